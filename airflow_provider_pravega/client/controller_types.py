"""The values the controller client takes and returns: segment-store endpoints, segments and
their key ranges, stream configurations, transactions and their states, and the parsing of
controller URIs and transaction ids. Plain data (picklable, no channel), so Spark tasks and
other Airflow tasks can carry them."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from airflow_provider_pravega.protocol import controller_pb2 as pb
from airflow_provider_pravega.protocol import naming

__all__ = [
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

I64_MAX = 2**63 - 1
I64_MIN = -(2**63)

_TLS_SCHEMES = frozenset({"tls", "ssl", "tcps", "pravegas"})
_ADDRESS = re.compile(r"(?P<host>\[[^\]]+\]|[^:/,\[\]]+):(?P<port>\d+)/?")


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

