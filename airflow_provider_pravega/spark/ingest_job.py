"""Exactly-once ingestion of files into a Pravega stream with PySpark.

The driver runs the protocol of :mod:`airflow_provider_pravega.client.ingest`; Spark does the
heavy lifting:

* line files (jsonl, text) are read as exact byte ranges (:func:`measure_pieces` fixes each file's
  piece before the run starts, :func:`line_frame` reads exactly it), so a file that grows while it
  is read, or between runs, has every line ingested once; Spark's own readers parse CSV (with a
  header) and Parquet. Every record carries its file and position, so the source order is known;
* with a routing key, records are shuffled by key and sorted by source position inside each
  partition, so *all* events of one key are written by one task in file order (readers then see
  each key's events in source order);
* each partition is written by one task into its own transaction (``mapInArrow``: records reach
  Python as Arrow batches), flushed (pre-committed) before the task succeeds, and the driver commits
  all of them at once after the commit record.

Run it without Airflow as ``python -m airflow_provider_pravega.spark.ingest_job --help``.
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import re
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from airflow_provider_pravega import fault_points
from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.client.errors import PravegaError, ScopeNotFoundError, StreamNotFoundError
from airflow_provider_pravega.client.ingest import (
    MIN_STALE_AFTER_S,
    UNKNOWN_COMMITS,
    FencedError,
    FilePlan,
    IngestCoordinator,
    IngestError,
    WriteResult,
    check_state_scope,
    check_timing,
    check_write_access,
    committed_end,
    file_identity,
    known_files,
    needs_fingerprint,
    open_ingest_state,
    open_state_store,
    register_txn,
    same_file,
)
from airflow_provider_pravega.client.ingest import state_location as _state_location
from airflow_provider_pravega.client.ingest_resume import (
    RESUMABLE,
    is_identity,
    record_written,
    resume_run,
    resume_status,
    run_identity,
)
from airflow_provider_pravega.spark.connection_args import (
    add_connection_arguments,
    add_spark_arguments,
    add_submission_argument,
    run_job_command,
    spark_settings,
)
from airflow_provider_pravega.spark.json_lines import json_line_problem
from airflow_provider_pravega.spark.session import started_on_first_use
from airflow_provider_pravega.spark.worker_heap import prepare_worker_heap

log = logging.getLogger(__name__)

FORMATS = ("jsonl", "csv", "parquet", "text")
#: Formats read as byte ranges of whole lines: a file of these that grows is tailed (see measure_pieces).
LINE_FORMATS = ("jsonl", "text")
#: A line file's last line without a line end is ingested only once the file has not been modified
#: for this long (at listing): until then it may be a line still being written.
TAIL_SETTLE_S = 60.0
MODES = ("exactly_once", "at_least_once")


class BadRecordError(IngestError):
    """A malformed record: nothing of the run was committed."""


class SourceError(IngestError, FileNotFoundError):
    """The source path/glob is missing or matches nothing."""


def check_options(*, format: str = "jsonl", mode: str = "exactly_once", on_empty: str = "fail",
                  routing_key_field: str | None = None, payload_field: str | None = None,
                  num_writers: int | None = None, stream_segments: int = 1, stale_after_s: float = 60.0,
                  unknown_commits: str | None = None, remember_files_for_s: float | None = None) -> None:
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

    def __post_init__(self) -> None:
        check_state_scope(self.state_scope)
        check_options(format=self.format, mode=self.mode, on_empty=self.on_empty,
                      routing_key_field=self.routing_key_field, payload_field=self.payload_field,
                      num_writers=self.num_writers, stream_segments=self.stream_segments,
                      stale_after_s=self.stale_after_s, unknown_commits=self.unknown_commits,
                      remember_files_for_s=self.remember_files_for_s)
        if self.interval_key is not None and not str(self.interval_key).strip():
            raise ValueError("interval_key must be a non-empty text (or None)")
        if not _items(self.source) or any(not i for i in _items(self.source)):
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


# ---------------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------------


GLOB_CHARS = "*?[{"
EMPTY_FILE = "empty (0 bytes)"  # why an empty file is skipped (Spark's listing drops it)


@dataclass(frozen=True)
class SourceFile:
    """One listed file: its name in the ingest state (a plain absolute path for local files, as
    states always held; the URI otherwise), the URI Spark reads, and what the listing says."""

    key: str
    uri: str
    size: int
    mtime_ms: int


def _items(source: str | Sequence[str]) -> list[str]:
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    return [os.fspath(i) for i in items]


def _scheme(item: str) -> str | None:
    head, sep, _ = item.partition("://")
    if sep and head.isidentifier():
        return head.lower()
    if item.startswith("file:/"):
        return "file"
    return None


def _local_path(item: str) -> str | None:
    """The local filesystem path of a plain path or ``file:`` URI; None for other schemes."""
    scheme = _scheme(item)
    if scheme is None:
        return os.path.abspath(item)
    if scheme == "file":
        from urllib.parse import unquote, urlsplit

        return unquote(urlsplit(item).path) if item.startswith("file://") else item[len("file:"):]
    return None


def key_of(uri: str) -> str:
    """State key of a file URI as Spark reports it (``file:/x``, ``file:///x%20y``, ``s3a://b/k``)."""
    from urllib.parse import unquote

    uri = unquote(uri)
    if uri.startswith("file:"):
        return "/" + uri[len("file:"):].lstrip("/")
    return uri


#: What Hadoop's glob patterns treat specially (GlobPattern): escaped with a backslash, a path is literal.
_HADOOP_GLOB_SPECIAL = re.compile(r"([\\\[\]*?{}])")


def escape_glob(path: str) -> str:
    """``path`` with Hadoop's glob characters escaped, so Spark reads exactly that file."""
    return _HADOOP_GLOB_SPECIAL.sub(r"\\\1", path)


def _is_glob(item: str) -> bool:
    return any(ch in item for ch in GLOB_CHARS) or "\\" in item


def uri_of(key: str) -> str:
    """What Spark is given to read a state key: the file itself, whatever its name holds (glob
    characters escaped), local paths explicitly on ``file:`` whatever the cluster's default
    filesystem is."""
    return f"file://{escape_glob(key)}" if key.startswith("/") else escape_glob(key)


@dataclass(frozen=True)
class Precheck:
    """What :func:`precheck_sources` learned without Spark."""

    #: Every item is local and holds no file Spark would read: no SparkSession is needed.
    empty: bool
    #: Local files the listing skips although their names would be read: (path, reason).
    skipped: tuple[tuple[str, str], ...] = ()
    #: The files exactly as :func:`list_sources` would list them, when every item is a local path
    #: this can list the way Spark does (plain files, directories of plain files, a glob in the
    #: last name only); None when only Spark can tell (other filesystems, subdirectories, Hadoop's
    #: own glob syntax). What lets a run with nothing new end without a JVM.
    files: tuple[SourceFile, ...] | None = None
    #: When the listing began (ms): a file's age is measured from here, never overstated.
    listed_at_ms: int = 0


def precheck_sources(source: str | Sequence[str]) -> Precheck:
    """What can be known about local sources without Spark: a missing path is a SourceError at
    once; ``empty`` when every item is local and matches no file that could hold records (so no
    SparkSession is started for an empty interval); empty files and dangling symbolic links among
    the matches are logged with their path and reason (Spark's listing skips them silently);
    ``files``: the listing itself where it is certain to be Spark's (see :class:`Precheck`).

    A local item that exists as given is taken literally, whatever characters its name holds;
    otherwise an item with ``*?[{`` or ``\\`` is a glob (Hadoop's syntax, ``\\`` escapes)."""
    definitely_empty = True
    skipped: list[tuple[str, str]] = []
    files: dict[str, SourceFile] | None = {}
    started_ms = int(time.time() * 1000)
    for item in _items(source):
        path = _local_path(item)
        if path is None:
            definitely_empty = False
            files = None
            continue
        if os.path.normpath(path) != path:  # ".." or "//": Hadoop's Path may name the files otherwise
            files = None
        if os.path.exists(path) or not _is_glob(path):
            if not os.path.exists(path):
                raise SourceError(f"source path {item!r} does not exist")
            if os.path.isdir(path):
                entries = [e.path for e in os.scandir(path)]
            else:
                entries = [path]
                if _skip_reason(path) == "":  # a hidden name given literally: Spark's rule for roots differs
                    files = None
        elif "{" in path or "\\" in path or "[^" in path or "[!" in path:
            entries = [path]  # Hadoop glob syntax Python's glob does not share: let Spark decide
            files = None
        else:
            entries = glob.glob(path)
            if _is_glob(os.path.dirname(path)):  # wildcards in directories: Spark's hidden-name rule differs
                files = None
        for entry in sorted(entries):
            why = _skip_reason(entry)
            if why is None:
                definitely_empty = False
                if files is not None:
                    files = _add_local_file(files, entry)
            elif why:
                log.warning("source %r: skipping %s: %s", item, entry, why)
                skipped.append((entry, why))
    listing = None if files is None else tuple(files[k] for k in sorted(files))
    return Precheck(definitely_empty, tuple(skipped), listing, started_ms)


def _add_local_file(files: dict[str, SourceFile], entry: str) -> dict[str, SourceFile] | None:
    """``files`` with ``entry`` added as Spark lists it (size, modification time in whole
    milliseconds, as Hadoop's local filesystem reports it); None when only Spark can tell (a
    directory: partition discovery; anything but a regular file)."""
    try:
        st = os.stat(entry)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    files[entry] = SourceFile(entry, uri_of(entry), st.st_size, st.st_mtime_ns // 1_000_000)
    return files


def _skip_reason(path: str) -> str | None:
    """Why Spark's listing skips ``path`` ("" for hidden names, Spark's rule for ``_*`` and
    ``.*``: not worth a log line), or None when it may hold records."""
    if os.path.basename(path).startswith((".", "_")):
        return ""
    try:
        if os.path.islink(path) and not os.path.exists(path):
            return f"a dangling symbolic link to {os.readlink(path)}, which does not exist"
        return EMPTY_FILE if os.path.isfile(path) and os.path.getsize(path) == 0 else None
    except OSError:
        return None


def list_sources(spark: Any, source: str | Sequence[str]) -> list[SourceFile]:
    """Files named by paths, directories or globs on any Hadoop filesystem (plain paths, ``file://``,
    ``s3a://``, ``hdfs://`` …), listed by Spark through Hadoop — one code path for every scheme,
    on classic Spark and Spark Connect alike. ``binaryFile`` with only path, length and modification
    time selected reads no file content (Spark prunes that column): executors get each file's listed
    status, the driver a few numbers per file. A directory means the files in it; names starting
    with ``_`` or ``.`` are skipped (Spark's hidden-file rule), and so are empty files; a glob
    matching nothing, or an empty directory, adds nothing; a path that does not exist is a
    SourceError. A path that exists as given is read literally, even with glob characters in its
    name (local paths: checked here; other filesystems: the literal is tried first)."""
    from pyspark.sql import functions as F

    frames = []
    for item in _items(source):
        local = _local_path(item)
        if local is not None:
            targets = [uri_of(local) if os.path.exists(local) else f"file://{local}"]
        elif _is_glob(item) and "\\" not in item:
            targets = [escape_glob(item), item]  # the file of that name if there is one, else the glob
        else:
            targets = [item]
        for target in targets:
            try:
                frame = spark.read.format("binaryFile").load(target)
                frame.schema  # analysed now (Spark Connect analyses lazily): a missing path fails here
                frames.append(frame.select("path", "length", F.unix_millis("modificationTime").alias("mtime")))
                break
            except Exception as exc:  # AnalysisException (classic and Connect) or a Hadoop error
                text = str(exc)
                if "PATH_NOT_FOUND" in text or "Path does not exist" in text:
                    if target != targets[-1] or _is_glob(item):
                        continue  # not a file of that name / a glob matching nothing
                    raise SourceError(f"source path {item!r} does not exist") from None
                raise SourceError(f"cannot list source {item!r}: {_listing_error(text)}") from None
    if not frames:
        return []
    frame = frames[0]
    for other in frames[1:]:
        frame = frame.unionByName(other)
    try:
        rows = frame.collect()
    except Exception as exc:
        raise SourceError(f"cannot list source {_items(source)!r}: {_listing_error(str(exc))}") from None
    files = {key_of(r["path"]): SourceFile(key_of(r["path"]), uri_of(key_of(r["path"])), r["length"], r["mtime"])
             for r in rows}
    return [files[k] for k in sorted(files)]


def file_contents(spark: Any, keys: Iterable[str]) -> Any:
    """(path, content) of each file, one row a file, read in Spark tasks through Hadoop (never on
    the driver): what fingerprinting, measuring and reading line files start from."""
    return spark.read.format("binaryFile").load([uri_of(k) for k in keys]).select("path", "content")


_DIGEST_SCHEMA = "path string, fp string"


def fingerprint_files(spark: Any, keys: Sequence[str]) -> dict[str, str]:
    """BLAKE2b-160 content fingerprints (the form states recorded before listing went through
    Spark), computed inside Spark tasks — one file per row, never on the driver."""
    if not keys:
        return {}

    def digest(batches: Iterator[Any]) -> Iterator[Any]:
        import hashlib

        prepare_worker_heap()

        from airflow_provider_pravega.spark.arrow_columns import record_batch, schema_of

        schema = schema_of(_DIGEST_SCHEMA)
        for batch in batches:
            paths = batch.column("path").to_pylist()
            fps = [hashlib.blake2b(c, digest_size=20).hexdigest() for c in batch.column("content").to_pylist()]
            yield record_batch({"path": paths, "fp": fps}, schema)

    rows = (file_contents(spark, keys)
            .mapInArrow(digest, _DIGEST_SCHEMA).collect())
    return {key_of(r["path"]): r["fp"] for r in rows}


#: Line files listed in the task's own process (local files) and holding at most this many bytes in
#: all are measured there, not in a Spark job: a small daily run saves the job (0.2-0.4 s of about
#: 2 s through a warm Spark Connect server); larger ones are read in Spark tasks, never on the driver.
LOCAL_MEASURE_MAX_BYTES = 64 * 1024 * 1024

#: What a measure task returns per file (see measure_file).
_MEASURED_SCHEMA = ("path string, start long, end long, fp string, line long, lines long, open boolean, "
                    "changed string")


def measure_file(content: bytes, req: dict[str, Any]) -> dict[str, Any]:
    """One line file's next piece (the rule: :func:`measure_pieces`) from its ``content``;
    ``req`` is its request (``open`` is filled in when unknown)."""
    import hashlib

    size, base = req["size"], req["base"]
    data = memoryview(content)[:size]
    if req.get("open") is None:  # a record from before pieces: was its last line terminated?
        req["open"] = bool(base) and bytes(data[base - 1:base]) != b"\n"
    changed = None
    digest = hashlib.blake2b(data[:base], digest_size=20)
    if len(data) < size:
        changed = f"it was cut to {len(data)} bytes after it was listed at {size} bytes"
    elif base and size < base:
        changed = f"it shrank to {size} bytes, below the {base} bytes committed"
    elif base and not req.get("fp"):
        changed = (f"it grew or was rewritten (now {size} bytes), and its record holds no fingerprint "
                   f"of the {base} bytes committed, so an append cannot be told from a rewrite")
    elif base and digest.hexdigest() != req["fp"]:
        changed = f"its first {base} bytes differ from the bytes committed"
    elif base and req.get("open") and size > base and bytes(data[base:base + 1]) != b"\n":
        changed = f"its last committed line, committed without a line end at byte {base}, was extended"
    if changed:
        base, digest = 0, hashlib.blake2b(digest_size=20)
    start = base + 1 if base and req.get("open") and not changed and size > base else base
    nl = content.rfind(b"\n", start, size)
    end, is_open = (nl + 1 if nl >= 0 else start), False
    if req["tail"] and end < size:
        end, is_open = size, True
    if end > base:
        digest.update(data[base:end])
    else:
        end = base
    return {"start": start, "end": end, "fp": digest.hexdigest(), "line": content.count(b"\n", 0, start) + 1,
            "lines": content.count(b"\n", 0, end) + (1 if is_open else 0),
            "open": is_open or (end == base and bool(req.get("open")) and not changed), "changed": changed}


def measure_pieces(spark: Any, requests: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each line file's next piece, decided in Spark tasks (one file per row, never on the driver)
    from its bytes up to its listed size: ``requests`` maps a file key to ``size`` (listed),
    ``base`` (its committed end, 0 when new), ``fp``/``open`` (what the committed record says) and
    ``tail`` (whether a last line without a line end may be ingested: the file has settled).

    Rule (:func:`measure_file`): a piece is ``[start, end)`` where ``end`` follows the last line end
    before the listed size, so a line still being written is left for a later run; when ``tail`` is
    set, the unterminated last line is included and recorded ``open``: the file may then only grow
    by a line end first. A committed file continues at its committed end when ``[0, base)`` still
    has the committed fingerprint; else (rewritten, shrunk, an open last line extended, or no
    fingerprint recorded) it is measured from byte 0 and marked ``changed`` with the reason (see
    ChangedFileError)."""
    if not requests:
        return {}
    requests = {k: dict(v) for k, v in requests.items()}

    def measure(batches: Iterator[Any]) -> Iterator[Any]:
        from airflow_provider_pravega.spark.arrow_columns import record_batch, schema_of

        prepare_worker_heap()

        schema = schema_of(_MEASURED_SCHEMA)
        for batch in batches:
            out: dict[str, list[Any]] = {c: [] for c in schema.names}
            for path, content in zip(batch.column("path").to_pylist(), batch.column("content").to_pylist()):
                row = {"path": path, **measure_file(content, requests[key_of(path)])}
                for c in schema.names:
                    out[c].append(row[c])
            yield record_batch(out, schema)

    rows = (file_contents(spark, requests)
            .mapInArrow(measure, _MEASURED_SCHEMA).collect())
    return _pieces(requests, {key_of(r["path"]): r for r in rows})


def measure_local_pieces(requests: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """:func:`measure_pieces` for local files, read in this process (at most
    :data:`LOCAL_MEASURE_MAX_BYTES` in all: the caller checks)."""
    requests = {k: dict(v) for k, v in requests.items()}
    found = {}
    for key, req in requests.items():
        content = _local_bytes(key)
        if content is not None:  # a file that is gone is reported with the others
            found[key] = measure_file(content, req)
    return _pieces(requests, found)


def _gone(key: str) -> SourceError:
    return SourceError(f"{key} was listed but is gone: it was deleted or renamed while the ingest ran")


def _local_bytes(key: str, upto: int = -1) -> bytes | None:
    """The bytes of a local file (its first ``upto``), None if it is gone; any other failure to
    read it is a :class:`SourceError` naming it."""
    try:
        with open(_local_path(key) or key, "rb") as fh:
            return fh.read(upto)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SourceError(f"cannot read {key}: {exc.strerror or exc}") from None


def _pieces(requests: Mapping[str, Mapping[str, Any]], found: Mapping[str, Mapping[str, Any]]
            ) -> dict[str, dict[str, Any]]:
    """The pieces to record from what each file measured (``found``, by key)."""
    missing = sorted(set(requests) - set(found))
    if missing:
        raise _gone(missing[0])
    pieces = {}
    for key, r in found.items():
        req = requests[key]
        piece = {"size": req["size"], "base": 0 if r["changed"] else req["base"], "start": r["start"],
                 "end": r["end"], "fp": r["fp"], "line": r["line"], "lines": r["lines"], "open": r["open"]}
        if req.get("mtime") is not None:
            piece["mtime"] = req["mtime"]
        if r["changed"]:
            piece["changed"] = r["changed"]
        pieces[key] = piece
    return pieces


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
            content = _local_bytes(key, upto=ranges[key][1])  # no further than the piece's end
            if content is None:
                raise _gone(key)
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


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), text)[:500]


_JAVA_ERROR = re.compile(r"(?:^|: )(?:[a-z_$][\w$]*\.)+([A-Z][\w$]*(?:Exception|Error))(?:: (.*))?$")


def _listing_error(text: str) -> str:
    """The Hadoop/Spark reason of a failed listing, without the Py4J wrapper and stack."""
    reason = _first_line(text)
    for line in text.splitlines():
        match = _JAVA_ERROR.search(line.strip())
        if match and not line.strip().startswith("at "):
            reason = f"{match.group(1)}: {match.group(2)}" if match.group(2) else match.group(1)
            break
    if "ClassNotFoundException" in text or "No FileSystem for scheme" in text:
        reason += (" (the filesystem's Hadoop connector is not on Spark's classpath: add it with "
                   "spark.jars.packages, e.g. org.apache.hadoop:hadoop-aws matching Spark's Hadoop for s3a://)")
    return reason[:600]


# ---------------------------------------------------------------------------------------------
# The Spark plan and record validation (one definition of a bad record, for both modes)
# ---------------------------------------------------------------------------------------------

CONNECT_DEFAULT_WRITERS = 8  # writers on Spark Connect when its configuration does not say
#: A run gets a write task (a transaction) per this many planned bytes, up to Spark's parallelism:
#: each task of a scheduled run starts a new Python worker (Spark stops idle ones after 60 s; about
#: 0.5 s of the task), so a small day's files are written faster, and with fewer transactions, by one.
BYTES_PER_WRITER = 16 * 1024 * 1024
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


def writers_of(spark: Any, spec: IngestSpec, files: Mapping[str, Mapping[str, Any]]) -> int:
    """Write tasks (transactions) for a run of ``files``: ``num_writers``, else the cluster's
    parallelism, but no more than one per :data:`BYTES_PER_WRITER` planned."""
    if spec.num_writers:
        return spec.num_writers
    planned = sum(_planned_bytes(ident) for ident in files.values())
    return max(1, min(_parallelism(spark), -(-planned // BYTES_PER_WRITER)))


def _parallelism(spark: Any) -> int:
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect has no SparkContext: what the server's configuration says
        pass
    conf = spark.conf.get
    if conf("spark.default.parallelism", None):
        return max(1, int(conf("spark.default.parallelism")))
    master = conf("spark.master", None) or ""
    if master.startswith("local"):
        cores = master[len("local"):].strip("[]").split(",")[0] or "1"
        return max(1, os.cpu_count() or 1) if cores == "*" else max(1, int(cores))
    instances, cores = conf("spark.executor.instances", None), conf("spark.executor.cores", None)
    if instances and cores:
        return max(1, int(instances) * int(cores))
    return CONNECT_DEFAULT_WRITERS  # not the SQL shuffle default (200 transactions per run)


def needs_labels(spec: IngestSpec, here: bool = False) -> bool:
    """Whether files must be assigned to write tasks explicitly: a line file read in Spark tasks is
    one task's input whole (``binaryFile``), so merging input partitions keeps it whole; lines read
    here (``here``: a local relation, cut into partitions by rows) and a CSV or Parquet file may be
    split between input partitions, and a routing key would spread every file over all tasks."""
    return bool(spec.routing_key_field) or spec.format not in LINE_FORMATS or here


def file_groups(files: Mapping[str, Mapping[str, Any]], writers: int) -> dict[str, int]:
    """Each file's write task (0..n-1): whole files, consecutive in path order, about the same
    bytes per task. Whole: a transaction lost after the commit point costs a rewrite of exactly its
    files (``IngestCoordinator.heal_lost``). Consecutive: with a routing key, the transactions are
    committed in path order of their files, so a key's events keep the source order across files."""
    keys = sorted(files)
    sizes = [max(1, _planned_bytes(files[k])) for k in keys]
    total, n = sum(sizes), max(1, min(writers, len(keys)))
    groups: dict[str, int] = {}
    before = 0
    for key, size in zip(keys, sizes):
        groups[key] = min(n - 1, before * n // total)
        before += size
    return groups


def _planned_bytes(ident: Mapping[str, Any]) -> int:
    if ident.get("end") is not None:
        return int(ident["end"]) - int(ident.get("start") or 0)
    return int(ident.get("size") or 0)


def spark_hash_long(value: int) -> int:
    """Spark's ``hash(value)`` of a bigint: Murmur3 x86 32-bit, seed 42, the hash of its hash
    partitioning (``HashPartitioning`` is ``pmod(hash(cols), n)``) since Spark 2.0. The write
    checks the outcome (:func:`check_file_groups`), so a Spark that partitions otherwise fails the
    run before its commit point instead of mixing the groups."""
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    def mix(h1: int, k1: int) -> int:
        k1 = rotl((k1 * 0xCC9E2D51) & mask, 15) * 0x1B873593 & mask
        return (rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & mask

    value &= 0xFFFFFFFFFFFFFFFF
    h1 = mix(mix(42, value & mask), value >> 32)
    h1 ^= 8
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & mask
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & mask
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def writer_labels(files: Mapping[str, Mapping[str, Any]], spec: IngestSpec, writers: int,
                  here: bool = False) -> dict[str, int] | None:
    """File key -> a label whose hash partition (``repartition(n, "w")``) is the file's write task
    (:func:`file_groups`), so that task *i* gets exactly group *i*; None where files stay whole
    without it (:func:`needs_labels`). The labels are the smallest ids that Spark's hash
    partitioner sends to each task (:func:`spark_hash_long`: computed here, not in a Spark job of
    its own; :func:`check_file_groups` checks what the tasks got)."""
    if not needs_labels(spec, here):
        return None
    groups = file_groups(files, writers)
    n = max(groups.values()) + 1
    label: dict[int, int] = {}
    for i in range(64 * n):
        label.setdefault(spark_hash_long(i) % n, i)
    fallback = [i for i in range(n) if i not in label]  # a task no label reached: share one (still whole files)
    for i in fallback:
        label[i] = label[min(label)]
    return {key: label[g] for key, g in groups.items()}


def check_file_groups(labels: Mapping[str, int] | None, holds: Mapping[str, Sequence[str]]) -> None:
    """Each transaction holds the files of one label (one group of :func:`file_groups`), as the
    labels meant: else the partitioner is not the one :func:`spark_hash_long` computes, and with a
    routing key the commit order would no longer follow the files' order. Raised before the
    commit point: nothing of the run is committed."""
    if labels is None:
        return
    for txn, keys in holds.items():
        found = {labels[k] for k in keys if k in labels}
        if len(found) > 1:
            raise IngestError(f"transaction {txn} holds files of {len(found)} write groups ({', '.join(keys[:3])}): "
                              f"this Spark does not partition as spark_hash_long computes. Nothing of this run was "
                              f"committed; this is a bug of the provider's partitioning: please report it")


def partition_for_writing(df: Any, spec: IngestSpec, writers: int, labels: Mapping[str, int] | None = None) -> Any:
    """One partition per write task (at most ``writers``), each holding whole files (see
    :func:`file_groups`); with a routing key, every key's events in source order within each file,
    as are labelled lines without one (read here, :func:`needs_labels`: a file's lines may come
    from several input partitions)."""
    if labels is None:
        return df.coalesce(writers)  # line files stay whole (coalesce only merges partitions)
    tasks = len(set(labels.values()))
    df = df.repartition(tasks, "w")
    return df.sortWithinPartitions("f", "b", "m") if spec.routing_key_field or spec.format in LINE_FORMATS else df


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


# ---------------------------------------------------------------------------------------------
# Spark tasks
# ---------------------------------------------------------------------------------------------

RESULT_SCHEMA = "txn string, events long, bytes long, error string, bad_file string, files array<string>"

_WORKER_CLIENTS: dict[tuple[int, PravegaConnectionConfig], Any] = {}


def _worker_client(config: PravegaConnectionConfig) -> Any:
    """One PravegaClient per Python worker process (sockets do not survive fork)."""
    from airflow_provider_pravega.client import PravegaClient

    # The config itself is the key (frozen, hashable, compares every field incl. credentials); its
    # repr hides the password, so two configs differing only there must not share a client.
    key = (os.getpid(), config)
    client = _WORKER_CLIENTS.get(key)
    if client is None:
        client = _WORKER_CLIENTS[key] = PravegaClient(config)
    return client


@dataclass(frozen=True)
class TaskContext:
    """Everything a write task needs (pickled into the task's closure; with credentials, the config
    carries the password to the executors - its repr hides it, and nothing here prints it)."""

    config: PravegaConnectionConfig
    spec: IngestSpec
    run_id: str
    state_scope: str
    state_stream: str
    lease_ms: int
    owner: str | None = None  # the driver owning the run: a task of a taken-over run cannot register


def task_result(txn: str | None, events: int, size: int, error: str | None = None, bad_file: str | None = None,
                files: Iterable[str] = ()) -> Any:
    """A write task's one-row answer (:data:`RESULT_SCHEMA`): its transaction, what it wrote, or
    the file of the bad record that stopped it."""
    from airflow_provider_pravega.spark.arrow_columns import record_batch, schema_of

    return record_batch({"txn": [txn], "events": [events], "bytes": [size], "error": [error], "bad_file": [bad_file],
                         "files": [sorted(files)]}, schema_of(RESULT_SCHEMA))


def make_writer(ctx: TaskContext):
    """The function ``mapInArrow`` runs on each partition: one transaction per task attempt."""

    def write_partition(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow.compute as pc

        prepare_worker_heap()

        batches = iter(batches)
        first = next(batches, None)
        if first is None or first.num_rows == 0 and _all_empty(batches):
            return  # an empty partition writes nothing and opens no transaction
        client = _worker_client(ctx.config)
        spec = ctx.spec
        txns = client.transactions
        info = txns.begin(spec.scope, spec.stream, ctx.lease_ms)
        hex_id = f"{info.txn_id:032x}"
        store = open_state_store(client, ctx.state_scope, ctx.state_stream, create=False)
        try:
            register_txn(store, ctx.run_id, hex_id, ctx.owner)
        except FencedError:
            txns.abort(spec.scope, spec.stream, info.txn_id)
            raise
        keeper = client.lease_keeper(max(1.0, ctx.lease_ms / 3000))
        keeper.add(spec.scope, spec.stream, info.txn_id)
        events = size = 0
        held: set[str] = set()  # the files this transaction holds (whole: see file_groups)
        try:
            writer = txns.writer(spec.scope, spec.stream, info, check_open=False)
            try:
                for batch in _chain(first, batches):
                    held.update(pc.unique(batch.column("f")).to_pylist())
                    bad_file = _first_bad_file(batch)
                    if bad_file is not None:  # nothing of this transaction will be committed
                        txns.abort(spec.scope, spec.stream, info.txn_id)
                        yield task_result(hex_id, events, size, "bad record", bad_file)
                        return
                    payloads = batch.column("payload").to_pylist()
                    if spec.routing_key_field:
                        write = writer.write_event
                        for payload, key in zip(payloads, batch.column("k").to_pylist()):
                            write(payload, key)
                    else:
                        writer.write_events(payloads)
                    events += len(payloads)
                    size += sum(map(len, payloads))
                    if events:
                        fault_points.reached("task_mid_write")
                writer.flush()  # pre-commit: every event acknowledged, transaction still open
            finally:
                writer.close()
        finally:
            keeper.close()
        try:  # what a later try needs to commit this transaction without its driver
            record_written(store, ctx.run_id, hex_id, (key_of(f) for f in held), events, size, ctx.owner)
        except FencedError:
            txns.abort(spec.scope, spec.stream, info.txn_id)
            raise
        yield task_result(hex_id, events, size, files=held)

    return write_partition


def _first_bad_file(batch: Any) -> str | None:
    """The file of the batch's first bad record (see record_frame), or None: the one check both
    modes make before writing a batch."""
    import pyarrow.compute as pc

    bad = batch.column("bad")
    if not pc.any(bad).as_py():
        return None
    return batch.column("f")[pc.index(bad, True).as_py()].as_py()


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _all_empty(batches: Iterator[Any]) -> bool:
    return all(b.num_rows == 0 for b in batches)


# ---------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------


def state_location(spec: IngestSpec) -> tuple[str, str]:
    """Where an ingest keeps its synchronizer state: keyed by the target stream and the ingest id,
    in its state scope."""
    return _state_location(spec.scope, spec.stream, spec.effective_ingest_id, spec.state_scope)


def run_ingest(client: Any, spark: Any, spec: IngestSpec,
               on_run: Callable[[dict[str, str]], None] | None = None) -> IngestResult:
    """Ingest ``spec.source`` into ``spec.scope/spec.stream`` exactly once (or at least once).

    ``spark`` is a SparkSession or a function returning one, called only once there is work (an
    empty interval of local files, a missing path or stream never starts a session). The protocol
    is :meth:`IngestCoordinator.run`'s; this supplies the files and the write stage. ``on_run``
    gets the identity of each run as soon as it is recorded, before anything is written (what
    :func:`resume_ingest` takes)."""
    started = time.monotonic()
    lease_ms = client.transactions.default_lease_ms
    check_timing(spec.stale_after_s, lease_ms)  # before anything is written
    # Everything checkable without Spark comes first; the session starts only when there is work.
    get_spark = started_on_first_use(spark)
    precheck = precheck_sources(spec.source)
    if precheck.empty:
        result = _nothing_to_ingest(spec, precheck.skipped)
        _record_empty_interval(client, spec)
        return result
    admin = client.admin
    if spec.create_stream:  # also finishes a creation a lost controller or segment store interrupted
        admin.ensure_stream(spec.scope, spec.stream, spec.stream_segments, create_scope=True)
    elif not admin.stream_exists(spec.scope, spec.stream):
        raise StreamNotFoundError(spec.scope, spec.stream)
    check_write_access(client, spec.scope, spec.stream)
    state_scope, state_stream = state_location(spec)
    store = open_ingest_state(client, spec.scope, spec.stream, spec.effective_ingest_id,
                              stale_after_s=spec.stale_after_s, state_scope=spec.state_scope)
    coord = _coordinator(client, store, spec)
    if precheck.files is not None:  # local files listed as Spark would: no JVM unless there is work
        listed = list(precheck.files)
        listed_at_ms = precheck.listed_at_ms
        log.info("source %r: %d file(s), listed without Spark", spec.source, len(listed))
    else:
        listed = list_sources(get_spark(), spec.source)
        listed_at_ms = int(time.time() * 1000)
    fault_points.reached("after_listing")
    if not listed:
        result = _nothing_to_ingest(spec, precheck.skipped)
        if spec.interval_key is not None and spec.mode == "exactly_once":
            coord.record_empty_interval(spec.interval_key)
        return result
    files = [f.key for f in listed]
    identities = {f.key: file_identity(f.size, f.mtime_ms) for f in listed}
    early: tuple[list[str], list[str]] = ([], [])
    if spec.format in LINE_FORMATS:
        # Earlier runs are finished or rolled back first, so pieces are measured against what is committed.
        early = coord.recover()
        identities.update(_line_pieces(get_spark, store, listed, identities, listed_at_ms,
                                       local=precheck.files is not None))
    else:
        unsure = needs_fingerprint(store.fetch(), identities, store)
        if unsure:  # recorded with a content fingerprint only (older states): compare contents
            log.info("fingerprinting %d file(s) in Spark tasks", len(unsure))
            for key, fp in fingerprint_files(get_spark(), unsure).items():
                identities[key]["fp"] = fp

    def write(run_id: str, plan: FilePlan) -> WriteResult:
        log.info("run %s: ingesting %d file(s) (%d already ingested)", run_id, len(plan.to_ingest),
                 len(plan.skipped))
        if on_run is not None and spec.mode == "exactly_once":
            on_run(run_identity(scope=spec.scope, stream=spec.stream, ingest_id=spec.effective_ingest_id,
                                state_scope=state_scope, state_stream=state_stream, run_id=run_id, owner=coord.owner))
        ctx = TaskContext(config_of(client), spec, run_id, state_scope, state_stream, lease_ms, coord.owner)
        spark = get_spark()
        here = spec.format in LINE_FORMATS and lines_read_here(plan.to_ingest, precheck.files is not None)
        writers = writers_of(spark, spec, plan.to_ingest)
        labels = writer_labels(plan.to_ingest, spec, writers, here)
        records = record_frame(spark, plan.to_ingest, spec, labels, here)
        frame = partition_for_writing(records, spec, writers, labels)
        rows = frame.mapInArrow(make_writer(ctx), RESULT_SCHEMA).collect()
        bad = [r for r in rows if r["error"]]
        if bad:
            raise bad_record_error(spark, bad[0]["bad_file"], spec, plan.to_ingest, here)
        holds = whole_file_holds({r["txn"]: r["files"] or () for r in rows if r["txn"]})
        check_file_groups(labels, holds)
        # Committed in path order of their files: with a routing key, a key's events keep source order.
        txns = sorted(holds, key=lambda t: (holds[t][:1], t))
        return WriteResult(txns, sum(r["events"] for r in rows), sum(r["bytes"] for r in rows), holds)

    outcome = coord.run(identities, write, allow_changed_files=spec.allow_changed_files,
                        wait_for_commit=spec.wait_for_commit, transactional=spec.mode == "exactly_once",
                        interval=spec.interval_key)
    ingested = set(outcome.plan.to_ingest) - set(outcome.returned)
    for _again in range(RETURNED_RUNS):
        if not outcome.returned:
            break
        # Transactions of this run were aborted after its commit point (leases lapsed while the
        # driver stalled): their files were taken back out of the run; write them again now.
        log.warning("run %s: writing again the %d file(s) of its lapsed transactions", outcome.run_id,
                    len(outcome.returned))
        earlier = outcome
        outcome = coord.run(identities, write, allow_changed_files=spec.allow_changed_files,
                            wait_for_commit=spec.wait_for_commit, transactional=True, interval=spec.interval_key)
        outcome.recovered = earlier.recovered + outcome.recovered
        outcome.finished = earlier.finished + outcome.finished
        outcome.events += earlier.events
        outcome.bytes += earlier.bytes
        ingested |= set(outcome.plan.to_ingest) - set(outcome.returned)
    if outcome.returned:
        raise IngestError(f"the transactions of {len(outcome.returned)} file(s) lapsed after the commit point "
                          f"{RETURNED_RUNS + 1} times in a row ({', '.join(outcome.returned[:3])}...): the driver "
                          f"stalls longer than the transaction lease; they stay uncommitted, the next run writes them")
    result = IngestResult(
        run_id=outcome.run_id, files_skipped=sorted(outcome.plan.skipped), recovered_runs=early[0] + outcome.recovered,
        finished_runs=early[1] + outcome.finished, state_scope=state_scope, state_stream=state_stream,
        events=outcome.events, bytes=outcome.bytes,
        transactions=[{"id": t, "status": outcome.status} for t in outcome.txns],
    )
    if outcome.run_id is None:
        log.info("all %d file(s) were already ingested: nothing to do", len(files))
        result.tail_cut = _tail_text(client, spec)
        result.seconds = time.monotonic() - started
        return result
    result.files_ingested = sorted(ingested)
    committed = spec.wait_for_commit or spec.mode != "exactly_once"
    result.tail_cut = _tail_text(client, spec) if committed else None
    result.seconds = time.monotonic() - started
    log.info("run %s: %d events (%d bytes) from %d file(s) in %.1f s (%.0f events/s)", outcome.run_id,
             result.events, result.bytes, len(result.files_ingested), result.seconds, result.events_per_second)
    return result


RETURNED_RUNS = 3  # runs again at once for files whose transactions lapsed after the commit point


def _coordinator(client: Any, store: Any, spec: IngestSpec) -> IngestCoordinator:
    return IngestCoordinator(
        store, client.transactions, spec.scope, spec.stream, stale_after_s=spec.stale_after_s,
        lease_ms=client.transactions.default_lease_ms, task_instance=spec.task_instance, try_number=spec.try_number,
        unknown_commits=spec.unknown_commits, remember_files_for_s=spec.remember_files_for_s,
        lease_keeper=client.lease_keeper, crash_hook=fault_points.reached, tail_positions=lambda: _tail_positions(client, spec),
    )


def resume_status_of(client: Any, spec: IngestSpec, identity: Any) -> str:
    """What a later try of ``spec``'s task can do with the run ``identity`` names (an earlier try's,
    from ``on_run``): :data:`~airflow_provider_pravega.client.ingest_resume.RESUMABLE` or why not
    (see :mod:`airflow_provider_pravega.client.ingest_resume`). No Spark."""
    if not is_identity(identity) or spec.mode != "exactly_once":
        return "MOVED"
    try:
        store = open_state_store(client, identity["state_scope"], identity["state_stream"], create=False)
    except (ScopeNotFoundError, StreamNotFoundError):
        return "GONE"
    with store:
        return resume_status(store.fetch(), identity, scope=spec.scope, stream=spec.stream,
                             ingest_id=spec.effective_ingest_id)


def resume_ingest(client: Any, spec: IngestSpec, identity: Any) -> IngestResult | None:
    """Finish the earlier try's run ``identity`` names without Spark: take it over (fencing that
    try, should it still run) and commit what its write tasks recorded. None when that run cannot
    be resumed, or some of its files must be written again (transactions whose lease lapsed): run
    :func:`run_ingest` then (it finishes or rolls back the run at once, and writes what is left)."""
    started = time.monotonic()
    if resume_status_of(client, spec, identity) not in RESUMABLE:
        return None
    with open_state_store(client, identity["state_scope"], identity["state_stream"], create=False) as store:
        resumed = resume_run(_coordinator(client, store, spec), identity, wait_for_commit=spec.wait_for_commit)
    if resumed is None:
        return None
    if resumed.returned:
        log.warning("resumed run %s: the transactions of %d file(s) lapsed; running the ingest to write them",
                    resumed.run_id, len(resumed.returned))
        return None
    state_scope, state_stream = identity["state_scope"], identity["state_stream"]
    result = IngestResult(
        run_id=resumed.run_id, files_ingested=resumed.files, events=resumed.events, bytes=resumed.bytes,
        transactions=[{"id": t, "status": resumed.status} for t in resumed.txns], state_scope=state_scope,
        state_stream=state_stream, resumed=True,
    )
    result.tail_cut = _tail_text(client, spec) if resumed.status == "COMMITTED" else None
    result.seconds = time.monotonic() - started
    log.info("resumed run %s: %d events (%d bytes) from %d file(s) committed in %.1f s", resumed.run_id,
             result.events, result.bytes, len(result.files_ingested), result.seconds)
    return result


def whole_file_holds(reported: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    """txn -> the file keys it holds, from the write tasks' reports; a file in two transactions
    would make a lapsed transaction impossible to heal, so it is refused before the commit point."""
    holds = {txn: sorted({key_of(f) for f in files}) for txn, files in reported.items()}
    owner: dict[str, str] = {}
    for txn, keys in holds.items():
        for key in keys:
            if key in owner:
                raise IngestError(f"{key} was written by two transactions ({owner[key]} and {txn}); a file must lie "
                                  f"wholly in one transaction. Nothing of this run was committed; this is a bug of "
                                  f"the provider's partitioning (file_groups): please report it")
            owner[key] = txn
    return holds


def _line_pieces(get_spark: Callable[[], Any], store: Any, listed: Sequence[SourceFile],
                 identities: Mapping[str, Mapping[str, Any]], listed_at_ms: int,
                 local: bool = False) -> dict[str, dict[str, Any]]:
    """The next piece of every listed line file that may hold lines not committed yet (new, grown,
    changed, or with an unterminated last line that has settled since), measured in Spark tasks, or
    here when ``local`` (listed in this process) and small (:data:`LOCAL_MEASURE_MAX_BYTES`);
    files listed exactly as committed are left to planning (skipped) without being read (nor
    Spark started for them)."""
    committed = known_files(store, store.fetch(), identities)
    requests = {}
    for f in listed:
        before = committed.get(f.key)
        settled = listed_at_ms - f.mtime_ms >= TAIL_SETTLE_S * 1000
        if before is not None and same_file(before, identities[f.key]) and not (
                settled and committed_end(before) < before["size"]):
            continue
        requests[f.key] = {"size": f.size, "mtime": f.mtime_ms, "tail": settled,
                           "base": 0 if before is None else committed_end(before),
                           "fp": None if before is None else before.get("fp"),
                           # unknown (None) for a record from before pieces: measured
                           "open": bool(before.get("open")) if before is not None and "end" in before else
                           None if before is not None else False}
    if not requests:
        return {}
    size = sum(r["size"] for r in requests.values())
    if local and size <= LOCAL_MEASURE_MAX_BYTES:
        log.info("measuring %d line file(s) of %d bytes here (the whole lines not committed yet)",
                 len(requests), size)
        return measure_local_pieces(requests)
    log.info("measuring %d line file(s) in Spark tasks (the whole lines not committed yet)", len(requests))
    return measure_pieces(get_spark(), requests)


def _nothing_to_ingest(spec: IngestSpec, skipped: Sequence[tuple[str, str]] = ()) -> IngestResult:
    """``skipped``: (path, reason) of the matching files that hold nothing to read."""
    what = "matches no file"
    if skipped:
        empty = all(why == EMPTY_FILE for _, why in skipped)
        shown = [path if empty else f"{path}: {why}" for path, why in skipped[:5]]
        shown += [f"and {len(skipped) - 5} more"] if len(skipped) > 5 else []
        what = (f"matches {len(skipped)} file(s), {'all empty' if empty else 'none readable'}: "
                f"{(', ' if empty else '; ').join(shown)}")
    if spec.on_empty == "succeed":
        log.info("source %r %s: nothing to ingest", spec.source, what)
        return IngestResult(run_id=None)
    raise SourceError(f"source {spec.source!r} {what} (pass on_empty='succeed' to accept that)")


def _tail_positions(client: Any, spec: IngestSpec) -> dict[str, int]:
    """The target stream's tail as the interval index keeps it (segment id text -> offset)."""
    from airflow_provider_pravega.client.streamcut import StreamCut

    return {str(k): v for k, v in StreamCut.tail(client, spec.scope, spec.stream).positions.items()}


def _record_empty_interval(client: Any, spec: IngestSpec) -> None:
    """An interval whose source holds no file: recorded as an empty range in the interval index
    (so its export is empty, not an error), when the stream and the ingest's state exist."""
    if spec.interval_key is None or spec.mode != "exactly_once" or not client.admin.stream_exists(spec.scope, spec.stream):
        return
    store = open_ingest_state(client, spec.scope, spec.stream, spec.effective_ingest_id,
                              stale_after_s=spec.stale_after_s, state_scope=spec.state_scope)
    try:
        coord = IngestCoordinator(store, client.transactions, spec.scope, spec.stream, stale_after_s=spec.stale_after_s,
                                  lease_ms=client.transactions.default_lease_ms,
                                  tail_positions=lambda: _tail_positions(client, spec))
        coord.record_empty_interval(spec.interval_key)
    finally:
        store.close()


def config_of(client: Any) -> PravegaConnectionConfig:
    """The connection configuration tasks rebuild their client from."""
    if client.config is not None:
        return client.config
    return PravegaConnectionConfig.from_connection_fields(host=client.controller_uri)


def _tail_text(client: Any, spec: IngestSpec) -> str | None:
    try:
        from airflow_provider_pravega.client.streamcut import StreamCut

        return StreamCut.tail(client, spec.scope, spec.stream).to_text()
    except PravegaError as exc:  # informative only
        log.warning("could not read the tail cut of %s/%s: %s", spec.scope, spec.stream, exc)
        return None


# ---------------------------------------------------------------------------------------------
# Command line (also what the crash-matrix tests run as a process)
# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m airflow_provider_pravega.spark.ingest_job",
                                 description="Ingest files into a Pravega stream exactly once with PySpark.")
    add_connection_arguments(ap, lease=True)
    ap.add_argument("--scope", required=True)
    ap.add_argument("--stream", required=True)
    ap.add_argument("--source", required=True, action="append",
                    help="path, directory or glob, plain or a Hadoop filesystem URI (repeatable)")
    ap.add_argument("--format", default="jsonl", choices=FORMATS)
    ap.add_argument("--routing-key-field")
    ap.add_argument("--payload-field")
    ap.add_argument("--ingest-id")
    ap.add_argument("--mode", default="exactly_once", choices=MODES)
    ap.add_argument("--create-stream", action="store_true")
    ap.add_argument("--segments", type=int, default=1)
    ap.add_argument("--num-writers", type=int,
                    help="transactions (Spark tasks) per run; default: Spark's parallelism, at most one per "
                         "16 MiB planned")
    ap.add_argument("--stale-after", type=float, default=60.0)
    ap.add_argument("--unknown-commits", choices=("committed", "not_committed"), default=None,
                    help="how to resolve a crashed run whose transactions the controller forgot (see docs/ingest.md)")
    ap.add_argument("--remember-files-for", type=float, default=None,
                    help="seconds after which committed files are forgotten (default: never)")
    ap.add_argument("--interval", help="record the run's committed range under this interval key (see the export's "
                                       "--interval-of), e.g. 2026-11-20T00:00:00+00:00/2026-11-21T00:00:00+00:00")
    ap.add_argument("--state-scope", help="the scope keeping the ingest's state, created if missing (default: the "
                                          "stream's scope)")
    ap.add_argument("--on-empty", choices=("fail", "succeed"), default="fail",
                    help="what a source that matches no file does (default: fail)")
    ap.add_argument("--allow-changed-files", action="store_true",
                    help="re-ingest a file whose content changed since it was ingested")
    ap.add_argument("--no-wait-for-commit", dest="wait_for_commit", action="store_false",
                    help="return once the commits are requested (PravegaTransactionSensor waits for them)")
    ap.add_argument("--task-instance", help=argparse.SUPPRESS)  # what the operator passes: fast takeover
    ap.add_argument("--try-number", type=int, help=argparse.SUPPRESS)
    add_submission_argument(ap)
    add_spark_arguments(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from airflow_provider_pravega.spark.session import get_spark_session

    try:
        spec = IngestSpec(
            scope=args.scope, stream=args.stream, source=args.source, format=args.format,
            routing_key_field=args.routing_key_field, payload_field=args.payload_field, ingest_id=args.ingest_id,
            mode=args.mode, create_stream=args.create_stream, stream_segments=args.segments,
            num_writers=args.num_writers, stale_after_s=args.stale_after, unknown_commits=args.unknown_commits,
            task_instance=args.task_instance, try_number=args.try_number,
            remember_files_for_s=args.remember_files_for, interval_key=args.interval, on_empty=args.on_empty,
            state_scope=args.state_scope, allow_changed_files=args.allow_changed_files,
            wait_for_commit=args.wait_for_commit,
        )
        settings = spark_settings(args)
    except ValueError as exc:
        print(f"ingest failed: {exc}", file=sys.stderr)
        return 2

    def spark() -> Any:  # started only when there is something to ingest
        return get_spark_session(None, "pravega-ingest", share_session=True, **settings)

    return run_job_command("ingest", args, lambda client: run_ingest(client, spark, spec), (IngestError, PravegaError),
                           state_location=lambda: state_location(spec))


def job_arguments(spec: IngestSpec) -> list[str]:
    """The command-line arguments of :func:`main` that run ``spec`` (the connection's and Spark's
    options apart): what an operator hands a Spark application it submits."""
    argv = ["--scope", spec.scope, "--stream", spec.stream]
    for item in _items(spec.source):
        argv += ["--source", str(item)]
    argv += ["--format", spec.format, "--ingest-id", spec.effective_ingest_id, "--mode", spec.mode,
             "--segments", str(spec.stream_segments), "--stale-after", repr(spec.stale_after_s),
             "--on-empty", spec.on_empty]
    for option, value in (("--routing-key-field", spec.routing_key_field), ("--payload-field", spec.payload_field),
                          ("--num-writers", spec.num_writers), ("--unknown-commits", spec.unknown_commits),
                          ("--remember-files-for", spec.remember_files_for_s), ("--interval", spec.interval_key),
                          ("--state-scope", spec.state_scope), ("--task-instance", spec.task_instance),
                          ("--try-number", spec.try_number)):
        if value is not None:
            argv += [option, str(value)]
    if spec.create_stream:
        argv.append("--create-stream")
    if spec.allow_changed_files:
        argv.append("--allow-changed-files")
    if not spec.wait_for_commit:
        argv.append("--no-wait-for-commit")
    return argv


if __name__ == "__main__":
    # Also run as a file (spark-submit ships this one to the cluster): the package's module does the
    # work, so that every class exists once (an error raised deep in the package is one `main` knows).
    from airflow_provider_pravega.spark import ingest_job

    sys.exit(ingest_job.main())
