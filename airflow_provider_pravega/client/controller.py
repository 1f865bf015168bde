"""Typed, fail-fast client of the Pravega controller's gRPC API.

Why not the official binding: it retries every controller error (and an unreachable controller)
for about a minute before Python sees anything, and it lacks transaction status/ping, scaling,
truncation and the segment queries the provider needs. This client checks that the controller
accepts TCP connections before its first call, puts a gRPC deadline on every call, and maps every
status to a return value or to one of the exceptions in :mod:`.errors`.
"""

from __future__ import annotations

import enum
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Self

# gRPC >= 1.81 restarts its poller in a fork()ed child (grpc/grpc#43055): a subprocess started with
# preexec_fn after a channel was used — PySpark launching its JVM once an ingest found work, for
# one — aborts before exec now and then. Its fork handlers only serve processes that keep using
# gRPC after fork without exec, which nothing here does. Read when grpc is first imported; a value
# set by the user wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc  # noqa: E402

from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.client.errors import (
    ControllerError,
    ControllerUnreachableError,
    InvalidNameError,
    InvalidStreamCutError,
    PravegaAuthenticationError,
    PravegaPermissionError,
    PravegaTLSError,
    ScaleError,
    ScopeNotEmptyError,
    ScopeNotFoundError,
    StreamNotFoundError,
    StreamNotSealedError,
    StreamSealedError,
    TransactionLeaseError,
    TransactionNotFoundError,
    TransactionStateError,
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

__all__ = [
    "ControllerClient",
    "Endpoint",
    "RetentionPolicy",
    "ScalingPolicy",
    "SegmentRange",
    "StreamConfiguration",
    "SuccessorSegment",
    "TransactionInfo",
    "TxnStatus",
    "parse_controller_uris",
    "parse_txn_id",
]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_CONNECT_TIMEOUT_S = 3.0
#: Commit and scale may merge/seal many segments on the server; give them more time than a lookup.
LONG_TIMEOUT_S = 120.0
I64_MAX = 2**63 - 1
I64_MIN = -(2**63)

_TLS_SCHEMES = frozenset({"tls", "ssl", "tcps", "pravegas"})
_ADDRESS = re.compile(r"(?P<host>\[[^\]]+\]|[^:/,\[\]]+):(?P<port>\d+)/?")


# ---------------------------------------------------------------------------------- value types


class Endpoint(NamedTuple):
    """A segment store's address as handed out by the controller's getURI."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class SegmentRange:
    """A segment and the routing-key range [min_key, max_key) it owns."""

    segment_id: int
    min_key: float
    max_key: float

    @property
    def epoch(self) -> int:
        return naming.segment_epoch(self.segment_id)

    @property
    def number(self) -> int:
        return naming.segment_number(self.segment_id)


@dataclass(frozen=True, slots=True)
class SuccessorSegment:
    """A successor of a sealed segment together with all of the successor's predecessors."""

    segment: SegmentRange
    predecessors: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """How many segments a stream has: fixed, or auto-scaled by data or event rate."""

    FIXED = "fixed"
    BY_DATA_RATE = "by_rate_in_kbytes_per_sec"
    BY_EVENT_RATE = "by_rate_in_events_per_sec"

    kind: str = FIXED
    min_segments: int = 1
    target_rate: int = 0
    scale_factor: int = 0

    def __post_init__(self) -> None:
        if self.kind not in _SCALE_TYPES:
            raise ValueError(
                f"scaling policy kind must be one of {sorted(_SCALE_TYPES)}, got {self.kind!r}"
            )
        if (
            isinstance(self.min_segments, bool)
            or not isinstance(self.min_segments, int)
            or self.min_segments < 1
        ):
            raise ValueError(
                f"a stream needs at least one segment, got min_segments={self.min_segments!r}"
            )
        if self.kind != self.FIXED and (
            self.target_rate <= 0 or self.scale_factor <= 0
        ):
            raise ValueError(
                "auto-scaling needs a positive target_rate and scale_factor"
            )

    @classmethod
    def fixed(cls, segments: int) -> ScalingPolicy:
        return cls(cls.FIXED, segments)

    @classmethod
    def by_data_rate(
        cls, target_kbytes_per_sec: int, scale_factor: int, min_segments: int = 1
    ) -> ScalingPolicy:
        return cls(cls.BY_DATA_RATE, min_segments, target_kbytes_per_sec, scale_factor)

    @classmethod
    def by_event_rate(
        cls, target_events_per_sec: int, scale_factor: int, min_segments: int = 1
    ) -> ScalingPolicy:
        return cls(cls.BY_EVENT_RATE, min_segments, target_events_per_sec, scale_factor)

    def to_proto(self) -> pb.ScalingPolicy:
        return pb.ScalingPolicy(
            scaleType=_SCALE_TYPES[self.kind],
            targetRate=self.target_rate,
            scaleFactor=self.scale_factor,
            minNumSegments=self.min_segments,
        )

    @classmethod
    def from_proto(cls, msg: pb.ScalingPolicy) -> ScalingPolicy:
        kind = _SCALE_KINDS.get(msg.scaleType, cls.FIXED)
        try:
            return cls(
                kind, max(1, msg.minNumSegments), msg.targetRate, msg.scaleFactor
            )
        except (
            ValueError
        ):  # an auto-scaling policy without rates: report what it behaves like
            return cls(
                cls.FIXED, max(1, msg.minNumSegments), msg.targetRate, msg.scaleFactor
            )


_SCALE_TYPES = {
    ScalingPolicy.FIXED: pb.ScalingPolicy.FIXED_NUM_SEGMENTS,
    ScalingPolicy.BY_DATA_RATE: pb.ScalingPolicy.BY_RATE_IN_KBYTES_PER_SEC,
    ScalingPolicy.BY_EVENT_RATE: pb.ScalingPolicy.BY_RATE_IN_EVENTS_PER_SEC,
}
_SCALE_KINDS = {v: k for k, v in _SCALE_TYPES.items()}


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Automatic truncation: keep data for ``value`` milliseconds (time) or ``value`` bytes (size)."""

    TIME = "time"
    SIZE = "size"

    kind: str
    value: int
    max_value: int = I64_MAX

    def __post_init__(self) -> None:
        if self.kind not in (self.TIME, self.SIZE):
            raise ValueError(
                f"retention kind must be 'time' or 'size', got {self.kind!r}"
            )
        if (
            isinstance(self.value, bool)
            or not isinstance(self.value, int)
            or self.value <= 0
        ):
            raise ValueError(
                f"retention value must be a positive integer, got {self.value!r}"
            )

    @classmethod
    def by_time(cls, milliseconds: int) -> RetentionPolicy:
        return cls(cls.TIME, milliseconds)

    @classmethod
    def by_size(cls, size_bytes: int) -> RetentionPolicy:
        return cls(cls.SIZE, size_bytes)

    def to_proto(self) -> pb.RetentionPolicy:
        kind = (
            pb.RetentionPolicy.TIME
            if self.kind == self.TIME
            else pb.RetentionPolicy.SIZE
        )
        return pb.RetentionPolicy(
            retentionType=kind, retentionParam=self.value, retentionMax=self.max_value
        )

    @classmethod
    def from_proto(cls, msg: pb.RetentionPolicy) -> RetentionPolicy | None:
        if msg.retentionType == pb.RetentionPolicy.TIME and msg.retentionParam > 0:
            return cls(cls.TIME, msg.retentionParam, msg.retentionMax or I64_MAX)
        if msg.retentionType == pb.RetentionPolicy.SIZE and msg.retentionParam > 0:
            return cls(cls.SIZE, msg.retentionParam, msg.retentionMax or I64_MAX)
        return None


@dataclass(frozen=True, slots=True)
class StreamConfiguration:
    scope: str
    stream: str
    scaling: ScalingPolicy
    retention: RetentionPolicy | None
    tags: tuple[str, ...] | None


class TxnStatus(str, enum.Enum):
    """A transaction's state as the controller knows it (UNKNOWN: never existed or forgotten)."""

    OPEN = "OPEN"
    COMMITTING = "COMMITTING"
    COMMITTED = "COMMITTED"
    ABORTING = "ABORTING"
    ABORTED = "ABORTED"
    UNKNOWN = "UNKNOWN"

    @property
    def is_final(self) -> bool:
        return self in (TxnStatus.COMMITTED, TxnStatus.ABORTED)

    def __str__(self) -> str:
        return self.value


_TXN_STATES = {
    pb.TxnState.OPEN: TxnStatus.OPEN,
    pb.TxnState.COMMITTING: TxnStatus.COMMITTING,
    pb.TxnState.COMMITTED: TxnStatus.COMMITTED,
    pb.TxnState.ABORTING: TxnStatus.ABORTING,
    pb.TxnState.ABORTED: TxnStatus.ABORTED,
    pb.TxnState.UNKNOWN: TxnStatus.UNKNOWN,
}


@dataclass(frozen=True, slots=True)
class TransactionInfo:
    """An open transaction: its 128-bit id and the segments (with key ranges) of its epoch.

    Picklable and JSON-able (``to_dict``/``from_dict``), so a Spark task or another Airflow task can
    write into the transaction that a driver began.
    """

    scope: str
    stream: str
    txn_id: int
    segments: tuple[SegmentRange, ...]

    @property
    def epoch(self) -> int:
        return naming.txn_epoch(self.txn_id)

    @property
    def hex_id(self) -> str:
        return f"{self.txn_id:032x}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "stream": self.stream,
            "txn_id": self.hex_id,
            "segments": [[s.segment_id, s.min_key, s.max_key] for s in self.segments],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TransactionInfo:
        return cls(
            data["scope"],
            data["stream"],
            parse_txn_id(data["txn_id"]),
            tuple(
                SegmentRange(int(i), float(lo), float(hi))
                for i, lo, hi in data["segments"]
            ),
        )


_HEX_ID = re.compile(r"(?:0[xX])?[0-9a-fA-F]{1,32}")


def parse_txn_id(value: int | str | TransactionInfo) -> int:
    """A transaction id from an int, a TransactionInfo, or text: the 32 hex digits this package
    prints (``f"{id:032x}"``, also what transaction segment names carry) or ``0x``-prefixed hex.

    Decimal text is refused: 32 decimal digits would be ambiguous with the hex form.
    """
    if isinstance(value, TransactionInfo):
        return value.txn_id
    if isinstance(value, bool):
        raise TypeError("a transaction id is an int, not a bool")
    if isinstance(value, str):
        text = value.strip()
        if not _HEX_ID.fullmatch(text) or not (
            len(text) == 32 or text[:2].lower() == "0x"
        ):
            raise ValueError(
                f"transaction id text must be 32 hex digits (as printed by this package) or 0x-prefixed hex, "
                f"got {value!r}"
            )
        return int(text, 16)
    if not isinstance(value, int):
        raise TypeError(
            f"a transaction id is an int or hex text, got {type(value).__name__}"
        )
    if not 0 <= value < 1 << 128:
        raise ValueError(f"a transaction id is an unsigned 128-bit int, got {value!r}")
    return value


def parse_controller_uris(uri: str) -> tuple[tuple[Endpoint, ...], bool]:
    """``[scheme://]host:port[,host:port...]`` -> (the controllers in order, tls), the way the
    official clients read a controller URI (one scheme, comma-separated addresses)."""
    if not isinstance(uri, str):
        raise TypeError(
            f"controller URI must be a string like tcp://host:9090, got {uri!r}"
        )
    text = uri.strip()
    scheme_match = re.match(r"^([A-Za-z][A-Za-z0-9+.\-]*)://", text)
    scheme = scheme_match.group(1).lower() if scheme_match else "tcp"
    rest = text[scheme_match.end():] if scheme_match else text
    endpoints = []
    for entry in rest.split(","):
        m = _ADDRESS.fullmatch(entry.strip())
        if not m:
            raise ValueError(
                f"controller URI {uri!r} is not of the form [tcp|tls]://host:port[,host:port...]"
            )
        port = int(m.group("port"))
        if not 1 <= port <= 65535:
            raise ValueError(f"controller URI {uri!r} has a port outside 1-65535")
        endpoints.append(Endpoint(m.group("host").strip("[]"), port))
    return tuple(endpoints), scheme in _TLS_SCHEMES


# --------------------------------------------------------------------------------------- client


class _NotFound(Exception):
    """Internal: the controller answered NOT_FOUND; the caller knows what was missing."""

    def __init__(self, details: str) -> None:
        super().__init__(details)
        self.details = details


class _InvalidArgument(Exception):
    def __init__(self, details: str) -> None:
        super().__init__(details)
        self.details = details


class _FailedPrecondition(Exception):
    def __init__(self, details: str) -> None:
        super().__init__(details)
        self.details = details


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
            return _NotFound(details)
        if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE):
            return _InvalidArgument(details)
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            return _FailedPrecondition(details)
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

    def _stream_call(
        self,
        method: str,
        request: Any,
        scope: str,
        stream: str,
        *,
        timeout: float | None = None,
    ) -> Any:
        deadline = time.monotonic() + STREAM_CREATING_WAIT_S
        delay = 0.05
        while True:
            try:
                return self._call(method, request, timeout=timeout)
            except _NotFound:
                raise self._missing(scope, stream) from None
            except (_InvalidArgument, _FailedPrecondition) as exc:
                raise ControllerError(
                    f"{method} on {scope}/{stream} was refused: {exc.details}"
                ) from None
            except _StreamBeingCreated:
                # Another process is creating it (two tries of a task, say): wait for it to finish.
                if time.monotonic() >= deadline:
                    raise ControllerError(
                        f"{method} on {scope}/{stream}: the stream was still being created after "
                        f"{STREAM_CREATING_WAIT_S:g} s; if a controller or segment store was lost while it was "
                        f"created, creating it again finishes it (StreamAdmin.ensure_stream or "
                        f"PravegaCreateStreamOperator: Pravega keeps the configuration first given)"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    @staticmethod
    def _stream_info(scope: str, stream: str) -> pb.StreamInfo:
        return pb.StreamInfo(scope=scope, stream=stream)

    # -------------------------------------------------------------------------------- scopes

    def create_scope(self, scope: str) -> bool:
        """True when created, False when it already existed."""
        try:
            status = self._call("createScope", pb.ScopeInfo(scope=scope)).status
        except _InvalidArgument as exc:
            raise InvalidNameError(
                f"invalid scope name {scope!r}: {exc.details}"
            ) from None
        if status == pb.CreateScopeStatus.SUCCESS:
            return True
        if status == pb.CreateScopeStatus.SCOPE_EXISTS:
            return False
        if status == pb.CreateScopeStatus.INVALID_SCOPE_NAME:
            raise InvalidNameError(
                f"invalid scope name {scope!r}: use letters, digits, '.' and '-' (not starting with '_')"
            )
        raise ControllerError(
            f"controller {self.uri} failed to create scope {scope!r} (status {status})"
        )

    def delete_scope(self, scope: str) -> bool:
        """True when deleted, False when it did not exist."""
        try:
            status = self._call("deleteScope", pb.ScopeInfo(scope=scope)).status
        except _NotFound:
            return False
        if status == pb.DeleteScopeStatus.SUCCESS:
            return True
        if status == pb.DeleteScopeStatus.SCOPE_NOT_FOUND:
            return False
        if status == pb.DeleteScopeStatus.SCOPE_NOT_EMPTY:
            raise ScopeNotEmptyError(scope)
        raise ControllerError(
            f"controller {self.uri} failed to delete scope {scope!r} (status {status})"
        )

    def scope_exists(self, scope: str) -> bool:
        try:
            return bool(
                self._call("checkScopeExists", pb.ScopeInfo(scope=scope)).exists
            )
        except _NotFound:
            return False
        except _InvalidArgument:
            return False

    def list_scopes(self) -> list[str]:
        names: list[str] = []
        token = ""
        for _ in range(100_000):
            reply = self._call(
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
        try:
            status = self._call("createStream", config).status
        except _InvalidArgument as exc:
            raise InvalidNameError(
                f"cannot create stream {scope}/{stream}: {exc.details}"
            ) from None
        except _NotFound:
            raise ScopeNotFoundError(scope) from None
        if status == pb.CreateStreamStatus.SUCCESS:
            return True
        if status == pb.CreateStreamStatus.STREAM_EXISTS:
            return False
        if status == pb.CreateStreamStatus.SCOPE_NOT_FOUND:
            raise ScopeNotFoundError(scope)
        if status == pb.CreateStreamStatus.INVALID_STREAM_NAME:
            raise InvalidNameError(
                f"invalid stream name {stream!r}: use letters, digits, '.' and '-' (not starting with '_')"
            )
        raise ControllerError(
            f"controller {self.uri} failed to create stream {scope}/{stream} (status {status})"
        )

    def update_stream(
        self,
        scope: str,
        stream: str,
        scaling: ScalingPolicy,
        retention: RetentionPolicy | None = None,
        tags: Sequence[str] | None = None,
    ) -> None:
        config = self._stream_config(scope, stream, scaling, retention, tags)
        status = self._stream_call("updateStream", config, scope, stream).status
        self._check_update_status(status, scope, stream, "update")

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

    def _check_update_status(
        self, status: int, scope: str, stream: str, action: str
    ) -> None:
        if status == pb.UpdateStreamStatus.SUCCESS:
            return
        if status == pb.UpdateStreamStatus.STREAM_NOT_FOUND:
            raise StreamNotFoundError(scope, stream)
        if status == pb.UpdateStreamStatus.SCOPE_NOT_FOUND:
            raise ScopeNotFoundError(scope)
        if status == 4:  # Java's STREAM_SEALED
            raise StreamSealedError(scope, stream, action)
        raise ControllerError(
            f"controller {self.uri} failed to {action} stream {scope}/{stream} (status {status})"
        )

    def get_stream_configuration(self, scope: str, stream: str) -> StreamConfiguration:
        msg = self._stream_call(
            "getStreamConfiguration", self._stream_info(scope, stream), scope, stream
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
        try:
            return bool(
                self._call("checkStreamExists", self._stream_info(scope, stream)).exists
            )
        except (_NotFound, _InvalidArgument):
            return False

    def list_streams(self, scope: str) -> list[str]:
        names: list[str] = []
        token = ""
        for _ in range(100_000):
            request = pb.StreamsInScopeRequest(
                scope=pb.ScopeInfo(scope=scope),
                continuationToken=pb.ContinuationToken(token=token),
            )
            try:
                reply = self._call("listStreamsInScope", request)
            except _NotFound:
                raise ScopeNotFoundError(scope) from None
            if reply.status == pb.StreamsInScopeResponse.SCOPE_NOT_FOUND:
                raise ScopeNotFoundError(scope)
            if not reply.streams:
                break
            names.extend(s.stream for s in reply.streams)
            next_token = reply.continuationToken.token
            if next_token == token:
                break
            token = next_token
        return names

    def seal_stream(self, scope: str, stream: str) -> None:
        status = self._stream_call(
            "sealStream",
            self._stream_info(scope, stream),
            scope,
            stream,
            timeout=self.long_timeout_s,
        ).status
        if status == 4:  # already sealed (Java): sealing is idempotent for us
            return
        self._check_update_status(status, scope, stream, "seal")

    def delete_stream(self, scope: str, stream: str) -> bool:
        """True when deleted, False when it did not exist; the stream must be sealed first."""
        try:
            status = self._call(
                "deleteStream",
                self._stream_info(scope, stream),
                timeout=self.long_timeout_s,
            ).status
        except _NotFound:
            return False
        except _FailedPrecondition:
            raise StreamNotSealedError(scope, stream) from None
        if status == pb.DeleteStreamStatus.SUCCESS:
            return True
        if status == pb.DeleteStreamStatus.STREAM_NOT_FOUND:
            return False
        if status == pb.DeleteStreamStatus.STREAM_NOT_SEALED:
            raise StreamNotSealedError(scope, stream)
        raise ControllerError(
            f"controller {self.uri} failed to delete stream {scope}/{stream} (status {status})"
        )

    def truncate_stream(self, scope: str, stream: str, cut: Mapping[int, int]) -> None:
        """Make everything before ``cut`` (segment id -> offset) unreadable."""
        request = pb.StreamCut(
            streamInfo=self._stream_info(scope, stream), cut=_cut_map(cut)
        )
        try:
            status = self._call(
                "truncateStream", request, timeout=self.long_timeout_s
            ).status
        except _NotFound:
            raise self._missing(scope, stream) from None
        except (_InvalidArgument, _FailedPrecondition) as exc:
            raise InvalidStreamCutError(
                f"cannot truncate {scope}/{stream} at {dict(cut)}: {exc.details}. A truncation cut needs "
                f"one offset per segment covering the whole key space, at or after the current head."
            ) from None
        if status == pb.UpdateStreamStatus.FAILURE:
            # Pravega 0.13 answers FAILURE for a cut that is not valid or is behind the head.
            raise InvalidStreamCutError(
                f"controller {self.uri} refused to truncate {scope}/{stream} at {dict(cut)}: a truncation "
                f"cut needs one offset per segment covering the whole key space, at or after the current "
                f"head, and within each segment's data"
            )
        self._check_update_status(status, scope, stream, "truncate")

    # ------------------------------------------------------------------------------ segments

    def get_current_segments(self, scope: str, stream: str) -> list[SegmentRange]:
        """The active segments (routing table), ordered by key range."""
        reply = self._stream_call(
            "getCurrentSegments", self._stream_info(scope, stream), scope, stream
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
        try:
            reply = self._call("getEpochSegments", request)
        except _NotFound:
            raise self._missing(scope, stream) from None
        except (_InvalidArgument, _FailedPrecondition) as exc:
            raise ControllerError(
                f"stream {scope}/{stream} has no epoch {epoch}: {exc.details}"
            ) from None
        return _ranges(reply.segmentRanges)

    def get_segments_at_head(self, scope: str, stream: str) -> dict[int, int]:
        """The stream's head: segment id -> first readable offset (getSegments at time 0)."""
        request = pb.GetSegmentsRequest(
            streamInfo=self._stream_info(scope, stream), timestamp=0
        )
        reply = self._stream_call("getSegments", request, scope, stream)
        return {loc.segmentId.segmentId: loc.offset for loc in reply.segments}

    def get_successors(
        self, scope: str, stream: str, segment_id: int
    ) -> list[SuccessorSegment]:
        """Segments that replaced ``segment_id`` after a scale; empty when the stream is sealed."""
        request = pb.SegmentId(
            streamInfo=self._stream_info(scope, stream), segmentId=segment_id
        )
        reply = self._stream_call(
            "getSegmentsImmediatelyFollowing", request, scope, stream
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
        try:
            reply = self._call("getSegmentsBetween", request)
        except _NotFound:
            raise self._missing(scope, stream) from None
        except (_InvalidArgument, _FailedPrecondition) as exc:
            raise InvalidStreamCutError(
                f"invalid stream cuts for {scope}/{stream} (from {dict(from_cut or {})}, to {dict(to_cut or {})}): "
                f"{exc.details}"
            ) from None
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
        reply = self._stream_call("getURI", request, scope, stream)
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
        return self._stream_call("getDelegationToken", request, scope, stream).delegationToken

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
            scaleTimestamp=int(time.time() * 1000),
        )
        what = f"scale of {scope}/{stream} (seal {sealed}, new ranges {ranges})"
        try:
            reply = self._call("scale", request, timeout=self.long_timeout_s)
        except _NotFound:
            raise self._missing(scope, stream) from None
        except (_InvalidArgument, _FailedPrecondition) as exc:
            raise ScaleError(f"{what} was refused: {exc.details}") from None
        # Pravega 0.13 (submitScale): PRECONDITION_FAILED when a segment to seal is not active or
        # the result has fewer segments than the scaling policy's minimum; FAILURE when the new
        # ranges do not exactly replace the sealed ones (invalid input) or the stream is sealed.
        if reply.status == pb.ScaleResponse.PRECONDITION_FAILED:
            raise ScaleError(
                f"{what} was refused: every segment to seal must be active, and the stream must keep at "
                f"least its scaling policy's minimum number of segments"
            )
        if reply.status == pb.ScaleResponse.FAILURE:
            raise ScaleError(
                f"{what} was refused: the new key ranges {ranges} must exactly cover the key ranges of "
                f"segments {sealed} (no gap, no overlap), and the stream must not be sealed"
            )
        if reply.status != pb.ScaleResponse.STARTED:
            raise ControllerError(
                f"{what} failed on controller {self.uri} (status {reply.status})"
            )
        new_segments = _ranges(reply.segments)
        deadline = time.monotonic() + (
            self.long_timeout_s if timeout_s is None else timeout_s
        )
        delay = poll_interval_s
        while True:
            status = self._stream_call(
                "checkScale",
                pb.ScaleStatusRequest(
                    streamInfo=self._stream_info(scope, stream), epoch=reply.epoch
                ),
                scope,
                stream,
            ).status
            if status == pb.ScaleStatusResponse.SUCCESS:
                return new_segments
            if status == pb.ScaleStatusResponse.INVALID_INPUT:
                raise ScaleError(f"{what}: the controller reports invalid input")
            if status != pb.ScaleStatusResponse.IN_PROGRESS:
                raise ControllerError(
                    f"{what} failed on controller {self.uri} (scale status {status})"
                )
            if time.monotonic() >= deadline:
                raise ControllerError(
                    f"{what} still in progress after {timeout_s or self.long_timeout_s:g} s"
                )
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    # -------------------------------------------------------------------------- transactions

    def create_transaction(
        self, scope: str, stream: str, lease_ms: int
    ) -> TransactionInfo:
        request = pb.CreateTxnRequest(
            streamInfo=self._stream_info(scope, stream), lease=int(lease_ms)
        )
        try:
            reply = self._call("createTransaction", request)
        except _NotFound:
            raise self._missing(scope, stream) from None
        except (_InvalidArgument, _FailedPrecondition) as exc:
            raise TransactionLeaseError(
                scope,
                stream,
                0,
                f"cannot begin a transaction on {scope}/{stream}: {exc.details}",
            ) from None
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

    def _txn_status_call(
        self, method: str, scope: str, stream: str, txn_id: int, action: str
    ) -> None:
        request = self._txn_request(
            scope, stream, txn_id, I64_MIN if method == "commitTransaction" else 0
        )
        try:
            status = self._call(method, request, timeout=self.long_timeout_s).status
        except _NotFound as exc:
            if "transaction" in exc.details.lower() or "txn" in exc.details.lower():
                raise TransactionNotFoundError(scope, stream, txn_id) from None
            raise self._missing(scope, stream) from None
        except (_InvalidArgument, _FailedPrecondition) as exc:
            raise TransactionStateError(
                scope,
                stream,
                txn_id,
                f"cannot {action} transaction {txn_id:032x} on {scope}/{stream}: {exc.details}",
            ) from None
        if status == pb.TxnStatus.SUCCESS:
            return
        if status == pb.TxnStatus.TRANSACTION_NOT_FOUND:
            raise TransactionNotFoundError(scope, stream, txn_id)
        if status == pb.TxnStatus.STREAM_NOT_FOUND:
            raise self._missing(scope, stream)
        raise TransactionStateError(
            scope,
            stream,
            txn_id,
            f"controller {self.uri} failed to {action} transaction {txn_id:032x} on {scope}/{stream} (status {status})",
        )

    def commit_transaction(self, scope: str, stream: str, txn_id: int) -> None:
        """Ask for the commit; the controller finishes it asynchronously (poll the state)."""
        self._txn_status_call("commitTransaction", scope, stream, txn_id, "commit")

    def abort_transaction(self, scope: str, stream: str, txn_id: int) -> None:
        self._txn_status_call("abortTransaction", scope, stream, txn_id, "abort")

    def check_transaction_state(
        self, scope: str, stream: str, txn_id: int
    ) -> TxnStatus:
        try:
            reply = self._call(
                "checkTransactionState", self._txn_request(scope, stream, txn_id)
            )
        except _NotFound as exc:
            if "transaction" in exc.details.lower() or "txn" in exc.details.lower():
                return TxnStatus.UNKNOWN
            raise self._missing(scope, stream) from None
        except (_InvalidArgument, _FailedPrecondition) as exc:
            raise ControllerError(
                f"cannot check transaction {txn_id:032x} on {scope}/{stream}: {exc.details}"
            ) from None
        return _TXN_STATES.get(reply.state, TxnStatus.UNKNOWN)

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
        try:
            status = self._call("pingTransaction", request).status
        except _NotFound as exc:
            if "transaction" in exc.details.lower() or "txn" in exc.details.lower():
                raise TransactionNotFoundError(scope, stream, txn_id) from None
            raise self._missing(scope, stream) from None
        except (_InvalidArgument, _FailedPrecondition) as exc:
            raise TransactionLeaseError(
                scope,
                stream,
                txn_id,
                f"cannot renew the lease of transaction {txn_id:032x}: {exc.details}",
            ) from None
        if status == pb.PingTxnStatus.OK:
            return TxnStatus.OPEN
        if status == pb.PingTxnStatus.COMMITTED:
            return TxnStatus.COMMITTED
        if status == pb.PingTxnStatus.ABORTED:
            return TxnStatus.ABORTED
        if status == pb.PingTxnStatus.UNKNOWN:
            raise TransactionNotFoundError(scope, stream, txn_id)
        if status == pb.PingTxnStatus.LEASE_TOO_LARGE:
            raise TransactionLeaseError(
                scope,
                stream,
                txn_id,
                f"lease of {lease_ms} ms for transaction {txn_id:032x} is larger than the controller allows; "
                f"use a shorter lease and ping more often",
            )
        if status == pb.PingTxnStatus.MAX_EXECUTION_TIME_EXCEEDED:
            raise TransactionLeaseError(
                scope,
                stream,
                txn_id,
                f"transaction {txn_id:032x} has been open longer than the controller's maximum execution time; "
                f"it cannot be renewed (commit or abort it)",
            )
        raise ControllerError(
            f"controller {self.uri} could not renew transaction {txn_id:032x} on {scope}/{stream} (ping status {status})"
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
