"""The exactly-once protocol's lifecycle against an embedded server that forgets finished
transactions at once (``--finished-txn-retention-ms 1``: a day of Pravega's retention in a test):
commit-later runs are recorded done by the next run or the commit sensor, acknowledged commits the
controller forgot count as committed, a crash between the commit requests and their record is a
clear error with the parameter that resolves it, a re-pointed ingest writes into its new stream,
the timing rule is enforced before any write, and a later try of a task takes its run over at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.controller_types import TxnStatus
from airflow_provider_pravega.client.ingest_errors import IngestError
from airflow_provider_pravega.client.ingest_location import legacy_state_location, open_state_store
from airflow_provider_pravega.client.ingest_state import REQUESTED, apply_update, initial_state
from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess
from airflow_provider_pravega.spark.ingest_job import run_ingest, state_location
from airflow_provider_pravega.spark.ingest_spec import IngestSpec
from pravega_testing.faults import fault_env


@pytest.fixture(scope="module")
def forgetful(tmp_path_factory: pytest.TempPathFactory):
    """An embedded server whose controller forgets a finished transaction as soon as another one
    of the stream finishes."""
    server = EmbeddedPravegaProcess(tmp_path_factory.mktemp("forgetful"),
                                    extra_args=["--finished-txn-retention-ms", "1"]).start()
    yield server
    server.stop()


@pytest.fixture
def client(forgetful):
    with PravegaClient(forgetful.controller_uri) as c:
        yield c


def write_day(directory, day: int, files: int = 2, per_file: int = 50) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(files):
        rows = [json.dumps({"sensor_id": f"s{n % 5}", "day": day, "f": i, "n": n}) for n in range(per_file)]
        (directory / f"d{day}-{i}.jsonl").write_text("\n".join(rows) + "\n")
        lines += rows
    return lines


def events(client: Any, scope: str, stream: str) -> Counter:
    from airflow_provider_pravega.client.batch import plan_segment_ranges, read_segment_ranges
    from airflow_provider_pravega.client.streamcut import StreamCut

    ranges = plan_segment_ranges(client, StreamCut.head(client, scope, stream), StreamCut.tail(client, scope, stream))
    return Counter(e.payload.decode() for e in read_segment_ranges(client, ranges))


def forget_finished(client: Any, scope: str, stream: str, txns: list[str]) -> None:
    """Let ``txns`` finish, then finish one more transaction: the controller forgets them."""
    deadline = time.monotonic() + 60
    while any(client.transactions.status(scope, stream, int(t, 16)) not in (TxnStatus.COMMITTED, TxnStatus.UNKNOWN)
              for t in txns):
        assert time.monotonic() < deadline, "commits did not complete"
        time.sleep(0.05)
    time.sleep(0.01)
    info = client.transactions.begin(scope, stream)
    client.transactions.abort(scope, stream, info.txn_id, wait=True)
    assert all(client.transactions.status(scope, stream, int(t, 16)) == TxnStatus.UNKNOWN for t in txns)


def state_of(client: Any, spec: IngestSpec) -> dict:
    with open_state_store(client, *state_location(spec), create=False) as store:
        return store.fetch()


def test_commit_later_days_after_the_controller_forgot(tmp_path, client, spark, forgetful, monkeypatch,
                                                       unique_name):
    """Two daily runs with wait_for_commit=False, the second after the controller forgot the
    first one's transactions: both succeed, no phantom recovery, every record once; the commit
    sensor, given the run through XCom, records the second run done."""
    from airflow.sdk import PokeReturnValue

    from airflow_provider_pravega.sensors import PravegaTransactionSensor

    scope = unique_name("days")
    lines1 = write_day(tmp_path / "in" / "d1", 1)
    lines2 = write_day(tmp_path / "in" / "d2", 2)

    def spec(day: str) -> IngestSpec:
        return IngestSpec(scope=scope, stream="s", source=str(tmp_path / "in" / day), routing_key_field="sensor_id",
                          ingest_id="daily", create_stream=True, stream_segments=2, num_writers=2,
                          wait_for_commit=False)

    day1 = run_ingest(client, spark, spec("d1"))
    assert day1.transactions and {t["status"] for t in day1.transactions} == {"COMMITTING"}
    assert state_of(client, spec("d1"))["runs"][day1.run_id]["phase"] == REQUESTED
    forget_finished(client, scope, "s", [t["id"] for t in day1.transactions])

    day2 = run_ingest(client, spark, spec("d2"))
    assert day2.finished_runs == [day1.run_id] and day2.recovered_runs == []
    assert len(day2.files_ingested) == 2
    forget_finished(client, scope, "s", [t["id"] for t in day2.transactions])

    host, port = forgetful.controller_uri.rsplit("//", 1)[1].rsplit(":", 1)
    monkeypatch.setenv("AIRFLOW_CONN_PRAVEGA_DEFAULT", json.dumps({"conn_type": "pravega", "host": host,
                                                                   "port": int(port)}))
    xcom = day2.to_dict()
    sensor = PravegaTransactionSensor(task_id="wait", scope=scope, stream="s", transaction_ids=xcom["transaction_ids"],
                                      ingest_run=repr(xcom))  # as a template renders it
    done = sensor.poke({})
    assert isinstance(done, PokeReturnValue) and done.is_done
    with open_state_store(client, *state_location(spec("d2")), create=False) as store:
        state = store.fetch()
        remembered = list(store.files.table.entries())  # the committed-file table, not the state
    assert state["runs"] == {} and state["committed"] == {} and not state.get("unindexed") and len(remembered) == 4
    assert events(client, scope, "s") == Counter(lines1 + lines2)
    again = run_ingest(client, spark, spec("d2"))
    assert again.run_id is None and again.finished_runs == [] and again.recovered_runs == []


def test_repointed_stream_receives_the_files(tmp_path, client, spark, unique_name):
    scope = unique_name("repoint")
    lines = write_day(tmp_path / "in", 1)
    first = run_ingest(client, spark, IngestSpec(scope=scope, stream="a", source=str(tmp_path / "in"),
                                                 ingest_id="dag.ingest", create_stream=True))
    again = run_ingest(client, spark, IngestSpec(scope=scope, stream="a", source=str(tmp_path / "in"),
                                                 ingest_id="dag.ingest", create_stream=True))
    moved = run_ingest(client, spark, IngestSpec(scope=scope, stream="b", source=str(tmp_path / "in"),
                                                 ingest_id="dag.ingest", create_stream=True))
    assert len(first.files_ingested) == 2 and again.run_id is None and len(moved.files_ingested) == 2
    assert events(client, scope, "a") == Counter(lines) == events(client, scope, "b")


def _legacy_state(client: Any, scope: str, ingest_id: str, files: dict[str, dict]) -> None:
    """A state as versions before 0.2 left it (keyed by the ingest id only)."""
    from airflow_provider_pravega.client.synchronizer import StateSynchronizer

    legacy = {"committed": {}, "runs": {}, "completed_runs": 0}  # no "target": the old layout
    with StateSynchronizer(client, *legacy_state_location(scope, ingest_id), legacy, apply_update) as store:
        store.update(lambda s: [{"op": "start", "run": "old", "files": files, "owner": "o", "ts": 1},
                                {"op": "done", "run": "old"}])


def test_old_layout_state_is_adopted_for_its_stream_only(tmp_path, client, spark, unique_name):
    import hashlib

    def old_identity(path: str) -> dict:  # what versions before 0.2 recorded: size and BLAKE2b-160
        data = open(path, "rb").read()
        return {"size": len(data), "fp": hashlib.blake2b(data, digest_size=20).hexdigest()}

    scope = unique_name("legacy")
    lines = write_day(tmp_path / "in", 1)
    files = sorted(str(p) for p in (tmp_path / "in").iterdir())
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "old", 1)
    # The old version ingested both files into "old" (the records stand for them here).
    info = client.transactions.begin(scope, "old")
    with client.transactions.writer(scope, "old", info) as writer:
        writer.write_events([line.encode() for line in lines])
    client.transactions.commit(scope, "old", info.txn_id)
    _legacy_state(client, scope, "dag.ingest", {f: old_identity(f) for f in files})

    # A new, empty stream for the same ingest id: its files are ingested (not adopted)...
    moved = run_ingest(client, spark, IngestSpec(scope=scope, stream="new", source=str(tmp_path / "in"),
                                                 ingest_id="dag.ingest", create_stream=True))
    assert len(moved.files_ingested) == 2 and events(client, scope, "new") == Counter(lines)
    # ...and the old stream keeps its history: nothing ingested twice after the upgrade.
    same = run_ingest(client, spark, IngestSpec(scope=scope, stream="old", source=str(tmp_path / "in"),
                                                ingest_id="dag.ingest"))
    # (Its write tasks read the files once, find the committed bytes unchanged and nothing new.)
    assert (same.events, same.files_ingested, sorted(same.files_skipped)) == (0, [], files)
    assert events(client, scope, "old") == Counter(lines)
    assert state_of(client, IngestSpec(scope=scope, stream="old", source="x", ingest_id="dag.ingest"))["target"] \
        == f"{scope}/old"


def test_stale_after_below_the_safe_bound_is_refused_before_any_write(tmp_path, client, spark, unique_name):
    from airflow_provider_pravega.client.ingest import check_timing
    from airflow_provider_pravega.operators.ingest import PravegaTransactionalIngestOperator

    scope = unique_name("timing")
    write_day(tmp_path / "in", 1)
    with pytest.raises(ValueError, match=r"stale_after_s=1\.5 is below the safe minimum of 2 s"):
        IngestSpec(scope=scope, stream="s", source=str(tmp_path / "in"), create_stream=True, stale_after_s=1.5)
    with pytest.raises(ValueError, match="stale_after_s=0.5 is below the safe minimum"):
        PravegaTransactionalIngestOperator(task_id="i", stream="s", source="x", stale_after_s=0.5)
    with pytest.raises(IngestError, match="lease of 1000 ms is too short"):
        check_timing(60, 1000)
    # The demo's old 5 s against a 30 s lease: heartbeats every 1.25 s, four per stale window.
    assert check_timing(5, 30_000) == 1.25 and check_timing(60, 120_000) == 10
    with PravegaClient(client.controller_uri) as short:
        short.transactions.default_lease_ms = 1000
        with pytest.raises(IngestError, match="too short"):
            run_ingest(short, spark, IngestSpec(scope=scope, stream="s", source=str(tmp_path / "in"),
                                                create_stream=True))
    assert not client.admin.scope_exists(scope)  # nothing written


# ------------------------------------------------------------------------------ driver processes


def ingest_cmd(uri: str, scope: str, source, *extra: str) -> list[str]:
    return [sys.executable, "-m", "airflow_provider_pravega.spark.ingest_job", "--controller-uri", uri,
            "--scope", scope, "--stream", "s", "--source", str(source), "--routing-key-field", "sensor_id",
            "--create-stream", "--segments", "2", "--num-writers", "2", "--ingest-id", "cli", "--master",
            "local[2]", *extra]


def run(cmd: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=300)


def summary(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_killed_after_its_commits_were_acknowledged_and_retried_after_the_retention(tmp_path, client, forgetful,
                                                                                      unique_name):
    scope = unique_name("acked")
    lines = write_day(tmp_path / "in", 1)
    killed = run(ingest_cmd(forgetful.controller_uri, scope, tmp_path / "in"),
                 fault_env(kill_at="after_commit_requested"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    spec = IngestSpec(scope=scope, stream="s", source="x", ingest_id="cli")
    (run_id, run_record), = state_of(client, spec)["runs"].items()
    forget_finished(client, scope, "s", run_record["commit"])
    retried = summary(run(ingest_cmd(forgetful.controller_uri, scope, tmp_path / "in")))
    assert retried["run_id"] is None and retried["finished_runs"] == [run_id] and retried["recovered_runs"] == []
    assert events(client, scope, "s") == Counter(lines)


def test_killed_between_the_acknowledgments_and_their_record_needs_a_decision(tmp_path, client, forgetful,
                                                                                unique_name):
    scope = unique_name("unres")
    lines = write_day(tmp_path / "in", 1)
    # A run's own staleness window bounds how soon another may take it over (the larger of the two
    # counts), so the killed run declares 2 s too: the runs below wait 2 s for it, not 60.
    killed = run(ingest_cmd(forgetful.controller_uri, scope, tmp_path / "in", "--stale-after", "2"),
                 fault_env(kill_at="after_commit_acks"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    spec = IngestSpec(scope=scope, stream="s", source="x", ingest_id="cli")
    (run_id, run_record), = state_of(client, spec)["runs"].items()
    forget_finished(client, scope, "s", run_record["commit"])
    # Nothing can tell committed-then-forgotten from expired-then-forgotten: a clear error.
    refused = run(ingest_cmd(forgetful.controller_uri, scope, tmp_path / "in", "--stale-after", "2"))
    assert refused.returncode == 1
    assert run_id in refused.stderr and "unknown_commits='committed'" in refused.stderr
    assert "d1-0.jsonl" in refused.stderr and "d1-1.jsonl" in refused.stderr
    # The records are there: resolve it so.
    resolved = summary(run(ingest_cmd(forgetful.controller_uri, scope, tmp_path / "in", "--stale-after", "2",
                                      "--unknown-commits", "committed")))
    assert resolved["run_id"] is None and resolved["recovered_runs"] == [run_id]
    assert events(client, scope, "s") == Counter(lines)


def test_a_later_try_takes_over_at_once_and_fences_the_earlier_one(tmp_path, client, forgetful, unique_name):
    """Try 1 has pre-committed everything and hangs before its commit point; try 2 of the same
    task instance (stale_after_s 60) takes the run over without waiting; try 1 then cannot commit."""
    scope = unique_name("takeover")
    lines = write_day(tmp_path / "in", 1)
    ti = ["--task-instance", "dag/ingest/run1/-1", "--stale-after", "60"]
    release = tmp_path / "release-try-1"
    first = subprocess.Popen(ingest_cmd(forgetful.controller_uri, scope, tmp_path / "in", *ti, "--try-number", "1"),
                             # Paused until try 2 is done (however loaded the machine), at most 10 minutes.
                             env=fault_env(delay_at="after_tasks", release=release),
                             stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        spec = IngestSpec(scope=scope, stream="s", source="x", ingest_id="cli")
        deadline = time.monotonic() + 240
        while True:  # until try 1 registered its transactions
            runs = state_of(client, spec)["runs"] if client.admin.stream_exists(*state_location(spec)) else {}
            if runs and len(next(iter(runs.values()))["txns"]) == 2:
                break
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.poll() else ""
            time.sleep(0.5)
        (run_id, _), = runs.items()
        second = run(ingest_cmd(forgetful.controller_uri, scope, tmp_path / "in", *ti, "--try-number", "2"))
        result = summary(second)
        assert result["recovered_runs"] == [run_id] and "waiting for live run" not in second.stderr
        release.touch()
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 1 and "no longer owned by this process" in err
    assert events(client, scope, "s") == Counter(lines)


def test_remember_files_for_bounds_the_state(client, unique_name):
    """The coordinator prunes files committed longer ago than remember_files_for (here through its
    at-least-once path: no transactions, no Spark), and refuses a forgotten file listed again."""
    from airflow_provider_pravega.client.ingest import IngestCoordinator, WriteResult
    from airflow_provider_pravega.client.ingest_errors import ForgottenFileError
    from airflow_provider_pravega.client.ingest_location import open_ingest_state

    scope = unique_name("prune")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "s", 1)
    now = int(time.time() * 1000)
    old = {"/d/old": {"size": 1, "mtime": now - 60_000}}
    new = {"/d/new": {"size": 2, "mtime": now}}
    written: list[list[str]] = []

    def write(run_id, plan):
        written.append(sorted(plan.to_ingest))
        return WriteResult([])

    with open_ingest_state(client, scope, "s", "prune") as store:
        coord = IngestCoordinator(store, client.transactions, scope, "s", remember_files_for_s=0.5)
        coord.run(old, write, transactional=False)
        time.sleep(0.6)
        coord.run(new, write, transactional=False)  # its done prunes /d/old
        state = store.fetch()
        assert set(store.files.lookup(["/d/old", "/d/new"])) == {"/d/new"}  # pruned from the table
        assert state["forgotten_before_ms"] > old["/d/old"]["mtime"]
        with pytest.raises(ForgottenFileError, match="/d/old"):
            coord.run({**old, **new}, write, transactional=False)
        assert written == [["/d/old"], ["/d/new"]]


def test_independent_writes_never_recover_each_other_and_a_dead_one_is_dropped_a_day_later(client, unique_name):
    """Data-source writes without a write_id share one state: a job never takes another's run over
    (a slow live job would be fenced off), and a run whose driver stopped a day ago is dropped, its
    open transactions aborted, so dead runs do not pile up in the state."""
    from airflow_provider_pravega.client.ingest import IngestCoordinator
    from airflow_provider_pravega.client.task_stage import register_txn
    from airflow_provider_pravega.client.ingest_location import open_ingest_state

    scope = unique_name("drop")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "s", 1)
    store = open_ingest_state(client, scope, "s", "spark-write")
    try:
        coord = IngestCoordinator(store, client.transactions, scope, "s", stale_after_s=2, lease_ms=10_000)
        day_ago = int(time.time() * 1000) - 25 * 3600 * 1000
        for run_id, ts in (("r-dead", day_ago), ("r-slow", int(time.time() * 1000) - 60_000)):
            store.update(lambda _s, r=run_id, t=ts: {"op": "start", "run": r, "owner": "gone", "ts": t, "files": {}})
        txn = client.transactions.begin(scope, "s", 10_000)
        register_txn(store, "r-dead", f"{txn.txn_id:032x}")
        mine = coord.start_open_run(wait_for_others_s=None)
        assert set(store.fetch()["runs"]) == {"r-dead", "r-slow", mine}
        assert coord.drop_dead_runs(24 * 3600) == ["r-dead"]
        assert set(store.fetch()["runs"]) == {"r-slow", mine}
        assert client.transactions.status(scope, "s", txn.txn_id) in (TxnStatus.ABORTED, TxnStatus.ABORTING)
    finally:
        store.close()
