"""The full stack natively, without Docker: ``scripts/stack up | down | status`` (``make stack``).

``up`` starts, on free loopback ports and under one work directory (``stack-work/`` or ``--work-dir``):

* PostgreSQL: a private cluster (``initdb``; as the ``postgres`` user when run as root, which
  initdb refuses) holding Airflow's metadata database;
* the embedded Pravega-compatible server (``python -m airflow_provider_pravega.embedded``);
* a stock Spark Connect server from pyspark's own jars (no plugin; ``pravega_testing.spark_connect``),
  long-running and warm: the ``spark_connect_default`` connection points at it and the example
  DAGs run their Spark jobs there (seconds per daily run instead of a JVM started per task);
  ``--no-spark-connect``: no server, every task starts its own local session, as before;
* with ``--spark``: a Spark standalone master and worker from pyspark's ``bin/spark-class``
  (the ``spark_default`` connection then points at it, so the example DAGs run their Spark jobs there);
* Airflow's api-server, scheduler (LocalExecutor), dag-processor and triggerer with the example
  DAGs (``dags/``), ``PRAVEGA_EXAMPLES_DATA`` (sample input generated on the first ``up``) and a
  ``pravega_default`` connection to the embedded server;

each in its own process group (session), recorded in ``<work>/stack.json``; it waits until
``/api/v2/monitor/health`` reports every component healthy, then prints the UI URL, the login, the
logs and how to stop. ``down`` stops exactly those groups (SIGTERM, then SIGKILL) and any process
still carrying this stack's id in its environment (a process that left its group), so nothing of the
stack survives it: not a LocalExecutor worker, not a Spark driver. ``status`` shows each component.
``<work>/env.sh`` sets the environment for the ``airflow`` CLI against this stack.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pwd
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess  # noqa: E402
from pravega_testing import spark_connect, spark_standalone  # noqa: E402
from pravega_testing.net import free_port  # noqa: E402
from pravega_testing.wait import WaitTimeout, wait_until  # noqa: E402

STATE = "stack.json"
STACK_ID_VAR = "PRAVEGA_STACK_ID"  # every process of a stack inherits it: `down` finds stragglers by it
AIRFLOW_COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
# Stopped in this order (the reverse of starting, the scheduler first: no new task starts while the rest stops).
STOP_ORDER = ("scheduler", "triggerer", "dag-processor", "api-server", "spark-connect", "spark-worker", "spark-master",
              "pravega", "postgres")
ADMIN = "admin"


class StackError(RuntimeError):
    pass


def say(msg: str) -> None:
    print(f"stack: {msg}", flush=True)


# ------------------------------------------------------------------------------------------ processes
def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user (postgres when we run as root)
        return True


def processes_of_stack(stack_id: str) -> list[int]:
    """Pids of live processes whose environment carries this stack's id (children inherit it)."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if f"{STACK_ID_VAR}={stack_id}".encode() in env.split(b"\0"):
            try:  # zombies are dead already; their parent reaps them
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            except (OSError, IndexError):
                continue
            found.append(int(entry.name))
    return found


def stop_group(pgid: int, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> bool:
    """Signal a process group, wait until it is gone, SIGKILL it after ``timeout_s``. True when it
    had to be killed."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    try:
        wait_until(f"process group {pgid} to exit", lambda: not group_alive(pgid), timeout_s, poll_s=0.2)
        return False
    except WaitTimeout:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        wait_until(f"process group {pgid} to die of SIGKILL", lambda: not group_alive(pgid), 60, poll_s=0.1)
        return True


def spawn(name: str, cmd: list[str], env: dict[str, str], logs: Path, *, user: str | None = None,
          cwd: Path | None = None) -> dict[str, Any]:
    """Start ``cmd`` in its own session with stdout+stderr to ``logs/<name>.log``."""
    log_path = logs / f"{name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, user=user, cwd=cwd)
    return {"pid": proc.pid, "pgid": proc.pid, "log": str(log_path), "cmd": cmd}


def log_tail(path: str | Path, chars: int = 3000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# ------------------------------------------------------------------------------------------ PostgreSQL
def pg_bindir(explicit: str | None) -> Path:
    candidates = [explicit] if explicit else []
    if not explicit:
        try:
            candidates.append(subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip())
        except OSError:
            pass
        candidates += sorted((str(p) for p in Path("/usr/lib/postgresql").glob("*/bin")), reverse=True)
        if shutil.which("initdb"):
            candidates.append(str(Path(shutil.which("initdb")).parent))  # type: ignore[arg-type]
    for c in candidates:
        if c and (Path(c) / "initdb").exists() and (Path(c) / "postgres").exists():
            return Path(c)
    raise StackError("PostgreSQL server binaries (initdb, postgres) not found: install PostgreSQL 15+ "
                     "(Debian/Ubuntu: apt-get install -y postgresql) or pass --pg-bin DIR")


def pg_user() -> str | None:
    """None: run PostgreSQL as ourselves; as root (initdb refuses root), the ``postgres`` user."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise StackError("running as root: PostgreSQL must run as an unprivileged user and there is no 'postgres' "
                         "user (create one, e.g. useradd --system postgres, or run scripts/stack as a normal user)")
    return "postgres"


def pg_root_for(work: Path, user: str | None) -> Path:
    """Where the cluster lives: ``<work>/postgres``, unless the postgres user cannot reach it (a work
    dir under a private directory such as /root or pytest's tmp): then a directory of its own under
    the system temp dir, named after the work dir."""
    inside = work / "postgres"
    if user is None:
        return inside
    probe = subprocess.run(["runuser", "-u", user, "--", "test", "-x", str(work)], capture_output=True)
    if probe.returncode == 0:
        return inside
    import hashlib

    return Path("/tmp") / f"pravega-stack-pg-{hashlib.sha1(str(work).encode()).hexdigest()[:12]}"


def start_postgres(work: Path, logs: Path, env: dict[str, str], bindir: Path) -> tuple[dict[str, Any], str]:
    user = pg_user()
    root = pg_root_for(work, user)
    data, sock = root / "data", root / "run"
    root.mkdir(parents=True, exist_ok=True)
    sock.mkdir(exist_ok=True)
    if user is not None:
        pw = pwd.getpwnam(user)
        for p in (root, sock):
            os.chown(p, pw.pw_uid, pw.pw_gid)
        root.chmod(0o700)
        # The server's log is written by that user.
        (logs / "postgres.log").touch()
        os.chown(logs / "postgres.log", pw.pw_uid, pw.pw_gid)
    if not (data / "PG_VERSION").exists():
        say(f"initdb {data}" + (f" (as user {user})" if user else ""))
        r = subprocess.run([str(bindir / "initdb"), "-D", str(data), "-U", "airflow", "--auth=trust", "-E", "UTF8",
                            "--no-instructions"], env={**env, "LC_ALL": "C.UTF-8"}, user=user, capture_output=True,
                           text=True, cwd="/")
        if r.returncode != 0:
            raise StackError(f"initdb failed (exit {r.returncode}): {(r.stdout + r.stderr)[-2000:]}")
    port = free_port()
    comp = spawn("postgres", [str(bindir / "postgres"), "-D", str(data), "-k", str(sock), "-p", str(port),
                              "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200"],
                 {**env, "LC_ALL": "C.UTF-8"}, logs, user=user, cwd=Path("/"))
    comp.update(port=port, data_dir=str(data), user=user, cluster_dir=str(root))
    def pg_ready() -> bool:
        if not group_alive(comp["pgid"]):
            raise StackError(f"PostgreSQL exited while starting; its log:\n{log_tail(comp['log'])}")
        return subprocess.run([str(bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port), "-U", "airflow"],
                              capture_output=True).returncode == 0

    try:
        wait_until("PostgreSQL to accept connections", pg_ready, 60, poll_s=0.3)
    except WaitTimeout as exc:
        raise StackError(f"{exc}; its log:\n{log_tail(comp['log'])}") from None
    r = subprocess.run([str(bindir / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "airflow", "-d", "postgres",
                        "-tAc", "SELECT 1 FROM pg_database WHERE datname = 'airflow'"], capture_output=True, text=True)
    if r.stdout.strip() != "1":
        subprocess.run([str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "airflow", "airflow"],
                       check=True, capture_output=True)
    return comp, f"postgresql+psycopg2://airflow@127.0.0.1:{port}/airflow"


# ------------------------------------------------------------------------------------------ up / down / status
def read_state(work: Path) -> dict[str, Any] | None:
    try:
        return json.loads((work / STATE).read_text())
    except (OSError, ValueError):
        return None


def write_state(work: Path, state: dict[str, Any]) -> None:
    tmp = work / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(work / STATE)


def running_components(state: dict[str, Any] | None) -> list[str]:
    if not state:
        return []
    return [n for n, c in state.get("components", {}).items() if group_alive(c["pgid"])]


def health(api_url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"{api_url}/api/v2/monitor/health", timeout=5) as resp:
            return json.load(resp)
    except (OSError, ValueError):
        return None


def unhealthy(report: dict[str, Any] | None) -> list[str]:
    if report is None:
        return ["api-server (no answer)"]
    return [k for k in ("metadatabase", "scheduler", "triggerer", "dag_processor")
            if (report.get(k) or {}).get("status") != "healthy"]


def airflow_env(work: Path, state: dict[str, Any], base: dict[str, str]) -> dict[str, str]:
    """The environment every Airflow component (and the CLI, via env.sh) runs with."""
    home = work / "airflow"
    api = state["api_url"]
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": state["sql_alchemy_conn"],
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": str(state["parallelism"]),
        "AIRFLOW__CORE__DAGS_FOLDER": state["dags_folder"],
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api}/execution/",
        "AIRFLOW__API__BASE_URL": api,
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(state["api_port"]),
        "AIRFLOW__API_AUTH__JWT_SECRET": state["jwt_secret"],
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "simple_auth_manager_passwords.json"),
        # The connections page's Test button (Airflow disables it by default; this is a private stack).
        "AIRFLOW__CORE__TEST_CONNECTION": "Enabled",
        # A lost worker (its task supervisor gone) is given up after 15 s without a heartbeat, not
        # Airflow's 300 s, so its retry resumes the ingest within about half a minute
        # (docs/deployment.md, "A lost worker"). Supervisors heartbeat every 5 s.
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "15",
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(state["worker_log_port"]),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(state["trigger_log_port"]),
        "AIRFLOW_CONN_PRAVEGA_DEFAULT": json.dumps({"conn_type": "pravega", "host": "127.0.0.1",
                                                    "port": state["pravega_port"]}),
        "PRAVEGA_EXAMPLES_DATA": state["examples_data"],
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), base.get("PYTHONPATH")])),
        STACK_ID_VAR: state["id"],
    }
    if state.get("examples_start"):
        env["PRAVEGA_EXAMPLES_START"] = state["examples_start"]
    if state.get("spark_connect_port"):
        env.update(spark_connect.example_dags_env(state["spark_connect_port"]))
    if state.get("spark_master"):
        env["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps({"conn_type": "spark", "host": state["spark_master"]})
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        # The executors' Python workers run what the driver names: this interpreter (pyarrow, the
        # provider), not whatever `python3` the worker finds first on PATH.
        env["PYSPARK_PYTHON"] = sys.executable
    env.update(state.get("extra_env") or {})
    return {**base, **env}


def write_env_sh(work: Path, env: dict[str, str], base: dict[str, str]) -> None:
    lines = ["# Environment of this stack: `. env.sh`, then the airflow CLI works against it."]
    for k, v in sorted(env.items()):
        # Not the stack id: `down` stops whatever carries it, and a shell is not part of the stack.
        if base.get(k) != v and k != STACK_ID_VAR:
            lines.append(f"export {k}={shlex.quote(v)}")
    (work / "env.sh").write_text("\n".join(lines) + "\n")


def up(args: argparse.Namespace) -> int:
    work: Path = args.work_dir.resolve()
    state = read_state(work)
    alive = running_components(state)
    if alive:
        if len(alive) == len(state["components"]):  # type: ignore[index]
            say(f"already up in {work}")
            print_info(work, state)  # type: ignore[arg-type]
            return 0
        raise StackError(f"a partly running stack is in {work} ({', '.join(alive)} up): run `scripts/stack down` first")
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    (work / "airflow").mkdir(exist_ok=True)
    examples_data = (args.examples_data or work / "data").resolve()
    state = {
        "id": uuid.uuid4().hex,
        "work_dir": str(work),
        "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "components": {},
        "api_port": args.api_port or free_port(),
        "worker_log_port": free_port(),
        "trigger_log_port": free_port(),
        # The same secret every start (tokens of running tasks stay valid across a restart of a component).
        "jwt_secret": (state or {}).get("jwt_secret") or secrets.token_urlsafe(32),
        "parallelism": args.parallelism,
        "dags_folder": str((args.dags or REPO / "dags").resolve()),
        "examples_data": str(examples_data),
        "examples_start": args.examples_start,
        "extra_env": dict(kv.split("=", 1) for kv in args.env),
    }
    state["api_url"] = f"http://127.0.0.1:{state['api_port']}"
    base = dict(os.environ)
    base[STACK_ID_VAR] = state["id"]
    os.environ[STACK_ID_VAR] = state["id"]  # inherited by everything started from here on
    try:
        if not (examples_data / "incoming").exists() and args.sample_days > 0:
            start = args.examples_start or "2026-11-01"
            subprocess.run([sys.executable, str(REPO / "scripts" / "generate_sample_data.py"), "--out",
                            str(examples_data / "incoming"), "--start", start, "--days", str(args.sample_days),
                            "--files-per-day", str(args.files_per_day), "--events-per-file",
                            str(args.events_per_file)], check=True, stdout=subprocess.DEVNULL)
        comps = state["components"]
        pg, state["sql_alchemy_conn"] = start_postgres(work, logs, base, pg_bindir(args.pg_bin))
        comps["postgres"] = pg
        write_state(work, state)

        server = EmbeddedPravegaProcess(work / "pravega", port=free_port(), segment_store_port=free_port(),
                                        new_session=True).start()
        state["pravega_port"] = server.port
        state["controller_uri"] = server.controller_uri
        comps["pravega"] = {"pid": server.pid, "pgid": server.pid, "log": str(work / "pravega" / "server.log"),
                            "port": server.port, "segment_store": server.segment_store_endpoint}
        write_state(work, state)

        if args.spark:
            spark_logs = logs / "spark"
            spark_logs.mkdir(exist_ok=True)
            senv = spark_standalone.spark_env(spark_logs, base)
            port, ui = free_port(), free_port()
            state["spark_master"] = f"spark://127.0.0.1:{port}"
            state["spark_ui"] = f"http://127.0.0.1:{ui}"
            comps["spark-master"] = spawn("spark-master", spark_standalone.master_command(port, ui), senv, logs)
            comps["spark-master"]["port"] = port
            (work / "spark-work").mkdir(exist_ok=True)
            comps["spark-worker"] = spawn("spark-worker", spark_standalone.worker_command(
                state["spark_master"], work / "spark-work", free_port(), cores=args.spark_cores,
                memory=args.spark_memory), senv, logs)
            write_state(work, state)
            spark_standalone.wait_for_workers(
                ui, 1, timeout_s=args.timeout,
                still_running=lambda: all(group_alive(comps[n]["pgid"]) for n in ("spark-master", "spark-worker")))

        if args.spark_connect:
            port, ui = free_port(), free_port()
            # Its Python workers run the jobs' functions: the provider must import there.
            senv = dict(spark_connect.server_env(base, worker_launcher=True), PYTHONPATH=os.pathsep.join(
                filter(None, [str(REPO), base.get("PYTHONPATH")])))
            comps["spark-connect"] = spawn("spark-connect", spark_connect.server_command(
                port, master=args.spark_connect_master, ui_port=ui,
                session_timeout=spark_connect.LONG_SESSION_TIMEOUT), senv, logs)
            comps["spark-connect"]["port"] = port
            state["spark_connect_port"] = port
            state["spark_connect_url"] = spark_connect.url(port)
            state["spark_connect_ui"] = f"http://127.0.0.1:{ui}"
            write_state(work, state)
            say(f"waiting for the Spark Connect server on {state['spark_connect_url']}")
            try:
                spark_connect.wait_ready(port, still_running=lambda: group_alive(comps["spark-connect"]["pgid"]),
                                         log=comps["spark-connect"]["log"], timeout_s=args.timeout)
            except spark_connect.SparkConnectServerError as exc:
                raise StackError(str(exc)) from None

        env = airflow_env(work, state, base)
        write_env_sh(work, env, base)
        pw_file = Path(env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"])
        if not pw_file.exists():
            pw_file.write_text(json.dumps({ADMIN: secrets.token_urlsafe(12)}) + "\n")
            pw_file.chmod(0o600)
        say("airflow db migrate")
        r = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, capture_output=True,
                           text=True, timeout=args.timeout)
        if r.returncode != 0:
            raise StackError(f"`airflow db migrate` failed (exit {r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
        commands = {
            "api-server": ["api-server", "--host", "127.0.0.1", "--port", str(state["api_port"]), "--workers", "1"],
            "scheduler": ["scheduler"],
            "dag-processor": ["dag-processor"],
            "triggerer": ["triggerer"],
        }
        for name in AIRFLOW_COMPONENTS:
            comps[name] = spawn(name, [sys.executable, "-m", "airflow", *commands[name]], env, logs, cwd=work)
        write_state(work, state)
        say(f"waiting for {state['api_url']}/api/v2/monitor/health to report every component healthy")
        missing: list[str] = []

        def healthy() -> bool:
            missing[:] = unhealthy(health(state["api_url"]))
            dead = [n for n, c in comps.items() if not group_alive(c["pgid"])]
            if missing and dead:
                raise StackError(f"{', '.join(dead)} exited while starting; last lines of {comps[dead[0]]['log']}:\n"
                                 f"{log_tail(comps[dead[0]]['log'])}")
            return not missing

        try:
            wait_until("every component to report healthy", healthy, args.timeout)
        except WaitTimeout:
            raise StackError(f"not healthy within {args.timeout:.0f} s: {', '.join(missing)} (logs in {logs})") from None
    except BaseException:
        say("start failed: stopping what was started")
        stop_all(work, state)
        raise
    print_info(work, state)
    return 0


def print_info(work: Path, state: dict[str, Any]) -> None:
    pw_file = Path(work / "airflow" / "simple_auth_manager_passwords.json")
    try:
        password = json.loads(pw_file.read_text())[ADMIN]
    except (OSError, ValueError, KeyError):
        password = f"(see {pw_file})"
    print(f"""
Airflow UI:      {state['api_url']}   login: {ADMIN} / {password}
Pravega:         {state.get('controller_uri')} (embedded; connection pravega_default)
PostgreSQL:      {state.get('sql_alchemy_conn')}""")
    if state.get("spark_connect_url"):
        print(f"Spark Connect:   {state['spark_connect_url']} (UI {state['spark_connect_ui']}; connection "
              f"{spark_connect.CONN_ID}: the example DAGs' Spark jobs)")
    if state.get("spark_master"):
        print(f"Spark:           {state['spark_master']} (UI {state['spark_ui']}; connection spark_default)")
    print(f"""Example data:    {state['examples_data']}   DAGs: {state['dags_folder']} (paused: unpause them in the UI)
Logs:            {work / 'logs'} (components), {work / 'airflow' / 'logs'} (tasks)
Airflow CLI:     . {work / 'env.sh'} && airflow dags list
Stop:            scripts/stack down{'' if work == (REPO / 'stack-work') else f' --work-dir {work}'}
""", flush=True)


def stop_all(work: Path, state: dict[str, Any] | None) -> list[str]:
    """Stop every recorded group, then whatever still carries the stack id. Returns what needed SIGKILL."""
    if not state:
        return []
    killed = []
    comps = state.get("components", {})
    for name in STOP_ORDER:
        c = comps.get(name)
        if c is None or not group_alive(c["pgid"]):
            continue
        # PostgreSQL: SIGINT is its fast shutdown (clients disconnected, a clean checkpoint).
        sig = signal.SIGINT if name == "postgres" else signal.SIGTERM
        t0 = time.monotonic()
        if stop_group(c["pgid"], sig, timeout_s=30.0):
            killed.append(name)
        say(f"{name} stopped ({time.monotonic() - t0:.1f} s)")
    for _ in range(3):
        stragglers = processes_of_stack(state["id"])
        if not stragglers:
            break
        for pid in stragglers:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(f"pid {pid} (left its group)")
            except ProcessLookupError:
                pass
        time.sleep(0.5)
    return killed


def down(args: argparse.Namespace) -> int:
    work: Path = args.work_dir.resolve()
    state = read_state(work)
    if state is None:
        say(f"no stack recorded in {work}")
        return 0
    killed = stop_all(work, state)
    left = running_components(state) + [f"pid {p}" for p in processes_of_stack(state["id"])]
    if left:
        raise StackError(f"still running after down: {', '.join(left)}")
    say("stopped" + (f" (SIGKILL needed for: {', '.join(killed)})" if killed else ""))
    if args.purge:
        cluster = (state.get("components", {}).get("postgres") or {}).get("cluster_dir")
        if cluster and Path(cluster).name.startswith("pravega-stack-pg-"):
            shutil.rmtree(cluster, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
        say(f"removed {work}")
    return 0


def restart(args: argparse.Namespace) -> int:
    """Stop one Airflow component's process group (if it still runs) and start it again, as after a
    crash: the same command, environment and log."""
    work: Path = args.work_dir.resolve()
    state = read_state(work)
    if state is None or args.component not in state.get("components", {}):
        raise StackError(f"no {args.component} recorded in {work}")
    c = state["components"][args.component]
    if group_alive(c["pgid"]):
        stop_group(c["pgid"])
    os.environ[STACK_ID_VAR] = state["id"]
    base = dict(os.environ)
    env = airflow_env(work, state, base)
    state["components"][args.component] = spawn(args.component, c["cmd"], env, work / "logs", cwd=work)
    write_state(work, state)
    say(f"{args.component} restarted (pgid {state['components'][args.component]['pgid']})")
    return 0


def status(args: argparse.Namespace) -> int:
    work: Path = args.work_dir.resolve()
    state = read_state(work)
    if state is None:
        say(f"no stack recorded in {work}")
        return 3
    report = health(state["api_url"]) if "api-server" in state.get("components", {}) else None
    names = {"scheduler": "scheduler", "triggerer": "triggerer", "dag-processor": "dag_processor"}
    up_count = 0
    for name in [n for n in reversed(STOP_ORDER) if n in state["components"]]:
        c = state["components"][name]
        alive = group_alive(c["pgid"])
        up_count += alive
        detail = ""
        if name in names and report:
            detail = f"health: {(report.get(names[name]) or {}).get('status')}"
        elif name == "api-server":
            detail = f"{state['api_url']}" + (f" (metadatabase {report['metadatabase']['status']})" if report else "")
        elif c.get("port"):
            detail = f"127.0.0.1:{c['port']}"
        print(f"{name:14} {'up' if alive else 'DOWN':5} pgid {c['pgid']:<8} {detail:50} log {c['log']}")
    total = len(state["components"])
    print(f"{up_count}/{total} components up; UI {state['api_url']}")
    return 0 if up_count == total and not unhealthy(report) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/stack", description=__doc__.split("\n\n")[0])
    ap.add_argument("--work-dir", type=Path, default=REPO / "stack-work", help="default: <repo>/stack-work")
    sub = ap.add_subparsers(dest="command", required=True)
    u = sub.add_parser("up", help="start everything and wait until healthy")
    u.add_argument("--spark", action="store_true", help="also a Spark standalone master + worker (spark_default)")
    u.add_argument("--no-spark-connect", dest="spark_connect", action="store_false",
                   help="no Spark Connect server: every Spark task starts its own local session")
    u.add_argument("--spark-connect-master", default=spark_connect.DEFAULT_MASTER,
                   help=f"the Spark Connect server's master (default {spark_connect.DEFAULT_MASTER})")
    u.add_argument("--spark-cores", type=int, default=1)
    u.add_argument("--spark-memory", default="1g")
    u.add_argument("--dags", type=Path, default=None, help="DAG folder (default: the repository's dags/)")
    u.add_argument("--examples-data", type=Path, default=None, help="PRAVEGA_EXAMPLES_DATA (default: <work>/data)")
    u.add_argument("--examples-start", default=None,
                   help="first day of the example DAGs' catchup (PRAVEGA_EXAMPLES_START; default 2026-11-01)")
    u.add_argument("--sample-days", type=int, default=3, help="days of sample input to generate (0: none)")
    u.add_argument("--files-per-day", type=int, default=2)
    u.add_argument("--events-per-file", type=int, default=1000)
    u.add_argument("--parallelism", type=int, default=4, help="LocalExecutor task slots (default 4)")
    u.add_argument("--api-port", type=int, default=0, help="api-server port (default: a free one)")
    u.add_argument("--pg-bin", default=None, help="PostgreSQL bin directory (default: found)")
    u.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment of the Airflow components (repeatable)")
    u.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each step")
    d = sub.add_parser("down", help="stop what `up` started")
    d.add_argument("--purge", action="store_true", help="also delete the work directory (database, streams, logs)")
    sub.add_parser("status", help="each component: running, health, log")
    r = sub.add_parser("restart", help="stop (if running) and start one Airflow component again")
    r.add_argument("component", choices=AIRFLOW_COMPONENTS)
    args = ap.parse_args(argv)
    try:
        return {"up": up, "down": down, "status": status, "restart": restart}[args.command](args)
    except StackError as exc:
        print(f"stack: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
