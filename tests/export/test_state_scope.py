"""``state_scope``: an ingest (with its commit sensor), an export of what it committed
(``from_ingest``) and a plain export, through the operators in real Airflow, keep every state in
the state scope and none in the user's scope; a rerun of the day finds them there (nothing ingested
twice, the same cuts). A bad state scope is refused naming the option. Embedded server, the
session's Spark."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.committed_files import CommittedFiles
from airflow_provider_pravega.client.ingest_location import state_location as ingest_location
from airflow_provider_pravega.spark.export_job import ExportSpec
from airflow_provider_pravega.spark.export_job import state_location as export_location
from airflow_provider_pravega.spark.ingest_spec import IngestSpec

STATE_SCOPE = "pravega-state"


def events_in(path: Path) -> list[str]:
    return [e for p in sorted(path.glob("part-*")) if not p.name.endswith(".crc")
            for e in pq.read_table(p).column("event").to_pylist()]


def test_operators_keep_their_state_in_the_state_scope_and_a_rerun_finds_it(tmp_path, spark, run_dag,
                                                                            pravega_default_conn, unique_name):
    from airflow.sdk import DAG

    from airflow_provider_pravega.operators import PravegaStreamCutExportOperator, PravegaTransactionalIngestOperator
    from airflow_provider_pravega.sensors import PravegaTransactionSensor

    uri = pravega_default_conn
    scope = unique_name("userscope")
    (tmp_path / "in").mkdir()
    lines = [json.dumps({"sensor_id": f"s{n % 3}", "n": n}) for n in range(60)]
    for f in range(2):
        (tmp_path / "in" / f"part{f}.jsonl").write_text("\n".join(lines[f::2]) + "\n")
    with DAG(dag_id=f"state_scope_{scope.replace('-', '_')}", schedule="@daily",
             start_date=datetime(2026, 11, 20, tzinfo=UTC), catchup=False, default_args={"retries": 0}) as dag:
        ingest = PravegaTransactionalIngestOperator(
            task_id="ingest", scope=scope, stream="s", source=str(tmp_path / "in"), create_stream=True,
            wait_for_commit=False, num_writers=2, spark_conn_id=None, state_scope="{{ params.state_scope }}",
            params={"state_scope": STATE_SCOPE})
        wait = PravegaTransactionSensor(  # records the run done in the ingest's state (in the state scope)
            task_id="wait", scope=scope, stream="s",
            transaction_ids="{{ ti.xcom_pull(task_ids='ingest')['transaction_ids'] }}",
            ingest_run="{{ ti.xcom_pull(task_ids='ingest') }}", poke_interval=0.5, timeout=60)
        of_ingest = PravegaStreamCutExportOperator(
            task_id="of_ingest", scope=scope, stream="s", output_path=str(tmp_path / "of_ingest"),
            from_ingest=f"{dag.dag_id}.ingest", state_scope=STATE_SCOPE, spark_conn_id=None)
        plain = PravegaStreamCutExportOperator(
            task_id="plain", scope=scope, stream="s", output_path=str(tmp_path / "plain"),
            state_scope=STATE_SCOPE, spark_conn_id=None)
        ingest >> wait >> [of_ingest, plain]

    logical = datetime(2026, 11, 21, tzinfo=UTC)
    summaries = []
    for _ in range(2):  # the day, then its rerun
        run = run_dag(dag, logical_date=logical)
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
        assert states == dict.fromkeys(("ingest", "wait", "of_ingest", "plain"), "success"), states
        summaries.append({t: run.get_task_instance(t).xcom_pull(task_ids=t) for t in ("ingest", "of_ingest", "plain")})
        assert Counter(events_in(tmp_path / "of_ingest")) == Counter(lines)
        assert Counter(events_in(tmp_path / "plain")) == Counter(lines)

    first, rerun = summaries
    ingest_state = ingest_location(scope, "s", f"{dag.dag_id}.ingest", STATE_SCOPE)
    assert (first["ingest"]["state_scope"], first["ingest"]["state_stream"]) == ingest_state
    assert len(first["ingest"]["files_ingested"]) == 2 and first["ingest"]["events"] == len(lines)
    assert rerun["ingest"]["files_ingested"] == [] and len(rerun["ingest"]["files_skipped"]) == 2
    assert rerun["plain"]["reused_record"]
    assert (rerun["plain"]["start_cut"], rerun["plain"]["end_cut"]) == (first["plain"]["start_cut"],
                                                                        first["plain"]["end_cut"])
    assert rerun["of_ingest"]["ingest_runs"] == first["of_ingest"]["ingest_runs"] == [first["ingest"]["run_id"]]
    with PravegaClient(uri) as client:
        mine = [n for n in client.admin.list_streams(scope) if n.startswith(("ingest-state-", "export-state-"))]
        assert mine == []
        export_state = export_location(ExportSpec(scope, "s", "/unused", export_id=f"{dag.dag_id}.plain",
                                                  state_scope=STATE_SCOPE))
        kept = set(client.admin.list_streams(STATE_SCOPE))
        assert {ingest_state[1], export_state[1]} <= kept and export_state[0] == STATE_SCOPE
        committed = CommittedFiles(client, *ingest_state).lookup(str(p) for p in (tmp_path / "in").iterdir())
        assert len(committed) == 2  # the committed-file table lives beside the state, in the state scope


def test_a_bad_state_scope_is_refused_naming_it(tmp_path, run_dag, pravega_default_conn, unique_name, task_errors):
    from airflow.sdk import DAG

    from airflow_provider_pravega.operators import PravegaStreamCutExportOperator, PravegaTransactionalIngestOperator

    for bad in ("", "no spaces", "_reserved"):
        with pytest.raises(ValueError, match="state_scope="):
            PravegaTransactionalIngestOperator(task_id="i", stream="s", source="/in", state_scope=bad)
        with pytest.raises(ValueError, match="state_scope="):
            PravegaStreamCutExportOperator(task_id="e", stream="s", output_path="/out", state_scope=bad)
        with pytest.raises(ValueError, match="ingest_state_scope="):
            PravegaStreamCutExportOperator(task_id="e", stream="s", output_path="/out", from_ingest="x",
                                           ingest_state_scope=bad)
        with pytest.raises(ValueError, match="state_scope="):
            IngestSpec(scope="a", stream="s", source="/in", state_scope=bad)
        with pytest.raises(ValueError, match="state_scope="):
            ExportSpec("a", "s", "/out", state_scope=bad)
    cli = subprocess.run([sys.executable, "-m", "airflow_provider_pravega.spark.ingest_job", "--controller-uri",
                          pravega_default_conn, "--scope", "a", "--stream", "s", "--source", "/in",
                          "--state-scope", "no spaces"], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and "state_scope='no spaces'" in cli.stderr, cli.stderr

    # A templated one is checked once rendered, before any Spark work (spark_conn_id points nowhere).
    scope = unique_name("badstate")
    with DAG(dag_id=f"bad_{scope.replace('-', '_')}", schedule=None, start_date=datetime(2026, 11, 1, tzinfo=UTC),
             default_args={"retries": 0}, params={"state_scope": "no spaces"}) as dag:
        PravegaTransactionalIngestOperator(task_id="ingest", scope=scope, stream="s", source=str(tmp_path),
                                           create_stream=True, state_scope="{{ params.state_scope }}",
                                           spark_conn_id="nowhere")
        PravegaStreamCutExportOperator(task_id="export", scope=scope, stream="s", output_path=str(tmp_path / "o"),
                                       state_scope="{{ params.state_scope }}", spark_conn_id="nowhere")
    run = run_dag(dag)
    assert {ti.task_id: str(ti.state) for ti in run.get_task_instances()} == {"ingest": "failed", "export": "failed"}
    for task_id in ("ingest", "export"):
        assert "state_scope='no spaces'" in str(task_errors[task_id]), task_errors[task_id]
    with PravegaClient(pravega_default_conn) as client:
        assert not client.admin.scope_exists(scope)  # refused before anything was created
