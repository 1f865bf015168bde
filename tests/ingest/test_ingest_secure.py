"""PravegaTransactionalIngestOperator in real Airflow against the embedded server with
authentication and TLS: a password-bearing connection ingests exactly once and the password
appears nowhere in the task logs; a read-only user fails with a permission error and leaves
nothing visible in the stream."""

from __future__ import annotations

import base64
import json
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest


def _set_connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, server: Any, user: str, scope: str) -> None:
    host, port = server.controller_uri.split("://", 1)[1].rsplit(":", 1)
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({
        "conn_type": "pravega", "host": host, "port": int(port), "login": user,
        "password": server.passwords[user],
        "extra": {"tls": server.tls, "trust_store": str(server.ca_cert), "scope": scope},
    }))


def _admin(server: Any) -> Any:
    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.client.config import PravegaConnectionConfig

    host, port = server.controller_uri.split("://", 1)[1].rsplit(":", 1)
    return PravegaClient(PravegaConnectionConfig.from_connection_fields(
        host=host, port=int(port), login="admin", password=server.passwords["admin"],
        extra={"tls": server.tls, "trust_store": str(server.ca_cert)},
    ))


def _events(server: Any, scope: str, stream: str) -> list[bytes]:
    """Every committed event, read head -> tail with the admin user."""
    from airflow_provider_pravega.client.batch import plan_segment_ranges, read_segment_ranges
    from airflow_provider_pravega.client.streamcut import StreamCut

    with _admin(server) as client:
        ranges = plan_segment_ranges(client, StreamCut.head(client, scope, stream),
                                     StreamCut.tail(client, scope, stream))
        return [e.payload for e in read_segment_ranges(client, ranges)]


def _task_logs(airflow_home: Path, dag_id: str, capfd: pytest.CaptureFixture[str]) -> str:
    """The task logs: log files under AIRFLOW_HOME (when a supervisor wrote them) and what
    ``dag.test()`` printed (it runs tasks in-process and renders their logs, through Airflow's
    log processors and secrets masker, to the console instead of to files)."""
    files = [p for p in (airflow_home / "logs").rglob("*") if p.is_file() and dag_id in str(p)]
    captured = capfd.readouterr()
    return "\n".join([*(p.read_text(errors="replace") for p in files), captured.out, captured.err])


def _ingest_dag(dag_id: str, conn_id: str, source: Path, *, leak_check: bool = False) -> Any:
    from airflow.sdk import DAG, task

    from airflow_provider_pravega.operators.ingest import PravegaTransactionalIngestOperator

    with DAG(dag_id=dag_id, schedule=None, start_date=datetime(2026, 11, 1, tzinfo=timezone.utc)) as dag:
        ingest = PravegaTransactionalIngestOperator(
            task_id="ingest", stream="readings", source=str(source), routing_key_field="sensor_id",
            create_stream=True, stream_segments=2, num_writers=2, pravega_conn_id=conn_id, spark_conn_id=None,
            retries=0,
        )
        if leak_check:

            @task
            def careless_logging() -> None:
                """A task that logs the secrets outright: the masker must hide both."""
                import logging

                from airflow_provider_pravega.hooks.pravega import PravegaHook

                config = PravegaHook(conn_id).get_config()
                header = base64.b64encode(f"{config.username}:{config.password}".encode()).decode()
                logging.getLogger("airflow_provider_pravega.leak_check").warning("LEAK-CHECK password=%s header=Basic %s", config.password,
                                                       header)

            ingest >> careless_logging()
    return dag


# Runs in a fresh interpreter: the Task SDK's logging, as the supervisor sets it up to write a task's
# log file (JSON lines through Airflow's secrets masker), goes to a file under AIRFLOW_HOME/logs, then
# the DAG runs with dag.test(). A subprocess, because logging configuration is process-wide.
_LOGGED_RUN = r"""
import json, sys
from datetime import datetime, timezone
from pathlib import Path

params = json.loads(sys.argv[1])
log_path = Path(params["log_file"])
log_path.parent.mkdir(parents=True, exist_ok=True)
log_file = open(log_path, "ab")
from airflow.sdk.log import configure_logging
configure_logging(json_output=True, output=log_file, cache_logger_on_first_use=False)

from airflow.sdk import DAG, task
from airflow_provider_pravega.operators.ingest import PravegaTransactionalIngestOperator
from pravega_testing.dag_test import run_dag

conn_id = params["conn_id"]
with DAG(dag_id=params["dag_id"], schedule=None, start_date=datetime(2026, 11, 1, tzinfo=timezone.utc)) as dag:
    ingest = PravegaTransactionalIngestOperator(
        task_id="ingest", stream="readings", source=params["source"], routing_key_field="sensor_id",
        create_stream=True, stream_segments=2, num_writers=2, pravega_conn_id=conn_id, spark_conn_id=None,
        retries=0, spark_conf={"spark.sql.shuffle.partitions": "2", "spark.master": "local[2]"},
    )

    @task
    def careless_logging() -> None:
        # A task that logs the secrets outright: the masker must hide both.
        import base64, logging
        from airflow_provider_pravega.hooks.pravega import PravegaHook

        config = PravegaHook(conn_id).get_config()
        header = base64.b64encode(f"{config.username}:{config.password}".encode()).decode()
        logging.getLogger("airflow_provider_pravega.leak_check").warning(
            "LEAK-CHECK password=%s header=Basic %s", config.password, header)

    ingest >> careless_logging()

results = []
for _ in range(params["runs"]):
    run = run_dag(dag)
    results.append({
        "states": {ti.task_id: str(ti.state) for ti in run.get_task_instances()},
        "xcom": run.get_task_instance("ingest").xcom_pull(task_ids="ingest"),
    })
log_file.flush()
print("RESULTS " + json.dumps(results))
"""


def test_ingest_with_credentials_over_tls_exactly_once_and_no_password_in_logs(
    tmp_path: Path, pravega_secure_embedded: Any, monkeypatch: pytest.MonkeyPatch, unique_name: Any,
) -> None:
    import os
    import subprocess
    import sys

    server = pravega_secure_embedded
    scope = unique_name("secure")
    with _admin(server) as admin:
        admin.admin.create_scope(scope)
    source = tmp_path / "in"
    source.mkdir()
    lines = [json.dumps({"sensor_id": f"s{n % 4}", "n": n}) for n in range(200)]
    (source / "a.jsonl").write_text("\n".join(lines[:120]) + "\n")
    (source / "b.jsonl").write_text("\n".join(lines[120:]) + "\n")

    home = tmp_path / "airflow-home"
    home.mkdir()
    dag_id = f"secure_{scope.replace('-', '_')}"
    log_file = home / "logs" / f"dag_id={dag_id}" / "task.log"
    _set_connection(monkeypatch, "pravega_secure_admin", server, "admin", scope)
    env = {k: v for k, v in os.environ.items() if not k.startswith("pravega_client_")}
    env.update(AIRFLOW_HOME=str(home), AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
               AIRFLOW__CORE__LOAD_EXAMPLES="False", AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))  # pravega_testing, from any directory
    params = {"log_file": str(log_file), "conn_id": "pravega_secure_admin", "dag_id": dag_id,
              "source": str(source), "runs": 2}
    done = subprocess.run([sys.executable, "-c", _LOGGED_RUN, json.dumps(params)], env=env, capture_output=True,
                          text=True, timeout=600)
    marker = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    assert done.returncode == 0 and marker, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    results = json.loads(marker[0][len("RESULTS "):])
    assert [r["states"] for r in results] == [{"ingest": "success", "careless_logging": "success"}] * 2
    # Exactly once, and the rerun found both files ingested.
    assert [len(r["xcom"]["files_ingested"]) for r in results] == [2, 0]
    assert Counter(e.decode() for e in _events(server, scope, "readings")) == Counter(lines)

    password = server.passwords["admin"]
    basic = base64.b64encode(f"admin:{password}".encode()).decode()
    logs = "\n".join(p.read_text(errors="replace") for p in (home / "logs").rglob("*") if p.is_file())
    # The data-flow messages are in the task log...
    assert "ingested 2 file(s), skipped 0, 200 events" in logs and "ingested 0 file(s), skipped 2" in logs
    # ...and what a careless task logs is masked: the password by Airflow, the Basic header (which
    # only this provider builds) because the hook registered it.
    assert "LEAK-CHECK password=*** header=Basic ***" in logs
    for text in (logs, done.stdout, done.stderr, json.dumps(results)):
        assert password not in text and basic not in text


def test_ingest_as_a_read_only_user_fails_with_a_permission_error(
    tmp_path: Path, spark: Any, run_dag: Any, pravega_secure_embedded: Any, airflow_home: Path,
    monkeypatch: pytest.MonkeyPatch, unique_name: Any, capfd: pytest.CaptureFixture[str],
) -> None:
    server = pravega_secure_embedded
    scope = unique_name("readonly")
    with _admin(server) as admin:
        admin.admin.create_scope(scope)
        admin.admin.create_stream(scope, "readings", 2)
    _set_connection(monkeypatch, "pravega_secure_reader", server, "reader", scope)
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.jsonl").write_text("\n".join(json.dumps({"sensor_id": "s", "n": n}) for n in range(20)) + "\n")

    dag_id = f"readonly_{scope.replace('-', '_')}"
    run = run_dag(_ingest_dag(dag_id, "pravega_secure_reader", source))
    assert {ti.task_id: str(ti.state) for ti in run.get_task_instances()} == {"ingest": "failed"}
    logs = _task_logs(airflow_home, dag_id, capfd)
    assert "PravegaPermissionError" in logs and "'reader'" in logs and "READ_UPDATE" in logs
    assert server.passwords["reader"] not in logs
    assert _events(server, scope, "readings") == []
    with _admin(server) as admin:
        assert admin.admin.list_streams(scope) == ["readings"]  # no state stream either


def test_templated_fields_and_lineage_carry_no_credentials(
    pravega_secure_embedded: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    from airflow_provider_pravega.operators.export import PravegaStreamCutExportOperator
    from airflow_provider_pravega.operators.ingest import PravegaTransactionalIngestOperator

    server = pravega_secure_embedded
    _set_connection(monkeypatch, "pravega_secure_lineage", server, "admin", "lineage")
    password = server.passwords["admin"]
    ingest = PravegaTransactionalIngestOperator(task_id="i", stream="s", source=str(tmp_path),
                                                pravega_conn_id="pravega_secure_lineage")
    export = PravegaStreamCutExportOperator(task_id="e", stream="s", output_path=str(tmp_path / "o"),
                                            pravega_conn_id="pravega_secure_lineage")
    for op in (ingest, export):
        rendered = {f: getattr(op, f) for f in op.template_fields}
        assert password not in repr(rendered)
        lineage = op.get_openlineage_facets_on_complete(None)
        assert lineage is not None and password not in repr(lineage) and "admin" not in repr(lineage)


def test_command_line_takes_the_password_from_the_environment_not_argv(
    tmp_path: Path, pravega_secure_embedded: Any, unique_name: Any,
) -> None:
    import os
    import subprocess
    import sys

    server = pravega_secure_embedded
    scope = unique_name("cli")
    with _admin(server) as admin:
        admin.admin.create_scope(scope)
    source = tmp_path / "in.jsonl"
    lines = [json.dumps({"sensor_id": f"s{n % 3}", "n": n}) for n in range(30)]
    source.write_text("\n".join(lines) + "\n")
    argv = [sys.executable, "-m", "airflow_provider_pravega.spark.ingest_job",
            "--controller-uri", server.controller_uri, "--scope", scope, "--stream", "readings",
            "--source", str(source), "--routing-key-field", "sensor_id", "--create-stream",
            "--username", "admin", "--trust-store", str(server.ca_cert), "--master", "local[2]"]
    password = server.passwords["admin"]
    assert not any(password in a for a in argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("pravega_client_")}
    env["PRAVEGA_PASSWORD"] = password
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["events"] == len(lines)
    assert password not in done.stdout and password not in done.stderr
    assert Counter(e.decode() for e in _events(server, scope, "readings")) == Counter(lines)

    env["PRAVEGA_PASSWORD"] = "wrong-Pa55word"
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "refused to authenticate user 'admin'" in done.stderr
    assert "wrong-Pa55word" not in done.stderr


def test_a_scoped_writer_ingests_into_an_existing_stream_and_exports(
    tmp_path: Path, spark: Any, run_dag: Any, pravega_secure_embedded: Any, airflow_home: Path,
    monkeypatch: pytest.MonkeyPatch, unique_name: Any, capfd: pytest.CaptureFixture[str],
) -> None:
    """``writer-iot`` has READ_UPDATE on scope ``iot`` and its streams only (the README's scoped
    writer): the ingest's and the export's state streams are created in the scope without ever
    asking for the scope itself (createScope on ``prn::/`` would be denied)."""
    from airflow.sdk import DAG

    from airflow_provider_pravega.operators.export import PravegaStreamCutExportOperator
    from airflow_provider_pravega.operators.ingest import PravegaTransactionalIngestOperator

    server = pravega_secure_embedded
    scope, stream = "iot", unique_name("scoped")
    with _admin(server) as admin:
        admin.admin.create_scope(scope)
        admin.admin.create_stream(scope, stream, 2)
    _set_connection(monkeypatch, "pravega_secure_writer", server, "writer-iot", scope)
    source = tmp_path / "in"
    source.mkdir()
    lines = [json.dumps({"sensor_id": f"s{n % 3}", "n": n}) for n in range(40)]
    (source / "a.jsonl").write_text("\n".join(lines) + "\n")

    dag_id = f"scoped_{stream.replace('-', '_')}"
    with DAG(dag_id=dag_id, schedule=None, start_date=datetime(2026, 11, 1, tzinfo=timezone.utc)) as dag:
        ingest = PravegaTransactionalIngestOperator(
            task_id="ingest", stream=stream, source=str(source), routing_key_field="sensor_id", num_writers=2,
            pravega_conn_id="pravega_secure_writer", spark_conn_id=None, retries=0,
        )
        export = PravegaStreamCutExportOperator(
            task_id="export", stream=stream, output_path=str(tmp_path / "out"), format="jsonl", start_cut="head",
            pravega_conn_id="pravega_secure_writer", spark_conn_id=None, retries=0,
        )
        ingest >> export
    run = run_dag(dag)
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    assert states == {"ingest": "success", "export": "success"}, _task_logs(airflow_home, dag_id, capfd)[-4000:]
    assert Counter(e.decode() for e in _events(server, scope, stream)) == Counter(lines)
    files = [p for p in (tmp_path / "out").rglob("part-*") if p.is_file() and not p.name.endswith(".crc")]
    exported = [json.loads(line)["event"] for p in files for line in p.read_text().splitlines()]
    assert Counter(exported) == Counter(lines)


def test_a_read_only_user_is_told_it_cannot_write_the_stream(
    tmp_path: Path, spark: Any, pravega_secure_embedded: Any, unique_name: Any,
) -> None:
    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.client.config import PravegaConnectionConfig
    from airflow_provider_pravega.client.errors import PravegaPermissionError
    from airflow_provider_pravega.spark.ingest_job import run_ingest
    from airflow_provider_pravega.spark.ingest_spec import IngestSpec

    server = pravega_secure_embedded
    scope = unique_name("ro")
    with _admin(server) as admin:
        admin.admin.create_scope(scope)
        admin.admin.create_stream(scope, "readings", 1)
    (tmp_path / "a.jsonl").write_text('{"n": 1}\n')
    host, port = server.controller_uri.split("://", 1)[1].rsplit(":", 1)
    config = PravegaConnectionConfig.from_connection_fields(
        host=host, port=int(port), login="reader", password=server.passwords["reader"],
        extra={"tls": server.tls, "trust_store": str(server.ca_cert)})
    with PravegaClient(config) as client, pytest.raises(PravegaPermissionError) as caught:
        run_ingest(client, spark, IngestSpec(scope=scope, stream="readings", source=str(tmp_path / "a.jsonl")))
    message = str(caught.value)
    assert f"no write permission on {scope}/readings" in message and "'reader'" in message, message
    assert "createScope" not in message
    with PravegaClient(config) as client:  # may not create streams in the scope: gets it as it is
        assert client.admin.ensure_stream(scope, "readings") is False
        with pytest.raises(PravegaPermissionError):
            client.admin.ensure_stream(scope, "other")
    with _admin(server) as admin:
        assert admin.admin.list_streams(scope) == ["readings"]


def test_a_state_scope_the_user_cannot_create_is_named(pravega_secure_embedded: Any, unique_name: Any) -> None:
    """``writer-iot`` may write in scope ``iot`` only: a state scope it may not use fails before
    anything is written, naming the option and the scope."""
    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.client.config import PravegaConnectionConfig
    from airflow_provider_pravega.client.errors import PravegaPermissionError
    from airflow_provider_pravega.client.ingest_location import open_ingest_state, state_location

    server = pravega_secure_embedded
    stream, state_scope = unique_name("stated"), unique_name("iot-state")
    with _admin(server) as admin:
        admin.admin.create_scope("iot")
        admin.admin.create_stream("iot", stream, 1)
    host, port = server.controller_uri.split("://", 1)[1].rsplit(":", 1)
    config = PravegaConnectionConfig.from_connection_fields(
        host=host, port=int(port), login="writer-iot", password=server.passwords["writer-iot"],
        extra={"tls": server.tls, "trust_store": str(server.ca_cert)})
    with PravegaClient(config) as client, pytest.raises(PravegaPermissionError) as caught:
        open_ingest_state(client, "iot", stream, "daily", state_scope=state_scope)
    assert f"state_scope {state_scope!r} keeps the provider's state" in str(caught.value), str(caught.value)
    with _admin(server) as admin:
        assert not admin.admin.scope_exists(state_scope)
        assert not admin.admin.stream_exists(*state_location("iot", stream, "daily"))  # nor in the stream's scope
