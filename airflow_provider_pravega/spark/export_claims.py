"""Whether an export may write at its output path: what a reader finds there against the
claims the export recorded in its state before each write (or the marker of an earlier
release), and the records of the claim and of what the write left there (the cut manifest)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from airflow_provider_pravega.spark.export_output import UnusablePathError, hidden_file_text, local_path, output_key
from airflow_provider_pravega.spark.export_spec import ExportResult, ExportSpec, OutputPathError
from airflow_provider_pravega.spark.export_state import ExportState

log = logging.getLogger(__name__)

#: The markers by which releases before 2026-11-27 said an export folder was theirs
#: (:func:`earlier_release_claim`); none is written now.
EARLIER_MARKERS = ("_PRAVEGA_EXPORT.json", "_PRAVEGA_EXPORT.pending.json")


def _is_the_path(uri: str, given: str) -> bool:
    """Whether a listed file is the output path itself (a file where a directory belongs)."""
    mine = local_path(given)
    if mine is not None:
        return local_path(uri) == mine
    return uri.partition("://")[2].rstrip("/") == output_key(given).partition("://")[2]


def check_output(spec: ExportSpec, state: ExportState, visible: list[str] | None, start_text: str,
                 end_text: str, earlier_marker: Callable[[], dict[str, Any] | None] | None = None) -> bool:
    """Whether this export may write at its output path, given what a reader finds there
    (``visible``) and the export's claims; True when it replaces files of its own. Without a claim,
    ``earlier_marker`` (:func:`earlier_release_claim`) gives the claim an earlier release's marker
    makes, checked as the export's own. Raises
    OutputPathError for a file, files no claim of this export covers, or its export of another
    interval or of other cuts."""
    given = spec.output_path
    if not visible:
        return False
    _refuse_a_file(given, visible)
    claim = state.outputs.get(output_key(given))
    if claim is None and earlier_marker is not None:
        claim = earlier_marker()
    if claim is None:
        raise OutputPathError(
            f"output path {given!r} already holds files that no export wrote as {spec.effective_export_id!r} "
            f"({_some_of(visible)}); remove them or choose another path")
    if claim.get("interval") != spec.interval_key:
        raise OutputPathError(
            f"output path {given!r} holds export {spec.effective_export_id!r} of interval {claim.get('interval')!r}, "
            f"not of {spec.interval_key!r}; remove it or choose another path")
    if spec.from_ingest is None and (claim.get("start"), claim.get("end")) != (start_text, end_text):
        raise OutputPathError(
            f"output path {given!r} holds an export of other cuts ({claim.get('start')} .. {claim.get('end')}) than "
            f"this run's ({start_text} .. {end_text}); remove it or choose another path")
    return True


def earlier_release_claim(spec: ExportSpec, spark: Any) -> dict[str, Any] | None:
    """The claim of the output path that the marker of an earlier release makes (None: no marker):
    until 2026-11-27 (commit 7f2ffb9) an export recorded whose folder it was in the folder itself,
    ``_PRAVEGA_EXPORT.json`` (or, while an object-store publish was under way,
    ``_PRAVEGA_EXPORT.pending.json``), not in its state. OutputPathError when the marker cannot be
    read or names another export or stream: that folder is not this export's to replace."""
    given, export_id = spec.output_path, spec.effective_export_id
    for name in EARLIER_MARKERS:
        try:
            text = hidden_file_text(spark, given, name)
        except (UnusablePathError, OSError, UnicodeDecodeError) as exc:
            raise OutputPathError(
                f"output path {given!r} holds no claim of export {export_id!r}, and its {name} (an earlier "
                f"release's marker) cannot be read: {exc}; remove the folder or choose another path") from None
        if text is None:
            continue
        try:
            marker = json.loads(text)
        except ValueError:
            marker = None
        if not isinstance(marker, dict) or not marker:
            raise OutputPathError(f"output path {given!r} has an unreadable {name} (an earlier release's marker); "
                                  f"remove the folder or choose another path")
        owner = (marker.get("export_id"), marker.get("scope"), marker.get("stream"))
        if owner != (export_id, spec.scope, spec.stream):
            raise OutputPathError(
                f"output path {given!r} holds export {owner[0]!r} of {owner[1]}/{owner[2]} (its {name}, written by "
                f"an earlier release), not {export_id!r} of {spec.scope}/{spec.stream}; remove it or choose another "
                f"path")
        log.info("output path %s holds export %s of interval %s as an earlier release wrote it (%s): its claim",
                 given, export_id, marker.get("interval"), name)
        return {"interval": marker.get("interval"), "start": marker.get("start_cut"), "end": marker.get("end_cut"),
                "marker": name}
    return None


def check_delta_location(spec: ExportSpec, visible: list[str] | None) -> None:
    """OutputPathError unless a Delta export may make a table at its output path, where there is
    no Delta table yet (``visible``: what a reader finds there): nothing, or an empty directory.
    Delta would write its log beside other files, and their readers would then see the export's
    rows instead of their own."""
    given = spec.output_path
    if not visible:
        return
    _refuse_a_file(given, visible)
    raise OutputPathError(
        f"output path {given!r} is not a Delta table (no _delta_log) and already holds other files "
        f"({_some_of(visible)}); a Delta export would turn it into a table hiding them: remove them or choose "
        "another path")


def _refuse_a_file(given: str, visible: list[str]) -> None:
    if len(visible) == 1 and _is_the_path(visible[0], given):
        raise OutputPathError(f"output path {given!r} is a file; exports write a directory there")


def _some_of(visible: list[str]) -> str:
    return f"{len(visible)} file(s), e.g. {visible[0].rsplit('/', 1)[-1]}"


def not_writable(spec: ExportSpec, reason: str) -> OutputPathError:
    return OutputPathError(f"output path {spec.output_path!r} is not writable ({reason})")


def claim_output(sync: Any, spec: ExportSpec, start_text: str, end_text: str) -> None:
    """Record, before the write, that the output path holds this export's interval."""
    sync.update(lambda _state: {"op": "output", "path": output_key(spec.output_path), "key": spec.interval_key,
                                "start": start_text, "end": end_text, "at": _now()})


def record_written(sync: Any, spec: ExportSpec, result: ExportResult,
                    pieces: list[tuple[str, str]] | None) -> None:
    """The cut manifest of what the write left at the output path, in the export's state (with
    ``from_ingest``: the ingest's runs and the committed ranges exported)."""
    op = {"op": "written", "path": output_key(spec.output_path), "events": result.events, "bytes": result.bytes,
          "files": [f.rsplit("/", 1)[-1] for f in result.files], "at": _now()}
    if pieces is not None:
        op.update(from_ingest=spec.from_ingest, ingest_runs=result.ingest_runs, pieces=[list(p) for p in pieces])
    sync.update(lambda _state: op)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
