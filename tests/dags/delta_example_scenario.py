"""The Delta example pipeline's scenario, run in its own process by
``test_example_dags.py::test_delta_export_dag_catch_up_out_of_order_rerun_and_backfills_each_day_once``.

Its own process because the export needs Delta in the Spark session, and a JVM cannot gain Delta's
package once started: the test run's shared ``spark`` session (no Delta) may already be up, and
the operator rightly refuses a session without the settings it asks for. Here one session with
Delta is started first, and every ingest and export task of the scenario reuses it.

Arguments: the days (ISO dates). Environment: the test's (AIRFLOW_HOME and its metadata DB,
AIRFLOW_CONN_PRAVEGA_DEFAULT, PRAVEGA_EXAMPLES_DATA / _START). Prints one ``STEP <json>`` line per
DAG run: what ran, the states of its tasks and the export's XCom.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"


def main(days: list[str]) -> None:
    from airflow_provider_pravega.spark.delta_export import session_conf
    from airflow_provider_pravega.spark.session import get_spark_session
    from pravega_testing.dag_test import mark_run_failed, run_backfill, run_dag
    from test_example_dags import load_dag

    started = time.monotonic()
    spark = get_spark_session(None, "delta-example-dags", **session_conf(
        {"spark.master": "local[2]", "spark.sql.shuffle.partitions": "2",
         # The Delta log of a small table in 2 tasks, not Delta's default 50 (seconds per export here).
         "spark.databricks.delta.snapshotPartitions": "2",
         # A short-lived JVM on a busy machine: C1 only and the serial GC (as tests/spark_cluster.py).
         "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}))
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
    sys.path[:0] = [str(REPO), str(DAGS), str(REPO / "tests"), str(Path(__file__).parent)]
    main(sys.argv[1:])
