"""An export's record in its state synchronizer: what it remembers (:class:`ExportState`), the
pure reducer that folds each recorded update into it (:func:`apply_update`), and where the
record is kept, opened, checked against the stream it describes, and forgotten."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_pravega.client.ingest_location import state_scope_access
from airflow_provider_pravega.client.synchronizer import StateSynchronizer
from airflow_provider_pravega.protocol.naming import state_stream
from airflow_provider_pravega.spark.export_spec import ExportError, ExportSpec


@dataclass
class ExportState:
    """Everything an export id remembers: recorded intervals, the last finished plain export and a
    claimed-but-unfinished one. Cuts are kept as Pravega stream-cut texts."""

    intervals: dict[str, dict[str, str]] = field(default_factory=dict)
    last: dict[str, str] | None = None
    pending: dict[str, str] | None = None
    #: The segment ids the stream was created with when its cuts were first recorded (StreamAdmin.origin).
    origin: list[int] | None = None
    #: Whose state this is (recorded with the origin; None in states recorded before): for
    #: ``python -m airflow_provider_pravega state``, since the stream's name holds only a digest.
    export_id: str | None = None
    stream: str | None = None
    #: The exported stream's scope (None in states recorded before: the state's own scope).
    scope: str | None = None
    #: Output path -> its claim (``interval``, ``start``, ``end``, ``at``), made before each write of
    #: files there, and the cut manifest of the last write (``events``, ``bytes``, ``files``).
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)


def apply_update(state: ExportState, op: dict[str, Any]) -> ExportState:
    """Fold one update. An interval is recorded once: the first record wins, forever."""
    kind = op.get("op")
    cuts = {"start": op.get("start"), "end": op.get("end")}
    if kind == "interval":
        state.intervals.setdefault(op["key"], {**cuts, "at": op.get("at", "")})
    elif kind == "claim":
        state.pending = {**cuts, "at": op.get("at", "")}
    elif kind == "done":
        state.last = cuts
        state.pending = None
    elif kind == "output":  # a new claim (the caller checked it may) replaces the manifest too
        state.outputs[op["path"]] = {"interval": op.get("key"), **cuts, "at": op.get("at", "")}
    elif kind == "written":
        state.outputs.setdefault(op["path"], {}).update(
            {k: v for k, v in op.items() if k not in ("op", "path", "at")}, written_at=op.get("at", ""))
    elif kind == "origin":
        if state.origin is None:
            state.origin = list(op["origin"])
            state.export_id, state.stream, state.scope = op.get("export_id"), op.get("stream"), op.get("scope")
    return state


def state_location(spec: ExportSpec) -> tuple[str, str]:
    """Where an export id keeps its state (see ``state_stream``). In the stream's own scope the key
    is the export id (as it always was); in another scope it also covers the stream's scope and
    name, so exports of streams of several scopes sharing one state scope never collide."""
    state_scope = spec.state_scope or spec.scope
    key = spec.effective_export_id
    if state_scope != spec.scope:
        key = f"{spec.scope}/{spec.stream}\n{key}"
    return state_stream("export", key, spec.scope, state_scope)


def open_export_state(client: Any, spec: ExportSpec) -> Any:
    """The export's recorded cuts (the stream, and its scope, created if missing)."""
    scope, stream = state_location(spec)
    with state_scope_access(spec.scope, spec.state_scope):
        if scope != spec.scope and not client.admin.stream_exists(scope, stream):
            own = state_location(dataclasses.replace(spec, state_scope=None))
            if client.admin.stream_exists(*own):  # a fresh state would forget every recorded cut
                raise ExportError(
                    f"export {spec.effective_export_id!r} of {spec.scope}/{spec.stream} keeps its recorded cuts in "
                    f"{own[0]}/{own[1]} (the stream's own scope), not in state_scope {scope!r}: a new state there "
                    f"would start 'previous' at the head again and forget every interval. Leave state_scope unset "
                    f"for this export, or forget the old state (python -m airflow_provider_pravega state --scope "
                    f"{own[0]} reset {own[1]} --yes) to start afresh in {scope}.")
        return StateSynchronizer(client, scope, stream, ExportState(), apply_update)


def reset_export_state(client: Any, scope: str, stream: str, export_id: str, *, state_scope: str | None = None
                       ) -> bool:
    """Forget every cut export ``export_id`` of ``scope/stream`` recorded (intervals, where
    ``previous`` continues): for a stream that was deleted and re-created. False when there was
    nothing to forget."""
    spec = ExportSpec(scope, stream, "/unused", export_id=export_id, state_scope=state_scope)
    return client.admin.delete_stream(*state_location(spec), seal=True)


def check_export_origin(client: Any, sync: Any, spec: ExportSpec) -> None:
    """ExportError when the export's recorded cuts belong to an earlier stream of this name (see
    check_stream_origin of the ingest); the origin is recorded on first use."""
    changed = client.admin.origin_changed(
        spec.scope, spec.stream, sync.fetch().origin,
        lambda origin: sync.update(lambda s: None if s.origin is not None else {
            "op": "origin", "origin": origin, "export_id": spec.effective_export_id, "scope": spec.scope,
            "stream": spec.stream}).origin)
    if changed is not None:
        recorded, origin = changed
        state_scope, state_stream = state_location(spec)
        raise ExportError(
            f"the recorded cuts of export {spec.effective_export_id!r} ({state_scope}/{state_stream}) belong to an "
            f"earlier stream {spec.scope}/{spec.stream}, deleted and re-created since (created with segment(s) "
            f"{', '.join(map(str, recorded))}, the current one with {', '.join(map(str, origin))}): its intervals "
            f"and where 'previous' continues point into the deleted stream. Forget them with reset_export_state("
            f"client, {spec.scope!r}, {spec.stream!r}, {spec.effective_export_id!r}"
            f"{'' if state_scope == spec.scope else f', state_scope={state_scope!r}'}) "
            f"(airflow_provider_pravega.spark.export_job), and reset_ingest_state for an ingest into the stream, or "
            f"give the export another export_id."
        )
