"""The stream-cut export operator on a connection with Keycloak bearer credentials, in local Spark:
it reads a stream of the scope the realm lets the client only read, keeping its recorded cuts in a
state scope the client may write, exports exactly the events between two cuts, and the client
secret appears in no output."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.client.streamcut import StreamCut
from airflow_provider_pravega.spark.export_job import ExportSpec
from airflow_provider_pravega.spark.export_job import state_location as export_location

from security.realm import APP_SECRET, READ_ONLY, WRITABLE


def write(client: PravegaClient, scope: str, stream: str, events: list[str]) -> None:
    writer = client.event_writer(scope, stream)
    try:
        for i, event in enumerate(events):
            writer.write_event(event.encode(), f"k{i % 5}")
        writer.flush()
    finally:
        writer.close()


def exported(directory: Path) -> list[str]:
    files = sorted(p for p in directory.glob("part-*") if not p.name.endswith(".crc"))
    return [e for p in files for e in pq.read_table(p).column("event").to_pylist()]


def test_export_of_a_read_only_scope_with_bearer_credentials_is_exact_and_hides_the_secret(
    tmp_path: Path, spark: Any, run_dag: Any, bearer_server: Any, keycloak_json: Callable[..., str],
    admin_config: PravegaConnectionConfig, airflow_home: Path, bearer_connection: Callable[..., str],
    capfd: pytest.CaptureFixture[str],
) -> None:
    from airflow.sdk import DAG

    from airflow_provider_pravega.operators import PravegaStreamCutExportOperator

    stream = f"exported-{uuid.uuid4().hex[:8]}"
    before, between, after = ([f"{part}-{n:03d}" for n in range(count)]
                              for part, count in (("before", 40), ("between", 90), ("after", 30)))
    with PravegaClient(admin_config) as admin:  # the client may not write the read-only scope: the admin does
        admin.admin.create_scope(READ_ONLY)
        admin.admin.create_stream(READ_ONLY, stream, 2)
        write(admin, READ_ONLY, stream, before)
        start = StreamCut.tail(admin, READ_ONLY, stream)
        write(admin, READ_ONLY, stream, between)
        end = StreamCut.tail(admin, READ_ONLY, stream)
        write(admin, READ_ONLY, stream, after)
    bearer_connection("pravega_kc_export")

    dag_id = f"bearer_export_{uuid.uuid4().hex[:8]}"
    with DAG(dag_id=dag_id, schedule="@daily", start_date=datetime(2026, 11, 1, tzinfo=timezone.utc),
             catchup=False, params={"start_cut": start.to_text()}) as dag:
        PravegaStreamCutExportOperator(
            task_id="export", scope=READ_ONLY, stream=stream, start_cut="{{ params.start_cut }}",
            end_cut=end.to_text(), output_path=str(tmp_path / "out" / "{{ ds }}"), state_scope=WRITABLE,
            pravega_conn_id="pravega_kc_export", spark_conn_id=None, retries=0)

    # The first day's cuts as given; the next day continues where it ended, at the same end: nothing new.
    runs = [run_dag(dag, logical_date=datetime(2026, 11, 2, tzinfo=timezone.utc)),
            run_dag(dag, logical_date=datetime(2026, 11, 3, tzinfo=timezone.utc), run_conf={"start_cut": "previous"})]
    for run in runs:
        assert {ti.task_id: str(ti.state) for ti in run.get_task_instances()} == {"export": "success"}
    first, second = (r.get_task_instance("export").xcom_pull(task_ids="export") for r in runs)
    assert Counter(exported(tmp_path / "out" / "2026-11-02")) == Counter(between)
    assert first["events"] == len(between) and not first["reused_record"]
    assert second["events"] == 0 and second["start_cut"] == second["end_cut"] == first["end_cut"]
    assert exported(tmp_path / "out" / "2026-11-03") == []
    state_scope, state_stream = export_location(ExportSpec(READ_ONLY, stream, "/unused", export_id=f"{dag_id}.export",
                                                           state_scope=WRITABLE))
    with PravegaClient(admin_config) as admin:  # the export kept its state in the writable scope only
        assert state_scope == WRITABLE and state_stream in admin.admin.list_streams(WRITABLE)
        assert not [s for s in admin.admin.list_streams(READ_ONLY) if s.startswith("export-state-")]

    captured = capfd.readouterr()
    logs = [p.read_text(errors="replace") for p in (airflow_home / "logs").rglob("*")
            if p.is_file() and dag_id in str(p)]
    for text in [*logs, captured.out, captured.err]:
        assert APP_SECRET not in text
