"""The options of the ``pravega`` data source: what each is (``OPTION_SPECS``, also the README's
"Spark data source"), for which uses, its parser and default; the check of all of them
(:func:`check_options`) as soon as Spark shows them to the data source; the values a read, a
write and the connection take from them; and :class:`PravegaDataSourceError`, for options or data
the data source cannot work with.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from airflow_provider_pravega.spark.worker_imports import missing_dependency

try:
    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.client.admin import build_retention_policy, build_scaling_policy
    from airflow_provider_pravega.client.batch import SegmentRange
    from airflow_provider_pravega.client.config import PravegaConnectionConfig
    from airflow_provider_pravega.client.errors import PravegaError
    from airflow_provider_pravega.client.ingest_location import check_state_scope
    from airflow_provider_pravega.client.streamcut import HEAD, TAIL, StreamCut
except ImportError as _missing:
    raise missing_dependency(_missing) from _missing

# Imports that one step needs only are made in that step: Spark imports the data source's modules
# in a new Python worker for each step of a use (its lookup, creation, planning, each task).

__all__ = [
    "ANY_USE",
    "OPTIONS",
    "OPTION_SPECS",
    "OptionSpec",
    "PravegaDataSourceError",
    "check_options",
    "connection_config",
    "connection_options",
    "segment_ranges_option",
]

#: The lease range Pravega 0.13's controller grants by default (its settings
#: controller.transaction.lease.count.min and .max); a server may be configured otherwise.
MIN_LEASE_MS, MAX_LEASE_MS = 10_000, 600_000


class PravegaDataSourceError(PravegaError, ValueError):
    """Options or data the ``pravega`` data source cannot work with; nothing was read or written."""


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
    return PravegaClient(config)


def _check_stream(client: Any, scope: str, stream: str) -> None:
    if not client.admin.stream_exists(scope, stream):
        raise PravegaDataSourceError(f"stream {scope}/{stream} does not exist (create it first)")


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
    return json.dumps([[[r.scope, r.stream, r.segment_id, r.start_offset, r.end_offset] for r in part]
                       for part in partitions], separators=(",", ":"))


def _stream_policies(options: Mapping[str, str]) -> tuple[Any, Any]:
    """The scaling and retention policies the options give a stream the write creates."""
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
