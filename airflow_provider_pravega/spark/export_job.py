"""Export what a Pravega stream received between two stream cuts to files, with PySpark.

The driver decides the two cuts, plans the segment ranges between them
(:func:`~airflow_provider_pravega.client.batch.plan_segment_ranges`, which follows successors
across scaling) and records the cuts in a state synchronizer; Spark then reads every range in
parallel straight from the segment store and writes the rows through its own writers:

* one Spark partition per 128 MiB of planned payload (:data:`BYTES_PER_PARTITION`, or
  ``num_partitions``), each a run of neighbouring segment ranges of about equal bytes and at most one
  partition per range, read in plan order and offset order by the provider's ``pravega``
  data source (:mod:`~airflow_provider_pravega.spark.datasource`), given the export's plan as its
  ``segment_ranges``, so the rows and files of a re-run come out the same, with no shuffle and no sort;
* rows are ``event`` (UTF-8 text, the top-level fields of a JSON object, or bytes) plus
  ``segment_id`` and ``offset`` (where the event's header starts in its segment); a task reads its
  ranges with a read-ahead thread and cuts the events out of each segment-store reply in Arrow
  (:func:`~airflow_provider_pravega.client.batch.read_segment_range_arrow`), so no Python object
  is made per event; the events and bytes are counted by an ``Observation`` of the rows;
* the rows are written with Spark's own commit protocol, ``mode("overwrite")`` on the output
  directory (:mod:`~airflow_provider_pravega.spark.export_output`): the output committer makes the
  files visible at job commit and writes ``_SUCCESS`` last, so a reader that waits for
  ``_SUCCESS`` sees a complete interval; a re-run replaces the directory, so no stale file of an
  earlier run stays visible. On object stores the S3A committers avoid copying each object again
  (docs/export.md). The same code runs on a classic session and on any Spark Connect server; it
  calls no filesystem API of its own. Before the write the output is claimed in the export's
  state in Pravega, and files at the path that no claim of this export covers are never replaced;
  after it, the state records what was written (the cut manifest: cuts, events, bytes, files).

Repeatable scheduled runs: with an ``interval_key`` (the operator passes the data interval) the
first export of an interval records (interval -> start cut, end cut); every later run of that
interval, a retry or a backfill, reuses the record, so it reads the same ranges and writes the same
bytes. ``start_cut="previous"`` tiles the stream: an interval starts where the latest recorded
interval before it ends (the head for the first one), and an interval that is exported after later
ones were recorded ends where the next recorded one starts. Without an interval key, ``previous``
is where the last successful export of this export id ended; a run that fails leaves its cuts as
pending and the next ``previous`` run exports exactly those again.

Interval-true exports (``from_ingest``): the cuts come from the interval index of an exactly-once
ingest into the same stream (:mod:`airflow_provider_pravega.client.ingest`): the ranges its runs of
the same interval key committed, in commit order, whatever order the intervals ran in. Events other
writers appended to the stream while such a range was open are inside it, so they are exported with
that interval. An interval no run of the ingest recorded (yet) is an
:class:`IntervalNotIngestedError` naming it. Its cuts are not recorded in the export's own state
(only its output's claim and manifest): a re-run reads the index again, so it writes the same files
unless a later run of that interval added a range.

Files at the output path are replaced only when the export's state claims the path for the same
export id, interval and cuts (a re-run reproduces them); anything else there is an error.

Speed: the export is CPU-bound, its read stage (reading, Arrow to the JVM, rows) and Spark's
Parquet writer (including the JVM's JIT compiler on every job; a local session's JVM runs the
parallel collector, under which the JIT settles sooner than under G1) adding up; ``num_partitions`` near
the core count and ``compression`` trade file layout and size for speed. Figures and how they were
measured (``benchmarks/bench_export.py``): docs/benchmarks.md.

Run it without Airflow as ``python -m airflow_provider_pravega.spark.export_job --help``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from airflow_provider_pravega.client.batch import (
    SegmentRange,
    plan_segment_ranges,
    read_segment_range,
)
from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.client.errors import (
    InvalidStreamCutError,
    PravegaError,
    SegmentStoreError,
    StreamNotFoundError,
    TruncatedStreamCutError,
)
from airflow_provider_pravega.client.streamcut import HEAD, TAIL, StreamCut, StreamCutMismatchError
from airflow_provider_pravega.protocol import wire
from airflow_provider_pravega.spark.connection_args import (
    add_connection_arguments,
    add_spark_arguments,
    add_submission_argument,
    run_job_command,
    spark_settings,
)
from airflow_provider_pravega.spark import datasource
from airflow_provider_pravega.spark.session import Py4JError, started_on_first_use
from airflow_provider_pravega.spark.export_output import (
    UnusablePathError,
    hidden_file_text,
    java_message,
    local_path,
    local_visible_files,
    output_key,
    path_problem,
    session_local_path,
    visible_files,
    write_empty_locally,
)

log = logging.getLogger(__name__)

__all__ = [
    "COMPRESSION",
    "EVENT_FORMATS",
    "FORMATS",
    "PREVIOUS",
    "EventDecodeError",
    "ExportError",
    "ExportResult",
    "ExportSpec",
    "ExportState",
    "IntervalNotIngestedError",
    "OutputPathError",
    "check_target",
    "main",
    "run_export",
    "state_location",
]

FORMATS = ("parquet", "jsonl", "csv", "delta")
EVENT_FORMATS = ("text", "json", "binary")
ON_TRUNCATED = ("fail", "head")
PREVIOUS = "previous"
#: The markers by which releases before 2026-11-27 said an export folder was theirs
#: (:func:`earlier_release_claim`); none is written now.
EARLIER_MARKERS = ("_PRAVEGA_EXPORT.json", "_PRAVEGA_EXPORT.pending.json")
_SPARK_FORMAT = {"parquet": "parquet", "jsonl": "json", "csv": "csv"}
#: A catalog table name for ``table=``: ``db.table`` or ``catalog.db.table`` (plain identifiers or
#: back-quoted parts).
_NAME_PART = r"(?:[A-Za-z_][A-Za-z0-9_]*|`[^`]+`)"
_TABLE_NAME = re.compile(rf"{_NAME_PART}(?:\.{_NAME_PART}){{1,2}}")
#: Why ``format="iceberg"`` is refused (docs/export.md, "Iceberg"): checked with Maven on 2026-11.
ICEBERG_UNAVAILABLE = (
    "format='iceberg' is not available yet: Apache Iceberg publishes no iceberg-spark-runtime for Spark 4.2 "
    "(Scala 2.13), the Spark this provider runs on (org.apache.iceberg:iceberg-spark-runtime-4.2_2.13 is not on "
    "Maven Central; Iceberg's Spark runtimes stop at Spark 4.1). Export with format='delta', or write files with "
    "format='parquet' and add them to an Iceberg table yourself; see docs/export.md (Iceberg)")
#: Parquet settings for the event columns (a profile of the writer showed min/max statistics of
#: the opaque event payloads and dictionary attempts on unique values as its largest costs): no
#: dictionary for ``event`` (payloads rarely repeat) and ``offset`` (unique by construction), no
#: statistics for ``event`` (min/max of payload bytes prune nothing). ``segment_id`` and
#: ``offset`` keep their statistics, so readers can still skip by position.
PARQUET_OPTIONS = {
    "parquet.enable.dictionary#event": "false",
    "parquet.enable.dictionary#offset": "false",
    "parquet.column.statistics.enabled#event": "false",
}
#: Codecs Spark's writers take per format (``compression``; None keeps Spark's default: snappy for
#: Parquet, none for JSON lines and CSV). Measured on 1M events of 200 bytes (task CPU of Spark's
#: Parquet writer): no compression saves ~18% of the writer's CPU for ~2.7x larger files, zstd
#: costs ~20% more CPU for smaller files than snappy; see benchmarks/bench_export.py.
COMPRESSION = {
    "parquet": ("none", "uncompressed", "snappy", "gzip", "lz4", "lz4_raw", "zstd", "brotli", "lzo"),
    "jsonl": ("none", "gzip", "bzip2", "deflate", "lz4", "snappy", "zstd"),
    "csv": ("none", "gzip", "bzip2", "deflate", "lz4", "snappy", "zstd"),
    "delta": (),  # the table's Parquet codec is the session's spark.sql.parquet.compression.codec
}
_WORKER_ERRORS = (
    "PravegaDataSourceError",
    "SegmentRangeTruncatedError",
    "NoSuchSegmentError",
    "SegmentStoreUnreachableError",
    "ControllerUnreachableError",
    "SegmentStoreError",
)


class ExportError(PravegaError):
    """An export that cannot be done as asked; nothing was written at the output path."""


class OutputPathError(ExportError):
    """The output path cannot be written, or already holds something this export must not replace."""


class IntervalNotIngestedError(ExportError):
    """``from_ingest``: the ingest recorded no committed range for the interval (not ingested yet,
    still committing, or forgotten)."""


class EventDecodeError(ExportError, ValueError):
    """An event does not decode as ``event_format`` says (not UTF-8, not a JSON object)."""


# ---------------------------------------------------------------------------------------------
# What to export
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportSpec:
    """What to export where. Cuts: ``"previous"`` (start only), ``"head"``, ``"tail"``, a stream-cut
    text (Java ``StreamCut.asText()``), a StreamCut, or its JSON form (dict or string)."""

    scope: str
    stream: str
    #: The output directory, or with ``format="delta"`` the Delta table's location. Exactly one of
    #: ``output_path`` and ``table`` is given.
    output_path: str | None = None
    start_cut: Any = PREVIOUS
    end_cut: Any = TAIL
    format: str = "parquet"
    event_format: str = "text"
    export_id: str | None = None
    interval_key: str | None = None
    on_truncated: str = "fail"
    num_partitions: int | None = None
    #: Spark DDL schema of the JSON events (e.g. ``"sensor string, value double"``); inferred from
    #: ``json_sample_events`` events spread over the ranges when not given.
    json_schema: str | None = None
    json_sample_events: int = 1000
    #: Codec of the output files (see :data:`COMPRESSION`); None: Spark's default for the format.
    compression: str | None = None
    #: The id of an exactly-once ingest into this stream: export what its runs of ``interval_key``
    #: committed (its interval index), instead of ``start_cut``/``end_cut``.
    from_ingest: str | None = None
    #: The scope keeping this export's recorded cuts (None: the stream's own scope).
    state_scope: str | None = None
    #: ``from_ingest``: the scope keeping the ingest's state (None: ``state_scope``).
    ingest_state_scope: str | None = None
    #: ``format="delta"``: a catalog table (``db.table`` or ``catalog.db.table``) resolved by the
    #: session's catalog, instead of ``output_path``; created at the first export if missing.
    table: str | None = None

    def __post_init__(self) -> None:
        from airflow_provider_pravega.client.ingest import check_state_scope

        check_state_scope(self.state_scope)
        check_state_scope(self.ingest_state_scope, "ingest_state_scope")
        check_target(self.format, self.output_path, self.table)
        if self.event_format not in EVENT_FORMATS:
            raise ValueError(f"event_format must be one of {', '.join(EVENT_FORMATS)}, got {self.event_format!r}")
        if self.on_truncated not in ON_TRUNCATED:
            raise ValueError(f"on_truncated must be 'fail' or 'head', got {self.on_truncated!r}")
        if self.format == "csv" and self.event_format == "binary":
            raise ValueError("CSV files cannot hold binary events: use format='parquet' or 'jsonl', or "
                             "event_format='text'")
        if isinstance(self.end_cut, str) and self.end_cut.strip().lower() == PREVIOUS:
            raise ValueError("end_cut cannot be 'previous' (only the start cut continues a previous export)")
        check_cut_option("start_cut", self.start_cut, self.scope, self.stream)
        check_cut_option("end_cut", self.end_cut, self.scope, self.stream)
        if self.num_partitions is not None and (isinstance(self.num_partitions, bool) or self.num_partitions < 1):
            raise ValueError(f"num_partitions must be at least 1, got {self.num_partitions!r}")
        if self.json_sample_events < 1:
            raise ValueError(f"json_sample_events must be at least 1, got {self.json_sample_events}")
        if self.format == "delta" and self.compression is not None:
            raise ValueError("compression does not apply to format='delta': the table's files follow the session's "
                             "spark.sql.parquet.compression.codec")
        if self.format == "delta" and self.interval_key is None:
            raise ValueError("format='delta' writes each interval as a partition of the table: it needs an "
                             "interval_key (the operator passes the run's data interval)")
        if self.compression is not None and self.compression not in COMPRESSION[self.format]:
            raise ValueError(f"compression for {self.format} must be one of {', '.join(COMPRESSION[self.format])}, "
                             f"got {self.compression!r}")
        if self.interval_key is not None and not str(self.interval_key).strip():
            raise ValueError("interval_key must be a non-empty text (or None)")
        if self.from_ingest is not None:
            if not str(self.from_ingest).strip():
                raise ValueError("from_ingest must be an ingest id (or None)")
            if self.interval_key is None:
                raise ValueError("from_ingest exports one interval of the ingest: it needs an interval_key (the "
                                 "operator passes the run's data interval)")
            if not self.continues_previous or not (isinstance(self.end_cut, str) and self.end_cut.strip() == TAIL):
                raise ValueError("from_ingest takes the cuts from the ingest's interval index: leave start_cut and "
                                 "end_cut at their defaults")

    @property
    def effective_export_id(self) -> str:
        return self.export_id or f"{self.scope}/{self.stream}"

    @property
    def continues_previous(self) -> bool:
        return isinstance(self.start_cut, str) and self.start_cut.strip().lower() == PREVIOUS

    @property
    def target(self) -> str:
        """Where the export writes: ``output_path``, or the ``table``'s name."""
        return self.output_path if self.output_path is not None else str(self.table)


def check_target(format: str, output_path: Any, table: Any) -> None:
    """ValueError naming what is wrong with the format and where it writes: an unknown format (and
    ``iceberg``, see :data:`ICEBERG_UNAVAILABLE`), not exactly one of ``output_path`` and
    ``table``, ``table`` with another format than ``delta``, or a malformed path or table name.
    The operator calls it with literal values when the DAG is parsed."""
    if format == "iceberg":
        raise ValueError(ICEBERG_UNAVAILABLE)
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if (output_path is None) == (table is None):
        raise ValueError(
            "give exactly one of output_path (a directory, or with format='delta' a Delta table's location) and table "
            f"(a catalog table name, format='delta' only); got {'both' if table is not None else 'neither'}"
            + (f": output_path={output_path!r}, table={table!r}" if table is not None else ""))
    if table is not None:
        if format != "delta":
            raise ValueError(f"table={table!r} is a catalog table, written only with format='delta' (got "
                             f"format={format!r}); for {format} files give output_path")
        if not isinstance(table, str) or not _TABLE_NAME.fullmatch(table.strip()):
            raise ValueError(f"table must be a qualified catalog table name, 'db.table' or 'catalog.db.table' (e.g. "
                             f"'lake.readings'), got {table!r}")
    elif not isinstance(output_path, str) or not output_path.strip().rstrip("/"):
        raise ValueError(f"output_path must be a directory path or URL, got {output_path!r}")


def check_cut_option(option: str, value: Any, scope: str | None = None, stream: str | None = None) -> None:
    """InvalidStreamCutError naming ``option`` (``start_cut``/``end_cut``) when ``value`` cannot be a
    cut of ``scope/stream``; only its form is checked while the stream is not known yet (the
    operator checks a literal when the DAG is parsed, before its scope comes from the connection)."""
    if option == "start_cut" and isinstance(value, str) and value.strip().lower() == PREVIOUS:
        return
    try:
        if scope and stream:
            StreamCut.coerce(value, scope, stream, unbounded=HEAD if option == "start_cut" else TAIL, what=option)
        elif isinstance(value, Mapping) or isinstance(value, str) and value.strip().startswith("{"):
            StreamCut.from_json(value)
        elif isinstance(value, str) and value.strip().lower() not in (HEAD, TAIL) and value.strip() != "UNBOUNDED":
            StreamCut.from_text(value.strip())
        elif not isinstance(value, (str, StreamCut)):
            raise InvalidStreamCutError(f"a {type(value).__name__} is not a stream cut")
    except StreamCutMismatchError as exc:
        raise StreamCutMismatchError(exc.expected, exc.actual, option) from None
    except InvalidStreamCutError as exc:
        shown = value if not isinstance(value, str) or len(value) <= 80 else value[:77] + "..."
        raise InvalidStreamCutError(
            f"{option}={shown!r} is not a usable stream cut: {exc}. Give "
            f"{repr(PREVIOUS) + ', ' if option == 'start_cut' else ''}'head', 'tail', a stream-cut text (e.g. an "
            f"ingest's tail_cut) or its JSON form"
        ) from None


@dataclass
class ExportResult:
    """The XCom of an export (``to_dict``)."""

    export_id: str
    scope: str
    stream: str
    interval: str | None
    start_cut: str
    end_cut: str
    output_path: str
    format: str
    event_format: str
    events: int = 0
    bytes: int = 0
    files: list[str] = field(default_factory=list)
    ranges: int = 0
    reused_record: bool = False
    replaced_output: bool = False
    #: ``from_ingest``: the ingest runs whose committed ranges were exported (None: an empty run).
    ingest_runs: list[str | None] = field(default_factory=list)
    seconds: float = 0.0
    #: ``format="delta"``: the table version holding the interval (None for files).
    table_version: int | None = None
    #: ``format="delta"``: the interval's write was a no-op (Delta had its transaction version already).
    already_written: bool = False
    #: ``table=`` exports: the catalog table's name (``output_path`` is then its location, as the
    #: catalog reports it, or the name when it reports none).
    table: str | None = None
    #: Seconds per phase: ``prepare`` (checks, cuts, plan, what is at the output path), ``write``
    #: (the Spark job and its commit), ``publish`` (listing what was written, recording it).
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["events_per_second"] = round(self.events_per_second, 1)
        return out


# ---------------------------------------------------------------------------------------------
# The export's record in a state synchronizer
# ---------------------------------------------------------------------------------------------


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
    """Where an export id keeps its state: a one-segment stream in ``spec.state_scope`` (default:
    the exported stream's scope; not ``_``-prefixed: Pravega reserves those names). In the stream's
    own scope the digest is of the export id (as it always was); in another scope it also covers
    the stream's scope and name, so exports of streams of several scopes sharing one state scope
    never collide."""
    state_scope = spec.state_scope or spec.scope
    key = spec.effective_export_id
    if state_scope != spec.scope:
        key = f"{spec.scope}/{spec.stream}\n{key}"
    return state_scope, f"export-state-{hashlib.sha1(key.encode()).hexdigest()[:20]}"


def open_export_state(client: Any, spec: ExportSpec) -> Any:
    """The export's recorded cuts (the stream, and its scope, created if missing)."""
    from airflow_provider_pravega.client.ingest import state_scope_access
    from airflow_provider_pravega.client.synchronizer import StateSynchronizer

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


def interval_order(key: str) -> tuple[Any, ...]:
    """Sort key of an interval: by its start (and end) instant when it reads as
    ``"<ISO start>/<ISO end>"``, else by its text (after every dated interval)."""
    start, _, end = key.partition("/")
    try:
        begin = datetime.fromisoformat(start.strip())
        finish = datetime.fromisoformat(end.strip()) if end.strip() else begin
        if begin.tzinfo is None:
            begin = begin.replace(tzinfo=UTC)
        if finish.tzinfo is None:
            finish = finish.replace(tzinfo=UTC)
        return (0, begin.timestamp(), finish.timestamp(), key)
    except ValueError:
        return (1, 0.0, 0.0, key)


class _Replan(Exception):
    """The state changed under a plan (another run recorded something): decide again."""


@dataclass(frozen=True)
class _Decision:
    start: StreamCut
    end: StreamCut
    ranges: list[SegmentRange]
    reused: bool
    record: dict[str, Any] | None  # the update that claims the cuts (None: nothing to record)
    basis: Any  # what the cuts were derived from; the record is written only if it still holds


def _cut_text(cut: StreamCut) -> str:
    return cut.to_text()


def _from_record(spec: ExportSpec, text: str, what: str) -> StreamCut:
    try:
        return StreamCut.from_text(text, scope=spec.scope, stream=spec.stream)
    except InvalidStreamCutError as exc:
        raise ExportError(f"the recorded {what} of export {spec.effective_export_id!r} is unusable: {exc}") from None


def _plan(client: Any, spec: ExportSpec, start: StreamCut, end: StreamCut) -> list[SegmentRange]:
    """plan_segment_ranges, asked again while a scale is half done (a segment with successors
    that is not sealed yet)."""
    on_truncated = "head" if spec.on_truncated == "head" else "error"
    for attempt in range(5):
        try:
            return plan_segment_ranges(client, start, end, on_truncated=on_truncated)
        except SegmentStoreError as exc:
            if "plan again" not in str(exc) or attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _decide(client: Any, spec: ExportSpec, state: ExportState, start_given: StreamCut | None,
            end_given: StreamCut) -> _Decision:
    """The cuts of this run from the current state (a recorded interval or pending claim is reused)."""
    now = datetime.now(UTC).isoformat()
    key = spec.interval_key
    if key is not None:
        record = state.intervals.get(key)
        if record is not None:
            start = _from_record(spec, record["start"], f"start cut of interval {key}")
            end = _from_record(spec, record["end"], f"end cut of interval {key}")
            _warn_given_cuts_unused(spec, key, ((start_given, start), (end_given, end)))
            try:
                ranges = _plan(client, spec, start, end)
            except TruncatedStreamCutError as exc:
                raise TruncatedStreamCutError(
                    spec.scope, spec.stream,
                    f"interval {key} was recorded as starting at {record['start']}, and the stream was truncated "
                    f"past it since; pass on_truncated='head' to export what is left of the interval",
                ) from exc
            return _Decision(start, end, ranges, True, None, None)
        order = interval_order(key)
        earlier = [k for k in state.intervals if interval_order(k) < order]
        later = [k for k in state.intervals if interval_order(k) > order]
        before = max(earlier, key=interval_order) if earlier else None
        after = min(later, key=interval_order) if later else None
        if start_given is not None:
            start = start_given.resolve(client)
        elif before is not None:
            start = _from_record(spec, state.intervals[before]["end"], f"end cut of interval {before}")
        else:
            start = StreamCut.head(client, spec.scope, spec.stream)
        if start_given is None and after is not None:
            # A backfill of a gap: end where the next recorded interval starts, so no event is
            # exported by two intervals.
            end = _from_record(spec, state.intervals[after]["start"], f"start cut of interval {after}")
            log.info("interval %s lies before the recorded interval %s: it ends where that one starts", key, after)
        else:
            end = end_given.resolve(client)
        ranges = _plan(client, spec, start, end)
        op = {"op": "interval", "key": key, "start": _cut_text(start), "end": _cut_text(end), "at": now}
        return _Decision(start, end, ranges, False, op, (before, after))

    if start_given is None:
        if state.pending is not None:
            start = _from_record(spec, state.pending["start"], "start cut of the unfinished previous export")
            end = _from_record(spec, state.pending["end"], "end cut of the unfinished previous export")
            log.info("the previous export of %s did not finish: exporting its cuts again", spec.effective_export_id)
            return _Decision(start, end, _plan(client, spec, start, end), True, None, None)
        if state.last is not None:
            start = _from_record(spec, state.last["end"], "end cut of the previous export")
        else:
            start = StreamCut.head(client, spec.scope, spec.stream)
        end = end_given.resolve(client)
        ranges = _plan(client, spec, start, end)
        op = {"op": "claim", "start": _cut_text(start), "end": _cut_text(end), "at": now}
        return _Decision(start, end, ranges, False, op, (state.last, state.pending))
    start, end = start_given.resolve(client), end_given.resolve(client)
    return _Decision(start, end, _plan(client, spec, start, end), False, None, None)


def _warn_given_cuts_unused(spec: ExportSpec, key: str,
                            given_and_recorded: tuple[tuple[StreamCut | None, StreamCut], ...]) -> None:
    """A rerun of a recorded interval exports its recorded cuts again, whatever cuts it is given
    (an interval's output is fixed once recorded: a retry or a cleared run writes the same events,
    while a refusal would fail every rerun given a cut that moves, such as a template of the
    latest ingest's tail): a concrete cut given that differs from the recorded one is named in a
    warning. 'head' and 'tail' move by nature and are not."""
    for name, (given, recorded) in zip(("start_cut", "end_cut"), given_and_recorded):
        if given is not None and given.bound is None and given != recorded:
            log.warning("export %s: interval %s was recorded with %s %s, which this rerun exports again; the %s "
                        "given, %s, is not used (to export another range, reset the interval with "
                        "reset_export_state or use another interval key)", spec.effective_export_id, key, name,
                        _cut_text(recorded), name, _cut_text(given))


def _basis(spec: ExportSpec, state: ExportState) -> Any:
    """What :func:`_decide` derived fresh cuts from, read from ``state`` (to detect a race)."""
    if spec.interval_key is not None:
        order = interval_order(spec.interval_key)
        earlier = [k for k in state.intervals if interval_order(k) < order]
        later = [k for k in state.intervals if interval_order(k) > order]
        return (max(earlier, key=interval_order) if earlier else None,
                min(later, key=interval_order) if later else None)
    return (state.last, state.pending)


def ingest_interval_cuts(client: Any, spec: ExportSpec) -> tuple[_Decision, list[str | None], list[tuple[str, str]]]:
    """``from_ingest``: the ranges the ingest's runs of ``spec.interval_key`` committed, from its
    interval index. Returns the decision (start of the first range, end of the last, the segment
    ranges of every piece in commit order), the runs and each piece's cut texts."""
    from airflow_provider_pravega.client.ingest import check_stream_origin, interval_pieces, open_state_store
    from airflow_provider_pravega.client.ingest import state_location as ingest_state_location

    key, ingest = spec.interval_key, spec.from_ingest
    where = f"ingest {ingest!r} into {spec.scope}/{spec.stream}"
    state_scope, state_stream = ingest_state_location(spec.scope, spec.stream, ingest,
                                                      spec.ingest_state_scope or spec.state_scope)
    if not client.admin.stream_exists(state_scope, state_stream):
        raise IntervalNotIngestedError(
            f"interval {key} was not ingested: {where} has no state in scope {state_scope} (no run of it ever "
            f"started; check the ingest id — the operator's default is '<dag_id>.<task_id>' — and the ingest's "
            f"state_scope, which the export's ingest_state_scope must name)")
    with open_state_store(client, state_scope, state_stream, create=False) as store:
        check_stream_origin(client, store, spec.scope, spec.stream, ingest, record=False)
        state = store.fetch()
    pieces = interval_pieces(state, key)
    if pieces is None:
        running = sorted(f"{rid} ({run['phase']})" for rid, run in state["runs"].items() if run.get("interval") == key)
        known = sorted(state.get("intervals") or {}, key=interval_order)
        if running:
            detail = (f"its run(s) {', '.join(running)} did not finish committing yet; wait for the ingest (e.g. its "
                      f"commit sensor) before exporting")
        elif state.get("intervals_forgotten_at") and known and interval_order(key) < interval_order(known[0]):
            detail = (f"it may have been forgotten: the index keeps the last intervals only (the oldest kept is "
                      f"{known[0]})")
        else:
            detail = (f"no run of this interval was recorded (yet); the ingest's recorded intervals: "
                      f"{len(known)}{', latest ' + known[-1] if known else ''}")
        raise IntervalNotIngestedError(f"interval {key} was not ingested by {where}: {detail}")
    if (state.get("intervals") or {})[key].get("overflow"):
        raise ExportError(f"interval {key} of {where} was ingested by more runs than its index keeps; export it with "
                          f"explicit cuts")
    ranges: list[SegmentRange] = []
    texts: list[tuple[str, str]] = []
    first = last = None
    for piece in pieces:
        if piece.get("end") is None:
            raise ExportError(f"the end of run {piece.get('run')}'s range of interval {key} ({where}) was not recorded")
        start = StreamCut(spec.scope, spec.stream, {int(k): v for k, v in piece["start"].items()})
        end = StreamCut(spec.scope, spec.stream, {int(k): v for k, v in piece["end"].items()})
        try:
            ranges += _plan(client, spec, start, end)
        except TruncatedStreamCutError as exc:
            raise TruncatedStreamCutError(
                spec.scope, spec.stream, f"the stream was truncated past the start of interval {key} ({where}); "
                f"pass on_truncated='head' to export what is left of it") from exc
        texts.append((_cut_text(start), _cut_text(end)))
        first = first or start
        last = end
    if first is None:  # recorded without any range (cannot happen: an empty run records an empty one)
        first = last = StreamCut.tail(client, spec.scope, spec.stream)
    return _Decision(first, last, ranges, True, None, None), [p.get("run") for p in pieces], texts


def fix_cuts(client: Any, sync: Any, spec: ExportSpec, start_given: StreamCut | None,
             end_given: StreamCut) -> _Decision:
    """Decide this run's cuts and record them (conditionally: a run that raced another one
    decides again from what the other recorded)."""
    for _ in range(50):
        state = sync.fetch()
        decision = _decide(client, spec, state, start_given, end_given)
        if decision.record is None:
            return decision
        op = decision.record

        def claim(current: ExportState, op: dict[str, Any] = op, basis: Any = decision.basis) -> Any:
            if spec.interval_key is not None and spec.interval_key in current.intervals:
                raise _Replan()
            if _basis(spec, current) != basis:
                raise _Replan()
            return op

        try:
            sync.update(claim)
        except _Replan:
            continue
        return decision
    raise ExportError(f"the state of export {spec.effective_export_id!r} kept changing while deciding the cuts")


# ---------------------------------------------------------------------------------------------
# The output directory (spark/export_output.py) and its claim in the export's state
# ---------------------------------------------------------------------------------------------


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


def _not_writable(spec: ExportSpec, reason: str) -> OutputPathError:
    return OutputPathError(f"output path {spec.output_path!r} is not writable ({reason})")


def _claim_output(sync: Any, spec: ExportSpec, start_text: str, end_text: str) -> None:
    """Record, before the write, that the output path holds this export's interval."""
    sync.update(lambda _state: {"op": "output", "path": output_key(spec.output_path), "key": spec.interval_key,
                                "start": start_text, "end": end_text, "at": _now()})


def _record_written(sync: Any, spec: ExportSpec, result: ExportResult,
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


# ---------------------------------------------------------------------------------------------
# Spark tasks
# ---------------------------------------------------------------------------------------------


#: Payload bytes per Spark partition (read task, output file) when ``num_partitions`` is not given:
#: Spark's own split size for files (``spark.sql.files.maxPartitionBytes``). Fewer, larger tasks cost
#: less CPU than one per segment range (measured: 4-9% less for 200 MB in 4 ranges on 2 cores, see
#: docs/benchmarks.md), and a small interval is one task, so one Python worker to start.
BYTES_PER_PARTITION = 128 * 1024 * 1024


def partitions_of(spec: ExportSpec, ranges: Sequence[SegmentRange]) -> int:
    """Spark partitions of an export: ``num_partitions``, else one per :data:`BYTES_PER_PARTITION`
    of the planned ranges (at most one per range: :func:`group_ranges`). Derived from the plan
    only, so a re-run of a recorded interval gets the same partitions, hence the same files."""
    if spec.num_partitions:
        return spec.num_partitions
    planned = sum(r.length or 0 for r in ranges)
    return max(1, -(-planned // BYTES_PER_PARTITION))


def group_ranges(ranges: Sequence[SegmentRange], partitions: int | None) -> list[list[int]]:
    """Indexes of ``ranges`` per Spark partition: one range each, or ``partitions`` runs of
    neighbouring ranges of about equal bytes (plan order is kept, so is the row order)."""
    if not ranges:
        return []
    if partitions is None or partitions >= len(ranges):
        return [[i] for i in range(len(ranges))]
    total = sum(r.length or 0 for r in ranges)
    groups: list[list[int]] = []
    current: list[int] = []
    done = 0
    for i, rng in enumerate(ranges):
        size = rng.length or 0
        left = len(ranges) - i  # ranges not placed yet, this one included
        to_open = partitions - len(groups) - 1  # groups still to start after the current one
        if current and to_open > 0:
            target = total * (len(groups) + 1) / partitions  # where the current group should end
            overshoot = done + size > target and abs(done + size - target) > abs(done - target)
            if left <= to_open or overshoot:
                groups.append(current)
                current = []
        current.append(i)
        done += size
    groups.append(current)
    return groups


def json_sample(config: Any, ranges: Sequence[SegmentRange], limit: int) -> list[str]:
    """Up to ``limit`` events spread over the ranges (the first ones of each, in plan order):
    deterministic for the same ranges, so a re-run infers the same schema."""
    sample: list[str] = []
    if not ranges:
        return sample
    per_range = max(1, -(-limit // len(ranges)))
    chunk = min(1 << 20, max(64 * 1024, per_range * 2048))
    for rng in ranges:
        for taken, event in enumerate(read_segment_range(config, rng, chunk=chunk), start=1):
            try:
                text = event.payload.decode("utf-8")
                value = json.loads(text)
            except (UnicodeDecodeError, ValueError) as exc:
                raise EventDecodeError(
                    f"the event at offset {event.offset} of segment {rng.segment_name} is not JSON ({exc}); export "
                    f"it with event_format='text' or 'binary'"
                ) from None
            if not isinstance(value, dict):
                raise EventDecodeError(
                    f"the event at offset {event.offset} of segment {rng.segment_name} is JSON but not an object "
                    f"({type(value).__name__}); event_format='json' makes one column per top-level field"
                )
            sample.append(text)
            if taken >= per_range or len(sample) >= limit:
                break
        if len(sample) >= limit:
            break
    return sample


def launch_order(ranges: Sequence[SegmentRange], groups: Sequence[Sequence[int]]) -> list[int]:
    """Group indexes, largest first: Spark starts tasks in partition order, so the longest reads
    start first and the last wave is short (Delta's writes, whose file names carry no order)."""
    size = [sum(ranges[i].length or 0 for i in group) for group in groups]
    return sorted(range(len(groups)), key=lambda g: (-size[g], g))


def build_frame(spark: Any, config: Any, spec: ExportSpec, ranges: Sequence[SegmentRange],
                groups: Sequence[Sequence[int]] | None = None, observation: Any = None) -> Any:
    """The rows to write: ``event`` (or the JSON fields), ``segment_id``, ``offset``; partition
    ``i`` holds the ranges ``groups[i]`` (default: :func:`group_ranges` of :func:`partitions_of`), each in
    offset order. Read by the ``pravega`` data source with the export's plan (``segment_ranges``)
    and only the columns it writes. ``observation`` (an ``Observation``) gets the ``events`` and
    payload ``bytes`` of the rows read."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, MapType, StructType, _parse_datatype_string

    if groups is None:
        groups = group_ranges(ranges, partitions_of(spec, ranges))
    groups = [list(g) for g in groups]
    datasource.register(spark)
    frame = (spark.read.format(datasource.FORMAT).options(**datasource.connection_options(config))
             .option("scope", spec.scope).option("stream", spec.stream)
             .option("segment_ranges", datasource.segment_ranges_option([[ranges[i] for i in g] for g in groups]))
             .option("decode", "binary" if spec.event_format == "binary" else "text")
             .option("columns", "event,segment_id,offset").load())
    if observation is not None:
        frame = frame.observe(observation, F.count(F.lit(1)).alias("events"),
                              F.coalesce(F.sum(F.octet_length("event")), F.lit(0)).alias("bytes"))
    if spec.event_format != "json":
        return frame  # already the output columns: no projection (each one copies every row)

    if spec.json_schema:
        from pyspark.errors import PySparkException

        try:
            schema = _parse_datatype_string(spec.json_schema)
        except (ValueError, PySparkException, Py4JError) as exc:
            raise ValueError(f"json_schema {spec.json_schema!r} is not a Spark DDL schema: {java_message(exc)}") from None
        if not isinstance(schema, StructType):
            raise ValueError(f"json_schema must describe an object's fields, got {spec.json_schema!r}")
    else:
        sample = json_sample(config, ranges, spec.json_sample_events)
        if sample:
            schema = spark.read.json(spark.createDataFrame([(s,) for s in sample], "value string")).schema
        else:
            schema = StructType([])
    names = [f.name for f in schema.fields]
    seg_col, off_col = "segment_id", "offset"
    if seg_col in names or off_col in names:
        seg_col, off_col = "_pravega_segment_id", "_pravega_offset"
        log.warning("the JSON events have a field named segment_id or offset: the event position columns are "
                    "named %s and %s", seg_col, off_col)
    parsed = frame.select(F.from_json("event", schema, {"mode": "FAILFAST"}).alias("j"), "segment_id", "offset")
    columns = []
    for f in schema.fields:
        col = F.col("j").getField(f.name)
        if spec.format == "csv" and isinstance(f.dataType, (StructType, ArrayType, MapType)):
            col = F.to_json(col)  # CSV has no nested values: keep them as JSON text
        columns.append(col.alias(f.name))
    return parsed.select(*columns, F.col("segment_id").alias(seg_col), F.col("offset").alias(off_col))


# ---------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------


class _Progress(threading.Thread):
    """Logs how many read tasks are done while Spark works."""

    def __init__(self, spark: Any, label: str, every_s: float = 10.0) -> None:
        super().__init__(name="pravega-export-progress", daemon=True)
        self.spark, self.label, self.every_s = spark, label, every_s
        self.stopped = threading.Event()

    def run(self) -> None:
        tracker = self.spark.sparkContext.statusTracker()
        while not self.stopped.wait(self.every_s):
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    log.info("%s: %d of %d tasks done (%d running)", self.label, info.numCompletedTasks,
                             info.numTasks, info.numActiveTasks)

    def stop(self) -> None:
        self.stopped.set()


def _worker_failure(spec: ExportSpec, exc: BaseException) -> ExportError | None:
    """A clear error for what a Spark task raised (py4j buries it in a stack trace)."""
    text = str(exc)
    for name in _WORKER_ERRORS:
        for line in text.splitlines():
            if f"{name}:" in line:
                message = line.split(f"{name}:", 1)[1].strip()
                if name == "PravegaDataSourceError" and "is not UTF-8 text" in message:
                    name, message = "EventDecodeError", message.replace(
                        datasource.NOT_UTF8_ADVICE, "export it with event_format='binary'")
                error_type = EventDecodeError if name == "EventDecodeError" else ExportError
                return error_type(f"exporting {spec.scope}/{spec.stream} failed in a Spark task: {name}: {message}")
    if "Malformed records are detected in record parsing" in text or "MALFORMED_RECORD_IN_PARSING" in text:
        return EventDecodeError(
            f"an event of {spec.scope}/{spec.stream} does not match the JSON schema (not JSON, or a field of "
            f"another type than in the sampled events); give json_schema, or export with event_format='text'"
        )
    return None


def config_of(client: Any) -> PravegaConnectionConfig:
    from airflow_provider_pravega.spark.ingest_job import config_of as ingest_config_of

    return ingest_config_of(client)


def _writes_without_spark(spec: ExportSpec, local_files: bool) -> bool:
    """Whether an export with nothing to read can be written without Spark: its output is a local
    path that Spark would write on this machine too (``local_files``: the session would run here),
    in a format whose empty output is known (not Delta, not JSON columns, Spark's default
    compression)."""
    return (local_files and spec.format != "delta" and spec.event_format != "json" and spec.compression is None
            and local_path(spec.output_path) is not None)


def _listed(spec: ExportSpec, spark: Any) -> list[str] | None:
    """What a reader finds at the output path: this machine's files when there is no session or
    the session's files are this machine's (:func:`session_local_path`), else through the session."""
    try:
        here = local_path(spec.output_path) if spark is None else session_local_path(spark, spec.output_path)
        if spark is None or here is not None:
            return local_visible_files(here or spec.output_path)
        return visible_files(spark, output_key(spec.output_path))
    except (UnusablePathError, OSError) as exc:  # an invalid URI, an unknown scheme, a missing connector
        raise OutputPathError(f"output path {spec.output_path!r} is not usable: {exc}") from None


def _write_files(spark: Any, client: Any, spec: ExportSpec, ranges: Sequence[SegmentRange], result: ExportResult,
                 planned_bytes: int, started: float) -> None:
    """The Spark job: every range read by the data source, written with Spark's commit protocol
    (``mode("overwrite")``) at the output path; the counts into ``result``."""
    # Counted by an observation of the rows (the data source's tasks have no accumulators).
    if type(spark).__module__.startswith("pyspark.sql.connect"):  # no SparkContext: no progress thread
        from pyspark.sql.connect.observation import Observation

        progress = None
    else:
        from pyspark.sql import Observation

        progress = _Progress(spark, f"export {result.export_id}")
    observation = Observation("pravega_export_counts")
    # Partitions in plan order: Spark names part file i after partition i, so reading the files in
    # name order gives the rows in plan order (not launched largest first, as Delta's writes are).
    groups = group_ranges(ranges, partitions_of(spec, ranges))
    frame = build_frame(spark, config_of(client), spec, ranges, groups, observation)
    writer = frame.write.mode("overwrite").format(_SPARK_FORMAT[spec.format])
    if spec.format == "csv":  # RFC 4180 quoting ("" inside quotes), readable by any CSV reader
        writer = writer.option("header", True).option("escape", '"')
    if spec.format == "parquet" and spec.event_format != "json":
        writer = writer.options(**PARQUET_OPTIONS)
    if spec.compression is not None:
        writer = writer.option("compression", spec.compression)
    if progress is not None:
        progress.start()
    else:
        log.info("export %s: writing %d partition(s) through Spark Connect", result.export_id, len(groups))
    written_at = time.monotonic()
    result.phases["prepare"] = round(written_at - started, 3)
    try:
        writer.save(output_key(spec.output_path))
    except Exception as exc:
        clear = _worker_failure(spec, exc)
        if clear is not None:
            raise clear from None
        problem = path_problem(exc)
        if problem is not None:
            raise _not_writable(spec, problem) from None
        raise
    finally:
        if progress is not None:
            progress.stop()
    result.phases["write"] = round(time.monotonic() - written_at, 3)
    counted = observation.get  # missing metrics: 0, and the check below counts the output
    result.events, result.bytes = int(counted.get("events") or 0), int(counted.get("bytes") or 0)
    if result.bytes + wire.EVENT_HEADER_LEN * result.events != planned_bytes:
        log.warning("the observed counts (%d events, %d bytes) do not add up to the %d bytes planned (a task ran "
                    "twice?); counting the output instead", result.events, result.bytes, planned_bytes)
        reader = spark.read.format(_SPARK_FORMAT[spec.format])
        if spec.format == "csv":
            reader = reader.option("header", True).option("multiLine", True).option("escape", '"')
        result.events = reader.load(output_key(spec.output_path)).count()
        result.bytes = planned_bytes - wire.EVENT_HEADER_LEN * result.events


def run_export(client: Any, spark: Any, spec: ExportSpec, *, local_files: bool = False) -> ExportResult:
    """Export ``spec.scope/spec.stream`` between the spec's cuts to ``spec.output_path``.

    ``spark`` is a SparkSession, or a function that starts one: an export with nothing to read into
    a local path (``local_files``: a session would run on this machine) then starts none."""
    started = time.monotonic()
    get_spark = started_on_first_use(spark)
    scope, stream = spec.scope, spec.stream
    if not client.admin.stream_exists(scope, stream):
        raise StreamNotFoundError(scope, stream)
    start_given = None if spec.continues_previous else StreamCut.coerce(
        spec.start_cut, scope, stream, unbounded=HEAD, what="start cut")
    end_given = StreamCut.coerce(spec.end_cut, scope, stream, unbounded=TAIL, what="end cut")
    export_id = spec.effective_export_id

    pieces: list[tuple[str, str]] | None = None
    with open_export_state(client, spec) as sync:
        if spec.from_ingest is None:
            if spec.interval_key is not None or spec.continues_previous:  # the recorded cuts are used
                check_export_origin(client, sync, spec)
            decision = fix_cuts(client, sync, spec, start_given, end_given)
        else:  # the ingest's index is the record: a re-run after a later range was added may replace
            decision, ingest_runs, pieces = ingest_interval_cuts(client, spec)
        start_text, end_text = _cut_text(decision.start), _cut_text(decision.end)
        planned_bytes = sum(r.length or 0 for r in decision.ranges)
        log.info("export %s%s of %s/%s: %d segment range(s), %d bytes, from %s to %s%s", export_id,
                 f" interval {spec.interval_key}" if spec.interval_key else "", scope, stream, len(decision.ranges),
                 planned_bytes, start_text, end_text, " (recorded cuts)" if decision.reused else "")
        result = ExportResult(
            export_id=export_id, scope=scope, stream=stream, interval=spec.interval_key, start_cut=start_text,
            end_cut=end_text, output_path=spec.target, format=spec.format, event_format=spec.event_format,
            ranges=len(decision.ranges), reused_record=decision.reused, table=spec.table,
        )
        if pieces is not None:
            result.ingest_runs = ingest_runs
        if spec.format == "delta":  # a Delta table always has an interval (ExportSpec): its cuts are recorded
            _export_to_delta(client, get_spark(), spec, decision, pieces, result, started, planned_bytes)
            _maybe_compact(sync)
            return result
        without_spark = not decision.ranges and _writes_without_spark(spec, local_files)
        session = None if without_spark else get_spark()
        result.replaced_output = check_output(spec, sync.fetch(), _listed(spec, session), start_text, end_text,
                                              lambda: earlier_release_claim(spec, session))
        _claim_output(sync, spec, start_text, end_text)
        if without_spark:
            result.phases["prepare"] = round(time.monotonic() - started, 3)
            try:
                names = write_empty_locally(local_path(spec.output_path) or "", spec.format, spec.event_format)
            except OSError as exc:
                raise _not_writable(spec, f"{exc.strerror or exc}: {exc.filename or spec.output_path}") from None
            result.phases["write"] = 0.0
            log.info("export %s: nothing to read; wrote the empty output without Spark", export_id)
        else:
            _write_files(session, client, spec, decision.ranges, result, planned_bytes, started)
            names = [uri.rsplit("/", 1)[-1] for uri in _listed(spec, session) or []]
        published_at = time.monotonic()
        result.files = [f"{output_key(spec.output_path)}/{name}" for name in names]
        _record_written(sync, spec, result, pieces)
        if spec.interval_key is None:  # where the next "previous" starts (intervals have their records)
            sync.update(lambda _state: {"op": "done", "start": start_text, "end": end_text})
        _maybe_compact(sync)

    result.seconds = time.monotonic() - started
    result.phases["publish"] = round(time.monotonic() - published_at, 3)
    log.info("export %s: %d events (%d bytes) to %d file(s) at %s in %.1f s (%.0f events/s; prepare %.2f s, "
             "write %.2f s, record %.2f s)", export_id, result.events, result.bytes, len(names), spec.output_path,
             result.seconds, result.events_per_second, result.phases["prepare"], result.phases["write"],
             result.phases["publish"])
    return result


def _export_to_delta(client: Any, spark: Any, spec: ExportSpec, decision: Any,
                     pieces: list[tuple[str, str]] | None, result: ExportResult, started: float,
                     planned_bytes: int) -> None:
    """The interval as a partition of the Delta table at ``output_path`` or the catalog's ``table``
    (spark/delta_export.py)."""
    from airflow_provider_pravega.spark import delta_export

    groups = group_ranges(decision.ranges, partitions_of(spec, decision.ranges))
    order = launch_order(decision.ranges, groups)
    frame = build_frame(spark, config_of(client), spec, decision.ranges, [groups[g] for g in order])
    written_at = time.monotonic()
    result.phases["prepare"] = round(written_at - started, 3)
    try:
        write = delta_export.write_interval(
            spark, frame, path=spec.output_path, table=spec.table, export_id=result.export_id, scope=spec.scope,
            stream=spec.stream,
            interval=spec.interval_key, start_cut=result.start_cut, end_cut=result.end_cut, pieces=pieces,
            check_location=lambda: check_delta_location(spec, _listed(spec, spark)))
    except ExportError:
        raise
    except Exception as exc:
        clear = _worker_failure(spec, exc)
        if clear is not None:
            raise clear from None
        problem = path_problem(exc) if spec.output_path is not None else None
        if problem is not None:
            raise _not_writable(spec, problem) from None
        raise
    result.phases["write"] = round(time.monotonic() - written_at, 3)
    result.events = write.events
    result.bytes = planned_bytes - wire.EVENT_HEADER_LEN * write.events if not write.skipped else 0
    result.table_version, result.already_written = write.version, write.skipped
    result.output_path = write.location or spec.target
    result.files = [result.output_path]
    result.seconds = time.monotonic() - started
    log.info("export %s: interval %s of %s/%s %s Delta table %s (version %s) in %.1f s", result.export_id,
             spec.interval_key, spec.scope, spec.stream,
             "was already in" if write.skipped else f"wrote {write.events} events to",
             spec.target + (f" at {write.location}" if spec.table and write.location else ""), write.version,
             result.seconds)


def _maybe_compact(sync: Any, limit: int = 1 << 20) -> None:
    """Keep the state stream short: fold its history into one record once it passes ``limit`` bytes."""
    try:
        revision = sync.revision
        if revision is not None and revision - sync.head_offset() > limit:
            sync.compact()
    except PravegaError as exc:  # housekeeping only
        log.warning("could not compact the export state: %s", exc)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m airflow_provider_pravega.spark.export_job",
                                 description="Export a Pravega stream between two stream cuts to files with PySpark.")
    add_connection_arguments(ap)
    ap.add_argument("--scope", required=True)
    ap.add_argument("--stream", required=True)
    target = ap.add_mutually_exclusive_group(required=True)
    target.add_argument("--output-path", help="the output directory, or with --format delta the table's location")
    target.add_argument("--table", help="with --format delta: a catalog table (db.table), instead of --output-path")
    ap.add_argument("--start-cut", default=PREVIOUS, help="previous (default), head, tail or a stream-cut text")
    ap.add_argument("--end-cut", default=TAIL, help="tail (default), head or a stream-cut text")
    ap.add_argument("--format", default="parquet", choices=(*FORMATS, "iceberg"))  # iceberg: said why not
    ap.add_argument("--event-format", default="text", choices=EVENT_FORMATS)
    ap.add_argument("--export-id")
    ap.add_argument("--interval", help="interval key, e.g. 2026-11-20T00:00:00+00:00/2026-11-21T00:00:00+00:00")
    ap.add_argument("--from-ingest", help="export what this ingest id committed for --interval (its interval index)")
    ap.add_argument("--state-scope", help="the scope keeping this export's recorded cuts, created if missing "
                                          "(default: the stream's scope)")
    ap.add_argument("--ingest-state-scope", help="with --from-ingest: the scope keeping the ingest's state "
                                                 "(default: --state-scope)")
    ap.add_argument("--on-truncated", default="fail", choices=ON_TRUNCATED)
    ap.add_argument("--num-partitions", type=int)
    ap.add_argument("--json-schema")
    ap.add_argument("--compression", help="codec of the files (default: Spark's, snappy for parquet)")
    add_submission_argument(ap)
    add_spark_arguments(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from airflow_provider_pravega.spark.session import get_spark_session, starts_local_session

    try:
        spec = ExportSpec(
            scope=args.scope, stream=args.stream, output_path=args.output_path, start_cut=args.start_cut,
            end_cut=args.end_cut, format=args.format, event_format=args.event_format, export_id=args.export_id,
            interval_key=args.interval, on_truncated=args.on_truncated, num_partitions=args.num_partitions,
            json_schema=args.json_schema, compression=args.compression, from_ingest=args.from_ingest,
            state_scope=args.state_scope, ingest_state_scope=args.ingest_state_scope, table=args.table,
        )
        settings = spark_settings(args)
    except ValueError as exc:
        print(f"export failed: {exc}", file=sys.stderr)
        return 2

    if spec.format == "delta":
        from airflow_provider_pravega.spark.delta_export import session_conf

        settings = session_conf(settings)

    def job(client: Any) -> ExportResult:
        return run_export(client, lambda: get_spark_session(None, "pravega-export", **settings), spec,
                          local_files=starts_local_session(None, **settings))

    return run_job_command("export", args, job, (PravegaError, ValueError), state_location=lambda: state_location(spec))


def job_arguments(spec: ExportSpec) -> list[str]:
    """The command-line arguments of :func:`main` that run ``spec`` (the connection's and Spark's
    options apart): what an operator hands a Spark application it submits."""
    argv = ["--scope", spec.scope, "--stream", spec.stream,
            *(["--table", spec.table] if spec.table else ["--output-path", spec.output_path]), "--format", spec.format, "--event-format", spec.event_format, "--export-id", spec.effective_export_id,
            "--on-truncated", spec.on_truncated]
    for option, cut in (("--start-cut", spec.start_cut), ("--end-cut", spec.end_cut)):
        if cut is not None:
            argv += [option, cut.to_text() if isinstance(cut, StreamCut) else
                     json.dumps(cut) if isinstance(cut, dict) else str(cut)]
    for option, value in (("--interval", spec.interval_key), ("--from-ingest", spec.from_ingest),
                          ("--state-scope", spec.state_scope), ("--ingest-state-scope", spec.ingest_state_scope),
                          ("--num-partitions", spec.num_partitions), ("--json-schema", spec.json_schema),
                          ("--compression", spec.compression)):
        if value is not None:
            argv += [option, str(value)]
    return argv


if __name__ == "__main__":
    # Also run as a file (spark-submit ships this one to the cluster): the package's module does the
    # work, so that every class exists once (an error raised deep in the package is one `main` knows).
    from airflow_provider_pravega.spark import export_job

    sys.exit(export_job.main())
