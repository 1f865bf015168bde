"""Ingest and export through Spark Connect: a stock Spark Connect server started from pyspark's
bundled jar (``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer``, no
``--jars`` or ``--conf`` of this project), reached through the Spark provider's ``spark_connect``
connection by ``PravegaTransactionalIngestOperator`` and ``PravegaStreamCutExportOperator`` in their
own process. That process is a venv with the provider's default install only (its wheel:
pyspark-client, no pyspark jars, no py4j) and no Java: a ``java`` first on PATH records any start.
Every record once in the stream and in the export; the rerun ingests nothing and rewrites the same
files (Spark's commit protocol, no stale file left). Where the server is the Spark that Delta's
package is built for, it also has Delta Lake, as a managed endpoint would, and a third export
writes a Delta table: once, the rerun a no-op."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from pravega_testing import spark_connect
from pravega_testing.venvs import ClientVenv, default_install_venv, helpers_path, spark_server_venv, without_java
from export_files import stable_name

_RUN = r"""
import hashlib, json, pathlib, sys
from datetime import datetime, timezone
from airflow.sdk import DAG
from airflow_provider_pravega.operators import PravegaStreamCutExportOperator, PravegaTransactionalIngestOperator
from pravega_testing.dag_test import run_dag

assert "py4j" not in sys.modules
p = json.loads(sys.argv[1])
day = datetime(2026, 11, 2, tzinfo=timezone.utc)
with DAG(dag_id=p["dag_id"], schedule=None, start_date=datetime(2026, 11, 1, tzinfo=timezone.utc)) as dag:
    ingest = PravegaTransactionalIngestOperator(
        task_id="ingest", scope=p["scope"], stream="readings", source=p["source"], routing_key_field="sensor_id",
        create_stream=True, stream_segments=2, spark_conn_id="spark_connect_test", retries=0)
    ingest >> PravegaStreamCutExportOperator(
        task_id="export", scope=p["scope"], stream="readings", output_path=p["output"], start_cut="head",
        spark_conn_id="spark_connect_test", retries=0)
    ingest >> PravegaStreamCutExportOperator(  # JSON columns: a schema inferred from sampled events
        task_id="export_json", scope=p["scope"], stream="readings", output_path=p["output"] + "_json",
        start_cut="head", event_format="json", spark_conn_id="spark_connect_test",
        retries=0)
    if p["delta"]:
        ingest >> PravegaStreamCutExportOperator(  # a Delta table (Delta is on the server)
            task_id="export_table", scope=p["scope"], stream="readings", output_path=p["output"] + "_table",
            start_cut="head", format="delta", spark_conn_id="spark_connect_test", retries=0)
results = []
for _ in range(2):
    run = run_dag(dag, logical_date=day)
    results.append({"states": {ti.task_id: str(ti.state) for ti in run.get_task_instances()},
                    "ingest": run.get_task_instance("ingest").xcom_pull(task_ids="ingest"),
                    "export": run.get_task_instance("export").xcom_pull(task_ids="export"),
                    "export_json": run.get_task_instance("export_json").xcom_pull(task_ids="export_json"),
                    "export_table": p["delta"] and run.get_task_instance("export_table").xcom_pull(
                        task_ids="export_table"),
                    "files": {f.name: hashlib.sha256(f.read_bytes()).hexdigest()
                              for f in sorted(pathlib.Path(p["output"]).iterdir())}})

from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(p["remote"]).getOrCreate()
print("RESULTS " + json.dumps({"runs": results, "py4j": "py4j" in sys.modules,
                               "server_version": spark.version}))
"""



_IMPORTS = r"""
import importlib, json, sys
sys.modules["airflow_provider_pravega.embedded"] = None  # what operators need must load without it
import airflow_provider_pravega
from airflow_provider_pravega import operators, sensors, triggers
from airflow_provider_pravega.hooks.pravega import PravegaHook
loaded = [PravegaHook] + [getattr(package, name) for package in (operators, sensors, triggers) for name in package.__all__]
for module in ("spark.datasource", "spark.datasource_options", "spark.datasource_read", "spark.datasource_write",
               "spark.ingest_job", "spark.export_job", "spark.export_spec", "spark.export_state",
               "spark.export_plan", "spark.export_claims", "spark.export_frame", "spark.export_write",
               "spark.delta_export", "spark.export_output",
               "assets", "openlineage", "state_admin"):
    importlib.import_module(f"airflow_provider_pravega.{module}")
provider = airflow_provider_pravega.get_provider_info()
from airflow_provider_pravega.spark.session import SparkSessionError, get_spark_session
try:
    get_spark_session(None)  # local mode: a driver JVM in this process
    error = "no error"
except SparkSessionError as exc:
    error = str(exc)
print("RESULTS " + json.dumps({"loaded": len(loaded), "py4j": "py4j" in sys.modules, "error": error,
                               "connection_types": [c["connection-type"] for c in provider["connection-types"]]}))
"""


def test_the_default_install_is_a_lean_wheel_that_imports_without_java(
    tmp_path: Path, default_install: tuple[ClientVenv, dict[str, str], Path],
) -> None:
    """``pip install airflow-provider-pravega`` (no extras): every operator, sensor, trigger, hook and
    the data source import with no JVM, no py4j and without the embedded server; the wheel carries
    no test helpers; a task that asks for local mode there is told to install the ``spark`` extra."""
    client, env, java_started = default_install
    assert not [n for n in client.wheel_files if "/testing/" in n or n.startswith("pravega_testing")]
    assert "airflow_provider_pravega/embedded/pytest_plugin.py" in client.wheel_files  # the `embedded` extra's
    assert not [n for n in client.wheel_files if n.endswith(".jar")]
    done = subprocess.run([str(client.python), "-c", _IMPORTS], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    marker = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    assert done.returncode == 0 and marker, done.stdout[-3000:] + done.stderr[-4000:]
    answer = json.loads(marker[0][len("RESULTS "):])
    assert answer["loaded"] >= 14 and not answer["py4j"] and "pravega" in answer["connection_types"]
    assert "airflow-provider-pravega[spark]" in answer["error"] and "spark_connect" in answer["error"], answer
    assert "py4j is not installed" in answer["error"]
    assert not java_started.exists()
    listed = subprocess.run([str(client.python), "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                            check=True).stdout
    names = {d["name"].lower() for d in json.loads(listed)}
    assert "pyspark-client" in names and "pyspark" not in names and "py4j" not in names


@pytest.fixture(scope="module")
def default_install(tmp_path_factory: pytest.TempPathFactory) -> tuple[ClientVenv, dict[str, str], Path]:
    """The provider's default install (its wheel, no extras) in a venv, an environment without Java
    for it, and the file a ``java`` start would be recorded in."""
    tmp = tmp_path_factory.mktemp("default-install")
    venv = default_install_venv()
    env, started = without_java(tmp)
    env["PYTHONPATH"] = helpers_path(tmp)
    return venv, env, started


#: ``PRAVEGA_CONNECT_SERVER_PYSPARK=4.3.0`` (scripts/test sets it for the newest tier): the Spark
#: Connect server runs that pyspark release from its own venv, not the test process's pyspark, so
#: the worker's pyspark-client talks to a newer Spark, as on a cluster upgraded before its clients.
SERVER_PYSPARK = os.environ.get("PRAVEGA_CONNECT_SERVER_PYSPARK") or None


@pytest.fixture(scope="module")
def server_python() -> str:
    """The interpreter whose pyspark runs the Spark Connect server and its Python workers."""
    if SERVER_PYSPARK is None:
        return sys.executable
    return str(spark_server_venv(SERVER_PYSPARK).python)


def delta_arguments() -> list[str]:
    """Delta Lake on the server, as a managed Connect endpoint would have it."""
    from airflow_provider_pravega.spark.delta_export import session_conf

    conf = session_conf({})
    return ["--packages", conf.pop("spark.jars.packages"), *[a for k, v in conf.items() for a in ("--conf", f"{k}={v}")]]


@pytest.fixture(scope="module")
def spark_connect_server(tmp_path_factory: pytest.TempPathFactory, server_python: str) -> Iterator[str]:
    """A stock Spark Connect server (local[2]) on a free loopback port; its ``sc://`` URL. With
    Delta Lake when the server is the Spark that Delta's package is built for."""
    log = tmp_path_factory.mktemp("spark-connect") / "server.log"
    try:
        with spark_connect.running_server(log, master="local[2,4]", python=server_python, extra_args=[
                *(delta_arguments() if SERVER_PYSPARK is None else [])],
                timeout_s=120) as server:
            yield server.url
    except spark_connect.SparkConnectServerError as exc:
        pytest.fail(f"Spark Connect server did not start: {exc}")


def stable(files: dict[str, str]) -> dict[str, str]:
    return {stable_name(name): digest for name, digest in files.items() if not name.startswith(".")}


def test_ingest_and_export_run_through_a_spark_connect_connection(
    tmp_path: Path, spark_connect_server: str, pravega_embedded: Any, unique_name: Any,
    default_install: tuple[ClientVenv, dict[str, str], Path],
) -> None:
    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.client.batch import plan_segment_ranges, read_segment_range
    from airflow_provider_pravega.client.streamcut import StreamCut

    source = tmp_path / "in"
    source.mkdir()
    lines = [json.dumps({"sensor_id": f"s{n % 5}", "n": n}) for n in range(900)]
    (source / "a.jsonl").write_text("\n".join(lines[:400]) + "\n")
    (source / "b.jsonl").write_text("\n".join(lines[400:]) + "\n")
    scope = unique_name("connect")
    host, port = spark_connect_server[len("sc://"):].rsplit(":", 1)
    controller_host, controller_port = pravega_embedded.controller_uri.rsplit("//", 1)[1].rsplit(":", 1)
    home = tmp_path / "airflow-home"
    home.mkdir()
    client, no_java, java_started = default_install
    env = dict(no_java, AIRFLOW_HOME=str(home), AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'a.db'}",
               AIRFLOW__CORE__LOAD_EXAMPLES="False", AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
               AIRFLOW_CONN_SPARK_CONNECT_TEST=json.dumps({"conn_type": "spark_connect", "host": host,
                                                          "port": int(port)}),
               AIRFLOW_CONN_PRAVEGA_DEFAULT=json.dumps({"conn_type": "pravega", "host": controller_host,
                                                        "port": int(controller_port)}))
    params = {"dag_id": f"connect_{scope.replace('-', '_')}", "scope": scope, "source": str(source / "*.jsonl"),
              "output": str(tmp_path / "out"), "remote": spark_connect_server, "delta": SERVER_PYSPARK is None}
    # A script file, not `python -c`: with no __main__ file, pyspark.sql.connect takes the process for
    # its own doctests and looks for a SPARK_HOME, which a pyspark-client install does not have.
    script = tmp_path / "run_dag.py"
    script.write_text(_RUN)
    done = subprocess.run([str(client.python), str(script), json.dumps(params)], env=env, capture_output=True,
                          text=True, timeout=600, cwd=tmp_path)
    marker = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    output = done.stdout[-3000:] + done.stderr[-4000:]
    assert done.returncode == 0 and marker, output
    answer = json.loads(marker[0][len("RESULTS "):])
    assert not java_started.exists() and not answer["py4j"]  # no JVM on the client's side, not even py4j
    results = answer["runs"]
    tasks = {"ingest": "success", "export": "success", "export_json": "success"}
    if SERVER_PYSPARK is None:
        tasks["export_table"] = "success"
    else:  # a newer Spark than the client's pyspark-client
        assert answer["server_version"] == SERVER_PYSPARK
    assert [r["states"] for r in results] == [tasks] * 2, output
    assert [len(r["ingest"]["files_ingested"]) for r in results] == [2, 0]
    first, rerun = results
    assert first["export"]["events"] == rerun["export"]["events"] == len(lines)
    assert rerun["export"]["reused_record"] and rerun["export"]["replaced_output"]
    assert stable(rerun["files"]) == stable(first["files"])  # the same bytes, nothing stale
    assert "_SUCCESS" in first["files"] and any(n.startswith("part-00000") for n in first["files"])
    exported = pq.read_table(tmp_path / "out").column("event").to_pylist()
    assert Counter(exported) == Counter(lines)  # every record once in the export
    assert first["export_json"]["events"] == len(lines) and first["export_json"]["bytes"] == first["export"]["bytes"]
    columns = pq.read_table(tmp_path / "out_json").select(["sensor_id", "n"]).to_pylist()
    assert sorted(row["n"] for row in columns) == list(range(900)) and columns[0]["sensor_id"].startswith("s")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # nothing temporary beside it
    if SERVER_PYSPARK is None:  # Delta's package is built for one Spark minor (the test process's)
        tables = [r["export_table"] for r in results]
        assert [(t["events"], t["already_written"]) for t in tables] == [(len(lines), False), (0, True)]
        assert tables[0]["table_version"] == tables[1]["table_version"] == 0
        import deltalake

        table = deltalake.DeltaTable(str(tmp_path / "out_table"))
        assert Counter(table.to_pyarrow_table().column("event").to_pylist()) == Counter(lines)
        assert json.loads(table.history()[0]["userMetadata"])["end_cut"] == first["export"]["end_cut"]
    with PravegaClient(pravega_embedded.controller_uri) as client:
        head, tail = StreamCut.head(client, scope, "readings"), StreamCut.tail(client, scope, "readings")
        events = [event.payload.decode() for rng in plan_segment_ranges(client, head, tail)
                  for event in read_segment_range(client, rng)]
    assert Counter(events) == Counter(lines)  # every record once
