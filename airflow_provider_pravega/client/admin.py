"""Scope and stream administration: create (idempotent), delete, list, policies, tags, seal,
truncate, manual scale and stream info.

Everything goes through the controller's gRPC API (fail-fast, see controller.py) and, for the
tail of a stream, the segment store's GetStreamSegmentInfo. The official binding offers a subset
of this but retries errors for a minute and cannot scale, truncate or report positions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any
from dataclasses import dataclass
from itertools import pairwise

from airflow_provider_pravega.client.controller import ControllerClient
from airflow_provider_pravega.client.controller_types import (
    RetentionPolicy,
    ScalingPolicy,
    SegmentRange,
    StreamConfiguration,
)
from airflow_provider_pravega.client.errors import (
    ControllerError,
    ControllerUnreachableError,
    InvalidNameError,
    InvalidStreamCutError,
    NoSuchSegmentError,
    PravegaPermissionError,
    ScaleError,
    ScopeExistsError,
    StreamExistsError,
    StreamNotFoundError,
    TruncatedStreamCutError,
)
from airflow_provider_pravega.client.segment_client import SegmentStoreClient
from airflow_provider_pravega.protocol import naming

__all__ = [
    "KEEP",
    "SCALING_POLICIES",
    "StreamAdmin",
    "StreamInfo",
    "build_retention_policy",
    "build_scaling_policy",
    "whole_number",
]


# ------------------------------------------------------------------ policies from parameters

SCALING_POLICIES = ("fixed", "by_event_rate", "by_data_rate")


def whole_number(value: Any, name: str, minimum: int = 0) -> int:
    """Numbers from templates or Spark options arrive as text; accept whole numbers only, naming the parameter."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a whole number, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if not isinstance(value, int):
        raise TypeError(f"{name} must be a whole number, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def build_scaling_policy(
    policy: str,
    *,
    segments: Any = None,
    min_segments: Any = None,
    target_rate: Any = None,
    scale_factor: Any = None,
) -> ScalingPolicy:
    """A scaling policy from operator parameters or data-source options.

    ``fixed`` takes ``segments`` (default 1); ``by_event_rate`` (events/s per segment) and
    ``by_data_rate`` (KiB/s per segment) take ``target_rate``, ``scale_factor`` and
    ``min_segments`` (default 1).
    """
    kind = str(policy).strip().lower()
    if kind == "fixed":
        extra = [n for n, v in (("min_segments", min_segments), ("target_rate", target_rate), ("scale_factor", scale_factor)) if v is not None]
        if extra:
            raise ValueError(
                f"{', '.join(extra)} only apply to scaling_policy 'by_event_rate' or 'by_data_rate'; a fixed "
                f"policy takes segments=N"
            )
        return ScalingPolicy.fixed(whole_number(1 if segments is None else segments, "segments", 1))
    if kind in ("by_event_rate", "by_data_rate"):
        if segments is not None:
            raise ValueError(f"segments is for scaling_policy 'fixed'; {kind} takes min_segments")
        if target_rate is None or scale_factor is None:
            raise ValueError(f"scaling_policy {kind!r} needs target_rate and scale_factor")
        rate = whole_number(target_rate, "target_rate", 1)
        factor = whole_number(scale_factor, "scale_factor", 1)
        minimum = whole_number(1 if min_segments is None else min_segments, "min_segments", 1)
        if kind == "by_event_rate":
            return ScalingPolicy.by_event_rate(rate, factor, minimum)
        return ScalingPolicy.by_data_rate(rate, factor, minimum)
    raise ValueError(f"scaling_policy must be one of {', '.join(SCALING_POLICIES)}, got {policy!r}")


def build_retention_policy(size_bytes: Any = None, time_ms: Any = None) -> RetentionPolicy | None:
    """Retention by size (bytes) or by time (milliseconds), or None (keep everything)."""
    if size_bytes is not None and time_ms is not None:
        raise ValueError("give retention_size_bytes or retention_time_ms, not both")
    if size_bytes is not None:
        return RetentionPolicy.by_size(whole_number(size_bytes, "retention_size_bytes", 1))
    if time_ms is not None:
        return RetentionPolicy.by_time(whole_number(time_ms, "retention_time_ms", 1))
    return None


class _Keep:
    """Marker: leave this setting as it is (update_stream)."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP = _Keep()


@dataclass(frozen=True)
class StreamInfo:
    """A stream's positions and shape at one moment.

    ``head``/``tail`` map segment id -> offset: where reading from the beginning starts, and
    where the data written so far ends. ``active_segments`` are the current (writable) segments;
    for a sealed stream (``sealed``), the segments it ended with (Pravega itself then reports no
    current segments).
    """

    scope: str
    stream: str
    head: dict[int, int]
    tail: dict[int, int]
    active_segments: tuple[SegmentRange, ...]
    sealed: bool
    config: StreamConfiguration

    @property
    def segment_count(self) -> int:
        return len(self.active_segments)


class StreamAdmin:
    def __init__(
        self, controller: ControllerClient, segments: SegmentStoreClient | None = None
    ) -> None:
        self.controller = controller
        self.segments = segments or SegmentStoreClient(controller)

    # -------------------------------------------------------------------------------- scopes

    def create_scope(self, scope: str, *, fail_if_exists: bool = False) -> bool:
        """True when created; False (or ScopeExistsError with ``fail_if_exists``) when it existed."""
        _check_name("scope", scope)
        created = self.controller.create_scope(scope)
        if not created and fail_if_exists:
            raise ScopeExistsError(scope)
        return created

    def delete_scope(self, scope: str) -> bool:
        """True when deleted, False when there was no such scope. The scope must be empty."""
        return self.controller.delete_scope(scope)

    def scope_exists(self, scope: str) -> bool:
        return self.controller.scope_exists(scope)

    def list_scopes(self) -> list[str]:
        return self.controller.list_scopes()

    # ------------------------------------------------------------------------------- streams

    def create_stream(
        self,
        scope: str,
        stream: str,
        segments: int | None = None,
        *,
        scaling: ScalingPolicy | None = None,
        retention: RetentionPolicy | None = None,
        tags: Sequence[str] | None = None,
        fail_if_exists: bool = False,
    ) -> bool:
        """Create a stream with ``segments`` fixed segments (default 1) or a ``scaling`` policy.

        Returns True when created, False when it already existed (whatever its configuration),
        unless ``fail_if_exists`` asks for StreamExistsError.
        """
        _check_name("stream", stream)
        if segments is not None and scaling is not None:
            raise ValueError("give either segments or scaling, not both")
        policy = scaling or ScalingPolicy.fixed(1 if segments is None else segments)
        created = self.controller.create_stream(scope, stream, policy, retention, tags)
        if not created and fail_if_exists:
            raise StreamExistsError(scope, stream)
        return created

    def ensure_stream(
        self,
        scope: str,
        stream: str,
        segments: int | None = None,
        *,
        scaling: ScalingPolicy | None = None,
        create_scope: bool = False,
    ) -> bool:
        """Make sure the stream exists and is usable; True when this call created it.

        Asks the controller to create it even when it exists: Pravega 0.13 leaves a stream whose
        creation was interrupted (a controller or segment store lost mid-way) in state CREATING,
        listed by ``stream_exists`` but refusing every read and write, until a create finishes it
        with the configuration first given. For a listed stream that create is a best effort: a user
        who may use the stream but not create streams in its scope (PravegaPermissionError), or a
        controller that cannot answer a change right now (as while a lost store's containers
        recover; reads wait for it, changes do not), gets the stream as it is. ``create_scope``
        also creates a missing scope.
        """
        exists = self.stream_exists(scope, stream)
        if not exists and create_scope and not self.scope_exists(scope):
            self.create_scope(scope)
        try:
            return self.create_stream(scope, stream, segments, scaling=scaling)
        except (PravegaPermissionError, ControllerError, ControllerUnreachableError):
            if exists:
                return False
            raise

    def stream_exists(self, scope: str, stream: str) -> bool:
        """Whether the controller lists it: also true for a stream still, or stuck, in creation
        (see :meth:`ensure_stream`)."""
        return self.controller.stream_exists(scope, stream)

    def list_streams(self, scope: str, *, include_internal: bool = False) -> list[str]:
        names = self.controller.list_streams(scope)
        if include_internal:
            return names
        return [n for n in names if not n.startswith(naming.INTERNAL_NAME_PREFIX)]

    def get_stream_config(self, scope: str, stream: str) -> StreamConfiguration:
        return self.controller.get_stream_configuration(scope, stream)

    def update_stream(
        self,
        scope: str,
        stream: str,
        *,
        scaling: ScalingPolicy | _Keep = KEEP,
        retention: RetentionPolicy | None | _Keep = KEEP,
        tags: Sequence[str] | None | _Keep = KEEP,
    ) -> StreamConfiguration:
        """Change some settings, keep the others; returns the new configuration."""
        current = self.controller.get_stream_configuration(scope, stream)
        new_scaling = current.scaling if isinstance(scaling, _Keep) else scaling
        new_retention = current.retention if isinstance(retention, _Keep) else retention
        new_tags = (
            current.tags
            if isinstance(tags, _Keep)
            else (tuple(tags) if tags is not None else ())
        )
        self.controller.update_stream(
            scope, stream, new_scaling, new_retention, new_tags
        )
        return self.controller.get_stream_configuration(scope, stream)

    def get_tags(self, scope: str, stream: str) -> tuple[str, ...]:
        return self.controller.get_stream_configuration(scope, stream).tags or ()

    def add_tags(self, scope: str, stream: str, *tags: str) -> tuple[str, ...]:
        current = list(self.get_tags(scope, stream))
        current.extend(t for t in tags if t not in current)
        return self.update_stream(scope, stream, tags=current).tags or ()

    def remove_tags(self, scope: str, stream: str, *tags: str) -> tuple[str, ...]:
        current = [t for t in self.get_tags(scope, stream) if t not in tags]
        return self.update_stream(scope, stream, tags=current).tags or ()

    def seal_stream(self, scope: str, stream: str) -> None:
        """Make the stream read-only (idempotent)."""
        self.controller.seal_stream(scope, stream)

    def delete_stream(self, scope: str, stream: str, *, seal: bool = False) -> bool:
        """True when deleted, False when there was no such stream. It must be sealed (or ``seal``)."""
        if seal:
            try:
                self.controller.seal_stream(scope, stream)
            except StreamNotFoundError:
                return False
        return self.controller.delete_stream(scope, stream)

    # -------------------------------------------------------------------------- truncation

    def truncate_stream(
        self, scope: str, stream: str, cut: Mapping[int, int] | object
    ) -> None:
        """Drop everything before ``cut``: a mapping segment id -> offset, or an object with a
        ``positions`` mapping (and ``scope``/``stream`` that must match)."""
        positions = _positions_of(cut, scope, stream)
        if not positions:
            raise InvalidStreamCutError(
                f"cannot truncate {scope}/{stream} at an empty (unbounded) stream cut"
            )
        head = self.controller.get_segments_at_head(scope, stream)
        for segment_id, offset in positions.items():
            if segment_id in head and offset < head[segment_id]:
                raise TruncatedStreamCutError(
                    scope,
                    stream,
                    f"segment {segment_id} is already truncated at {head[segment_id]}, the cut says {offset}",
                )
        # Pravega 0.13 accepts a cut past the end of a segment's data: it records that head (so
        # readers wait there for data that may never come) without truncating the segment.
        # Refuse it here, where the lengths are known.
        for segment_id, offset in positions.items():
            try:
                length = self._length(scope, stream, segment_id)
            except NoSuchSegmentError:
                continue  # not a segment of the stream (any more): the controller names the problem
            if offset > length:
                raise InvalidStreamCutError(
                    f"cannot truncate {scope}/{stream} at {positions}: segment {segment_id} holds {length} "
                    f"bytes, the cut says {offset} (beyond the end of the data)"
                )
        self.controller.truncate_stream(scope, stream, positions)

    # ------------------------------------------------------------------------------- scaling

    def scale(
        self,
        scope: str,
        stream: str,
        sealed_segments: Sequence[int],
        new_ranges: Sequence[tuple[float, float]],
    ) -> list[SegmentRange]:
        """Replace segments by new ones covering exactly the same key ranges; returns the new ones."""
        return self.controller.scale(scope, stream, sealed_segments, new_ranges)

    def split_segment(
        self, scope: str, stream: str, segment_id: int, parts: int = 2
    ) -> list[SegmentRange]:
        """Split one active segment into ``parts`` equal key ranges."""
        if parts < 2:
            raise ValueError(f"a split needs at least 2 parts, got {parts}")
        seg = self._active(scope, stream, [segment_id])[0]
        width = (seg.max_key - seg.min_key) / parts
        bounds = [seg.min_key + i * width for i in range(parts)] + [seg.max_key]
        return self.scale(scope, stream, [segment_id], list(pairwise(bounds)))

    def merge_segments(
        self, scope: str, stream: str, segment_ids: Sequence[int]
    ) -> SegmentRange:
        """Merge adjacent active segments into one segment covering their union."""
        if len(segment_ids) < 2:
            raise ValueError("a merge needs at least 2 segments")
        segs = sorted(self._active(scope, stream, segment_ids), key=lambda s: s.min_key)
        for a, b in pairwise(segs):
            if a.max_key != b.min_key:
                raise ScaleError(
                    f"segments {a.segment_id} [{a.min_key}, {a.max_key}) and {b.segment_id} [{b.min_key}, "
                    f"{b.max_key}) of {scope}/{stream} are not adjacent; only neighbouring key ranges can merge"
                )
        (new,) = self.scale(
            scope,
            stream,
            [s.segment_id for s in segs],
            [(segs[0].min_key, segs[-1].max_key)],
        )
        return new

    def _active(
        self, scope: str, stream: str, segment_ids: Sequence[int]
    ) -> list[SegmentRange]:
        current = {
            s.segment_id: s for s in self.controller.get_current_segments(scope, stream)
        }
        missing = [i for i in segment_ids if i not in current]
        if missing:
            raise ScaleError(
                f"segments {missing} are not active segments of {scope}/{stream} (active: {sorted(current)})"
            )
        return [current[i] for i in segment_ids]

    # ---------------------------------------------------------------------------------- info

    def head(self, scope: str, stream: str) -> dict[int, int]:
        """segment id -> first readable offset, at the stream's beginning (after truncation)."""
        return self.controller.get_segments_at_head(scope, stream)

    def tail(self, scope: str, stream: str) -> dict[int, int]:
        """segment id -> current length, for the active segments (the end of the data so far);
        for a sealed stream, the final lengths of the segments it ended with."""
        return {
            s.segment_id: self._length(scope, stream, s.segment_id)
            for s in self.controller.get_last_segments(scope, stream)
        }

    def origin(self, scope: str, stream: str) -> list[int]:
        """The ids of the segments ``scope/stream`` was created with (its epoch 0), sorted: what tells
        a stream from a re-created namesake, whose segment numbers start after the deleted one's
        (Pravega's safe starting segment number). Scaling and truncation leave it unchanged."""
        return sorted(s.segment_id for s in self.controller.get_epoch_segments(scope, stream, 0))

    def origin_changed(self, scope: str, stream: str, recorded: Sequence[int] | None,
                       record: Callable[[list[int]], Sequence[int] | None] | None = None
                       ) -> tuple[list[int], list[int]] | None:
        """(recorded, current) origins when a state that ``recorded`` an origin of ``scope/stream``
        belongs to an earlier stream of that name (deleted and re-created since); None when it is
        this one's. A state with no origin yet records the current one through ``record`` (which
        returns the origin the state then holds: another writer's may have come first), or, without
        ``record``, has nothing to compare."""
        origin = self.origin(scope, stream)
        if recorded is None and record is not None:
            recorded = record(origin)
        if recorded is None or list(recorded) == origin:
            return None
        return list(recorded), origin

    def _length(self, scope: str, stream: str, segment_id: int) -> int:
        return self._info(scope, stream, segment_id).length

    def _info(self, scope: str, stream: str, segment_id: int):
        name = naming.qualified_segment_name(scope, stream, segment_id)
        return self.segments.get_segment_info(name)

    def stream_info(self, scope: str, stream: str) -> StreamInfo:
        config = self.controller.get_stream_configuration(scope, stream)
        head = self.controller.get_segments_at_head(scope, stream)
        active = self.controller.get_last_segments(scope, stream)
        tail: dict[int, int] = {}
        sealed_flags: list[bool] = []
        for seg in active:
            try:
                info = self._info(scope, stream, seg.segment_id)
            except NoSuchSegmentError:
                continue
            tail[seg.segment_id] = info.length
            sealed_flags.append(info.sealed)
        sealed = not active or (bool(sealed_flags) and all(sealed_flags))
        return StreamInfo(scope, stream, head, tail, tuple(active), sealed, config)


def _check_name(kind: str, name: str) -> None:
    try:
        if kind == "scope":
            naming.validate_scope_name(name)
        else:
            naming.validate_stream_name(name)
    except ValueError as exc:
        raise InvalidNameError(str(exc)) from None


def _positions_of(cut: object, scope: str, stream: str) -> dict[int, int]:
    if isinstance(cut, Mapping):
        return {int(k): int(v) for k, v in cut.items()}
    positions = getattr(cut, "positions", None)
    if isinstance(positions, Mapping):
        cut_scope, cut_stream = (
            getattr(cut, "scope", scope),
            getattr(cut, "stream", stream),
        )
        if (cut_scope, cut_stream) != (scope, stream):
            raise InvalidStreamCutError(
                f"a stream cut of {cut_scope}/{cut_stream} cannot be used on {scope}/{stream}"
            )
        return {int(k): int(v) for k, v in positions.items()}
    raise InvalidStreamCutError(
        f"a stream cut must be a mapping segment id -> offset (or a StreamCut), got {type(cut).__name__}"
    )
