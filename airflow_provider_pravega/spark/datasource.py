"""``spark.read.format("pravega")`` and ``df.write.format("pravega")``: a PySpark (Spark 4) Python
data source over this provider's client.

Register it once per session with :func:`register` (classic PySpark or Spark Connect), then:

* **batch read** between two stream cuts: the driver resolves the cuts and plans the segment
  ranges between them (:func:`~airflow_provider_pravega.client.batch.plan_segment_ranges`, which
  follows scaling); each range is one Spark partition, read straight from the segment store as
  Arrow batches by :func:`read_ranges_arrow`. A job that plans its own ranges (the export job)
  passes them as ``segment_ranges`` (partitions in its order) and may emit fewer ``columns``.
  Rows: ``event`` (binary, or UTF-8 text with ``decode=text``; with ``decode=json`` the
  columns of the given schema instead, parsed by Arrow), ``scope``, ``stream``,
  ``segment_id``, ``offset`` (where the event's header starts in its segment).
* **batch write**, exactly once: each task attempt writes its rows into one Pravega transaction
  (:class:`~airflow_provider_pravega.client.transactions.TransactionalWriter`, routed by the
  optional ``routing_key`` column, so one key's rows keep their order within a task), flushes it
  (every event acknowledged), and hands its transaction id to the driver in its commit message
  and its lease to the host's lease keeper (:mod:`~airflow_provider_pravega.client.lease_handoff`),
  which renews it until the job commits or aborts it, however long the job's other tasks take.
  The driver's ``commit`` renews every transaction, then commits them all; ``abort`` (a failed job)
  aborts them. A failed task attempt's transaction is aborted by the attempt itself, or, when its
  process died, is never committed and expires with its lease.

Options (all strings, as Spark passes them): see ``OPTIONS`` and the README's "Spark data source".
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)

from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

try:
    from airflow_provider_pravega.client.batch import (
        SegmentRange,
        advance_cut,
        plan_segment_ranges,
        read_segment_range_arrow,
    )
    from airflow_provider_pravega.client.config import PravegaConnectionConfig
    from airflow_provider_pravega.client.errors import PravegaError, SegmentStoreError
    from airflow_provider_pravega.client.lease_handoff import DEFAULT_KEEP_S, hand_over
    from airflow_provider_pravega.client.streamcut import HEAD, TAIL, StreamCut
except ImportError as _missing:
    # Spark imports this module in its Python workers too (on a cluster or a Connect server): a
    # worker interpreter without the provider's dependencies would only say "No module named 'grpc'".
    raise ImportError(
        f"the pravega Spark data source cannot import {_missing.name or _missing}: it runs in Spark's "
        f"Python workers as well as the driver, and {sys.executable} lacks the provider's dependencies. "
        "Install airflow-provider-pravega into the interpreter the workers use (PYSPARK_PYTHON or "
        "spark.pyspark.python) on every Spark host.", name=_missing.name) from _missing

__all__ = [
    "FORMAT",
    "OPTIONS",
    "PravegaDataSource",
    "NOT_UTF8_ADVICE",
    "PravegaDataSourceError",
    "connection_options",
    "read_ranges_arrow",
    "register",
    "segment_ranges_option",
]

log = logging.getLogger(__name__)

#: The name ``spark.read.format(...)`` takes.
FORMAT = "pravega"
#: option -> what it means (the README's table says the same).
OPTIONS = {
    "controller": "controller URI, tcp://host:9090 or tls://host:9090 (required)",
    "scope": "scope of the stream (required)",
    "stream": "stream name (required)",
    "username": "Basic-auth user (optional)",
    "password": "its password (optional)",
    "tls": "true/false; also implied by a tls:// controller URI",
    "trust_store": "CA certificate (PEM file or directory) for TLS",
    "validate_hostname": "true/false (default true)",
    "transaction_lease_ms": "write: lease of each task's transaction (default 90000)",
    "lease_keep_s": "write: how long after its task ended a transaction's lease is renewed while it waits for "
                    "the job's commit (default 3600; then it expires, e.g. after a driver crash)",
    "start_stream_cut": "read: head/earliest (default), tail/latest, or a stream-cut text",
    "end_stream_cut": "read: tail/latest (default), head/earliest, or a stream-cut text",
    "decode": "read: binary (default), text (UTF-8, event becomes a string) or json (each event one JSON object, "
              "parsed into the columns of the schema given with .schema(...))",
    "mode": "write: exactly_once (default) or at_least_once (plain appends; a retried task writes again)",
    "writer_id": "streaming write, exactly once: names the query's record of committed micro-batches (required; "
                 "keep it with the checkpoint location: a new checkpoint needs a new writer_id)",
    "stale_after_s": "streaming write: after a driver crash, how long a restarted query waits before it "
                     "finishes or rolls back the crashed commit (default 60)",
    "create_stream": "write: true creates the scope and the stream when missing, with the policy options below "
                     "(default false: a missing stream is an error)",
    "scaling_policy": "write with create_stream: fixed (default), by_event_rate or by_data_rate",
    "segments": "write with create_stream: segments of a fixed policy (default 1)",
    "min_segments": "write with create_stream: minimum segments of a rate policy (default 1)",
    "target_rate": "write with create_stream: events/s or KiB/s per segment of a rate policy",
    "scale_factor": "write with create_stream: how many segments one splits into under a rate policy",
    "retention_size_bytes": "write with create_stream: keep at most this many bytes",
    "retention_time_ms": "write with create_stream: keep data this many milliseconds",
    "segment_ranges": "batch read, for jobs that plan their own ranges: JSON list of partitions, each a list of "
                      "ranges [scope, stream, segment_id, start_offset, end_offset or null], read instead of the "
                      "ranges between start_stream_cut and end_stream_cut (not with those); partition i is the "
                      "i-th list, its ranges read in the given order",
    "columns": "read with decode binary or text: the columns to emit, comma-separated, of event, scope, stream, "
               "segment_id, offset (default all; Python data sources get no column pruning, so each column "
               "costs its conversion to the JVM)",
    "max_events_per_trigger": "streaming read: at most this many events per micro-batch (default: no limit)",
    "max_bytes_per_trigger": "streaming read: at most this many segment bytes (event headers included) per "
                             "micro-batch; at least one event is always taken (default: no limit)",
}
_CONNECTION_OPTIONS = ("tls", "trust_store", "validate_hostname", "transaction_lease_ms")
_CUT_WORDS = {"head": HEAD, "earliest": HEAD, "tail": TAIL, "latest": TAIL}
_MODES = ("exactly_once", "at_least_once")
_DECODINGS = ("binary", "text", "json")
#: The columns a read gives besides the event, with their Spark types.
_METADATA_COLUMNS = {"scope": "string", "stream": "string", "segment_id": "bigint", "offset": "bigint"}


class PravegaDataSourceError(PravegaError, ValueError):
    """Options or data the ``pravega`` data source cannot work with; nothing was read or written."""


# ---------------------------------------------------------------------------------------------
# Reading segment ranges as Arrow batches (shared with the export job)
# ---------------------------------------------------------------------------------------------


#: The advice closing the error for an event that is not UTF-8 (a job reading through this data
#: source, e.g. the export, replaces it with its own words).
NOT_UTF8_ADVICE = "read it with decode=binary"


def read_ranges_arrow(config: Any, ranges: Sequence[SegmentRange], *,
                      text: bool) -> Iterator[tuple[SegmentRange, Any, Any, int]]:
    """The events of ``ranges``, one range after the other, as ``(range, events, offsets,
    payload_bytes)`` per segment-store reply: ``events`` a pyarrow BinaryArray (StringArray with
    ``text``; an event that is not UTF-8 raises :class:`PravegaDataSourceError` naming its
    position), ``offsets`` an int64 numpy array. No Python object per event."""
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


# ---------------------------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------------------------


def _option(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    value = options.get(name)
    if value is None or not str(value).strip():
        return default
    return str(value).strip()


def _required(options: Mapping[str, str], name: str, what: str) -> str:
    value = _option(options, name)
    if value is None:
        raise PravegaDataSourceError(f"the pravega data source needs option {name!r} ({what})")
    return value


def connection_config(options: Mapping[str, str]) -> PravegaConnectionConfig:
    """The connection settings in the options, read as the ``pravega`` Airflow connection reads
    its fields (``controller`` is its host, ``username``/``password`` its login; the rest its extra)."""
    controller = _required(options, "controller", "the controller URI, tcp://host:9090 or tls://host:9090")
    extra = {name: options[name] for name in _CONNECTION_OPTIONS if _option(options, name) is not None}
    try:
        return PravegaConnectionConfig.from_connection_fields(
            host=controller, login=_option(options, "username"), password=options.get("password") or None,
            extra=extra)
    except ValueError as exc:
        raise PravegaDataSourceError(f"pravega data source option: {exc}") from None


def connection_options(config: PravegaConnectionConfig) -> dict[str, str]:
    """The options that give :func:`connection_config` back ``config`` (for jobs that read through
    this data source with a connection they already hold)."""
    options = {"controller": config.controller_uri, "validate_hostname": str(config.validate_hostname).lower(),
               "transaction_lease_ms": str(config.transaction_lease_ms)}
    if config.username is not None:
        options["username"] = config.username
    if config.password is not None:
        options["password"] = config.password
    if config.trust_store is not None:
        options["trust_store"] = config.trust_store
    return options


def _number(options: Mapping[str, str], name: str, default: Any, *, whole: bool = False,
            positive: bool = False) -> Any:
    """Option ``name`` as a number of seconds (``whole``: a whole number instead; ``positive``:
    above zero), ``default`` when absent, or a clear error naming the option."""
    text = _option(options, name)
    if text is None:
        return default
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        value = float("nan")
    if value != value or (positive and not value > 0):
        kind = "whole number" if whole else "number of seconds"
        raise PravegaDataSourceError(f"option {name} must be a {'positive ' if positive else ''}{kind}, got {text!r}")
    return value


def _cut(options: Mapping[str, str], name: str, default: str, scope: str, stream: str) -> StreamCut:
    value = _option(options, name, default)
    assert value is not None
    word = value.lower()
    if word == "unbounded":
        word = default
    if word in _CUT_WORDS:
        return StreamCut.symbolic(scope, stream, _CUT_WORDS[word])
    try:
        return StreamCut.coerce(value, scope, stream, unbounded=_CUT_WORDS[default], what=name)
    except PravegaError as exc:
        raise PravegaDataSourceError(f"option {name}: {exc}") from None


def _client(config: PravegaConnectionConfig) -> Any:
    from airflow_provider_pravega.client import PravegaClient

    return PravegaClient(config)


def _check_stream(client: Any, scope: str, stream: str) -> None:
    if not client.admin.stream_exists(scope, stream):
        raise PravegaDataSourceError(f"stream {scope}/{stream} does not exist (create it first)")


# ---------------------------------------------------------------------------------------------
# The data source
# ---------------------------------------------------------------------------------------------


class PravegaDataSource(DataSource):
    """``format("pravega")``: batch reads between stream cuts and exactly-once batch writes."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        decode = _decode_option(self.options)
        if decode == "json":
            raise PravegaDataSourceError(
                "decode=json needs the events' fields as a schema, e.g. spark.read.format('pravega')"
                ".schema('sensor string, temperature double, offset bigint').option('decode', 'json'); "
                f"columns named {', '.join(_METADATA_COLUMNS)} are filled from the event's position")
        types = _fixed_columns(self.options, decode)
        return ", ".join(f"{name} {kind} not null" for name, kind in types.items())

    def reader(self, schema: Any) -> DataSourceReader:
        return PravegaBatchReader(self.options, Decoding.of(self.options, schema))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return PravegaStreamReader(self.options, Decoding.of(self.options, schema))

    def writer(self, schema: Any, overwrite: bool) -> PravegaBatchWriter:
        return PravegaBatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: Any, overwrite: bool) -> PravegaStreamWriter:
        return PravegaStreamWriter(self.options, schema, overwrite)


class RangePartition(InputPartition):
    """Segment ranges read one after the other (picklable): one range when the data source plans,
    a group when the caller does (``segment_ranges``)."""

    def __init__(self, *ranges: SegmentRange) -> None:
        super().__init__([r.to_json() for r in ranges])
        self.ranges = ranges


def _fixed_columns(options: Mapping[str, str], decode: str) -> dict[str, str]:
    """name -> Spark type of the columns a binary or text read emits: all, or those of ``columns``
    in its order."""
    types = {"event": "string" if decode == "text" else "binary", **_METADATA_COLUMNS}
    chosen = _option(options, "columns")
    if chosen is None:
        return types
    if decode == "json":
        raise PravegaDataSourceError("option columns is for decode=binary or text; with decode=json the schema "
                                     "given with .schema(...) chooses the columns")
    names = [n.strip() for n in chosen.split(",")]
    unknown = [n for n in names if n not in types]
    if unknown or not names or len(set(names)) != len(names):
        raise PravegaDataSourceError(f"option columns must name distinct columns of {', '.join(types)}, "
                                     f"comma-separated; got {chosen!r}")
    return {n: types[n] for n in names}


def _segment_ranges(options: Mapping[str, str], scope: str, stream: str) -> list[list[SegmentRange]] | None:
    """The caller's plan in option ``segment_ranges`` (None when not given), checked."""
    import json

    text = _option(options, "segment_ranges")
    if text is None:
        return None
    given = [n for n in ("start_stream_cut", "end_stream_cut") if _option(options, n) is not None]
    if given:
        raise PravegaDataSourceError(f"option segment_ranges is the plan of the read: leave out {' and '.join(given)}")
    example = "e.g. [[[\"scope\", \"stream\", 0, 0, 1024]], [[\"scope\", \"stream\", 1, 0, null]]]"
    try:
        plan = json.loads(text)
        if not isinstance(plan, list) or not all(isinstance(p, list) for p in plan):
            raise ValueError("not a list of partitions")
        partitions = []
        for part in plan:
            ranges = []
            for r in part:
                if not isinstance(r, list) or len(r) != 5 or not all(isinstance(v, str) for v in r[:2]):
                    raise ValueError(f"{r!r} is not [scope, stream, segment_id, start_offset, end_offset or null]")
                ranges.append(SegmentRange(*r))  # checks the numbers
            partitions.append(ranges)
    except ValueError as exc:
        raise PravegaDataSourceError(f"option segment_ranges must be a JSON list of partitions, each a list of "
                                     f"ranges [scope, stream, segment_id, start_offset, end_offset or null], "
                                     f"{example}: {exc}") from None
    other = sorted({f"{r.scope}/{r.stream}" for part in partitions for r in part} - {f"{scope}/{stream}"})
    if other:
        raise PravegaDataSourceError(f"option segment_ranges has ranges of {', '.join(other)}, but the read is of "
                                     f"{scope}/{stream}")
    return partitions


def segment_ranges_option(partitions: Sequence[Sequence[SegmentRange]]) -> str:
    """The ``segment_ranges`` option for a plan: partition ``i`` reads ``partitions[i]`` in order."""
    import json

    return json.dumps([[[r.scope, r.stream, r.segment_id, r.start_offset, r.end_offset] for r in part]
                       for part in partitions], separators=(",", ":"))


def _decode_option(options: Mapping[str, str]) -> str:
    decode = (_option(options, "decode", "binary") or "binary").lower()
    if decode not in _DECODINGS:
        raise PravegaDataSourceError(f"option decode must be one of {', '.join(_DECODINGS)}, got {decode!r}")
    return decode


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
        from pyspark.sql.pandas.types import to_arrow_schema

        kind = _decode_option(options)
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
        self.start = _cut(options, "start_stream_cut", "head", self.scope, self.stream)
        self.end = _cut(options, "end_stream_cut", "tail", self.scope, self.stream)
        self.decoding = decoding

    def partitions(self) -> Sequence[InputPartition]:
        if self.plan is not None:  # the caller's plan, partitions in its order (no controller call)
            return [RangePartition(*ranges) for ranges in self.plan] or [RangePartition()]
        with _client(self.config) as client:
            _check_stream(client, self.scope, self.stream)
            ranges = _plan(client, self.start.resolve(client), self.end.resolve(client))
        # An empty range reads nothing: Spark still needs one partition for an empty frame.
        return [RangePartition(rng) for rng in ranges if rng.length != 0] or [RangePartition()]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_partition(self.config, partition.ranges, self.decoding)  # type: ignore[attr-defined]


def _read_partition(config: Any, ranges: Sequence[SegmentRange], decoding: Decoding) -> Iterator[Any]:
    """Ranges, one after the other, as Arrow record batches of the read's schema (batch and
    streaming reads); only the schema's columns are made."""
    import pyarrow as pa

    schema = decoding.arrow_schema
    int64, string = pa.int64(), pa.string()
    wanted = set(schema.names)
    json_schema = pa.schema([schema.field(n) for n in decoding.json_fields]) if decoding.json_fields else None
    current, constants = None, {}
    for rng, events, offsets, _ in read_ranges_arrow(config, [r for r in ranges if r.length != 0],
                                                     text=decoding.text):
        if rng is not current:
            current = rng
            constants = {name: pa.scalar(value, kind) for name, value, kind in (
                ("scope", rng.scope, string), ("stream", rng.stream, string), ("segment_id", rng.segment_id, int64))
                if name in wanted}
        n = len(events)
        columns = {"offset": pa.array(offsets)} if "offset" in wanted else {}
        columns.update((name, pa.repeat(value, n)) for name, value in constants.items())
        if json_schema is None:
            columns["event"] = events
        else:
            parsed = _parse_json(events, offsets, json_schema, rng)
            columns.update((name, parsed.column(name).combine_chunks()) for name in decoding.json_fields)
        yield pa.RecordBatch.from_arrays([columns[name] for name in schema.names], schema=schema)


def _parse_json(events: Any, offsets: Any, schema: Any, rng: SegmentRange) -> Any:
    """Each event one JSON object, parsed by Arrow's JSON reader in one pass over the reply
    (fields not in ``schema`` ignored, missing ones null); a bad event is named by its position."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    lines = pc.binary_join_element_wise(events, pa.scalar(b"\n"), pa.scalar(b""))
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
        self.start = _cut(options, "start_stream_cut", "head", self.scope, self.stream)
        if _option(options, "segment_ranges") is not None:
            raise PravegaDataSourceError("option segment_ranges is for batch reads (spark.read), not streaming ones")
        if _option(options, "end_stream_cut") is not None:
            raise PravegaDataSourceError("a streaming read has no end_stream_cut (it follows the stream's tail); "
                                         "use spark.read for a bounded read")
        self.max_events = _number(options, "max_events_per_trigger", None, whole=True, positive=True)
        self.max_bytes = _number(options, "max_bytes_per_trigger", None, whole=True, positive=True)
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
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows

        if self.max_events is not None:
            return ReadMaxRows(self.max_events)
        if self.max_bytes is not None:
            return ReadMaxBytes(self.max_bytes)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: Any) -> dict:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows

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


def _flag(options: Mapping[str, str], name: str) -> bool:
    value = (_option(options, name, "false") or "").lower()
    if value not in ("true", "false"):
        raise PravegaDataSourceError(f"option {name} must be true or false, got {value!r}")
    return value == "true"


def _create_stream(client: Any, scope: str, stream: str, options: Mapping[str, str]) -> None:
    """The scope and stream, created when missing with the policies in the options (an existing
    stream is left as it is, whatever its policies)."""
    from airflow_provider_pravega.client.admin import build_retention_policy, build_scaling_policy

    try:
        scaling = build_scaling_policy(
            _option(options, "scaling_policy", "fixed"), segments=_option(options, "segments"),
            min_segments=_option(options, "min_segments"), target_rate=_option(options, "target_rate"),
            scale_factor=_option(options, "scale_factor"))
        retention = build_retention_policy(_option(options, "retention_size_bytes"),
                                           _option(options, "retention_time_ms"))
    except (TypeError, ValueError) as exc:
        raise PravegaDataSourceError(f"pravega data source option: {exc}") from None
    if client.admin.create_scope(scope):
        log.info("created scope %s", scope)
    if client.admin.create_stream(scope, stream, scaling=scaling, retention=retention):
        log.info("created stream %s/%s (%s)", scope, stream, scaling)


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


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------


@dataclass
class PravegaCommitMessage(WriterCommitMessage):
    """What a write task reports: its transaction (None in at_least_once mode) and its count."""

    scope: str
    stream: str
    txn_id: int | None
    events: int


class _TaskWrites:
    """What batch and streaming writes share: the options checked on the driver, and each task
    attempt writing its rows into one transaction (or plainly, at least once)."""

    def __init__(self, options: Mapping[str, str], schema: Any, overwrite: bool) -> None:
        if overwrite:
            raise PravegaDataSourceError("a Pravega stream is append-only: use mode('append'), not overwrite")
        self.config = connection_config(options)
        self.scope = _required(options, "scope", "the stream's scope")
        self.stream = _required(options, "stream", "the stream to write")
        self.mode = (_option(options, "mode", "exactly_once") or "").lower()
        if self.mode not in _MODES:
            raise PravegaDataSourceError(f"option mode must be one of {', '.join(_MODES)}, got {self.mode!r}")
        self.event_text, self.has_key = _check_columns(schema)
        self.keep_s = _number(options, "lease_keep_s", DEFAULT_KEEP_S, positive=True)
        create = _flag(options, "create_stream")
        with _client(self.config) as client:
            if create:
                _create_stream(client, self.scope, self.stream, options)
            _check_stream(client, self.scope, self.stream)

    def write(self, iterator: Iterator[Any]) -> PravegaCommitMessage:
        if self.mode == "at_least_once":
            return self._write_at_least_once(iterator)
        client = _client(self.config)
        manager = client.transactions
        txn = manager.begin(self.scope, self.stream)
        keeper = client.lease_keeper()
        keeper.add(self.scope, self.stream, txn.txn_id)
        writer = manager.writer(self.scope, self.stream, txn, check_open=False)
        try:
            count = self._write_rows(iterator, writer.write_event)
            writer.flush()
            keeper.check()
            # From here until the driver commits, this host's lease keeper renews the lease.
            manager.ping(self.scope, self.stream, txn.txn_id)
            try:
                hand_over(self.config, self.scope, self.stream, txn.txn_id, self.keep_s)
            except OSError as exc:  # the job still commits if it ends within the lease
                log.warning("no lease keeper for transaction %032x (%s): it must be committed within %d ms",
                            txn.txn_id, exc, self.config.transaction_lease_ms)
        except BaseException:
            try:
                manager.abort(self.scope, self.stream, txn.txn_id)
            except Exception as exc:  # the lease ends it anyway
                log.warning("could not abort transaction %032x of a failed write task: %s", txn.txn_id, exc)
            raise
        finally:
            keeper.close()
            writer.close()
            client.close()
        return PravegaCommitMessage(self.scope, self.stream, txn.txn_id, count)

    def _write_at_least_once(self, iterator: Iterator[Any]) -> PravegaCommitMessage:
        """Plain appends (the provider's EventWriter, routed like the official writer): visible at
        once, no transaction; a retried task writes its rows again (at least once)."""
        with _client(self.config) as client, client.event_writer(self.scope, self.stream) as writer:
            count = self._write_rows(iterator, writer.write_event)
            writer.flush()
        return PravegaCommitMessage(self.scope, self.stream, None, count)

    def _write_rows(self, batches: Iterator[Any], write: Any) -> int:
        count = 0
        for batch in batches:
            events = batch.column("event").to_pylist()
            if self.event_text:
                events = [e.encode("utf-8") if e is not None else None for e in events]
            keys = batch.column("routing_key").to_pylist() if self.has_key else [None] * len(events)
            for event, key in zip(events, keys, strict=True):
                if event is None:
                    raise PravegaDataSourceError(f"row {count} has a null event; events cannot be null")
                write(event, key)
                count += 1
        return count


class PravegaBatchWriter(_TaskWrites, DataSourceArrowWriter):
    """Exactly once by default: one transaction per task attempt, committed by the driver;
    ``mode=at_least_once``: plain appends, nothing to commit."""

    def commit(self, messages: Sequence[PravegaCommitMessage | None]) -> None:
        txns = [m.txn_id for m in messages if m is not None and m.txn_id is not None]
        if not txns:
            return
        with _client(self.config) as client:
            from airflow_provider_pravega.client.transactions import TxnStatus

            manager = client.transactions
            _renew_all_or_abort(manager, self.scope, self.stream, txns, self.config)
            for t in txns:
                manager.commit(self.scope, self.stream, t, wait=False)
            for t in txns:
                manager.wait_for(self.scope, self.stream, t, (TxnStatus.COMMITTED,))

    def abort(self, messages: Sequence[PravegaCommitMessage | None]) -> None:
        _abort_all(self.config, self.scope, self.stream, messages)


class PravegaStreamWriter(_TaskWrites, DataSourceStreamArrowWriter):
    """Exactly once per micro-batch: each task attempt writes one transaction, as in a batch write;
    the driver's commit of micro-batch N runs the provider's exactly-once ingest protocol
    (:class:`~airflow_provider_pravega.client.ingest.IngestCoordinator`) with the batch as its one
    "file", identified by N, in a state keyed by the target stream and ``writer_id``. A batch that
    Spark replays after a crash between this commit and Spark's own commit log is found committed:
    its new transactions are aborted, so it is not written twice; a commit interrupted after its
    commit point is rolled forward by the next batch's commit (once ``stale_after_s`` has passed)."""

    def __init__(self, options: Mapping[str, str], schema: Any, overwrite: bool) -> None:
        super().__init__(options, schema, overwrite)
        self.writer_id = _option(options, "writer_id")
        if self.mode == "exactly_once" and self.writer_id is None:
            raise PravegaDataSourceError(
                "an exactly-once streaming write needs option writer_id (a name for this query's record of "
                "committed micro-batches, kept with its checkpoint location), or mode=at_least_once")
        self.stale_after_s = _number(options, "stale_after_s", 60.0)
        if self.mode == "exactly_once":
            from airflow_provider_pravega.client.ingest import IngestError, check_timing

            try:
                check_timing(self.stale_after_s, self.config.transaction_lease_ms)
            except IngestError as exc:
                raise PravegaDataSourceError(f"option stale_after_s: {exc}") from None

    def commit(self, messages: Sequence[PravegaCommitMessage | None], batchId: int) -> None:
        if self.mode != "exactly_once":
            return
        from airflow_provider_pravega.client.ingest import (
            FilePlan,
            IngestCoordinator,
            WriteResult,
            open_ingest_state,
            register_txn,
        )

        done = [m for m in messages if m is not None and m.txn_id is not None]
        txns = [m.txn_id for m in done]
        with _client(self.config) as client:
            manager = client.transactions
            _renew_all_or_abort(manager, self.scope, self.stream, txns, self.config)
            store = open_ingest_state(client, self.scope, self.stream, f"spark-stream:{self.writer_id}",
                                      stale_after_s=self.stale_after_s)
            try:
                coord = IngestCoordinator(store, manager, self.scope, self.stream, stale_after_s=self.stale_after_s,
                                          lease_ms=self.config.transaction_lease_ms,
                                          lease_keeper=client.lease_keeper)
                hex_ids = [f"{t:032x}" for t in txns]

                def register(run_id: str, plan: FilePlan) -> WriteResult:
                    for hex_id in hex_ids:
                        register_txn(store, run_id, hex_id)
                    return WriteResult(hex_ids, sum(m.events for m in done))

                # One "file" whose identity is the batch id: a replay of the last committed batch is
                # skipped, the next batch replaces it (the state stays one entry long).
                outcome = coord.run({"micro-batch": {"size": 0, "fp": f"{batchId:020d}"}}, register,
                                    allow_changed_files=True, wait_for_commit=True)
            finally:
                store.close()
            if outcome.run_id is None:
                log.info("micro-batch %d of writer %s was already committed (a replay): its %d new transaction(s) "
                         "are aborted", batchId, self.writer_id, len(txns))
                for t in txns:
                    _abort_quietly(manager, self.scope, self.stream, t)

    def abort(self, messages: Sequence[PravegaCommitMessage | None], batchId: int) -> None:
        _abort_all(self.config, self.scope, self.stream, messages)


def _renew_all_or_abort(manager: Any, scope: str, stream: str, txns: Sequence[int], config: Any) -> None:
    """Renew every transaction; if any ended (its lease ran out), abort them all and say so."""
    from airflow_provider_pravega.client.transactions import TxnStatus

    lost = [t for t in txns if manager.ping(scope, stream, t) != TxnStatus.OPEN]
    if lost:
        for t in txns:
            _abort_quietly(manager, scope, stream, t)
        raise PravegaDataSourceError(
            f"{len(lost)} of the {len(txns)} write transactions on {scope}/{stream} ended before the job "
            f"committed (lease of {config.transaction_lease_ms} ms ran out?): nothing was committed; raise "
            f"option transaction_lease_ms")


def _abort_all(config: Any, scope: str, stream: str, messages: Sequence[PravegaCommitMessage | None]) -> None:
    txns = [m.txn_id for m in messages if m is not None and m.txn_id is not None]
    if not txns:
        return
    with _client(config) as client:
        for t in txns:
            _abort_quietly(client.transactions, scope, stream, t)


def _abort_quietly(manager: Any, scope: str, stream: str, txn_id: int) -> None:
    try:
        manager.abort(scope, stream, txn_id)
    except PravegaError as exc:
        log.warning("could not abort transaction %032x on %s/%s: %s", txn_id, scope, stream, exc)


def _check_columns(schema: Any) -> tuple[bool, bool]:
    """``event`` (binary or string) and an optional ``routing_key`` (string); nothing else."""
    from pyspark.sql.types import BinaryType, StringType

    fields = {f.name: f.dataType for f in schema.fields}
    if "event" not in fields:
        raise PravegaDataSourceError(
            f"the DataFrame to write needs a column 'event' (binary or string); it has {', '.join(fields) or 'none'}")
    if not isinstance(fields["event"], (BinaryType, StringType)):
        raise PravegaDataSourceError(
            f"column 'event' must be binary or string, got {fields['event'].simpleString()}")
    key = fields.get("routing_key")
    if key is not None and not isinstance(key, StringType):
        raise PravegaDataSourceError(f"column 'routing_key' must be a string, got {key.simpleString()}")
    extra = sorted(set(fields) - {"event", "routing_key"})
    if extra:
        raise PravegaDataSourceError(
            f"the DataFrame to write has columns the pravega data source does not write: {', '.join(extra)} "
            f"(only 'event' and 'routing_key'); select them away or serialise them into 'event'")
    return isinstance(fields["event"], StringType), key is not None


# ---------------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------------


def register(spark: Any) -> None:
    """Make ``format("pravega")`` available in ``spark`` (a classic or a Spark Connect session)."""
    spark.dataSource.register(PravegaDataSource)
