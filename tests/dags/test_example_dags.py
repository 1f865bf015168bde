"""The example DAGs in dags/ are tests too: they import cleanly and run end to end through
``dag.test()`` against the embedded server, with assertions on what landed in the stream."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest
from delta_example_scenario import check_table, drop_example_stream, read_table, run_scenario
from pravega_clients import stream_writer

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"


# Airflow puts a DAG folder on the import path (the examples share pravega_examples_common.py).
if str(DAGS) not in sys.path:
    sys.path.append(str(DAGS))


def load_dag(path: Path, dag_id: str):
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, "dag") if hasattr(module, "dag") else next(
        v for v in vars(module).values() if getattr(v, "dag_id", None) == dag_id
    )


def test_every_example_dag_imports_without_errors():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS))
    assert not bag.import_errors, bag.import_errors
    assert set(bag.dag_ids) == {"pravega_exactly_once_ingest", "pravega_stream_cut_export",
                                "pravega_stream_cut_export_delta", "pravega_on_new_readings",
                                "pravega_count_new_readings"}


def test_sample_data_generator_is_deterministic(tmp_path):
    cmd = [sys.executable, str(REPO / "scripts" / "generate_sample_data.py"), "--days", "2", "--files-per-day", "2",
           "--events-per-file", "50"]
    subprocess.run(cmd + ["--out", str(tmp_path / "a")], check=True, capture_output=True)
    subprocess.run(cmd + ["--out", str(tmp_path / "b")], check=True, capture_output=True)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.jsonl"))
    assert len(files) == 4
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    first = json.loads((tmp_path / "a" / files[0]).read_text().splitlines()[0])
    assert {"reading_id", "sensor_id", "ts", "temperature_c", "humidity_pct"} <= set(first)
    bad = subprocess.run(cmd + ["--out", str(tmp_path / "c"), "--days", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "at least 1" in bad.stderr


def test_ingest_dag_runs_two_days_and_a_backfill_without_duplicates(tmp_path, monkeypatch, spark, run_dag,
                                                                   pravega_default_conn, read_stream):
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(REPO / "scripts" / "generate_sample_data.py"), "--out",
                    str(data / "incoming"), "--days", "2", "--files-per-day", "2", "--events-per-file", "300"],
                   check=True, capture_output=True)
    monkeypatch.setenv("PRAVEGA_EXAMPLES_DATA", str(data))
    dag = load_dag(DAGS / "pravega_exactly_once_ingest.py", "pravega_exactly_once_ingest")
    drop_example_stream(pravega_default_conn)
    for day in ("2026-11-01", "2026-11-02", "2026-11-01"):  # the second 11-01 is a backfill
        run = run_dag(dag, logical_date=datetime.fromisoformat(day).replace(tzinfo=timezone.utc))
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
        assert set(states.values()) == {"success"}, states
        # Every run ended recorded: the commit sensor recorded it done, so no later run had to
        # finish it, and nothing was "recovered" (no run was killed).
        summary = run.get_task_instance("ingest").xcom_pull(task_ids="ingest")
        assert summary["recovered_runs"] == [] and summary["finished_runs"] == [], summary
    source = [line for p in sorted((data / "incoming").rglob("*.jsonl")) for line in p.read_text().splitlines()]
    events = read_stream(pravega_default_conn, "iot", "readings", expected=len(source))
    assert Counter(e.decode() for e in events) == Counter(source)


def test_ingest_and_export_dags_catch_up_out_of_order_each_day_exactly(tmp_path, monkeypatch, spark, run_dag,
                                                                       pravega_default_conn):
    """The example pair over five days, ingested out of order (3, 1, 5, 2, 4) as a catchup or late
    days may run: each day's export folder holds exactly that day's records (the export waits for
    the ingest of its day and takes that day's cuts from the ingest's interval index); re-running a
    day's export rewrites the same rows."""
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(REPO / "scripts" / "generate_sample_data.py"), "--out",
                    str(data / "incoming"), "--days", "5", "--files-per-day", "1", "--events-per-file", "30"],
                   check=True, capture_output=True)
    monkeypatch.setenv("PRAVEGA_EXAMPLES_DATA", str(data))
    ingest = load_dag(DAGS / "pravega_exactly_once_ingest.py", "pravega_exactly_once_ingest")
    export = load_dag(DAGS / "pravega_stream_cut_export.py", "pravega_stream_cut_export")
    drop_example_stream(pravega_default_conn)
    days = [f"2026-11-0{d}" for d in (1, 2, 3, 4, 5)]

    def run(dag, day: str) -> None:
        dag_run = run_dag(dag, logical_date=datetime.fromisoformat(day).replace(tzinfo=timezone.utc))
        states = {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}
        assert set(states.values()) == {"success"}, (dag.dag_id, day, states)

    def ids(lines) -> list[str]:
        return sorted(json.loads(line)["reading_id"] for line in lines)

    def exported(day: str) -> list[str]:
        return sorted(r["reading_id"] for r in spark.read.parquet(str(data / "export" / "readings" / day)).collect())

    for day in ("2026-11-03", "2026-11-01", "2026-11-05", "2026-11-02", "2026-11-04"):
        run(ingest, day)
    for day in days:
        run(export, day)
    for day in days:
        source = [line for p in sorted((data / "incoming" / day).glob("*.jsonl")) for line in p.read_text().splitlines()]
        assert exported(day) == ids(source) and len(source) == 30, day
    before = exported(days[1])
    run(export, days[1])
    assert exported(days[1]) == before


def test_event_driven_dag_exports_the_new_range(tmp_path, monkeypatch, spark, run_dag, pravega_default_conn):
    """Run by hand (no asset event) it exports head → tail; with an event, the event's two cuts."""
    from airflow_provider_pravega.client import PravegaClient

    monkeypatch.setenv("PRAVEGA_EXAMPLES_DATA", str(tmp_path / "data"))
    from airflow_provider_pravega.triggers import PravegaStreamTrigger

    dag = load_dag(DAGS / "pravega_on_new_readings.py", "pravega_on_new_readings")
    # Scheduled on the stream's asset, named after the connection's controller, watched from the head.
    (asset,) = dag.timetable.asset_condition.objects
    assert asset.uri == pravega_default_conn.replace("tcp://", "pravega://") + "/iot/readings"
    (watcher,) = asset.watchers
    trigger = watcher.trigger.trigger  # MessageQueueTrigger(scheme="pravega") → this provider's trigger
    assert isinstance(trigger, PravegaStreamTrigger)
    assert (trigger.scope, trigger.stream, trigger.after_cut) == ("iot", "readings", "head")
    with PravegaClient(pravega_default_conn) as client:
        client.admin.create_scope("iot")
        if client.admin.stream_exists("iot", "readings"):
            client.admin.delete_stream("iot", "readings", seal=True)
        client.admin.create_stream("iot", "readings", 2)
    writer = stream_writer(pravega_default_conn, "iot", "readings", 100)
    for n in range(25):
        writer.write_event(json.dumps({"reading_id": f"r{n}", "sensor_id": f"s{n % 3}"}), f"s{n % 3}")
    writer.flush()
    run = run_dag(dag)
    assert {str(ti.state) for ti in run.get_task_instances()} == {"success"}
    (out,) = [p for p in (tmp_path / "data" / "export" / "on-new-readings").iterdir() if p.is_dir()]
    assert spark.read.json(str(out)).count() == 25


def test_count_dag_shares_the_watched_asset_and_counts_the_new_range(run_dag, pravega_default_conn):
    """Scheduled on the same asset and watcher as the export example; run by hand it counts head → tail
    (scripts/stack runs it on asset events: tests/triggers/test_shared_stream_triggerer.py)."""
    from airflow_provider_pravega.client import PravegaClient

    dag = load_dag(DAGS / "pravega_count_new_readings.py", "pravega_count_new_readings")
    export = load_dag(DAGS / "pravega_on_new_readings.py", "pravega_on_new_readings")
    (asset,) = dag.timetable.asset_condition.objects
    (exported,) = export.timetable.asset_condition.objects
    assert asset == exported and asset.watchers[0].trigger.serialize() == exported.watchers[0].trigger.serialize()
    with PravegaClient(pravega_default_conn) as client:
        client.admin.create_scope("iot")
        if client.admin.stream_exists("iot", "readings"):
            client.admin.delete_stream("iot", "readings", seal=True)
        client.admin.create_stream("iot", "readings", 2)
    writer = stream_writer(pravega_default_conn, "iot", "readings", 100)
    for n in range(7):
        writer.write_event(json.dumps({"reading_id": f"r{n}"}), f"s{n % 3}")
    writer.flush()
    run = run_dag(dag)
    assert {str(ti.state) for ti in run.get_task_instances()} == {"success"}
    result = run.get_task_instance("count_new_readings").xcom_pull(task_ids="count_new_readings")
    assert result == {"previous_cut": "head", "cut": "tail", "asset_events": 0, "readings": 7}


def test_delta_export_dag_catch_up_out_of_order_rerun_and_backfills_each_day_once(tmp_path, monkeypatch, pravega_conn,
                                                                                  pravega_embedded):
    """The example pair with the Delta variant of the export over a 3-day catchup: the export
    lagging and running the days out of order (3, 1, 2), a rerun of day 2, then backfills of day 1
    with ``--reprocess-behavior completed`` and, once its run is marked failed, ``failed``. Read
    back independently with delta-rs: each day's events are in the table exactly once, in that
    day's partition; the table has one version per day (the rerun and the backfills committed
    nothing), and each version's commit metadata names its day and stream cuts, between which
    every row of that day lies.

    The DAG runs happen in one child process (tests/delta_example_scenario.py, one Spark
    session with Delta for all of them; why: its docstring); this test checks what they left. On
    the embedded server only: what is tested is the table, and the DAG pair above runs on both
    backends."""
    pytest.importorskip("deltalake", reason="the test extra installs deltalake (delta-rs) to read tables")
    days = ["2026-11-01", "2026-11-02", "2026-11-03"]  # in the past: a backfill refuses future dates
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(REPO / "scripts" / "generate_sample_data.py"), "--out",
                    str(data / "incoming"), "--start", days[0], "--days", "3", "--files-per-day", "1",
                    "--events-per-file", "20"], check=True, capture_output=True)
    monkeypatch.setenv("PRAVEGA_EXAMPLES_DATA", str(data))
    monkeypatch.setenv("PRAVEGA_EXAMPLES_START", days[0])
    drop_example_stream(pravega_embedded.controller_uri)
    steps = run_scenario(days, os.environ, tmp_path)
    sources = {day: [json.loads(line)["reading_id"] for p in sorted((data / "incoming" / day).glob("*.jsonl"))
                     for line in p.read_text().splitlines()] for day in days}
    assert [len(ids) for ids in sources.values()] == [20] * 3
    check_table(steps, read_table(str(data / "export" / "readings_delta")), days, sources)
