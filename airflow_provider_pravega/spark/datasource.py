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
* **batch write**, exactly once, through the provider's transactional stage (the ingest's run
  protocol, :class:`~airflow_provider_pravega.client.ingest.IngestCoordinator`): ``save()`` starts
  a run in a state keyed by the target stream and ``write_id``; each task attempt begins a Pravega
  transaction, registers it in the run (fenced), writes its rows (routed by the optional
  ``routing_key`` column, so one key's rows keep their order within a task) and flushes them, and
  while it writes it renews every transaction registered in the run. The driver's ``commit``
  records the commit point (the winning attempts' transactions, each holding its input
  partition), aborts every other registered transaction (failed and losing speculative
  attempts), commits, and records the run done; ``abort`` aborts them all. Nothing runs on an
  executor host after its tasks: no helper process, nothing on disk. With ``write_id``, a rerun
  after a crash skips the partitions whose transactions committed and writes the rest. The
  process that registered the data source with ``renew_writes`` keeps a write alive between its
  last task and its commit (:mod:`~airflow_provider_pravega.spark.write_renewal`).
* **streaming write**, exactly once per micro-batch, through the same stage: one run per batch id,
  started by its first task; tasks register under their input partition, so a replay skips the
  partitions committed and writes the rest.

Options (all strings, as Spark passes them): ``OPTION_SPECS``, also the README's "Spark data source".
Every one is checked (:func:`check_options`) on the driver as soon as Spark shows it to the data
source: names and values at ``load()``/``save()`` (the constructor); then, once Spark says which
use this is, that each applies to it (a read's ``schema()`` at ``load()``, a batch read's planning
at its first action, a streaming read's start, a write's ``save()``).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
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
    from airflow_provider_pravega import fault_points
    from airflow_provider_pravega.client.batch import (
        SegmentRange,
        advance_cut,
        plan_segment_ranges,
        read_segment_range_arrow,
    )
    from airflow_provider_pravega.client.config import PravegaConnectionConfig
    from airflow_provider_pravega.client.errors import PravegaError, SegmentStoreError
    from airflow_provider_pravega.client.streamcut import HEAD, TAIL, StreamCut
    from airflow_provider_pravega.spark import row_digest
    from airflow_provider_pravega.spark.row_digest import RowDigest
    from airflow_provider_pravega.spark.worker_heap import prepare_worker_heap
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
    "OPTION_SPECS",
    "OptionSpec",
    "check_options",
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
#: The lease range Pravega 0.13's controller grants by default (its settings
#: controller.transaction.lease.count.min and .max); a server may be configured otherwise.
MIN_LEASE_MS, MAX_LEASE_MS = 10_000, 600_000


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

#: The kinds of use an option can apply to (what Spark asks of the data source).
BATCH_READ, STREAM_READ, BATCH_WRITE, STREAM_WRITE = "batch read", "streaming read", "batch write", "streaming write"
READS = frozenset({BATCH_READ, STREAM_READ})
#: A read, batch or streaming (what ``schema()`` knows at ``load()``).
READ = "read"
WRITES = frozenset({BATCH_WRITE, STREAM_WRITE})
ANY_USE = READS | WRITES


@dataclass(frozen=True)
class OptionSpec:
    """One option: the uses it applies to, its parser (text -> value, or ValueError saying what
    it must be), what it means, its default, and the other option's value it needs, if any
    (``("create_stream", "true")``: without it the option would be ignored, so it is refused)."""

    name: str
    applies: frozenset[str]
    parse: Callable[[str], Any]
    doc: str
    default: str | None = None
    needs: tuple[str, str] | None = None


def _text(text: str) -> str:
    return text


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.lower() not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return text.lower()

    return parse


def _flag(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise ValueError("must be true or false")
    return text.lower() == "true"


def _positive_whole(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError("must be a positive whole number")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ValueError("must be a positive number of seconds")
    return value


def _state_scope(text: str) -> str:
    from airflow_provider_pravega.client.ingest import check_state_scope

    return check_state_scope(text) or text  # never empty: an empty option is an absent one


_CREATED = ("create_stream", "true")
_EXACTLY_ONCE = ("mode", "exactly_once")
_MODES = ("exactly_once", "at_least_once")
_DECODINGS = ("binary", "text", "json")

#: Every option of the data source (all strings, as Spark passes them). Spark lower-cases option
#: names, so they are all lower case; any other name is refused.
OPTION_SPECS: tuple[OptionSpec, ...] = (
    OptionSpec("controller", ANY_USE, _text, "controller URI, tcp://host:9090 or tls://host:9090 (required)"),
    OptionSpec("scope", ANY_USE, _text, "scope of the stream (required)"),
    OptionSpec("stream", ANY_USE, _text, "stream name (required)"),
    OptionSpec("username", ANY_USE, _text, "Basic-auth user"),
    OptionSpec("password", ANY_USE, _text, "its password (with auth_method Bearer: the keycloak.json)"),
    OptionSpec("auth_method", ANY_USE, _text, "Basic, or Bearer for Keycloak credentials", "Basic"),
    OptionSpec("keycloak_file", ANY_USE, _text, "keycloak.json path for Bearer credentials (implies Bearer)"),
    OptionSpec("tls", ANY_USE, _text, "true/false; also implied by a tls:// controller URI", "false"),
    OptionSpec("trust_store", ANY_USE, _text, "CA certificate (PEM file or directory) for TLS"),
    OptionSpec("validate_hostname", ANY_USE, _text, "true/false", "true"),
    OptionSpec("transaction_lease_ms", WRITES, _positive_whole,
               "lease of each task's transaction; Pravega's controller accepts "
               f"{MIN_LEASE_MS}..{MAX_LEASE_MS} ms unless configured otherwise (the embedded server: up to 120000)", "90000", _EXACTLY_ONCE),
    OptionSpec("start_stream_cut", READS, _text,
               "head/earliest, tail/latest, or a stream-cut text (a streaming read: where a new query starts)", "head"),
    OptionSpec("end_stream_cut", frozenset({BATCH_READ}), _text,
               "tail/latest, head/earliest, or a stream-cut text", "tail"),
    OptionSpec("decode", READS, _choice(*_DECODINGS),
               "binary, text (UTF-8, event becomes a string) or json (each event one JSON object, parsed into the "
               "columns of the schema given with .schema(...))", "binary"),
    OptionSpec("columns", READS, _text,
               "with decode binary or text: the columns to emit, comma-separated, of event, scope, stream, "
               "segment_id, offset (Python data sources get no column pruning, so each column costs its "
               "conversion to the JVM)"),
    OptionSpec("segment_ranges", frozenset({BATCH_READ}), _text,
               "for jobs that plan their own ranges: JSON list of partitions, each a list of ranges "
               "[scope, stream, segment_id, start_offset, end_offset or null], read instead of the ranges between "
               "start_stream_cut and end_stream_cut (not with those); partition i is the i-th list, its ranges "
               "read in the given order"),
    OptionSpec("max_events_per_trigger", frozenset({STREAM_READ}), _positive_whole,
               "at most this many events per micro-batch (default: no limit)"),
    OptionSpec("max_bytes_per_trigger", frozenset({STREAM_READ}), _positive_whole,
               "at most this many segment bytes (event headers included) per micro-batch; at least one event is "
               "always taken (default: no limit)"),
    OptionSpec("mode", WRITES, _choice(*_MODES),
               "exactly_once, or at_least_once (plain appends; a retried task writes again)", "exactly_once"),
    OptionSpec("writer_id", frozenset({STREAM_WRITE}), _text,
               "names the query's record of committed micro-batches (required; keep it with the checkpoint "
               "location: a new checkpoint needs a new writer_id)", None, _EXACTLY_ONCE),
    OptionSpec("write_id", frozenset({BATCH_WRITE}), _text,
               "names this write's record of committed input partitions (like Delta's txnAppId): a rerun of the "
               "same job with the same write_id after a crash skips the partitions already committed with the same "
               "rows and writes the rest, exactly once when the job's input partitions are deterministic; a "
               "partition with other rows is refused (new data needs a new write_id). Without it each save() is "
               "independent", None, _EXACTLY_ONCE),
    OptionSpec("stale_after_s", WRITES, _positive_seconds,
               "after a driver crash, how long a restarted query (or a rerun with the same write_id) waits before "
               "it finishes or rolls back the crashed commit", "60", _EXACTLY_ONCE),
    OptionSpec("state_scope", WRITES, _state_scope,
               "the scope keeping the write's record of committed partitions or micro-batches, created if missing "
               "(default: the stream's scope)", None, _EXACTLY_ONCE),
    OptionSpec("create_stream", WRITES, _flag,
               "true creates the scope and the stream when missing, with the policy options below (false: a "
               "missing stream is an error)", "false"),
    OptionSpec("scaling_policy", WRITES, _choice("fixed", "by_event_rate", "by_data_rate"),
               "the new stream's scaling: fixed, by_event_rate or by_data_rate", "fixed", _CREATED),
    OptionSpec("segments", WRITES, _text, "segments of a fixed policy", "1", _CREATED),
    OptionSpec("min_segments", WRITES, _text, "minimum segments of a rate policy", "1", _CREATED),
    OptionSpec("target_rate", WRITES, _text, "events/s or KiB/s per segment of a rate policy", None, _CREATED),
    OptionSpec("scale_factor", WRITES, _text, "how many segments one splits into under a rate policy", None,
               _CREATED),
    OptionSpec("retention_size_bytes", WRITES, _text, "keep at most this many bytes", None, _CREATED),
    OptionSpec("retention_time_ms", WRITES, _text, "keep data this many milliseconds", None, _CREATED),
)
_SPECS = {spec.name: spec for spec in OPTION_SPECS}
#: option -> what it means.
OPTIONS = {spec.name: spec.doc for spec in OPTION_SPECS}
#: Options Spark itself passes to the data source (lower-cased), and the uses it passes them for.
_SPARK_OPTIONS = {"checkpointlocation": frozenset({STREAM_WRITE})}
_CONNECTION_OPTIONS = ("tls", "trust_store", "validate_hostname", "transaction_lease_ms", "auth_method",
                       "keycloak_file")
_CUT_WORDS = {"head": HEAD, "earliest": HEAD, "tail": TAIL, "latest": TAIL}
#: The columns a read gives besides the event, with their Spark types.
_METADATA_COLUMNS = {"scope": "string", "stream": "string", "segment_id": "bigint", "offset": "bigint"}
#: Why an option that belongs to another use is refused, where a word helps more than the list of uses.
_HINTS = {
    ("end_stream_cut", STREAM_READ): "a streaming read has no end_stream_cut (it follows the stream's tail); "
                                     "use spark.read for a bounded read",
    ("segment_ranges", STREAM_READ): "option segment_ranges is for batch reads (spark.read), not streaming ones",
    ("max_events_per_trigger", BATCH_READ): "a batch read has no micro-batches: read a bounded range with "
                                            "end_stream_cut, or use spark.readStream",
    ("max_bytes_per_trigger", BATCH_READ): "a batch read has no micro-batches: read a bounded range with "
                                           "end_stream_cut, or use spark.readStream",
}


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


def _value(options: Mapping[str, str], name: str) -> Any:
    """Option ``name`` parsed by its spec (its default when absent; None without one)."""
    spec = _SPECS[name]
    text = _option(options, name, spec.default)
    if text is None:
        return None
    try:
        return spec.parse(text)
    except ValueError as exc:
        raise PravegaDataSourceError(f"option {name} {exc}, got {text!r}") from None


def check_options(options: Mapping[str, str], use: str | None = None) -> None:
    """Every option checked before anything is read or written: known names ("did you mean"),
    values, what each needs, and, once Spark says which ``use`` this is (BATCH_READ, STREAM_READ,
    BATCH_WRITE, STREAM_WRITE, or READ for either read; None: not known yet, as in the data
    source's constructor at ``load()``/``save()``), that each applies to it. An option that would
    be ignored is refused."""
    import difflib

    given = {name.lower(): name for name, value in options.items() if value is not None and str(value).strip()}
    for name in sorted(given):
        if name in ("path", "paths"):
            raise PravegaDataSourceError(
                f"the pravega data source takes no path (got {options[given[name]]!r} from load(path) or "
                "save(path)): name the stream with options scope and stream")
        if name in _SPARK_OPTIONS:
            if use is not None and use not in _SPARK_OPTIONS[name]:
                raise PravegaDataSourceError(f"option {name} is Spark's for a {' or a '.join(_SPARK_OPTIONS[name])}, "
                                             f"not a {use}: leave it out")
            continue
        if name not in _SPECS:
            close = difflib.get_close_matches(name, _SPECS, n=1)
            advice = f"did you mean {close[0]!r}?" if close else f"it takes {', '.join(_SPECS)}"
            raise PravegaDataSourceError(f"unknown option {name!r} for the pravega data source: {advice}")
        spec = _SPECS[name]
        if use is not None and not (use in spec.applies or (use == READ and spec.applies & READS)):
            hint = _HINTS.get((name, use))
            raise PravegaDataSourceError(hint or f"option {name} is for a {' or a '.join(sorted(spec.applies))}, "
                                                 f"not a {use}: leave it out")
        _value(options, name)
    for name in sorted(given):
        spec = _SPECS.get(name)
        if spec is None or spec.needs is None:
            continue
        other, wanted = spec.needs
        if _value(options, other) != _SPECS[other].parse(wanted):
            raise PravegaDataSourceError(f"option {name} only applies with {other}={wanted}; without it, it would "
                                         f"be ignored: set {other}={wanted} or leave {name} out")
    connection_config(options)
    scope = _required(options, "scope", "the stream's scope")
    stream = _required(options, "stream", "the stream")
    if use is None or use == READ or use in READS:
        _read_options(options, scope, stream)
    if _value(options, "create_stream"):
        _stream_policies(options)


def _read_options(options: Mapping[str, str], scope: str, stream: str) -> None:
    """What only a read's options say together: cuts of this stream, a plan, decode and columns."""
    _segment_ranges(options, scope, stream)
    _cut(options, "start_stream_cut", scope, stream)
    _cut(options, "end_stream_cut", scope, stream)
    _fixed_columns(options, _value(options, "decode"))


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
    """The options that give :func:`connection_config` back ``config`` for a read (jobs that read
    through this data source with a connection they already hold; a read has no transactions, so
    no ``transaction_lease_ms``)."""
    options = {"controller": config.controller_uri, "validate_hostname": str(config.validate_hostname).lower()}
    if config.username is not None:
        options["username"] = config.username
    if config.password is not None:
        options["password"] = config.password
    if config.bearer:
        options["auth_method"] = config.auth_method
    if config.keycloak_file is not None:
        options["keycloak_file"] = config.keycloak_file
    if config.trust_store is not None:
        options["trust_store"] = config.trust_store
    return options


def _cut(options: Mapping[str, str], name: str, scope: str, stream: str) -> StreamCut:
    default = _SPECS[name].default
    assert default is not None
    given = options.get(name)
    if given is not None and not str(given).strip():  # not the default: an empty template is a missing value
        raise PravegaDataSourceError(
            f"option {name} is empty (a template that rendered to nothing, such as a missing XCom?): give 'head', "
            f"'tail', a stream-cut text or its JSON form, or leave the option out to read from the {default}")
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


@contextmanager
def _first_line() -> Iterator[None]:
    """PySpark shows an error the data source raises on the driver (at ``load()``, ``save()``,
    planning) as its Python worker's traceback after its own prefix, so the provider's message
    would come last. In such a worker, which exits after the error, the traceback is left out:
    the message follows the prefix on the first line."""
    try:
        yield
    except PravegaError:
        if os.environ.get("SPARK_PYTHON_RUNTIME") == "PYTHON_WORKER":
            sys.tracebacklimit = 0
        raise


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

    def __init__(self, options: dict[str, str]) -> None:  # in a planning worker
        prepare_worker_heap()
        super().__init__(options)
        with _first_line():  # at load() and save(), before Spark knows which use this is
            check_options(self.options)

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:  # asked at load() of a read without .schema(...)
        with _first_line():
            check_options(self.options, READ)
            return self._schema()

    def _schema(self) -> str:
        decode = _value(self.options, "decode")
        if decode == "json":
            raise PravegaDataSourceError(
                "decode=json needs the events' fields as a schema, e.g. spark.read.format('pravega')"
                ".schema('sensor string, temperature double, offset bigint').option('decode', 'json'); "
                f"columns named {', '.join(_METADATA_COLUMNS)} are filled from the event's position")
        types = _fixed_columns(self.options, decode)
        return ", ".join(f"{name} {kind} not null" for name, kind in types.items())

    def reader(self, schema: Any) -> DataSourceReader:  # planning the first action
        with _first_line():
            check_options(self.options, BATCH_READ)
            return PravegaBatchReader(self.options, Decoding.of(self.options, schema))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # the query's start
        try:
            check_options(self.options, STREAM_READ)
            return PravegaStreamReader(self.options, Decoding.of(self.options, schema))
        except PravegaError as exc:
            return _RefusedStreamRead(exc)

    def writer(self, schema: Any, overwrite: bool) -> PravegaBatchWriter:  # save()
        with _first_line():
            check_options(self.options, BATCH_WRITE)
            return PravegaBatchWriter(self.options, schema, overwrite, renewal=getattr(self, "renewal", None))

    def streamWriter(self, schema: Any, overwrite: bool) -> PravegaStreamWriter:  # the query's start
        with _first_line():
            check_options(self.options, STREAM_WRITE)
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


def _stream_policies(options: Mapping[str, str]) -> tuple[Any, Any]:
    """The scaling and retention policies the options give a stream the write creates."""
    from airflow_provider_pravega.client.admin import build_retention_policy, build_scaling_policy

    try:
        scaling = build_scaling_policy(
            _value(options, "scaling_policy"), segments=_option(options, "segments"),
            min_segments=_option(options, "min_segments"), target_rate=_option(options, "target_rate"),
            scale_factor=_option(options, "scale_factor"))
        retention = build_retention_policy(_option(options, "retention_size_bytes"),
                                           _option(options, "retention_time_ms"))
    except (TypeError, ValueError) as exc:
        raise PravegaDataSourceError(f"pravega data source option: {exc}") from None
    return scaling, retention


def _create_stream(client: Any, scope: str, stream: str, options: Mapping[str, str]) -> None:
    """The scope and stream, created when missing with the policies in the options (an existing
    stream is left as it is, whatever its policies)."""
    scaling, retention = _stream_policies(options)
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
    unit: str | None = None  # the input partition it holds (a write with write_id)
    rows: dict[str, Any] | None = None  # what that partition held: its row count and digest (row_digest.py)
    skipped: bool = False  # the partition held the rows an earlier job committed under the write_id


class _TaskWrites:
    """What batch and streaming writes share: the options checked on the driver, and each task
    attempt writing its rows into one transaction (or plainly, at least once)."""

    def __init__(self, options: Mapping[str, str], schema: Any, overwrite: bool) -> None:
        if overwrite:
            raise PravegaDataSourceError("a Pravega stream is append-only: use mode('append'), not overwrite")
        self.config = connection_config(options)
        self.scope = _required(options, "scope", "the stream's scope")
        self.stream = _required(options, "stream", "the stream to write")
        self.mode = _value(options, "mode")
        self.event_text, self.has_key = _check_columns(schema)
        self.stale_after_s = _value(options, "stale_after_s")
        self.write_id = _option(options, "write_id")
        self.state_scope = _value(options, "state_scope")
        self.run_id: str | None = None  # the run of a batch write (see PravegaBatchWriter)
        self.owner: str | None = None
        create = _value(options, "create_stream")
        with _client(self.config) as client:
            if create:
                _create_stream(client, self.scope, self.stream, options)
            _check_stream(client, self.scope, self.stream)
            if self.mode == "exactly_once":
                # The lease the tasks will ask for, asked now: a controller's limits are its configuration
                # (MIN_LEASE_MS..MAX_LEASE_MS by default, up to 120000 ms on the embedded server), which
                # no call but a begin tells, and a lease it refuses would fail every task instead of save().
                txn = _begin(client.transactions, self.scope, self.stream, self.config.transaction_lease_ms)
                _abort_quietly(client.transactions, self.scope, self.stream, txn.txn_id)

    def write(self, iterator: Iterator[Any]) -> PravegaCommitMessage:
        prepare_worker_heap()
        if self.mode == "at_least_once":
            return self._write_at_least_once(iterator)
        from pyspark import TaskContext

        from airflow_provider_pravega.client.ingest import known_files

        if self.run_id is None:
            return self._write_micro_batch(iterator)
        task = TaskContext.get()
        unit = f"partition-{task.partitionId():05d}" if self.write_id is not None and task is not None else None
        with _client(self.config) as client:
            store = _write_state(client, self.scope, self.stream, self.write_id, self.state_scope, create=False)
            try:
                committed = known_files(store, store.fetch(), [unit]).get(unit) if unit is not None else None
                if committed is not None:
                    self._check_retry(unit, committed, iterator)
                    return PravegaCommitMessage(self.scope, self.stream, None, 0, unit, skipped=True)
                digest = RowDigest(self._digest_columns()) if unit is not None else None
                txn_id, count = self._write_in_run(client, store, self._coordinator(client, store), self.run_id,
                                                   iterator, digest)
            finally:
                store.close()
        return PravegaCommitMessage(self.scope, self.stream, txn_id, count, unit,
                                    rows=digest.identity() if digest is not None else None)

    def _digest_columns(self) -> tuple[str, ...]:
        return ("event", "routing_key") if self.has_key else ("event",)

    def _check_retry(self, unit: str, committed: Mapping[str, Any], batches: Iterator[Any]) -> None:
        """An input partition an earlier job committed under this write_id: passes if it holds the
        same rows (a retry: nothing to write), refused if not (new rows under a used id would
        otherwise be dropped without a word)."""
        digest = RowDigest(self._digest_columns())
        for batch in batches:
            digest.add(batch)
        now = digest.identity()
        if committed.get("digest") == now["digest"] and committed.get("events") == now["events"]:
            return
        raise PravegaDataSourceError(
            f"write_id {self.write_id!r}: input partition {unit} holds other rows than the job that committed it "
            f"under this id ({row_digest.describe(now)} now; {row_digest.describe(committed)} committed by run "
            f"{committed.get('run')}): nothing of this write is committed. A write_id names one write: a retry of "
            f"the same rows skips what was committed, new rows need a new write_id (e.g. the job's name and its "
            f"batch, such as its date)")

    def _write_in_run(self, client: Any, store: Any, coord: Any, run_id: str, iterator: Iterator[Any],
                      digest: RowDigest | None = None) -> tuple[int, int]:
        """The task side of the transactional stage, for batch and streaming writes alike: begin a
        transaction, register it in ``run_id`` (fenced: refused once the run reached its commit
        point or was taken over), write the rows, flush. While it writes the task renews every
        transaction registered in the run, so a finished task's transaction stays alive while any
        task of the job still runs, on no host of its own. ``digest`` is fed the rows written.
        Returns (transaction id, events)."""
        from airflow_provider_pravega.client.ingest import RunKeeper, register_txn

        manager = client.transactions
        txn = _begin(manager, self.scope, self.stream, self.config.transaction_lease_ms)
        writer = manager.writer(self.scope, self.stream, txn, check_open=False)
        keeper = None
        try:
            register_txn(store, run_id, f"{txn.txn_id:032x}", self.owner)
            fault_points.reached("task_registered")
            keeper = RunKeeper(coord, run_id)
            keeper.start()
            count = self._write_rows(iterator, writer.write_event, digest)
            writer.flush()
            keeper.check()
            manager.ping(self.scope, self.stream, txn.txn_id)  # a full lease from here to the commit
        except BaseException:
            _abort_quietly(manager, self.scope, self.stream, txn.txn_id)  # else the lease ends it
            raise
        finally:
            if keeper is not None:
                keeper.stop()
            writer.close()
        return txn.txn_id, count

    def _write_micro_batch(self, iterator: Iterator[Any]) -> PravegaCommitMessage:
        """A streaming write's task, through the transactional stage like a batch write's: the
        micro-batch's run (one per batch id, the same in every attempt, started by its first
        task) registers this task's transaction under its input partition; a partition a replay
        finds committed is not written again."""
        from pyspark import TaskContext

        task = TaskContext.get()
        batch = task.getLocalProperty("streaming.sql.batchId") if task is not None else None
        if batch is None:  # Spark sets it for every micro-batch's tasks; without it no replay can be told
            raise PravegaDataSourceError("a streaming write task without Spark's micro-batch id "
                                         "(local property streaming.sql.batchId): use mode=at_least_once here")
        batch_id = int(batch)
        unit = f"partition-{task.partitionId():05d}"
        run_id = micro_batch_run(batch_id)
        with _client(self.config) as client:
            store = self._stream_state(client)
            try:
                coord = self._coordinator(client, store)
                if _committed_before(store, batch_id) or not coord.join_unit_run(run_id, unit):
                    log.info("writer %s: partition %s of micro-batch %d was committed before (a replay): skipped",
                             self.writer_id, unit, batch_id)
                    return PravegaCommitMessage(self.scope, self.stream, None, 0, unit)
                txn_id, count = self._write_in_run(client, store, coord, run_id, iterator)
            finally:
                store.close()
        return PravegaCommitMessage(self.scope, self.stream, txn_id, count, unit)

    def _stream_state(self, client: Any) -> Any:
        from airflow_provider_pravega.client.ingest import open_ingest_state

        return open_ingest_state(client, self.scope, self.stream, f"spark-stream:{self.writer_id}",
                                 stale_after_s=self.stale_after_s, state_scope=self.state_scope)

    def _coordinator(self, client: Any, store: Any) -> Any:
        """The transactional stage's coordinator for this write's run (driver and tasks alike)."""
        from airflow_provider_pravega.client.ingest import IngestCoordinator

        return IngestCoordinator(store, client.transactions, self.scope, self.stream, owner=self.owner,
                                 stale_after_s=self.stale_after_s, lease_ms=self.config.transaction_lease_ms,
                                 lease_keeper=client.lease_keeper, crash_hook=fault_points.reached)

    def _write_at_least_once(self, iterator: Iterator[Any]) -> PravegaCommitMessage:
        """Plain appends (the provider's EventWriter, routed like the official writer): visible at
        once, no transaction; a retried task writes its rows again (at least once)."""
        with _client(self.config) as client, client.event_writer(self.scope, self.stream) as writer:
            count = self._write_rows(iterator, writer.write_event)
            writer.flush()
        return PravegaCommitMessage(self.scope, self.stream, None, count)

    def _write_rows(self, batches: Iterator[Any], write: Any, digest: RowDigest | None = None) -> int:
        from pyspark import TaskContext

        count = 0
        for batch in batches:
            if digest is not None:
                digest.add(batch)
            events = batch.column("event").to_pylist()
            if self.event_text:
                events = [e.encode("utf-8") if e is not None else None for e in events]
            keys = batch.column("routing_key").to_pylist() if self.has_key else [None] * len(events)
            for event, key in zip(events, keys, strict=True):
                if event is None:  # a task cannot know its rows' position in the whole DataFrame
                    task = TaskContext.get()
                    where = f" of task {task.partitionId()} (counted from 0 within its partition)" if task else ""
                    raise PravegaDataSourceError(f"row {count}{where} has a null event; events cannot be null: "
                                                 "filter them out, e.g. .where('event IS NOT NULL')")
                write(event, key)
                count += 1
        return count


def _note(message: str) -> None:
    """Log at INFO from the driver's side of a write. Spark runs a Python data source's commit in a
    Python worker of its own, whose logging nobody configured: there the line goes to stderr, which
    Spark's driver log (and a session the provider started, its JVM logger) shows."""
    if log.hasHandlers():
        log.info("%s", message)
    else:
        print(f"INFO {log.name}: {message}", file=sys.stderr, flush=True)


class PravegaBatchWriter(_TaskWrites, DataSourceArrowWriter):
    """Exactly once by default: a run of the transactional stage (see the module doc), started
    at ``save()``, one transaction per task attempt, committed by the driver; ``mode=at_least_once``:
    plain appends, nothing to commit."""

    def __init__(self, options: Mapping[str, str], schema: Any, overwrite: bool, renewal: Any = None) -> None:
        super().__init__(options, schema, overwrite)
        self.renewal_key: str | None = None
        if self.mode != "exactly_once":
            return
        import uuid

        from airflow_provider_pravega.client.ingest import IngestError, check_timing

        try:
            check_timing(self.stale_after_s, self.config.transaction_lease_ms)
        except IngestError as exc:
            raise PravegaDataSourceError(f"option stale_after_s: {exc}") from None
        self.owner = f"spark-write:{self.write_id or '-'}:{uuid.uuid4().hex[:12]}"
        self.renewal = renewal
        with _client(self.config) as client:
            self._announce(client, run_id=None)  # a rerun's renewer lets go of the earlier run first
            store = _write_state(client, self.scope, self.stream, self.write_id, self.state_scope)
            try:
                coord = self._coordinator(client, store)
                if self.write_id is None:  # independent jobs: none recovers another's run, dead ones are dropped
                    coord.drop_dead_runs(DEAD_WRITE_AFTER_S)
                    self.run_id = coord.start_open_run(wait_for_others_s=None)
                else:  # a rerun first finishes or rolls back the crashed job's run
                    self.run_id = coord.start_open_run(wait_for_others_s=2 * self.stale_after_s + 60)
            finally:
                store.close()
            self._announce(client, run_id=self.run_id)

    def _announce(self, client: Any, run_id: str | None, *, retire: bool = False) -> None:
        """Tell the registering process's renewer (``register(spark, renew_writes=...)``) about this
        write's run, or that it is over. Best effort: without it the lease alone bridges the gap."""
        renewal = self.renewal
        if renewal is None:
            return
        from airflow_provider_pravega.spark import write_renewal

        if renewal.controller != self.config.controller_uri:
            if not retire and run_id is None:
                log.warning("write into %s/%s: its controller %s is not the renewer's (%s): only its lease "
                            "keeps it alive between its last task and its commit", self.scope, self.stream,
                            self.config.controller_uri, renewal.controller)
            return
        if self.renewal_key is None:
            self.renewal_key = write_renewal.write_key(renewal, self.scope, self.stream, self.write_id, self.owner)
        write = None if retire else {
            "scope": self.scope, "stream": self.stream, "run_id": run_id, "owner": self.owner,
            "ingest_id": f"spark-write:{self.write_id}" if self.write_id is not None else "spark-write",
            "state_scope": self.state_scope, "stale_after_s": self.stale_after_s,
            "lease_ms": self.config.transaction_lease_ms}
        try:
            write_renewal.announce(client, renewal, self.renewal_key, write)
        except PravegaError as exc:
            log.warning("write into %s/%s: could not reach the write renewer's registry in scope %s (%s): only "
                        "its lease keeps it alive between its last task and its commit", self.scope, self.stream,
                        renewal.scope, exc)

    def commit(self, messages: Sequence[PravegaCommitMessage | None]) -> None:
        if self.mode != "exactly_once":
            return
        from airflow_provider_pravega.client.ingest import WriteResult

        fault_points.reached("job_commit")
        done = [m for m in messages if m is not None and m.txn_id is not None]
        hex_ids = [f"{m.txn_id:032x}" for m in done]
        holds = {f"{m.txn_id:032x}": [m.unit] if m.unit else [] for m in done}
        units = {m.unit: m.rows for m in done if m.unit is not None and m.rows is not None}
        skipped = sorted(m.unit for m in messages if m is not None and m.skipped and m.unit is not None)
        if skipped:
            _note(f"write {self.write_id} into {self.scope}/{self.stream}: {len(skipped)} input partition(s) hold the "
                  f"rows an earlier job committed under this write_id, so they are not written again ("
                  + ", ".join(skipped[:5]) + (", …" if len(skipped) > 5 else "") + ")")
        with _client(self.config) as client:
            store = _write_state(client, self.scope, self.stream, self.write_id, self.state_scope, create=False)
            try:
                coord = self._coordinator(client, store)
                _, status, returned = coord.commit_written(
                    self.run_id, WriteResult(hex_ids, sum(m.events for m in done), holds=holds, units=units or None))
            finally:
                store.close()
                self._announce(client, self.run_id, retire=True)
        if returned or status == "LOST":
            raise PravegaDataSourceError(
                f"the transactions of {len(returned) or len(done)} write task(s) on {self.scope}/{self.stream} were "
                f"aborted before the job committed (their leases of {self.config.transaction_lease_ms} ms lapsed: "
                f"no task of the job ran to renew them, and the job's commit came later than that); the others "
                f"were committed. "
                + (f"Run the job again with the same write_id={self.write_id!r}: it writes only the input partitions "
                   f"not committed ({', '.join(returned[:5])})." if self.write_id else
                   "Without option write_id a rerun would write the committed rows again; give each job a write_id "
                   "so a rerun writes only what is missing, or raise transaction_lease_ms."))

    def abort(self, messages: Sequence[PravegaCommitMessage | None]) -> None:
        if self.mode != "exactly_once":
            return
        with _client(self.config) as client:
            store = _write_state(client, self.scope, self.stream, self.write_id, self.state_scope, create=False)
            try:
                self._coordinator(client, store).abandon(self.run_id)  # aborts every registered transaction
            finally:
                store.close()
                self._announce(client, self.run_id, retire=True)


class PravegaStreamWriter(_TaskWrites, DataSourceStreamArrowWriter):
    """Exactly once per micro-batch, through the transactional stage: micro-batch N is the run
    ``batch-N`` in a state keyed by the target stream and ``writer_id`` (the same in every attempt
    and replay of N). Tasks start it, register their transaction under their input partition and
    renew the run while they write; the driver's commit of N is the stage's commit point. A batch
    Spark replays after a crash between this commit and Spark's own commit log finds its partitions
    committed (nothing is written twice); a commit interrupted after its commit point is finished by
    the replay; a partition whose transaction lapsed after the commit point fails the query, and
    the replay writes only it."""

    def __init__(self, options: Mapping[str, str], schema: Any, overwrite: bool) -> None:
        super().__init__(options, schema, overwrite)
        self.writer_id = _option(options, "writer_id")
        if self.mode == "exactly_once" and self.writer_id is None:
            raise PravegaDataSourceError(
                "an exactly-once streaming write needs option writer_id (a name for this query's record of "
                "committed micro-batches, kept with its checkpoint location), or mode=at_least_once")
        self.stale_after_s = _value(options, "stale_after_s")
        self.owner = f"spark-stream:{self.writer_id}"  # every attempt of the query: a batch's run has one owner
        if self.mode == "exactly_once":
            from airflow_provider_pravega.client.ingest import IngestError, check_timing

            try:
                check_timing(self.stale_after_s, self.config.transaction_lease_ms)
            except IngestError as exc:
                raise PravegaDataSourceError(f"option stale_after_s: {exc}") from None

    def commit(self, messages: Sequence[PravegaCommitMessage | None], batchId: int) -> None:
        """The micro-batch's commit point and commits (the stage's driver side). A partition whose
        transaction was lost after the commit point fails the query: restarted from its checkpoint,
        it replays the batch and writes only the partitions not committed."""
        if self.mode != "exactly_once":
            return
        from airflow_provider_pravega.client.ingest import WRITING, WriteResult

        done = [m for m in messages if m is not None and m.txn_id is not None]
        hex_ids = [f"{m.txn_id:032x}" for m in done]
        run_id = micro_batch_run(batchId)
        with _client(self.config) as client:
            store = self._stream_state(client)
            try:
                coord = self._coordinator(client, store)
                run = store.fetch()["runs"].get(run_id)
                if run is None or run["phase"] != WRITING:
                    # Every partition was committed before (a replay), or an earlier attempt's
                    # commit is to be finished: nothing of this attempt is in it.
                    if run is not None:
                        coord.finish_past_commit_point(run_id, run)
                    for m in done:
                        _abort_quietly(client.transactions, self.scope, self.stream, m.txn_id)
                    log.info("micro-batch %d of writer %s: committed before (a replay)", batchId, self.writer_id)
                    return
                _, status, returned = coord.commit_written(
                    run_id, WriteResult(hex_ids, sum(m.events for m in done),
                                        holds={f"{m.txn_id:032x}": [m.unit] for m in done}))
                coord.recover_stale_runs()  # runs a zombie task started after its batch committed
            finally:
                store.close()
        if returned or status == "LOST":
            raise PravegaDataSourceError(
                f"micro-batch {batchId} of writer {self.writer_id}: the transactions of input partition(s) "
                f"{', '.join(returned[:5]) or 'all'} were aborted after its commit point (leases of "
                f"{self.config.transaction_lease_ms} ms lapsed before the commit); the other partitions were "
                "committed. Restart the query from its checkpoint location: it replays this micro-batch and "
                "writes only the partitions not committed.")

    def abort(self, messages: Sequence[PravegaCommitMessage | None], batchId: int) -> None:
        if self.mode != "exactly_once":
            return
        with _client(self.config) as client:
            store = self._stream_state(client)
            try:
                run = store.fetch()["runs"].get(micro_batch_run(batchId))
                if run is not None and run["phase"] == "WRITING":
                    self._coordinator(client, store).abandon(micro_batch_run(batchId))
            finally:
                store.close()
        _abort_all(self.config, self.scope, self.stream, messages)


def micro_batch_run(batch_id: int) -> str:
    """The run of a streaming micro-batch: the same id in every attempt and replay of the batch."""
    return f"batch-{batch_id:020d}"


def _committed_before(store: Any, batch_id: int) -> bool:
    """Versions before 0.4 recorded a streaming write's micro-batch as one "file": a replay of a
    batch they committed is skipped whole."""
    from airflow_provider_pravega.client.ingest import known_files

    old = known_files(store, store.fetch(), ["micro-batch"]).get("micro-batch")
    return old is not None and int(old.get("fp") or -1) >= batch_id


#: A run of a write without write_id whose driver stopped heartbeating this long ago is dropped.
DEAD_WRITE_AFTER_S = 24 * 3600


def _write_state(client: Any, scope: str, stream: str, write_id: str | None, state_scope: str | None = None, *,
                 create: bool = True) -> Any:
    """The state of batch writes into ``scope/stream`` (kept in ``state_scope``; default: the
    stream's scope): one per ``write_id``, one shared by writes without one (independent runs:
    their units are never recorded)."""
    from airflow_provider_pravega.client.ingest import open_ingest_state, open_state_store, state_location

    ingest_id = f"spark-write:{write_id}" if write_id is not None else "spark-write"
    if create:
        return open_ingest_state(client, scope, stream, ingest_id, state_scope=state_scope)
    return open_state_store(client, *state_location(scope, stream, ingest_id, state_scope), create=False)


def _begin(manager: Any, scope: str, stream: str, lease_ms: int) -> Any:
    """A transaction with the options' lease; a lease the controller refuses is named as the option."""
    import re

    try:
        return manager.begin(scope, stream, lease_ms)
    except PravegaError as exc:
        text = str(exc)
        maximum = re.search(r"max(?:imum)?(?: value)?(?: is| of) (\d+)", text)
        if "minimum lease" in text:
            problem = (f"is below the controller's minimum lease: give at least {MIN_LEASE_MS} ms (Pravega's default "
                       f"controller.transaction.lease.count.min) and at most the controller's maximum "
                       f"(controller.transaction.lease.count.max, {MAX_LEASE_MS} ms by default)")
        elif maximum and "lease" in text:
            problem = (f"is above the controller's maximum lease of {maximum.group(1)} ms (its "
                       f"controller.transaction.lease.count.max): give at most {maximum.group(1)} ms and at least "
                       f"{MIN_LEASE_MS} ms (Pravega's default minimum)")
        else:
            raise
        raise PravegaDataSourceError(f"option transaction_lease_ms={lease_ms} {problem}") from None


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


#: Session -> the class it has as ``format("pravega")`` (weakly held: a new session is a new object).
_REGISTERED: weakref.WeakKeyDictionary[Any, type] = weakref.WeakKeyDictionary()


def register(spark: Any, *, renew_writes: Mapping[str, str] | None = None) -> Any:
    """Make ``format("pravega")`` available in ``spark`` (a classic or a Spark Connect session).

    ``renew_writes``: connection options (``controller``, ``scope``, and ``username``/``password``,
    ``tls``... as a write takes them). This process then runs a renewer thread that keeps every
    exactly-once batch write of the session alive between its last task and its commit (see
    :mod:`~airflow_provider_pravega.spark.write_renewal`), through a registry in that scope.
    Returns the renewer (``.stop()`` ends it; it is a daemon thread) or None.

    Without ``renew_writes``, a session that has this plain source already is left as it is (each
    export reads through it; registering it again costs 10-25 ms)."""
    if renew_writes is None:
        if _REGISTERED.get(spark) is not PravegaDataSource:
            spark.dataSource.register(PravegaDataSource)
            _REGISTERED[spark] = PravegaDataSource
        return None
    from airflow_provider_pravega.spark import write_renewal

    with _first_line():
        config = connection_config(renew_writes)
        scope = _required(renew_writes, "scope", "the scope of the write renewer's registry")
        with _client(config) as client:  # unreachable or refused: said now, not at the first write
            client.admin.create_scope(scope)
            write_renewal.open_registry(client, scope).close()
    renewer = write_renewal.WriteRenewer(config, scope)
    # A subclass carrying the renewer's token (pickled by value with the class, no secret in it).
    renewed = type(PravegaDataSource.__name__, (PravegaDataSource,),
                   {"renewal": renewer.renewal, "__module__": __name__,
                    "__qualname__": f"{PravegaDataSource.__qualname__}.renewed", "__doc__": PravegaDataSource.__doc__})
    spark.dataSource.register(renewed)
    _REGISTERED[spark] = renewed
    renewer.start()
    return renewer
