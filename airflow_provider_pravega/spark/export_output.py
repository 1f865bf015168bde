"""The output directory of a file export: what is there, and the writes that replace it.

An export writes its interval with Spark's own commit protocol: ``mode("overwrite")`` on the output
directory, so Spark's output committer (Hadoop's ``FileOutputCommitter``, or an S3A committer on an
object store) makes the files visible at job commit and then writes ``_SUCCESS``. A reader sees a
complete interval when ``_SUCCESS`` is there. Nothing here calls a filesystem API of its own
through the session: it is the same code on a classic session and on any Spark Connect server,
stock or managed, with no server plugin. The one exception is the marker of an earlier release
(:func:`hidden_file_text`): a ``_`` name, which Spark's readers leave out, so a folder not on this
machine has it read through the driver's Hadoop filesystem of a classic session.

Whose directory it is lives in the export's state in Pravega (the output's claim, recorded before
the write), not in a file beside the data. What is at the path is listed through the session's
own reader (:func:`visible_files`: the ``binaryFile`` source's file index, no Spark job), or here
(:func:`local_visible_files`) when the session's files are this machine's
(:func:`session_local_path`), so the export never replaces files it did not write.

An export with nothing to read into a local path, when the session would run on this machine,
needs no Spark at all: :func:`write_empty_locally` writes what Spark writes for no rows with
Python's own file functions.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["UnusablePathError", "hadoop_file_text", "hidden_file_text", "local_path", "local_visible_files",
           "output_key", "path_problem", "session_local_path", "visible_files", "write_empty_locally"]


class UnusablePathError(Exception):
    """The session cannot list the path (an invalid URI, an unknown scheme, a missing connector);
    the message is the first line of Spark's error."""


def output_key(path: str) -> str:
    """The output path as the export's state records it (spaces and trailing slashes dropped)."""
    return path.strip().rstrip("/") or "/"


def local_path(path: str) -> str | None:
    """The absolute local path of a plain path or a ``file:`` URI; None for any other filesystem."""
    head, sep, _ = path.partition("://")
    if sep and head.isidentifier() and head.lower() != "file":
        return None
    if path.startswith("file:"):
        path = unquote(urlsplit(path).path) if path.startswith("file://") else path[len("file:"):]
    elif ":" in path.split("/", 1)[0]:  # another scheme without "//" (e.g. "s3a:bucket")
        return None
    return os.path.abspath(path)


def _hidden(name: str) -> bool:
    """Names Spark's file index leaves out (and so does every reader of Spark's output): ``.`` and
    ``_`` names (but partition directories such as ``_day=1`` and Parquet's ``_metadata`` files)
    and files still being copied (as Hadoop's ``shouldFilterOutPathName``)."""
    if name.startswith(("_metadata", "_common_metadata")):
        return False
    return name.startswith(".") or name.startswith("_") and "=" not in name or name.endswith("._COPYING_")


def java_message(exc: BaseException) -> str:
    """The first line of a Java exception's message (py4j and Spark Connect add long traces)."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        with contextlib.suppress(Exception):
            return str(java.toString()).splitlines()[0]
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def visible_files(spark: Any, path: str) -> list[str] | None:
    """The files a reader of ``path`` finds, as the session's filesystem lists them (qualified
    URIs; hidden ``_``/``.`` names left out, subdirectories included); None when nothing is there.
    One file index of the ``binaryFile`` source: planning only, no Spark job, no file read."""
    try:
        return sorted(spark.read.format("binaryFile").load(path).inputFiles())
    except Exception as exc:
        text = str(exc)
        if "PATH_NOT_FOUND" in text or "Path does not exist" in text:
            return None
        raise UnusablePathError(java_message(exc)) from None


def session_local_path(spark: Any, path: str) -> str | None:
    """The local path of ``path`` when ``spark`` reads and writes it on this machine's filesystem:
    a classic session in local mode, and a ``file:`` URI or a plain path under a local default
    filesystem. None otherwise (Spark Connect, a cluster, another filesystem). Listing such a
    path with Python's own functions finds what Spark finds, without a round trip through the JVM
    (about 45 ms per listing)."""
    if spark is None or type(spark).__module__.startswith("pyspark.sql.connect"):
        return None
    mine = local_path(path)
    if mine is None:
        return None
    try:
        context = spark.sparkContext
        if not context.master.startswith("local"):
            return None
        if not path.startswith("file:"):
            default_fs = context._jsc.hadoopConfiguration().get("fs.defaultFS") or "file:///"
            if not default_fs.startswith("file:"):
                return None
    except Exception:  # noqa: BLE001 - a session that cannot say: list through it
        return None
    return mine


def local_visible_files(path: str) -> list[str] | None:
    """:func:`visible_files` of a local directory, without Spark."""
    if not os.path.lexists(path):
        return None
    if not os.path.isdir(path):
        return [path]
    found = []
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not _hidden(d)]
        found.extend(os.path.join(root, name) for name in files if not _hidden(name))
    return sorted(found)


def hidden_file_text(spark: Any, path: str, name: str) -> str | None:
    """The UTF-8 text of the hidden file ``name`` (a ``_`` name, such as an earlier release's
    marker) in the directory ``path``; None when it is not there. Spark's readers leave such names
    out, so it is read here when the session's files are this machine's (or there is no session),
    else through the driver's Hadoop filesystem of a classic session. UnusablePathError through
    Spark Connect on another filesystem: its client reaches no filesystem but through readers."""
    here = local_path(path) if spark is None else session_local_path(spark, path)
    if spark is None or here is not None:
        file = os.path.join(here or local_path(path) or path, name)
        if not os.path.isfile(file):
            return None
        with open(file, encoding="utf-8") as handle:
            return handle.read()
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        raise UnusablePathError(f"{output_key(path)}/{name} cannot be read through Spark Connect (Spark's readers "
                                f"leave out '_' names; a classic session reads it)")
    return hadoop_file_text(spark, f"{output_key(path)}/{name}")


def hadoop_file_text(spark: Any, uri: str) -> str | None:
    """The UTF-8 text of the file ``uri`` through the Hadoop filesystem of a classic session's
    driver (None when there is no such file); UnusablePathError with Hadoop's first line."""
    try:
        jvm = spark.sparkContext._jvm
        target = jvm.org.apache.hadoop.fs.Path(uri)
        fs = target.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        if not fs.isFile(target):
            return None
        stream = fs.open(target)
        try:
            return bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream)).decode("utf-8")
        finally:
            stream.close()
    except Exception as exc:  # noqa: BLE001 - a missing connector, no permission: the first line says which
        raise UnusablePathError(java_message(exc)) from None


#: What Hadoop and Spark say when the output path itself cannot be written (not a failed task).
_PATH_PROBLEMS = ("Mkdirs failed", "ParentNotDirectoryException", "AccessDeniedException", "Permission denied",
                  "Read-only file system", "Not a directory", "not a directory", "FileAlreadyExistsException")


#: What Delta says when it cannot create its log at the table's path (read-only, ``/proc``); its
#: cause, when it names one (a file in the way), is the clearer line.
_DELTA_LOG_PROBLEM = "[DELTA_CANNOT_CREATE_LOG_PATH] "


def path_problem(exc: BaseException) -> str | None:
    """The line of a failed write's error that says the output path cannot be written (not a
    failed task); None for other failures."""
    text = str(exc)
    lines = text.splitlines()
    if any(problem in text for problem in _PATH_PROBLEMS):
        return next((line.strip() for line in lines if any(p in line for p in _PATH_PROBLEMS)), java_message(exc))
    return next((line.split(_DELTA_LOG_PROBLEM, 1)[1].strip() for line in lines if _DELTA_LOG_PROBLEM in line), None)


def write_empty_locally(path: str, fmt: str, event_format: str) -> list[str]:
    """Write at the local directory ``path`` what Spark's writer leaves for no rows, replacing what
    is there (the caller checked it may): a Parquet file with only the schema (Spark's schema
    metadata included, so Spark reads the same types back), an empty JSON-lines file or a CSV file
    with only its header, and ``_SUCCESS``. Written beside it, then renamed into place. The part
    file's name."""
    fields = [("event", "binary" if event_format == "binary" else "string"), ("segment_id", "long"),
              ("offset", "long")]
    parent, name = os.path.split(path)
    token = uuid.uuid4()
    staging = os.path.join(parent, f".{name}.pravega-export-{token.hex[:12]}")
    try:
        os.makedirs(staging)
        part = f"part-00000-{token}-c000"
        if fmt == "parquet":
            # import cost: pyarrow (0.3-0.5 s) only where a batch is built, not with the module: an empty output written without Spark
            import pyarrow as pa
            import pyarrow.parquet as pq

            arrow = {"binary": pa.binary(), "string": pa.string(), "long": pa.int64()}
            # The export's columns are never null (the data source's rows), and Spark records it so.
            row = {"type": "struct",
                   "fields": [{"name": n, "type": t, "nullable": False, "metadata": {}} for n, t in fields]}
            schema = pa.schema([pa.field(n, arrow[t], nullable=False) for n, t in fields], metadata={
                "org.apache.spark.sql.parquet.row.metadata": json.dumps(row, separators=(",", ":"))})
            part += ".snappy.parquet"
            pq.write_table(schema.empty_table(), os.path.join(staging, part), compression="snappy")
        else:
            part += ".json" if fmt == "jsonl" else ".csv"
            with open(os.path.join(staging, part), "w", encoding="utf-8") as file:
                file.write("" if fmt == "jsonl" else ",".join(n for n, _ in fields) + "\n")
        open(os.path.join(staging, "_SUCCESS"), "wb").close()
        aside = None
        if os.path.lexists(path):
            aside = os.path.join(parent, f".{name}.pravega-replaced-{token.hex[:12]}")
            os.rename(path, aside)
        os.rename(staging, path)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [part]
