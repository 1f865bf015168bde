"""The Delta example pipeline's scenario, run in its own process (:func:`run_scenario`) by
``tests/dags/test_example_dags.py::test_delta_export_dag_catch_up_out_of_order_rerun_and_backfills_each_day_once``
(a local table, one local session) and ``tests/lake/test_delta_connect_s3a.py`` (an ``s3a://`` table,
every task through a Spark Connect server); both check what it left with :func:`check_table`.

Its own process because the export needs Delta in the Spark session, and a JVM cannot gain Delta's
package once started: the test run's shared ``spark`` session (no Delta) may already be up, and
the operator rightly refuses a session without the settings it asks for. Here one session with
Delta is started first, and every ingest and export task of the scenario reuses it.

With ``PRAVEGA_EXAMPLES_SPARK_CONN`` set (tests/lake/test_delta_connect_s3a.py: a ``spark_connect``
connection), no session is started here: every task reaches that Spark Connect server, which has
Delta already.

Arguments: the days (ISO dates). Environment: the test's (AIRFLOW_HOME and its metadata DB,
AIRFLOW_CONN_PRAVEGA_DEFAULT, PRAVEGA_EXAMPLES_DATA / _START, and PRAVEGA_EXAMPLES_SPARK_CONN with
its AIRFLOW_CONN_*). Prints one ``STEP <json>`` line per DAG run: what ran, the states of its tasks
and the export's XCom.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DAGS = REPO / "dags"
EXPORT_ID = "pravega_stream_cut_export_delta.export"


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


def run_scenario(days: Sequence[str], env: Mapping[str, str], cwd: Path, timeout_s: float = 600) -> list[dict[str, Any]]:
    """Run :func:`main` in a child process (its own process group: a Spark JVM it starts is in it
    too, and is killed with it on a timeout or an interrupt); its ``STEP`` records. Its output is
    printed (shown when an assertion fails)."""
    env = dict(env, PYTHONPATH=os.pathsep.join([str(REPO), str(DAGS), str(REPO / "tests")]))
    child = subprocess.Popen([sys.executable, __file__, *days], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env, cwd=cwd, start_new_session=True)
    try:
        out, err = child.communicate(timeout=timeout_s)
    finally:
        if child.poll() is None:  # timed out, or the test was interrupted: stop the child and its JVM
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
    assert child.returncode == 0, out[-3000:] + err[-6000:]
    print(out)  # the runs and their seconds
    return [json.loads(line[len("STEP "):]) for line in out.splitlines() if line.startswith("STEP ")]


def read_table(uri: str, storage_options: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The Delta table at ``uri`` read with delta-rs: its rows and its history (``deltalake``'s
    ``to_pyarrow_table().to_pylist()`` and ``history()``)."""
    import deltalake

    table = deltalake.DeltaTable(uri, storage_options=dict(storage_options or {}) or None)
    return {"rows": table.to_pyarrow_table().to_pylist(), "history": table.history()}


def check_table(steps: Sequence[Mapping[str, Any]], table: Mapping[str, Any], days: Sequence[str],
                sources: Mapping[str, Sequence[str]]) -> None:
    """What the scenario must leave: every run succeeded; the first export of each day committed
    its rows, the rerun and both backfills nothing; read back with delta-rs (``table``: what
    :func:`read_table` returns), each day's events (``sources``: the day's reading ids) are in the
    table exactly once, in that day's partition; one version per day, whose commit metadata names
    its day and stream cuts, between which every row of that day lies."""
    from airflow_provider_pravega.client.streamcut import StreamCut

    assert [(s["step"], s["day"]) for s in steps] == [
        ("ingest", days[0]), ("ingest", days[1]), ("ingest", days[2]), ("export", days[2]), ("export", days[0]),
        ("export", days[1]), ("rerun", days[1]), ("backfill completed", days[0]), ("backfill failed", days[0])]
    for s in steps:
        assert set(s["states"].values()) == {"success"}, s
    assert [s["run_type"] for s in steps[-2:]] == ["backfill", "backfill"]
    exports = [s["export"] for s in steps[3:]]
    # The first export of each day committed its rows; the rerun and both backfills committed nothing.
    assert [(e["already_written"], e["events"]) for e in exports] == [
        (False, len(sources[day])) for day in (days[2], days[0], days[1])] + [(True, 0)] * 3
    version = {s["day"]: s["export"]["table_version"] for s in steps[3:6]}
    assert sorted(version.values()) == [0, 1, 2]
    assert [e["table_version"] for e in exports[3:]] == [version[days[1]], version[days[0]], version[days[0]]]

    rows = table["rows"]
    interval = {s["day"]: s["export"]["interval"] for s in steps[3:6]}
    # The day's partition is the run's data interval (a daily cron DAG's runs are points in time).
    assert all(interval[day].startswith(f"{day}T00:00:00") for day in days), interval
    for day in days:
        assert Counter(r["reading_id"] for r in rows if r["interval_key"] == interval[day]) == Counter(sources[day]), day
    assert len(rows) == sum(map(len, sources.values())) and {(r["scope"], r["stream"]) for r in rows} == {
        ("iot", "readings")}

    history = [h for h in table["history"] if h.get("userMetadata")]
    assert sorted(h["version"] for h in history) == [0, 1, 2] and len(table["history"]) == 3
    for commit in history:
        meta = json.loads(commit["userMetadata"])
        day = next(d for d in days if interval[d] == meta["interval"])
        assert commit["version"] == version[day] and meta["export_id"] == EXPORT_ID
        start = StreamCut.from_text(meta["start_cut"], scope="iot", stream="readings", unbounded="head").positions
        end = StreamCut.from_text(meta["end_cut"], scope="iot", stream="readings", unbounded="tail").positions
        for r in rows:  # every row of the day lies between the cuts its version names
            if r["interval_key"] == meta["interval"]:
                assert start.get(r["segment_id"], 0) <= r["offset"] < end[r["segment_id"]], (day, r, meta)


def main(days: list[str]) -> None:
    from airflow_provider_pravega.spark.delta_export import session_conf
    from airflow_provider_pravega.spark.session import get_spark_session
    from pravega_testing.dag_test import mark_run_failed, run_backfill, run_dag
    from test_example_dags import load_dag

    started = time.monotonic()
    connect = bool(os.environ.get("PRAVEGA_EXAMPLES_SPARK_CONN"))  # the tasks' Spark Connect server
    spark = None if connect else get_spark_session(None, "delta-example-dags", **session_conf(
        {"spark.master": "local[2]", "spark.sql.shuffle.partitions": "2",
         # The Delta log of a small table in 2 tasks, not Delta's default 50 (seconds per export here).
         "spark.databricks.delta.snapshotPartitions": "2",
         # A short-lived JVM on a busy machine: C1 only and the serial GC (as tests/spark_cluster.py).
         "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}))
    if spark is not None:
        print(f"SPARK {time.monotonic() - started:.1f} s", flush=True)
    ingest = load_dag(DAGS / "pravega_exactly_once_ingest.py", "pravega_exactly_once_ingest")
    export = load_dag(DAGS / "pravega_stream_cut_export_delta.py", "pravega_stream_cut_export_delta")
    when = {day: datetime.fromisoformat(day).replace(tzinfo=timezone.utc) for day in days}
    first, second, third = days

    clock = [time.monotonic()]

    def report(step: str, day: str, run) -> None:
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
        xcom = run.get_task_instance("export").xcom_pull(task_ids="export") if "export" in states else None
        print("STEP " + json.dumps({"step": step, "day": day, "run_type": str(run.run_type), "states": states,
                                    "export": xcom, "seconds": round(time.monotonic() - clock[0], 1)},
                                   default=str), flush=True)
        clock[0] = time.monotonic()

    try:
        for day in days:  # the ingest's catchup
            report("ingest", day, run_dag(ingest, logical_date=when[day]))
        for day in (third, first, second):  # the export lagging, catching up out of order
            report("export", day, run_dag(export, logical_date=when[day]))
        report("rerun", second, run_dag(export, logical_date=when[second]))
        (run,) = run_backfill(export, when[first], when[first], "completed")
        report("backfill completed", first, run)
        mark_run_failed(export, when[first])  # as the UI or the REST API marks a run failed
        (run,) = run_backfill(export, when[first], when[first], "failed")
        report("backfill failed", first, run)
    finally:
        if spark is not None:
            spark.stop()
            _stop_jvm()


def _stop_jvm() -> None:
    """End Spark's JVM and reap it here: left to exit with this process, it would be orphaned
    (and, where nothing reaps orphans, stay a zombie)."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if gateway is None:
        return
    gateway.shutdown()
    if proc is not None:
        proc.stdin.close()  # the JVM's gateway server exits when its stdin closes
        proc.wait(timeout=60)


if __name__ == "__main__":
    sys.path[:0] = [str(REPO), str(DAGS), str(REPO / "tests"), str(REPO / "tests" / "dags")]
    main(sys.argv[1:])
