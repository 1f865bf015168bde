"""Pravega's state synchronizer over the public protocols: shared state with optimistic concurrency.

Why: the exactly-once ingest protocol and the stream-cut export record their progress where every
process (Airflow tasks, Spark drivers, zombie retries) sees the same history, and where an update
made from a stale view fails instead of overwriting someone else's. Pravega's state synchronizer
does that with a single-segment stream; the official Python binding does not offer it, so it is
built here from the same pieces:

* the state lives in a stream with exactly one segment; its **revision** is a byte offset of that
  segment (the end of the records a reader has folded);
* every record is one framed event whose payload is JSON: ``{"t": "full", "state": ...}`` (a whole
  state) or ``{"t": "upd", "op": ...}`` (an update, folded with the caller's ``apply``);
* an update is a **conditional append** at the writer's revision (ConditionalAppend, or
  ConditionalBlockEnd for several records at once); the segment store refuses it with
  ConditionalCheckFailed when anyone appended since, and :meth:`StateSynchronizer.update`
  re-reads and retries;
* :meth:`StateSynchronizer.compact` appends a full state (conditionally) and truncates the stream
  at it, so new readers start from one record; readers behind the new head restart from it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from airflow_provider_pravega.client.appends import set_up_appends
from airflow_provider_pravega.client.batch import (
    SegmentRange,
    SegmentRangeTruncatedError,
    read_segment_range,
)
from airflow_provider_pravega.client.connection import SegmentStoreConnection, next_request_id
from airflow_provider_pravega.client.controller_types import ScalingPolicy
from airflow_provider_pravega.client.errors import (
    ControllerUnreachableError,
    InvalidStreamCutError,
    NoSuchSegmentError,
    PravegaError,
    PravegaPermissionError,
    PravegaTLSError,
    SegmentSealedError,
    SegmentStoreError,
    SegmentStoreUnreachableError,
    SegmentTruncatedError,
    TruncatedStreamCutError,
)
from airflow_provider_pravega.client.segment_client import SegmentStoreClient
from airflow_provider_pravega.client.segment_replies import raise_for_reply
from airflow_provider_pravega.client.streamcut import controller_of, segments_of
from airflow_provider_pravega.protocol import naming, wire

__all__ = ["StateSynchronizer", "SynchronizerConflictError", "SynchronizerError"]

log = logging.getLogger(__name__)

S = TypeVar("S")
U = TypeVar("U")

FULL = "full"
UPDATE = "upd"
PART = "part"  # one chunk of a snapshot larger than one event
#: Characters of state JSON per snapshot chunk: escaped inside the chunk record at most twice as
#: long (quotes and backslashes), so a chunk stays well under the 8 MiB event limit.
SNAPSHOT_CHUNK_CHARS = 3 * 1024 * 1024


class SynchronizerError(PravegaError):
    """The synchronizer's stream cannot hold state (wrong shape, sealed, corrupt records)."""


class SynchronizerConflictError(SynchronizerError):
    """Every attempt of an update lost against concurrent writers."""

    def __init__(self, scope: str, stream: str, attempts: int) -> None:
        self.scope = scope
        self.stream = stream
        self.attempts = attempts
        super().__init__(
            f"state update on {scope}/{stream} lost {attempts} times in a row to other writers; raise "
            f"max_attempts or reduce the number of processes updating this state at once"
        )


class _ConditionalAppender:
    """Conditional appends of one writer id to one segment, safe across reconnects.

    Event numbers only grow, so after a broken connection the AppendSetup's last event number
    tells whether the in-doubt append landed (the segment store deduplicates by writer id and
    event number, so resending the same append cannot write it twice).

    That answer is only sound while this writer id has one append outstanding at a time: its
    connection carries one request at a time, and a later event number of the same writer id
    landing says nothing about an earlier one. Appends are therefore serialized (``_lock``), and
    an in-doubt append whose writer id shows a later event number than its own is an error, never
    taken as written.
    """

    def __init__(self, segments: SegmentStoreClient, segment: str, *, reconnect_timeout_s: float = 60.0) -> None:
        self.segments = segments
        self.segment = segment
        self.writer_id = uuid.uuid4().int
        self.reconnect_timeout_s = reconnect_timeout_s
        self._conn: SegmentStoreConnection | None = None
        self._event_number = 0
        self._lock = threading.RLock()

    def _setup(self) -> int:
        setup = set_up_appends(self.segments, self.segment, self.writer_id)
        self._conn = setup.conn
        last = setup.last_event_number
        return 0 if last == wire.NO_EVENT_NUMBER else last

    def _reconnect(self) -> int:
        """Set up on the segment's current owner (following it after WrongHost or a lost store, within
        the failover bounds); returns the writer id's last durable event number there."""
        failover = self.segments.failover(self.segment, "conditional appends", timeout_s=self.reconnect_timeout_s)
        while True:
            try:
                return self._setup()
            except PravegaTLSError:
                raise  # a TLS mismatch does not heal by retrying
            except (SegmentStoreUnreachableError, ControllerUnreachableError) as exc:
                failover.retry(exc, getattr(exc, "endpoint", None))

    def append(self, expected_offset: int, payloads: list[bytes]) -> bool:
        """Append ``payloads`` (one event each) at ``expected_offset``: True when written there,
        False when the segment's length was not ``expected_offset`` (ConditionalCheckFailed)."""
        with self._lock:
            return self._append(expected_offset, payloads)

    def _landed(self, number: int, last: int) -> bool:
        """Whether the in-doubt append ``number`` was written, from the writer id's last event
        number after reconnecting."""
        if last > number:
            # Event number ``last`` was never sent by this (serialized) appender: someone else
            # appends with this writer id, and ``last`` says nothing about ``number``.
            raise SegmentStoreError(
                f"cannot tell whether the conditional append {number} to {self.segment} was written: its writer id "
                f"{self.writer_id:032x} already reached event number {last} (is one state synchronizer used by "
                f"several processes?)",
                segment=self.segment,
            )
        return last == number

    def _landed_after_reconnect(self, number: int) -> bool:
        """Reconnect (a new setup tells the writer id's last event number) and say whether the
        in-doubt append ``number`` was written (:meth:`_landed`)."""
        self.close()
        last = self._reconnect()
        self._event_number = max(self._event_number, last)
        return self._landed(number, last)

    def _append(self, expected_offset: int, payloads: list[bytes]) -> bool:
        if self._conn is None:
            self._event_number = max(self._event_number, self._reconnect())
        self._event_number += 1
        number = self._event_number

        def request() -> wire.Request:
            if len(payloads) == 1:
                return wire.ConditionalAppend(self.writer_id, number, expected_offset, payloads[0], next_request_id())
            data = b"".join(wire.frame_event(p) for p in payloads)
            return wire.ConditionalBlockEnd(self.writer_id, number, expected_offset, data, next_request_id())

        while True:
            conn = self._conn
            assert conn is not None
            try:
                reply = conn.call(request())
            except SegmentStoreError as exc:
                # Broken connection (or a garbled reply): was the append written before it broke?
                log.info("conditional append to %s in doubt (%s); reconnecting", self.segment, exc)
                if self._landed_after_reconnect(number):
                    return True
                continue
            if isinstance(reply, wire.DataAppended):
                return True
            if isinstance(reply, wire.ConditionalCheckFailed):
                return False
            if isinstance(reply, wire.WrongHost):
                self.segments.forget_endpoint(self.segment)
                if self._landed_after_reconnect(number):
                    return True
                continue
            raise_for_reply(reply, endpoint=conn.endpoint, segment=self.segment)
            raise SegmentStoreError(
                f"unexpected reply {type(reply).__name__} to a conditional append on {self.segment}",
                segment=self.segment,
            )

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _create_missing(admin: Any, scope: str, stream: str) -> None:
    """Create the scope and the one-segment stream when missing, and finish a creation that a lost
    controller or segment store interrupted (see ``StreamAdmin.ensure_stream``). A user allowed to
    write in its scope (READ_UPDATE on ``prn::/scope:S`` and ``prn::/scope:S/*``) needs no more."""
    try:
        admin.ensure_stream(scope, stream, scaling=ScalingPolicy.fixed(1), create_scope=True)
    except PravegaPermissionError as exc:
        if exc.action == "createScope":
            what = (f"the missing scope {scope} (for the state stream {scope}/{stream}): no permission to create "
                    f"scopes; create scope {scope} first, or give the user create rights on it")
        else:
            what = f"the missing state stream {scope}/{stream}: no write permission on scope {scope}"
        raise PravegaPermissionError(
            exc.where, exc.user, exc.action, exc.resource,
            f"creating {what}" + (f"; {exc.detail}" if exc.detail else ""),
        ) from None


def _identity(value: Any) -> Any:
    return value


class StateSynchronizer(Generic[S, U]):
    """A state of type ``S`` shared through ``scope/stream``, changed by updates of type ``U``.

    ``apply(state, update) -> state`` folds one update (it may modify ``state`` in place and
    return it). ``encode_state``/``decode_state`` and ``encode_update``/``decode_update`` map to
    and from JSON-able values; by default a dataclass state goes through ``asdict`` and its
    constructor, anything else must already be JSON-able.

    Many instances (threads, processes, machines) may share a stream; every instance appends with
    its own writer id. One instance may also be shared by threads (an ingest's driver and its
    heartbeat thread do): its reads and updates take turns (``_lock``), because its state, its
    revision, its append connection and its writer id's event numbers belong to one update at a
    time.
    """

    def __init__(
        self,
        client: Any,
        scope: str,
        stream: str,
        initial: S,
        apply: Callable[[S, U], S],
        *,
        encode_state: Callable[[S], Any] | None = None,
        decode_state: Callable[[Any], S] | None = None,
        encode_update: Callable[[U], Any] | None = None,
        decode_update: Callable[[Any], U] | None = None,
        create: bool = True,
        max_attempts: int = 100,
        backoff_s: float = 0.002,
        max_backoff_s: float = 0.25,
        read_chunk: int = 4 * 1024 * 1024,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.client = client
        self.scope = scope
        self.stream = stream
        self._controller = controller_of(client)
        self._segments: SegmentStoreClient = segments_of(client)
        self._initial = copy.deepcopy(initial)
        self._apply = apply
        if dataclasses.is_dataclass(initial) and not isinstance(initial, type):
            state_type = type(initial)
            self._encode_state = encode_state or dataclasses.asdict
            self._decode_state = decode_state or (lambda data: state_type(**data))
        else:
            self._encode_state = encode_state or _identity
            self._decode_state = decode_state or _identity
        self._encode_update = encode_update or _identity
        self._decode_update = decode_update or _identity
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.read_chunk = read_chunk

        if create:
            admin = getattr(client, "admin", None)
            if admin is None:
                raise TypeError("create=True needs a PravegaClient (with .admin); or create the stream first")
            _create_missing(admin, scope, stream)
        current = self._controller.get_current_segments(scope, stream)
        if len(current) != 1:
            raise SynchronizerError(
                f"stream {scope}/{stream} has {len(current)} segments; a state synchronizer needs a stream with "
                f"exactly one segment (create it with one fixed segment, and never scale it)"
            )
        self.segment_id = current[0].segment_id
        self.segment = naming.qualified_segment_name(scope, stream, self.segment_id)
        self._appender = _ConditionalAppender(self._segments, self.segment)
        #: Held by each fetch, update attempt and compaction attempt (re-entrant: ``fn`` may fetch).
        self._lock = threading.RLock()
        self._state: S = copy.deepcopy(self._initial)
        self._revision: int | None = None  # None: nothing read yet (start from the head)
        self._parts: dict[str, Any] | None = None  # a chunked snapshot being read
        #: Offset at which this instance's last successful update (or compaction) was written.
        self.last_written_revision: int | None = None
        #: Revisions (record offsets) of every update this instance won, in order.
        self.written_revisions: list[int] = []
        #: Conditional appends this instance lost to other writers (a measure of contention).
        self.conflicts = 0

    # ---------------------------------------------------------------------------- reading

    @property
    def revision(self) -> int | None:
        """The segment offset up to which updates are folded into :attr:`state` (None: not read yet)."""
        return self._revision

    @property
    def state(self) -> S:
        """A copy of the state as of :attr:`revision` (call fetch_updates() to catch up)."""
        with self._lock:
            return copy.deepcopy(self._state)

    def _fold(self, state: S, payload: bytes, offset: int) -> S:
        try:
            record = json.loads(payload)
            kind = record["t"]
        except (ValueError, TypeError, KeyError):
            raise SynchronizerError(
                f"record at offset {offset} of {self.scope}/{self.stream} is not a synchronizer record; is this "
                f"stream used for something else?"
            ) from None
        if kind == PART:
            return self._fold_part(state, record)
        self._parts = None  # a snapshot interrupted by another record is incomplete: ignore it
        if kind == FULL:
            return self._decode_state(record["state"])
        if kind == UPDATE:
            return self._apply(state, self._decode_update(record["op"]))
        raise SynchronizerError(f"record at offset {offset} of {self.scope}/{self.stream} has unknown kind {kind!r}")

    def _fold_part(self, state: S, record: dict[str, Any]) -> S:
        """One chunk of a snapshot too large for one event: the state is replaced once the last
        chunk arrives; a snapshot interrupted by other records is dropped (it was redundant: it
        only repeated the state as of its first chunk)."""
        index, count, snap = record["i"], record["n"], record["id"]
        parts = self._parts
        if index == 0:
            parts = self._parts = {"id": snap, "data": []}
        elif parts is None or parts["id"] != snap or len(parts["data"]) != index:
            self._parts = None
            return state
        parts["data"].append(record["data"])
        if len(parts["data"]) < count:
            return state
        self._parts = None
        return self._decode_state(json.loads("".join(parts["data"])))

    def fetch_updates(self) -> S:
        """Read every record from the current revision to the tail, fold them, return the state.

        A reader whose revision is below the stream's head (someone compacted) restarts from the
        head, where compaction left a full state.
        """
        with self._lock:
            return self._fetch_updates()

    def _fetch_updates(self) -> S:
        for _ in range(100):
            info = self._segments.get_segment_info(self.segment)
            if self._revision is None:
                self._state = copy.deepcopy(self._initial)
                self._parts = None
                self._revision = info.start_offset
            # A revision below the head (someone compacted) is found out by the read itself:
            # SegmentIsTruncated, which also covers a compaction that happens while reading.
            if self._revision >= info.length:
                return copy.deepcopy(self._state)
            state = self._state
            position = self._revision
            rng = SegmentRange(self.scope, self.stream, self.segment_id, position, info.length)
            try:
                for event in read_segment_range(self._segments, rng, chunk=self.read_chunk):
                    state = self._fold(state, event.payload, event.offset)
                    position = event.offset + 8 + len(event.payload)
            except (SegmentRangeTruncatedError, SegmentTruncatedError, TruncatedStreamCutError):
                # Compacted while we read: whatever we folded may be partial; start again from the head.
                log.info("state stream %s/%s was truncated while reading; restarting from the head", self.scope, self.stream)
                self._revision = None
                continue
            except BaseException:
                # ``apply`` may have changed the state in place: never keep a half-folded state.
                self._revision = None
                raise
            self._state = state
            self._revision = position
            return copy.deepcopy(self._state)
        raise SynchronizerError(f"the head of {self.scope}/{self.stream} kept moving while reading the state")

    def fetch(self) -> S:
        """The latest state (alias of :meth:`fetch_updates`, the ingest protocol's StateStore API)."""
        return self.fetch_updates()

    # ---------------------------------------------------------------------------- writing

    def _encode(self, records: list[dict[str, Any]]) -> list[bytes]:
        out = []
        for record in records:
            data = json.dumps(record, separators=(",", ":")).encode("utf-8")
            if len(data) > wire.MAX_EVENT_SIZE:
                raise SynchronizerError(
                    f"a state record of {len(data)} bytes is over Pravega's {wire.MAX_EVENT_SIZE}-byte event limit; "
                    f"keep the state (or one update) smaller"
                )
            out.append(data)
        return out

    def _sleep(self, attempt: int) -> None:
        time.sleep(random.uniform(0, min(self.max_backoff_s, self.backoff_s * (2 ** min(attempt, 16)))))

    def _attempt(self, fn: Callable[[S], list[U] | U | None]) -> bool:
        result = fn(copy.deepcopy(self._state))
        if result is None:
            return True
        updates = result if isinstance(result, list) else [result]
        if not updates:
            return True
        payloads = self._encode([{"t": UPDATE, "op": self._encode_update(u)} for u in updates])
        revision = self._revision
        assert revision is not None
        try:
            won = self._appender.append(revision, payloads)
        except (SegmentSealedError, NoSuchSegmentError) as exc:
            raise SynchronizerError(f"cannot update the state in {self.scope}/{self.stream}: {exc}") from None
        if not won:
            self.conflicts += 1
            return False
        # Our records are exactly the bytes after ``revision``: fold them locally.
        state = self._state
        offset = revision
        for payload in payloads:
            # Fold what readers will decode, not the caller's object (JSON may change types).
            state = self._apply(state, self._decode_update(json.loads(payload)["op"]))
            self.written_revisions.append(offset)
            offset += wire.EVENT_HEADER_LEN + len(payload)
        self._state = state
        self.last_written_revision = revision
        self._revision = offset
        return True

    def update(self, fn: Callable[[S], list[U] | U | None]) -> S:
        """Apply ``fn``'s updates atomically and return the new state.

        ``fn`` gets a copy of the current state and returns an update, a list of updates (written
        as one atomic append) or None (nothing to change). When another writer appended first,
        the state is re-read and ``fn`` called again, up to ``max_attempts`` times (with jittered
        backoff); then SynchronizerConflictError.
        """
        for attempt in range(self.max_attempts):
            with self._lock:
                self._fetch_updates()
                if self._attempt(fn):
                    return copy.deepcopy(self._state)
            self._sleep(attempt)
        raise SynchronizerConflictError(self.scope, self.stream, self.max_attempts)

    def compact(self) -> int:
        """Write the full state and truncate the stream at it; returns the new head offset.

        Readers (and fresh synchronizers) then start from that snapshot instead of the whole
        history. A state larger than one event is written as several chunk records, each a
        conditional append; when another writer appends in between, the snapshot is incomplete
        (readers ignore it) and compaction starts over. Retried like :meth:`update`.
        """
        for attempt in range(self.max_attempts):
            with self._lock:
                revision = self._compact_attempt()
                if revision is not None:
                    return revision
                # Our partial snapshot stays in the stream; readers (we too) skip it as incomplete.
                self.conflicts += 1
            self._sleep(attempt)
        raise SynchronizerConflictError(self.scope, self.stream, self.max_attempts)

    def _compact_attempt(self) -> int | None:
        """One compaction (the caller holds ``_lock``): the new head offset, or None when lost."""
        self._fetch_updates()
        revision = self._revision
        assert revision is not None
        text = json.dumps(self._encode_state(self._state), separators=(",", ":"))
        if len(text) <= SNAPSHOT_CHUNK_CHARS:
            records = [{"t": FULL, "state": json.loads(text)}]
        else:
            chunks = [text[i:i + SNAPSHOT_CHUNK_CHARS] for i in range(0, len(text), SNAPSHOT_CHUNK_CHARS)]
            snap = uuid.uuid4().hex
            records = [{"t": PART, "id": snap, "i": i, "n": len(chunks), "data": c} for i, c in enumerate(chunks)]
        offset = revision
        for payload in self._encode(records):
            try:
                won = self._appender.append(offset, [payload])
            except (SegmentSealedError, NoSuchSegmentError) as exc:
                raise SynchronizerError(f"cannot compact the state in {self.scope}/{self.stream}: {exc}") from None
            if not won:
                return None
            offset += wire.EVENT_HEADER_LEN + len(payload)
        self._revision = offset
        self._parts = None
        self.last_written_revision = revision
        self._truncate(revision)
        return revision

    def _truncate(self, offset: int) -> None:
        """Truncate at ``offset`` unless a later compaction already moved the head past it."""
        if self.head_offset() >= offset:
            return
        try:
            self._controller.truncate_stream(self.scope, self.stream, {self.segment_id: offset})
        except (InvalidStreamCutError, TruncatedStreamCutError):
            if self.head_offset() < offset:
                raise

    def head_offset(self) -> int:
        """Where the stream's readable data starts now (moves with each compaction)."""
        return self._segments.get_segment_info(self.segment).start_offset

    def close(self) -> None:
        self._appender.close()

    def __enter__(self) -> StateSynchronizer[S, U]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StateSynchronizer({self.scope}/{self.stream}, revision={self._revision})"
