"""Typed, fail-fast client of the Pravega controller's gRPC API.

Why not the official binding: it retries every controller error (and an unreachable controller)
for about a minute before Python sees anything, and it lacks transaction status/ping, scaling,
truncation and the segment queries the provider needs. This client checks that the controller
accepts TCP connections before its first call, puts a gRPC deadline on every call, and maps every
status to a return value or to one of the exceptions in :mod:`.errors` (what each RPC's answers
mean is one table, :mod:`.controller_replies`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Self

# gRPC >= 1.81 restarts its poller in a fork()ed child (grpc/grpc#43055): a subprocess started with
# preexec_fn after a channel was used — PySpark launching its JVM once an ingest found work, for
# one — aborts before exec now and then. Its fork handlers only serve processes that keep using
# gRPC after fork without exec, which nothing here does. Read when grpc is first imported; a value
# set by the user wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc  # noqa: E402

from airflow_provider_pravega._clock import now_ms
from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.client.controller_replies import (
    ANSWERS,
    MISSING,
    NOT_FOUND,
    PRECONDITION,
    RAISE,
    REFUSED_ARGUMENT,
    About,
    Refusal,
)
from airflow_provider_pravega.client.controller_types import (
    I64_MAX,
    I64_MIN,
    Endpoint,
    RetentionPolicy,
    ScalingPolicy,
    SegmentRange,
    StreamConfiguration,
    SuccessorSegment,
    TransactionInfo,
    TxnStatus,
    parse_controller_uris,
)
from airflow_provider_pravega.client.errors import (
    ControllerError,
    ControllerUnreachableError,
    InvalidStreamCutError,
    PravegaAuthenticationError,
    PravegaPermissionError,
    PravegaTLSError,
    ScopeNotFoundError,
    StreamNotFoundError,
)
from airflow_provider_pravega.client.security import (
    CallCredentials,
    TokenCache,
    certificate_name,
    grpc_channel_credentials,
    speaks_tls,
    tls_handshake,
)
from airflow_provider_pravega.protocol import controller_pb2 as pb
from airflow_provider_pravega.protocol import controller_pb2_grpc as pb_grpc
from airflow_provider_pravega.protocol import naming

__all__ = ["ControllerClient"]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_CONNECT_TIMEOUT_S = 3.0
#: Commit and scale may merge/seal many segments on the server; give them more time than a lookup.
LONG_TIMEOUT_S = 120.0


# --------------------------------------------------------------------------------------- client


class _StreamBeingCreated(ControllerError):
    """Internal: Pravega's controller answers INTERNAL "State: CREATING" for a stream another
    process is still creating (``checkStreamExists`` already says it exists)."""


class _Recovering(Exception):
    """Internal: the controller gave no answer in time, or INTERNAL; ``error`` is the caller's error
    should asking again not help."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


#: How long a call waits for a stream that another process is still creating.
STREAM_CREATING_WAIT_S = 30.0

#: How long a read-only call keeps asking while the controller cannot answer it (no answer within
#: the call's timeout, or INTERNAL): when a segment store dies, the controller's own metadata tables
#: may sit in one of its containers until Pravega has recovered them on another store (ZooKeeper's
#: 10 s session timeout, then the log's recovery: about 15 s on a test cluster).
RECOVERY_WAIT_S = 30.0
#: The calls that only read, so asking again cannot change anything on the server.
_READ_ONLY = frozenset({
    "listScopes", "checkScopeExists", "checkStreamExists", "listStreamsInScope", "getStreamConfiguration",
    "getCurrentSegments", "getEpochSegments", "getSegments", "getSegmentsBetween",
    "getSegmentsImmediatelyFollowing", "getURI", "checkTransactionState", "checkScale",
})


class ControllerClient:
    """Blocking controller client; thread-safe (gRPC channels are), one channel per instance.

    ``target`` is a controller URI (``tcp://host:9090``, ``tls://…``) or a
    :class:`PravegaConnectionConfig` (which also supplies credentials and the TLS trust store).
    """

    def __init__(
        self,
        target: str | PravegaConnectionConfig,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        long_timeout_s: float = LONG_TIMEOUT_S,
    ) -> None:
        if isinstance(target, PravegaConnectionConfig):
            self.config: PravegaConnectionConfig | None = target
            self.uri = target.controller_uri
            self._controllers = tuple(Endpoint(h, p) for h, p in target.controllers)
            self._tls = target.tls_enabled
        else:
            self.config = None
            self.uri = target.strip()
            self._controllers, self._tls = parse_controller_uris(self.uri)
        #: The controller in use; the next one in the list is tried when it cannot be reached.
        self._current = 0
        if timeout_s <= 0 or connect_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        self.timeout_s = float(timeout_s)
        #: How long a read-only call is asked again while the controller cannot answer it.
        self.recovery_wait_s = RECOVERY_WAIT_S
        self.connect_timeout_s = float(min(connect_timeout_s, timeout_s))
        self.long_timeout_s = float(max(long_timeout_s, timeout_s))
        # Sent with every RPC; never logged (repr shows the URI only).
        self._metadata = CallCredentials(self.config)
        self.username: str | None = self._metadata.principal
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: pb_grpc.ControllerServiceStub | None = None
        self._uri_cache: dict[tuple[str, str, int], Endpoint] = {}
        #: Delegation tokens per (scope, stream), refreshed before their JWT expiry.
        self.tokens = TokenCache(self._fetch_delegation_token)
        self._closed = False

    # ------------------------------------------------------------------------------ plumbing

    def __repr__(self) -> str:
        return f"ControllerClient({self.uri!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._channel is not None:
                self._channel.close()
            self._channel = None
            self._stub = None

    @property
    def current_controller(self) -> Endpoint:
        """The controller this client talks to now (the first of its list that answered)."""
        return self._controllers[self._current]

    def _probe(self, endpoint: Endpoint) -> str | None:
        """A plain TCP connect (with TLS: a full handshake), so a dead controller or a TLS mismatch
        is reported in seconds, not after gRPC's backoff. Returns the name the server certificate
        carries when TLS is on and host names are not validated (for gRPC's target-name override)."""
        where = f"{self.uri}" if len(self._controllers) == 1 else f"{endpoint} (of {self.uri})"
        try:
            if self._tls and self.config is not None:
                cert = tls_handshake(
                    self.config, endpoint.host, endpoint.port, self.connect_timeout_s,
                    where=f"controller {where}",
                )
                return None if self.config.validate_hostname else certificate_name(cert)
            with socket.create_connection(
                (endpoint.host, endpoint.port), timeout=self.connect_timeout_s
            ):
                pass
            return None
        except PravegaTLSError:
            raise
        except TimeoutError:
            raise ControllerUnreachableError(
                where, f"no TCP connection within {self.connect_timeout_s:g} s"
            ) from None
        except OSError as exc:
            raise ControllerUnreachableError(
                where, exc.strerror or str(exc)
            ) from None

    def _connect(self) -> str | None:
        """Probe the controllers from the one in use onwards and keep the first that answers."""
        failures: list[str] = []
        count = len(self._controllers)
        for step in range(count):
            index = (self._current + step) % count
            try:
                name_override = self._probe(self._controllers[index])
            except ControllerUnreachableError as exc:
                if count == 1:
                    raise
                failures.append(f"{self._controllers[index]}: {exc.reason}")
                continue
            self._current = index
            return name_override
        raise ControllerUnreachableError(
            self.uri, "no controller of the list answered (" + "; ".join(failures) + ")"
        )

    def _get_stub(self) -> pb_grpc.ControllerServiceStub:
        stub = self._stub
        if stub is not None:
            return stub
        with self._lock:
            if self._closed:
                raise ControllerError(f"controller client for {self.uri} is closed")
            if self._stub is None:
                name_override = self._connect()
                endpoint = self.current_controller
                target = (
                    f"[{endpoint.host}]:{endpoint.port}"
                    if ":" in endpoint.host
                    else f"{endpoint.host}:{endpoint.port}"
                )
                options = [
                    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                    ("grpc.enable_retries", 0),
                    # Reconnect quickly after a controller restart instead of gRPC's growing backoff.
                    ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 2000),
                ]
                if self._tls:
                    if name_override:
                        # validate_hostname=False: the chain is still verified against the trust
                        # store; gRPC checks the certificate against its own name instead of ours.
                        options.append(("grpc.ssl_target_name_override", name_override))
                    self._channel = grpc.secure_channel(
                        target, grpc_channel_credentials(self.config), options=options
                    )
                else:
                    self._channel = grpc.insecure_channel(target, options=options)
                self._stub = pb_grpc.ControllerServiceStub(self._channel)
            return self._stub

    def _fail_over(self, stub: pb_grpc.ControllerServiceStub) -> bool:
        """The controller behind ``stub`` stopped answering: aim at the next one of the list.
        False when there is no other controller to try."""
        if len(self._controllers) == 1:
            return False
        with self._lock:
            if self._stub is stub and not self._closed:  # another thread may have moved on already
                if self._channel is not None:
                    self._channel.close()
                self._channel = None
                self._stub = None
                self._current = (self._current + 1) % len(self._controllers)
        return True

    def _call(self, method: str, request: Any, *, timeout: float | None = None) -> Any:
        """One RPC, failing over along the controller list; a read-only call that gets no answer
        or INTERNAL is asked again (backing off) for up to ``recovery_wait_s``."""
        if method not in _READ_ONLY:  # a change is not asked again: the caller's error, as is
            try:
                return self._call_once(method, request, timeout=timeout)
            except _Recovering as exc:
                raise exc.error from None
        give_up = time.monotonic() + self.recovery_wait_s
        delay = 0.5
        while True:
            try:
                return self._call_once(method, request, timeout=timeout)
            except _Recovering as exc:
                if time.monotonic() + delay > give_up:
                    raise exc.error from None
                log.info("controller %s: %s; asking again in %.1f s (a segment store may be recovering)",
                         self.uri, exc.error, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _call_once(self, method: str, request: Any, *, timeout: float | None = None) -> Any:
        deadline = self.timeout_s if timeout is None else timeout
        # Each controller of the list gets one try when the one before it is unavailable: the
        # official clients retry a call on another controller the same way.
        for tries_left in range(len(self._controllers) - 1, -1, -1):
            stub = self._get_stub()
            try:
                return getattr(stub, method)(
                    request, timeout=deadline, metadata=self._metadata.headers() or None
                )
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                details = (exc.details() if hasattr(exc, "details") else "") or ""
                if code == grpc.StatusCode.UNAVAILABLE and tries_left and self._fail_over(stub):
                    continue
                error = self._call_error(method, request, deadline, exc)
                if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL) and not isinstance(
                        error, _StreamBeingCreated):
                    raise _Recovering(error) from None
                raise error from None
        raise AssertionError("unreachable")  # the loop returns or raises

    def _call_error(self, method: str, request: Any, deadline: float, exc: grpc.RpcError) -> Exception:
        """The client's error for a failed RPC."""
        code = exc.code() if hasattr(exc, "code") else None
        details = (exc.details() if hasattr(exc, "details") else "") or ""
        if code == grpc.StatusCode.UNAVAILABLE:
            return self._unavailable(method, details)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return ControllerUnreachableError(
                self.uri, f"no answer to {method} within {deadline:g} s"
            )
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return PravegaAuthenticationError(
                self.uri, self.username, method, details
            )
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return PravegaPermissionError(
                f"controller at {self.uri}", self.username, method, _resource_of(request), details
            )
        if code == grpc.StatusCode.NOT_FOUND:
            return Refusal(NOT_FOUND, details)
        if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE):
            return Refusal(REFUSED_ARGUMENT, details)
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            return Refusal(PRECONDITION, details)
        if code == grpc.StatusCode.INTERNAL and "State: CREATING" in details:
            return _StreamBeingCreated(
                f"controller {self.uri} failed {method}: INTERNAL: {details}"
            )
        return ControllerError(
            f"controller {self.uri} failed {method}: {code.name if code else 'error'}: {details}"
        )

    def _unavailable(self, method: str, details: str) -> Exception:
        """UNAVAILABLE: a dead controller, or a TLS mismatch that the handshake probe cannot see
        (a plaintext channel to a TLS controller)."""
        lowered = details.lower()
        if self._tls and any(w in lowered for w in ("handshake", "certificate", "ssl", "tls")):
            return PravegaTLSError(f"controller {self.uri}", f"{method}: {details}")
        endpoint = self.current_controller
        if not self._tls and speaks_tls(endpoint.host, endpoint.port, min(2.0, self.connect_timeout_s)):
            return PravegaTLSError(
                f"controller {self.uri}",
                "the controller speaks TLS but the connection is plaintext; use a tls:// URI (turn the "
                "connection's 'tls' on) and set 'trust_store' to the CA certificate",
            )
        return ControllerUnreachableError(self.uri, f"{method}: {details or 'unavailable'}")

    def _missing(self, scope: str, stream: str | None = None) -> Exception:
        """Whether the scope or only the stream is missing (the controller's NOT_FOUND does not say)."""
        try:
            scope_there = self.scope_exists(scope)
        except ControllerError:
            scope_there = True
        if not scope_there:
            return ScopeNotFoundError(scope)
        return StreamNotFoundError(scope, stream or "")

    def _ask(self, method: str, request: Any, *, timeout: float | None = None, **about: Any) -> Any:
        """One RPC, answered as its entry in :data:`.controller_replies.ANSWERS` says: a value, the
        reply, or an exception. ``about`` (scope, stream, txn_id, what...) fills the messages."""
        answers = ANSWERS[method]
        subject = About(self.uri, method, **about)
        deadline = time.monotonic() + STREAM_CREATING_WAIT_S
        delay = 0.05
        while True:
            try:
                reply = self._call(method, request, timeout=timeout)
            except Refusal as refusal:
                outcome = answers.of_refusal(refusal, subject)
                if outcome is RAISE:
                    raise
                return self._settled(outcome, subject)
            except _StreamBeingCreated:
                if not answers.wait_while_creating:
                    raise
                # Another process is creating it (two tries of a task, say): wait for it to finish.
                if time.monotonic() >= deadline:
                    raise ControllerError(
                        f"{method} on {subject.scope}/{subject.stream}: the stream was still being created after "
                        f"{STREAM_CREATING_WAIT_S:g} s; if a controller or segment store was lost while it was "
                        f"created, creating it again finishes it (StreamAdmin.ensure_stream or "
                        f"PravegaCreateStreamOperator: Pravega keeps the configuration first given)"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            return self._settled(answers.of_reply(reply, subject), subject)

    def _settled(self, outcome: Any, subject: About) -> Any:
        """An answer's outcome made final: an exception is raised, MISSING asks which of scope and
        stream is gone, anything else is returned."""
        if outcome is MISSING:
            raise self._missing(subject.scope, subject.stream) from None
        if isinstance(outcome, BaseException):
            raise outcome from None
        return outcome

    @staticmethod
    def _stream_info(scope: str, stream: str) -> pb.StreamInfo:
        return pb.StreamInfo(scope=scope, stream=stream)

    # -------------------------------------------------------------------------------- scopes

    def create_scope(self, scope: str) -> bool:
        """True when created, False when it already existed."""
        return self._ask("createScope", pb.ScopeInfo(scope=scope), scope=scope)

    def delete_scope(self, scope: str) -> bool:
        """True when deleted, False when it did not exist."""
        return self._ask("deleteScope", pb.ScopeInfo(scope=scope), scope=scope)

    def scope_exists(self, scope: str) -> bool:
        return self._ask("checkScopeExists", pb.ScopeInfo(scope=scope), scope=scope)

    def list_scopes(self) -> list[str]:
        names: list[str] = []
        token = ""
        for _ in range(100_000):
            reply = self._ask(
                "listScopes",
                pb.ScopesRequest(continuationToken=pb.ContinuationToken(token=token)),
            )
            if not reply.scopes:
                break
            names.extend(reply.scopes)
            next_token = reply.continuationToken.token
            if next_token == token:  # a server that would repeat the same page forever
                break
            token = next_token
        return names

    # ------------------------------------------------------------------------------- streams

    def create_stream(
        self,
        scope: str,
        stream: str,
        scaling: ScalingPolicy,
        retention: RetentionPolicy | None = None,
        tags: Sequence[str] | None = None,
    ) -> bool:
        """True when created, False when it already existed."""
        config = self._stream_config(scope, stream, scaling, retention, tags)
        return self._ask("createStream", config, scope=scope, stream=stream)

    def update_stream(
        self,
        scope: str,
        stream: str,
        scaling: ScalingPolicy,
        retention: RetentionPolicy | None = None,
        tags: Sequence[str] | None = None,
    ) -> None:
        config = self._stream_config(scope, stream, scaling, retention, tags)
        self._ask("updateStream", config, scope=scope, stream=stream)

    @staticmethod
    def _stream_config(
        scope: str,
        stream: str,
        scaling: ScalingPolicy,
        retention: RetentionPolicy | None,
        tags: Sequence[str] | None,
    ) -> pb.StreamConfig:
        config = pb.StreamConfig(
            streamInfo=pb.StreamInfo(scope=scope, stream=stream),
            scalingPolicy=scaling.to_proto(),
        )
        if retention is not None:
            config.retentionPolicy.CopyFrom(retention.to_proto())
        else:
            config.retentionPolicy.CopyFrom(
                pb.RetentionPolicy(
                    retentionType=pb.RetentionPolicy.UNKNOWN,
                    retentionParam=0,
                    retentionMax=I64_MAX,
                )
            )
        if tags is not None:
            if isinstance(tags, str):
                raise ValueError("tags must be a list of strings, not one string")
            config.tags.CopyFrom(pb.Tags(tag=list(tags)))
        return config

    def get_stream_configuration(self, scope: str, stream: str) -> StreamConfiguration:
        msg = self._ask(
            "getStreamConfiguration", self._stream_info(scope, stream), scope=scope, stream=stream
        )
        tags = tuple(msg.tags.tag) if msg.HasField("tags") else None
        retention = (
            RetentionPolicy.from_proto(msg.retentionPolicy)
            if msg.HasField("retentionPolicy")
            else None
        )
        return StreamConfiguration(
            scope, stream, ScalingPolicy.from_proto(msg.scalingPolicy), retention, tags
        )

    def stream_exists(self, scope: str, stream: str) -> bool:
        return self._ask("checkStreamExists", self._stream_info(scope, stream), scope=scope, stream=stream)

    def list_streams(self, scope: str) -> list[str]:
        names: list[str] = []
        token = ""
        for _ in range(100_000):
            request = pb.StreamsInScopeRequest(
                scope=pb.ScopeInfo(scope=scope),
                continuationToken=pb.ContinuationToken(token=token),
            )
            reply = self._ask("listStreamsInScope", request, scope=scope)
            if not reply.streams:
                break
            names.extend(s.stream for s in reply.streams)
            next_token = reply.continuationToken.token
            if next_token == token:
                break
            token = next_token
        return names

    def seal_stream(self, scope: str, stream: str) -> None:
        self._ask(
            "sealStream", self._stream_info(scope, stream), scope=scope, stream=stream, timeout=self.long_timeout_s
        )

    def delete_stream(self, scope: str, stream: str) -> bool:
        """True when deleted, False when it did not exist; the stream must be sealed first."""
        return self._ask(
            "deleteStream", self._stream_info(scope, stream), scope=scope, stream=stream, timeout=self.long_timeout_s
        )

    def truncate_stream(self, scope: str, stream: str, cut: Mapping[int, int]) -> None:
        """Make everything before ``cut`` (segment id -> offset) unreadable."""
        request = pb.StreamCut(
            streamInfo=self._stream_info(scope, stream), cut=_cut_map(cut)
        )
        self._ask(
            "truncateStream", request, scope=scope, stream=stream, what=f"{scope}/{stream} at {dict(cut)}",
            timeout=self.long_timeout_s,
        )

    # ------------------------------------------------------------------------------ segments

    def get_current_segments(self, scope: str, stream: str) -> list[SegmentRange]:
        """The active segments (routing table), ordered by key range."""
        reply = self._ask(
            "getCurrentSegments", self._stream_info(scope, stream), scope=scope, stream=stream
        )
        return _ranges(reply.segmentRanges)

    def get_last_segments(self, scope: str, stream: str) -> list[SegmentRange]:
        """The segments the stream ends with, ordered by key range: the current ones, or — for a
        sealed stream, whose current segments Pravega 0.13 answers as none — those of its last
        epoch (sealed, still readable; the tail of a sealed stream is their final lengths)."""
        current = self.get_current_segments(scope, stream)
        if current:
            return current
        # Every epoch creates at least one segment numbered with it, so the newest segment id
        # between the head and the end names the last epoch. (Pravega refuses getSegmentsBetween
        # with both cuts empty, so the head is given.)
        between = self.get_segments_between(
            scope, stream, self.get_segments_at_head(scope, stream), None
        )
        if not between:
            return []
        last_epoch = max(naming.segment_epoch(s) for s in between)
        return sorted(
            self.get_epoch_segments(scope, stream, last_epoch), key=lambda s: s.min_key
        )

    def get_epoch_segments(
        self, scope: str, stream: str, epoch: int
    ) -> list[SegmentRange]:
        request = pb.GetEpochSegmentsRequest(
            streamInfo=self._stream_info(scope, stream), epoch=epoch
        )
        reply = self._ask("getEpochSegments", request, scope=scope, stream=stream, what=f"epoch {epoch}")
        return _ranges(reply.segmentRanges)

    def get_segments_at_head(self, scope: str, stream: str) -> dict[int, int]:
        """The stream's head: segment id -> first readable offset (getSegments at time 0)."""
        request = pb.GetSegmentsRequest(
            streamInfo=self._stream_info(scope, stream), timestamp=0
        )
        reply = self._ask("getSegments", request, scope=scope, stream=stream)
        return {loc.segmentId.segmentId: loc.offset for loc in reply.segments}

    def get_successors(
        self, scope: str, stream: str, segment_id: int
    ) -> list[SuccessorSegment]:
        """Segments that replaced ``segment_id`` after a scale; empty when the stream is sealed."""
        request = pb.SegmentId(
            streamInfo=self._stream_info(scope, stream), segmentId=segment_id
        )
        reply = self._ask(
            "getSegmentsImmediatelyFollowing", request, scope=scope, stream=stream
        )
        out = [
            SuccessorSegment(
                SegmentRange(
                    e.segment.segmentId.segmentId, e.segment.minKey, e.segment.maxKey
                ),
                tuple(e.value),
            )
            for e in reply.segments
        ]
        out.sort(key=lambda s: s.segment.min_key)
        return out

    def get_segments_between(
        self,
        scope: str,
        stream: str,
        from_cut: Mapping[int, int] | None,
        to_cut: Mapping[int, int] | None,
    ) -> set[int]:
        """Every segment id between two cuts, both included (None or {} = head / current tail)."""
        request = pb.StreamCutRange(
            streamInfo=self._stream_info(scope, stream),
            **{"from": _cut_map(from_cut or {}), "to": _cut_map(to_cut or {})},
        )
        reply = self._ask(
            "getSegmentsBetween", request, scope=scope, stream=stream,
            what=f"(from {dict(from_cut or {})}, to {dict(to_cut or {})})",
        )
        return {s.segmentId for s in reply.segments}

    def get_uri(self, scope: str, stream: str, segment_id: int) -> Endpoint:
        """The segment store that owns the segment (cached until :meth:`invalidate_uri`)."""
        key = (scope, stream, segment_id)
        hit = self._uri_cache.get(key)
        if hit is not None:
            return hit
        request = pb.SegmentId(
            streamInfo=self._stream_info(scope, stream), segmentId=segment_id
        )
        reply = self._ask("getURI", request, scope=scope, stream=stream)
        endpoint = Endpoint(reply.endpoint, reply.port)
        if len(self._uri_cache) > 100_000:
            self._uri_cache.clear()
        self._uri_cache[key] = endpoint
        return endpoint

    def invalidate_uri(
        self, scope: str, stream: str, segment_id: int | None = None
    ) -> None:
        """Forget cached segment-store locations (after WrongHost or a connection failure)."""
        if segment_id is not None:
            self._uri_cache.pop((scope, stream, segment_id), None)
            return
        for key in [k for k in self._uri_cache if k[0] == scope and k[1] == stream]:
            self._uri_cache.pop(key, None)

    def get_delegation_token(self, scope: str, stream: str, access: str = "read") -> str:
        """Token for segment-store requests on ``scope/stream`` (cached; fetched again shortly before
        its JWT expiry); empty when this client has no credentials. ``access`` is "read" (reads and
        segment info: what a read-only user can get) or "write" (appends, seal, truncate)."""
        if not self._metadata:
            return ""
        return self.tokens.get(scope, stream, access)

    def renew_delegation_token(
        self, scope: str, stream: str, stale: str | None = None, access: str = "read"
    ) -> str:
        """A fresh token after the segment store reported ``stale`` expired."""
        if not self._metadata:
            return ""
        return self.tokens.renew(scope, stream, stale, access)

    def _fetch_delegation_token(self, scope: str, stream: str, access: str) -> str:
        # Ask for what will be done, as Pravega's Java client does (READ for readers, WRITE for
        # writers): Pravega refuses a read-only user a token asked for anything but READ.
        operation = pb.StreamInfo.READ if access == "read" else pb.StreamInfo.WRITE
        request = pb.StreamInfo(scope=scope, stream=stream, accessOperation=operation)
        return self._ask("getDelegationToken", request, scope=scope, stream=stream).delegationToken

    # --------------------------------------------------------------------------------- scale

    def scale(
        self,
        scope: str,
        stream: str,
        sealed_segments: Iterable[int],
        new_ranges: Iterable[tuple[float, float]],
        *,
        timeout_s: float | None = None,
        poll_interval_s: float = 0.05,
    ) -> list[SegmentRange]:
        """Replace ``sealed_segments`` by new segments with ``new_ranges``; wait until done."""
        sealed = list(sealed_segments)
        ranges = [(float(lo), float(hi)) for lo, hi in new_ranges]
        request = pb.ScaleRequest(
            streamInfo=self._stream_info(scope, stream),
            sealedSegments=sealed,
            newKeyRanges=[
                pb.ScaleRequest.KeyRangeEntry(start=lo, end=hi) for lo, hi in ranges
            ],
            scaleTimestamp=now_ms(),
        )
        about = {"scope": scope, "stream": stream, "sealed": sealed, "ranges": ranges,
                 "what": f"scale of {scope}/{stream} (seal {sealed}, new ranges {ranges})"}
        reply = self._ask("scale", request, timeout=self.long_timeout_s, **about)
        new_segments = _ranges(reply.segments)
        deadline = time.monotonic() + (
            self.long_timeout_s if timeout_s is None else timeout_s
        )
        delay = poll_interval_s
        check = pb.ScaleStatusRequest(streamInfo=self._stream_info(scope, stream), epoch=reply.epoch)
        while not self._ask("checkScale", check, **about):
            if time.monotonic() >= deadline:
                raise ControllerError(
                    f"{about['what']} still in progress after {timeout_s or self.long_timeout_s:g} s"
                )
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
        return new_segments

    # -------------------------------------------------------------------------- transactions

    def create_transaction(
        self, scope: str, stream: str, lease_ms: int
    ) -> TransactionInfo:
        request = pb.CreateTxnRequest(
            streamInfo=self._stream_info(scope, stream), lease=int(lease_ms)
        )
        reply = self._ask("createTransaction", request, scope=scope, stream=stream)
        if not reply.HasField("txnId"):
            raise ControllerError(
                f"controller {self.uri} returned no transaction id for {scope}/{stream}"
            )
        txn_id = naming.bits_to_txn_id(reply.txnId.highBits, reply.txnId.lowBits)
        return TransactionInfo(
            scope, stream, txn_id, tuple(_ranges(reply.activeSegments))
        )

    def _txn_request(
        self, scope: str, stream: str, txn_id: int, timestamp: int = 0
    ) -> pb.TxnRequest:
        hi, lo = naming.txn_id_to_bits(txn_id)
        return pb.TxnRequest(
            streamInfo=self._stream_info(scope, stream),
            txnId=pb.TxnId(highBits=hi, lowBits=lo),
            writerId="",
            timestamp=timestamp,
        )

    def commit_transaction(self, scope: str, stream: str, txn_id: int) -> None:
        """Ask for the commit; the controller finishes it asynchronously (poll the state)."""
        self._ask(
            "commitTransaction", self._txn_request(scope, stream, txn_id, I64_MIN),
            scope=scope, stream=stream, txn_id=txn_id, timeout=self.long_timeout_s,
        )

    def abort_transaction(self, scope: str, stream: str, txn_id: int) -> None:
        self._ask(
            "abortTransaction", self._txn_request(scope, stream, txn_id),
            scope=scope, stream=stream, txn_id=txn_id, timeout=self.long_timeout_s,
        )

    def check_transaction_state(
        self, scope: str, stream: str, txn_id: int
    ) -> TxnStatus:
        return self._ask(
            "checkTransactionState", self._txn_request(scope, stream, txn_id),
            scope=scope, stream=stream, txn_id=txn_id,
        )

    def ping_transaction(
        self, scope: str, stream: str, txn_id: int, lease_ms: int
    ) -> TxnStatus:
        """Renew the lease: OPEN when renewed; COMMITTED/ABORTED when there is nothing to renew."""
        hi, lo = naming.txn_id_to_bits(txn_id)
        request = pb.PingTxnRequest(
            streamInfo=self._stream_info(scope, stream),
            txnId=pb.TxnId(highBits=hi, lowBits=lo),
            lease=int(lease_ms),
        )
        return self._ask(
            "pingTransaction", request, scope=scope, stream=stream, txn_id=txn_id, what=f"lease of {lease_ms} ms"
        )


def _resource_of(request: Any) -> str:
    """The scope or stream a controller request is about, for error messages."""
    fields = getattr(getattr(request, "DESCRIPTOR", None), "fields_by_name", {})
    for name in ("streamInfo",):
        if name in fields:
            info = getattr(request, name)
            return f"stream {info.scope}/{info.stream}"
    if "scope" in fields:
        scope = request.scope
        if isinstance(scope, str):
            return f"scope {scope}"
        return f"scope {getattr(scope, 'scope', scope)}"
    if "segmentId" in fields and hasattr(request.segmentId, "streamInfo"):
        info = request.segmentId.streamInfo
        return f"stream {info.scope}/{info.stream}"
    return "the cluster (all scopes)"


def _cut_map(cut: Mapping[int, int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for segment, offset in cut.items():
        if isinstance(segment, bool) or isinstance(offset, bool):
            raise InvalidStreamCutError(
                f"stream cut entries must be integers, got {segment!r}: {offset!r}"
            )
        try:
            seg, off = int(segment), int(offset)
        except (TypeError, ValueError):
            raise InvalidStreamCutError(
                f"stream cut entries must be integers, got {segment!r}: {offset!r}"
            ) from None
        if off < 0 and off != -1:
            raise InvalidStreamCutError(
                f"stream cut offset for segment {seg} is negative: {off}"
            )
        out[seg] = off
    return out


def _ranges(items: Iterable[pb.SegmentRange]) -> list[SegmentRange]:
    out = [SegmentRange(r.segmentId.segmentId, r.minKey, r.maxKey) for r in items]
    out.sort(key=lambda r: (r.min_key, r.segment_id))
    return out
