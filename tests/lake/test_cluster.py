"""Ingest on a real Spark standalone cluster: a master and two workers (one core, 1 GB, their own
work directories) started from pyspark's own ``bin/spark-class`` on loopback, the ingest job's
command line as the driver (``--master spark://…``), a ``file://`` glob every worker sees.

While the write tasks run, one executor JVM is SIGKILLed: Spark retries its tasks on the executors
left (or the one its worker starts instead), the run succeeds, every record is in the stream exactly
once, and the rerun ingests nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from spark_cluster import SparkCluster, start_spark_cluster

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.batch import plan_segment_ranges, read_segment_range
from airflow_provider_pravega.client.ingest_location import open_state_store, state_location
from airflow_provider_pravega.client.streamcut import StreamCut


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    with start_spark_cluster(tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster


def _ingest_cmd(controller_uri: str, master: str, scope: str, source: str) -> list[str]:
    return [sys.executable, "-m", "airflow_provider_pravega.spark.ingest_job", "--controller-uri", controller_uri,
            "--scope", scope, "--stream", "readings", "--source", source, "--routing-key-field", "sensor_id",
            "--ingest-id", "cluster", "--create-stream", "--segments", "2", "--num-writers", "2",
            "--master", master, "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
            "--conf", "spark.executor.memory=768m", "--conf", "spark.ui.showConsoleProgress=false",
            # A cluster master keeps Spark's UI on; it would listen on every interface: not in a test.
            "--conf", "spark.ui.enabled=false"]


def _writing_started(client: PravegaClient, scope: str) -> bool:
    """True once a write task registered its transaction in the ingest's state (it does so right
    before it writes its first event)."""
    try:
        store = open_state_store(client, *state_location(scope, "readings", "cluster"), create=False)
    except Exception:  # the state stream does not exist yet
        return False
    try:
        return any(run.get("txns") for run in store.fetch().get("runs", {}).values())
    finally:
        store.close()


def _has_children(proc: psutil.Process) -> bool:
    try:
        return bool(proc.children(recursive=True))
    except psutil.NoSuchProcess:
        return False


def test_ingest_on_a_standalone_cluster_survives_a_killed_executor(
    tmp_path: Path, spark_cluster: SparkCluster, pravega_embedded: Any, unique_name: Any,
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    lines = [json.dumps({"sensor_id": f"s{n % 11}", "n": n, "pad": "p" * 40}) for n in range(120_000)]
    for part in range(6):
        (source / f"part-{part}.jsonl").write_text("\n".join(lines[part::6]) + "\n")
    (source / "_SUCCESS").write_text("")  # hidden: skipped
    scope = unique_name("cluster")
    uri = pravega_embedded.controller_uri
    cmd = _ingest_cmd(uri, spark_cluster.master_url, scope, f"file://{source}/*.jsonl")
    out = tmp_path / "first.log"
    with out.open("w") as log:
        driver = subprocess.Popen(cmd, env=spark_cluster.env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    killed = None
    try:
        with PravegaClient(uri) as client:
            while driver.poll() is None and not _writing_started(client, scope):
                time.sleep(0.05)
        assert driver.poll() is None, f"the ingest ended before any write task started:\n{out.read_text()[-4000:]}"
        while killed is None and driver.poll() is None:  # an executor running a write task (a Python worker)
            busy = [e for e in spark_cluster.executors() if _has_children(e)]
            if busy:
                killed = busy[0].pid
                os.kill(killed, signal.SIGKILL)
            else:
                time.sleep(0.05)
        code = driver.wait(timeout=600)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    first = out.read_text()
    assert killed is not None, f"no executor was running a write task to kill:\n{first[-4000:]}"
    assert code == 0, f"{first[-6000:]}\n{spark_cluster.log_tail()}"
    assert f"{len(lines)} events" in first, first[-4000:]
    assert "ExecutorLostFailure" in first, first[-4000:]  # Spark lost a write task with the executor, retried it

    rerun = subprocess.run(cmd, env=spark_cluster.env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    assert "all 6 file(s) were already ingested: nothing to do" in rerun.stdout + rerun.stderr

    with PravegaClient(uri) as client:
        head, tail = StreamCut.head(client, scope, "readings"), StreamCut.tail(client, scope, "readings")
        events = [event.payload.decode() for rng in plan_segment_ranges(client, head, tail)
                  for event in read_segment_range(client, rng)]
    assert Counter(events) == Counter(lines)  # every record exactly once
