"""Blocking segment-store connections over the sans-IO wire codec.

Three layers, each reusable by the other client modules (batch reads, synchronizer, writers):

* :class:`SegmentStoreConnection` - one TCP connection that has exchanged Hello; ``call`` sends a
  request and returns the reply whose request id matches (a mismatch poisons the connection).
* :class:`ConnectionPool` - idle connections per endpoint, thread-safe, fork-aware; ``call``
  retries a request once on a fresh connection when the old one broke.
* :class:`SegmentStoreClient` - finds a segment's segment store through the controller (getURI,
  cached), adds the delegation token, maps error replies to exceptions, retries after WrongHost.
* :class:`Failover` - the one policy every path (request/response calls, append sessions,
  conditional appends, batch reads) follows when a segment's store answers ``WrongHost`` or its
  connection fails: forget the cached owner, ask the controller again, back off, and give up after
  bounded tries with :class:`SegmentUnavailableError` naming the segment and the stores tried.

and :class:`AppendSession`, the pipelined writer of one (segment, writer id): many AppendBlockEnd
frames in flight, a reader thread consuming DataAppended acks, ``flush`` that returns only when
everything is acknowledged, and a reconnect that resends exactly the unacknowledged blocks with
their original event numbers (the segment store deduplicates by writer id and event number).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import os
import select
import socket
import ssl
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, Self

from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.client.controller import ControllerClient
from airflow_provider_pravega.client.controller_types import Endpoint
from airflow_provider_pravega.client.errors import (
    AuthenticationError,
    ConditionalAppendFailedError,
    ControllerUnreachableError,
    DelegationTokenError,
    NoSuchSegmentError,
    PravegaError,
    PravegaTLSError,
    SegmentSealedError,
    SegmentStoreError,
    SegmentStoreUnreachableError,
    SegmentTruncatedError,
    SegmentUnavailableError,
)
from airflow_provider_pravega.protocol import naming, wire

__all__ = [
    "AppendConnection",
    "AppendSession",
    "ConnectionPool",
    "Failover",
    "SegmentInfo",
    "SegmentStoreClient",
    "SegmentStoreConnection",
    "TokenSource",
    "access_of",
    "next_request_id",
    "raise_for_reply",
    "set_up_appends",
]

log = logging.getLogger(__name__)

DEFAULT_CALL_TIMEOUT_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
#: How long, and how many times, a segment is followed to a new owner before giving up: long enough
#: for Pravega to reassign a dead store's containers, short enough to surface a real outage.
DEFAULT_FAILOVER_TIMEOUT_S = 30.0
DEFAULT_FAILOVER_ATTEMPTS = 30

# Process-wide request ids, starting at 1 like the Rust client; ``next`` on a count is atomic in CPython.
_REQUEST_IDS = itertools.count(1)


def next_request_id() -> int:
    return next(_REQUEST_IDS)


def raise_for_reply(
    reply: wire.Reply,
    *,
    endpoint: Endpoint | str | None = None,
    segment: str | None = None,
    request: wire.Request | None = None,
    user: str | None = None,
) -> None:
    """Raise the exception matching an error reply; return for any other reply. ``request`` and
    ``user`` only make the message of a refused delegation token more precise."""
    if not getattr(reply, "IS_FAILURE", False) and not isinstance(
        reply, wire.ConditionalCheckFailed
    ):
        return
    where = str(endpoint) if endpoint is not None else None
    name = getattr(reply, "segment", None) or segment or "?"
    at = f" at segment store {where}" if where else ""
    if isinstance(reply, wire.NoSuchSegment):
        raise NoSuchSegmentError(
            f"segment {name} does not exist{at}", segment=name, endpoint=where
        )
    if isinstance(reply, wire.SegmentIsSealed):
        raise SegmentSealedError(
            f"segment {name} is sealed{at}; no more appends are possible (stream sealed or scaled, or the "
            f"transaction already ended)",
            segment=name,
            endpoint=where,
        )
    if isinstance(reply, wire.SegmentIsTruncated):
        raise SegmentTruncatedError(
            f"segment {name} is truncated at offset {reply.start_offset}{at}; offset {reply.offset} is gone",
            segment=name,
            endpoint=where,
            start_offset=reply.start_offset,
        )
    if isinstance(reply, wire.AuthTokenCheckFailed):
        if reply.error_code == wire.AUTH_TOKEN_EXPIRED:
            detail = "the delegation token expired and a fresh one was refused too"
        else:
            detail = (
                "the delegation token was refused (check failed: the user lacks this permission on the "
                "stream, or the token was altered or is for another stream)"
            )
        raise DelegationTokenError(
            f"segment store{(' ' + where) if where else ''}", user, _action_of(request), f"segment {name}",
            f"{detail}; error code {reply.error_code}",
        )
    if isinstance(reply, wire.ConditionalCheckFailed):
        raise ConditionalAppendFailedError(
            f"conditional append to {segment or '?'} failed: the segment is not at the expected offset",
            segment=segment,
            endpoint=where,
        )
    if isinstance(reply, wire.WrongHost):
        raise SegmentStoreError(
            f"segment store {where} does not own segment {name} (it points at {reply.correct_host!r})",
            segment=name,
            endpoint=where,
        )
    detail = getattr(reply, "message", "") or getattr(reply, "server_stack_trace", "")
    raise SegmentStoreError(
        f"segment store{at} refused a request on {name}: {type(reply).__name__}{': ' + detail if detail else ''}",
        segment=name,
        endpoint=where,
    )


_WRITE_REQUESTS = frozenset(
    {"SetupAppend", "CreateSegment", "SealSegment", "TruncateSegment", "DeleteSegment", "MergeSegments",
     "CreateTransientSegment", "UpdateSegmentAttribute", "UpdateSegmentPolicy", "CreateTableSegment",
     "DeleteTableSegment", "UpdateTableEntries", "RemoveTableKeys"}
)


def access_of(request: wire.Request) -> str:
    """The delegation-token access a request needs: "write" or "read"."""
    return "write" if type(request).__name__ in _WRITE_REQUESTS else "read"


def _action_of(request: wire.Request | None) -> str:
    if request is None:
        return "use the segment"
    return f"{access_of(request)} ({type(request).__name__})"


def _segment_of(request: wire.Request) -> str | None:
    for field in ("segment", "segment_name", "target"):
        value = getattr(request, field, None)
        if isinstance(value, str):
            return value
    return None


class TokenSource(Protocol):
    """Where a connection gets the delegation token of a segment's stream (SegmentStoreClient)."""

    def current_token(self, segment: str, access: str = "read") -> str | None: ...

    def renewed_token(self, segment: str, stale: str, access: str = "read") -> str | None: ...


# ----------------------------------------------------------------------------------- connection


def _send_parts(
    sock: socket.socket, parts: list[bytes | bytearray | memoryview]
) -> None:
    """Send all parts without joining them (no copy of a megabyte block)."""
    views = [memoryview(p) for p in parts]
    while views:
        sent = sock.sendmsg(views)
        while sent:
            first = views[0]
            if sent >= first.nbytes:
                sent -= first.nbytes
                views.pop(0)
            else:
                views[0] = first[sent:]
                sent = 0


class SegmentStoreConnection:
    """One connection to a segment store, past the Hello handshake. Not thread-safe."""

    RECV_SIZE = 256 * 1024

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        tls: tuple[PravegaConnectionConfig, ssl.SSLContext] | None = None,
        tokens: TokenSource | None = None,
        user: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.tokens = tokens
        self.user = user
        self._decoder = wire.FrameDecoder("reply")
        self._ready: collections.deque[wire.Reply] = collections.deque()
        self.failed = False
        # OpenSSL forbids using one connection from two threads at once (an append session reads
        # acks in one thread while another sends): with TLS every socket operation holds this lock.
        self._io_lock: threading.Lock | None = None
        self._timeout = timeout_s
        try:
            raw = socket.create_connection(
                (endpoint.host, endpoint.port), timeout=connect_timeout_s
            )
        except OSError as exc:
            raise SegmentStoreUnreachableError(
                f"cannot connect to segment store {endpoint}: {exc.strerror or exc}",
                endpoint=str(endpoint),
            ) from None
        self.sock: socket.socket = raw
        if tls is not None:
            from airflow_provider_pravega.client.security import wrap_client_socket

            config, context = tls
            try:
                self.sock = wrap_client_socket(
                    raw, config, context, endpoint.host, f"segment store {endpoint}", connect_timeout_s
                )
            except BaseException:
                raw.close()
                raise
            self._io_lock = threading.Lock()
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock.settimeout(timeout_s)
            self.send(wire.Hello(wire.WIRE_VERSION, wire.OLDEST_COMPATIBLE_VERSION))
            try:
                hello = self.recv()
            except SegmentStoreUnreachableError:
                if tls is None:
                    from airflow_provider_pravega.client.security import speaks_tls

                    if speaks_tls(endpoint.host, endpoint.port, min(2.0, connect_timeout_s)):
                        raise PravegaTLSError(
                            f"segment store {endpoint}",
                            "the segment store speaks TLS but the connection is plaintext; use a tls:// URI "
                            "(turn the connection's 'tls' on) and set 'trust_store' to the CA certificate",
                        ) from None
                raise
            if not isinstance(hello, wire.Hello):
                raise SegmentStoreError(
                    f"segment store {endpoint} answered Hello with {type(hello).__name__}",
                    endpoint=str(endpoint),
                )
            if not hello.low_version <= wire.WIRE_VERSION <= hello.high_version:
                raise SegmentStoreError(
                    f"segment store {endpoint} speaks wire versions {hello.low_version}-{hello.high_version}, "
                    f"this client speaks {wire.WIRE_VERSION}",
                    endpoint=str(endpoint),
                )
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"SegmentStoreConnection({self.endpoint})"

    def send(self, cmd: wire.Command) -> None:
        self.send_bytes(wire.encode(cmd))

    @property
    def tls(self) -> bool:
        return self._io_lock is not None

    def set_timeout(self, timeout_s: float) -> None:
        """How long a blocking send or receive may wait."""
        self._timeout = timeout_s
        if self._io_lock is None:
            self.sock.settimeout(timeout_s)
        else:
            with self._io_lock:
                self.sock.settimeout(timeout_s)

    def send_bytes(self, data: bytes | bytearray | memoryview) -> None:
        try:
            if self._io_lock is None:
                self.sock.sendall(data)
            else:
                with self._io_lock:
                    self.sock.sendall(data)
        except OSError as exc:
            self.failed = True
            raise SegmentStoreUnreachableError(
                f"connection to segment store {self.endpoint} failed while sending: {exc}",
                endpoint=str(self.endpoint),
            ) from None

    def send_parts(self, parts: list[bytes | bytearray | memoryview]) -> None:
        try:
            if self._io_lock is None:
                _send_parts(self.sock, parts)
            else:  # an SSL socket has no sendmsg
                with self._io_lock:
                    for part in parts:
                        self.sock.sendall(part)
        except OSError as exc:
            self.failed = True
            raise SegmentStoreUnreachableError(
                f"connection to segment store {self.endpoint} failed while sending: {exc}",
                endpoint=str(self.endpoint),
            ) from None

    def recv_some(self) -> bytes:
        """The next bytes from the server (b"" at its end), waiting up to the timeout; raises
        TimeoutError or OSError like ``socket.recv``."""
        return self._receive(lambda sock: sock.recv(self.RECV_SIZE))

    def recv_some_into(self, space: memoryview) -> int:
        """Like :meth:`recv_some`, into ``space``: the number of bytes received (0 at the end)."""
        return self._receive(lambda sock: sock.recv_into(space))

    def _receive(self, read: Callable[[socket.socket], Any]) -> Any:
        if self._io_lock is None:
            return read(self.sock)
        sock = self.sock
        deadline = time.monotonic() + self._timeout
        while True:
            with self._io_lock:
                sock.settimeout(0.0)
                try:
                    return read(sock)
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                    pass
                finally:
                    if sock.fileno() >= 0:
                        sock.settimeout(self._timeout)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no data from segment store {self.endpoint} within {self._timeout:g} s")
            try:
                select.select([sock], [], [], min(remaining, 1.0))
            except (ValueError, OSError) as exc:  # closed by another thread
                raise OSError(f"connection to segment store {self.endpoint} was closed") from exc

    def recv(self) -> wire.Reply:
        """The next reply frame (blocking up to the socket timeout)."""
        decoder = self._decoder
        while not self._ready:
            space = decoder.frame_space()  # a large frame under way: received straight into its buffer
            try:
                data = self.recv_some() if space is None else self.recv_some_into(space)
            except TimeoutError:
                self.failed = True
                raise SegmentStoreUnreachableError(
                    f"segment store {self.endpoint} did not answer within {self.timeout_s:g} s",
                    endpoint=str(self.endpoint),
                ) from None
            except OSError as exc:
                self.failed = True
                raise SegmentStoreUnreachableError(
                    f"connection to segment store {self.endpoint} failed: {exc}",
                    endpoint=str(self.endpoint),
                ) from None
            if not data:
                self.failed = True
                raise SegmentStoreUnreachableError(
                    f"segment store {self.endpoint} closed the connection",
                    endpoint=str(self.endpoint),
                )
            try:
                self._ready.extend(decoder.feed(data) if space is None else decoder.filled(data))
            except wire.ProtocolError as exc:
                self.failed = True
                raise SegmentStoreError(
                    f"segment store {self.endpoint} sent an invalid frame: {exc}",
                    endpoint=str(self.endpoint),
                ) from None
        return self._ready.popleft()

    def call(self, request: wire.Request) -> wire.Reply:
        """Send ``request`` and return its reply (which may be an error reply: see raise_for_reply).

        With a token source, a request carrying a delegation token is sent with the current token
        of its stream (so callers holding an old one still work), and when the segment store says
        the token expired (AuthTokenCheckFailed code 1), a fresh token is fetched and the request
        sent once more.
        """
        token = getattr(request, "delegation_token", None)
        if not token or self.tokens is None:
            return self._exchange(request)
        segment = _segment_of(request)
        if segment is None:
            return self._exchange(request)
        access = access_of(request)
        current = self.tokens.current_token(segment, access)
        if current and current != token:
            request = dataclasses.replace(request, delegation_token=current)  # type: ignore[type-var]
            token = current
        reply = self._exchange(request)
        if type(reply) is wire.AuthTokenCheckFailed and reply.error_code == wire.AUTH_TOKEN_EXPIRED:
            fresh = self.tokens.renewed_token(segment, token, access)
            if fresh and fresh != token:
                log.info("delegation token for %s expired; retrying with a fresh one", segment)
                request = dataclasses.replace(  # type: ignore[type-var]
                    request, delegation_token=fresh, request_id=next_request_id()
                )
                reply = self._exchange(request)
        return reply

    def _exchange(self, request: wire.Request) -> wire.Reply:
        self.send(request)
        want = wire.request_id_of(request)
        while True:
            reply = self.recv()
            if isinstance(reply, wire.KeepAlive):
                continue
            got = getattr(reply, "request_id", None)
            if got is not None and got != want:
                self.failed = True
                self.close()
                raise SegmentStoreError(
                    f"segment store {self.endpoint} answered request {want} with {type(reply).__name__} for "
                    f"request {got}; the connection was dropped",
                    endpoint=str(self.endpoint),
                )
            return reply

    def close(self) -> None:
        self.failed = True
        try:
            self.sock.close()
        except OSError:
            pass

    def abort(self) -> None:
        """Close and wake any thread blocked in recv on this socket (close alone does not)."""
        lock = self._io_lock
        held = lock.acquire(timeout=1.0) if lock is not None else False
        try:
            try:
                # For TLS, shut down the TCP socket underneath (no close_notify exchange to wait for).
                socket.socket.shutdown(self.sock, socket.SHUT_RDWR)
            except OSError:
                pass
            self.close()
        finally:
            if held and lock is not None:
                lock.release()


class ConnectionPool:
    """Idle request/response connections per endpoint; safe to share between threads.

    After ``os.fork`` the child drops (without closing) the parent's connections, so a pool built
    in a Spark driver never shares a socket with a forked worker.
    """

    def __init__(
        self,
        *,
        timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        max_idle_per_endpoint: int = 8,
        config: PravegaConnectionConfig | None = None,
        tokens: TokenSource | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_idle = max_idle_per_endpoint
        #: Connections use TLS (with this configuration's trust store) when it has TLS on.
        self.config = config
        self._tls: tuple[PravegaConnectionConfig, ssl.SSLContext] | None = None
        if config is not None and config.tls_enabled:
            from airflow_provider_pravega.client.security import client_ssl_context

            self._tls = (config, client_ssl_context(config))
        #: Supplies current delegation tokens to the connections (set by SegmentStoreClient).
        self.tokens = tokens
        self._idle: dict[Endpoint, list[SegmentStoreConnection]] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False

    def connect(self, endpoint: Endpoint) -> SegmentStoreConnection:
        """A new dedicated connection (e.g. for an append session), not taken from the pool."""
        return SegmentStoreConnection(
            endpoint,
            timeout_s=self.timeout_s,
            connect_timeout_s=self.connect_timeout_s,
            tls=self._tls,
            tokens=self.tokens,
            user=self.config.username if self.config is not None else None,
        )

    def _take(self, endpoint: Endpoint) -> SegmentStoreConnection | None:
        with self._lock:
            if self._pid != os.getpid():
                self._idle = {}
                self._pid = os.getpid()
            idle = self._idle.get(endpoint)
            while idle:
                conn = idle.pop()
                if not conn.failed:
                    return conn
        return None

    def _give(self, conn: SegmentStoreConnection) -> None:
        if conn.failed:
            conn.close()
            return
        with self._lock:
            if not self._closed and self._pid == os.getpid():
                idle = self._idle.setdefault(conn.endpoint, [])
                if len(idle) < self.max_idle:
                    idle.append(conn)
                    return
        conn.close()

    @contextmanager
    def connection(self, endpoint: Endpoint) -> Iterator[SegmentStoreConnection]:
        """Borrow a connection; it goes back to the pool unless it failed or an error escaped."""
        conn = self._take(endpoint) or self.connect(endpoint)
        ok = False
        try:
            yield conn
            ok = True
        finally:
            if ok:
                self._give(conn)
            else:
                conn.close()

    def call(
        self, endpoint: Endpoint, request: wire.Request, *, attempts: int = 3
    ) -> wire.Reply:
        """Request/response with a retry on a fresh connection (and a fresh request id) if one breaks."""
        last: Exception | None = None
        for attempt in range(attempts):
            if attempt:
                if hasattr(request, "request_id"):
                    request = dataclasses.replace(request, request_id=next_request_id())  # type: ignore[type-var]
                time.sleep(min(0.05 * 2**attempt, 1.0))
            try:
                with self.connection(endpoint) as conn:
                    return conn.call(request)
            except SegmentStoreUnreachableError as exc:
                last = exc
        assert last is not None
        raise last

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()


# ------------------------------------------------------------------------------ segment client


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """GetStreamSegmentInfo: ``length`` is the write offset (tail), ``start_offset`` the head."""

    name: str
    length: int
    start_offset: int
    sealed: bool
    last_modified_ms: int


class SegmentStoreClient:
    """Segment requests addressed by qualified segment name (transaction segments included)."""

    def __init__(
        self, controller: ControllerClient, pool: ConnectionPool | None = None
    ) -> None:
        #: Bounds of :class:`Failover` (time and tries) for every segment this client follows.
        self.failover_timeout_s = DEFAULT_FAILOVER_TIMEOUT_S
        self.failover_attempts = DEFAULT_FAILOVER_ATTEMPTS
        self.controller = controller
        self.pool = pool or ConnectionPool(config=controller.config)
        self._own_pool = pool is None
        if self.pool.tokens is None:
            self.pool.tokens = self

    def close(self) -> None:
        if self._own_pool:
            self.pool.close()

    @staticmethod
    def locate(segment: str) -> naming.SegmentName:
        """(scope, stream, segment id) of a qualified (or transaction) segment name."""
        return naming.parse_qualified_segment_name(segment)

    def endpoint_for(self, segment: str) -> Endpoint:
        scope, stream, segment_id = self.locate(segment)
        return self.controller.get_uri(scope, stream, segment_id)

    def token_for(self, segment: str, access: str = "read") -> str:
        """The delegation token of the segment's stream for reading (default) or writing."""
        scope, stream, _ = self.locate(segment)
        return self.controller.get_delegation_token(scope, stream, access)

    # TokenSource: what the pool's connections ask before sending a request that carries a token.
    def current_token(self, segment: str, access: str = "read") -> str | None:
        """:meth:`token_for`, or None for a name that is not a stream segment's."""
        try:
            self.locate(segment)
        except ValueError:
            return None
        return self.token_for(segment, access)

    def renewed_token(self, segment: str, stale: str, access: str = "read") -> str | None:
        try:
            scope, stream, _ = self.locate(segment)
        except ValueError:
            return None
        return self.controller.renew_delegation_token(scope, stream, stale, access)

    def forget_endpoint(self, segment: str) -> None:
        scope, stream, segment_id = self.locate(segment)
        self.controller.invalidate_uri(scope, stream, segment_id)

    def failover(self, segment: str, what: str, *, timeout_s: float | None = None) -> Failover:
        """A :class:`Failover` for ``segment`` (``what``: the operation, for the error message)."""
        return Failover(self, segment, what, timeout_s=timeout_s)

    def call(
        self,
        segment: str,
        build: Callable[[int, str], wire.Request],
        *,
        check: bool = True,
    ) -> wire.Reply:
        """``build(request_id, delegation_token)`` makes the request; errors raise (unless ``check``
        is false), WrongHost and broken connections are retried on the segment's current owner
        (:class:`Failover`)."""
        token = self.token_for(segment, access_of(build(0, "")))
        failover: Failover | None = None
        while True:
            endpoint = self.endpoint_for(segment)
            request = build(next_request_id(), token)
            try:
                reply = self.pool.call(endpoint, request, attempts=2)
            except SegmentStoreUnreachableError as exc:
                failover = failover or self.failover(segment, type(request).__name__)
                failover.retry(exc, endpoint)
                continue
            if isinstance(reply, wire.WrongHost):
                failover = failover or self.failover(segment, type(request).__name__)
                failover.retry(f"WrongHost from {endpoint}", endpoint)
                continue
            if check:
                raise_for_reply(
                    reply, endpoint=endpoint, segment=segment, request=request, user=self.controller.username
                )
            return reply

    def get_segment_info(self, segment: str) -> SegmentInfo:
        reply = self.call(
            segment, lambda rid, tok: wire.GetStreamSegmentInfo(rid, segment, tok)
        )
        if not isinstance(reply, wire.StreamSegmentInfo):
            raise SegmentStoreError(
                f"unexpected reply {type(reply).__name__} to GetStreamSegmentInfo",
                segment=segment,
            )
        if not reply.exists or reply.is_deleted:
            raise NoSuchSegmentError(
                f"segment {segment} does not exist", segment=segment
            )
        return SegmentInfo(
            segment,
            reply.write_offset,
            reply.start_offset,
            reply.is_sealed,
            reply.last_modified,
        )

    def read_segment(self, segment: str, offset: int, length: int) -> wire.SegmentRead:
        """One ReadSegment; the reply may hold fewer bytes (and parks at the tail on the server)."""
        reply = self.call(
            segment,
            lambda rid, tok: wire.ReadSegment(segment, offset, length, tok, rid),
        )
        if not isinstance(reply, wire.SegmentRead):
            raise SegmentStoreError(
                f"unexpected reply {type(reply).__name__} to ReadSegment",
                segment=segment,
            )
        if reply.offset != offset:
            raise SegmentStoreError(
                f"segment store answered a read of {segment} at {offset} with offset {reply.offset}",
                segment=segment,
            )
        return reply

    def truncate_segment(self, segment: str, offset: int) -> None:
        self.call(
            segment, lambda rid, tok: wire.TruncateSegment(rid, segment, offset, tok)
        )

    def seal_segment(self, segment: str) -> None:
        try:
            self.call(segment, lambda rid, tok: wire.SealSegment(rid, segment, tok))
        except SegmentSealedError:
            pass  # sealing twice is success

    def open_append_session(self, segment: str, **options: Any) -> AppendSession:
        session = AppendSession(self, segment, **options)
        session.open()
        return session


class Failover:
    """Following one segment to the store that owns it now, within bounds.

    Every path that talks to a segment store about a segment (request/response calls, append
    sessions, the synchronizer's conditional appends, batch reads) reports each failure to reach the
    segment (a lost or refused connection, ``WrongHost``) with :meth:`retry`: the cached owner is
    forgotten, so the next :meth:`SegmentStoreClient.endpoint_for` asks the controller's getURI
    again, and the caller resumes there (appends by SetupAppend and the writer's last event number,
    reads at their offset). The first retry is immediate (a moved container is served at once),
    later ones back off up to 1 s. After ``segments.failover_attempts`` failures or
    ``timeout_s`` (default ``segments.failover_timeout_s``) without progress, :meth:`retry` raises
    :class:`SegmentUnavailableError` naming the segment and the stores tried. :meth:`progress`
    resets the bounds (a long read or write may fail over many times)."""

    def __init__(self, segments: SegmentStoreClient, segment: str, what: str, *,
                 timeout_s: float | None = None) -> None:
        self.segments = segments
        self.segment = segment
        self.what = what
        self.timeout_s = segments.failover_timeout_s if timeout_s is None else timeout_s
        self.max_attempts = segments.failover_attempts
        self.tried: list[str] = []
        self.failures = 0
        self._since: float | None = None
        self._delay = 0.0

    def retry(self, cause: object, endpoint: Endpoint | str | None = None) -> None:
        """Record a failure; forget the cached owner; wait before the next try, or raise
        SegmentUnavailableError when the bounds are used up."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
        self.failures += 1
        where = str(endpoint) if endpoint is not None else getattr(cause, "endpoint", None)
        if where and (not self.tried or self.tried[-1] != where):
            self.tried.append(where)
        try:
            self.segments.forget_endpoint(self.segment)
        except ValueError:  # not a stream segment's name: no controller lookup to redo
            pass
        elapsed = now - self._since
        if self.failures >= self.max_attempts or elapsed + self._delay > self.timeout_s:
            stores = ", ".join(self.tried) if self.tried else "none (the controller named no store)"
            raise SegmentUnavailableError(
                f"segment {self.segment} is unavailable: {self.what} failed {self.failures} times in "
                f"{elapsed:.1f} s (bounds: {self.max_attempts} tries, {self.timeout_s:g} s); segment stores "
                f"tried: {stores}; last error: {cause}",
                segment=self.segment,
                endpoints=self.tried,
                attempts=self.failures,
            ) from (cause if isinstance(cause, BaseException) else None)
        log.info("%s on %s failed (%s); asking the controller for its owner again", self.what, self.segment, cause)
        if self._delay:
            time.sleep(self._delay)
        self._delay = min(max(self._delay * 2, 0.05), 1.0)

    def progress(self) -> None:
        """The segment answered: the bounds start afresh at the next failure."""
        if self.failures:
            self.failures = 0
            self._since = None
            self._delay = 0.0
            self.tried = []


# ----------------------------------------------------------------------------------- appends

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
        """Queue many events; returns how many."""
        write = self.write_event
        count = 0
        for payload in payloads:
            write(payload)
            count += 1
        return count

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
