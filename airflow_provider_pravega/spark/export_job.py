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

Its parts: what it is asked (:mod:`~airflow_provider_pravega.spark.export_spec`), its record in a
state synchronizer (:mod:`~airflow_provider_pravega.spark.export_state`), its cuts, ranges and
partitions (:mod:`~airflow_provider_pravega.spark.export_plan`), whether it may write at its output
path (:mod:`~airflow_provider_pravega.spark.export_claims`), the rows it writes
(:mod:`~airflow_provider_pravega.spark.export_frame`) and the Spark write
(:mod:`~airflow_provider_pravega.spark.export_write`); this module runs them in order.

Run it without Airflow as ``python -m airflow_provider_pravega.spark.export_job --help``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

from airflow_provider_pravega.client.errors import PravegaError, StreamNotFoundError
from airflow_provider_pravega.client.streamcut import HEAD, TAIL, StreamCut
from airflow_provider_pravega.spark.connection_args import (
    add_connection_arguments,
    add_spark_arguments,
    add_submission_argument,
    run_job_command,
    spark_settings,
)
from airflow_provider_pravega.spark.delta_export import session_conf
from airflow_provider_pravega.spark.export_claims import (
    check_output,
    claim_output,
    earlier_release_claim,
    not_writable,
    record_written,
)
from airflow_provider_pravega.spark.export_output import local_path, output_key, write_empty_locally
from airflow_provider_pravega.spark.export_plan import cut_text, fix_cuts, ingest_interval_cuts
from airflow_provider_pravega.spark.export_spec import (
    COMPRESSION,
    EVENT_FORMATS,
    FORMATS,
    ON_TRUNCATED,
    PREVIOUS,
    EventDecodeError,
    ExportError,
    ExportResult,
    ExportSpec,
    IntervalNotIngestedError,
    OutputPathError,
    check_target,
)
from airflow_provider_pravega.spark.export_state import (
    ExportState,
    check_export_origin,
    open_export_state,
    reset_export_state,
    state_location,
)
from airflow_provider_pravega.spark.export_write import (
    export_to_delta,
    listed_output,
    write_files,
    writes_without_spark,
)
from airflow_provider_pravega.spark.session import get_spark_session, started_on_first_use, starts_local_session

log = logging.getLogger(__name__)

#: What users import from here (the job's entry points, and the spec, result, errors and state
#: functions they take or raise, defined in the modules named above).
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
    "job_arguments",
    "main",
    "reset_export_state",
    "run_export",
    "state_location",
]


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
        start_text, end_text = cut_text(decision.start), cut_text(decision.end)
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
            export_to_delta(client, get_spark(), spec, decision, pieces, result, started, planned_bytes)
            _maybe_compact(sync)
            return result
        without_spark = not decision.ranges and writes_without_spark(spec, local_files)
        session = None if without_spark else get_spark()
        result.replaced_output = check_output(spec, sync.fetch(), listed_output(spec, session), start_text, end_text,
                                              lambda: earlier_release_claim(spec, session))
        claim_output(sync, spec, start_text, end_text)
        if without_spark:
            result.phases["prepare"] = round(time.monotonic() - started, 3)
            try:
                names = write_empty_locally(local_path(spec.output_path) or "", spec.format, spec.event_format)
            except OSError as exc:
                raise not_writable(spec, f"{exc.strerror or exc}: {exc.filename or spec.output_path}") from None
            result.phases["write"] = 0.0
            log.info("export %s: nothing to read; wrote the empty output without Spark", export_id)
        else:
            write_files(session, client, spec, decision.ranges, result, planned_bytes, started)
            names = [uri.rsplit("/", 1)[-1] for uri in listed_output(spec, session) or []]
        published_at = time.monotonic()
        result.files = [f"{output_key(spec.output_path)}/{name}" for name in names]
        record_written(sync, spec, result, pieces)
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
