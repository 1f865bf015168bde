"""The Hadoop FileSystem calls of the stream-cut export's publish, for both kinds of Spark session.

The export publishes its output with the filesystem Spark writes through (local, HDFS, S3A, ...),
so the moves see what Spark's writers wrote. A classic session reaches it through py4j in the
driver's JVM (:class:`JvmFileSystem`); a Spark Connect client has no JVM, so each call goes to the
server as an extension relation that the plugin of :mod:`~airflow_provider_pravega.spark.connect_plugin`
answers (:class:`ConnectFileSystem`). Paths are Hadoop path texts; both raise
:class:`FileSystemError` with the first line of the Java exception.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

__all__ = ["ConnectFileSystem", "ConnectPluginMissingError", "FileSystemError", "JvmFileSystem", "Resolved",
           "filesystem_for", "is_connect"]


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
