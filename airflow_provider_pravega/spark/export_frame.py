"""The rows an export writes, as a Spark DataFrame read by the ``pravega`` data source with the
export's own plan: the events as text or bytes, or (``event_format="json"``) their top-level
fields, with a schema given or inferred from a deterministic sample of the events."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from pyspark.errors import PySparkException
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, MapType, StructType, _parse_datatype_string

from airflow_provider_pravega.client.batch import SegmentRange, read_segment_range
from airflow_provider_pravega.spark import datasource
from airflow_provider_pravega.spark.export_output import java_message
from airflow_provider_pravega.spark.export_plan import group_ranges, partitions_of
from airflow_provider_pravega.spark.export_spec import EventDecodeError, ExportSpec
from airflow_provider_pravega.spark.session import Py4JError

log = logging.getLogger(__name__)


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


def build_frame(spark: Any, config: Any, spec: ExportSpec, ranges: Sequence[SegmentRange],
                groups: Sequence[Sequence[int]] | None = None, observation: Any = None) -> Any:
    """The rows to write: ``event`` (or the JSON fields), ``segment_id``, ``offset``; partition
    ``i`` holds the ranges ``groups[i]`` (default: :func:`group_ranges` of :func:`partitions_of`), each in
    offset order. Read by the ``pravega`` data source with the export's plan (``segment_ranges``)
    and only the columns it writes. ``observation`` (an ``Observation``) gets the ``events`` and
    payload ``bytes`` of the rows read."""
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
