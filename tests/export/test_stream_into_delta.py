"""A streaming query from a Pravega stream into a Delta Lake table
(``spark.readStream.format("pravega") ... .writeStream.format("delta")`` with a checkpoint): run,
stopped and restarted twice while a writer keeps writing, then caught up; every event is in the
table exactly once (read back with delta-rs). The stream cut offsets in the checkpoint and Delta's
own idempotent sink (its commit log keyed by the query id and batch id) make it exactly once.

The query runs in its own process (a Spark session with Delta's package); the writer is this
test, writing between and during the runs.

Embedded server only: what these rely on of Pravega (stream-cut reads) runs against Pravega
standalone in the export and data-source tests; here the subject is Delta's side.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections import Counter

import pytest

from airflow_provider_pravega.client import PravegaClient

deltalake = pytest.importorskip("deltalake", reason="the test extra installs deltalake (delta-rs) to read tables")

QUERY = textwrap.dedent("""
    import sys
    from airflow_provider_pravega.spark.datasource import register
    from airflow_provider_pravega.spark.delta_export import session_conf
    from airflow_provider_pravega.spark.session import get_spark_session

    uri, scope, table, checkpoint, runs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    spark = get_spark_session(None, "pravega-to-delta", **session_conf({"spark.master": "local[2]"}))
    register(spark)
    for run in range(runs):  # each run: a query started from the checkpoint, stopped when caught up
        q = (spark.readStream.format("pravega").option("controller", uri).option("scope", scope)
             .option("stream", "s").option("max_events_per_trigger", "400").load()
             .selectExpr("cast(event as string) as event", "segment_id", "offset")
             .writeStream.format("delta").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start(table))
        q.awaitTermination()
        assert q.exception() is None, q.exception()
        print("RUN", run, "batches", len(q.recentProgress), flush=True)
        if run < runs - 1:
            print("WAITING", flush=True)
            sys.stdin.readline()  # the test writes more, then lets the next run start
    spark.stop()
""")


def test_a_query_into_delta_restarted_twice_while_writing_has_every_event_once(
        tmp_path, pravega_embedded, unique_name):
    pravega_controller_uri = pravega_embedded.controller_uri
    scope = unique_name("to-delta")
    table, checkpoint = tmp_path / "table", tmp_path / "checkpoint"
    script = tmp_path / "query.py"
    script.write_text(QUERY)
    written: list[str] = []
    with PravegaClient(pravega_controller_uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "s", 2)

        def write(count: int) -> None:
            with client.event_writer(scope, "s") as writer:
                for _ in range(count):
                    event = f"e{len(written):05d}"
                    writer.write_event(event.encode(), routing_key=f"k{len(written) % 5}")
                    written.append(event)
                writer.flush()

        write(700)
        query = subprocess.Popen([sys.executable, str(script), pravega_controller_uri, scope, str(table),
                                  str(checkpoint), "3"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        try:
            for _restart in range(2):
                # While this run reads, the writer keeps writing; once it stopped, more again.
                writer = threading.Thread(target=write, args=(300,))
                writer.start()
                line = query.stdout.readline()
                while line and not line.startswith("WAITING"):
                    line = query.stdout.readline()
                writer.join()
                assert line, query.communicate()[1][-4000:]
                write(200)
                query.stdin.write("go\n")
                query.stdin.flush()
            out, err = query.communicate(timeout=900)
        finally:
            if query.poll() is None:
                query.kill()
                query.communicate()
        assert query.returncode == 0, err[-4000:]
    rows = deltalake.DeltaTable(str(table)).to_pyarrow_table().column("event").to_pylist()
    assert Counter(rows) == Counter(written)
    assert "RUN 2 " in out  # the third run (the second restart) caught up
