"""Blocking segment-store connections over the sans-IO wire codec: the transport.

* :class:`SegmentStoreConnection` - one TCP (or TLS) connection that has exchanged Hello; ``call``
  sends a request and returns the reply whose request id matches (a mismatch poisons the
  connection), with the current delegation token of the request's stream from a
  :class:`TokenSource` (renewed once when the segment store says it expired).
* :class:`ConnectionPool` - idle connections per endpoint, thread-safe, fork-aware; ``call``
  retries a request once on a fresh connection when the old one broke.

Requests addressed by segment (the owner found through the controller, error replies raised,
failover) are :mod:`.segment_client`'s; appends are :mod:`.appends`'.
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
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.client.controller_types import Endpoint
from airflow_provider_pravega.client.errors import (
    PravegaTLSError,
    SegmentStoreError,
    SegmentStoreUnreachableError,
)
from airflow_provider_pravega.client.security import client_ssl_context, speaks_tls, wrap_client_socket
from airflow_provider_pravega.protocol import wire

__all__ = [
    "ConnectionPool",
    "SegmentStoreConnection",
    "TokenSource",
    "access_of",
    "next_request_id",
]

log = logging.getLogger(__name__)

DEFAULT_CALL_TIMEOUT_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0

# Process-wide request ids, starting at 1 like the Rust client; ``next`` on a count is atomic in CPython.
_REQUEST_IDS = itertools.count(1)


def next_request_id() -> int:
    return next(_REQUEST_IDS)


_WRITE_REQUESTS = frozenset(
    {"SetupAppend", "CreateSegment", "SealSegment", "TruncateSegment", "DeleteSegment", "MergeSegments",
     "CreateTransientSegment", "UpdateSegmentAttribute", "UpdateSegmentPolicy", "CreateTableSegment",
     "DeleteTableSegment", "UpdateTableEntries", "RemoveTableKeys"}
)


def access_of(request: wire.Request) -> str:
    """The delegation-token access a request needs: "write" or "read"."""
    return "write" if type(request).__name__ in _WRITE_REQUESTS else "read"


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
