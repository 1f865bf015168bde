"""The ingest's source files: listing paths, directories and globs as Spark does (without Spark
for local files where that is certain), the names the ingest state keys them by, and reading them."""

from __future__ import annotations

import glob
import logging
import os
import re
import socket
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import functions as F
from urllib.parse import unquote, urlsplit

from airflow_provider_pravega._clock import now_ms
from airflow_provider_pravega.spark.ingest_spec import SourceError, source_items

log = logging.getLogger(__name__)


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


def _scheme(item: str) -> str | None:
    head, sep, _ = item.partition("://")
    if sep and head.isidentifier():
        return head.lower()
    if item.startswith("file:/"):
        return "file"
    return None


def local_path(item: str) -> str | None:
    """The local filesystem path of a plain path or ``file:`` URI; None for other schemes."""
    scheme = _scheme(item)
    if scheme is None:
        return os.path.abspath(item)
    if scheme == "file":
        return unquote(urlsplit(item).path) if item.startswith("file://") else item[len("file:"):]
    return None


def key_of(uri: str) -> str:
    """State key of a file URI as Spark reports it (``file:/x``, ``file:///x%20y``, ``s3a://b/k``)."""
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


def is_local_key(key: str) -> bool:
    """Whether a state key names a local file (:func:`key_of`: a plain absolute path)."""
    return key.startswith("/")


def uri_of(key: str) -> str:
    """What Spark is given to read a state key: the file itself, whatever its name holds (glob
    characters escaped), local paths explicitly on ``file:`` whatever the cluster's default
    filesystem is."""
    return f"file://{escape_glob(key)}" if is_local_key(key) else escape_glob(key)


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
    started_ms = now_ms()
    for item in source_items(source):
        path = local_path(item)
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
    frames = []
    for item in source_items(source):
        local = local_path(item)
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
        raise SourceError(f"cannot list source {source_items(source)!r}: {_listing_error(str(exc))}") from None
    files = {key_of(r["path"]): SourceFile(key_of(r["path"]), uri_of(key_of(r["path"])), r["length"], r["mtime"])
             for r in rows}
    return [files[k] for k in sorted(files)]


def file_contents(spark: Any, keys: Iterable[str]) -> Any:
    """(path, content) of each file, one row a file, read in Spark tasks through Hadoop (never on
    the driver): what fingerprinting, measuring and reading line files start from."""
    return spark.read.format("binaryFile").load([uri_of(k) for k in keys]).select("path", "content")


def file_gone(key: str) -> SourceError:
    return SourceError(f"{key} was listed but is gone: it was deleted or renamed while the ingest ran")


def file_gone_where_read(key: str, host: str) -> SourceError:
    """The error of a local file its write task did not find on ``host``, where the task ran: gone
    since it was listed, or, on another host, never there (a disk only this host has)."""
    if host == socket.gethostname() or not os.path.exists(key):
        return file_gone(key)
    return SourceError(f"{key} is on the disk of {socket.gethostname()}, where it was listed, but not on {host}, "
                       f"where the Spark task writing it ran: local source files must be on a filesystem every "
                       f"Spark executor sees (a shared mount), or on the cluster's own (hdfs://, s3a:// ...)")


def local_bytes(key: str, upto: int = -1) -> bytes | None:
    """The bytes of a local file (its first ``upto``), None if it is gone; any other failure to
    read it is a :class:`SourceError` naming it."""
    try:
        with open(local_path(key) or key, "rb") as fh:
            return fh.read(upto)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SourceError(f"cannot read {key}: {exc.strerror or exc}") from None


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
