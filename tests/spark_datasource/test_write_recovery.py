"""A batch write's driver killed inside its commit loop, then the same job run again with the same
``write_id``: every row is in the stream exactly once and no transaction of the killed job is left
OPEN. The driver runs as its own process (a PySpark script, as a user's job would); the kill point
is the data source's fault hook (``PRAVEGA_WRITE_HOLD_AT``), the kill a SIGKILL of its process group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter

from held_jobs import wait_until_held

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.ingest_location import open_ingest_state
from pravega_testing.faults import fault_env

ROWS, PARTITIONS = 2000, 4

JOB = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    from airflow_provider_pravega.spark.datasource import register

    uri, scope, write_id = sys.argv[1:4]
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    register(spark)
    (spark.range(0, {rows}, 1, {partitions}).selectExpr("cast(id as string) as event")
     .write.format("pravega").mode("append").option("controller", uri).option("scope", scope)
     .option("stream", "s").option("write_id", write_id).option("stale_after_s", "2").save())
    print("saved")
""").format(rows=ROWS, partitions=PARTITIONS)


def _job(tmp_path, uri: str, scope: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, **(env or {})}
    return subprocess.Popen([sys.executable, str(script), uri, scope, "w1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _run_record(client: PravegaClient, scope: str) -> dict:
    store = open_ingest_state(client, scope, "s", "spark-write:w1")
    try:
        return store.fetch()["runs"]
    finally:
        store.close()


def test_driver_killed_in_the_commit_loop_then_rerun_with_the_same_write_id_is_exactly_once(
        tmp_path, pravega_controller_uri, unique_name, read_stream):
    scope = unique_name("ds-rerun")
    with PravegaClient(pravega_controller_uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "s", 2)
        held = tmp_path / "held"
        held.mkdir()
        first = _job(tmp_path, pravega_controller_uri, scope,
                     fault_env(hold_at="after_first_commit", hold_dir=held))
        try:
            wait_until_held(first, held, "its commit loop")
        finally:
            os.killpg(first.pid, signal.SIGKILL)  # the driver JVM, its Python workers, the script
            first.communicate()
        (run,) = _run_record(client, scope).values()
        assert run["phase"] == "COMMITTING" and len(run["commit"]) == PARTITIONS
        txns = run["txns"]

        second = _job(tmp_path, pravega_controller_uri, scope)
        out, err = second.communicate(timeout=600)
        assert second.returncode == 0, err[-3000:]
        assert "saved" in out

        events = read_stream(pravega_controller_uri, scope, "s", expected=ROWS)
        assert Counter(e.decode() for e in events) == Counter(str(i) for i in range(ROWS))
        assert _run_record(client, scope) == {}
        states = {t: client.transactions.status(scope, "s", int(t, 16)).name for t in txns}
        assert "OPEN" not in states.values(), states
