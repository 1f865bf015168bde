"""PravegaStreamCutExportOperator in real Airflow (``dag.test()``) against the embedded server with
authentication and TLS: head -> tail exports every event once; the segment-store reads in the
Spark tasks carry the stream's delegation token over TLS."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pravega_clients import official_client_installed


def _connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, server: Any, user: str) -> None:
    host, port = server.controller_uri.split("://", 1)[1].rsplit(":", 1)
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({
        "conn_type": "pravega", "host": host, "port": int(port), "login": user,
        "password": server.passwords[user], "extra": {"tls": True, "trust_store": str(server.ca_cert)},
    }))


def test_export_head_to_tail_through_auth_and_tls(
    tmp_path: Path, spark: Any, run_dag: Any, pravega_secure_embedded: Any, monkeypatch: pytest.MonkeyPatch,
    unique_name: Any,
) -> None:
    from airflow.sdk import DAG

    from airflow_provider_pravega.hooks.pravega import PravegaHook
    from airflow_provider_pravega.operators import PravegaStreamCutExportOperator

    server = pravega_secure_embedded
    assert server.tls
    _connection(monkeypatch, "pravega_secure_export", server, "admin")
    scope = unique_name("export")
    hook = PravegaHook("pravega_secure_export")
    with hook.get_client() as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "readings", 2)
    # Written by the official client, built by the hook with the connection's credentials and CA
    # (where it is installed), else by the hook's own client's EventWriter over the same TLS and auth.
    events = [f"event-{i:04d}" for i in range(400)]
    if official_client_installed():
        manager = hook.get_conn()
        writer = manager.create_writer(scope, "readings", 1000)
        for i, event in enumerate(events):
            writer.write_event(event, routing_key=f"k{i % 7}")
        writer.flush()
    else:
        with hook.get_client() as client, client.event_writer(scope, "readings") as own_writer:
            for i, event in enumerate(events):
                own_writer.write_event(event.encode(), routing_key=f"k{i % 7}")

    out = tmp_path / "lake" / "all"
    with DAG(dag_id=f"export_{scope.replace('-', '_')}", schedule=None,
             start_date=datetime(2026, 11, 1, tzinfo=UTC)) as dag:
        PravegaStreamCutExportOperator(
            task_id="export", scope=scope, stream="readings", output_path=str(out) + "/", start_cut="head",
            end_cut="tail", pravega_conn_id="pravega_secure_export", spark_conn_id=None,
        )
    run = run_dag(dag)
    assert {ti.task_id: str(ti.state) for ti in run.get_task_instances()} == {"export": "success"}
    summary = run.get_task_instance("export").xcom_pull(task_ids="export")
    assert summary["events"] == len(events)
    files = sorted(p for p in out.iterdir() if p.name.startswith("part-") and not p.name.endswith(".crc"))
    exported = [e for p in files for e in pq.read_table(p).column("event").to_pylist()]
    assert Counter(exported) == Counter(events)
    assert server.passwords["admin"] not in json.dumps(summary, default=str)


def test_export_with_a_wrong_password_fails_clearly(
    tmp_path: Path, spark: Any, run_dag: Any, pravega_secure_embedded: Any, monkeypatch: pytest.MonkeyPatch,
    unique_name: Any, capfd: pytest.CaptureFixture[str],
) -> None:
    from airflow.sdk import DAG

    from airflow_provider_pravega.operators import PravegaStreamCutExportOperator

    server = pravega_secure_embedded
    host, port = server.controller_uri.split("://", 1)[1].rsplit(":", 1)
    monkeypatch.setenv("AIRFLOW_CONN_PRAVEGA_SECURE_BADPW", json.dumps({
        "conn_type": "pravega", "host": host, "port": int(port), "login": "admin", "password": "wrong-Pa55word",
        "extra": {"tls": True, "trust_store": str(server.ca_cert)},
    }))
    scope = unique_name("badpw")
    with DAG(dag_id=f"export_{scope.replace('-', '_')}", schedule=None,
             start_date=datetime(2026, 11, 1, tzinfo=UTC)) as dag:
        PravegaStreamCutExportOperator(
            task_id="export", scope=scope, stream="readings", output_path=str(tmp_path / "out") + "/",
            start_cut="head", end_cut="tail", pravega_conn_id="pravega_secure_badpw", spark_conn_id=None, retries=0,
        )
    run = run_dag(dag)
    assert {ti.task_id: str(ti.state) for ti in run.get_task_instances()} == {"export": "failed"}
    captured = capfd.readouterr()
    text = captured.out + captured.err
    assert "PravegaAuthenticationError" in text and "refused to authenticate user 'admin'" in text
    assert "wrong-Pa55word" not in text
    assert not (tmp_path / "out").exists()


def test_export_command_line_through_auth_and_tls_takes_the_password_from_the_environment(
    tmp_path: Path, pravega_secure_embedded: Any, unique_name: Any,
) -> None:
    """The export job run by hand (spark-submit style) authenticates like the operator; argv never
    holds the password, and a wrong one fails with a clear message that does not repeat it."""
    import os
    import subprocess
    import sys

    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.client.config import PravegaConnectionConfig

    server = pravega_secure_embedded
    password = server.passwords["admin"]
    config = PravegaConnectionConfig.from_connection_fields(
        host=server.controller_uri, login="admin", password=password,
        extra={"trust_store": str(server.ca_cert)},
    )
    scope = unique_name("export-cli")
    events = [f"cli-{i:03d}".encode() for i in range(120)]
    with PravegaClient(config) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "readings", 1)
        txn = client.transactions.begin(scope, "readings")
        with client.transactions.writer(scope, "readings", txn) as writer:
            writer.write_events(events)
            writer.flush()
        client.transactions.commit(scope, "readings", txn)

    out = tmp_path / "out"
    argv = [sys.executable, "-m", "airflow_provider_pravega.spark.export_job",
            "--controller-uri", server.controller_uri, "--username", "admin", "--trust-store", str(server.ca_cert),
            "--scope", scope, "--stream", "readings", "--output-path", str(out), "--start-cut", "head",
            "--end-cut", "tail", "--master", "local[2]"]
    assert not any(password in a for a in argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("pravega_client_")}
    env["PRAVEGA_PASSWORD"] = password
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["events"] == len(events)
    assert password not in done.stdout and password not in done.stderr
    files = sorted(p for p in out.iterdir() if p.name.startswith("part-") and not p.name.endswith(".crc"))
    exported = [e for p in files for e in pq.read_table(p).column("event").to_pylist()]
    assert Counter(exported) == Counter(e.decode() for e in events)

    env["PRAVEGA_PASSWORD"] = "wrong-Pa55word"
    argv[argv.index("--output-path") + 1] = str(tmp_path / "out2")
    done = subprocess.run(argv, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "refused to authenticate user 'admin'" in done.stderr and "wrong-Pa55word" not in done.stderr
    assert not (tmp_path / "out2").exists()
