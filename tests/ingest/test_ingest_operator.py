"""PravegaTransactionalIngestOperator in real Airflow (``dag.test()``): a scheduled DAG over
several data intervals, then a backfill re-running them all — nothing duplicated."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timezone

DAYS = ["2026-11-01", "2026-11-02", "2026-11-03"]


def test_scheduled_intervals_then_backfill_ingest_each_record_once(tmp_path, spark, run_dag, pravega_default_conn,
                                                                   read_stream, unique_name):
    from airflow.sdk import DAG, task

    from airflow_provider_pravega.operators.ingest import PravegaTransactionalIngestOperator

    lines = []
    for day in DAYS:
        d = tmp_path / "in" / day
        d.mkdir(parents=True)
        for part in range(2):
            with open(d / f"part-{part}.jsonl", "w") as fh:
                for n in range(150):
                    line = json.dumps({"sensor_id": f"s{n % 5}", "day": day, "part": part, "n": n})
                    fh.write(line + "\n")
                    lines.append(line)
    scope = unique_name("dag")
    results: list[dict] = []
    with DAG(dag_id=f"ingest_{scope.replace('-', '_')}", schedule="@daily",
             start_date=datetime(2026, 11, 1, tzinfo=timezone.utc), catchup=True) as dag:
        ingest = PravegaTransactionalIngestOperator(
            task_id="ingest", scope=scope, stream="readings", source=str(tmp_path / "in" / "{{ ds }}" / "*.jsonl"),
            routing_key_field="sensor_id", create_stream=True, stream_segments=2, spark_conn_id=None,
        )

        @task
        def keep(summary: dict) -> None:
            results.append(summary)

        keep(ingest.output)

    for day in DAYS + DAYS:  # the scheduled runs, then a backfill of the same intervals
        run = run_dag(dag, logical_date=datetime.fromisoformat(day).replace(tzinfo=timezone.utc))
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
        assert states == {"ingest": "success", "keep": "success"}, states
    assert [len(r["files_ingested"]) for r in results] == [2, 2, 2, 0, 0, 0]
    assert [len(r["files_skipped"]) for r in results] == [0, 0, 0, 2, 2, 2]
    assert all(r["tail_cut"] for r in results)
    events = read_stream(pravega_default_conn, scope, "readings", expected=len(lines))
    assert Counter(e.decode() for e in events) == Counter(lines)


def test_ingest_without_waiting_then_deferrable_transaction_sensor(tmp_path, spark, run_dag, pravega_default_conn,
                                                                   read_stream, unique_name):
    from airflow.sdk import DAG

    from airflow_provider_pravega.operators.ingest import PravegaTransactionalIngestOperator
    from airflow_provider_pravega.sensors import PravegaTransactionSensor

    (tmp_path / "in").mkdir()
    lines = [json.dumps({"sensor_id": f"s{n % 3}", "n": n}) for n in range(120)]
    (tmp_path / "in" / "a.jsonl").write_text("\n".join(lines) + "\n")
    scope = unique_name("nowait")
    with DAG(dag_id=f"nowait_{scope.replace('-', '_')}", schedule=None,
             start_date=datetime(2026, 11, 1, tzinfo=timezone.utc)) as dag:
        ingest = PravegaTransactionalIngestOperator(
            task_id="ingest", scope=scope, stream="s", source=str(tmp_path / "in"), routing_key_field="sensor_id",
            create_stream=True, stream_segments=2, wait_for_commit=False, num_writers=2, spark_conn_id=None,
        )
        wait = PravegaTransactionSensor(
            task_id="wait", scope=scope, stream="s",
            transaction_ids="{{ ti.xcom_pull(task_ids='ingest')['transaction_ids'] }}",
            deferrable=True, poke_interval=0.5, timeout=60,
        )
        ingest >> wait
    run = run_dag(dag)
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    assert states == {"ingest": "success", "wait": "success"}, states
    summary = run.get_task_instance("ingest").xcom_pull(task_ids="ingest")
    assert summary["transaction_ids"] and {t["status"] for t in summary["transactions"]} == {"COMMITTING"}
    events = read_stream(pravega_default_conn, scope, "s", expected=len(lines))
    assert Counter(e.decode() for e in events) == Counter(lines)


def test_a_small_day_is_written_by_the_task_itself_without_spark(tmp_path, run_dag, pravega_default_conn,
                                                                  read_stream, unique_name, monkeypatch):
    """Under the deployment's ``[pravega] ingest_in_process_max_bytes`` (set here as Airflow reads
    it, from its variable) a day of local files is written by the task's own process: no Spark
    session is asked for, every line lands once, and a rerun of the day writes nothing. A value
    that is not a byte count is refused, naming the setting."""
    import pytest
    from airflow.sdk import DAG, task

    from airflow_provider_pravega.operators import ingest as ingest_module
    from airflow_provider_pravega.operators.ingest import PravegaTransactionalIngestOperator
    from airflow_provider_pravega.spark import session
    from airflow_provider_pravega.spark.ingest_spec import IN_PROCESS_MAX_BYTES_VARIABLE, IngestSpec

    def no_session(*args, **kwargs):
        raise AssertionError("a small day asked for a Spark session")

    monkeypatch.setattr(session, "get_spark_session", no_session)
    monkeypatch.setenv(IN_PROCESS_MAX_BYTES_VARIABLE, str(1 << 20))
    (tmp_path / "in").mkdir()
    lines = [json.dumps({"sensor_id": f"s{n % 3}", "n": n}) for n in range(300)]
    for part in range(2):
        (tmp_path / "in" / f"part-{part}.jsonl").write_text("\n".join(lines[part::2]) + "\n")
    scope = unique_name("inproc")
    results: list[dict] = []
    with DAG(dag_id=f"inproc_{scope.replace('-', '_')}", schedule=None,
             start_date=datetime(2026, 11, 1, tzinfo=timezone.utc)) as dag:
        ingest = PravegaTransactionalIngestOperator(
            task_id="ingest", scope=scope, stream="s", source=str(tmp_path / "in"), routing_key_field="sensor_id",
            create_stream=True, stream_segments=2, spark_conn_id="spark_default")

        @task
        def keep(summary: dict) -> None:
            results.append(summary)

        keep(ingest.output)

    for _ in range(2):
        run = run_dag(dag)
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
        assert states == {"ingest": "success", "keep": "success"}, states
    assert [r["events"] for r in results] == [300, 0]
    assert Counter(e.decode() for e in read_stream(pravega_default_conn, scope, "s", expected=300)) == Counter(lines)
    monkeypatch.setenv(IN_PROCESS_MAX_BYTES_VARIABLE, "lots")
    with pytest.raises(ValueError, match=r"\[pravega\] ingest_in_process_max_bytes must be a whole number of bytes"):
        ingest_module._in_process_max_bytes(None)
    assert ingest_module._in_process_max_bytes(0) == 0  # the task's own value first
    with pytest.raises(ValueError, match=f"{IN_PROCESS_MAX_BYTES_VARIABLE} must be a whole number"):
        IngestSpec(scope=scope, stream="s", source=str(tmp_path / "in"))  # the job outside Airflow: at once
    assert IngestSpec(scope=scope, stream="s", source="x", in_process_max_bytes=5).in_process_max_bytes == 5
