"""A Spark standalone master and workers from pyspark's own ``bin/spark-class`` (no Spark download):
the command lines, their environment and the readiness check. ``scripts/stack --spark`` and the
cluster test (tests/lake/test_cluster.py) both start theirs with these."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path


class SparkStandaloneError(RuntimeError):
    """The master or a worker did not come up."""


def spark_home() -> Path:
    """pyspark's installation directory (it ships ``bin/spark-class`` and the jars)."""
    import pyspark

    return Path(pyspark.__file__).parent


def spark_env(log_dir: str | os.PathLike[str], base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the master, the workers and drivers talking to them: loopback only,
    Python workers on this interpreter, logs under ``log_dir``, no daemonizing."""
    return dict(base if base is not None else os.environ, SPARK_HOME=str(spark_home()), PYSPARK_PYTHON=sys.executable,
                SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(log_dir), SPARK_NO_DAEMONIZE="1")


def master_command(port: int, webui_port: int) -> list[str]:
    return [str(spark_home() / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(webui_port)]


def worker_command(master_url: str, work_dir: str | os.PathLike[str], webui_port: int, *, cores: int = 1,
                   memory: str = "1g", host: str = "127.0.0.1") -> list[str]:
    """A worker on ``host`` (a loopback address; its executors take the same one)."""
    return [str(spark_home() / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker", master_url,
            "--cores", str(cores), "--memory", memory, "--work-dir", str(work_dir), "--webui-port", str(webui_port),
            "--host", host]


def alive_workers(master_webui_port: int) -> int | None:
    """How many workers the master's UI lists alive (None while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{master_webui_port}/json/", timeout=2) as resp:
            return int(json.load(resp).get("aliveworkers", 0))
    except (OSError, ValueError):
        return None


def wait_for_workers(master_webui_port: int, count: int, *, timeout_s: float = 120.0,
                     still_running: Callable[[], bool] = lambda: True) -> None:
    """Until the master lists ``count`` workers alive; SparkStandaloneError when ``still_running``
    turns false (a process died) or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (alive_workers(master_webui_port) or 0) < count:
        if not still_running():
            raise SparkStandaloneError("a Spark master or worker process exited while starting")
        if time.monotonic() > deadline:
            raise SparkStandaloneError(f"the Spark master did not list {count} alive worker(s) within {timeout_s:.0f} s")
        time.sleep(0.3)
