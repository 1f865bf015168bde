"""The Hadoop FileSystem calls of the stream-cut export's publish, for both kinds of Spark session.

The export publishes its output with the filesystem Spark writes through (local, HDFS, S3A, ...),
so the moves see what Spark's writers wrote. A classic session reaches it through py4j in the
driver's JVM (:class:`JvmFileSystem`); a Spark Connect client has no JVM, so each call goes to the
server as an extension relation that the plugin of :mod:`~airflow_provider_pravega.spark.connect_plugin`
answers (:class:`ConnectFileSystem`). Paths are Hadoop path texts; both raise
:class:`FileSystemError` with the first line of the Java exception. An export with nothing to
write to this machine's files needs no Spark at all: :class:`LocalFileSystem` does the same calls
with Python's own file functions.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from typing import Any

__all__ = ["ConnectFileSystem", "ConnectPluginMissingError", "FileSystemError", "JvmFileSystem", "LocalFileSystem",
           "Resolved", "filesystem_for", "is_connect", "local_path"]


class FileSystemError(Exception):
    """A filesystem call failed (the message is the first line of the Java exception)."""


class ConnectPluginMissingError(FileSystemError):
    """The Spark Connect server does not have the provider's plugin loaded."""


@dataclass(frozen=True)
class Resolved:
    path: str
    parent: str | None
    name: str
    scheme: str


def is_connect(spark: Any) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def filesystem_for(spark: Any) -> JvmFileSystem | ConnectFileSystem:
    return ConnectFileSystem(spark) if is_connect(spark) else JvmFileSystem(spark)


def java_message(exc: BaseException | None) -> str:
    """The first line of a Java exception's message (py4j adds a long stack trace)."""
    if exc is None:
        return ""
    if isinstance(exc, FileSystemError):
        return str(exc)
    java = getattr(exc, "java_exception", None)
    if java is not None:
        from py4j.protocol import Py4JError

        with contextlib.suppress(Py4JError, IndexError):
            return str(java.toString()).splitlines()[0]
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def local_path(path: str) -> str | None:
    """The absolute local path of a plain path or a ``file:`` URI; None for any other filesystem."""
    head, sep, _ = path.partition("://")
    if sep and head.isidentifier() and head.lower() != "file":
        return None
    if path.startswith("file:"):
        from urllib.parse import unquote, urlsplit

        path = unquote(urlsplit(path).path) if path.startswith("file://") else path[len("file:"):]
    elif ":" in path.split("/", 1)[0]:  # another scheme without "//" (e.g. "s3a:bucket")
        return None
    return os.path.abspath(path)


class LocalFileSystem:
    """This machine's files, with the calls of :class:`JvmFileSystem`, for an export that writes
    without Spark (nothing to read, a local output path): no JVM is started for it."""

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except OSError as exc:
            raise FileSystemError(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from None

    def resolve(self, path: str) -> Resolved:
        local = local_path(path)
        if local is None:
            raise FileSystemError(f"{path} is not a local path")
        parent = os.path.dirname(local)
        return Resolved(local, None if parent == local else parent, os.path.basename(local), "file")

    def child(self, base: str, name: str) -> str:
        return os.path.join(base, name)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def mkdirs(self, path: str) -> bool:
        self._call(os.makedirs, path, 0o777, True)
        return True

    def create(self, path: str) -> None:
        self._call(lambda: open(path, "wb").close())

    def list(self, path: str) -> list[str]:
        return sorted(self._call(os.listdir, path))

    def rename(self, src: str, dst: str) -> bool:
        if os.path.exists(dst):  # Hadoop's rename refuses to replace
            return False
        self._call(os.rename, src, dst)
        return True

    def delete(self, path: str, recursive: bool) -> bool:
        if not os.path.lexists(path):
            return False
        if os.path.isdir(path) and not os.path.islink(path):
            self._call(shutil.rmtree if recursive else os.rmdir, path)
        else:
            self._call(os.remove, path)
        return True

    def read_text(self, path: str) -> str:
        def read() -> str:
            with open(path, encoding="utf-8") as file:
                return file.read().rstrip("\n")

        return self._call(read)

    def write_text(self, path: str, text: str) -> None:
        def write() -> None:
            with open(path, "w", encoding="utf-8") as file:
                file.write(text)

        self._call(write)


class JvmFileSystem:
    """Classic sessions: the driver JVM's Hadoop FileSystem of the resolved path, through py4j."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self._Path = spark._jvm.org.apache.hadoop.fs.Path
        self._fs: Any = None

    def _call(self, fn: Any, *args: Any) -> Any:
        from py4j.protocol import Py4JError

        try:
            return fn(*args)
        except Py4JError as exc:
            raise FileSystemError(java_message(exc)) from None

    def resolve(self, path: str) -> Resolved:
        def go() -> Resolved:
            p = self._Path(path)
            self._fs = p.getFileSystem(self.spark._jsc.hadoopConfiguration())
            parent = p.getParent()
            return Resolved(p.toString(), None if parent is None else parent.toString(), p.getName(),
                            str(self._fs.getScheme()))

        return self._call(go)

    def child(self, base: str, name: str) -> str:
        return self._call(lambda: self._Path(self._Path(base), name).toString())

    def exists(self, path: str) -> bool:
        return bool(self._call(lambda: self._fs.exists(self._Path(path))))

    def is_dir(self, path: str) -> bool:
        return bool(self._call(lambda: self._fs.getFileStatus(self._Path(path)).isDirectory()))

    def mkdirs(self, path: str) -> bool:
        return bool(self._call(lambda: self._fs.mkdirs(self._Path(path))))

    def create(self, path: str) -> None:
        self._call(lambda: self._fs.create(self._Path(path), True).close())

    def list(self, path: str) -> list[str]:
        return self._call(lambda: [s.getPath().getName() for s in self._fs.listStatus(self._Path(path))])

    def rename(self, src: str, dst: str) -> bool:
        return bool(self._call(lambda: self._fs.rename(self._Path(src), self._Path(dst))))

    def delete(self, path: str, recursive: bool) -> bool:
        return bool(self._call(lambda: self._fs.delete(self._Path(path), recursive)))

    def read_text(self, path: str) -> str:
        def go() -> str:
            stream = self._fs.open(self._Path(path))
            try:
                jio = self.spark._jvm.java.io
                reader = jio.BufferedReader(jio.InputStreamReader(stream, "UTF-8"))
                lines = []
                while (line := reader.readLine()) is not None:
                    lines.append(line)
                return "\n".join(lines)
            finally:
                stream.close()

        return self._call(go)

    def write_text(self, path: str, text: str) -> None:
        def go() -> None:
            stream = self._fs.create(self._Path(path), True)
            try:
                stream.write(bytearray(text.encode("utf-8")))
            finally:
                stream.close()

        self._call(go)


def _extension_plan(request: str) -> Any:
    """A Spark Connect logical plan: one extension relation carrying ``request`` as a StringValue."""
    from google.protobuf.wrappers_pb2 import StringValue
    from pyspark.sql.connect import proto
    from pyspark.sql.connect.plan import LogicalPlan

    class _FsRequest(LogicalPlan):
        def __init__(self) -> None:
            super().__init__(None)

        def plan(self, session: Any) -> Any:
            rel = proto.Relation()  # no plan id: the server caches plans by id, and each call must run
            rel.extension.Pack(StringValue(value=request))
            return rel

    return _FsRequest()


class ConnectFileSystem:
    """Spark Connect sessions: each call is a JSON request the server's plugin runs with its own
    Hadoop configuration (the one its writers use)."""

    VERSION = 1

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    def _call(self, op: str, **fields: Any) -> Any:
        return self.request({"pravega_fs": self.VERSION, "op": op, **fields, "nonce": uuid.uuid4().hex})

    def request(self, payload: dict[str, Any]) -> Any:
        """Send one request to the server's plugin; its ``value``."""
        from pyspark.sql.connect.dataframe import DataFrame

        try:
            table, _ = DataFrame(_extension_plan(json.dumps(payload)), self.spark)._to_table()
        except Exception as exc:
            text = str(exc)
            if "NO_HANDLER_FOR_EXTENSION" in text or "No handler found for extension" in text:
                raise ConnectPluginMissingError(
                    "the Spark Connect server does not have the provider's filesystem plugin, which the export "
                    "needs to publish its files: build it with `python -m airflow_provider_pravega.spark."
                    "connect_plugin` and start the server with the --jars and --conf it prints "
                    f"({java_message(exc)})") from None
            raise FileSystemError(java_message(exc)) from None
        answer = json.loads(table.column(0)[0].as_py())
        if "error" in answer:
            raise FileSystemError(answer["error"])
        return answer["value"]

    def resolve(self, path: str) -> Resolved:
        value = self._call("resolve", path=path)
        return Resolved(value["path"], value["parent"], value["name"], value["scheme"])

    def child(self, base: str, name: str) -> str:
        return f"{base.rstrip('/')}/{name}"  # Hadoop's Path(base, name) for a plain name

    def exists(self, path: str) -> bool:
        return bool(self._call("exists", path=path))

    def is_dir(self, path: str) -> bool:
        return bool(self._call("is_dir", path=path))

    def mkdirs(self, path: str) -> bool:
        return bool(self._call("mkdirs", path=path))

    def create(self, path: str) -> None:
        self._call("create", path=path)

    def list(self, path: str) -> list[str]:
        return list(self._call("list", path=path))

    def rename(self, src: str, dst: str) -> bool:
        return bool(self._call("rename", src=src, dst=dst))

    def delete(self, path: str, recursive: bool) -> bool:
        return bool(self._call("delete", path=path, recursive=recursive))

    def read_text(self, path: str) -> str:
        return str(self._call("read", path=path))

    def write_text(self, path: str, text: str) -> None:
        self._call("write", path=path, text=text)
