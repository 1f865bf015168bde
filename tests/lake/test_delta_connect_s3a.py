"""The Delta example pipeline (``pravega_exactly_once_ingest`` + ``pravega_stream_cut_export_delta``)
on ``s3a://`` and through Spark Connect at once: the scenario of
``tests/dags/test_example_dags.py::test_delta_export_dag_catch_up_out_of_order_rerun_and_backfills_each_day_once``
(3-day catchup, the export lagging and out of order, a rerun of day 2, backfills of day 1 with
``--reprocess-behavior completed`` and ``failed``) with the example data directory in an
S3-compatible server (moto): the ingest reads ``s3a://lake/data/incoming/<day>/``, the export writes
the table ``s3a://lake/data/export/readings_delta``.

Every ingest and export task reaches a stock Spark Connect server through the examples' Spark
connection (``PRAVEGA_EXAMPLES_SPARK_CONN``, a ``spark_connect`` connection), the test's only Spark:
the server has Delta's jars and ``hadoop-aws`` (``spark.jars.packages``, fetched into the project's
Ivy cache the first time), Delta's SQL extension and catalog and the s3a settings, as a cluster
with Delta installed would; no plugin or setting of this project. Read back with delta-rs straight
from the object store: the same assertions as the local-path test (tests/delta_example_scenario.py's
``check_table``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pravega.spark.delta_export import DELTA_SQL_CONF, delta_package
from delta_example_scenario import REPO, check_table, drop_example_stream, run_scenario
from pravega_testing import spark_connect
from pravega_testing.object_store import ObjectStore

pytest.importorskip("deltalake", reason="the test extra installs deltalake (delta-rs) to read tables")

DAYS = ["2026-11-01", "2026-11-02", "2026-11-03"]  # in the past: a backfill refuses future dates
BUCKET = "lake"


def server_arguments(store: ObjectStore) -> list[str]:
    """``spark-submit`` arguments of a Connect server with Delta and s3a: the packages, Delta's SQL
    extension and catalog, and the standard s3a settings of ``store``."""
    package = delta_package()
    if package is None:
        pytest.skip("no Delta package is known for this pyspark's Spark minor")
    conf = store.spark_conf()
    packages = ",".join([package, conf.pop("spark.jars.packages")])
    conf.update(DELTA_SQL_CONF)
    conf.update({
        # The Delta log of a small table in 2 tasks, not Delta's default 50 (seconds per export here).
        "spark.databricks.delta.snapshotPartitions": "2",
        # A short-lived JVM on a busy machine: C1 only and the serial GC (as tests/spark_cluster.py).
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    })
    return ["--packages", packages, *[a for k, v in conf.items() for a in ("--conf", f"{k}={v}")]]


@pytest.fixture
def delta_s3a_server(tmp_path: Path, object_store: ObjectStore) -> Iterator[spark_connect.RunningServer]:
    try:
        with spark_connect.running_server(tmp_path / "connect" / "server.log", master="local[2,4]",
                                          extra_args=server_arguments(object_store), timeout_s=300) as server:
            yield server
    except spark_connect.SparkConnectServerError as exc:
        pytest.fail(f"Spark Connect server did not start: {exc}")


def test_delta_example_dags_on_s3a_through_spark_connect(
    tmp_path: Path, fresh_airflow_env: dict[str, str], object_store: ObjectStore, pravega_embedded: Any,
    delta_s3a_server: spark_connect.RunningServer,
) -> None:
    s3 = object_store
    s3.client.create_bucket(Bucket=BUCKET)
    local = tmp_path / "incoming"
    subprocess.run([sys.executable, str(REPO / "scripts" / "generate_sample_data.py"), "--out", str(local),
                    "--start", DAYS[0], "--days", "3", "--files-per-day", "1", "--events-per-file", "20"],
                   check=True, capture_output=True)
    sources = {}
    for day in DAYS:
        files = sorted((local / day).glob("*.jsonl"))
        sources[day] = [json.loads(line)["reading_id"] for p in files for line in p.read_text().splitlines()]
        for p in files:
            s3.client.put_object(Bucket=BUCKET, Key=f"data/incoming/{day}/{p.name}", Body=p.read_bytes())
    assert [len(ids) for ids in sources.values()] == [20] * 3

    drop_example_stream(pravega_embedded.controller_uri)
    host, port = pravega_embedded.controller_uri.rsplit("//", 1)[1].rsplit(":", 1)
    env = dict(fresh_airflow_env, PRAVEGA_EXAMPLES_DATA=f"s3a://{BUCKET}/data", PRAVEGA_EXAMPLES_START=DAYS[0],
               AIRFLOW_CONN_PRAVEGA_DEFAULT=json.dumps({"conn_type": "pravega", "host": host, "port": int(port)}),
               **spark_connect.example_dags_env(delta_s3a_server.port))
    # The tasks can only have run on the server: only it has hadoop-aws (a local session the
    # operator started would fail on s3a://, and an unknown connection id fails the task).
    steps = run_scenario(DAYS, env, tmp_path)

    # Nothing was written outside the object store (a relative s3a path taken for a local one).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["airflow-home", "connect", "incoming"]
    assert any(k.startswith("data/export/readings_delta/_delta_log/") for k in s3.keys(BUCKET, "data/export/"))
    check_table(steps, read_with_delta_rs(s3, f"s3://{BUCKET}/data/export/readings_delta"), DAYS, sources)


#: Reads the table with delta-rs straight from the object store, in a child process: the object store
#: (moto) runs in this one, on Python threads, and delta-rs holds this process's GIL while it waits for
#: some of its S3 answers (measured: a list request with ``start-after`` stalled until delta-rs's timeout,
#: answered by moto only then), which moto could never give.
#: It ends with ``os._exit``: after an S3 read, deltalake 1.6.6 aborts at interpreter exit
#: ("terminate called without an active exception", SIGABRT; measured here), once its answer is out.
_READ = """
import json, os, sys
from delta_example_scenario import read_table
uri, options = json.loads(sys.argv[1])
print("TABLE " + json.dumps(read_table(uri, options), default=str), flush=True)
os._exit(0)
"""


def read_with_delta_rs(s3: ObjectStore, uri: str) -> dict[str, Any]:
    options = {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_ACCESS_KEY_ID": s3.access_key,
               "AWS_SECRET_ACCESS_KEY": s3.secret_key, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    done = subprocess.run([sys.executable, "-c", _READ, json.dumps([uri, options])], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO / "tests")))
    marker = [line for line in done.stdout.splitlines() if line.startswith("TABLE ")]
    assert done.returncode == 0 and marker, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(marker[0][len("TABLE "):])
