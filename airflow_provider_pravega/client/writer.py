"""Writing events to a stream's segments, routed by routing key: one home for both writers.

* :class:`RoutedSegmentWriter` - the shared part: a routing table (segments ordered by their key
  ranges), routing keys hashed exactly like the official client (:mod:`..protocol.routing`), one
  pipelined :class:`~airflow_provider_pravega.client.appends.AppendSession` per segment opened
  on first use, ``flush`` that returns once every event is acknowledged.
* :class:`EventWriter` - plain (non-transactional) appends to the stream's current segments, the
  provider's counterpart of the official client's ``create_writer(scope, stream, 1000)``: at most
  ``max_inflight_events`` events in flight per segment, and when a segment is sealed under it (the
  stream scaled) the events it had not acknowledged go, in order, to the successors owning their
  keys, as the official client does. A sealed stream raises StreamSealedError. Like every Pravega
  writer it may write an event twice when a connection breaks before its ack (at least once).
* :class:`~airflow_provider_pravega.client.transactions.TransactionalWriter` - the same over a
  transaction's segments; a sealed transaction segment means the transaction ended.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterable, Sequence
from typing import Any

from airflow_provider_pravega.client.appends import AppendSession, FlushOnExit, write_each
from airflow_provider_pravega.client.controller import ControllerClient
from airflow_provider_pravega.client.controller_types import SegmentRange
from airflow_provider_pravega.client.errors import (
    NoSuchSegmentError,
    PravegaError,
    SegmentSealedError,
    StreamNotFoundError,
    StreamSealedError,
)
from airflow_provider_pravega.client.segment_client import SegmentStoreClient
from airflow_provider_pravega.protocol import naming, routing

__all__ = ["DEFAULT_MAX_INFLIGHT_EVENTS", "EventWriter", "RoutedSegmentWriter"]

#: The window the official client's at-least-once writer is used with here (create_writer(..., 1000)).
DEFAULT_MAX_INFLIGHT_EVENTS = 1000


class RoutedSegmentWriter(FlushOnExit):
    """Events routed by key over a table of segments, one append session per segment.

    Subclasses say which segment a table entry names (:meth:`segment_name`) and what a sealed or
    missing segment means (:meth:`_segment_ended`). Not thread-safe: one producing thread.
    """

    def __init__(
        self,
        segments_client: SegmentStoreClient,
        scope: str,
        stream: str,
        segments: Sequence[SegmentRange],
        **session_options: Any,
    ) -> None:
        self.segments_client = segments_client
        self.scope = scope
        self.stream = stream
        self._session_options = session_options
        self._random = random.random
        self._closed = False
        self.events_written = 0
        self._set_table(segments)

    def _set_table(self, segments: Sequence[SegmentRange]) -> None:
        """Route over ``segments`` (each owning [min_key, max_key)); sessions open on first use."""
        ordered = sorted(segments, key=lambda s: s.max_key)
        routing.check_key_ranges([s.max_key for s in ordered])
        self.segments: tuple[SegmentRange, ...] = tuple(ordered)
        self._max_keys = [s.max_key for s in ordered]
        self._sessions: list[AppendSession | None] = [None] * len(ordered)
        self._key_index: dict[str, int] = {}
        if len(ordered) == 1:
            # One segment: route nothing (the same choice the official client would make).
            self.write_event = self._write_single  # type: ignore[method-assign]
        else:
            self.__dict__.pop("write_event", None)

    # ------------------------------------------------------------------ what subclasses decide

    def segment_name(self, index: int) -> str:
        raise NotImplementedError

    def _segment_ended(self, index: int, cause: PravegaError) -> PravegaError:
        """The error to raise when the index-th segment is sealed or missing."""
        return cause

    def _closed_error(self) -> PravegaError:
        return PravegaError(f"{self!r} is closed; create a new writer")

    # --------------------------------------------------------------------------------- routing

    def _session(self, index: int) -> AppendSession:
        session = self._sessions[index]
        if session is None:
            if self._closed:
                raise self._closed_error()
            try:
                session = self.segments_client.open_append_session(
                    self.segment_name(index), **self._session_options
                )
            except (NoSuchSegmentError, SegmentSealedError) as exc:
                raise self._segment_ended(index, exc) from exc
            self._sessions[index] = session
        return session

    def index_for(self, routing_key: str | None) -> int:
        """Which table entry an event with this routing key goes to (None: a random one)."""
        if routing_key is None:
            return bisect.bisect_left(self._max_keys, self._random())
        index = self._key_index.get(routing_key)
        if index is None:
            index = bisect.bisect_left(
                self._max_keys, routing.hash_routing_key(routing_key)
            )
            if index >= len(self._max_keys):  # only with a malformed routing table
                index = len(self._max_keys) - 1
            if len(self._key_index) >= 1 << 16:
                self._key_index.clear()
            self._key_index[routing_key] = index
        return index

    # --------------------------------------------------------------------------------- writing

    def write_event(self, payload: bytes, routing_key: str | None = None) -> None:
        """Queue one event (bytes); it is sent in a block and acknowledged by ``flush``."""
        index = self.index_for(routing_key)
        session = self._sessions[index] or self._session(index)
        session.write_event(payload)
        self.events_written += 1

    def _write_single(self, payload: bytes, routing_key: str | None = None) -> None:
        session = self._sessions[0] or self._session(0)
        session.write_event(payload)
        self.events_written += 1

    def write_events(
        self, payloads: Iterable[bytes], routing_key: str | None = None
    ) -> int:
        """Queue many events with one routing key (or none: each one to a random segment)."""
        if routing_key is not None or len(self.segments) == 1:
            index = self.index_for(routing_key) if routing_key is not None else 0
            session = self._sessions[index] or self._session(index)
            count = session.write_events(payloads)
            self.events_written += count
            return count
        return write_each(self.write_event, payloads)

    def _flush_sessions(self, timeout_s: float | None) -> None:
        for index, session in enumerate(self._sessions):
            if session is not None:
                try:
                    session.flush(timeout_s)
                except (NoSuchSegmentError, SegmentSealedError) as exc:
                    raise self._segment_ended(index, exc) from exc

    def flush(self, timeout_s: float | None = None) -> None:
        """Return only when the segment store has acknowledged every event written so far."""
        self._flush_sessions(timeout_s)

    @property
    def pending_events(self) -> int:
        return sum(s.pending_events for s in set(self._open_sessions()))

    @property
    def reconnects(self) -> int:
        """Connection losses the writer recovered from (resending what was not acknowledged)."""
        return sum(s.reconnects for s in set(self._open_sessions()))

    def _open_sessions(self) -> list[AppendSession]:
        return [s for s in self._sessions if s is not None]

    def close(self) -> None:
        """Close the segment connections; events not flushed are abandoned."""
        self._closed = True
        for session in set(self._open_sessions()):
            session.close()
        self._sessions = [None] * len(self._sessions)


class EventWriter(RoutedSegmentWriter):
    """Plain appends to a stream, routed by key; survives scaling (see the module docstring).

    ``EventWriter(client, scope, stream)`` or ``client.event_writer(scope, stream)``. Events with
    one routing key keep their order. ``flush`` returns once every event is acknowledged.
    """

    def __init__(
        self,
        segments_client: SegmentStoreClient,
        scope: str,
        stream: str,
        *,
        max_inflight_events: int = DEFAULT_MAX_INFLIGHT_EVENTS,
        **session_options: Any,
    ) -> None:
        if max_inflight_events < 1:
            raise ValueError(f"max_inflight_events must be at least 1, got {max_inflight_events}")
        self.controller: ControllerClient = segments_client.controller
        self.max_inflight_events = max_inflight_events
        current = self.controller.get_current_segments(scope, stream)
        if not current:
            raise StreamSealedError(scope, stream, "write events")
        session_options.setdefault("window_events", max_inflight_events)
        #: Sealed segments replaced by their successors so far.
        self.segments_replaced = 0
        super().__init__(segments_client, scope, stream, current, **session_options)

    def __repr__(self) -> str:
        return f"EventWriter({self.scope}/{self.stream})"

    def _set_table(self, segments: Sequence[SegmentRange]) -> None:
        super()._set_table(segments)
        # Routing keys of the events each session holds that are not known to be acknowledged:
        # keys[i] belongs to event number base + i. Re-routing after a seal needs them.
        self._keys: list[list[str | None]] = [[] for _ in self.segments]
        self._bases: list[int] = [1] * len(self.segments)
        if len(self.segments) == 1:
            self.write_event = self._write_single  # type: ignore[method-assign]
        else:
            self.write_event = self._write_routed  # type: ignore[method-assign]

    def segment_name(self, index: int) -> str:
        return naming.qualified_segment_name(self.scope, self.stream, self.segments[index].segment_id)

    def _session(self, index: int) -> AppendSession:
        session = super()._session(index)
        self._bases[index] = session.next_event_number - len(self._keys[index])
        return session

    def _write_routed(self, payload: bytes, routing_key: str | None = None) -> None:
        self._write_at(self.index_for(routing_key), payload, routing_key)

    def _write_single(self, payload: bytes, routing_key: str | None = None) -> None:
        self._write_at(0, payload, routing_key)

    def _write_at(self, index: int, payload: bytes, routing_key: str | None) -> None:
        keys = self._keys[index]
        try:
            session = self._sessions[index] or self._session(index)
            session.write_event(payload)
        except SegmentSealedError:
            session = self._sessions[index]
            self.events_written += 1
            if session is not None and session.next_event_number > self._bases[index] + len(keys):
                keys.append(routing_key)  # it was taken: it moves with the unacknowledged ones
                self._replace_sealed(index)
            else:
                self._replace_sealed(index)
                self.events_written -= 1
                self.write_event(payload, routing_key)
            return
        keys.append(routing_key)
        self.events_written += 1
        if len(keys) > 4 * self.max_inflight_events:
            self._forget_acknowledged(index)

    def write_events(self, payloads: Iterable[bytes], routing_key: str | None = None) -> int:
        write = self.write_event
        count = 0
        for payload in payloads:
            write(payload, routing_key)
            count += 1
        return count

    def _forget_acknowledged(self, index: int) -> None:
        session = self._sessions[index]
        acked = session.last_acked_event_number if session is not None else None
        if acked is None:
            return
        drop = acked - self._bases[index] + 1
        if drop > 0:
            del self._keys[index][:drop]
            self._bases[index] += drop

    def flush(self, timeout_s: float | None = None) -> None:
        """Return once every event written so far is acknowledged (also those moved to successors)."""
        while True:
            for index, session in enumerate(self._sessions):
                if session is None:
                    continue
                try:
                    session.flush(timeout_s)
                except SegmentSealedError:
                    self._replace_sealed(index)
                    break  # the table changed: flush it all again
                except NoSuchSegmentError as exc:
                    raise self._segment_ended(index, exc) from exc
                self._keys[index].clear()
                self._bases[index] = session.next_event_number
            else:
                return

    def _segment_ended(self, index: int, cause: PravegaError) -> PravegaError:
        if isinstance(cause, NoSuchSegmentError) and not self.controller.stream_exists(self.scope, self.stream):
            return StreamNotFoundError(self.scope, self.stream)
        return cause

    def _replace_sealed(self, index: int) -> None:
        """The index-th segment was sealed: route its key range to its successors and move the
        events it did not acknowledge there, in order. Events of one key stay in order: readers
        read a segment's successors only after the segment itself."""
        sealed = self.segments[index]
        session = self._sessions[index]
        moved: list[tuple[bytes, str | None]] = []
        if session is not None:
            keys, base = self._keys[index], self._bases[index]
            moved = [(payload, keys[number - base]) for number, payload in session.unacknowledged_events()]
            session.close()
        successors = self.controller.get_successors(self.scope, self.stream, sealed.segment_id)
        if not successors:
            raise StreamSealedError(self.scope, self.stream, "write events")
        # Each successor takes the part of the sealed range it covers (a merge's successor also
        # covers neighbours not sealed yet: they keep their own part until they are sealed too).
        # Several entries may name one segment; each has its own session (its own writer id).
        entries: list[tuple[SegmentRange, AppendSession | None, list[str | None], int]] = []
        for i, seg in enumerate(self.segments):
            if i != index:
                entries.append((seg, self._sessions[i], self._keys[i], self._bases[i]))
        for succ in successors:
            low = max(succ.segment.min_key, sealed.min_key)
            high = min(succ.segment.max_key, sealed.max_key)
            if high > low:
                entries.append((SegmentRange(succ.segment.segment_id, low, high), None, [], 1))
        entries.sort(key=lambda e: e[0].max_key)
        self._set_table([e[0] for e in entries])
        for i, (_, kept_session, kept_keys, kept_base) in enumerate(entries):
            self._sessions[i], self._keys[i], self._bases[i] = kept_session, kept_keys, kept_base
        self.segments_replaced += 1
        self.events_written -= len(moved)
        for payload, key in moved:
            self.write_event(payload, key)
