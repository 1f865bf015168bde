"""``spark.read.format("pravega")`` and ``df.write.format("pravega")``: a PySpark (Spark 4) Python
data source over this provider's client.

Register it once per session with :func:`register` (classic PySpark or Spark Connect), then:

* **batch read** between two stream cuts: the driver resolves the cuts and plans the segment
  ranges between them (:func:`~airflow_provider_pravega.client.batch.plan_segment_ranges`, which
  follows scaling); each range is one Spark partition, read straight from the segment store as
  Arrow batches by :func:`read_ranges_arrow` (the export job reads its partitions with the same
  function). Rows: ``event`` (binary, or UTF-8 text with ``decode=text``), ``scope``, ``stream``,
  ``segment_id``, ``offset`` (where the event's header starts in its segment).
* **batch write**, exactly once: each task attempt writes its rows into one Pravega transaction
  (:class:`~airflow_provider_pravega.client.transactions.TransactionalWriter`, routed by the
  optional ``routing_key`` column, so one key's rows keep their order within a task), flushes it
  (every event acknowledged), and hands its transaction id to the driver in its commit message.
  The driver's ``commit`` renews every transaction, then commits them all; ``abort`` (a failed job)
  aborts them. A failed task attempt's transaction is aborted by the attempt itself, or, when its
  process died, is never committed and expires with its lease.

Options (all strings, as Spark passes them): see ``OPTIONS`` and the README's "Spark data source".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)

from airflow_provider_pravega.client.batch import SegmentRange, plan_segment_ranges, read_segment_range_arrow
from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.client.errors import PravegaError, SegmentStoreError
from airflow_provider_pravega.client.streamcut import HEAD, TAIL, StreamCut

__all__ = [
    "FORMAT",
    "OPTIONS",
    "PravegaDataSource",
    "PravegaDataSourceError",
    "read_ranges_arrow",
    "register",
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
    "start_stream_cut": "read: head/earliest (default), tail/latest, or a stream-cut text",
    "end_stream_cut": "read: tail/latest (default), head/earliest, or a stream-cut text",
    "decode": "read: binary (default) or text (UTF-8, event becomes a string)",
    "mode": "write: exactly_once (default) or at_least_once (plain appends; a retried task writes again)",
}
_CONNECTION_OPTIONS = ("tls", "trust_store", "validate_hostname", "transaction_lease_ms")
_CUT_WORDS = {"head": HEAD, "earliest": HEAD, "tail": TAIL, "latest": TAIL}
_MODES = ("exactly_once", "at_least_once")


class PravegaDataSourceError(PravegaError, ValueError):
    """Options or data the ``pravega`` data source cannot work with; nothing was read or written."""


# ---------------------------------------------------------------------------------------------
# Reading segment ranges as Arrow batches (shared with the export job)
# ---------------------------------------------------------------------------------------------


def read_ranges_arrow(config: Any, ranges: Sequence[SegmentRange], *, text: bool,
                      decode_error: type[Exception] = PravegaDataSourceError,
                      advice: str = "read it with decode=binary") -> Iterator[tuple[SegmentRange, Any, Any, int]]:
    """The events of ``ranges``, one range after the other, as ``(range, events, offsets,
    payload_bytes)`` per segment-store reply: ``events`` a pyarrow BinaryArray (StringArray with
    ``text``; an event that is not UTF-8 raises ``decode_error`` naming its position and
    ``advice``), ``offsets`` an int64 numpy array. No Python object per event."""
    import pyarrow as pa

    string = pa.string()
    for rng in ranges:
        for _, events, offsets, payload_bytes in read_segment_range_arrow(config, rng):
            if text:
                try:
                    events = events.cast(string)
                except pa.ArrowInvalid:
                    _raise_not_utf8(rng, events, offsets, decode_error, advice)
            yield rng, events, offsets, payload_bytes


def _raise_not_utf8(rng: SegmentRange, events: Any, offsets: Any, error: type[Exception], advice: str) -> None:
    for payload, offset in zip(events.to_pylist(), offsets.tolist(), strict=True):
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(
                f"the event at offset {offset} of segment {rng.segment_name} is not UTF-8 text ({exc.reason} at "
                f"byte {exc.start}); {advice}"
            ) from None
    raise error(f"an event of segment {rng.segment_name} is not UTF-8 text")


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
        event = "string" if self._text() else "binary"
        return f"event {event} not null, scope string not null, stream string not null, " \
               "segment_id bigint not null, offset bigint not null"

    def _text(self) -> bool:
        decode = (_option(self.options, "decode", "binary") or "binary").lower()
        if decode not in ("binary", "text"):
            raise PravegaDataSourceError(f"option decode must be 'binary' or 'text', got {decode!r}")
        return decode == "text"

    def reader(self, schema: Any) -> DataSourceReader:
        return PravegaBatchReader(self.options, self._text())

    def writer(self, schema: Any, overwrite: bool) -> PravegaBatchWriter:
        return PravegaBatchWriter(self.options, schema, overwrite)


class RangePartition(InputPartition):
    """One segment range (picklable)."""

    def __init__(self, rng: SegmentRange) -> None:
        super().__init__(rng.to_json())
        self.rng = rng


class PravegaBatchReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str], text: bool) -> None:
        self.config = connection_config(options)
        self.scope = _required(options, "scope", "the stream's scope")
        self.stream = _required(options, "stream", "the stream to read")
        self.start = _cut(options, "start_stream_cut", "head", self.scope, self.stream)
        self.end = _cut(options, "end_stream_cut", "tail", self.scope, self.stream)
        self.text = text

    def partitions(self) -> Sequence[InputPartition]:
        with _client(self.config) as client:
            _check_stream(client, self.scope, self.stream)
            ranges = _plan(client, self.start.resolve(client), self.end.resolve(client))
        # An empty range reads nothing: Spark still needs one partition for an empty frame.
        return [RangePartition(rng) for rng in ranges if rng.length != 0] or [
            RangePartition(SegmentRange(self.scope, self.stream, 0, 0, 0))]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow as pa

        rng: SegmentRange = partition.rng  # type: ignore[attr-defined]
        if rng.length == 0:
            return
        int64, string = pa.int64(), pa.string()
        # NOT NULL as the schema says (Spark checks nullability too).
        schema = pa.schema([pa.field("event", string if self.text else pa.binary(), nullable=False),
                            pa.field("scope", string, nullable=False), pa.field("stream", string, nullable=False),
                            pa.field("segment_id", int64, nullable=False), pa.field("offset", int64, nullable=False)])
        scope, stream = pa.scalar(rng.scope, string), pa.scalar(rng.stream, string)
        segment_id = pa.scalar(rng.segment_id, int64)
        for _, events, offsets, _ in read_ranges_arrow(self.config, [rng], text=self.text):
            n = len(events)
            yield pa.RecordBatch.from_arrays(
                [events, pa.repeat(scope, n), pa.repeat(stream, n), pa.repeat(segment_id, n), pa.array(offsets)],
                schema=schema)


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


class PravegaBatchWriter(DataSourceArrowWriter):
    """Exactly once by default: one transaction per task attempt, committed by the driver;
    ``mode=at_least_once``: plain appends, nothing to commit."""

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
        with _client(self.config) as client:
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
            # Renew once more: the lease runs from here until the driver commits.
            manager.ping(self.scope, self.stream, txn.txn_id)
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

    def commit(self, messages: Sequence[PravegaCommitMessage | None]) -> None:
        txns = [m.txn_id for m in messages if m is not None and m.txn_id is not None]
        if not txns:
            return
        with _client(self.config) as client:
            manager = client.transactions
            # Renew all first: if any ended (its lease ran out), commit none of them.
            from airflow_provider_pravega.client.transactions import TxnStatus

            lost = [t for t in txns if manager.ping(self.scope, self.stream, t) != TxnStatus.OPEN]
            if lost:
                for t in txns:
                    _abort_quietly(manager, self.scope, self.stream, t)
                raise PravegaDataSourceError(
                    f"{len(lost)} of the {len(txns)} write transactions on {self.scope}/{self.stream} ended before "
                    f"the job committed (lease of {self.config.transaction_lease_ms} ms ran out?): nothing was "
                    f"committed; raise option transaction_lease_ms")
            for t in txns:
                manager.commit(self.scope, self.stream, t, wait=False)
            for t in txns:
                manager.wait_for(self.scope, self.stream, t, (TxnStatus.COMMITTED,))

    def abort(self, messages: Sequence[PravegaCommitMessage | None]) -> None:
        txns = [m.txn_id for m in messages if m is not None and m.txn_id is not None]
        if not txns:
            return
        with _client(self.config) as client:
            for t in txns:
                _abort_quietly(client.transactions, self.scope, self.stream, t)


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
