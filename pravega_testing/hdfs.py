"""A real HDFS for tests: Hadoop's own ``MiniDFSCluster`` (a NameNode and a DataNode in one JVM,
on loopback ports), started through its command-line manager from ``hadoop-client-minicluster`` at
the version of pyspark's Hadoop, with pyspark's jars beside it. Maven fetches the jar (and the
JUnit API classes MiniDFSCluster links against) from Maven Central into the project's cache the
first time (about 57 MB), as the Pravega standalone backend fetches its jars."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_pravega._cache import cache_dir
from pravega_testing.object_store import hadoop_version
from pravega_testing.spark_connect import stop_group

#: JUnit 5 as Hadoop 3.5's build uses it (MiniDFSCluster calls its assertions).
_JUNIT = ("org.junit.jupiter:junit-jupiter-api:5.13.3", "org.junit.platform:junit-platform-commons:1.13.3",
          "org.opentest4j:opentest4j:1.3.0")
_MANAGER = "org.apache.hadoop.test.MiniDFSClusterManager"


class HdfsUnavailable(RuntimeError):
    """No Java or Maven, or Maven Central refused: the HDFS tests skip with this reason."""


def minicluster_jars() -> list[Path]:
    """hadoop-client-minicluster and JUnit's API in the cache, fetched by Maven when missing."""
    return maven_jars((f"org.apache.hadoop:hadoop-client-minicluster:{hadoop_version()}", *_JUNIT),
                      cache_dir("hdfs-minicluster"))


def maven_jars(artifacts: tuple[str, ...], directory: Path) -> list[Path]:
    """The jars of ``artifacts`` (``group:name:version``, no dependencies) in ``directory``, fetched
    by Maven from Maven Central when missing; HdfsUnavailable without java or mvn."""
    jars = [directory / f"{a.split(':')[1]}-{a.split(':')[2]}.jar" for a in artifacts]
    missing = [a for a, jar in zip(artifacts, jars, strict=True) if not jar.exists()]
    if not missing:
        return jars
    mvn, java = shutil.which("mvn"), shutil.which("java")
    if not mvn or not java:
        raise HdfsUnavailable("HDFS minicluster needs java and mvn on PATH")
    directory.mkdir(parents=True, exist_ok=True)
    for artifact in missing:
        done = subprocess.run(
            [mvn, "-B", "-q", "org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy",
             f"-Dartifact={artifact}", f"-DoutputDirectory={directory}"],
            capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise HdfsUnavailable(f"maven could not fetch {artifact}: {(done.stdout + done.stderr)[-800:]}")
    return jars


def _namenode_port(details: Path) -> int | None:
    try:
        return int(json.loads(details.read_text())["namenode_port"])
    except (OSError, ValueError, KeyError):
        return None  # not written (completely) yet


@dataclass
class Hdfs:
    """A running minicluster: ``uri`` is ``hdfs://127.0.0.1:<port>``."""

    uri: str
    process: subprocess.Popen
    log: Path


@contextmanager
def hdfs_minicluster(work: Path, *, timeout_s: float = 180.0) -> Iterator[Hdfs]:
    """MiniDFSCluster (one DataNode) with its data under ``work``; stopped (its whole process
    group) on exit."""
    import pyspark

    jars = minicluster_jars()
    classpath = os.pathsep.join([*map(str, jars), str(Path(pyspark.__file__).parent / "jars" / "*")])
    work.mkdir(parents=True, exist_ok=True)
    details, log = work / "details.json", work / "minicluster.log"
    cmd = [shutil.which("java") or "java", "-Xmx512m", f"-Dtest.build.data={work / 'data'}",
           "-Djava.net.preferIPv4Stack=true", "-cp", classpath, _MANAGER, "-datanodes", "1", "-format",
           "-writeDetails", str(details),
           # Loopback only (MiniDFSCluster binds its NameNode and DataNode to 127.0.0.1 already).
           "-D", "dfs.namenode.http-address=127.0.0.1:0", "-D", "dfs.datanode.address=127.0.0.1:0",
           "-D", "dfs.datanode.http.address=127.0.0.1:0", "-D", "dfs.datanode.ipc.address=127.0.0.1:0"]
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while (port := _namenode_port(details)) is None:
            if process.poll() is not None:
                raise RuntimeError(f"the HDFS minicluster exited ({process.returncode}): "
                                   f"{log.read_text(errors='replace')[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the HDFS minicluster did not start within {timeout_s:.0f} s; see {log}")
            time.sleep(0.5)
        yield Hdfs(f"hdfs://127.0.0.1:{port}", process, log)
    finally:
        stop_group(process.pid, reap=process.poll)
        process.wait()
