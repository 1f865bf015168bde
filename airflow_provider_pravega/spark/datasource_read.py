"""Reads of the ``pravega`` data source: batch reads between two stream cuts (or of a caller's
plan, ``segment_ranges``) and micro-batch streaming reads whose offsets are stream cuts. A
partition is a run of segment ranges, read straight from the segment store as Arrow batches
(:func:`read_ranges_arrow`, shared with the export job) and returned as the read's columns.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows, SupportsTriggerAvailableNow

from airflow_provider_pravega.spark.worker_imports import missing_dependency

try:
    from airflow_provider_pravega.client.batch import (
        SegmentRange,
        advance_cut,
        plan_segment_ranges,
        read_segment_range_arrow,
    )
    from airflow_provider_pravega.client.errors import PravegaError, SegmentStoreError
    from airflow_provider_pravega.client.streamcut import TAIL, StreamCut
    from airflow_provider_pravega.spark.datasource_options import (
        _METADATA_COLUMNS,
        PravegaDataSourceError,
        _check_stream,
        _client,
        _cut,
        _first_line,
        _fixed_columns,
        _required,
        _segment_ranges,
        _value,
        connection_config,
    )
    from airflow_provider_pravega.spark.worker_heap import prepare_worker_heap
except ImportError as _missing:
    raise missing_dependency(_missing) from _missing

# Imports that one step needs only are made in that step: Spark imports the data source's modules
# in a new Python worker for each step of a use (its lookup, creation, planning, each task).

__all__ = [
    "NOT_UTF8_ADVICE",
    "Decoding",
    "PravegaBatchReader",
    "PravegaStreamReader",
    "RangePartition",
    "read_ranges_arrow",
]

#: The advice closing the error for an event that is not UTF-8 (a job reading through this data
#: source, e.g. the export, replaces it with its own words).
NOT_UTF8_ADVICE = "read it with decode=binary"


def read_ranges_arrow(config: Any, ranges: Sequence[SegmentRange], *,
                      text: bool) -> Iterator[tuple[SegmentRange, Any, Any, int]]:
    """The events of ``ranges``, one range after the other, as ``(range, events, offsets,
    payload_bytes)`` per segment-store reply: ``events`` a pyarrow BinaryArray (StringArray with
    ``text``; an event that is not UTF-8 raises :class:`PravegaDataSourceError` naming its
    position), ``offsets`` an int64 numpy array. No Python object per event."""
    # import cost: pyarrow (0.3-0.5 s) only where a batch is built, not with the module
    import pyarrow as pa

    string = pa.string()
    for rng in ranges:
        for _, events, offsets, payload_bytes in read_segment_range_arrow(config, rng):
            if text:
                try:
                    events = events.cast(string)
                except pa.ArrowInvalid:
                    _raise_not_utf8(rng, events, offsets)
            yield rng, events, offsets, payload_bytes


def _raise_not_utf8(rng: SegmentRange, events: Any, offsets: Any) -> None:
    for payload, offset in zip(events.to_pylist(), offsets.tolist(), strict=True):
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PravegaDataSourceError(
                f"the event at offset {offset} of segment {rng.segment_name} is not UTF-8 text ({exc.reason} at "
                f"byte {exc.start}); {NOT_UTF8_ADVICE}"
            ) from None
    raise PravegaDataSourceError(f"an event of segment {rng.segment_name} is not UTF-8 text")


class RangePartition(InputPartition):
    """Segment ranges read one after the other (picklable): one range when the data source plans,
    a group when the caller does (``segment_ranges``)."""

    def __init__(self, *ranges: SegmentRange) -> None:
        super().__init__([r.to_json() for r in ranges])
        self.ranges = ranges


@dataclass(frozen=True)
class Decoding:
    """How events become rows (picklable, shipped to the read tasks): the output's Arrow schema
    and, for ``json``, which of its columns come from the event's JSON fields."""

    kind: str
    arrow_schema: Any
    json_fields: tuple[str, ...] = ()

    @classmethod
    def of(cls, options: Mapping[str, str], schema: Any) -> Decoding:
        """``schema`` is the user's (``.schema(...)``) or ours; checked against ``decode``."""
        kind = _value(options, "decode")
        fields = {f.name: f.dataType.simpleString() for f in schema.fields}
        expected = _fixed_columns(options, kind)
        if kind != "json":
            if fields != expected:
                raise PravegaDataSourceError(
                    f"with decode={kind} the schema is fixed ({', '.join(f'{n} {t}' for n, t in expected.items())}); "
                    f"got {', '.join(f'{n} {t}' for n, t in fields.items())}: leave .schema() out, or use "
                    "decode=json to read JSON events into columns of your own")
        else:
            wrong = [f"{n} {t}" for n, t in fields.items() if n in _METADATA_COLUMNS and t != _METADATA_COLUMNS[n]]
            if wrong:
                raise PravegaDataSourceError(
                    f"schema column(s) {', '.join(wrong)}: columns named {', '.join(_METADATA_COLUMNS)} are the "
                    f"event's position and must have the types {', '.join(f'{n} {t}' for n, t in _METADATA_COLUMNS.items())}")
            if not any(n not in _METADATA_COLUMNS for n in fields):
                raise PravegaDataSourceError("decode=json needs at least one column read from the events' JSON")
        json_fields = tuple(n for n in fields if n not in _METADATA_COLUMNS) if kind == "json" else ()
        return cls(kind, to_arrow_schema(schema, timezone="UTC"), json_fields)

    @property
    def text(self) -> bool:
        return self.kind == "text"


class PravegaBatchReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str], decoding: Decoding) -> None:
        self.config = connection_config(options)
        self.scope = _required(options, "scope", "the stream's scope")
        self.stream = _required(options, "stream", "the stream to read")
        self.plan = _segment_ranges(options, self.scope, self.stream)
        self.start = _cut(options, "start_stream_cut", self.scope, self.stream)
        self.end = _cut(options, "end_stream_cut", self.scope, self.stream)
        self.decoding = decoding

    def partitions(self) -> Sequence[InputPartition]:
        if self.plan is not None:  # the caller's plan, partitions in its order (no controller call)
            return [RangePartition(*ranges) for ranges in self.plan] or [RangePartition()]
        with _first_line(), _client(self.config) as client:
            _check_stream(client, self.scope, self.stream)
            ranges = _plan(client, self.start.resolve(client), self.end.resolve(client))
        # An empty range reads nothing: Spark still needs one partition for an empty frame.
        return [RangePartition(rng) for rng in ranges if rng.length != 0] or [RangePartition()]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_partition(self.config, partition.ranges, self.decoding)  # type: ignore[attr-defined]


def _read_partition(config: Any, ranges: Sequence[SegmentRange], decoding: Decoding) -> Iterator[Any]:
    """Ranges, one after the other, as Arrow record batches of the read's schema (batch and
    streaming reads); only the schema's columns are made."""
    # import cost: pyarrow (0.3-0.5 s) only where a batch is built, not with the module (arrow_columns imports it)
    import pyarrow as pa

    from airflow_provider_pravega.spark.arrow_columns import int64_array, repeated

    prepare_worker_heap()
    schema = decoding.arrow_schema
    int64, string = pa.int64(), pa.string()
    wanted = set(schema.names)
    json_schema = pa.schema([schema.field(n) for n in decoding.json_fields]) if decoding.json_fields else None
    current, constants = None, {}
    for rng, events, offsets, _ in read_ranges_arrow(config, [r for r in ranges if r.length != 0],
                                                     text=decoding.text):
        if rng is not current:
            current = rng
            constants = [(name, value, kind) for name, value, kind in (
                ("scope", rng.scope, string), ("stream", rng.stream, string), ("segment_id", rng.segment_id, int64))
                if name in wanted]
        n = len(events)
        columns = {"offset": int64_array(offsets)} if "offset" in wanted else {}
        columns.update((name, repeated(value, kind, n)) for name, value, kind in constants)
        if json_schema is None:
            columns["event"] = events
        else:
            parsed = _parse_json(events, offsets, json_schema, rng)
            columns.update((name, parsed.column(name).combine_chunks()) for name in decoding.json_fields)
        yield pa.RecordBatch.from_arrays([columns[name] for name in schema.names], schema=schema)


def _parse_json(events: Any, offsets: Any, schema: Any, rng: SegmentRange) -> Any:
    """Each event one JSON object, parsed by Arrow's JSON reader in one pass over the reply
    (fields not in ``schema`` ignored, missing ones null); a bad event is named by its position."""
    # import cost: pyarrow (0.3-0.5 s) only where a batch is built, not with the module; pyarrow.json only for JSON events
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    from airflow_provider_pravega.spark.arrow_columns import scalar

    lines = pc.binary_join_element_wise(events, scalar(b"\n", pa.binary()), scalar(b"", pa.binary()))
    ends = np.frombuffer(lines.buffers()[1], dtype=np.int32 if lines.type == pa.binary() else np.int64)
    start, end = int(ends[lines.offset]), int(ends[lines.offset + len(lines)])
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore", newlines_in_values=True)
    try:
        table = pj.read_json(pa.BufferReader(lines.buffers()[2].slice(start, end - start)),
                             read_options=pj.ReadOptions(use_threads=False, block_size=max(end - start, 1) + 1),
                             parse_options=options)
        if table.num_rows == len(events):
            return table
    except pa.ArrowInvalid:
        pass
    for payload, offset in zip(events.to_pylist(), offsets.tolist(), strict=True):  # find the culprit
        try:
            rows = pj.read_json(pa.BufferReader(payload + b"\n"), parse_options=options).num_rows
            problem = None if rows == 1 else f"holds {rows} JSON values, not one object"
        except pa.ArrowInvalid as exc:
            problem = str(exc).removeprefix("JSON parse error: ")
        if problem:
            raise PravegaDataSourceError(
                f"the event at offset {offset} of segment {rng.segment_name} cannot be read as JSON of the schema "
                f"({problem}); read it with decode=text to see it")
    raise PravegaDataSourceError(f"the events of segment {rng.segment_name} cannot be read as JSON of the schema")


class _RefusedStreamRead(DataSourceStreamReader):
    """What ``streamReader`` returns when the options do not fit a streaming read: PySpark's
    streaming runner (4.x) hides an error raised by ``streamReader`` itself behind its own
    ``UnboundLocalError`` (it stops a reader it never got), so the query's first call raises it."""

    def __init__(self, error: PravegaError) -> None:
        self.error = error

    def _refuse(self, *args: Any) -> Any:
        with _first_line():  # the runner exits after it, as the other workers do
            raise self.error

    initialOffset = latestOffset = partitions = read = getDefaultReadLimit = reportLatestOffset = _refuse


class PravegaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reads: offsets are stream cuts (``{"scope", "stream", "positions"}``), so a
    query restarted from its checkpoint continues exactly at the last committed cut; each
    micro-batch is planned like a batch read (successors followed across scaling, predecessors
    first) and bounded by ``max_events_per_trigger`` / ``max_bytes_per_trigger``
    (:func:`~airflow_provider_pravega.client.batch.advance_cut`)."""

    def __init__(self, options: Mapping[str, str], decoding: Decoding) -> None:
        self.config = connection_config(options)
        self.scope = _required(options, "scope", "the stream's scope")
        self.stream = _required(options, "stream", "the stream to read")
        self.start = _cut(options, "start_stream_cut", self.scope, self.stream)
        self.max_events = _value(options, "max_events_per_trigger")
        self.max_bytes = _value(options, "max_bytes_per_trigger")
        self.decoding = decoding
        self._client: Any = None
        self._end = StreamCut.symbolic(self.scope, self.stream, TAIL)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}  # tasks connect on their own

    def prepareForTriggerAvailableNow(self) -> None:
        """``trigger(availableNow=True)``: read up to the tail as it is now, in limited batches."""
        self._end = StreamCut.tail(self._connected(), self.scope, self.stream)

    def _connected(self) -> Any:
        if self._client is None:
            self._client = _client(self.config)
            _check_stream(self._client, self.scope, self.stream)
        return self._client

    def _offset(self, cut: StreamCut) -> dict:
        return {"scope": cut.scope, "stream": cut.stream,
                "positions": {str(s): o for s, o in sorted(cut.positions.items())}}

    def _cut_of(self, offset: Mapping[str, Any]) -> StreamCut:
        try:
            cut = StreamCut(offset["scope"], offset["stream"],
                            {int(s): int(o) for s, o in offset["positions"].items()})
        except (KeyError, TypeError, ValueError, PravegaError) as exc:
            raise PravegaDataSourceError(f"checkpointed offset {dict(offset)!r} is not a pravega stream cut: {exc}") \
                from None
        if (cut.scope, cut.stream) != (self.scope, self.stream):
            raise PravegaDataSourceError(
                f"the checkpoint's offsets are of stream {cut.scope}/{cut.stream}, but the query reads "
                f"{self.scope}/{self.stream}: use a new checkpoint location for another stream")
        return cut

    def initialOffset(self) -> dict:
        return self._offset(self.start.resolve(self._connected()))

    def getDefaultReadLimit(self) -> Any:
        if self.max_events is not None:
            return ReadMaxRows(self.max_events)
        if self.max_bytes is not None:
            return ReadMaxBytes(self.max_bytes)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: Any) -> dict:
        client = self._connected()
        if isinstance(limit, ReadAllAvailable):
            max_events = max_bytes = None
        else:  # the engine's limit for its kind, the options for the other (both may be set)
            max_events = limit.max_rows if isinstance(limit, ReadMaxRows) else self.max_events
            max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else self.max_bytes
        return self._offset(advance_cut(client, self._cut_of(start), self._end, max_bytes=max_bytes,
                                        max_events=max_events))

    def reportLatestOffset(self) -> dict:
        return self._offset(StreamCut.tail(self._connected(), self.scope, self.stream))

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ranges = _plan(self._connected(), self._cut_of(start), self._cut_of(end))
        return [RangePartition(rng) for rng in ranges if rng.length != 0]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_partition(self.config, partition.ranges, self.decoding)  # type: ignore[attr-defined]

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _plan(client: Any, start: StreamCut, end: StreamCut) -> list[SegmentRange]:
    """plan_segment_ranges, asked again while a scale is half done."""
    for attempt in range(5):
        try:
            return plan_segment_ranges(client, start, end)
        except SegmentStoreError as exc:
            if "plan again" not in str(exc) or attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")
