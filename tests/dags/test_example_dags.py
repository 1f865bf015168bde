"""The example DAGs in dags/ are tests too: they import cleanly and run end to end through
``dag.test()`` against the embedded server, with assertions on what landed in the stream."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest
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


def drop_example_stream(controller_uri: str) -> None:
    """A fresh start for the examples: drop iot/readings and reset the example ingest's state (its
    committed files and interval index describe the dropped stream; an export taking its cuts from
    them would be refused, as those ranges do not exist in a new stream)."""
    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.client.ingest import reset_ingest_state

    with PravegaClient(controller_uri) as client:
        client.admin.create_scope("iot")
        if client.admin.stream_exists("iot", "readings"):
            client.admin.delete_stream("iot", "readings", seal=True)
        reset_ingest_state(client, "iot", "readings", "pravega_exactly_once_ingest.ingest")


def test_every_example_dag_imports_without_errors():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS))
    assert not bag.import_errors, bag.import_errors
    assert set(bag.dag_ids) == {"pravega_exactly_once_ingest", "pravega_stream_cut_export",
                                "pravega_stream_cut_export_delta", "pravega_on_new_readings"}


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


def test_delta_export_dag_catch_up_out_of_order_rerun_and_backfills_each_day_once(tmp_path, monkeypatch, pravega_conn,
                                                                                  pravega_embedded):
    """The example pair with the Delta variant of the export over a 3-day catchup: the export
    lagging and running the days out of order (3, 1, 2), a rerun of day 2, then backfills of day 1
    with ``--reprocess-behavior completed`` and, once its run is marked failed, ``failed``. Read
    back independently with delta-rs: each day's events are in the table exactly once, in that
    day's partition; the table has one version per day (the rerun and the backfills committed
    nothing), and each version's commit metadata names its day and stream cuts, between which
    every row of that day lies.

    The DAG runs happen in one child process (tests/dags/delta_example_scenario.py, one Spark
    session with Delta for all of them; why: its docstring); this test checks what they left. On
    the embedded server only: what is tested is the table, and the DAG pair above runs on both
    backends."""
    from airflow_provider_pravega.client.streamcut import StreamCut

    deltalake = pytest.importorskip("deltalake", reason="the test extra installs deltalake (delta-rs) to read tables")
    days = ["2026-11-01", "2026-11-02", "2026-11-03"]  # in the past: a backfill refuses future dates
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(REPO / "scripts" / "generate_sample_data.py"), "--out",
                    str(data / "incoming"), "--start", days[0], "--days", "3", "--files-per-day", "1",
                    "--events-per-file", "20"], check=True, capture_output=True)
    monkeypatch.setenv("PRAVEGA_EXAMPLES_DATA", str(data))
    monkeypatch.setenv("PRAVEGA_EXAMPLES_START", days[0])
    drop_example_stream(pravega_embedded.controller_uri)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(DAGS), str(REPO / "tests")]))
    child = subprocess.Popen([sys.executable, str(Path(__file__).parent / "delta_example_scenario.py"), *days],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                             start_new_session=True)  # its own process group: Spark's JVM is in it too
    try:
        out, err = child.communicate(timeout=600)
    finally:
        if child.poll() is None:  # timed out, or this test was interrupted: stop the child and its JVM
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
    assert child.returncode == 0, out[-3000:] + err[-6000:]
    print(out)  # the runs and their seconds, shown when an assertion below fails
    steps = [json.loads(line[len("STEP "):]) for line in out.splitlines() if line.startswith("STEP ")]
    assert [(s["step"], s["day"]) for s in steps] == [
        ("ingest", days[0]), ("ingest", days[1]), ("ingest", days[2]), ("export", days[2]), ("export", days[0]),
        ("export", days[1]), ("rerun", days[1]), ("backfill completed", days[0]), ("backfill failed", days[0])]
    for s in steps:
        assert set(s["states"].values()) == {"success"}, s
    assert [s["run_type"] for s in steps[-2:]] == ["backfill", "backfill"]
    exports = [s["export"] for s in steps[3:]]
    # The first export of each day committed its rows; the rerun and both backfills committed nothing.
    assert [(e["already_written"], e["events"]) for e in exports] == [(False, 20)] * 3 + [(True, 0)] * 3
    version = {s["day"]: s["export"]["table_version"] for s in steps[3:6]}
    assert sorted(version.values()) == [0, 1, 2]
    assert [e["table_version"] for e in exports[3:]] == [version[days[1]], version[days[0]], version[days[0]]]

    table = deltalake.DeltaTable(str(data / "export" / "readings_delta"))
    rows = table.to_pyarrow_table().to_pylist()
    interval = {s["day"]: s["export"]["interval"] for s in steps[3:6]}
    # The day's partition is the run's data interval (a daily cron DAG's runs are points in time).
    assert all(interval[day].startswith(f"{day}T00:00:00") for day in days), interval
    for day in days:
        source = [json.loads(line)["reading_id"] for p in sorted((data / "incoming" / day).glob("*.jsonl"))
                  for line in p.read_text().splitlines()]
        assert len(source) == 20
        assert Counter(r["reading_id"] for r in rows if r["interval_key"] == interval[day]) == Counter(source), day
    assert len(rows) == 60 and {(r["scope"], r["stream"]) for r in rows} == {("iot", "readings")}

    history = [h for h in table.history() if h.get("userMetadata")]
    assert sorted(h["version"] for h in history) == [0, 1, 2] and len(table.history()) == 3
    for commit in history:
        meta = json.loads(commit["userMetadata"])
        day = next(d for d in days if interval[d] == meta["interval"])
        assert commit["version"] == version[day] and meta["export_id"] == "pravega_stream_cut_export_delta.export"
        start = StreamCut.from_text(meta["start_cut"], scope="iot", stream="readings", unbounded="head").positions
        end = StreamCut.from_text(meta["end_cut"], scope="iot", stream="readings", unbounded="tail").positions
        for r in rows:  # every row of the day lies between the cuts its version names
            if r["interval_key"] == meta["interval"]:
                assert start.get(r["segment_id"], 0) <= r["offset"] < end[r["segment_id"]], (day, r, meta)
