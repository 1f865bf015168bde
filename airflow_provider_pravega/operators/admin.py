"""Operators that administer Pravega scopes and streams.

Each is a thin layer over :class:`~airflow_provider_pravega.client.admin.StreamAdmin`: it reads the
``pravega`` connection, fills in the connection's default scope, calls the client once, and pushes
a JSON result to XCom (for streams: segments, and head and tail cuts as Pravega text that the
truncate operator, the stream sensor or an export can take). Creating what exists and deleting
what is gone succeed and say so in the log; ``fail_if_exists`` / ``fail_if_missing`` refuse instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_provider_pravega._streams import (
    cut_text,
    parse_stream_cut,
    resolve_scope,
    resolve_stream_cut,
    stream_info_to_dict,
)
from airflow_provider_pravega.client.admin import KEEP, build_retention_policy, build_scaling_policy, whole_number
from airflow_provider_pravega.client.controller_types import SegmentRange
from airflow_provider_pravega.client.errors import (
    PravegaError,
    ScopeNotFoundError,
    StreamNotFoundError,
)
from airflow_provider_pravega.hooks.pravega import PravegaHook
from airflow_provider_pravega.openlineage import operator_lineage, stream_dataset

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.client.config import PravegaConnectionConfig

__all__ = [
    "PravegaCreateScopeOperator",
    "PravegaCreateStreamOperator",
    "PravegaDeleteScopeOperator",
    "PravegaDeleteStreamOperator",
    "PravegaScaleStreamOperator",
    "PravegaSealStreamOperator",
    "PravegaTruncateStreamOperator",
    "PravegaUpdateStreamOperator",
    "build_retention_policy",
    "build_scaling_policy",
]

class _PravegaOperator(BaseOperator):
    """Connection, default scope and client handling shared by the Pravega operators."""

    ui_color = "#d6ecfa"

    def __init__(self, *, scope: str | None = None, pravega_conn_id: str = PravegaHook.default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scope = scope
        self.pravega_conn_id = pravega_conn_id

    @cached_property
    def hook(self) -> PravegaHook:
        return PravegaHook(pravega_conn_id=self.pravega_conn_id)

    @property
    def connection_config(self) -> PravegaConnectionConfig:
        return self.hook.get_config()

    def resolved_scope(self) -> str:
        """The ``scope`` argument, else the connection's default scope."""
        return resolve_scope(self.scope, self.connection_config, self.pravega_conn_id)

    @contextmanager
    def client(self) -> Iterator[PravegaClient]:
        client = self.hook.get_client()
        try:
            yield client
        finally:
            client.close()


class _PravegaStreamOperator(_PravegaOperator):
    """An operator acting on one stream; reports it to OpenLineage as an output dataset."""

    def __init__(self, *, stream: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        # (scope, stream, OpenLineage lifecycle change or None) of the last execute.
        self._lineage: tuple[str, str, str | None] | None = None

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The stream as an output dataset, with the lifecycle change this task made (if any)."""
        if self._lineage is None:
            return None
        scope, stream, change = self._lineage
        return operator_lineage(outputs=[stream_dataset(self.connection_config, scope, stream, lifecycle=change)])


# ----------------------------------------------------------------------------------- parameters


def _as_list(value: Any, name: str) -> list[Any]:
    """A list parameter, also accepted as rendered JSON text (e.g. from a template)."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text) if text.startswith("[") else [t.strip() for t in text.split(",") if t.strip()]
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name} is not a valid JSON list: {exc.msg}") from None
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list, got {type(value).__name__}")
    return list(value)


def _as_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{name} must be true or false, got {value!r}")


def _tags(value: Any) -> list[str] | None:
    if value is None:
        return None
    tags = _as_list(value, "tags")
    if not all(isinstance(t, str) and t for t in tags):
        raise ValueError(f"tags must be non-empty strings, got {tags!r}")
    return tags


def _segment_json(segments: Sequence[SegmentRange]) -> list[dict[str, Any]]:
    return [{"segment_id": s.segment_id, "min_key": s.min_key, "max_key": s.max_key} for s in segments]


# ---------------------------------------------------------------------------------------- scopes


class PravegaCreateScopeOperator(_PravegaOperator):
    """Create a scope (the connection's default scope when ``scope`` is not given).

    An existing scope is success (logged) unless ``fail_if_exists=True``.
    XCom: ``{"scope": ..., "created": bool}``.
    """

    template_fields: Sequence[str] = ("scope",)

    def __init__(self, *, fail_if_exists: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail_if_exists = fail_if_exists

    def execute(self, context: Context) -> dict[str, Any]:
        scope = self.resolved_scope()
        with self.client() as client:
            created = client.admin.create_scope(scope, fail_if_exists=self.fail_if_exists)
        self.log.info("Scope %s %s", scope, "created" if created else "already exists; nothing to do")
        return {"scope": scope, "created": created}


class PravegaDeleteScopeOperator(_PravegaOperator):
    """Delete a scope. It must be empty, unless ``delete_streams=True`` seals and deletes its streams first.

    A missing scope is success (logged) unless ``fail_if_missing=True``.
    XCom: ``{"scope": ..., "deleted": bool, "deleted_streams": [...]}``.
    """

    template_fields: Sequence[str] = ("scope",)

    def __init__(self, *, delete_streams: bool = False, fail_if_missing: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.delete_streams = delete_streams
        self.fail_if_missing = fail_if_missing
        self._dropped: list[str] = []

    def execute(self, context: Context) -> dict[str, Any]:
        scope = self.resolved_scope()
        self._dropped = []
        with self.client() as client:
            if self.delete_streams and client.admin.scope_exists(scope):
                for stream in client.admin.list_streams(scope):
                    if client.admin.delete_stream(scope, stream, seal=True):
                        self._dropped.append(stream)
                        self.log.info("Sealed and deleted stream %s/%s", scope, stream)
                # Internal streams (reader groups, ...) left behind would keep the scope from going.
                for stream in client.admin.list_streams(scope, include_internal=True):
                    try:
                        client.admin.delete_stream(scope, stream, seal=True)
                        self.log.info("Deleted internal stream %s/%s", scope, stream)
                    except PravegaError as exc:
                        self.log.warning("Could not delete internal stream %s/%s: %s", scope, stream, exc)
            deleted = client.admin.delete_scope(scope)
        if not deleted:
            if self.fail_if_missing:
                raise ScopeNotFoundError(scope)
            self.log.info("Scope %s does not exist; nothing to delete", scope)
        else:
            self.log.info("Deleted scope %s", scope)
        return {"scope": scope, "deleted": deleted, "deleted_streams": list(self._dropped)}

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Streams this task deleted, as dropped output datasets (None when it deleted none)."""
        if not self._dropped:
            return None
        scope = self.resolved_scope()
        config = self.connection_config
        return operator_lineage(outputs=[stream_dataset(config, scope, s, lifecycle="DROP") for s in self._dropped])


# --------------------------------------------------------------------------------------- streams


class PravegaCreateStreamOperator(_PravegaStreamOperator):
    """Create a stream with a scaling policy, an optional retention policy and tags.

    :param scaling_policy: ``fixed`` (``segments``), ``by_event_rate`` or ``by_data_rate``
        (``target_rate`` in events/s or KiB/s per segment, ``scale_factor``, ``min_segments``).
    :param retention_size_bytes: keep at most this many bytes (older data is truncated).
    :param retention_time_ms: keep data this many milliseconds.
    :param tags: stream tags.
    :param fail_if_exists: refuse an existing stream instead of accepting it. An existing
        stream is left as it is (a different configuration is logged as a warning; use
        :class:`PravegaUpdateStreamOperator` to change it).

    XCom: the stream's info (see ``_streams.stream_info_to_dict``) plus ``created``.
    """

    template_fields: Sequence[str] = (
        "scope", "stream", "scaling_policy", "segments", "min_segments", "target_rate", "scale_factor",
        "retention_size_bytes", "retention_time_ms", "tags",
    )

    def __init__(
        self,
        *,
        stream: str,
        scaling_policy: str = "fixed",
        segments: int | None = None,
        min_segments: int | None = None,
        target_rate: int | None = None,
        scale_factor: int | None = None,
        retention_size_bytes: int | None = None,
        retention_time_ms: int | None = None,
        tags: list[str] | None = None,
        fail_if_exists: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(stream=stream, **kwargs)
        self.scaling_policy = scaling_policy
        self.segments = segments
        self.min_segments = min_segments
        self.target_rate = target_rate
        self.scale_factor = scale_factor
        self.retention_size_bytes = retention_size_bytes
        self.retention_time_ms = retention_time_ms
        self.tags = tags
        self.fail_if_exists = fail_if_exists

    def execute(self, context: Context) -> dict[str, Any]:
        scope = self.resolved_scope()
        scaling = build_scaling_policy(
            self.scaling_policy,
            segments=self.segments,
            min_segments=self.min_segments,
            target_rate=self.target_rate,
            scale_factor=self.scale_factor,
        )
        retention = build_retention_policy(self.retention_size_bytes, self.retention_time_ms)
        tags = _tags(self.tags)
        with self.client() as client:
            created = client.admin.create_stream(
                scope, self.stream, scaling=scaling, retention=retention, tags=tags, fail_if_exists=self.fail_if_exists
            )
            info = client.admin.stream_info(scope, self.stream)
        if created:
            self.log.info("Created stream %s/%s (%s, retention %s, tags %s)", scope, self.stream, scaling, retention, tags)
        else:
            self.log.info("Stream %s/%s already exists; left as it is", scope, self.stream)
            existing = info.config
            if existing.scaling != scaling or existing.retention != retention or (
                tags is not None and sorted(existing.tags or ()) != sorted(tags)
            ):
                self.log.warning(
                    "Stream %s/%s exists with another configuration (%s, retention %s, tags %s) than requested "
                    "(%s, retention %s, tags %s); use PravegaUpdateStreamOperator to change it",
                    scope, self.stream, existing.scaling, existing.retention, list(existing.tags or ()),
                    scaling, retention, tags,
                )
        self._lineage = (scope, self.stream, "CREATE" if created else None)
        return {**stream_info_to_dict(info), "created": created}


class PravegaUpdateStreamOperator(_PravegaStreamOperator):
    """Change a stream's scaling policy, retention or tags; what is not given is kept.

    Parameters as for :class:`PravegaCreateStreamOperator` (``scaling_policy=None`` keeps the
    scaling policy); ``remove_retention=True`` drops the retention policy; ``tags=[]`` removes all tags.
    XCom: the stream's info after the update.
    """

    template_fields: Sequence[str] = PravegaCreateStreamOperator.template_fields + ("remove_retention",)

    def __init__(
        self,
        *,
        stream: str,
        scaling_policy: str | None = None,
        segments: int | None = None,
        min_segments: int | None = None,
        target_rate: int | None = None,
        scale_factor: int | None = None,
        retention_size_bytes: int | None = None,
        retention_time_ms: int | None = None,
        remove_retention: bool = False,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(stream=stream, **kwargs)
        self.scaling_policy = scaling_policy
        self.segments = segments
        self.min_segments = min_segments
        self.target_rate = target_rate
        self.scale_factor = scale_factor
        self.retention_size_bytes = retention_size_bytes
        self.retention_time_ms = retention_time_ms
        self.remove_retention = remove_retention
        self.tags = tags

    def _changes(self) -> dict[str, Any]:
        changes: dict[str, Any] = {"scaling": KEEP, "retention": KEEP, "tags": KEEP}
        scaling_args = {
            "segments": self.segments, "min_segments": self.min_segments,
            "target_rate": self.target_rate, "scale_factor": self.scale_factor,
        }
        if self.scaling_policy is not None:
            changes["scaling"] = build_scaling_policy(self.scaling_policy, **scaling_args)
        elif any(v is not None for v in scaling_args.values()):
            raise ValueError("set scaling_policy ('fixed', 'by_event_rate' or 'by_data_rate') to change segments or rates")
        remove = _as_bool(self.remove_retention, "remove_retention")
        retention = build_retention_policy(self.retention_size_bytes, self.retention_time_ms)
        if remove and retention is not None:
            raise ValueError("remove_retention=True cannot be combined with a new retention size or time")
        if remove:
            changes["retention"] = None
        elif retention is not None:
            changes["retention"] = retention
        if self.tags is not None:
            changes["tags"] = _tags(self.tags)
        return changes

    def execute(self, context: Context) -> dict[str, Any]:
        scope = self.resolved_scope()
        changes = self._changes()
        with self.client() as client:
            new_config = client.admin.update_stream(scope, self.stream, **changes)
            info = client.admin.stream_info(scope, self.stream)
        self.log.info(
            "Updated stream %s/%s: %s, retention %s, tags %s",
            scope, self.stream, new_config.scaling, new_config.retention, list(new_config.tags or ()),
        )
        self._lineage = (scope, self.stream, "ALTER")
        return stream_info_to_dict(info)


class PravegaScaleStreamOperator(_PravegaStreamOperator):
    """Manually scale a stream: split one segment, merge adjacent ones, or replace given segments.

    Exactly one of:

    - ``split_segment=ID`` (and ``parts``, default 2): split an active segment into equal key ranges;
    - ``merge_segments=[ID, ...]``: merge adjacent active segments into one;
    - ``seal_segments=[ID, ...]`` with ``new_key_ranges=[[lo, hi], ...]``: the new ranges must cover
      exactly the sealed segments' key ranges.

    Re-running a scale that is already done (the segments are sealed and their successors are the
    requested ranges) succeeds without scaling again. XCom: ``sealed_segments``, ``new_segments``
    and the stream's info after the scale.
    """

    template_fields: Sequence[str] = (
        "scope", "stream", "split_segment", "parts", "merge_segments", "seal_segments", "new_key_ranges",
    )

    def __init__(
        self,
        *,
        stream: str,
        split_segment: int | None = None,
        parts: int = 2,
        merge_segments: list[int] | None = None,
        seal_segments: list[int] | None = None,
        new_key_ranges: list[tuple[float, float]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(stream=stream, **kwargs)
        self.split_segment = split_segment
        self.parts = parts
        self.merge_segments = merge_segments
        self.seal_segments = seal_segments
        self.new_key_ranges = new_key_ranges

    def _plan(self) -> tuple[str, list[int], list[tuple[float, float]] | None, int]:
        modes = [
            name for name, given in (
                ("split_segment", self.split_segment is not None),
                ("merge_segments", self.merge_segments is not None),
                ("seal_segments", self.seal_segments is not None or self.new_key_ranges is not None),
            ) if given
        ]
        if len(modes) != 1:
            raise ValueError(
                "give exactly one of split_segment, merge_segments, or seal_segments with new_key_ranges"
                + (f" (got {', '.join(modes)})" if modes else "")
            )
        if modes[0] == "split_segment":
            return "split", [whole_number(self.split_segment, "split_segment")], None, whole_number(self.parts, "parts", 2)
        if modes[0] == "merge_segments":
            ids = [whole_number(i, "merge_segments") for i in _as_list(self.merge_segments, "merge_segments")]
            if len(ids) < 2:
                raise ValueError(f"merge_segments needs at least 2 segment ids, got {ids}")
            return "merge", ids, None, 1
        if self.seal_segments is None or self.new_key_ranges is None:
            raise ValueError("seal_segments and new_key_ranges go together")
        ids = [whole_number(i, "seal_segments") for i in _as_list(self.seal_segments, "seal_segments")]
        ranges = []
        for item in _as_list(self.new_key_ranges, "new_key_ranges"):
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise ValueError(f"new_key_ranges entries are [low, high] pairs, got {item!r}")
            low, high = float(item[0]), float(item[1])
            if not 0.0 <= low < high <= 1.0:
                raise ValueError(f"key range [{low}, {high}) must satisfy 0 <= low < high <= 1")
            ranges.append((low, high))
        if not ids or not ranges:
            raise ValueError("seal_segments and new_key_ranges must not be empty")
        return "replace", ids, ranges, len(ranges)

    def execute(self, context: Context) -> dict[str, Any]:
        scope = self.resolved_scope()
        mode, sealed_ids, ranges, parts = self._plan()
        with self.client() as client:
            done = _finished_scale(client, scope, self.stream, mode, sealed_ids, ranges, parts)
            if done is not None:
                self.log.info("Segments %s of %s/%s are already scaled into %s; nothing to do",
                              sealed_ids, scope, self.stream, [s.segment_id for s in done])
                new_segments = done
            elif mode == "split":
                new_segments = client.admin.split_segment(scope, self.stream, sealed_ids[0], parts)
            elif mode == "merge":
                new_segments = [client.admin.merge_segments(scope, self.stream, sealed_ids)]
            else:
                new_segments = client.admin.scale(scope, self.stream, sealed_ids, ranges or [])
            info = client.admin.stream_info(scope, self.stream)
        self.log.info("Scaled %s/%s: sealed %s, new segments %s", scope, self.stream, sealed_ids,
                      [(s.segment_id, s.min_key, s.max_key) for s in new_segments])
        self._lineage = (scope, self.stream, "ALTER")
        return {**stream_info_to_dict(info), "sealed_segments": sealed_ids, "new_segments": _segment_json(new_segments)}


def _close(a: float, b: float) -> bool:
    return abs(a - b) < 1e-9


def _finished_scale(
    client: PravegaClient,
    scope: str,
    stream: str,
    mode: str,
    sealed_ids: list[int],
    ranges: list[tuple[float, float]] | None,
    parts: int,
) -> list[SegmentRange] | None:
    """The successors, when this very scale already happened (a retry after success); else None."""
    active = {s.segment_id for s in client.controller.get_current_segments(scope, stream)}
    if any(i in active for i in sealed_ids):
        return None
    successors: dict[int, SegmentRange] = {}
    for segment_id in sealed_ids:
        try:
            found = client.controller.get_successors(scope, stream, segment_id)
        except PravegaError:  # an unknown segment id: let the scale itself report it clearly
            return None
        if not found:
            return None
        for succ in found:
            if not set(succ.predecessors) <= set(sealed_ids):
                return None  # these successors came from a different scale
            successors[succ.segment.segment_id] = succ.segment
    result = sorted(successors.values(), key=lambda s: s.min_key)
    if any(not _close(a.max_key, b.min_key) for a, b in pairwise(result)):
        return None
    if mode == "split":
        width = (result[-1].max_key - result[0].min_key) / parts
        if len(result) != parts or any(not _close(s.max_key - s.min_key, width) for s in result):
            return None
    elif mode == "merge":
        if len(result) != 1:
            return None
    else:
        wanted = sorted(ranges or [])
        if len(wanted) != len(result) or any(
            not (_close(lo, s.min_key) and _close(hi, s.max_key)) for (lo, hi), s in zip(wanted, result)
        ):
            return None
    return result


class PravegaTruncateStreamOperator(_PravegaStreamOperator):
    """Drop a stream's data before a stream cut.

    :param stream_cut: ``"tail"`` (drop everything written so far), ``"head"`` (nothing to do),
        Pravega's stream-cut text (e.g. ``"{{ ti.xcom_pull('seal')['tail'] }}"``), the JSON form of
        a cut, or a mapping segment id -> offset. A cut of another stream is refused.

    Truncating again at the current head is a no-op (so retries succeed). XCom: the stream's info
    after truncation plus ``truncated_at`` (the cut as text).
    """

    template_fields: Sequence[str] = ("scope", "stream", "stream_cut")

    def __init__(self, *, stream: str, stream_cut: Any, **kwargs: Any) -> None:
        super().__init__(stream=stream, **kwargs)
        self.stream_cut = stream_cut

    def execute(self, context: Context) -> dict[str, Any]:
        scope = self.resolved_scope()
        parse_stream_cut(self.stream_cut, scope, self.stream)  # bad values fail before any call
        with self.client() as client:
            positions = resolve_stream_cut(client, scope, self.stream, self.stream_cut)
            head = client.admin.head(scope, self.stream)
            if positions == head:
                self.log.info("Stream %s/%s already starts at this cut; nothing to truncate", scope, self.stream)
            else:
                client.admin.truncate_stream(scope, self.stream, positions)
                self.log.info("Truncated stream %s/%s at %s", scope, self.stream, positions)
            info = client.admin.stream_info(scope, self.stream)
        self._lineage = (scope, self.stream, "TRUNCATE")
        return {**stream_info_to_dict(info), "truncated_at": cut_text(scope, self.stream, positions)}


class PravegaSealStreamOperator(_PravegaStreamOperator):
    """Seal a stream (read-only from now on); sealing a sealed stream succeeds.

    XCom: the stream's info; its ``tail`` is the final cut (everything the stream will ever hold).
    """

    template_fields: Sequence[str] = ("scope", "stream")

    def execute(self, context: Context) -> dict[str, Any]:
        scope = self.resolved_scope()
        with self.client() as client:
            client.admin.seal_stream(scope, self.stream)
            info = client.admin.stream_info(scope, self.stream)
        self.log.info("Sealed stream %s/%s; final cut %s", scope, self.stream, dict(info.tail))
        self._lineage = (scope, self.stream, "ALTER")
        return stream_info_to_dict(info)


class PravegaDeleteStreamOperator(_PravegaStreamOperator):
    """Delete a stream, sealing it first when it is not sealed yet.

    A missing stream (or scope) is success (logged) unless ``fail_if_missing=True``.
    XCom: ``{"scope": ..., "stream": ..., "deleted": bool}``.
    """

    template_fields: Sequence[str] = ("scope", "stream")

    def __init__(self, *, stream: str, fail_if_missing: bool = False, **kwargs: Any) -> None:
        super().__init__(stream=stream, **kwargs)
        self.fail_if_missing = fail_if_missing

    def execute(self, context: Context) -> dict[str, Any]:
        scope = self.resolved_scope()
        with self.client() as client:
            try:
                deleted = client.admin.delete_stream(scope, self.stream, seal=True)
            except ScopeNotFoundError:
                deleted = False
        if deleted:
            self.log.info("Sealed and deleted stream %s/%s", scope, self.stream)
        elif self.fail_if_missing:
            raise StreamNotFoundError(scope, self.stream)
        else:
            self.log.info("Stream %s/%s does not exist; nothing to delete", scope, self.stream)
        self._lineage = (scope, self.stream, "DROP" if deleted else None)
        return {"scope": scope, "stream": self.stream, "deleted": deleted}

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        if self._lineage is None or self._lineage[2] is None:
            return None  # nothing was deleted: no dataset changed
        return super().get_openlineage_facets_on_complete(task_instance)
