"""The ingest's records as Spark DataFrames: the lines of each line file's piece, the records of
every format with the one definition of a bad record, and the explanation of the first bad one."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from airflow_provider_pravega.spark.ingest_sources import file_contents, file_gone, key_of, local_bytes, uri_of
from airflow_provider_pravega.spark.ingest_spec import LINE_FORMATS, BadRecordError, IngestSpec, SourceError
from airflow_provider_pravega.spark.json_lines import json_line_problem
from airflow_provider_pravega.spark.worker_heap import prepare_worker_heap


#: Line files listed in the task's own process (local files) whose pieces end within this many bytes
#: in all (what is read: each file up to its piece's end, for the fingerprint) are also read there,
#: and their lines travel to Spark inside the query (a local relation): no Spark job reads the files
#: (one Python worker stage less per small run), and a Spark Connect server elsewhere needs no
#: access to the task's disk. Larger ones are read in Spark tasks (``binaryFile``), never on the driver.
LOCAL_LINES_MAX_BYTES = 16 * 1024 * 1024


def lines_read_here(pieces: Mapping[str, Mapping[str, Any]], listed_here: bool) -> bool:
    """Whether :func:`line_frame` reads these pieces in this process: their files were listed here
    (local files) and little is read (:data:`LOCAL_LINES_MAX_BYTES`)."""
    return listed_here and sum(int(p["end"]) for p in pieces.values()) <= LOCAL_LINES_MAX_BYTES


def _line_columns(labelled: bool) -> str:
    """The columns of a piece's lines (see piece_lines): file, line number, line, why the line is
    not a JSON object (jsonl only; NULL when it is one)[, write task]."""
    return "f string, b long, value binary, j string" + (", w long" if labelled else "")


def _line_schema(labelled: bool) -> Any:
    from airflow_provider_pravega.spark.arrow_columns import schema_of

    return schema_of(_line_columns(labelled))


def piece_lines(path: str, content: bytes, piece: tuple[int, int, int, str | None], label: int | None,
                check_json: bool = False) -> Iterator[Any]:
    """Arrow batches (f, b, value, j[, w]) of the lines of one file's piece ``(start, end, line, fp)``
    in ``content``: the one rule both ways of :func:`line_frame` apply. The bytes before ``end``
    must still have the planned fingerprint ``fp``, else :class:`SourceError`. With ``check_json``
    each line is checked as a JSON object here, where it is split (see spark/json_lines.py)."""
    import hashlib

    import numpy as np
    import pyarrow as pa

    from airflow_provider_pravega.spark.arrow_columns import array, int64_array, repeated

    start, end, line, fp = piece
    if fp is not None and hashlib.blake2b(memoryview(content)[:end], digest_size=20).hexdigest() != fp:
        raise SourceError(f"{key_of(path)} changed while the ingest read it (its first {end} bytes are "
                          f"not those planned, or it is shorter): nothing of this run is committed; "
                          f"run the ingest again")
    lines = content[start:end].split(b"\n")
    if content[end - 1:end] == b"\n" or end == start:
        lines.pop()  # after the last line end: nothing
    lines = [x[:-1] if x.endswith(b"\r") else x for x in lines]
    schema = _line_schema(label is not None)
    for i in range(0, len(lines), 10_000):
        chunk = lines[i:i + 10_000]
        problems = [json_line_problem(x) for x in chunk] if check_json else None
        columns = [repeated(path, pa.string(), len(chunk)), int64_array(np.arange(line + i, line + i + len(chunk))),
                   array(chunk, pa.binary()),
                   pa.array(problems, pa.string()) if problems is not None else pa.nulls(len(chunk), pa.string())]
        if label is not None:
            columns.append(repeated(label, pa.int64(), len(chunk)))
        yield pa.RecordBatch.from_arrays(columns, schema=schema)


def line_frame(spark: Any, pieces: Mapping[str, Mapping[str, Any]], labels: Mapping[str, int] | None = None,
               here: bool = False, check_json: bool = False) -> Any:
    """(f, b, value, j) of the lines of each file's piece ``[start, end)`` and nothing else, whatever
    the file holds by the time it is read: ``b`` is the line's number in the whole file (piece
    ``line`` onwards), ``value`` its bytes without the line end (LF, or CR LF). The bytes before
    ``end`` must still have the planned fingerprint ``fp``: a file rewritten between the measuring and
    the reading fails the run, uncommitted. One Spark task holds a whole file (``binaryFile``: files
    up to 2 GiB; a few hundred MB is the normal case); with ``here`` (small local files, see
    :func:`lines_read_here`) this process reads them and the lines go to Spark in the query. With
    ``labels`` (file key -> its write task's label, see :func:`writer_labels`) each line also
    carries its file's label as ``w``. ``j``: why a line is not a JSON object, with ``check_json``
    (see :func:`piece_lines`)."""
    from pyspark.sql import functions as F

    ranges = {k: (int(p["start"]), int(p["end"]), int(p["line"]), p.get("fp")) for k, p in pieces.items()}
    labels = dict(labels) if labels is not None else None

    def label_of(path: str) -> int | None:
        return None if labels is None else labels[key_of(path)]

    if here:
        import pyarrow as pa

        batches = []
        for key in sorted(ranges):
            content = local_bytes(key, upto=ranges[key][1])  # no further than the piece's end
            if content is None:
                raise file_gone(key)
            path = "file:" + key  # as binaryFile names a local file
            batches.extend(piece_lines(path, content, ranges[key], label_of(path), check_json))
        frame = spark.createDataFrame(pa.Table.from_batches(batches, schema=_line_schema(labels is not None)))
    else:
        def split(batches: Iterator[Any]) -> Iterator[Any]:
            prepare_worker_heap()
            for batch in batches:
                for path, content in zip(batch.column("path").to_pylist(), batch.column("content").to_pylist()):
                    yield from piece_lines(path, content, ranges[key_of(path)], label_of(path), check_json)

        frame = file_contents(spark, pieces).mapInArrow(split, _line_columns(labels is not None))
    return frame.select("f", "b", F.col("value").cast("string").alias("value"), "j",
                        *(["w"] if labels is not None else []))


EVENT_LIMIT = 8 * 1024 * 1024  # Pravega's event size limit (protocol.wire.MAX_EVENT_SIZE)


def _record_columns(df: Any, spec: IngestSpec, header: Sequence[str] | None = None) -> tuple[Any, Any, Any]:
    """(payload as binary, routing key, reason-if-bad) columns of one format's raw rows; the reason
    is NULL for a good record. The same expressions check records in the write path and find the
    failing line afterwards. A jsonl line's own check comes with it (``j``, see :func:`line_frame`):
    Spark's JSON functions only pick fields out of lines that passed it."""
    from pyspark.sql import functions as F

    key_field, payload_field = spec.routing_key_field, spec.payload_field
    none = F.lit(None).cast("string")
    checks: list[tuple[Any, Any]] = []  # (condition, reason) in order: the first that holds is the reason
    if spec.format in LINE_FORMATS:
        value = F.col("value")
        payload, key = value, none
        if spec.format == "jsonl":
            checks.append((F.col("j").isNotNull(), F.col("j")))
            payload = F.get_json_object(value, f"$.{payload_field}") if payload_field else value
            key = F.get_json_object(value, f"$.{key_field}") if key_field else none
    elif spec.format == "csv":
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
        what = "routing key field" if spec.format == "jsonl" else "value for routing key field"
        checks.append((key.isNull(), F.lit(f"no {what} {key_field!r}")))
    if payload_field:
        checks.append((payload.isNull(), F.lit(f"no payload field {payload_field!r}")))
    # A line that is the event whole: its size is the first thing wrong with it (not what a parser
    # with length limits of its own makes of it).
    if spec.format in LINE_FORMATS and not payload_field:
        checks.insert(0, too_big)
    else:
        checks.append(too_big)
    reason = F.when(F.lit(False), none)
    for condition, why in checks:
        reason = reason.when(condition, why)
    return payload, key, reason


def _read(spark: Any, uris: Sequence[str], spec: IngestSpec, header: Sequence[str] | None) -> Any:
    if spec.format == "csv":
        from pyspark.sql.types import StringType, StructField, StructType

        schema = StructType([StructField(c, StringType()) for c in header or ()]
                            + [StructField("_corrupt", StringType())])
        return (spark.read.option("header", True).option("mode", "PERMISSIVE")
                .option("columnNameOfCorruptRecord", "_corrupt").schema(schema).csv(list(uris)))
    return spark.read.parquet(*uris)


def record_frame(spark: Any, files: Mapping[str, Mapping[str, Any]], spec: IngestSpec,
                 labels: Mapping[str, int] | None = None, here: bool = False) -> Any:
    """A DataFrame of (f, b, m, payload, k, bad) in source order, not yet partitioned:
    ``bad`` marks a record no mode may write (malformed, no routing key, over the event limit).
    ``files``: the plan's files (key -> identity; a line file's identity is its piece). With
    ``labels`` (see :func:`writer_labels`) a column ``w``: the record's write task. ``here``: line
    files read in this process (:func:`lines_read_here`)."""
    from pyspark.sql import functions as F

    if spec.format in LINE_FORMATS:
        lines = line_frame(spark, files, labels, here, spec.format == "jsonl").filter(F.length(F.trim("value")) > 0)
        payload, key, reason = _record_columns(lines, spec)
        return lines.select("f", "b", F.lit(0).cast("long").alias("m"), payload.alias("payload"), key.alias("k"),
                            reason.isNotNull().alias("bad"), *(["w"] if labels is not None else []))
    files = sorted(files)
    uris = [uri_of(f) for f in files]
    header = _csv_header(spark, uris[0]) if spec.format == "csv" else None
    if labels is not None:  # one read per write task's files, each labelled: a file is never split between tasks
        by_label: dict[int, list[str]] = {}
        for f in files:
            by_label.setdefault(labels[f], []).append(uri_of(f))
        parts = [_read(spark, group, spec, header).withColumn("w", F.lit(label).cast("long"))
                 for label, group in sorted(by_label.items())]
        df = parts[0]
        for part in parts[1:]:
            df = df.unionByName(part)
    else:
        df = _read(spark, uris, spec, header)
    if spec.format in ("csv", "parquet"):  # a field no record can have: say so before any write
        columns = list(header) if header is not None else df.columns
        for what, name in (("routing_key_field", spec.routing_key_field), ("payload_field", spec.payload_field)):
            if name and name not in columns:
                raise BadRecordError(f"{what} {name!r} is not a column of {files[0]} (columns: "
                                     f"{', '.join(columns)}). Nothing of this run was committed.")
    payload, key, reason = _record_columns(df.drop("w") if labels is not None else df, spec, header)
    return df.select(
        F.input_file_name().alias("f"), F.input_file_block_start().alias("b"),
        F.monotonically_increasing_id().alias("m"),
        payload.alias("payload"), key.alias("k"), reason.isNotNull().alias("bad"),
        *(["w"] if labels is not None else []),
    )


def bad_record_error(spark: Any, file_uri: str, spec: IngestSpec,
                     pieces: Mapping[str, Mapping[str, Any]] | None = None, here: bool = False) -> BadRecordError:
    key = key_of(file_uri)
    line, reason = first_bad_line(spark, key, spec, (pieces or {}).get(key), here)
    where = f"{key}, {'record' if spec.format == 'parquet' else 'line'} {line}" if line else key
    return BadRecordError(f"{where}: {reason}. Nothing of this run was committed; fix the file and re-run.")


def _csv_header(spark: Any, uri: str) -> list[str]:
    """The header of a CSV file, read through Spark (any filesystem): only its first line."""
    import csv

    first = spark.read.text(uri).limit(1).collect()
    if not first:
        raise BadRecordError(f"{key_of(uri)}: empty CSV file (no header line)")
    return next(csv.reader([first[0]["value"]]))


def first_bad_line(spark: Any, key: str, spec: IngestSpec, piece: Mapping[str, Any] | None = None,
                   here: bool = False) -> tuple[int, str]:
    """(1-based line number — record number for Parquet —, reason) of the first bad record of one
    file; only on errors. Read through Spark, so it works on every filesystem. A line file's
    ``piece`` (the run's byte range) carries its lines' numbers in the whole file; otherwise each
    line carries its split's start offset and an id rising within the split, so its number is the
    count of lines in earlier splits plus its position in its own split. ``here``: the piece is read
    in this process, as the run read it (:func:`line_frame`)."""
    from pyspark.sql import functions as F

    if spec.format in LINE_FORMATS and piece is not None:
        lines = line_frame(spark, {key: piece}, here=here, check_json=spec.format == "jsonl")
        _payload, _key, reason = _record_columns(lines, spec)
        found = (lines.withColumn("why", reason).where((F.length(F.trim("value")) > 0) & F.col("why").isNotNull())
                 .select("b", "why", F.when(F.length("value") <= 65536, F.col("value")).alias("text"))
                 .orderBy("b").limit(1).collect())
        if not found:
            return 0, "bad record"
        return found[0]["b"], _explain(found[0]["why"], found[0]["text"], spec, None)
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
        import csv

        n = len(next(csv.reader([text])))
        why = f"{n} fields where the header has {len(header or ())}"
    return why
