"""Appends to a segment: the SetupAppend handshake of one writer id, and the pipelined session.

:func:`set_up_appends` is every appender's handshake (append sessions here, the synchronizer's
conditional appends): connect to the segment's owner, SetupAppend, follow a ``WrongHost``.

:class:`AppendSession` is the pipelined writer of one (segment, writer id): many AppendBlockEnd
frames in flight, a reader thread consuming DataAppended acks, ``flush`` that returns only when
everything is acknowledged, and a reconnect that resends exactly the unacknowledged blocks with
their original event numbers (the segment store deduplicates by writer id and event number).
"""

from __future__ import annotations

import bisect
import collections
import functools
import itertools
import logging
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self

from airflow_provider_pravega.client.connection import SegmentStoreConnection, next_request_id
from airflow_provider_pravega.client.controller_types import Endpoint
from airflow_provider_pravega.client.errors import (
    AuthenticationError,
    ControllerUnreachableError,
    NoSuchSegmentError,
    PravegaError,
    PravegaTLSError,
    SegmentSealedError,
    SegmentStoreError,
    SegmentStoreUnreachableError,
    SegmentTruncatedError,
)
from airflow_provider_pravega.client.segment_replies import raise_for_reply
from airflow_provider_pravega.protocol import wire

if TYPE_CHECKING:  # annotations only: segment_client imports this module (it opens the sessions)
    from airflow_provider_pravega.client.segment_client import Failover, SegmentStoreClient

__all__ = ["AppendConnection", "AppendSession", "FlushOnExit", "set_up_appends"]

log = logging.getLogger(__name__)

#: InvalidEventNumber refusals in a row, without an acknowledgment between them, that a session
#: heals by setting up again; one more is an error (another writer with the same writer id, whose
#: appends keep moving the event number, cannot be healed by reconnecting).
MAX_INVALID_EVENT_NUMBERS = 5

#: Append-setup failures that no reconnect can fix.
_FINAL_ERRORS = (
    NoSuchSegmentError,
    SegmentSealedError,
    SegmentTruncatedError,
    AuthenticationError,
    PravegaTLSError,
)

# AppendBlockEnd as sent: header (type, length), writer id (2 x u64), size_of_whole_events, data length
# | data | num_event, last_event_number, request_id.  Payload = 16 + 4 + 4 + n + 4 + 8 + 8.
_ABE_HEAD = struct.Struct(">iiQQiI")
_ABE_TAIL = struct.Struct(">iqq")
_ABE_OVERHEAD = 44
_EVENT_HEADER = struct.Struct(">iI")
_EVENT_FRAME_HEADER = functools.partial(_EVENT_HEADER.pack, 0)  # an event's header, from its size
_FRAMED = _EVENT_HEADER.size  # what the header adds to an event's size
_MASK64 = (1 << 64) - 1


def _unframe(data: bytes | bytearray, first: int, acked: int, out: list[tuple[int, bytes]]) -> None:
    """Append (event number, payload) of the framed events in ``data`` numbered above ``acked``."""
    view = memoryview(data)
    pos, number, end = 0, first, len(data)
    while pos < end:
        _, n = _EVENT_HEADER.unpack_from(view, pos)
        if number > acked:
            out.append((number, bytes(view[pos + 8 : pos + 8 + n])))
        pos += 8 + n
        number += 1


class _Block:
    __slots__ = ("count", "last", "nbytes", "parts")

    def __init__(self, last: int, count: int, nbytes: int, parts: list) -> None:
        self.last = last
        self.count = count
        self.nbytes = nbytes
        self.parts = parts


@dataclass(frozen=True, slots=True)
class AppendConnection:
    """A connection on which one writer id's SetupAppend was answered with AppendSetup."""

    conn: SegmentStoreConnection
    endpoint: Endpoint
    #: The delegation token the appends were set up with.
    token: str
    #: The writer id's last durable event number on the segment (wire.NO_EVENT_NUMBER: none yet).
    last_event_number: int


def set_up_appends(segments: SegmentStoreClient, segment: str, writer_id: int) -> AppendConnection:
    """Connect to the segment's current owner and SetupAppend as ``writer_id``: the handshake of
    every appender (append sessions, the synchronizer's conditional appends).

    A ``WrongHost`` answer forgets the cached owner and raises SegmentStoreUnreachableError, so the
    caller's :class:`Failover` asks the controller again; any other error reply raises as
    :func:`raise_for_reply` says. The connection is closed on every error.
    """
    endpoint = segments.endpoint_for(segment)
    conn = segments.pool.connect(endpoint)
    try:
        token = segments.token_for(segment, "write")  # cached; renewed near expiry
        request = wire.SetupAppend(next_request_id(), writer_id, segment, token)
        reply = conn.call(request)
        if isinstance(reply, wire.WrongHost):
            segments.forget_endpoint(segment)
            raise SegmentStoreUnreachableError(
                f"segment store {endpoint} does not own segment {segment} (it points at {reply.correct_host!r})",
                segment=segment,
                endpoint=str(endpoint),
            )
        raise_for_reply(
            reply, endpoint=endpoint, segment=segment, request=request, user=segments.controller.username,
        )
        if not isinstance(reply, wire.AppendSetup):
            raise SegmentStoreError(
                f"segment store {endpoint} answered SetupAppend for {segment} with {type(reply).__name__}",
                segment=segment,
                endpoint=str(endpoint),
            )
    except BaseException:
        conn.close()
        raise
    return AppendConnection(conn, endpoint, token, reply.last_event_number)


def write_each(write: Callable[[bytes], None], payloads: Iterable[bytes]) -> int:
    """``write`` each payload in turn; how many there were."""
    count = 0
    for payload in payloads:
        write(payload)
        count += 1
    return count


class FlushOnExit:
    """``with`` for writers: flush when the block ends normally, close in every case (an error
    abandons what was not flushed rather than waiting on it)."""

    def flush(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                self.flush()
        finally:
            self.close()


class AppendSession(FlushOnExit):
    """Pipelined appends of framed events to one segment by one writer id.

    Not thread-safe for writers (one producing thread); a private reader thread handles acks.
    ``block_bytes``/``block_events`` bound one AppendBlockEnd; ``window_bytes`` (and, when given,
    ``window_events``) bound what is in flight (unacknowledged) - the writer blocks when the window
    is full. With ``window_events`` a block holds at most a quarter of it, so blocks keep flowing.
    """

    def __init__(
        self,
        segments: SegmentStoreClient,
        segment: str,
        *,
        writer_id: int | None = None,
        block_bytes: int = 1024 * 1024,
        block_events: int = 1 << 30,
        window_bytes: int = 16 * 1024 * 1024,
        window_events: int | None = None,
        flush_timeout_s: float = 120.0,
        reconnect_timeout_s: float = 30.0,
    ) -> None:
        if block_bytes <= 0 or block_events <= 0 or window_bytes <= 0 or (
            window_events is not None and window_events <= 0
        ):
            raise ValueError(
                "block_bytes, block_events, window_bytes and window_events must be positive"
            )
        if window_events is not None:
            block_events = min(block_events, max(1, window_events // 4))
        self.segments = segments
        self.segment = segment
        self.writer_id = uuid.uuid4().int if writer_id is None else writer_id
        self._wid_hi = self.writer_id >> 64
        self._wid_lo = self.writer_id & _MASK64
        self.block_bytes = min(block_bytes, wire.MAX_EVENT_SIZE + wire.EVENT_HEADER_LEN)
        self.block_events = block_events
        self.window_bytes = max(window_bytes, self.block_bytes)
        self.window_events = window_events if window_events is not None else 1 << 62
        self.flush_timeout_s = flush_timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s
        self.endpoint: Endpoint | None = None
        #: Event number of the last event acknowledged by the segment store (None: nothing yet).
        self.last_acked_event_number: int | None = None
        #: Segment length reported by the latest DataAppended.
        self.write_offset: int | None = None
        self.events_written = 0
        #: How many times the session had to set up again after losing its connection.
        self.reconnects = 0
        #: InvalidEventNumber refusals since the last acknowledgment (see MAX_INVALID_EVENT_NUMBERS).
        self._invalid_event_numbers = 0
        self._buf = bytearray()
        self._count = 0
        self._next_event_number = 1
        self._inflight: collections.deque[_Block] = collections.deque()
        self._inflight_bytes = 0
        self._inflight_events = 0
        self._cond = threading.Condition(threading.Lock())
        self._error: PravegaError | None = None
        self._broken: Exception | None = None
        self._conn: SegmentStoreConnection | None = None
        self._reader: threading.Thread | None = None
        self._closed = False
        self._token = ""

    def __repr__(self) -> str:
        return f"AppendSession({self.segment!r}, writer_id={self.writer_id:032x})"

    # -------------------------------------------------------------------------- connection

    def open(self) -> AppendSession:
        """Connect and SetupAppend; numbering continues after what the server already has."""
        self._token = self.segments.token_for(self.segment, "write")
        last = self._connect_with_retries()
        self._next_event_number = 1 if last == wire.NO_EVENT_NUMBER else last + 1
        if last != wire.NO_EVENT_NUMBER:
            self.last_acked_event_number = last
        return self

    def _connect_once(self) -> int:
        setup = set_up_appends(self.segments, self.segment, self.writer_id)
        conn, endpoint = setup.conn, setup.endpoint
        self._token = setup.token
        self._conn = conn
        self.endpoint = endpoint
        # Appends wait on acks in the reader thread; a long socket timeout only bounds a stuck send.
        conn.set_timeout(max(conn.timeout_s, 60.0))
        self._reader = threading.Thread(
            target=self._read_acks,
            args=(conn,),
            name=f"pravega-acks-{self.writer_id & 0xFFFF:04x}",
            daemon=True,
        )
        self._reader.start()
        return setup.last_event_number

    def _connect_with_retries(self, failover: Failover | None = None) -> int:
        """Set up on the segment's current owner, following it (:class:`Failover`, bounded by
        ``reconnect_timeout_s``); errors that retrying cannot fix (missing or sealed segment,
        refused credentials) are raised at once."""
        failover = failover or self.segments.failover(self.segment, "setting up appends",
                                                      timeout_s=self.reconnect_timeout_s)
        while True:
            try:
                return self._connect_once()
            except _FINAL_ERRORS:
                raise
            except (SegmentStoreError, ControllerUnreachableError) as exc:
                failover.retry(exc, getattr(exc, "endpoint", None))

    def _read_acks(self, conn: SegmentStoreConnection) -> None:
        """Reader thread: consume replies of one connection until it closes."""
        recv_some = conn.recv_some
        decoder = conn._decoder
        pending = list(conn._ready)
        conn._ready.clear()
        while True:
            if pending:
                self._on_replies(conn, pending)
                pending = []
            try:
                data = recv_some()
            except TimeoutError:
                if self._conn is not conn:
                    return
                continue
            except OSError as exc:
                self._on_broken(conn, exc)
                return
            if not data:
                self._on_broken(
                    conn,
                    ConnectionError(
                        f"segment store {conn.endpoint} closed the connection"
                    ),
                )
                return
            try:
                pending = decoder.feed(data)
            except wire.ProtocolError as exc:
                if exc.decoded:
                    self._on_replies(conn, list(exc.decoded))
                self._on_broken(conn, exc)
                return

    def _on_replies(self, conn: SegmentStoreConnection, replies: list) -> None:
        with self._cond:
            if self._conn is not conn:
                return
            inflight = self._inflight
            for reply in replies:
                if type(reply) is wire.DataAppended:
                    self._invalid_event_numbers = 0  # progress: the count is of refusals in a row
                    n = reply.event_number
                    while inflight and inflight[0].last <= n:
                        block = inflight.popleft()
                        self._inflight_bytes -= block.nbytes
                        self._inflight_events -= block.count
                    self.last_acked_event_number = n
                    self.write_offset = reply.current_segment_write_offset
                elif isinstance(reply, wire.KeepAlive):
                    continue
                elif (isinstance(reply, wire.InvalidEventNumber)
                      and self._invalid_event_numbers < MAX_INVALID_EVENT_NUMBERS):
                    # Pravega refused a block because the writer's event number moved since this
                    # connection's SetupAppend (a block of the previous connection landed late), and
                    # closes the connection: set up again, which answers the true last event number,
                    # and resend only what is after it (as the official writer reconnects). One
                    # refusal too many falls through to the failure branch below: an error.
                    self._invalid_event_numbers += 1
                    self._broken = SegmentStoreError(
                        f"segment store {conn.endpoint} refused an append to {self.segment}: the writer's event "
                        f"number had moved on (InvalidEventNumber)", endpoint=str(conn.endpoint), segment=self.segment)
                elif isinstance(reply, wire.WrongHost):
                    self._broken = SegmentStoreError(
                        f"segment store {conn.endpoint} no longer owns {self.segment}"
                    )
                    try:
                        self.segments.forget_endpoint(self.segment)
                    except ValueError:
                        pass
                elif getattr(reply, "IS_FAILURE", False) or isinstance(
                    reply, wire.ConditionalCheckFailed
                ):
                    try:
                        raise_for_reply(
                            reply, endpoint=conn.endpoint, segment=self.segment
                        )
                    except PravegaError as exc:
                        if self._error is None:
                            self._error = exc
                else:
                    log.debug(
                        "ignoring %s on the append connection of %s",
                        type(reply).__name__,
                        self.segment,
                    )
            self._cond.notify_all()

    def _on_broken(self, conn: SegmentStoreConnection, exc: Exception) -> None:
        with self._cond:
            if self._conn is conn and not self._closed:
                self._broken = exc
            self._cond.notify_all()

    def _reconnect(self) -> None:
        """Drop the broken connection, set up again on the segment's current owner (a WrongHost or
        a lost store: the controller is asked again), and resend the blocks the server does not have
        (SetupAppend answers the writer id's last durable event number, so a block that landed
        before the connection broke is never sent twice)."""
        deadline = time.monotonic() + self.reconnect_timeout_s
        failover = self.segments.failover(self.segment, "appending", timeout_s=self.reconnect_timeout_s)
        while True:
            if time.monotonic() > deadline:
                with self._cond:
                    self._error = SegmentStoreUnreachableError(
                        f"appends to {self.segment} kept failing for {self.reconnect_timeout_s:g} s",
                        segment=self.segment,
                        endpoint=str(self.endpoint),
                    )
                    self._broken = None
                    raise self._error
            old = self._conn
            reader = self._reader
            with self._cond:
                cause = self._broken
                self._conn = None
            if old is not None:
                old.abort()
            if reader is not None and reader is not threading.current_thread():
                reader.join(timeout=10)
            log.info(
                "append connection for %s broke (%s); reconnecting", self.segment, cause
            )
            self.reconnects += 1
            if old is not None:
                failover.tried.append(str(old.endpoint))
            try:
                last = self._connect_with_retries(failover)
            except PravegaError as exc:
                with self._cond:
                    if self._error is None:
                        self._error = exc
                    self._broken = None
                raise
            with self._cond:
                self._broken = None
                if last != wire.NO_EVENT_NUMBER:
                    while self._inflight and self._inflight[0].last <= last:
                        block = self._inflight.popleft()
                        self._inflight_bytes -= block.nbytes
                        self._inflight_events -= block.count
                    self.last_acked_event_number = last
                resend = list(self._inflight)
                conn = self._conn
            assert conn is not None
            try:
                for block in resend:
                    conn.send_parts(block.parts)
            except SegmentStoreUnreachableError as exc:
                with self._cond:
                    if self._conn is conn:
                        self._broken = exc
                continue
            return

    # ------------------------------------------------------------------------------ writing

    def _raise_error(self) -> None:
        err = self._error
        if err is not None:
            raise err

    def write_event(self, payload: bytes, routing_key: object = None) -> None:
        """Queue one event (framed here); sent when the block fills or on flush."""
        if self._error is not None:
            raise self._error
        n = len(payload)
        if n > wire.MAX_EVENT_SIZE:
            self._check_event_size(n)
        if self._count and len(self._buf) + n + 8 > self.block_bytes:
            self._send_block()
        buf = self._buf
        try:
            buf += _EVENT_HEADER.pack(0, n)
            buf += payload
        except TypeError:
            del buf[len(buf) - 8 :]
            raise TypeError(
                f"event payload must be bytes, got {type(payload).__name__}"
            ) from None
        self._count += 1
        if len(buf) >= self.block_bytes or self._count >= self.block_events:
            self._send_block()

    def write_events(self, payloads: Iterable[bytes]) -> int:
        """Queue many events; returns how many. The blocks are those ``write_event`` one by one
        would make, framed a block's worth at a time (no Python call per event). Payloads that
        are not all bytes, or one over the event limit, go one by one, which names what is wrong."""
        payloads = payloads if isinstance(payloads, list) else list(payloads)
        if self._error is not None:
            raise self._error
        try:
            sizes = list(map(len, payloads))
        except TypeError:
            return write_each(self.write_event, payloads)
        if not sizes or max(sizes) > wire.MAX_EVENT_SIZE:
            return write_each(self.write_event, payloads)
        ends = list(itertools.accumulate(map(_FRAMED.__add__, sizes), initial=0))  # ends[k]: framed bytes of events < k
        i, n = 0, len(payloads)
        while i < n:
            # The events from i that fit this block: framed within block_bytes, within block_events.
            last = min(n, i + self.block_events - self._count)
            e = bisect.bisect_right(ends, ends[i] + self.block_bytes - len(self._buf), i + 1, last + 1) - 1
            if e == i:
                if self._count:
                    self._send_block()  # the next event does not fit the block begun: a new one
                    continue
                e = i + 1  # alone, in a block of its own
            frames: list[bytes] = [b""] * (2 * (e - i))
            frames[0::2] = map(_EVENT_FRAME_HEADER, sizes[i:e])
            frames[1::2] = payloads[i:e]
            try:
                self._buf += b"".join(frames)
            except TypeError:  # not bytes-like: one by one from here, which says which
                return i + write_each(self.write_event, payloads[i:])
            self._count += e - i
            if len(self._buf) >= self.block_bytes or self._count >= self.block_events:
                self._send_block()
            i = e
        return n

    def _check_event_size(self, n: int) -> None:
        if n > wire.MAX_EVENT_SIZE:
            raise ValueError(
                f"event of {n} bytes is larger than Pravega's {wire.MAX_EVENT_SIZE}-byte limit for {self.segment}"
            )

    def _send_block(self) -> None:
        count = self._count
        if not count:
            return
        data = self._buf
        self._buf = bytearray()
        self._count = 0
        last = self._next_event_number + count - 1
        self._next_event_number = last + 1
        n = len(data)
        parts = [
            _ABE_HEAD.pack(
                wire.AppendBlockEnd.TYPE,
                _ABE_OVERHEAD + n,
                self._wid_hi,
                self._wid_lo,
                n,
                n,
            ),
            data,
            _ABE_TAIL.pack(count, last, next_request_id()),
        ]
        block = _Block(last, count, n, parts)
        self.events_written += count
        while True:
            with self._cond:
                deadline = None
                while (
                    self._inflight
                    and (
                        self._inflight_bytes + n > self.window_bytes
                        or self._inflight_events + count > self.window_events
                    )
                    and self._error is None
                    and self._broken is None
                ):
                    if deadline is None:
                        deadline = time.monotonic() + self.flush_timeout_s
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        # The block's event numbers are spent: the session cannot continue.
                        self._error = SegmentStoreError(
                            f"segment store did not acknowledge appends to {self.segment} within "
                            f"{self.flush_timeout_s:g} s",
                            segment=self.segment,
                            endpoint=str(self.endpoint),
                        )
                        break
                    self._cond.wait(remaining)
                if self._error is not None or self._closed:
                    # Not sent, but kept with the blocks in flight: unacknowledged_events() sees it.
                    self._inflight.append(block)
                    self._raise_error()
                    raise SegmentStoreError(
                        f"append session for {self.segment} is closed",
                        segment=self.segment,
                    )
                broken = self._broken is not None
                if not broken:
                    self._inflight.append(block)
                    self._inflight_bytes += n
                    self._inflight_events += count
                    conn = self._conn
            if broken:
                self._reconnect()
                continue
            assert conn is not None
            try:
                conn.send_parts(parts)
            except SegmentStoreUnreachableError as exc:
                # The block is already in flight: the reconnect resends it.
                with self._cond:
                    if self._conn is conn:
                        self._broken = exc
                self._reconnect()
            return

    def flush(self, timeout_s: float | None = None) -> None:
        """Send what is buffered and return once every event is acknowledged (or raise)."""
        self._raise_error()
        if self._closed:
            raise SegmentStoreError(
                f"append session for {self.segment} is closed", segment=self.segment
            )
        self._send_block()
        limit = self.flush_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        while True:
            with self._cond:
                while self._inflight and self._error is None and self._broken is None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise SegmentStoreError(
                            f"{len(self._inflight)} blocks appended to {self.segment} were not acknowledged within "
                            f"{limit:g} s",
                            segment=self.segment,
                            endpoint=str(self.endpoint),
                        )
                    self._cond.wait(remaining)
                self._raise_error()
                if self._broken is None:
                    return
            self._reconnect()

    @property
    def next_event_number(self) -> int:
        """The event number the next event written will get (event numbers grow by one per event)."""
        return self._next_event_number + self._count

    def unacknowledged_events(self) -> list[tuple[int, bytes]]:
        """(event number, payload) of every event written and not acknowledged, in order: what a
        writer re-routes when the segment was sealed under it (call it once the session failed)."""
        with self._cond:
            acked = self.last_acked_event_number or 0
            out: list[tuple[int, bytes]] = []
            for block in self._inflight:
                _unframe(block.parts[1], block.last - block.count + 1, acked, out)
            _unframe(self._buf, self._next_event_number, acked, out)
            return out

    @property
    def pending_events(self) -> int:
        """Events written but not yet acknowledged (buffered or in flight)."""
        with self._cond:
            return self._count + sum(b.count for b in self._inflight)

    def close(self) -> None:
        """Close the connection; anything not flushed is abandoned."""
        with self._cond:
            self._closed = True
            conn = self._conn
            self._conn = None
            self._cond.notify_all()
        if conn is not None:
            conn.abort()
        reader = self._reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout=5)
