"""A batch write whose commit comes long after its last task: the process that registered the data
source with ``renew_writes`` keeps the write's transactions alive (its renewer thread follows the
registry in Pravega), so the job commits every row exactly once; without it the leases lapse and
the job says which partitions to write again. The driver runs as its own process (a user's PySpark
script); the gap is the data source's hold point at ``job_commit`` (``PRAVEGA_WRITE_HOLD_AT``).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections import Counter

import pytest

from held_jobs import kill_if_running, release, wait_until_held

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.ingest_location import open_ingest_state
from pravega_testing.faults import fault_env

ROWS, PARTITIONS, LEASE_MS = 1000, 3, 10_000

JOB = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    from airflow_provider_pravega.spark.datasource import register

    uri, scope, renew = sys.argv[1:4]
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate())
    renewer = register(spark, renew_writes={{"controller": uri, "scope": scope}} if renew == "yes" else None)
    (spark.range(0, {rows}, 1, {partitions}).selectExpr("cast(id as string) as event")
     .write.format("pravega").mode("append").option("controller", uri).option("scope", scope)
     .option("stream", "s").option("write_id", "w1").option("stale_after_s", "4")
     .option("transaction_lease_ms", "{lease}").save())
    print("saved; renewed runs:", len(renewer.renewed_runs) if renewer else 0)
    if renewer:
        renewer.stop()
    spark.stop()
""").format(rows=ROWS, partitions=PARTITIONS, lease=LEASE_MS)


def _txn_states(client: PravegaClient, scope: str) -> dict[str, str]:
    store = open_ingest_state(client, scope, "s", "spark-write:w1")
    try:
        runs = store.fetch()["runs"]
    finally:
        store.close()
    return {t: client.transactions.status(scope, "s", int(t, 16)).name for run in runs.values() for t in run["txns"]}


@pytest.mark.parametrize("renewed", [True, False], ids=["renewer", "lease-only"])
def test_a_commit_long_after_the_last_task_is_kept_alive_by_the_registering_process(
        tmp_path, pravega_backend, pravega_controller_uri, unique_name, read_stream, renewed):
    if not renewed and pravega_backend != "embedded":
        pytest.skip("the lease-only contrast runs on the embedded server only (it shows what the renewer prevents)")
    scope = unique_name("ds-renew")
    held = tmp_path / "held"
    held.mkdir()
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {**fault_env(hold_at="job_commit", hold_dir=held), "PYSPARK_PYTHON": sys.executable}
    with PravegaClient(pravega_controller_uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "s", 2)
        job = subprocess.Popen([sys.executable, str(script), pravega_controller_uri, scope, "yes" if renewed else "no"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
        try:
            wait_until_held(job, held, "its commit")
            # Every task is done, the commit waits: only the registering process can renew now.
            states = _txn_states(client, scope)
            assert len(states) == PARTITIONS and set(states.values()) == {"OPEN"}, states
            if renewed:
                time.sleep(3 * LEASE_MS / 1000)  # three leases: each would have lapsed unrenewed
                states = _txn_states(client, scope)
                assert set(states.values()) == {"OPEN"}, states
            else:
                deadline = time.monotonic() + 600  # a bound for a loaded machine, not a timing assertion
                while set(_txn_states(client, scope).values()) == {"OPEN"}:
                    assert time.monotonic() < deadline, "the unrenewed leases never lapsed"
                    time.sleep(1.0)
            out, err = release(job, held)
        finally:
            kill_if_running(job)
        if renewed:
            assert job.returncode == 0, err[-3000:]
            assert "saved; renewed runs: 1" in out
            events = read_stream(pravega_controller_uri, scope, "s", expected=ROWS)
            assert Counter(e.decode() for e in events) == Counter(str(i) for i in range(ROWS))
        else:
            assert job.returncode != 0
            assert "were aborted before the job committed" in err and "same write_id='w1'" in err, err[-3000:]


def test_a_renewer_needs_the_scope_of_its_registry_and_a_controller_that_answers():
    """Bad input to ``register(spark, renew_writes=...)`` is said at registration, not at a write."""
    from airflow_provider_pravega.client.errors import ControllerUnreachableError
    from airflow_provider_pravega.spark.datasource import PravegaDataSourceError, register
    from pravega_testing.net import free_port

    with pytest.raises(PravegaDataSourceError, match="scope"):
        register(object(), renew_writes={"controller": "tcp://127.0.0.1:9090"})
    nowhere = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(ControllerUnreachableError, match=nowhere.rsplit(":", 1)[1]):
        register(object(), renew_writes={"controller": nowhere, "scope": "s"})
