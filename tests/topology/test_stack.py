"""The production topology as a test: ``scripts/stack up`` (PostgreSQL, the embedded Pravega server,
Airflow's api-server, scheduler, dag-processor and triggerer on LocalExecutor) in a temporary work
dir, driven through Airflow's REST API like a user would.

A probe DAG's deferrable transaction sensor waits on a transaction the test holds open: it is
observed ``deferred``, the triggerer's process group is SIGKILLed and restarted, and once the test
commits, the restarted triggerer resumes the sensor and its run succeeds.

The example ingest DAG catches up over two days of small sample data; while the first ingest task
runs, the scheduler's whole process group is SIGKILLed (its LocalExecutor workers and the task die
with it) and the scheduler restarted: every run still succeeds. A backfill over the killed day with
``reprocess_behavior=completed`` runs it again and adds nothing: the stream holds every source
record exactly once. ``scripts/stack down`` leaves no process of the stack behind.

Lean on purpose (one stack, two days of 2 x 150 readings); no timed assertions: every wait polls
with a generous deadline and fails with the component logs."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.batch import plan_segment_ranges, read_segment_range
from airflow_provider_pravega.client.streamcut import StreamCut
from airflow_provider_pravega.triggers.transaction import format_txn_id

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "scripts" / "stack.py"
DAG = "pravega_exactly_once_ingest"
SCOPE, STREAM = "iot", "readings"
FILES_PER_DAY, EVENTS_PER_FILE = 2, 150
PROBE = "pravega_topology_probe"
PROBE_SCOPE, PROBE_STREAM = "topology", "probe"
PROBE_DAG = f"""
from datetime import datetime, timezone
from airflow.sdk import DAG
from airflow_provider_pravega.sensors import PravegaTransactionSensor

with DAG(dag_id={PROBE!r}, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc), catchup=False):
    PravegaTransactionSensor(task_id="wait", scope={PROBE_SCOPE!r}, stream={PROBE_STREAM!r},
                             transaction_ids="{{{{ dag_run.conf['txn'] }}}}", deferrable=True, poke_interval=1,
                             timeout=1200)
"""

pytestmark = pytest.mark.timeout(1200)


def _requirements() -> str | None:
    import importlib.util
    for mod in ("asyncpg", "psycopg2"):
        if importlib.util.find_spec(mod) is None:
            return f"needs {mod} (the postgres extra; scripts/bootstrap.sh installs it with the test extra)"
    if os.geteuid() == 0:
        import pwd
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "runs as root and there is no 'postgres' user to run PostgreSQL as (initdb refuses root)"
    if not any(Path(p, "initdb").exists() for p in [*Path("/usr/lib/postgresql").glob("*/bin")]) and not \
            subprocess.run(["sh", "-c", "command -v initdb"], capture_output=True).stdout:
        return "needs PostgreSQL server binaries (apt-get install -y postgresql)"
    return None


def _stack(work: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(STACK), "--work-dir", str(work), *args], capture_output=True,
                          text=True, timeout=timeout)


class Stack:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.state: dict[str, Any] = json.loads((work / "stack.json").read_text())
        self.api = self.state["api_url"]
        password = json.loads((work / "airflow" / "simple_auth_manager_passwords.json").read_text())["admin"]
        self.token = self._call("POST", "/auth/token", {"username": "admin", "password": password},
                                auth=False)["access_token"]

    def reload(self) -> None:
        self.state = json.loads((self.work / "stack.json").read_text())

    def _call(self, method: str, path: str, body: Any = None, *, auth: bool = True) -> Any:
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(5):  # a loaded machine: the api-server may answer slowly, not wrongly
            req = urllib.request.Request(self.api + path, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    return json.load(resp)
            except urllib.error.HTTPError as exc:
                raise AssertionError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:1000]!r}") from None
            except OSError:
                if attempt == 4:
                    raise
                time.sleep(2)
        raise AssertionError("unreachable")

    def get(self, path: str) -> Any:
        return self._call("GET", path)

    def runs(self, dag: str = DAG) -> list[dict[str, Any]]:
        return self.get(f"/api/v2/dags/{dag}/dagRuns?limit=100")["dag_runs"]

    def task_instances(self, run_id: str, dag: str = DAG) -> list[dict[str, Any]]:
        return self.get(f"/api/v2/dags/{dag}/dagRuns/{urllib.request.quote(run_id, safe='')}/taskInstances")[
            "task_instances"]

    def kill_and_restart(self, component: str) -> None:
        """kill -9 of the component's whole process group, then ``scripts/stack restart``."""
        pgid = self.state["components"][component]["pgid"]
        os.killpg(pgid, signal.SIGKILL)
        self.wait(f"the killed {component}'s process group to be gone", lambda: not _group_alive(pgid), 120)
        restarted = _stack(self.work, "restart", component)
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        self.reload()

    def logs(self) -> str:
        parts = []
        for name in ("scheduler", "triggerer", "dag-processor", "api-server"):
            try:
                parts.append(f"--- {name}\n" + (self.work / "logs" / f"{name}.log").read_text(errors="replace")[-3000:])
            except OSError:
                pass
        for path in sorted((self.work / "airflow" / "logs").rglob("*ingest*/*.log"))[-3:]:
            parts.append(f"--- {path}\n" + path.read_text(errors="replace")[-3000:])
        return "\n".join(parts)

    on_poll: Callable[[], None] = staticmethod(lambda: None)  # type: ignore[assignment]

    def wait(self, what: str, done: Callable[[], Any], timeout_s: float = 900, poll_s: float = 3) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            self.on_poll()
            result = done()
            if result:
                return result
            if time.monotonic() > deadline:
                pytest.fail(f"waited {timeout_s:.0f} s for {what}; runs: "
                            f"{[(r['logical_date'], r['state']) for r in self.runs()]}\n{self.logs()}")
            time.sleep(poll_s)


def _day_runs(stack: Stack, days: list[str]) -> dict[str, dict[str, Any]]:
    """The latest run of each day (by start)."""
    runs: dict[str, dict[str, Any]] = {}
    for r in sorted(stack.runs(), key=lambda r: r.get("start_date") or ""):
        if r["logical_date"] and r["logical_date"][:10] in days:
            runs[r["logical_date"][:10]] = r
    return runs


def _all_succeeded(stack: Stack, days: list[str]) -> bool:
    runs = _day_runs(stack, days)
    failed = [d for d, r in runs.items() if r["state"] == "failed"]
    if failed:
        pytest.fail(f"runs failed for {failed}:\n{stack.logs()}")
    return len(runs) == len(days) and all(r["state"] == "success" for r in runs.values())


def _stack_processes(stack_id: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if f"PRAVEGA_STACK_ID={stack_id}".encode() in env and state != "Z":
                found.append(int(entry.name))
    return found


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


@pytest.fixture
def stack_work(tmp_path: Path) -> Iterator[tuple[Path, list[str]]]:
    reason = _requirements()
    if reason:
        pytest.skip(reason)
    global T0
    T0 = time.monotonic()
    work = tmp_path / "stack"
    dags = tmp_path / "dags"  # the example DAGs and the probe
    shutil.copytree(REPO / "dags", dags, ignore=shutil.ignore_patterns("__pycache__"))
    (dags / f"{PROBE}.py").write_text(PROBE_DAG)
    today = dt.datetime.now(dt.timezone.utc).date()
    start = today - dt.timedelta(days=2)
    days = [start.isoformat(), (start + dt.timedelta(days=1)).isoformat()]
    up = _stack(work, "up", "--examples-start", start.isoformat(), "--sample-days", "2",
                "--files-per-day", str(FILES_PER_DAY), "--events-per-file", str(EVENTS_PER_FILE),
                "--parallelism", "2", "--timeout", "600", "--dags", str(dags),
                # A retry recovers a crashed ingest run quickly (its driver silent for 5 s: dead).
                "--env", "PRAVEGA_EXAMPLES_STALE_AFTER_S=5",
                # Notice the killed scheduler's task soon instead of after the 5-minute defaults.
                "--env", "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL=15",
                "--env", "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT=60",
                "--env", "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD=30")
    try:
        assert up.returncode == 0, f"scripts/stack up failed:\n{up.stdout[-3000:]}\n{up.stderr[-5000:]}"
        assert "login: admin / " in up.stdout and "/api/v2/monitor/health" in up.stdout, up.stdout
        yield work, days
    finally:
        phase("stack down")
        down = _stack(work, "down", timeout=300)
        print(down.stdout, flush=True)
        phase("stack stopped")
        state = json.loads((work / "stack.json").read_text()) if (work / "stack.json").exists() else None
        if state is not None:  # whatever the test did: nothing of the stack survives `down`
            groups = [n for n, c in state["components"].items() if _group_alive(c["pgid"])]
            left = _stack_processes(state["id"])
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            assert down.returncode == 0 and not groups and not left, (down.stdout, down.stderr, groups, left)
        _stack(work, "down", "--purge", timeout=300)


T0 = time.monotonic()


def phase(what: str) -> None:
    print(f"[topology {time.monotonic() - T0:6.1f} s] {what}", flush=True)


def test_stack_catchup_scheduler_kill_backfill_exactly_once(stack_work: tuple[Path, list[str]]) -> None:
    work, days = stack_work
    phase("stack up")
    stack = Stack(work)
    status = _stack(work, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    for name in ("postgres", "pravega", "api-server", "scheduler", "dag-processor", "triggerer"):
        assert any(line.startswith(name) and " up " in line for line in status.stdout.splitlines()), status.stdout

    stack.wait("the dag-processor to register the ingest and probe DAGs",
               lambda: {DAG, PROBE} <= {d["dag_id"] for d in stack.get("/api/v2/dags")["dags"]})
    client = PravegaClient(stack.state["controller_uri"])
    try:
        client.admin.create_scope(PROBE_SCOPE)
        client.admin.create_stream(PROBE_SCOPE, PROBE_STREAM, 1)
        txn = client.transactions.begin(PROBE_SCOPE, PROBE_STREAM, lease_ms=60_000).txn_id
        stack.on_poll = lambda: client.transactions.ping(PROBE_SCOPE, PROBE_STREAM, txn, 60_000)
        probe_run = stack._call("POST", f"/api/v2/dags/{PROBE}/dagRuns",
                                {"logical_date": None, "conf": {"txn": format_txn_id(txn)}})["dag_run_id"]
        stack._call("PATCH", f"/api/v2/dags/{PROBE}", {"is_paused": False})
        stack._call("PATCH", f"/api/v2/dags/{DAG}", {"is_paused": False})

        def ingest_running() -> bool:
            runs = _day_runs(stack, days)
            if days[0] not in runs:
                return False
            tis = {t["task_id"]: t for t in stack.task_instances(runs[days[0]]["dag_run_id"])}
            if (tis.get("ingest") or {}).get("state") == "success":
                pytest.fail("the first ingest finished before the scheduler could be killed during it")
            return (tis.get("ingest") or {}).get("state") == "running"

        stack.wait(f"the ingest task of {days[0]} to run", ingest_running, poll_s=1)
        phase("first ingest running: killing the scheduler's process group")
        # kill -9 of the scheduler's process group: the scheduler, its LocalExecutor workers, the task.
        stack.kill_and_restart("scheduler")

        def probe_state() -> str:
            return stack.task_instances(probe_run, PROBE)[0]["state"] or ""

        stack.wait("the probe's sensor to be deferred", lambda: probe_state() == "deferred")
        phase("probe sensor deferred: killing the triggerer's process group")
        stack.kill_and_restart("triggerer")
        assert probe_state() == "deferred"
        stack.on_poll = lambda: None
        client.transactions.commit(PROBE_SCOPE, PROBE_STREAM, txn)
        stack.wait("the restarted triggerer to resume the probe's sensor and its run to succeed",
                   lambda: stack.get(f"/api/v2/dags/{PROBE}/dagRuns/{urllib.request.quote(probe_run, safe='')}")[
                       "state"] == "success")
        phase("probe resumed after the triggerer restart")
    finally:
        client.close()

    stack.wait(f"the catchup runs of {days} to succeed", lambda: _all_succeeded(stack, days))
    first = _day_runs(stack, days)
    tries = {t["task_id"]: t["try_number"] for t in stack.task_instances(first[days[0]]["dag_run_id"])}
    assert tries["ingest"] >= 2, tries  # the killed try died with the scheduler group; another one ran

    phase("catchup runs succeeded")
    # One day only (the killed one) keeps the test lean: a backfill over a range is the same per day.
    backfill = stack._call("POST", "/api/v2/backfills", {
        "dag_id": DAG, "from_date": f"{days[0]}T00:00:00Z", "to_date": f"{days[0]}T00:00:00Z",
        "reprocess_behavior": "completed", "max_active_runs": 1})
    stack.wait("the backfill to complete",
               lambda: stack.get(f"/api/v2/backfills/{backfill['id']}").get("completed_at"))
    phase("backfill completed")
    rerun = _day_runs(stack, days)
    assert all(r["state"] == "success" for r in rerun.values()), rerun
    # The backfill ran the day again (reprocess_behavior=completed): a newer run than the catchup's.
    assert (rerun[days[0]]["end_date"] or "") > (first[days[0]]["end_date"] or ""), (first, rerun)

    source = [line for day in days
              for path in sorted((work / "data" / "incoming" / day).glob("*.jsonl"))
              for line in path.read_text().splitlines()]
    assert len(source) == len(days) * FILES_PER_DAY * EVENTS_PER_FILE
    with PravegaClient(stack.state["controller_uri"]) as client:
        head, tail = StreamCut.head(client, SCOPE, STREAM), StreamCut.tail(client, SCOPE, STREAM)
        events = [event.payload.decode() for rng in plan_segment_ranges(client, head, tail)
                  for event in read_segment_range(client, rng)]
    assert Counter(events) == Counter(source)  # every record exactly once: kill, retry and backfill included
    phase(f"{len(events)} events read back, each source record exactly once")
