"""What an export is asked to do (:class:`ExportSpec`, checked when it is made), what it reports
(:class:`ExportResult`) and the errors it raises: all an Airflow scheduler needs to check an
export operator's literal options when it parses a DAG, without PySpark."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_provider_pravega.client.errors import InvalidStreamCutError, PravegaError
from airflow_provider_pravega.client.ingest_location import check_state_scope
from airflow_provider_pravega.client.streamcut import HEAD, TAIL, StreamCut, StreamCutMismatchError

__all__ = [
    "COMPRESSION",
    "EVENT_FORMATS",
    "FORMATS",
    "ON_TRUNCATED",
    "PREVIOUS",
    "EventDecodeError",
    "ExportError",
    "ExportResult",
    "ExportSpec",
    "IntervalNotIngestedError",
    "OutputPathError",
    "check_cut_option",
    "check_target",
]

FORMATS = ("parquet", "jsonl", "csv", "delta")
EVENT_FORMATS = ("text", "json", "binary")
ON_TRUNCATED = ("fail", "head")
PREVIOUS = "previous"
#: A catalog table name for ``table=``: ``db.table`` or ``catalog.db.table`` (plain identifiers or
#: back-quoted parts).
_NAME_PART = r"(?:[A-Za-z_][A-Za-z0-9_]*|`[^`]+`)"
_TABLE_NAME = re.compile(rf"{_NAME_PART}(?:\.{_NAME_PART}){{1,2}}")
#: Why ``format="iceberg"`` is refused (docs/export.md, "Iceberg"): checked with Maven on 2026-11.
ICEBERG_UNAVAILABLE = (
    "format='iceberg' is not available yet: Apache Iceberg publishes no iceberg-spark-runtime for Spark 4.2 "
    "(Scala 2.13), the Spark this provider runs on (org.apache.iceberg:iceberg-spark-runtime-4.2_2.13 is not on "
    "Maven Central; Iceberg's Spark runtimes stop at Spark 4.1). Export with format='delta', or write files with "
    "format='parquet' and add them to an Iceberg table yourself; see docs/export.md (Iceberg)")
#: Codecs Spark's writers take per format (``compression``; None keeps Spark's default: snappy for
#: Parquet, none for JSON lines and CSV). Measured on 1M events of 200 bytes (task CPU of Spark's
#: Parquet writer): no compression saves ~18% of the writer's CPU for ~2.7x larger files, zstd
#: costs ~20% more CPU for smaller files than snappy; see benchmarks/bench_export.py.
COMPRESSION = {
    "parquet": ("none", "uncompressed", "snappy", "gzip", "lz4", "lz4_raw", "zstd", "brotli", "lzo"),
    "jsonl": ("none", "gzip", "bzip2", "deflate", "lz4", "snappy", "zstd"),
    "csv": ("none", "gzip", "bzip2", "deflate", "lz4", "snappy", "zstd"),
    "delta": (),  # the table's Parquet codec is the session's spark.sql.parquet.compression.codec
}


class ExportError(PravegaError):
    """An export that cannot be done as asked; nothing was written at the output path."""


class OutputPathError(ExportError):
    """The output path cannot be written, or already holds something this export must not replace."""


class IntervalNotIngestedError(ExportError):
    """``from_ingest``: the ingest recorded no committed range for the interval (not ingested yet,
    still committing, or forgotten)."""


class EventDecodeError(ExportError, ValueError):
    """An event does not decode as ``event_format`` says (not UTF-8, not a JSON object)."""


@dataclass(frozen=True)
class ExportSpec:
    """What to export where. Cuts: ``"previous"`` (start only), ``"head"``, ``"tail"``, a stream-cut
    text (Java ``StreamCut.asText()``), a StreamCut, or its JSON form (dict or string)."""

    scope: str
    stream: str
    #: The output directory, or with ``format="delta"`` the Delta table's location. Exactly one of
    #: ``output_path`` and ``table`` is given.
    output_path: str | None = None
    start_cut: Any = PREVIOUS
    end_cut: Any = TAIL
    format: str = "parquet"
    event_format: str = "text"
    export_id: str | None = None
    interval_key: str | None = None
    on_truncated: str = "fail"
    num_partitions: int | None = None
    #: Spark DDL schema of the JSON events (e.g. ``"sensor string, value double"``); inferred from
    #: ``json_sample_events`` events spread over the ranges when not given.
    json_schema: str | None = None
    json_sample_events: int = 1000
    #: Codec of the output files (see :data:`COMPRESSION`); None: Spark's default for the format.
    compression: str | None = None
    #: The id of an exactly-once ingest into this stream: export what its runs of ``interval_key``
    #: committed (its interval index), instead of ``start_cut``/``end_cut``.
    from_ingest: str | None = None
    #: The scope keeping this export's recorded cuts (None: the stream's own scope).
    state_scope: str | None = None
    #: ``from_ingest``: the scope keeping the ingest's state (None: ``state_scope``).
    ingest_state_scope: str | None = None
    #: ``format="delta"``: a catalog table (``db.table`` or ``catalog.db.table``) resolved by the
    #: session's catalog, instead of ``output_path``; created at the first export if missing.
    table: str | None = None

    def __post_init__(self) -> None:
        check_state_scope(self.state_scope)
        check_state_scope(self.ingest_state_scope, "ingest_state_scope")
        check_target(self.format, self.output_path, self.table)
        if self.event_format not in EVENT_FORMATS:
            raise ValueError(f"event_format must be one of {', '.join(EVENT_FORMATS)}, got {self.event_format!r}")
        if self.on_truncated not in ON_TRUNCATED:
            raise ValueError(f"on_truncated must be 'fail' or 'head', got {self.on_truncated!r}")
        if self.format == "csv" and self.event_format == "binary":
            raise ValueError("CSV files cannot hold binary events: use format='parquet' or 'jsonl', or "
                             "event_format='text'")
        if isinstance(self.end_cut, str) and self.end_cut.strip().lower() == PREVIOUS:
            raise ValueError("end_cut cannot be 'previous' (only the start cut continues a previous export)")
        check_cut_option("start_cut", self.start_cut, self.scope, self.stream)
        check_cut_option("end_cut", self.end_cut, self.scope, self.stream)
        if self.num_partitions is not None and (isinstance(self.num_partitions, bool) or self.num_partitions < 1):
            raise ValueError(f"num_partitions must be at least 1, got {self.num_partitions!r}")
        if self.json_sample_events < 1:
            raise ValueError(f"json_sample_events must be at least 1, got {self.json_sample_events}")
        if self.format == "delta" and self.compression is not None:
            raise ValueError("compression does not apply to format='delta': the table's files follow the session's "
                             "spark.sql.parquet.compression.codec")
        if self.format == "delta" and self.interval_key is None:
            raise ValueError("format='delta' writes each interval as a partition of the table: it needs an "
                             "interval_key (the operator passes the run's data interval)")
        if self.compression is not None and self.compression not in COMPRESSION[self.format]:
            raise ValueError(f"compression for {self.format} must be one of {', '.join(COMPRESSION[self.format])}, "
                             f"got {self.compression!r}")
        if self.interval_key is not None and not str(self.interval_key).strip():
            raise ValueError("interval_key must be a non-empty text (or None)")
        if self.from_ingest is not None:
            if not str(self.from_ingest).strip():
                raise ValueError("from_ingest must be an ingest id (or None)")
            if self.interval_key is None:
                raise ValueError("from_ingest exports one interval of the ingest: it needs an interval_key (the "
                                 "operator passes the run's data interval)")
            if not self.continues_previous or not (isinstance(self.end_cut, str) and self.end_cut.strip() == TAIL):
                raise ValueError("from_ingest takes the cuts from the ingest's interval index: leave start_cut and "
                                 "end_cut at their defaults")

    @property
    def effective_export_id(self) -> str:
        return self.export_id or f"{self.scope}/{self.stream}"

    @property
    def continues_previous(self) -> bool:
        return isinstance(self.start_cut, str) and self.start_cut.strip().lower() == PREVIOUS

    @property
    def target(self) -> str:
        """Where the export writes: ``output_path``, or the ``table``'s name."""
        return self.output_path if self.output_path is not None else str(self.table)


def check_target(format: str, output_path: Any, table: Any) -> None:
    """ValueError naming what is wrong with the format and where it writes: an unknown format (and
    ``iceberg``, see :data:`ICEBERG_UNAVAILABLE`), not exactly one of ``output_path`` and
    ``table``, ``table`` with another format than ``delta``, or a malformed path or table name.
    The operator calls it with literal values when the DAG is parsed."""
    if format == "iceberg":
        raise ValueError(ICEBERG_UNAVAILABLE)
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if (output_path is None) == (table is None):
        raise ValueError(
            "give exactly one of output_path (a directory, or with format='delta' a Delta table's location) and table "
            f"(a catalog table name, format='delta' only); got {'both' if table is not None else 'neither'}"
            + (f": output_path={output_path!r}, table={table!r}" if table is not None else ""))
    if table is not None:
        if format != "delta":
            raise ValueError(f"table={table!r} is a catalog table, written only with format='delta' (got "
                             f"format={format!r}); for {format} files give output_path")
        if not isinstance(table, str) or not _TABLE_NAME.fullmatch(table.strip()):
            raise ValueError(f"table must be a qualified catalog table name, 'db.table' or 'catalog.db.table' (e.g. "
                             f"'lake.readings'), got {table!r}")
    elif not isinstance(output_path, str) or not output_path.strip().rstrip("/"):
        raise ValueError(f"output_path must be a directory path or URL, got {output_path!r}")


def check_cut_option(option: str, value: Any, scope: str | None = None, stream: str | None = None) -> None:
    """InvalidStreamCutError naming ``option`` (``start_cut``/``end_cut``) when ``value`` cannot be a
    cut of ``scope/stream``; only its form is checked while the stream is not known yet (the
    operator checks a literal when the DAG is parsed, before its scope comes from the connection)."""
    if option == "start_cut" and isinstance(value, str) and value.strip().lower() == PREVIOUS:
        return
    try:
        if scope and stream:
            StreamCut.coerce(value, scope, stream, unbounded=HEAD if option == "start_cut" else TAIL, what=option)
        elif isinstance(value, Mapping) or isinstance(value, str) and value.strip().startswith("{"):
            StreamCut.from_json(value)
        elif isinstance(value, str) and value.strip().lower() not in (HEAD, TAIL) and value.strip() != "UNBOUNDED":
            StreamCut.from_text(value.strip())
        elif not isinstance(value, (str, StreamCut)):
            raise InvalidStreamCutError(f"a {type(value).__name__} is not a stream cut")
    except StreamCutMismatchError as exc:
        raise StreamCutMismatchError(exc.expected, exc.actual, option) from None
    except InvalidStreamCutError as exc:
        shown = value if not isinstance(value, str) or len(value) <= 80 else value[:77] + "..."
        raise InvalidStreamCutError(
            f"{option}={shown!r} is not a usable stream cut: {exc}. Give "
            f"{repr(PREVIOUS) + ', ' if option == 'start_cut' else ''}'head', 'tail', a stream-cut text (e.g. an "
            f"ingest's tail_cut) or its JSON form"
        ) from None


@dataclass
class ExportResult:
    """The XCom of an export (``to_dict``)."""

    export_id: str
    scope: str
    stream: str
    interval: str | None
    start_cut: str
    end_cut: str
    output_path: str
    format: str
    event_format: str
    events: int = 0
    bytes: int = 0
    files: list[str] = field(default_factory=list)
    ranges: int = 0
    reused_record: bool = False
    replaced_output: bool = False
    #: ``from_ingest``: the ingest runs whose committed ranges were exported (None: an empty run).
    ingest_runs: list[str | None] = field(default_factory=list)
    seconds: float = 0.0
    #: ``format="delta"``: the table version holding the interval (None for files).
    table_version: int | None = None
    #: ``format="delta"``: the interval's write was a no-op (Delta had its transaction version already).
    already_written: bool = False
    #: ``table=`` exports: the catalog table's name (``output_path`` is then its location, as the
    #: catalog reports it, or the name when it reports none).
    table: str | None = None
    #: Seconds per phase: ``prepare`` (checks, cuts, plan, what is at the output path), ``write``
    #: (the Spark job and its commit), ``publish`` (listing what was written, recording it).
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["events_per_second"] = round(self.events_per_second, 1)
        return out
