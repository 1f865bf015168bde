"""The Spark Connect server plugin the stream-cut export needs to run through Spark Connect.

A Spark Connect client has no JVM, so the export cannot move its files with the driver's Hadoop
FileSystem; instead it sends each filesystem call to the server as an extension relation, which
``PravegaFsRelationPlugin`` (the Java source next to this file) answers with the server's own Hadoop
configuration. The jar is built here from that source with ``javac`` against pyspark's jars (never
shipped as a binary): ``python -m airflow_provider_pravega.spark.connect_plugin --out DIR`` prints
the ``--jars`` path and the ``--conf`` line to add to the Connect server's command.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from airflow_provider_pravega._cache import cache_dir

__all__ = ["PLUGIN_CLASS", "PLUGIN_CONF", "SOURCE", "PluginBuildError", "build_plugin_jar", "default_dir", "main",
           "server_arguments"]

SOURCE = Path(__file__).with_name("PravegaFsRelationPlugin.java")
PLUGIN_CLASS = "airflow_provider_pravega.spark.PravegaFsRelationPlugin"
#: The Spark Connect server setting that loads the plugin.
PLUGIN_CONF = "spark.connect.extensions.relation.classes"


class PluginBuildError(RuntimeError):
    """The plugin jar could not be compiled (no JDK, no pyspark jars, a compile error)."""


def _spark_jars() -> Path:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    if not jars.is_dir():
        raise PluginBuildError(f"pyspark has no jars directory at {jars} (a pyspark-client install?)")
    return jars


def _tool(name: str) -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / name).is_file():
        return str(Path(home) / "bin" / name)
    found = shutil.which(name)
    if found is None:
        raise PluginBuildError(f"{name} not found: building the plugin needs a JDK 17+ (set JAVA_HOME)")
    return found


def default_dir() -> Path:
    """``$PRAVEGA_CONNECT_PLUGIN_DIR``, else the project's cache directory."""
    return cache_dir("connect-plugin", "PRAVEGA_CONNECT_PLUGIN_DIR")


def build_plugin_jar(out_dir: str | os.PathLike[str] | None = None) -> Path:
    """The plugin jar in ``out_dir`` (default: the project's cache directory), compiled unless a jar
    of the same source and pyspark version is already there."""
    import pyspark

    out = Path(out_dir) if out_dir is not None else default_dir()
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + pyspark.__version__.encode()).hexdigest()[:12]
    jar = out / f"pravega-connect-plugin-{pyspark.__version__}-{digest}.jar"
    if jar.is_file():
        return jar
    out.mkdir(parents=True, exist_ok=True)
    jars = _spark_jars()
    with tempfile.TemporaryDirectory(prefix="pravega-connect-plugin-") as work:
        classes = Path(work) / "classes"
        done = subprocess.run(
            [_tool("javac"), "--release", "17", "-nowarn", "-encoding", "UTF-8", "-cp", f"{jars}{os.sep}*",
             "-d", str(classes), str(SOURCE)], capture_output=True, text=True)
        if done.returncode != 0:
            raise PluginBuildError(f"javac failed:\n{(done.stdout + done.stderr)[-3000:]}")
        partial = out / f".{jar.name}.{os.getpid()}.partial"
        try:
            with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zf:
                zf.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
                for path in sorted(classes.rglob("*.class")):
                    zf.write(path, path.relative_to(classes).as_posix())
            os.replace(partial, jar)  # whole or not at all: a concurrent build finds a complete jar or none
        finally:
            partial.unlink(missing_ok=True)
    return jar


def server_arguments(jar: str | os.PathLike[str]) -> list[str]:
    """What to add to ``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer``."""
    return ["--jars", str(jar), "--conf", f"{PLUGIN_CONF}={PLUGIN_CLASS}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m airflow_provider_pravega.spark.connect_plugin",
        description="Build the Spark Connect server plugin the Pravega stream-cut export needs, and print how "
                    "to load it into a Spark Connect server.")
    ap.add_argument("--out", help="directory of the jar (default: the project's cache directory)")
    args = ap.parse_args(argv)
    try:
        jar = build_plugin_jar(args.out)
    except PluginBuildError as exc:
        print(f"building the plugin failed: {exc}", file=sys.stderr)
        return 1
    print(f"jar: {jar}")
    print("add to the Spark Connect server's spark-submit: " + " ".join(server_arguments(jar)))
    print(f"or in spark-defaults.conf: spark.jars {jar}")
    print(f"                           {PLUGIN_CONF} {PLUGIN_CLASS}")
    return 0
