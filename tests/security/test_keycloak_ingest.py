"""The transactional ingest operator on a connection with Keycloak bearer credentials, in local
Spark: the driver and every Python worker obtain their own tokens from the keycloak.json the task
gives them, the files are ingested exactly once, and the client secret appears in no output."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.batch import plan_segment_ranges, read_segment_ranges
from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.client.streamcut import StreamCut

from security.realm import APP_SECRET, WRITABLE


def test_ingest_with_bearer_credentials_exactly_once_and_no_secret_in_logs(
    tmp_path: Path, spark: Any, run_dag: Any, bearer_server: Any, keycloak_json: Callable[..., str],
    admin_config: PravegaConnectionConfig, airflow_home: Path, bearer_connection: Callable[..., str],
    capfd: pytest.CaptureFixture[str],
) -> None:
    from airflow.sdk import DAG

    from airflow_provider_pravega.operators.ingest import PravegaTransactionalIngestOperator

    stream = f"ingested-{uuid.uuid4().hex[:8]}"
    with PravegaClient(admin_config) as admin:
        admin.admin.create_scope(WRITABLE)
    bearer_connection("pravega_kc_ingest", scope=WRITABLE)
    source = tmp_path / "in"
    source.mkdir()
    lines = [json.dumps({"sensor_id": f"s{n % 4}", "n": n}) for n in range(120)]
    (source / "a.jsonl").write_text("\n".join(lines[:70]) + "\n")
    (source / "b.jsonl").write_text("\n".join(lines[70:]) + "\n")

    dag_id = f"bearer_ingest_{uuid.uuid4().hex[:8]}"
    with DAG(dag_id=dag_id, schedule=None, start_date=datetime(2026, 11, 1, tzinfo=timezone.utc)) as dag:
        PravegaTransactionalIngestOperator(
            task_id="ingest", stream=stream, source=str(source), routing_key_field="sensor_id",
            create_stream=True, stream_segments=2, num_writers=2, pravega_conn_id="pravega_kc_ingest",
            spark_conn_id=None, retries=0)

    runs = [run_dag(dag), run_dag(dag)]
    for run in runs:
        assert {ti.task_id: str(ti.state) for ti in run.get_task_instances()} == {"ingest": "success"}
    assert [len(r.get_task_instance("ingest").xcom_pull(task_ids="ingest")["files_ingested"]) for r in runs] == [2, 0]
    with PravegaClient(admin_config) as admin:
        ranges = plan_segment_ranges(admin, StreamCut.head(admin, WRITABLE, stream), StreamCut.tail(admin, WRITABLE, stream))
        events = [e.payload.decode() for e in read_segment_ranges(admin, ranges)]
    assert Counter(events) == Counter(lines)

    captured = capfd.readouterr()
    files = [p.read_text(errors="replace") for p in (airflow_home / "logs").rglob("*") if p.is_file() and dag_id in str(p)]
    assert "ingested 2 file(s), skipped 0, 120 events" in "\n".join([*files, captured.out, captured.err])
    for text in [*files, captured.out, captured.err]:
        assert APP_SECRET not in text
