"""The ingest's inputs as Spark DataFrames: the bytes of line files, one partition per write task
(their lines are split, checked and written by that task: spark/line_events.py), and the records of
CSV and Parquet files with their definition of a bad record and the explanation of the first one."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from airflow_provider_pravega.spark.ingest_partitions import one_task_per_group, read_bytes, write_groups
from airflow_provider_pravega.spark.ingest_sources import (
    file_contents,
    file_gone,
    is_local_key,
    key_of,
    local_bytes,
    uri_of,
)
from airflow_provider_pravega.spark.ingest_spec import BadRecordError, IngestSpec
from airflow_provider_pravega.spark.ingest_task import file_rows


#: Line files listed in the task's own process (local files) holding at most this many bytes in
#: all are read there, and their bytes travel to Spark inside the query (a local relation): no
#: Spark job lists or reads the files, and a Spark Connect server elsewhere needs no access to the
#: task's disk. Larger ones are read by the write tasks (:func:`file_frame`), never on the driver.
LOCAL_LINES_MAX_BYTES = 16 * 1024 * 1024


def files_read_here(requests: Mapping[str, Mapping[str, Any]], listed_here: bool) -> bool:
    """Whether :func:`file_frame` reads these line files in this process: they were listed here
    (local files) and little is read (:data:`LOCAL_LINES_MAX_BYTES`)."""
    return listed_here and read_bytes(requests) <= LOCAL_LINES_MAX_BYTES


def file_frame(spark: Any, requests: Mapping[str, Mapping[str, Any]], spec: IngestSpec, writers: int,
               here: bool = False) -> Any:
    """(path, content) of each line file to write, one partition per write task: whole files,
    consecutive in path order, about equal bytes per task (:func:`write_groups`), in path order
    within a task when a routing key orders events (a key's events keep source order). Each group
    is its own one-partition relation, so no shuffle moves the bytes. Who reads them:

    - this process, with ``here`` (:func:`files_read_here`): the bytes go to Spark in the query;
    - the write task itself, for other local files: the rows name them (``content`` is NULL) and
      the task opens them where it runs, as Spark's own reader would, so no JVM copies the bytes
      on their way to Python;
    - Spark tasks (``binaryFile``: files up to 2 GiB each) on every other filesystem.

    Each file up to its listed size: what lies beyond is left for a later run."""
    groups = write_groups(requests, writers)
    if here:
        parts = []
        for keys in groups:
            contents = []
            for key in keys:
                content = local_bytes(key, upto=int(requests[key]["size"]))
                if content is None:
                    raise file_gone(key)
                contents.append(content)
            parts.append(_file_relation(spark, keys, contents))
    elif all(map(is_local_key, requests)):
        parts = [_file_relation(spark, keys, [None] * len(keys)) for keys in groups]
    else:
        parts = [file_contents(spark, keys) for keys in groups]
    keyed = spec.routing_key_field and any(len(keys) > 1 for keys in groups)
    return one_task_per_group(parts, ("path",) if keyed else ())


def _file_relation(spark: Any, keys: Sequence[str], contents: Sequence[bytes | None]) -> Any:
    """One write group's rows as a relation in the query."""
    return spark.createDataFrame(file_rows(keys, contents))


EVENT_LIMIT = 8 * 1024 * 1024  # Pravega's event size limit (protocol.wire.MAX_EVENT_SIZE)


def _record_columns(df: Any, spec: IngestSpec, header: Sequence[str] | None = None) -> tuple[Any, Any, Any]:
    """(payload as binary, routing key, reason-if-bad) columns of a CSV or Parquet file's rows; the
    reason is NULL for a good record. The same expressions check records in the write path and find
    the failing record afterwards. (Line files are split and checked by their write task:
    :mod:`airflow_provider_pravega.spark.line_events`.)"""
    key_field, payload_field = spec.routing_key_field, spec.payload_field
    none = F.lit(None).cast("string")
    checks: list[tuple[Any, Any]] = []  # (condition, reason) in order: the first that holds is the reason
    if spec.format == "csv":
        fields = [F.col(f"`{c}`") for c in header or ()]
        checks.append((F.col("_corrupt").isNotNull(), F.lit("the number of fields differs from the header")))
        payload = F.col(f"`{payload_field}`") if payload_field else F.to_json(F.struct(*fields))
        key = F.col(f"`{key_field}`") if key_field else none
    else:  # parquet
        payload = F.col(f"`{payload_field}`").cast("string") if payload_field else F.to_json(
            F.struct(*[F.col(f"`{c}`") for c in df.columns]))
        key = F.col(f"`{key_field}`").cast("string") if key_field else none
    payload = payload.cast("binary")
    too_big = (F.length(payload) > EVENT_LIMIT, F.concat(
        F.lit("an event of "), F.length(payload).cast("string"),
        F.lit(f" bytes is over Pravega's {EVENT_LIMIT}-byte (8 MiB) event limit")))
    if key_field:
        checks.append((key.isNull(), F.lit(f"no value for routing key field {key_field!r}")))
    if payload_field:
        checks.append((payload.isNull(), F.lit(f"no payload field {payload_field!r}")))
    checks.append(too_big)
    reason = F.when(F.lit(False), none)
    for condition, why in checks:
        reason = reason.when(condition, why)
    return payload, key, reason


def _read(spark: Any, uris: Sequence[str], spec: IngestSpec, header: Sequence[str] | None) -> Any:
    if spec.format == "csv":
        schema = StructType([StructField(c, StringType()) for c in header or ()]
                            + [StructField("_corrupt", StringType())])
        return (spark.read.option("header", True).option("mode", "PERMISSIVE")
                .option("columnNameOfCorruptRecord", "_corrupt").schema(schema).csv(list(uris)))
    return spark.read.parquet(*uris)


def record_frame(spark: Any, files: Mapping[str, Mapping[str, Any]], spec: IngestSpec, writers: int) -> Any:
    """A DataFrame of (f, b, m, payload, k, bad) of CSV or Parquet files, one partition per write
    task (:func:`write_groups`: whole files, consecutive in path order), in source order within
    each task with a routing key: ``bad`` marks a record no mode may write (malformed, no routing
    key, over the event limit). ``files``: the plan's files."""
    groups = write_groups(files, writers)
    header = _csv_header(spark, uri_of(groups[0][0])) if spec.format == "csv" else None
    parts = []
    for keys in groups:  # one read per write task's files: a file is never split between tasks
        df = _read(spark, [uri_of(k) for k in keys], spec, header)
        if not parts:  # a field no record can have: said before any write
            columns = list(header) if header is not None else df.columns
            for what, name in (("routing_key_field", spec.routing_key_field), ("payload_field", spec.payload_field)):
                if name and name not in columns:
                    raise BadRecordError(f"{what} {name!r} is not a column of {keys[0]} (columns: "
                                         f"{', '.join(columns)}). Nothing of this run was committed.")
        payload, key, reason = _record_columns(df, spec, header)
        parts.append(df.select(
            F.input_file_name().alias("f"), F.input_file_block_start().alias("b"),
            F.monotonically_increasing_id().alias("m"),
            payload.alias("payload"), key.alias("k"), reason.isNotNull().alias("bad"),
        ))
    return one_task_per_group(parts, ("f", "b", "m") if spec.routing_key_field else ())


def bad_record_error(key: str, spec: IngestSpec, line: int, reason: str) -> BadRecordError:
    """The error of a run stopped by a bad record: its file, its line (record, for Parquet) number
    in the whole file when known, and what is wrong with it."""
    where = f"{key}, {'record' if spec.format == 'parquet' else 'line'} {line}" if line else key
    return BadRecordError(f"{where}: {reason}. Nothing of this run was committed; fix the file and re-run.")


def first_bad_record(spark: Any, file_uri: str, spec: IngestSpec) -> BadRecordError:
    """The error naming the first bad record of a CSV or Parquet file (found again by Spark)."""
    key = key_of(file_uri)
    return bad_record_error(key, spec, *first_bad_line(spark, key, spec))


def _csv_header(spark: Any, uri: str) -> list[str]:
    """The header of a CSV file, read through Spark (any filesystem): only its first line."""
    first = spark.read.text(uri).limit(1).collect()
    if not first:
        raise BadRecordError(f"{key_of(uri)}: empty CSV file (no header line)")
    return next(csv.reader([first[0]["value"]]))


def first_bad_line(spark: Any, key: str, spec: IngestSpec) -> tuple[int, str]:
    """(1-based line number — record number for Parquet —, reason) of the first bad record of a CSV
    or Parquet file; only on errors. Read through Spark, so it works on every filesystem: each line
    carries its split's start offset and an id rising within the split, so its number is the count
    of lines in earlier splits plus its position in its own split."""
    uri = uri_of(key)
    pos = [F.input_file_block_start().alias("b"), F.monotonically_increasing_id().alias("m")]
    header = None
    if spec.format == "parquet":
        raw = spark.read.parquet(uri)
        payload, _key, reason = _record_columns(raw, spec)
        lines = rows = raw.select("*", *pos)
        good_line = F.lit(True)
        text = F.lit(None).cast("string")
    else:
        lines = rows = spark.read.text(uri).select("value", *pos)
        good_line = F.length(F.trim("value")) > 0
        text = F.when(F.length("value") <= 65536, F.col("value"))
        if spec.format == "csv":
            header = _csv_header(spark, uri)
            ddl = ", ".join(f"`{c}` string" for c in header) + ", _corrupt string"
            parsed = F.from_csv("value", ddl, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt"})
            rows = lines.withColumn("r", parsed).select(
                "value", "b", "m", *[F.col("r")[c].alias(c) for c in header], F.col("r")["_corrupt"].alias("_corrupt"))
            first = lines.orderBy("b", "m").select("b", "m").limit(1).collect()[0]  # line 1: the header
            good_line = good_line & ~((F.col("b") == first["b"]) & (F.col("m") == first["m"]))
        payload, _key, reason = _record_columns(rows, spec, header)
    found = (rows.withColumn("why", reason).where(good_line & F.col("why").isNotNull())
             .select("b", "m", "why", text.alias("text")).orderBy("b", "m").limit(1).collect())
    if not found:
        return 0, "bad record"
    bad = found[0]
    splits = lines.where(F.col("b") <= bad["b"]).groupBy("b").agg(F.count("*").alias("n"), F.min("m").alias("m0"))
    before, start = 0, bad["m"]
    for split in splits.collect():  # one row per split before the bad one: a few numbers
        if split["b"] < bad["b"]:
            before += split["n"]
        else:
            start = split["m0"]
    return before + (bad["m"] - start) + 1, _explain(bad["why"], bad["text"], spec, header)


def _explain(why: str, text: str | None, spec: IngestSpec, header: Sequence[str] | None) -> str:
    """The reason of a bad record in full (the CSV field count; a jsonl line's reason is whole)."""
    if spec.format == "csv" and why.startswith("the number of fields") and text is not None:
        n = len(next(csv.reader([text])))
        why = f"{n} fields where the header has {len(header or ())}"
    return why
