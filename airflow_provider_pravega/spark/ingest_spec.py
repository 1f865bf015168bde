"""What a file ingest is asked to do (:class:`IngestSpec`, its options checked once for the
operator and the job alike) and what a run reports (:class:`IngestResult`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from airflow_provider_pravega.client.ingest import MIN_STALE_AFTER_S, UNKNOWN_COMMITS
from airflow_provider_pravega.client.ingest_errors import IngestError
from airflow_provider_pravega.client.ingest_location import check_state_scope


FORMATS = ("jsonl", "csv", "parquet", "text")


#: Formats read as byte ranges of whole lines: a file of these that grows is tailed (see measure_pieces).
LINE_FORMATS = ("jsonl", "text")


MODES = ("exactly_once", "at_least_once")

#: The default of :attr:`IngestSpec.in_process_max_bytes` where the deployment sets none: a day of a
#: few MB is written by the task in less time than a Spark session takes to start, and no JVM,
#: Connect session or Python daemon is paid for it; above it, Spark's parallelism pays.
IN_PROCESS_MAX_BYTES = 16 * 1024 * 1024
#: The deployment's own default: Airflow's ``[pravega] ingest_in_process_max_bytes`` (the operator
#: reads Airflow's configuration), which the ingest job outside Airflow reads from this variable.
IN_PROCESS_MAX_BYTES_VARIABLE = "AIRFLOW__PRAVEGA__INGEST_IN_PROCESS_MAX_BYTES"


def check_in_process_max_bytes(value: Any, what: str) -> int:
    """``value`` as a byte count (0 or more), or a ValueError naming ``what`` it came from."""
    try:
        limit = int(str(value).strip()) if isinstance(value, str) else value
    except ValueError:
        limit = None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"{what} must be a whole number of bytes, 0 or more (0: always Spark), got {value!r}")
    return limit


def configured_in_process_max_bytes(value: str | None, what: str) -> int | None:
    """A deployment's setting (``what`` names where it is set): None when unset or blank."""
    if value is None or not str(value).strip():
        return None
    return check_in_process_max_bytes(value, what)


def in_process_limit(spec: IngestSpec) -> int:
    """The most bytes of local line files a run of ``spec`` writes in this process: the spec's own
    value, else the deployment's (:data:`IN_PROCESS_MAX_BYTES_VARIABLE`), else :data:`IN_PROCESS_MAX_BYTES`."""
    if spec.in_process_max_bytes is not None:
        return spec.in_process_max_bytes
    configured = configured_in_process_max_bytes(os.environ.get(IN_PROCESS_MAX_BYTES_VARIABLE),
                                                 IN_PROCESS_MAX_BYTES_VARIABLE)
    return IN_PROCESS_MAX_BYTES if configured is None else configured


class BadRecordError(IngestError):
    """A malformed record: nothing of the run was committed."""


class SourceError(IngestError, FileNotFoundError):
    """The source path/glob is missing or matches nothing."""


def check_options(*, format: str = "jsonl", mode: str = "exactly_once", on_empty: str = "fail",
                  routing_key_field: str | None = None, payload_field: str | None = None,
                  num_writers: int | None = None, stream_segments: int = 1, stale_after_s: float = 60.0,
                  unknown_commits: str | None = None, remember_files_for_s: float | None = None,
                  in_process_max_bytes: int | None = None) -> None:
    """ValueError for an option no run could accept (the operator calls it when the DAG is parsed)."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if on_empty not in ("fail", "succeed"):
        raise ValueError(f"on_empty must be 'fail' or 'succeed', got {on_empty!r}")
    if format == "text" and (routing_key_field or payload_field):
        raise ValueError("format 'text' has no fields: routing_key_field and payload_field do not apply")
    if num_writers is not None and num_writers < 1:
        raise ValueError(f"num_writers must be at least 1, got {num_writers}")
    if stream_segments < 1:
        raise ValueError(f"stream_segments must be at least 1, got {stream_segments}")
    if not stale_after_s >= MIN_STALE_AFTER_S:
        raise ValueError(f"stale_after_s={stale_after_s!r} is below the safe minimum of {MIN_STALE_AFTER_S:g} s (the "
                         f"driver heartbeats at most every 0.5 s; a run is presumed dead after four missed heartbeats)")
    if unknown_commits is not None and unknown_commits not in UNKNOWN_COMMITS:
        raise ValueError(f"unknown_commits must be one of {', '.join(UNKNOWN_COMMITS)} or None, got {unknown_commits!r}")
    if in_process_max_bytes is not None:
        check_in_process_max_bytes(in_process_max_bytes, "in_process_max_bytes")
    if remember_files_for_s is not None and not remember_files_for_s > 0:
        raise ValueError(f"remember_files_for must be a positive duration, got {remember_files_for_s!r} s")


@dataclass(frozen=True)
class IngestSpec:
    """What to ingest where; every field is plain data (it travels to Spark tasks)."""

    scope: str
    stream: str
    source: str | Sequence[str]
    format: str = "jsonl"
    routing_key_field: str | None = None
    payload_field: str | None = None
    ingest_id: str | None = None
    mode: str = "exactly_once"
    create_stream: bool = False
    stream_segments: int = 1
    on_empty: str = "fail"  # or "succeed"
    allow_changed_files: bool = False
    wait_for_commit: bool = True
    num_writers: int | None = None  # transactions (tasks) per run; default: see writers_of
    stale_after_s: float = 60.0
    task_instance: str | None = None  # the Airflow task instance running this ingest ...
    try_number: int | None = None  # ... and its try: a later try takes an earlier try's run over at once
    unknown_commits: str | None = None  # "committed" / "not_committed": see UnresolvedCommitError
    remember_files_for_s: float | None = None  # forget committed files after this long (None: never)
    #: Record the run's committed range under this key in the ingest's interval index (the
    #: operator passes its data interval, "<start ISO>/<end ISO>"); the export's interval_of reads it.
    interval_key: str | None = None
    #: The scope keeping the ingest's state (created if missing); None: the stream's own scope.
    state_scope: str | None = None
    #: A run of local line files reading at most this many bytes is written by this process itself,
    #: without Spark, through the same transactional stage (0: always Spark; None: the deployment's
    #: setting, see in_process_limit).
    in_process_max_bytes: int | None = None

    def __post_init__(self) -> None:
        check_state_scope(self.state_scope)
        check_options(format=self.format, mode=self.mode, on_empty=self.on_empty,
                      routing_key_field=self.routing_key_field, payload_field=self.payload_field,
                      num_writers=self.num_writers, stream_segments=self.stream_segments,
                      stale_after_s=self.stale_after_s, unknown_commits=self.unknown_commits,
                      remember_files_for_s=self.remember_files_for_s, in_process_max_bytes=self.in_process_max_bytes)
        in_process_limit(self)  # a bad deployment setting is named before anything runs
        if self.interval_key is not None and not str(self.interval_key).strip():
            raise ValueError("interval_key must be a non-empty text (or None)")
        if not source_items(self.source) or any(not i for i in source_items(self.source)):
            raise ValueError(f"source must be a non-empty path, glob or URI (or a list of them), got {self.source!r}")

    @property
    def effective_ingest_id(self) -> str:
        return self.ingest_id or f"{self.scope}/{self.stream}"


@dataclass
class IngestResult:
    run_id: str | None
    files_ingested: list[str] = field(default_factory=list)
    files_skipped: list[str] = field(default_factory=list)
    events: int = 0
    bytes: int = 0
    transactions: list[dict[str, str]] = field(default_factory=list)
    tail_cut: str | None = None
    seconds: float = 0.0
    recovered_runs: list[str] = field(default_factory=list)  # killed runs rolled forward or back
    finished_runs: list[str] = field(default_factory=list)  # earlier runs with acknowledged commits, recorded done
    state_scope: str | None = None  # where the ingest's state lives (the commit sensor records the run done)
    state_stream: str | None = None
    resumed: bool = False  # run_id is an earlier try's run, finished by this one (see resume_ingest)

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> IngestResult:
        """The result :meth:`to_dict` gave (what a submitted application recorded)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["events_per_second"] = round(self.events_per_second, 1)
        # What PravegaTransactionSensor takes (with wait_for_commit=False).
        out["transaction_ids"] = [t["id"] for t in self.transactions]
        return out


def source_items(source: str | Sequence[str]) -> list[str]:
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    return [os.fspath(i) for i in items]
