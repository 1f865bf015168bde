"""A later try resumes the run of a killed (or still running) earlier try by the run's identity
(client/ingest_resume.py, what the operator keeps in Airflow's task state store): without Spark when
every write was recorded or every commit acknowledged, fencing the earlier try; otherwise it
declines and changes nothing (the try then runs the ingest afresh). The earlier try is the ingest
job's own process (``python -m airflow_provider_pravega.spark.ingest_job``), paused or killed at a
protocol step by its fault-injection hooks."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import pytest

from airflow_provider_pravega.client.controller_types import TxnStatus
from airflow_provider_pravega.client.ingest import IngestCoordinator
from airflow_provider_pravega.client.ingest_location import open_ingest_state, open_state_store
from airflow_provider_pravega.client.ingest_plan import file_identity
from airflow_provider_pravega.client.ingest_state import COMMITTING, REQUESTED, WRITING
from airflow_provider_pravega.client.ingest_resume import (
    RESUMABLE,
    WRITTEN,
    record_written,
    resume_status,
    run_identity,
    written_holds,
)
from airflow_provider_pravega.client.task_stage import register_txn
from airflow_provider_pravega.spark.ingest_job import resume_ingest, resume_status_of, state_location
from airflow_provider_pravega.spark.ingest_spec import IngestSpec
from pravega_testing.faults import fault_env

TI = "dag/ingest/run1/-1"


def write_files(directory, files: int = 2, per_file: int = 60) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(files):
        rows = [json.dumps({"sensor_id": f"s{n % 5}", "f": i, "n": n}) for n in range(per_file)]
        (directory / f"part-{i}.jsonl").write_text("\n".join(rows) + "\n")
        lines += rows
    return lines


def ingest_cmd(uri: str, scope: str, source, *extra: str) -> list[str]:
    return [sys.executable, "-m", "airflow_provider_pravega.spark.ingest_job", "--controller-uri", uri,
            "--scope", scope, "--stream", "s", "--source", str(source), "--routing-key-field", "sensor_id",
            "--create-stream", "--segments", "2", "--num-writers", "2", "--ingest-id", "cli", "--master", "local[2]",
            "--task-instance", TI, "--try-number", "1", "--stale-after", "60", *extra]


def spec_of(scope: str, try_number: int = 2, **kw: Any) -> IngestSpec:
    """The later try's spec (what the operator builds; the source is not read when resuming)."""
    return IngestSpec(**{"scope": scope, "stream": "s", "source": "unused", "routing_key_field": "sensor_id",
                         "ingest_id": "cli", "stale_after_s": 60, "task_instance": TI, "try_number": try_number, **kw})


def the_run(client: Any, spec: IngestSpec) -> tuple[str, dict]:
    with open_state_store(client, *state_location(spec), create=False) as store:
        (run_id, run), = store.fetch()["runs"].items()
    return run_id, run


def identity_of(spec: IngestSpec, run_id: str, owner: str) -> dict[str, str]:
    return run_identity(scope=spec.scope, stream="s", ingest_id="cli", state_scope=state_location(spec)[0],
                        state_stream=state_location(spec)[1], run_id=run_id, owner=owner)


def events(client: Any, scope: str) -> Counter:
    from airflow_provider_pravega.client.batch import plan_segment_ranges, read_segment_ranges
    from airflow_provider_pravega.client.streamcut import StreamCut

    ranges = plan_segment_ranges(client, StreamCut.head(client, scope, "s"), StreamCut.tail(client, scope, "s"))
    return Counter(e.payload.decode() for e in read_segment_ranges(client, ranges))


def test_a_later_try_commits_the_recorded_writes_without_spark_and_fences_the_earlier(tmp_path, client,
                                                                                      unique_name):
    """Try 1 wrote and flushed everything and hangs before its commit point (alive: its driver
    still heartbeats); try 2 resumes its run from the identity alone and commits it; try 1, once
    released, is fenced and commits nothing."""
    scope = unique_name("resume")
    lines = write_files(tmp_path / "in")
    release = tmp_path / "release-try-1"
    first = subprocess.Popen(ingest_cmd(client.controller_uri, scope, tmp_path / "in"),
                             # Paused until try 2 is done (however loaded the machine), at most 10 minutes.
                             env=fault_env(delay_at="after_tasks", release=release),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        spec = spec_of(scope)
        deadline = time.monotonic() + 240
        while True:  # until try 1's write tasks recorded what they wrote
            runs = _runs(client, spec) if client.admin.stream_exists(*state_location(spec)) else {}
            if len(runs) == 1 and written_holds(next(iter(runs.values()))) is not None:
                break
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.poll() else ""
            time.sleep(0.5)
        run_id, run = the_run(client, spec)
        identity = identity_of(spec, run_id, run["owner"])
        assert resume_status_of(client, spec, identity) == WRITTEN
        # Another ingest, or one that moved, is not this run's later try.
        assert resume_status_of(client, spec_of(scope, ingest_id="other"), identity) == "MOVED"
        result = resume_ingest(client, spec, identity)  # no Spark session anywhere in this process
        assert result is not None and result.resumed and result.run_id == run_id
        assert result.events == len(lines) and sorted(result.files_ingested) == sorted(run["files"])
        assert {t["status"] for t in result.transactions} == {"COMMITTED"} and len(result.transactions) == 2
        assert resume_status_of(client, spec, identity) == "GONE"  # recorded done
        release.touch()
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 1 and "no longer owned by this process" in err, err[-2000:]
    assert events(client, scope) == Counter(lines)


def _runs(client: Any, spec: IngestSpec) -> dict:
    with open_state_store(client, *state_location(spec), create=False) as store:
        return store.fetch()["runs"]


def test_a_killed_try_whose_commits_were_acknowledged_is_finished(tmp_path, client, unique_name):
    scope = unique_name("acked")
    lines = write_files(tmp_path / "in")
    killed = subprocess.run(ingest_cmd(client.controller_uri, scope, tmp_path / "in"),
                            env=fault_env(kill_at="after_commit_requested"), capture_output=True, text=True,
                            timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    spec = spec_of(scope)
    run_id, run = the_run(client, spec)
    assert run["phase"] == REQUESTED
    result = resume_ingest(client, spec, identity_of(spec, run_id, run["owner"]))
    assert result is not None and result.resumed and result.events == len(lines)
    assert {t["status"] for t in result.transactions} == {"COMMITTED"}
    assert _runs(client, spec) == {}  # recorded done
    assert events(client, scope) == Counter(lines)


def test_a_run_that_cannot_be_resumed_is_left_alone(client, tmp_path, unique_name):
    """A run recorded but not (fully) written: resuming declines and changes nothing; the try
    then runs the ingest afresh (which rolls the run back at once: test_ingest_protocol)."""
    scope = unique_name("declined")
    spec = spec_of(scope)
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "s", 1)
    with open_ingest_state(client, scope, "s", "cli") as store:
        try1 = IngestCoordinator(store, client.transactions, scope, "s", stale_after_s=60, task_instance=TI,
                                 try_number=1)
        run_id, _ = try1.start_run({"/in/a.jsonl": file_identity(10, 1), "/in/b.jsonl": file_identity(10, 1)})
        txn = f"{client.transactions.begin(scope, 's').txn_id:032x}"
        register_txn(store, run_id, txn, try1.owner)
        record_written(store, run_id, txn, ["/in/a.jsonl"], 3, 30, try1.owner)  # b.jsonl was never written
    identity = identity_of(spec, run_id, try1.owner)
    before = _runs(client, spec)
    assert resume_status_of(client, spec, identity) == WRITING
    assert resume_ingest(client, spec, identity) is None
    assert _runs(client, spec) == before  # not taken over, nothing aborted
    assert client.transactions.status(scope, "s", int(txn, 16)) == TxnStatus.OPEN
    # A stranger's value under the key, or an identity of a state that does not exist, is no run.
    assert resume_status_of(client, spec, {"run": run_id}) == "MOVED"
    assert resume_status_of(client, spec, {**identity, "state_stream": "ingest-state-missing"}) == "GONE"
    assert resume_status_of(client, spec, {**identity, "state_scope": "no-such-scope"}) == "GONE"
    client.transactions.abort(scope, "s", int(txn, 16))


def _run(files: list[str], txns: list[str], written: dict[str, list[str]], phase: str = WRITING,
         owner: str = "o1") -> dict:
    from airflow_provider_pravega.client.ingest_state import encode_holds

    return {"phase": phase, "owner": owner, "files": {f: {} for f in files}, "txns": txns, "commit": [],
            "written": {t: {"holds": encode_holds({t: u}, files)[t], "events": 1, "bytes": 1}
                        for t, u in written.items()}}


@pytest.mark.parametrize("txns,written,holds", [
    (["t1", "t2"], {"t1": ["a", "b"], "t2": ["c"]}, {"t1": ["a", "b"], "t2": ["c"]}),
    # t3 is a second attempt of t1's Spark task: the same files; the first registered is kept
    (["t1", "t2", "t3"], {"t3": ["a", "b"], "t1": ["a", "b"], "t2": ["c"]}, {"t1": ["a", "b"], "t2": ["c"]}),
    (["t1", "t2"], {"t1": ["a", "b"]}, None),  # c not written yet
    (["t1", "t2"], {"t1": ["a", "b"], "t2": ["b", "c"]}, None),  # b in two different partitions
    (["t1"], {}, None),
])
def test_written_holds_cover_the_files_once(txns, written, holds):
    assert written_holds(_run(["a", "b", "c"], txns, written)) == holds


def test_resume_status_follows_the_run():
    files = ["a", "b"]
    ident = {"scope": "sc", "stream": "s", "ingest_id": "i", "state_scope": "sc", "state_stream": "st", "run": "r",
             "owner": "o1"}

    def status(run: dict | None, **where: str) -> str:
        return resume_status({"runs": {"r": run} if run else {}}, ident,
                             **{"scope": "sc", "stream": "s", "ingest_id": "i", **where})

    whole = _run(files, ["t1"], {"t1": files})
    assert status(whole) == WRITTEN and WRITTEN in RESUMABLE
    assert status(_run(files, ["t1"], {})) == WRITING
    assert status({**whole, "owner": "o2"}) == "TAKEN"  # another copy recovered it meanwhile
    assert status({**whole, "phase": COMMITTING}) == COMMITTING
    assert status({**whole, "phase": REQUESTED, "owner": "o2"}) == REQUESTED  # anyone may finish it
    assert status(None) == "GONE"
    assert status(whole, stream="other") == "MOVED"
