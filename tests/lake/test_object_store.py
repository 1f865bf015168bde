"""A daily DAG that ingests ``s3a://`` files and exports the stream back to ``s3a://``, as Parquet
files and into a Delta Lake table, with standard s3a settings only, run by ``airflow dags test``
(its own Spark JVM with ``hadoop-aws`` and Delta's package) against an S3-compatible server and the
shared embedded Pravega server.

The second run of the same day ingests nothing, rewrites the same export with Spark's commit
protocol and leaves no stale object (see ``parquet_pages``
for what "the same" means for Parquet across JVMs) and leaves the table as it was (Delta's
idempotent commit); every record is in the stream, in the Parquet files and in the table once
(read back with delta-rs); nothing temporary is left beside the export."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.spark.delta_export import session_conf
from airflow_provider_pravega.spark.export_job import ExportSpec, open_export_state
from export_files import stable_name

DAG_FILE = '''
import json, os
import pendulum
from airflow.sdk import DAG
from airflow_provider_pravega.operators import PravegaStreamCutExportOperator, PravegaTransactionalIngestOperator

CONF = json.loads(os.environ["LAKE_SPARK_CONF"])
SCOPE, STREAM = os.environ["LAKE_SCOPE"], "readings"
with DAG("lake_pipeline", schedule="@daily", start_date=pendulum.datetime(2026, 11, 1, tz="UTC"), catchup=False):
    ingest = PravegaTransactionalIngestOperator(
        task_id="ingest", scope=SCOPE, stream=STREAM, source="s3a://lake/in/{{ ds }}/*.jsonl",
        routing_key_field="sensor_id", create_stream=True, spark_conf=CONF)
    export = PravegaStreamCutExportOperator(
        task_id="export", scope=SCOPE, stream=STREAM, output_path="s3a://lake/out/{{ ds }}", spark_conf=CONF)
    lines = PravegaStreamCutExportOperator(  # JSON lines: the S3A magic committer (see MAGIC)
        task_id="export_jsonl", scope=SCOPE, stream=STREAM, output_path="s3a://lake/out-jsonl/{{ ds }}",
        format="jsonl", spark_conf=CONF)
    table = PravegaStreamCutExportOperator(
        task_id="export_table", scope=SCOPE, stream=STREAM, output_path="s3a://lake/tables/readings",
        format="delta", event_format="json", json_schema="sensor_id string, value bigint, day string, part int",
        spark_conf=CONF)
    ingest >> export >> lines >> table
'''

DAY = "2026-11-01"
#: The S3A magic committer, as docs/deployment.md gives it: files written once, as multipart uploads
#: completed at job commit (no copy by rename). Spark's Parquet writer keeps its own committer.
MAGIC = {
    "spark.hadoop.fs.s3a.committer.name": "magic",
    "spark.hadoop.mapreduce.outputcommitter.factory.scheme.s3a": "org.apache.hadoop.fs.s3a.commit.S3ACommitterFactory",
}


def parquet_pages(data: bytes) -> bytes:
    """A Parquet file without its footer (the data pages); other files whole."""
    if not data.startswith(b"PAR1"):
        return data
    footer = int.from_bytes(data[-8:-4], "little")
    return data[: len(data) - 8 - footer]


def parquet_footer(data: bytes) -> dict[str, Any]:
    """The footer's metadata with each column's encoding list in a fixed order."""
    meta = pq.read_metadata(io.BytesIO(data)).to_dict()
    for group in meta["row_groups"]:
        for column in group["columns"]:
            column["encodings"] = sorted(column["encodings"])
    return meta


def records(day: str, part: int, count: int) -> list[dict[str, Any]]:
    return [{"sensor_id": f"s{i % 7}", "value": i, "day": day, "part": part} for i in range(count)]


def read_table(s3: Any, local: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The Delta table's rows (the JSON fields) and its commits' metadata, read with delta-rs from a
    copy of its objects (delta-rs's own S3 client waits on the test server's keep-alive connections)."""
    import shutil

    import deltalake

    shutil.rmtree(local, ignore_errors=True)
    prefix = "tables/readings/"
    for key in s3.keys("lake", prefix):
        if key.endswith("/"):
            continue
        target = local / key[len(prefix):]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(s3.read("lake", key))
    table = deltalake.DeltaTable(str(local))
    rows = [{k: r[k] for k in ("sensor_id", "value", "day", "part")} for r in table.to_pyarrow_table().to_pylist()]
    history = [json.loads(h["userMetadata"]) for h in table.history() if h.get("userMetadata")]
    return sorted(rows, key=lambda row: (row["part"], row["value"])), history


def test_dag_ingests_from_and_exports_to_s3a(
    tmp_path: Path, fresh_airflow_env: dict[str, str], object_store: Any, pravega_embedded: Any,
    unique_name: Any,
) -> None:
    s3 = object_store
    s3.client.create_bucket(Bucket="lake")
    sent = []
    for part, count in ((0, 700), (1, 500)):
        rows = records(DAY, part, count)
        sent += rows
        body = "".join(json.dumps(row) + "\n" for row in rows).encode()
        s3.client.put_object(Bucket="lake", Key=f"in/{DAY}/part-{part}.jsonl", Body=body)
    s3.client.put_object(Bucket="lake", Key=f"in/{DAY}/_SUCCESS", Body=b"")  # hidden: skipped
    s3.client.put_object(Bucket="lake", Key="in/2026-11-02/part-0.jsonl", Body=b'{"sensor_id": "other"}\n')

    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "lake_pipeline.py").write_text(DAG_FILE)
    host, port = pravega_embedded.controller_uri.rsplit("//", 1)[1].rsplit(":", 1)
    scope = unique_name("lake")
    env = dict(fresh_airflow_env, AIRFLOW__CORE__DAGS_FOLDER=str(dags), LAKE_SCOPE=scope,
               # One session serves every task of `dags test`: it has Delta's package from the start.
               LAKE_SPARK_CONF=json.dumps(session_conf({**s3.spark_conf(), **MAGIC})),
               AIRFLOW_CONN_PRAVEGA_DEFAULT=json.dumps({"conn_type": "pravega", "host": host, "port": int(port)}))
    migrate = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, capture_output=True,
                             text=True, timeout=300)
    assert migrate.returncode == 0, migrate.stderr[-3000:]

    def run_day() -> str:
        done = subprocess.run([sys.executable, "-m", "airflow", "dags", "test", "lake_pipeline", DAY], env=env,
                              capture_output=True, text=True, timeout=900)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-6000:]
        return output

    first = run_day()
    assert f"ingested 2 file(s), skipped 0, {len(sent)} events" in first, first[-4000:]
    export_keys = s3.keys("lake", f"out/{DAY}/")
    assert f"out/{DAY}/_SUCCESS" in export_keys  # Spark's committer: complete
    first_bytes = {stable_name(key): s3.read("lake", key) for key in export_keys}

    table = read_table(s3, tmp_path / "table-1")
    second = run_day()
    assert "all 2 file(s) were already ingested: nothing to do" in second, second[-4000:]
    assert "was already in Delta table s3a://lake/tables/readings" in second, second[-4000:]
    rewritten = s3.keys("lake", f"out/{DAY}/")
    assert sorted(map(stable_name, rewritten)) == sorted(map(stable_name, export_keys))  # nothing stale
    second_bytes = {stable_name(key): s3.read("lake", key) for key in rewritten}
    # The same export: each Parquet file's data pages byte for byte (its
    # footer may list a column's encodings in another order: parquet-java keeps them in a HashSet of
    # enums, whose order follows identity hash codes, which differ from one JVM to the next).
    assert {key: parquet_pages(value) for key, value in second_bytes.items()} == {
        key: parquet_pages(value) for key, value in first_bytes.items()}
    for key in first_bytes:
        if key.endswith(".parquet"):
            assert parquet_footer(second_bytes[key]) == parquet_footer(first_bytes[key])

    # JSON lines through the magic committer: its _SUCCESS names it; every record once; nothing of
    # the committer's own (__magic) left.
    lines_keys = s3.keys("lake", f"out-jsonl/{DAY}/")
    assert json.loads(s3.read("lake", f"out-jsonl/{DAY}/_SUCCESS"))["committer"] == "magic"
    assert not any("__magic" in key or "_temporary" in key for key in s3.keys("lake", "out-jsonl/"))
    exported_lines = [json.loads(json.loads(line)["event"]) for key in lines_keys if key.endswith(".json")
                      for line in s3.read("lake", key).decode().splitlines()]
    assert sorted(exported_lines, key=lambda row: (row["part"], row["value"])) == sorted(
        sent, key=lambda row: (row["part"], row["value"]))

    # The table: every record once, in one version whose metadata names the day's cuts.
    assert read_table(s3, tmp_path / "table-2") == table
    rows, history = table
    key_of = lambda row: (row["part"], row["value"])  # noqa: E731
    assert sorted(rows, key=key_of) == sorted(sent, key=key_of)
    (version,) = history
    assert version["interval"].startswith(DAY) and version["start_cut"] and version["end_cut"]

    # Nothing temporary beside the export: only the day's directory under out/ (and S3A's marker of out/).
    leftovers = [key for key in s3.keys("lake", "out/") if key != "out/" and not key.startswith(f"out/{DAY}/")]
    assert leftovers == []

    # The export's state in Pravega lists the files; every record once in them and in the stream.
    exported = [json.loads(event) for key in sorted(first_bytes) if key.endswith(".parquet")
                for event in pq.read_table(io.BytesIO(first_bytes[key])).column("event").to_pylist()]
    assert sorted(exported, key=key_of) == sorted(sent, key=key_of)
    with PravegaClient(pravega_embedded.controller_uri) as client:
        tail = client.admin.tail(scope, "readings")
        with open_export_state(client, ExportSpec(scope, "readings", "/unused",
                                                  export_id="lake_pipeline.export")) as sync:
            recorded = sync.fetch().outputs[f"s3a://lake/out/{DAY}"]
    assert sorted(f"out/{DAY}/{name}" for name in recorded["files"]) == sorted(
        key for key in rewritten if key.endswith(".parquet"))  # the last run's files
    assert recorded["events"] == len(sent)
    assert sum(tail.values()) == recorded["bytes"] + 8 * len(sent)  # the export read the whole stream
