"""Kill -> retry success of the example ingest DAG on the production topology (``scripts/stack``).

Not part of ``make bench`` (it starts the whole stack: PostgreSQL, the embedded Pravega server,
Airflow's four components; about 3-5 minutes). One day of sample input (2 files of 150 readings);
the ingest pauses after its write tasks flushed (``pravega_testing.faults``' pause), the script SIGKILLs
its task process (``--kill task``: the supervisor lives and reports the failure) or the whole
worker (``--kill worker``: supervisor, task process and its Spark JVM; Airflow notices only by the
missing heartbeat), and prints the seconds from the kill to the retry's success, with each try's
start and end relative to the kill and the retry's log. ``--env KEY=VALUE`` passes Airflow
settings to the stack (e.g. ``AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT=300``, Airflow's
default, instead of the stack's 15 s). Figures: docs/benchmarks.md, "Kill to retry success".

    python benchmarks/kill_retry.py --kill task
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pravega_testing.faults import fault_env  # noqa: E402

DAG = "pravega_exactly_once_ingest"


def stack(work: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "stack.py"), "--work-dir", str(work), *args],
                          env=env, capture_output=True, text=True, timeout=900)


class Api:
    def __init__(self, work: Path) -> None:
        state = json.loads((work / "stack.json").read_text())
        self.url = state["api_url"]
        password = json.loads((work / "airflow" / "simple_auth_manager_passwords.json").read_text())["admin"]
        self.token = self.call("POST", "/auth/token", {"username": "admin", "password": password})["access_token"]

    def call(self, method: str, path: str, body: Any = None) -> Any:
        headers = {"Content-Type": "application/json"}
        if getattr(self, "token", None):
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + path, json.dumps(body).encode() if body is not None else None,
                                     headers, method=method)
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.load(resp)


def wait(what: str, check: Any, timeout_s: float = 900, poll_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            found = check()
        except OSError:  # the api-server answers slowly on a loaded machine
            found = None
        if found:
            return found
        time.sleep(poll_s)
    raise SystemExit(f"timed out waiting for {what}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kill", choices=("task", "worker"), default="task")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--keep", action="store_true", help="leave the stack's work directory (logs) behind")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kill-retry-")) / "stack"
    release = work.parent / "release"
    day = (dt.datetime.now(dt.timezone.utc).date() - dt.timedelta(days=1)).isoformat()
    up = stack(work, "up", "--examples-start", day, "--sample-days", "1", "--files-per-day", "2",
               "--events-per-file", "150", "--parallelism", "2", *[a for e in args.env for a in ("--env", e)],
               # the stack's components inherit the test harness's pause after the write tasks
               env=fault_env(delay_at="after_tasks", release=release))
    if up.returncode != 0:
        print(up.stdout[-2000:], up.stderr[-3000:], file=sys.stderr)
        return 1
    try:
        api = Api(work)
        wait("the example DAGs", lambda: DAG in {d["dag_id"] for d in api.call("GET", "/api/v2/dags")["dags"]})
        api.call("PATCH", f"/api/v2/dags/{DAG}", {"is_paused": False})

        def paused() -> tuple[str, dict] | None:
            runs = [r for r in api.call("GET", f"/api/v2/dags/{DAG}/dagRuns")["dag_runs"] if r["logical_date"]]
            if not runs:
                return None
            run_id = runs[0]["dag_run_id"]
            ti = api.call("GET", f"/api/v2/dags/{DAG}/dagRuns/{urllib.parse.quote(run_id, safe='')}/taskInstances/"
                                 "ingest")
            log = work / "airflow" / "logs" / f"dag_id={DAG}" / f"run_id={run_id}" / "task_id=ingest" / "attempt=1.log"
            if ti["state"] == "running" and ti.get("pid") and log.exists() and "fault injection: pausing" in \
                    log.read_text(errors="replace"):
                return run_id, ti
            return None

        run_id, ti = wait("the ingest to pause after its write tasks", paused)
        pid = ti["pid"]
        supervisor = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        children = [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                                   text=True).stdout.split()]
        release.write_text("")  # later pauses (a retry that writes again) end at once
        killed_at, killed_wall = time.monotonic(), dt.datetime.now(dt.timezone.utc)
        for p in ([pid] if args.kill == "task" else [supervisor, pid, *children]):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        path = f"/api/v2/dags/{DAG}/dagRuns/{urllib.parse.quote(run_id, safe='')}/taskInstances/ingest"

        def retried() -> bool:
            now = api.call("GET", path)
            if now["state"] == "failed":
                raise SystemExit(f"the ingest failed: {now}")
            return now["try_number"] >= 2 and now["state"] == "success"

        wait("the retry to succeed", retried)
        seconds = time.monotonic() - killed_at

        def since_kill(ts: str | None) -> str:
            return "-" if not ts else f"{(dt.datetime.fromisoformat(ts) - killed_wall).total_seconds():+.1f} s"

        for t in api.call("GET", path + "/tries")["task_instances"]:
            print(f"try {t['try_number']}: {t['state']}, started {since_kill(t['start_date'])}, "
                  f"ended {since_kill(t['end_date'])}")
        logs = work / "airflow" / "logs" / f"dag_id={DAG}" / f"run_id={run_id}" / "task_id=ingest"
        for line in (logs / "attempt=2.log").read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not str(record.get("logger", "")).endswith("spark.jvm"):
                print(f"  {str(record.get('timestamp', ''))[11:23]} {str(record.get('event', ''))[:160]}")
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"kill ({args.kill}) -> retry success: {seconds:.1f} s (load average {load})")
        return 0
    finally:
        stack(work, "down", *([] if args.keep else ["--purge"]))
        if args.keep:
            print(f"stack work directory: {work}")


if __name__ == "__main__":
    sys.exit(main())
