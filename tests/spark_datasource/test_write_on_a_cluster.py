"""``df.write.format("pravega")`` on a real Spark standalone cluster (a master and two one-core
workers from pyspark's ``bin/spark-class``, tests/spark_cluster.py), the driver a PySpark script run
as its own process, as a user's job would be, held at the start of its commit (``job_commit``):

* every executor process (the executor JVMs and their Python workers) is SIGKILLed after the write
  tasks finished, while the driver is held: the job still commits every row exactly once. Nothing
  on an executor host is needed once its tasks are done (the workers stay up; they start fresh
  executors for the job, which get no task of it).
* speculation: one partition's first attempt blocks, Spark launches a speculative copy on the other
  worker and the copy wins; every row is in the stream exactly once and no transaction registered
  in the run (the ``register`` updates in its state synchronizer's log) is left OPEN. The losing
  attempt's writer is frozen (SIGSTOP) once both attempts registered, so it cannot abort its own
  transaction when Spark kills it: the job's commit has to.

The workers run on 127.0.0.1 and 127.0.0.2 (both loopback): Spark never starts a speculative copy on
a host where an attempt of the task already ran. Embedded server only (``pravega_embedded``): each
test is a Spark application of its own (a driver and two executor JVMs, tens of seconds on a busy
machine); what it relies on of Pravega (transactions, the state synchronizer) is the same in the
backend-neutral write tests (test_datasource.py, test_write_recovery.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest
from spark_cluster import QUICK_JVM, SparkCluster, start_spark_cluster

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.ingest_location import state_location
from airflow_provider_pravega.client.ingest_state import apply_update, initial_state
from airflow_provider_pravega.client.synchronizer import StateSynchronizer
from pravega_testing.faults import fault_env

ROWS, PARTITIONS = 2000, 4
WRITE_ID = "w1"

#: The job: ROWS rows in PARTITIONS partitions; each task attempt leaves a marker
#: ``p<partition>.a<attempt>`` (holding its Python worker's pid) in the hold directory. With
#: ``slow``, attempt 0 of partition 0 waits for the hold directory's ``release`` (so another attempt
#: of it has to win), attempt 1 of it for ``go`` (the test's signal).
JOB = textwrap.dedent("""
    import os
    import sys
    import time
    from pathlib import Path

    from pyspark import TaskContext
    from pyspark.sql import SparkSession

    from airflow_provider_pravega.spark.datasource import register

    master, uri, scope, write_id, hold, slow, *conf = sys.argv[1:]
    builder = (SparkSession.builder.master(master).config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.executor.memory", "768m")
               .config("spark.driver.extraJavaOptions", "{jvm}").config("spark.executor.extraJavaOptions", "{jvm}")
               # every executor registered before the first task: the tasks spread over both workers
               .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
               .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "300s"))
    for setting in conf:
        builder = builder.config(*setting.split("=", 1))
    spark = builder.getOrCreate()
    register(spark)


    def attempt(batches):
        task = TaskContext.get()
        Path(hold, f"p{{task.partitionId()}}.a{{task.attemptNumber()}}").write_text(str(os.getpid()))
        if slow == "slow" and task.partitionId() == 0:
            deadline = time.monotonic() + 600  # a bound for a loaded machine, not a timing assertion
            wait_for = Path(hold, "release" if task.attemptNumber() == 0 else "go")
            while not wait_for.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        yield from batches


    (spark.range(0, {rows}, 1, {partitions}).selectExpr("cast(id as string) as event")
     .mapInArrow(attempt, "event string")
     .write.format("pravega").mode("append").option("controller", uri).option("scope", scope)
     .option("stream", "s").option("write_id", write_id).save())
    print("saved")
""").format(rows=ROWS, partitions=PARTITIONS, jvm=QUICK_JVM)

#: Speculation once half the tasks are done and the slow one ran twice their median (and 1 s); the
#: efficiency check is off (it judges a task by its rate of processed rows, none for a blocked one).
SPECULATION = ["spark.speculation=true", "spark.speculation.interval=100ms", "spark.speculation.quantile=0.5",
               "spark.speculation.multiplier=2", "spark.speculation.minTaskRuntime=1s",
               "spark.speculation.efficiency.enabled=false"]


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    with start_spark_cluster(tmp_path_factory.mktemp("spark-cluster"), ("127.0.0.1", "127.0.0.2")) as cluster:
        yield cluster


@pytest.fixture
def stream(pravega_embedded: Any, unique_name: Any) -> tuple[str, str]:
    """(controller URI, scope) of a new scope with the two-segment stream ``s``."""
    uri, scope = pravega_embedded.controller_uri, unique_name("ds-cluster")
    with PravegaClient(uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "s", 2)
    return uri, scope


def _run_job(tmp_path: Path, cluster: SparkCluster, uri: str, scope: str, while_held: Callable[[Path], None], *,
             slow: bool = False, conf: Sequence[str] = (), while_writing: Callable[..., None] | None = None) -> None:
    """Run the job up to the start of its commit, call ``while_held(hold directory)``, release it;
    the job must then succeed. ``while_writing(hold directory, wait_until)`` first, once started."""
    script, hold, log = tmp_path / "job.py", tmp_path / "hold", tmp_path / "driver.log"
    script.write_text(JOB)
    hold.mkdir()
    env = fault_env(hold_at="job_commit", hold_dir=hold, base=cluster.env)
    with log.open("w") as out:
        driver = subprocess.Popen([sys.executable, str(script), cluster.master_url, uri, scope, WRITE_ID, str(hold),
                                   "slow" if slow else "-", *conf],
                                  env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_until(done: Callable[[], Any], what: str) -> None:
        deadline = time.monotonic() + 600  # a bound for a loaded machine, not a timing assertion
        while not done():
            assert driver.poll() is None, f"the job ended before {what}:\n{log.read_text()[-6000:]}"
            assert time.monotonic() < deadline, f"the job never reached {what}:\n{cluster.log_tail()}"
            time.sleep(0.2)

    try:
        if while_writing is not None:
            while_writing(hold, wait_until)
        wait_until(lambda: list(hold.glob("job_commit.*")), "its commit")
        while_held(hold)
        (hold / "release").touch()
        code = driver.wait(timeout=600)
    finally:
        if driver.poll() is None:  # the test failed first
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert code == 0 and "saved" in log.read_text(), f"{log.read_text()[-6000:]}\n{cluster.log_tail()}"


def _attempts(hold: Path) -> set[str]:
    return {p.name for p in hold.glob("p*.a*")}


def _kill_tree(proc: psutil.Process) -> None:
    """SIGKILL a process and everything below it (children first: none is re-parented and missed)."""
    try:
        tree = proc.children(recursive=True) + [proc]
    except psutil.NoSuchProcess:
        return
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    gone, alive = psutil.wait_procs(tree, timeout=30)
    assert not alive, alive


def _write_state(client: PravegaClient, scope: str, apply: Callable, initial: Any) -> StateSynchronizer:
    return StateSynchronizer(client, *state_location(scope, "s", f"spark-write:{WRITE_ID}"), initial, apply,
                             create=False)


def _registered_txns(client: PravegaClient, scope: str) -> list[str]:
    """Every transaction registered in the write's state, from its ``register`` updates: read by a
    synchronizer whose state is the list of updates itself (the run record that held them is gone
    once the run is done; a state with one run was never compacted)."""
    with _write_state(client, scope, lambda ops, op: [*ops, op], []) as updates:
        return [op["txn"] for op in updates.fetch() if op["op"] == "register"]


def _assert_exactly_once(read_stream: Any, uri: str, scope: str) -> Counter[str]:
    """Every row once in the stream; returns how the transactions registered in the run ended."""
    events = read_stream(uri, scope, "s", expected=ROWS)
    assert Counter(e.decode() for e in events) == Counter(str(i) for i in range(ROWS))
    with PravegaClient(uri) as client:
        txns = _registered_txns(client, scope)
        assert len(set(txns)) == len(txns), txns
        return Counter(client.transactions.status(scope, "s", int(t, 16)).name for t in txns)


def test_every_executor_killed_after_the_tasks_the_job_still_commits_exactly_once(
        tmp_path: Path, spark_cluster: SparkCluster, stream: tuple[str, str], read_stream: Any) -> None:
    uri, scope = stream

    def kill_every_executor(hold: Path) -> None:
        assert _attempts(hold) == {f"p{i}.a0" for i in range(PARTITIONS)}
        executors = spark_cluster.executors()
        assert len(executors) == 2, spark_cluster.log_tail()
        # Both ran write tasks: their Python workers (the pyspark daemon and its forks) are below them.
        assert all(e.children(recursive=True) for e in executors)
        for executor in executors:
            _kill_tree(executor)

    _run_job(tmp_path, spark_cluster, uri, scope, kill_every_executor)
    assert _assert_exactly_once(read_stream, uri, scope) == Counter(COMMITTED=PARTITIONS)


def test_a_speculative_attempt_wins_every_row_once_and_no_registered_transaction_left_open(
        tmp_path: Path, spark_cluster: SparkCluster, stream: tuple[str, str], read_stream: Any) -> None:
    uri, scope = stream
    frozen: list[psutil.Process] = []

    def freeze_the_loser(hold: Path, wait_until: Callable[..., None]) -> None:
        """Once both attempts of partition 0 registered their transactions, freeze attempt 0's
        writer (SIGSTOP): it cannot abort its own transaction when Spark kills it, so only the
        job's commit can end it. Then let the speculative copy go on."""
        # Both attempts' files, not only the speculative one's: attempt 0's task starts (and its writer
        # registers) before its mapInArrow worker writes p0.a0, so on a loaded machine the copy can
        # be launched, and both be registered, before that file is there (a CI run failed so).
        started = [hold / "p0.a0", hold / "p0.a1"]
        wait_until(lambda: all(p.exists() and p.read_text() for p in started), "both attempts of partition 0")
        with PravegaClient(uri) as client, _write_state(client, scope, apply_update, initial_state()) as state:
            wait_until(lambda: sum(len(r["txns"]) for r in state.fetch()["runs"].values()) > PARTITIONS,
                       "the registration of both attempts of partition 0")
        udf = psutil.Process(int((hold / "p0.a0").read_text()))  # its writer is a sibling (same daemon)
        frozen.extend(p for p in udf.parent().children() if p.pid != udf.pid)
        assert frozen, "attempt 0's writer process was not found"
        for p in frozen:
            p.suspend()
        (hold / "go").touch()

    def speculated(hold: Path) -> None:
        # Every partition has a successful attempt while attempt 0 of partition 0 still waits for
        # the release: partition 0 was won by attempt 1, run beside it (the speculative copy).
        assert _attempts(hold) == {"p0.a0", "p0.a1", *(f"p{i}.a0" for i in range(1, PARTITIONS))}

    try:
        _run_job(tmp_path, spark_cluster, uri, scope, speculated, slow=True, conf=SPECULATION,
                 while_writing=freeze_the_loser)
    finally:
        for p in frozen:  # Spark may have killed them already
            _kill_tree(p)
    states = _assert_exactly_once(read_stream, uri, scope)  # one transaction per task attempt:
    assert states["COMMITTED"] == PARTITIONS and states.total() == PARTITIONS + 1, states  # both of partition 0's
    assert "OPEN" not in states, states  # the loser's was aborted by the job's commit
