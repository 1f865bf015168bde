"""The production topology as a test: ``scripts/stack up`` (PostgreSQL, the embedded Pravega server,
Airflow's api-server, scheduler, dag-processor and triggerer on LocalExecutor) in a temporary work
dir, driven like a user would: the REST API, the ``airflow`` CLI (``. env.sh``) and the UI.

In one stack, in this order:

* the event-driven DAG is unpaused before its stream exists; it must start cleanly once the ingest
  creates the stream and export what was written;
* a probe DAG's deferrable transaction sensor waits on a transaction the test holds open: it is
  observed ``deferred``, the triggerer's process group is SIGKILLed and restarted, and once the test
  commits, the restarted triggerer resumes the sensor and its run succeeds;
* the example ingest DAG catches up over two days of small sample data; while the first ingest task
  runs, the scheduler's whole process group is SIGKILLed (its LocalExecutor workers and the task die
  with it) and restarted; during the second day's ingest, only the task's own process (the pid
  Airflow records for the running try) is SIGKILLed while its transactions are open (the ingest
  pauses there: ``pravega_testing.faults.fault_env``): the retry resumes the killed try's run from the
  identity the try kept in Airflow's task state store (durable execution: no Spark, nothing
  written again) and succeeds; the time from the kill to the retry's success is printed
  (docs/benchmarks.md), never asserted;
* backfills through ``airflow backfill create`` (the CLI, with the stack's environment):
  ``--reprocess-behavior failed`` reruns only the day whose ingest run failed (marked so through
  the REST API), while the daily export DAG catches up (each day's folder holds its records, see
  ``_check_exports``); ``completed`` reruns done days: the ingest adds nothing, the export rewrites
  each day byte for byte (see ``_hashes``); ``none`` then runs nothing again;
* the stream holds every source record exactly once, and the event-driven DAG's exports too;
* task logs are readable: no py4j ``RecursionError`` or connection chatter, Spark's INFO/WARN lines
  not at error level, also in the killed attempt's log;
* the UI in headless Chromium (``tests/ui``'s helpers): login, the grid shows every run green, the
  Pravega connection's Test button succeeds (without Chromium this last part is skipped, saying so);
* the ingest tasks run their Spark jobs on the stack's stock Spark Connect server (their log shows
  the ``sc://`` session), which ``status`` lists;
* ``scripts/stack down`` leaves no process of the stack behind (the Spark Connect server included).

Lean on purpose (one stack, two days of 2 x 150 readings); no timed assertions: every wait polls
with a generous deadline and fails with the component logs."""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.util
import json
import os
import re
import shlex
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
from export_files import stable_name

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.batch import plan_segment_ranges, read_segment_range
from airflow_provider_pravega.client.streamcut import StreamCut
from pravega_testing.faults import fault_env
from pravega_testing.wait import WaitTimeout, wait_until
from airflow_provider_pravega.triggers.transaction import format_txn_id

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "scripts" / "stack.py"
DAG = "pravega_exactly_once_ingest"
EXPORT_DAG = "pravega_stream_cut_export"
EVENT_DAG = "pravega_on_new_readings"
SCOPE, STREAM = "iot", "readings"
FILES_PER_DAY, EVENTS_PER_FILE = 2, 150
# Every ingest that writes pauses this long with its transactions open (after its Spark tasks
# wrote, before its commit point): the window in which the test kills a task mid-write.
PAUSE_MID_WRITE_S = 8
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
UI_CONN = "pravega_ui"

pytestmark = pytest.mark.timeout(1500)


def _requirements() -> str | None:
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


def _ui_helpers() -> Any:
    """tests/ui/conftest.py as a module (its Chromium flags, page and login helpers)."""
    spec = importlib.util.spec_from_file_location("pravega_ui_helpers", REPO / "tests" / "ui" / "conftest.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]  # its dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _stack(work: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """``scripts/stack ARGS``; the components it starts or restarts inherit the test harness's
    pause of the ingest after its write tasks (see _kill_task_mid_write)."""
    return subprocess.run([sys.executable, str(STACK), "--work-dir", str(work), *args], capture_output=True,
                          text=True, timeout=timeout, env=fault_env(delay_at="after_tasks", delay_s=PAUSE_MID_WRITE_S))


def _quote(run_id: str) -> str:
    return urllib.request.quote(run_id, safe="")


class Stack:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.state: dict[str, Any] = json.loads((work / "stack.json").read_text())
        self.api = self.state["api_url"]
        self.password = json.loads((work / "airflow" / "simple_auth_manager_passwords.json").read_text())["admin"]
        self.token = self._call("POST", "/auth/token", {"username": "admin", "password": self.password},
                                auth=False)["access_token"]
        self.data = work / "data"
        self.task_logs = work / "airflow" / "logs"

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
        return self.get(f"/api/v2/dags/{dag}/dagRuns/{_quote(run_id)}/taskInstances")["task_instances"]

    def airflow_command(self, *args: str) -> list[str]:
        """``airflow ARGS`` as a user runs it against the stack: ``. env.sh && airflow …``."""
        return ["bash", "-c", f". {shlex.quote(str(self.work / 'env.sh'))} && exec {shlex.quote(sys.executable)} "
                f"-m airflow {' '.join(map(shlex.quote, args))}"]

    def airflow_cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(self.airflow_command(*args), capture_output=True, text=True, timeout=timeout,
                              cwd=self.work)

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
        for path in sorted(self.task_logs.rglob("dag_id=*/**/*.log"), key=lambda p: p.stat().st_mtime)[-3:]:
            parts.append(f"--- {path}\n" + path.read_text(errors="replace")[-3000:])
        return "\n".join(parts)

    on_poll: Callable[[], None] = staticmethod(lambda: None)  # type: ignore[assignment]

    def wait(self, what: str, done: Callable[[], Any], timeout_s: float = 900, poll_s: float = 3) -> Any:
        """:func:`wait_until`, failing the test with the runs and the logs."""
        try:
            return wait_until(what, done, timeout_s, poll_s=poll_s, on_poll=self.on_poll)
        except WaitTimeout as exc:
            pytest.fail(f"{exc}; runs: {[(r['logical_date'], r['state']) for r in self.runs()]}\n{self.logs()}")


def _day_runs(stack: Stack, days: list[str], dag: str = DAG) -> dict[str, dict[str, Any]]:
    """The latest run of each day (by start)."""
    runs: dict[str, dict[str, Any]] = {}
    for r in sorted(stack.runs(dag), key=lambda r: r.get("start_date") or ""):
        if r["logical_date"] and r["logical_date"][:10] in days:
            runs[r["logical_date"][:10]] = r
    return runs


def _all_succeeded(stack: Stack, days: list[str], dag: str = DAG) -> bool:
    runs = _day_runs(stack, days, dag)
    failed = [d for d, r in runs.items() if r["state"] == "failed"]
    if failed:
        pytest.fail(f"{dag} runs failed for {failed}:\n{stack.logs()}")
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


def _pid_alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _parent_pid(pid: int) -> int:
    return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])


def _attempt_log(stack: Stack, run_id: str, task: str, attempt: int, dag: str = DAG) -> Path:
    return stack.task_logs / f"dag_id={dag}" / f"run_id={run_id}" / f"task_id={task}" / f"attempt={attempt}.log"


def _canonical(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True)


def _source_records(data: Path, days: list[str]) -> list[str]:
    return [_canonical(json.loads(line)) for day in days for path in sorted((data / "incoming" / day).glob("*.jsonl"))
            for line in path.read_text().splitlines()]


def _exported_records(folder: Path) -> list[str]:
    """The records of one export folder (Parquet with the JSON fields as columns, or JSON lines of
    ``{"event": text}``; both with each event's position), as canonical JSON."""
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith((".", "_")):
            continue
        if ".parquet" in path.name:
            rows += pq.read_table(path).to_pylist()
        elif ".json" in path.name:
            rows += [json.loads(line) for line in path.read_text().splitlines()]
    out = []
    for row in rows:
        record = {k: v for k, v in row.items() if k not in ("segment_id", "offset")}
        out.append(_canonical(json.loads(record["event"]) if set(record) == {"event"} else record))
    return out


def _hashes(folder: Path) -> dict[str, str]:
    """Each file's SHA-256; of a Parquet file, its bytes before the footer (every data page) and its
    footer's data (schema, row groups, statistics; parquet-java may list a column's encodings in
    another order in another Spark application, nothing else of the file may differ). Hadoop's
    hidden ``.*.crc`` checksums of the files are left out; files by their names without Spark's
    per-write UUID."""
    import pyarrow.parquet as pq

    out = {}
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or path.name.startswith("."):
            continue
        data = path.read_bytes()
        if data[:4] == data[-4:] == b"PAR1":
            footer = int.from_bytes(data[-8:-4], "little")
            meta = pq.ParquetFile(path).metadata.to_dict()
            for group in meta["row_groups"]:
                for column in group["columns"]:
                    column["encodings"] = sorted(column["encodings"])
            data = data[:-8 - footer] + json.dumps(meta, sort_keys=True, default=str).encode()
        out[stable_name(path.relative_to(folder).as_posix())] = hashlib.sha256(data).hexdigest()
    return out


def _stream_events(stack: Stack) -> list[str]:
    with PravegaClient(stack.state["controller_uri"]) as client:
        head, tail = StreamCut.head(client, SCOPE, STREAM), StreamCut.tail(client, SCOPE, STREAM)
        return [_canonical(json.loads(event.payload)) for rng in plan_segment_ranges(client, head, tail)
                for event in read_segment_range(client, rng)]


def _is_green(css_color: str) -> bool:
    """A CSS colour the UI paints success with: oklch with a green hue, or rgb with green on top."""
    m = re.match(r"oklch\(\s*[\d.]+%?\s+[\d.]+\s+([\d.]+)", css_color)
    if m:
        return 120 <= float(m.group(1)) <= 165
    m = re.match(r"rgba?\((\d+),\s*(\d+),\s*(\d+)", css_color)
    return bool(m) and int(m.group(2)) > max(int(m.group(1)), int(m.group(3)))


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


def test_stack_kills_backfills_exports_ui_exactly_once(stack_work: tuple[Path, list[str]]) -> None:
    work, days = stack_work
    phase("stack up")
    stack = Stack(work)
    status = _stack(work, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    for name in ("postgres", "pravega", "spark-connect", "api-server", "scheduler", "dag-processor", "triggerer"):
        assert any(line.startswith(name) and " up " in line for line in status.stdout.splitlines()), status.stdout

    stack.wait("the dag-processor to register the example and probe DAGs",
               lambda: {DAG, EXPORT_DAG, EVENT_DAG, PROBE} <= {d["dag_id"] for d in stack.get("/api/v2/dags")["dags"]})
    # The event-driven DAG first, before anything created its stream.
    stack._call("PATCH", f"/api/v2/dags/{EVENT_DAG}", {"is_paused": False})
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
                   lambda: stack.get(f"/api/v2/dags/{PROBE}/dagRuns/{_quote(probe_run)}")["state"] == "success")
        phase("probe resumed after the triggerer restart")
    finally:
        client.close()

    # ---- kill -9 of the second day's ingest task alone, while its transactions are open
    killed_run = _kill_task_mid_write(stack, days[1])
    stack.wait(f"the catchup runs of {days} to succeed", lambda: _all_succeeded(stack, days))
    first = _day_runs(stack, days)
    tries = {t["task_id"]: t["try_number"] for t in stack.task_instances(first[days[0]]["dag_run_id"])}
    assert tries["ingest"] >= 2, tries  # the killed try died with the scheduler group; another one ran
    retry_log = _attempt_log(stack, killed_run, "ingest", 2).read_text(errors="replace")
    # The retry read the killed try's run from the task state store and committed what its write
    # tasks had flushed, without Spark and without writing anything again.
    assert "Reconnecting to existing job" in retry_log and "resuming ingest run" in retry_log, retry_log[-3000:]
    assert "starting Spark" not in retry_log and "died while writing" not in retry_log, retry_log[-3000:]
    # The ingest ran its Spark jobs on the stack's stock Spark Connect server (no JVM in the task).
    killed_try = _attempt_log(stack, killed_run, "ingest", 1).read_text(errors="replace")
    assert f"connecting to Spark Connect server {stack.state['spark_connect_url']}" in killed_try, killed_try[-3000:]
    assert "starting Spark with master" not in killed_try, killed_try[-3000:]
    source = _source_records(stack.data, days)
    assert len(source) == len(days) * FILES_PER_DAY * EVENTS_PER_FILE
    assert Counter(_stream_events(stack)) == Counter(source)  # every record once: both kills included
    phase("catchup runs succeeded; every record once in the stream")

    # ---- the daily export DAG catches up over the ingested days, while a backfill reruns the day
    # whose ingest run failed
    export_days = sorted({r["logical_date"][:10] for r in stack.runs(DAG) if r["logical_date"]})
    stack._call("PATCH", f"/api/v2/dags/{EXPORT_DAG}", {"is_paused": False})
    _backfill_failed(stack, days)
    stack.wait(f"the export runs of {export_days} to succeed", lambda: _all_succeeded(stack, export_days, EXPORT_DAG))
    _check_exports(stack, days, export_days, source)
    phase("export runs succeeded; their folders hold the ingested records")
    _backfill_completed_and_none(stack, days)

    assert Counter(_stream_events(stack)) == Counter(source)  # backfills added nothing
    phase("every source record exactly once in the stream after the backfills")

    # ---- the event-driven DAG: announced the data (also what was written before its stream
    # existed) and exported it, each record once over its runs.
    def event_exports() -> list[str]:
        return [rec for folder in sorted((stack.data / "export" / "on-new-readings").glob("*"))
                for rec in _exported_records(folder)]

    stack.wait("the event-driven DAG to export every ingested record",
               lambda: sorted(event_exports()) == sorted(source) or (Counter(event_exports()) - Counter(source)
                                                                     and pytest.fail("duplicates/unknown records")))
    event_runs = stack.runs(EVENT_DAG)
    assert any(r["state"] == "success" for r in event_runs), event_runs
    assert not [r for r in event_runs if r["state"] == "failed"], event_runs
    phase(f"event-driven DAG: {len(event_runs)} run(s), every record exported once")

    _check_task_logs(stack, killed_run)
    phase("task logs clean")
    _check_ui(stack, days)
    phase("UI checked")


def _kill_task_mid_write(stack: Stack, day: str) -> str:
    """SIGKILL the process of the running first try of ``day``'s ingest (the pid Airflow records
    for it, not its supervisor nor the scheduler) while its transactions are open. Returns the run id."""

    def paused_mid_write() -> tuple[str, dict[str, Any]] | None:
        run = _day_runs(stack, [day]).get(day)
        if run is None:
            return None
        ti = {t["task_id"]: t for t in stack.task_instances(run["dag_run_id"])}.get("ingest")
        if ti is None or not ti.get("try_number"):
            return None
        if ti["try_number"] > 1 or ti["state"] == "success":
            pytest.fail(f"the first try of {day}'s ingest ended before it could be killed: {ti}")
        log = _attempt_log(stack, run["dag_run_id"], "ingest", 1)
        paused = log.exists() and "fault injection: pausing" in log.read_text(errors="replace")
        return (run["dag_run_id"], ti) if paused and ti["state"] == "running" and ti.get("pid") else None

    run_id, ti = stack.wait(f"{day}'s ingest to pause with its transactions open", paused_mid_write, poll_s=1)
    pid = ti["pid"]
    supervisor = _parent_pid(pid)
    scheduler_pgid = stack.state["components"]["scheduler"]["pgid"]
    assert pid != scheduler_pgid and supervisor != scheduler_pgid, (pid, supervisor, scheduler_pgid)
    phase(f"{day}'s ingest paused mid-write: kill -9 of its task process {pid} (supervisor {supervisor})")
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    stack.wait(f"task process {pid} to be gone", lambda: not _pid_alive(pid), 60, poll_s=0.5)
    assert _group_alive(scheduler_pgid)  # the task alone died
    ti_path = f"/api/v2/dags/{DAG}/dagRuns/{_quote(run_id)}/taskInstances/ingest"

    def retried() -> bool:
        now = stack.get(ti_path)
        if now["state"] == "failed":
            pytest.fail(f"{day}'s ingest failed after its task was killed: {now}\n{stack.logs()}")
        return now["try_number"] >= 2 and now["state"] == "success"

    stack.wait(f"a retry of {day}'s ingest to succeed", retried, poll_s=0.5)
    # The figure docs/benchmarks.md quotes (printed, never asserted: the machine's load decides it).
    tries = {t["try_number"]: t for t in stack.get(ti_path + "/tries")["task_instances"]}
    phase(f"kill -> retry success: {time.monotonic() - killed_at:.1f} s (try 1 ended {tries[1]['end_date']}, "
          f"try 2 ran {tries[2]['start_date']} .. {tries[2]['end_date']})")
    return run_id


def _check_exports(stack: Stack, days: list[str], export_days: list[str], source: list[str]) -> None:
    """The folders together hold every record once, and each day's folder exactly that day's
    records: the example export takes its day's ranges from the ingest's interval index
    (``from_ingest``), however late or out of order the days ran."""
    folders = {d: stack.data / "export" / "readings" / d for d in export_days}
    assert all(f.is_dir() for f in folders.values()), sorted(p.name for p in (stack.data / "export").rglob("*"))
    exported = {d: _exported_records(f) for d, f in folders.items()}
    assert Counter(r for recs in exported.values() for r in recs) == Counter(source)
    for d in export_days:
        assert Counter(exported[d]) == Counter(_source_records(stack.data, [d] if d in days else [])), d


def _backfill_args(dag: str, start: str, end: str, behavior: str) -> list[str]:
    return ["backfill", "create", "--dag-id", dag, "--from-date", start, "--to-date", end,
            "--reprocess-behavior", behavior]


def _backfill(stack: Stack, dag: str, start: str, end: str, behavior: str) -> subprocess.CompletedProcess:
    return stack.airflow_cli(*_backfill_args(dag, start, end, behavior))


def _backfill_done(stack: Stack, dag: str, known: set[int]) -> Callable[[], bool]:
    def done() -> bool:
        new = [b for b in stack.get(f"/api/v2/backfills?dag_id={dag}")["backfills"] if b["id"] not in known]
        return bool(new) and all(b.get("completed_at") for b in new)
    return done


def _backfill_ids(stack: Stack, dag: str) -> set[int]:
    return {b["id"] for b in stack.get(f"/api/v2/backfills?dag_id={dag}")["backfills"]}


def _backfill_failed(stack: Stack, days: list[str]) -> None:
    """``--reprocess-behavior failed``: only the day whose run failed runs again, and ends well
    (its ingest adds nothing: the files are in)."""
    first, last = days[0], days[-1]
    before = _day_runs(stack, days)
    known = _backfill_ids(stack, DAG)
    stack._call("PATCH", f"/api/v2/dags/{DAG}/dagRuns/{_quote(before[last]['dag_run_id'])}", {"state": "failed"})
    assert _day_runs(stack, days)[last]["state"] == "failed"
    failed = _backfill(stack, DAG, first, last, "failed")
    assert failed.returncode == 0, failed.stdout + failed.stderr
    stack.wait("the `failed` ingest backfill to complete", _backfill_done(stack, DAG, known))
    after = _day_runs(stack, days)
    assert all(r["state"] == "success" for r in after.values()), after
    assert after[first]["end_date"] == before[first]["end_date"], (before, after)  # untouched: it had succeeded
    assert (after[last]["end_date"] or "") > (before[last]["end_date"] or ""), (before, after)  # ran again
    phase("backfill --reprocess-behavior failed: only the failed day ran again, successfully")


def _backfill_completed_and_none(stack: Stack, days: list[str]) -> None:
    """``completed`` reruns done days: the export rewrites them byte for byte, the ingest adds
    nothing (one day keeps the test lean); then ``none`` runs nothing again."""
    first, last = days[0], days[-1]
    exports_before = {d: _hashes(stack.data / "export" / "readings" / d) for d in days}
    assert all(exports_before.values()), exports_before
    ingest_before, export_before = _day_runs(stack, days), _day_runs(stack, days, EXPORT_DAG)
    known = {DAG: _backfill_ids(stack, DAG), EXPORT_DAG: _backfill_ids(stack, EXPORT_DAG)}
    backfills = [subprocess.Popen(stack.airflow_command(*_backfill_args(dag, first, end, "completed")),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=stack.work)
                 for dag, end in ((EXPORT_DAG, last), (DAG, first))]  # two CLI processes at once
    for proc in backfills:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:]
    stack.wait("the `completed` backfills of the export and the ingest to complete",
               lambda: all(_backfill_done(stack, dag, ids)() for dag, ids in known.items()))
    ingest_after, export_after = _day_runs(stack, days), _day_runs(stack, days, EXPORT_DAG)
    assert ingest_after[first]["state"] == "success" and (ingest_after[first]["end_date"] or "") > (
        ingest_before[first]["end_date"] or ""), (ingest_before, ingest_after)
    for d in days:
        assert export_after[d]["state"] == "success" and (export_after[d]["end_date"] or "") > (
            export_before[d]["end_date"] or ""), (export_before, export_after)
        # Rewritten byte for byte: the same files with the same contents (see _hashes).
        assert _hashes(stack.data / "export" / "readings" / d) == exports_before[d], d
    phase("backfills --reprocess-behavior completed: export days byte-identical, ingest added nothing")

    # `none`: every day is done, so the backfill runs nothing again and creates no run.
    known_ingest = _backfill_ids(stack, DAG)
    runs_before = {r["dag_run_id"]: (r["state"], r["end_date"]) for r in stack.runs(DAG)}
    none = _backfill(stack, DAG, first, last, "none")
    assert none.returncode == 0, none.stdout + none.stderr
    stack.wait("the `none` ingest backfill to complete", _backfill_done(stack, DAG, known_ingest))
    assert {r["dag_run_id"]: (r["state"], r["end_date"]) for r in stack.runs(DAG)} == runs_before
    phase("backfill --reprocess-behavior none: no run created or rerun")


def _check_task_logs(stack: Stack, killed_run: str) -> None:
    """No py4j shutdown noise, Spark's lines at their own level, the killed attempt's log readable."""
    spark_line = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (INFO|WARN) |^Using Spark's default log4j profile")
    killed = _attempt_log(stack, killed_run, "ingest", 1)
    assert killed.exists()
    logs = sorted(stack.task_logs.glob("dag_id=*/run_id=*/task_id=*/attempt=*.log"))
    assert killed in logs and len(logs) > 10, logs
    problems = []
    for path in logs:
        text = path.read_text(errors="replace")
        if "RecursionError" in text:
            problems.append(f"{path}: RecursionError")
        if "Closing down clientserver connection" in text:
            problems.append(f"{path}: py4j 'Closing down clientserver connection'")
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("level") in ("error", "critical") and spark_line.match(str(record.get("event", ""))):
                problems.append(f"{path}: a Spark line at {record['level']}: {record['event'][:200]}")
    assert not problems, "\n".join(problems[:20])
    killed_text = killed.read_text(errors="replace")
    assert "fault injection: pausing" in killed_text and len(killed_text) < 256 * 1024, len(killed_text)


def _check_ui(stack: Stack, days: list[str]) -> None:
    """Login, the ingest DAG's grid all green, the Pravega connection's Test button succeeds."""
    ui = _ui_helpers()
    reason = ui.chromium_missing()
    if reason:
        pytest.skip(f"everything but the UI part passed; the UI part needs a browser: {reason}")
    from playwright.sync_api import expect

    stack._call("POST", "/api/v2/connections", {"connection_id": UI_CONN, "conn_type": "pravega",
                                                "host": "127.0.0.1", "port": stack.state["pravega_port"]})
    runs = [r["dag_run_id"] for r in stack.runs(DAG)]
    profile = stack.work / "chromium-profile"
    with ui.chromium_page(ui.CHROMIUM, profile) as page:
        try:
            ui.ui_login(page, f"{stack.api}/dags/{DAG}", "admin", stack.password)
            for run_id in runs:  # every run's bar, and every task's badge, painted success
                bar = page.locator(f"a[href='/dags/{DAG}/runs/{run_id}/'] > div")
                expect(bar).to_have_count(1, timeout=30_000)  # the grid paints late on a loaded machine
                badges = page.locator(f"[data-testid^='grid-{run_id}-'] [data-testid=task-state-badge]")
                expect(badges).to_have_count(5)
                colours = [bar.evaluate("e => getComputedStyle(e).backgroundColor")] + [
                    b.evaluate("e => getComputedStyle(e).backgroundColor") for b in badges.all()]
                assert all(map(_is_green, colours)), (run_id, colours)
            page.goto(f"{stack.api}/connections")
            row = page.get_by_role("row").filter(has_text=UI_CONN)
            with page.expect_response(lambda r: "/api/v2/connections/test" in r.url) as answer:
                row.get_by_role("button", name="Test Connection").click()
            assert answer.value.status == 200 and answer.value.json()["status"] is True, answer.value.text()
            expect(page.get_by_text("Test Connection Successful").first).to_be_visible()
            expect(page.get_by_text(f"Connected to Pravega controller at {stack.state['controller_uri']}").first
                   ).to_be_visible()
        except Exception:
            shot = stack.work.parent / "topology-ui-failure.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"screenshot at the failure: {shot}")
            raise
