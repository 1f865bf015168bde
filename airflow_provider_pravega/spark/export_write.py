"""An export's Spark job: the planned ranges written as files with Spark's own commit protocol
(``mode("overwrite")`` at the output path), or as an interval of a Delta table
(:mod:`~airflow_provider_pravega.spark.delta_export`); the counts of what was written, and a
clear error for what a Spark task raised."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from airflow_provider_pravega.client.batch import SegmentRange
from airflow_provider_pravega.protocol import wire
from airflow_provider_pravega.spark import datasource, delta_export
from airflow_provider_pravega.spark.export_claims import check_delta_location, not_writable
from airflow_provider_pravega.spark.export_frame import build_frame
from airflow_provider_pravega.spark.export_output import (
    UnusablePathError,
    local_path,
    local_visible_files,
    output_key,
    path_problem,
    session_local_path,
    visible_files,
)
from airflow_provider_pravega.spark.export_plan import group_ranges, launch_order, partitions_of
from airflow_provider_pravega.spark.export_spec import (
    EventDecodeError,
    ExportError,
    ExportResult,
    ExportSpec,
    OutputPathError,
)

log = logging.getLogger(__name__)

_SPARK_FORMAT = {"parquet": "parquet", "jsonl": "json", "csv": "csv"}
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
_WORKER_ERRORS = (
    "PravegaDataSourceError",
    "SegmentRangeTruncatedError",
    "NoSuchSegmentError",
    "SegmentStoreUnreachableError",
    "ControllerUnreachableError",
    "SegmentStoreError",
)


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


def writes_without_spark(spec: ExportSpec, local_files: bool) -> bool:
    """Whether an export with nothing to read can be written without Spark: its output is a local
    path that Spark would write on this machine too (``local_files``: the session would run here),
    in a format whose empty output is known (not Delta, not JSON columns, Spark's default
    compression)."""
    return (local_files and spec.format != "delta" and spec.event_format != "json" and spec.compression is None
            and local_path(spec.output_path) is not None)


def listed_output(spec: ExportSpec, spark: Any) -> list[str] | None:
    """What a reader finds at the output path: this machine's files when there is no session or
    the session's files are this machine's (:func:`session_local_path`), else through the session."""
    try:
        here = local_path(spec.output_path) if spark is None else session_local_path(spark, spec.output_path)
        if spark is None or here is not None:
            return local_visible_files(here or spec.output_path)
        return visible_files(spark, output_key(spec.output_path))
    except (UnusablePathError, OSError) as exc:  # an invalid URI, an unknown scheme, a missing connector
        raise OutputPathError(f"output path {spec.output_path!r} is not usable: {exc}") from None


def write_files(spark: Any, client: Any, spec: ExportSpec, ranges: Sequence[SegmentRange], result: ExportResult,
                 planned_bytes: int, started: float) -> None:
    """The Spark job: every range read by the data source, written with Spark's commit protocol
    (``mode("overwrite")``) at the output path; the counts into ``result``."""
    # Counted by an observation of the rows (the data source's tasks have no accumulators). The
    # Observation class is the session's kind's, imported here: Spark Connect's client modules load
    # only for a Connect session.
    if type(spark).__module__.startswith("pyspark.sql.connect"):  # no SparkContext: no progress thread
        # import cost: Spark Connect's client (about 1 s, pandas and pyarrow) only for a Connect session
        from pyspark.sql.connect.observation import Observation

        progress = None
    else:
        # classic: the Connect session's own Observation otherwise (see above)
        from pyspark.sql import Observation

        progress = _Progress(spark, f"export {result.export_id}")
    observation = Observation("pravega_export_counts")
    # Partitions in plan order: Spark names part file i after partition i, so reading the files in
    # name order gives the rows in plan order (not launched largest first, as Delta's writes are).
    groups = group_ranges(ranges, partitions_of(spec, ranges))
    frame = build_frame(spark, client.connection_config, spec, ranges, groups, observation)
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
            raise not_writable(spec, problem) from None
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


def export_to_delta(client: Any, spark: Any, spec: ExportSpec, decision: Any,
                     pieces: list[tuple[str, str]] | None, result: ExportResult, started: float,
                     planned_bytes: int) -> None:
    """The interval as a partition of the Delta table at ``output_path`` or the catalog's ``table``
    (spark/delta_export.py)."""
    groups = group_ranges(decision.ranges, partitions_of(spec, decision.ranges))
    order = launch_order(decision.ranges, groups)
    frame = build_frame(spark, client.connection_config, spec, decision.ranges, [groups[g] for g in order])
    written_at = time.monotonic()
    result.phases["prepare"] = round(written_at - started, 3)
    try:
        write = delta_export.write_interval(
            spark, frame, path=spec.output_path, table=spec.table, export_id=result.export_id, scope=spec.scope,
            stream=spec.stream,
            interval=spec.interval_key, start_cut=result.start_cut, end_cut=result.end_cut, pieces=pieces,
            check_location=lambda: check_delta_location(spec, listed_output(spec, spark)))
    except ExportError:
        raise
    except Exception as exc:
        clear = _worker_failure(spec, exc)
        if clear is not None:
            raise clear from None
        problem = path_problem(exc) if spec.output_path is not None else None
        if problem is not None:
            raise not_writable(spec, problem) from None
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
