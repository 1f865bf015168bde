"""A Spark standalone cluster for tests: a master and workers (one core, 1 GB, their own work
directories) from pyspark's own ``bin/spark-class`` on loopback (pravega_testing/
spark_standalone.py), their executor processes, and stopping every process again.

Each worker may get its own loopback address: Spark never launches a speculative copy of a task on
a host where an attempt of it already ran, so a speculation test needs workers on two "hosts"
(127.0.0.1 and 127.0.0.2 are both the loopback interface on Linux)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from pravega_testing import spark_standalone
from pravega_testing.net import free_port


#: Short-lived JVMs on a busy machine start much quicker with C1 only, the serial GC and the
#: suite's class archive (drivers and executors take it as spark.driver/executor.extraJavaOptions):
#: the options tests/conftest.py gave every spark-submit.
QUICK_JVM = os.environ.get("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


@dataclass
class SparkCluster:
    master_url: str
    workers: list[subprocess.Popen]
    env: dict[str, str]
    logs: Path

    def executors(self) -> list[psutil.Process]:
        """The executor JVMs (``CoarseGrainedExecutorBackend``) the workers started."""
        found = []
        for worker in self.workers:
            try:
                children = psutil.Process(worker.pid).children()
            except psutil.NoSuchProcess:
                continue
            for child in children:
                try:
                    if any("CoarseGrainedExecutorBackend" in arg for arg in child.cmdline()):
                        found.append(child)
                except psutil.NoSuchProcess:
                    pass
        return found

    def log_tail(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.logs.glob("*.log")))


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every process group (a worker's executors and their Python workers are in it), then
    SIGKILL what is left."""
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the group, even when its leader is gone
        except ProcessLookupError:
            pass
        proc.wait()


@contextmanager
def start_spark_cluster(root: Path, worker_hosts: Sequence[str] = ("127.0.0.1", "127.0.0.1")) -> Iterator[SparkCluster]:
    """A master on 127.0.0.1 and one worker per entry of ``worker_hosts`` (its address), ready once
    the master lists them all alive (else the test fails with the logs); stopped on exit."""
    env = spark_standalone.spark_env(root)
    port, ui = free_port(), free_port()
    master_url = f"spark://127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []

    def start(name: str, cmd: list[str], host: str = "127.0.0.1") -> subprocess.Popen:
        with (root / f"{name}.log").open("w") as log:
            proc = subprocess.Popen(cmd, env={**env, "SPARK_LOCAL_IP": host, "SPARK_DAEMON_JAVA_OPTS": QUICK_JVM},
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(proc)
        return proc

    try:
        start("master", spark_standalone.master_command(port, ui))
        workers = []
        for i, host in enumerate(worker_hosts):
            work_dir = root / f"work-{i}"
            work_dir.mkdir()
            workers.append(start(f"worker-{i}", spark_standalone.worker_command(master_url, work_dir, free_port(),
                                                                                 host=host), host))
        cluster = SparkCluster(master_url, workers, env, root)
        try:  # ready when the master's UI lists every worker alive
            spark_standalone.wait_for_workers(ui, len(workers), timeout_s=120,
                                              still_running=lambda: all(p.poll() is None for p in procs))
        except spark_standalone.SparkStandaloneError as exc:
            pytest.fail(f"the Spark cluster did not start ({exc}):\n{cluster.log_tail()}")
        yield cluster
    finally:
        _stop(procs)
