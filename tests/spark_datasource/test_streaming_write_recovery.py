"""A streaming write through the transactional stage: each task registers its micro-batch
transaction under its input partition. When one partition's transaction is lost after the
batch's commit point (its lease lapsed: here aborted by the test while the commit is held), the
other partitions are committed, the query fails saying so, and the query restarted from its
checkpoint replays the batch and writes only the lost partition: every event exactly once.

The query runs as its own process (a user's PySpark script); the hold is the data source's test
hook at the coordinator's ``after_commit_record`` step (``PRAVEGA_WRITE_HOLD_AT``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter

from held_jobs import kill_if_running, release, wait_until_held

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.ingest_location import open_ingest_state
from pravega_testing.faults import fault_env

EVENTS = 600

QUERY = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    from airflow_provider_pravega.spark.datasource import register

    uri, scope, checkpoint = sys.argv[1:4]
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    register(spark)
    q = (spark.readStream.format("pravega").option("controller", uri).option("scope", scope)
         .option("stream", "in").load().select("event")
         .writeStream.format("pravega").option("controller", uri).option("scope", scope)
         .option("stream", "out").option("writer_id", "copy").option("stale_after_s", "4")
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    q.awaitTermination()
    print("query done")
""")


def test_a_partition_lost_after_the_commit_point_is_written_again_by_the_restarted_query(
        tmp_path, pravega_controller_uri, unique_name, read_stream):
    scope = unique_name("ds-stream-heal")
    script = tmp_path / "query.py"
    script.write_text(QUERY)
    held = tmp_path / "held"
    held.mkdir()
    args = [sys.executable, str(script), pravega_controller_uri, scope, str(tmp_path / "checkpoint")]
    source = [f"e{i:05d}" for i in range(EVENTS)]
    with PravegaClient(pravega_controller_uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "in", 3)
        client.admin.create_stream(scope, "out", 2)
        with client.event_writer(scope, "in") as writer:
            for i, event in enumerate(source):
                writer.write_event(event.encode(), routing_key=f"k{i % 5}")
            writer.flush()

        env = {**fault_env(hold_at="after_commit_record", hold_dir=held), "PYSPARK_PYTHON": sys.executable}
        first = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)
        try:
            wait_until_held(first, held, "its commit point")
            store = open_ingest_state(client, scope, "out", "spark-stream:copy")
            try:
                (run,) = store.fetch()["runs"].values()
            finally:
                store.close()
            assert run["phase"] == "COMMITTING" and len(run["commit"]) >= 2, run  # one per input partition
            lost = run["commit"][1]
            client.transactions.abort(scope, "out", int(lost, 16))  # as a lapsed lease would
            out, err = release(first, held)
        finally:
            kill_if_running(first)
        assert first.returncode != 0
        assert "were aborted after its commit point" in err and "Restart the query" in err, err[-3000:]
        partial = read_stream(pravega_controller_uri, scope, "out")
        assert 0 < len(partial) < EVENTS and len(set(partial)) == len(partial)

        second = subprocess.run(args, env={**os.environ, "PYSPARK_PYTHON": sys.executable}, capture_output=True,
                                text=True, timeout=600)
        assert second.returncode == 0, second.stderr[-3000:]
        events = read_stream(pravega_controller_uri, scope, "out", expected=EVENTS)
        assert Counter(e.decode() for e in events) == Counter(source)
