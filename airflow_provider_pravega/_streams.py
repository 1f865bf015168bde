"""Stream positions for the Airflow layer: cut values given by DAG authors, XCom-friendly stream info,
"has new data arrived since this cut?" and "is it enough to announce?".

Shared by the admin operators, the sensors and the triggers, and free of Airflow imports so the
triggers stay light. Cut *values* are what a DAG author writes or pulls from XCom: ``"head"``,
``"tail"``, Pravega's stream-cut text (Java ``StreamCut.asText()``), the JSON form
(``{"scope", "stream", "positions": {segment id: offset}, "text"}``), a plain mapping
segment id -> offset, or any object with ``scope``/``stream``/``positions`` (the client's StreamCut).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from airflow_provider_pravega.client.errors import (
    InvalidStreamCutError,
    NoSuchSegmentError,
    SegmentTruncatedError,
    TruncatedStreamCutError,
)
from airflow_provider_pravega.client.streamcut import StreamCut, StreamCutMismatchError
from airflow_provider_pravega.protocol import naming
from airflow_provider_pravega.protocol.streamcut import streamcut_to_text

if TYPE_CHECKING:
    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.client.admin import StreamInfo
    from airflow_provider_pravega.client.config import PravegaConnectionConfig

__all__ = [
    "Batching",
    "NewData",
    "PendingBatch",
    "Positions",
    "cut_text",
    "find_new_data",
    "new_data_at",
    "parse_stream_cut",
    "positions_from_json",
    "positions_to_json",
    "resolve_scope",
    "resolve_stream_cut",
    "stream_info_to_dict",
]

Positions = dict[int, int]
Symbolic = Literal["head", "tail"]


class ScopeNotSetError(ValueError):
    """No scope was given to the task and its connection has no default scope."""


def resolve_scope(scope: str | None, config: PravegaConnectionConfig, conn_id: str) -> str:
    """The task's ``scope``, else the connection's default scope; an error names both places."""
    chosen = scope.strip() if isinstance(scope, str) else scope
    if chosen:
        return chosen
    if config.scope:
        return config.scope
    raise ScopeNotSetError(
        f"no Pravega scope: pass scope=... to the task or set the default scope (extra 'scope') of "
        f"connection {conn_id!r}"
    )


# ----------------------------------------------------------------------------------- cut values


def cut_text(scope: str, stream: str, positions: Mapping[int, int]) -> str:
    """Pravega's text form of a cut (what Java's ``StreamCut.from(text)`` reads)."""
    return streamcut_to_text(scope, stream, positions)


def positions_to_json(positions: Mapping[int, int]) -> dict[str, int]:
    """JSON object keys must be strings: segment ids become decimal text."""
    return {str(segment): int(offset) for segment, offset in sorted(positions.items())}


def positions_from_json(data: Mapping[Any, Any], what: str = "positions") -> Positions:
    out: Positions = {}
    for segment, offset in data.items():
        try:
            seg, off = int(segment), int(offset)
        except (TypeError, ValueError):
            raise InvalidStreamCutError(
                f"{what}: a cut maps segment ids to offsets (integers), got {segment!r}: {offset!r}"
            ) from None
        if seg < 0 or off < 0:
            raise InvalidStreamCutError(f"{what}: segment {seg} has a negative id or offset ({off})")
        out[seg] = off
    return out


def parse_stream_cut(value: Any, scope: str, stream: str, what: str = "stream_cut") -> Positions | Symbolic:
    """Turn a DAG author's cut value into positions, or the symbolic ``"head"`` / ``"tail"``.

    Everything :meth:`StreamCut.coerce <airflow_provider_pravega.client.streamcut.StreamCut.coerce>`
    accepts (a StreamCut, ``"head"``, ``"tail"``, Java text, the JSON form as dict or text; a cut
    of another stream is refused naming both), plus a bare mapping segment id -> offset (e.g. a
    stream info's ``tail_positions``). ``UNBOUNDED`` means the head. ``what`` names the parameter.
    """
    if value is None:
        raise InvalidStreamCutError(f"{what} is missing: give 'head', 'tail', a stream-cut text or a cut from XCom")
    if isinstance(value, Mapping) and not ({"scope", "stream", "positions", "text", "bound"} & set(value)):
        return positions_from_json(value, what)
    try:
        cut = StreamCut.coerce(value, scope, stream, unbounded="head", what=what)
    except StreamCutMismatchError as exc:
        raise StreamCutMismatchError(exc.expected, exc.actual, what) from None
    except InvalidStreamCutError as exc:
        raise InvalidStreamCutError(f"{what}: {exc}") from None
    if cut.bound is not None:
        return cut.bound
    return dict(cut.positions)


def resolve_stream_cut(client: PravegaClient, scope: str, stream: str, value: Any, what: str = "stream_cut") -> Positions:
    """Like :func:`parse_stream_cut`, with ``head``/``tail`` read from the live stream."""
    cut = parse_stream_cut(value, scope, stream, what)
    if cut == "head":
        return dict(client.admin.head(scope, stream))
    if cut == "tail":
        return dict(client.admin.tail(scope, stream))
    return cut  # type: ignore[return-value]


# ------------------------------------------------------------------------------------ stream info


def stream_info_to_dict(info: StreamInfo) -> dict[str, Any]:
    """A stream's shape and positions as plain JSON (for XCom): head and tail cuts as Pravega text."""
    config = info.config
    scaling = config.scaling
    retention = config.retention
    return {
        "scope": info.scope,
        "stream": info.stream,
        "sealed": info.sealed,
        "segment_count": info.segment_count,
        "segments": [
            {"segment_id": s.segment_id, "epoch": s.epoch, "min_key": s.min_key, "max_key": s.max_key}
            for s in info.active_segments
        ],
        "head": cut_text(info.scope, info.stream, info.head),
        "tail": cut_text(info.scope, info.stream, info.tail),
        "head_positions": positions_to_json(info.head),
        "tail_positions": positions_to_json(info.tail),
        "scaling": {
            "policy": _SCALING_NAMES.get(scaling.kind, scaling.kind),
            "min_segments": scaling.min_segments,
            "target_rate": scaling.target_rate,
            "scale_factor": scaling.scale_factor,
        },
        "retention": None if retention is None else {"type": retention.kind, "value": retention.value},
        "tags": list(config.tags or ()),
    }


#: The controller client's policy kinds, spelled as the operators' ``scaling_policy`` parameter.
_SCALING_NAMES = {
    "fixed": "fixed",
    "by_rate_in_events_per_sec": "by_event_rate",
    "by_rate_in_kbytes_per_sec": "by_data_rate",
}


# -------------------------------------------------------------------------------------- new data


@dataclass(frozen=True)
class NewData:
    """What arrived after ``previous``: ``grown`` maps segment id -> (from offset, to offset)."""

    scope: str
    stream: str
    previous: Positions
    tail: Positions
    grown: dict[int, tuple[int, int]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.grown)

    @property
    def new_bytes(self) -> int:
        return sum(end - start for start, end in self.grown.values())

    def to_event(self) -> dict[str, Any]:
        """JSON payload: the previous cut, the new tail (both as text) and the grown ranges."""
        return {
            "scope": self.scope,
            "stream": self.stream,
            "previous_cut": cut_text(self.scope, self.stream, self.previous),
            "cut": cut_text(self.scope, self.stream, self.tail),
            "tail_positions": positions_to_json(self.tail),
            "grown_segments": {str(s): [a, b] for s, (a, b) in sorted(self.grown.items())},
            "new_bytes": self.new_bytes,
        }


def find_new_data(client: PravegaClient, scope: str, stream: str, previous: Mapping[int, int]) -> NewData:
    """Compare the stream's tail with ``previous``, segment by segment, across scaling.

    Without scaling the tail has the same segments as ``previous`` and a larger offset is new data
    (one controller call and one segment-store call per segment). After a scale, every segment
    between ``previous`` and the tail is checked: a sealed predecessor may have grown before it
    was sealed, and a successor holds only new data; such segments' lengths are read from the
    segment store.
    """
    return new_data_at(client, scope, stream, previous, client.admin.tail(scope, stream))


def new_data_at(client: PravegaClient, scope: str, stream: str, previous: Mapping[int, int],
                tail: Mapping[int, int]) -> NewData:
    """:func:`find_new_data` against a ``tail`` already read (one poll shared by several watchers):
    no call at all unless the stream scaled between ``previous`` and ``tail``."""
    previous = dict(previous)
    tail = dict(tail)
    grown: dict[int, tuple[int, int]] = {}
    if set(tail) == set(previous):
        for segment, end in tail.items():
            if end > previous[segment]:
                grown[segment] = (previous[segment], end)
        return NewData(scope, stream, previous, tail, grown)

    between = client.controller.get_segments_between(scope, stream, previous, None) if previous else set()
    for segment in sorted(between | set(tail) | set(previous)):
        start = previous.get(segment, 0)
        if segment in tail:
            end = tail[segment]
        else:
            try:
                end = client.segments.get_segment_info(naming.qualified_segment_name(scope, stream, segment)).length
            except NoSuchSegmentError:
                continue  # deleted by retention or truncation: nothing left to read there
        if end > start:
            grown[segment] = (start, end)
    return NewData(scope, stream, previous, tail, grown)


# -------------------------------------------------------------------------------------- batching


@dataclass(frozen=True)
class Batching:
    """When new data is worth announcing (the stream sensor's and trigger's parameters), so that a
    busy stream does not start a DAG run per poll.

    Neither minimum set (both 0, the default): any new data, at once. Otherwise: when the data
    after the last announced cut reaches ``min_bytes`` (segment bytes, 8-byte event headers
    included) or ``min_events``, or ``max_wait_s`` seconds after data was first seen there,
    whichever comes first. Without ``max_wait_s`` a batch below the minimums waits for more data.
    """

    min_bytes: int = 0
    min_events: int = 0
    max_wait_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("min_bytes", "min_events"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an integer (0: no minimum), got {type(value).__name__} {value!r}")
            if value < 0:
                raise ValueError(f"{name} must be 0 (no minimum) or more, got {value}")
        wait = self.max_wait_s
        if wait is None:
            return
        if isinstance(wait, bool) or not isinstance(wait, (int, float)):
            raise TypeError(f"max_wait_s must be a number of seconds or None, got {type(wait).__name__} {wait!r}")
        if not (0 < wait < math.inf):
            raise ValueError(f"max_wait_s must be a positive, finite number of seconds or None, got {wait!r}")
        if not self.batches:
            raise ValueError(
                f"max_wait_s={wait!r} bounds the wait for min_bytes or min_events, and neither is set "
                f"(without them new data is announced at once): set one, or drop max_wait_s"
            )
        object.__setattr__(self, "max_wait_s", float(wait))

    @property
    def batches(self) -> bool:
        """Whether data may wait for more (a minimum is set)."""
        return bool(self.min_bytes or self.min_events)


class PendingBatch:
    """The data after the last announced cut, judged against a :class:`Batching` poll after poll.

    For ``min_events`` the events are counted by reading the bytes added since the previous poll
    (only the 8-byte headers are parsed; the read costs the new data's size once). ``clock``
    (monotonic seconds) times ``max_wait_s``; tests pass their own.
    """

    def __init__(self, batching: Batching, clock: Callable[[], float] = time.monotonic) -> None:
        self.batching = batching
        self._clock = clock
        self._first_seen: float | None = None
        self._counted: dict[int, int] = {}  # segment id -> offset up to which events were counted
        self.events = 0

    def ready(self, client: PravegaClient, found: NewData) -> bool:
        """Whether ``found`` (all the data after the last announced cut) is to be announced now."""
        if not found:
            return False
        rule = self.batching
        if not rule.batches:
            return True
        if self._first_seen is None:
            self._first_seen = self._clock()
        if rule.min_events:
            self._count_events(client, found)
        if rule.min_bytes and found.new_bytes >= rule.min_bytes:
            return True
        if rule.min_events and self.events >= rule.min_events:
            return True
        return self.wait_left() == 0.0

    def wait_left(self) -> float | None:
        """Seconds until ``max_wait_s`` ends the wait for the minimums; None while there is no data
        waiting or no ``max_wait_s``."""
        if self._first_seen is None or self.batching.max_wait_s is None:
            return None
        return max(0.0, self._first_seen + self.batching.max_wait_s - self._clock())

    def event(self, found: NewData) -> dict[str, Any]:
        """The announcement of ``found``: :meth:`NewData.to_event`, plus ``new_events`` when counted."""
        event = found.to_event()
        if self.batching.min_events:
            event["new_events"] = self.events
        return event

    def reset(self) -> None:
        """Start a new batch (after ``found`` was announced)."""
        self._first_seen = None
        self._counted.clear()
        self.events = 0

    def _count_events(self, client: PravegaClient, found: NewData) -> None:
        # import cost: client.batch brings gRPC; the triggerer imports this module
        from airflow_provider_pravega.client.batch import SegmentRange, read_segment_range_batches

        for segment, (start, end) in sorted(found.grown.items()):
            begin = max(start, self._counted.get(segment, start))
            if begin >= end:
                continue
            count = 0  # added only once the range is read: a failed read is retried whole at the next poll
            try:
                for batch in read_segment_range_batches(client, SegmentRange(found.scope, found.stream, segment,
                                                                             begin, end)):
                    count += len(batch.offsets)
            except (NoSuchSegmentError, SegmentTruncatedError, TruncatedStreamCutError):
                pass  # truncated away (retention) meanwhile: the rest of this range stays uncounted
            self.events += count
            self._counted[segment] = end
