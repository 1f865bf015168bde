"""Exactly-once ingestion of files into a Pravega stream with PySpark.

The driver runs the protocol of :mod:`airflow_provider_pravega.client.ingest`; Spark does the
heavy lifting:

* line files (jsonl, text) are read as exact byte ranges (``ingest_pieces.measure_pieces`` fixes
  each file's piece before the run starts, ``ingest_frames.line_frame`` reads exactly it), so a
  file that grows while it is read, or between runs, has every line ingested once; Spark's own readers parse CSV (with a
  header) and Parquet. Every record carries its file and position, so the source order is known;
* with a routing key, records are shuffled by key and sorted by source position inside each
  partition, so *all* events of one key are written by one task in file order (readers then see
  each key's events in source order);
* each partition is written by one task into its own transaction (``mapInArrow``: records reach
  Python as Arrow batches), flushed (pre-committed) before the task succeeds, and the driver commits
  all of them at once after the commit record.

This module is the job itself: the driver's run, a later try's resumption and the command line;
its parts each have a module of their own (``ingest_spec``, ``ingest_sources``, ``ingest_pieces``,
``ingest_frames``, ``ingest_partitions``, ``ingest_task``). Run it without Airflow as
``python -m airflow_provider_pravega.spark.ingest_job --help``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from airflow_provider_pravega import fault_points
from airflow_provider_pravega._clock import now_ms
from airflow_provider_pravega.client.errors import PravegaError, ScopeNotFoundError, StreamNotFoundError
from airflow_provider_pravega.client.ingest import IngestCoordinator, WriteResult, check_timing
from airflow_provider_pravega.client.ingest_errors import ChangedFileError, IngestError
from airflow_provider_pravega.client.ingest_location import check_write_access, open_ingest_state, open_state_store
from airflow_provider_pravega.client.ingest_plan import FilePlan, file_identity, known_files, needs_fingerprint
from airflow_provider_pravega.client.ingest_location import state_location as _state_location
from airflow_provider_pravega.client.ingest_resume import (
    RESUMABLE,
    is_identity,
    resume_run,
    resume_status,
    run_identity,
)
from airflow_provider_pravega.client.streamcut import StreamCut
from airflow_provider_pravega.spark.connection_args import (
    add_connection_arguments,
    add_spark_arguments,
    add_submission_argument,
    run_job_command,
    spark_settings,
)
from airflow_provider_pravega.spark.ingest_frames import (
    bad_record_error,
    file_frame,
    files_read_here,
    first_bad_record,
    record_frame,
)
from airflow_provider_pravega.spark.ingest_partitions import (
    read_bytes,
    whole_file_holds,
    write_groups,
    write_job_settings,
    writers_of,
    written_in_process,
)
from airflow_provider_pravega.spark.ingest_pieces import fingerprint_files, line_requests
from airflow_provider_pravega.spark.ingest_sources import (
    EMPTY_FILE,
    file_gone,
    file_gone_where_read,
    list_sources,
    precheck_sources,
)
from airflow_provider_pravega.spark.ingest_spec import (
    FORMATS,
    IN_PROCESS_MAX_BYTES_VARIABLE,
    LINE_FORMATS,
    MODES,
    IngestResult,
    IngestSpec,
    SourceError,
    in_process_limit,
    source_items,
)
from airflow_provider_pravega.spark.ingest_task import (
    RESULT_SCHEMA,
    TaskContext,
    make_line_writer,
    make_writer,
    write_in_process,
)
from airflow_provider_pravega.spark.session import get_spark_session, started_on_first_use

log = logging.getLogger(__name__)


def state_location(spec: IngestSpec) -> tuple[str, str]:
    """The state of ``spec``'s ingest (client/ingest_location.py's ``state_location``): the
    location a job module gives the job command and submit.py, as export_job's does."""
    return _state_location(spec.scope, spec.stream, spec.effective_ingest_id, spec.state_scope)


def run_ingest(client: Any, spark: Any, spec: IngestSpec,
               on_run: Callable[[dict[str, str]], None] | None = None) -> IngestResult:
    """Ingest ``spec.source`` into ``spec.scope/spec.stream`` exactly once (or at least once).

    ``spark`` is a SparkSession or a function returning one, called only once there is work (an
    empty interval of local files, a missing path or stream never starts a session). The protocol
    is :meth:`IngestCoordinator.run`'s; this supplies the files and the write stage. ``on_run``
    gets the identity of each run as soon as it is recorded, before anything is written (what
    :func:`resume_ingest` takes)."""
    started = time.monotonic()
    lease_ms = client.transactions.default_lease_ms
    check_timing(spec.stale_after_s, lease_ms)  # before anything is written
    in_process_max_bytes = in_process_limit(spec)
    # Everything checkable without Spark comes first; the session starts only when there is work.
    get_spark = started_on_first_use(spark)
    precheck = precheck_sources(spec.source)
    if precheck.empty:
        result = _nothing_to_ingest(spec, precheck.skipped)
        _record_empty_interval(client, spec)
        return result
    admin = client.admin
    if spec.create_stream:  # also finishes a creation a lost controller or segment store interrupted
        admin.ensure_stream(spec.scope, spec.stream, spec.stream_segments, create_scope=True)
    elif not admin.stream_exists(spec.scope, spec.stream):
        raise StreamNotFoundError(spec.scope, spec.stream)
    check_write_access(client, spec.scope, spec.stream)
    state_scope, state_stream = state_location(spec)
    store = open_ingest_state(client, spec.scope, spec.stream, spec.effective_ingest_id,
                              stale_after_s=spec.stale_after_s, state_scope=spec.state_scope)
    coord = _coordinator(client, store, spec)
    if precheck.files is not None:  # local files listed as Spark would: no JVM unless there is work
        listed = list(precheck.files)
        listed_at_ms = precheck.listed_at_ms
        log.info("source %r: %d file(s), listed without Spark", spec.source, len(listed))
    else:
        listed = list_sources(get_spark(), spec.source)
        listed_at_ms = now_ms()
    fault_points.reached("after_listing")
    if not listed:
        result = _nothing_to_ingest(spec, precheck.skipped)
        if spec.interval_key is not None and spec.mode == "exactly_once":
            coord.record_empty_interval(spec.interval_key)
        return result
    files = [f.key for f in listed]
    identities = {f.key: file_identity(f.size, f.mtime_ms) for f in listed}
    early: tuple[list[str], list[str]] = ([], [])
    if spec.format in LINE_FORMATS:
        # Earlier runs are finished or rolled back first, so pieces are asked against what is committed.
        early = coord.recover()
        identities.update(line_requests(store, listed, identities, listed_at_ms))
    else:
        unsure = needs_fingerprint(store.fetch(), identities, store)
        if unsure:  # recorded with a content fingerprint only (older states): compare contents
            log.info("fingerprinting %d file(s) in Spark tasks", len(unsure))
            for key, fp in fingerprint_files(get_spark(), unsure).items():
                identities[key]["fp"] = fp
    nothing_new: set[str] = set()  # line files their task found no new whole line in

    def write(run_id: str, plan: FilePlan) -> WriteResult:
        log.info("run %s: ingesting %d file(s) (%d already ingested)", run_id, len(plan.to_ingest),
                 len(plan.skipped))
        if on_run is not None and spec.mode == "exactly_once":
            on_run(run_identity(scope=spec.scope, stream=spec.stream, ingest_id=spec.effective_ingest_id,
                                state_scope=state_scope, state_stream=state_stream, run_id=run_id, owner=coord.owner))
        ctx = TaskContext(client.connection_config, spec, run_id, state_scope, state_stream, lease_ms, coord.owner)
        listed_here = precheck.files is not None
        if spec.format in LINE_FORMATS and written_in_process(plan.to_ingest, in_process_max_bytes, listed_here):
            log.info("run %s: %d bytes of local files to read: written by this process, without Spark "
                     "(in_process_max_bytes=%d)", run_id, read_bytes(plan.to_ingest), in_process_max_bytes)
            rows = write_in_process(ctx, client, plan.to_ingest, write_groups(plan.to_ingest, spec.num_writers or 1))
        else:
            spark = get_spark()
            writers = writers_of(spark, spec, plan.to_ingest)
            with write_job_settings(spark, listed_here=listed_here):
                if spec.format in LINE_FORMATS:
                    frame = file_frame(spark, plan.to_ingest, spec, writers, files_read_here(plan.to_ingest, listed_here))
                    task = make_line_writer(ctx, plan.to_ingest)
                else:
                    frame, task = record_frame(spark, plan.to_ingest, spec, writers), make_writer(ctx)
                rows = frame.mapInArrow(task, RESULT_SCHEMA).collect()
        failed = sorted((r for r in rows if r["error"]), key=lambda r: r["bad_file"] or "")
        if failed:
            raise _task_error(get_spark, failed[0], spec, store, plan)
        holds = whole_file_holds({r["txn"]: r["files"] or () for r in rows if r["txn"]})
        missing = sorted(set(plan.to_ingest) - {f for held in holds.values() for f in held})
        if missing:  # binaryFile leaves out a file deleted since it was listed
            raise file_gone(missing[0])
        nothing_new.update(f for r in rows for f in r["empty"] or ())
        # Committed in path order of their files: with a routing key, a key's events keep source order.
        txns = sorted(holds, key=lambda t: (holds[t][:1], t))
        return WriteResult(txns, sum(r["events"] for r in rows), sum(r["bytes"] for r in rows), holds)

    outcome = coord.run(identities, write, allow_changed_files=spec.allow_changed_files,
                        wait_for_commit=spec.wait_for_commit, transactional=spec.mode == "exactly_once",
                        interval=spec.interval_key)
    ingested = set(outcome.plan.to_ingest) - set(outcome.returned) - nothing_new
    for _again in range(RETURNED_RUNS):
        if not outcome.returned:
            break
        # Transactions of this run were aborted after its commit point (leases lapsed while the
        # driver stalled): their files were taken back out of the run; write them again now.
        log.warning("run %s: writing again the %d file(s) of its lapsed transactions", outcome.run_id,
                    len(outcome.returned))
        earlier = outcome
        outcome = coord.run(identities, write, allow_changed_files=spec.allow_changed_files,
                            wait_for_commit=spec.wait_for_commit, transactional=True, interval=spec.interval_key)
        outcome.recovered = earlier.recovered + outcome.recovered
        outcome.finished = earlier.finished + outcome.finished
        outcome.events += earlier.events
        outcome.bytes += earlier.bytes
        ingested |= set(outcome.plan.to_ingest) - set(outcome.returned) - nothing_new
    if outcome.returned:
        raise IngestError(f"the transactions of {len(outcome.returned)} file(s) lapsed after the commit point "
                          f"{RETURNED_RUNS + 1} times in a row ({', '.join(outcome.returned[:3])}...): the driver "
                          f"stalls longer than the transaction lease; they stay uncommitted, the next run writes them")
    result = IngestResult(
        run_id=outcome.run_id, files_skipped=sorted(set(outcome.plan.skipped) | nothing_new), recovered_runs=early[0] + outcome.recovered,
        finished_runs=early[1] + outcome.finished, state_scope=state_scope, state_stream=state_stream,
        events=outcome.events, bytes=outcome.bytes,
        transactions=[{"id": t, "status": outcome.status} for t in outcome.txns],
    )
    if outcome.run_id is None:
        log.info("all %d file(s) were already ingested: nothing to do", len(files))
        result.tail_cut = _tail_text(client, spec)
        result.seconds = time.monotonic() - started
        return result
    result.files_ingested = sorted(ingested)
    committed = spec.wait_for_commit or spec.mode != "exactly_once"
    result.tail_cut = _tail_text(client, spec) if committed else None
    result.seconds = time.monotonic() - started
    log.info("run %s: %d events (%d bytes) from %d file(s) in %.1f s (%.0f events/s)", outcome.run_id,
             result.events, result.bytes, len(result.files_ingested), result.seconds, result.events_per_second)
    return result


def _task_error(get_spark: Callable[[], Any], row: Any, spec: IngestSpec, store: Any, plan: FilePlan) -> IngestError:
    """The error a failed write task reported: a local file it did not find, a changed file (its
    committed bytes are not those committed) or the first bad record of a file; nothing of the run
    was committed."""
    key = row["bad_file"]
    if row["error"] == "gone":
        return file_gone_where_read(key, row["reason"])
    if row["error"] == "changed":
        before = known_files(store, store.fetch(), [key])[key]
        listed = plan.to_ingest[key]
        return ChangedFileError(key, before, {"size": listed["size"], "mtime": listed.get("mtime"),
                                              "changed": row["reason"]})
    if spec.format in LINE_FORMATS:
        return bad_record_error(key, spec, row["line"], row["reason"])
    return first_bad_record(get_spark(), key, spec)


RETURNED_RUNS = 3  # runs again at once for files whose transactions lapsed after the commit point


def _coordinator(client: Any, store: Any, spec: IngestSpec) -> IngestCoordinator:
    return IngestCoordinator(
        store, client.transactions, spec.scope, spec.stream, stale_after_s=spec.stale_after_s,
        lease_ms=client.transactions.default_lease_ms, task_instance=spec.task_instance, try_number=spec.try_number,
        unknown_commits=spec.unknown_commits, remember_files_for_s=spec.remember_files_for_s,
        lease_keeper=client.lease_keeper, crash_hook=fault_points.reached, tail_positions=lambda: _tail_positions(client, spec),
    )


def resume_status_of(client: Any, spec: IngestSpec, identity: Any) -> str:
    """What a later try of ``spec``'s task can do with the run ``identity`` names (an earlier try's,
    from ``on_run``): :data:`~airflow_provider_pravega.client.ingest_resume.RESUMABLE` or why not
    (see :mod:`airflow_provider_pravega.client.ingest_resume`). No Spark."""
    if not is_identity(identity) or spec.mode != "exactly_once":
        return "MOVED"
    try:
        store = open_state_store(client, identity["state_scope"], identity["state_stream"], create=False)
    except (ScopeNotFoundError, StreamNotFoundError):
        return "GONE"
    with store:
        return resume_status(store.fetch(), identity, scope=spec.scope, stream=spec.stream,
                             ingest_id=spec.effective_ingest_id)


def resume_ingest(client: Any, spec: IngestSpec, identity: Any) -> IngestResult | None:
    """Finish the earlier try's run ``identity`` names without Spark: take it over (fencing that
    try, should it still run) and commit what its write tasks recorded. None when that run cannot
    be resumed, or some of its files must be written again (transactions whose lease lapsed): run
    :func:`run_ingest` then (it finishes or rolls back the run at once, and writes what is left)."""
    started = time.monotonic()
    if resume_status_of(client, spec, identity) not in RESUMABLE:
        return None
    with open_state_store(client, identity["state_scope"], identity["state_stream"], create=False) as store:
        resumed = resume_run(_coordinator(client, store, spec), identity, wait_for_commit=spec.wait_for_commit)
    if resumed is None:
        return None
    if resumed.returned:
        log.warning("resumed run %s: the transactions of %d file(s) lapsed; running the ingest to write them",
                    resumed.run_id, len(resumed.returned))
        return None
    state_scope, state_stream = identity["state_scope"], identity["state_stream"]
    result = IngestResult(
        run_id=resumed.run_id, files_ingested=resumed.files, events=resumed.events, bytes=resumed.bytes,
        transactions=[{"id": t, "status": resumed.status} for t in resumed.txns], state_scope=state_scope,
        state_stream=state_stream, resumed=True,
    )
    result.tail_cut = _tail_text(client, spec) if resumed.status == "COMMITTED" else None
    result.seconds = time.monotonic() - started
    log.info("resumed run %s: %d events (%d bytes) from %d file(s) committed in %.1f s", resumed.run_id,
             result.events, result.bytes, len(result.files_ingested), result.seconds)
    return result


def _nothing_to_ingest(spec: IngestSpec, skipped: Sequence[tuple[str, str]] = ()) -> IngestResult:
    """``skipped``: (path, reason) of the matching files that hold nothing to read."""
    what = "matches no file"
    if skipped:
        empty = all(why == EMPTY_FILE for _, why in skipped)
        shown = [path if empty else f"{path}: {why}" for path, why in skipped[:5]]
        shown += [f"and {len(skipped) - 5} more"] if len(skipped) > 5 else []
        what = (f"matches {len(skipped)} file(s), {'all empty' if empty else 'none readable'}: "
                f"{(', ' if empty else '; ').join(shown)}")
    if spec.on_empty == "succeed":
        log.info("source %r %s: nothing to ingest", spec.source, what)
        return IngestResult(run_id=None)
    raise SourceError(f"source {spec.source!r} {what} (pass on_empty='succeed' to accept that)")


def _tail_positions(client: Any, spec: IngestSpec) -> dict[str, int]:
    """The target stream's tail as the interval index keeps it (segment id text -> offset)."""
    return {str(k): v for k, v in StreamCut.tail(client, spec.scope, spec.stream).positions.items()}


def _record_empty_interval(client: Any, spec: IngestSpec) -> None:
    """An interval whose source holds no file: recorded as an empty range in the interval index
    (so its export is empty, not an error), when the stream and the ingest's state exist."""
    if spec.interval_key is None or spec.mode != "exactly_once" or not client.admin.stream_exists(spec.scope, spec.stream):
        return
    store = open_ingest_state(client, spec.scope, spec.stream, spec.effective_ingest_id,
                              stale_after_s=spec.stale_after_s, state_scope=spec.state_scope)
    try:
        coord = IngestCoordinator(store, client.transactions, spec.scope, spec.stream, stale_after_s=spec.stale_after_s,
                                  lease_ms=client.transactions.default_lease_ms,
                                  tail_positions=lambda: _tail_positions(client, spec))
        coord.record_empty_interval(spec.interval_key)
    finally:
        store.close()


def _tail_text(client: Any, spec: IngestSpec) -> str | None:
    try:
        return StreamCut.tail(client, spec.scope, spec.stream).to_text()
    except PravegaError as exc:  # informative only
        log.warning("could not read the tail cut of %s/%s: %s", spec.scope, spec.stream, exc)
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m airflow_provider_pravega.spark.ingest_job",
                                 description="Ingest files into a Pravega stream exactly once with PySpark.")
    add_connection_arguments(ap, lease=True)
    ap.add_argument("--scope", required=True)
    ap.add_argument("--stream", required=True)
    ap.add_argument("--source", required=True, action="append",
                    help="path, directory or glob, plain or a Hadoop filesystem URI (repeatable)")
    ap.add_argument("--format", default="jsonl", choices=FORMATS)
    ap.add_argument("--routing-key-field")
    ap.add_argument("--payload-field")
    ap.add_argument("--ingest-id")
    ap.add_argument("--mode", default="exactly_once", choices=MODES)
    ap.add_argument("--create-stream", action="store_true")
    ap.add_argument("--segments", type=int, default=1)
    ap.add_argument("--num-writers", type=int,
                    help="transactions (Spark tasks) per run; default: Spark's parallelism, at most one per "
                         "16 MiB planned")
    ap.add_argument("--in-process-max-bytes", type=int, default=None,
                    help="local line files of a run reading at most this many bytes are written by this process, "
                         f"without Spark (0: always Spark; default: ${IN_PROCESS_MAX_BYTES_VARIABLE}, else 16 MiB)")
    ap.add_argument("--stale-after", type=float, default=60.0)
    ap.add_argument("--unknown-commits", choices=("committed", "not_committed"), default=None,
                    help="how to resolve a crashed run whose transactions the controller forgot (see docs/ingest.md)")
    ap.add_argument("--remember-files-for", type=float, default=None,
                    help="seconds after which committed files are forgotten (default: never)")
    ap.add_argument("--interval", help="record the run's committed range under this interval key (see the export's "
                                       "--interval-of), e.g. 2026-11-20T00:00:00+00:00/2026-11-21T00:00:00+00:00")
    ap.add_argument("--state-scope", help="the scope keeping the ingest's state, created if missing (default: the "
                                          "stream's scope)")
    ap.add_argument("--on-empty", choices=("fail", "succeed"), default="fail",
                    help="what a source that matches no file does (default: fail)")
    ap.add_argument("--allow-changed-files", action="store_true",
                    help="re-ingest a file whose content changed since it was ingested")
    ap.add_argument("--no-wait-for-commit", dest="wait_for_commit", action="store_false",
                    help="return once the commits are requested (PravegaTransactionSensor waits for them)")
    ap.add_argument("--task-instance", help=argparse.SUPPRESS)  # what the operator passes: fast takeover
    ap.add_argument("--try-number", type=int, help=argparse.SUPPRESS)
    add_submission_argument(ap)
    add_spark_arguments(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        spec = IngestSpec(
            scope=args.scope, stream=args.stream, source=args.source, format=args.format,
            routing_key_field=args.routing_key_field, payload_field=args.payload_field, ingest_id=args.ingest_id,
            mode=args.mode, create_stream=args.create_stream, stream_segments=args.segments,
            num_writers=args.num_writers, stale_after_s=args.stale_after, unknown_commits=args.unknown_commits,
            task_instance=args.task_instance, try_number=args.try_number,
            remember_files_for_s=args.remember_files_for, interval_key=args.interval, on_empty=args.on_empty,
            state_scope=args.state_scope, allow_changed_files=args.allow_changed_files,
            wait_for_commit=args.wait_for_commit, in_process_max_bytes=args.in_process_max_bytes,
        )
        settings = spark_settings(args)
    except ValueError as exc:
        print(f"ingest failed: {exc}", file=sys.stderr)
        return 2

    def spark() -> Any:  # started only when there is something to ingest
        return get_spark_session(None, "pravega-ingest", share_session=True, **settings)

    return run_job_command("ingest", args, lambda client: run_ingest(client, spark, spec), (IngestError, PravegaError),
                           state_location=lambda: state_location(spec))


def job_arguments(spec: IngestSpec) -> list[str]:
    """The command-line arguments of :func:`main` that run ``spec`` (the connection's and Spark's
    options apart): what an operator hands a Spark application it submits."""
    argv = ["--scope", spec.scope, "--stream", spec.stream]
    for item in source_items(spec.source):
        argv += ["--source", str(item)]
    argv += ["--format", spec.format, "--ingest-id", spec.effective_ingest_id, "--mode", spec.mode,
             "--segments", str(spec.stream_segments), "--stale-after", repr(spec.stale_after_s),
             "--on-empty", spec.on_empty]
    for option, value in (("--routing-key-field", spec.routing_key_field), ("--payload-field", spec.payload_field),
                          ("--num-writers", spec.num_writers), ("--unknown-commits", spec.unknown_commits),
                          ("--in-process-max-bytes", spec.in_process_max_bytes),
                          ("--remember-files-for", spec.remember_files_for_s), ("--interval", spec.interval_key),
                          ("--state-scope", spec.state_scope), ("--task-instance", spec.task_instance),
                          ("--try-number", spec.try_number)):
        if value is not None:
            argv += [option, str(value)]
    if spec.create_stream:
        argv.append("--create-stream")
    if spec.allow_changed_files:
        argv.append("--allow-changed-files")
    if not spec.wait_for_commit:
        argv.append("--no-wait-for-commit")
    return argv


if __name__ == "__main__":
    # Also run as a file (spark-submit ships this one to the cluster): the package's module does the
    # work, so that every class exists once (an error raised deep in the package is one `main` knows).
    from airflow_provider_pravega.spark import ingest_job

    sys.exit(ingest_job.main())
