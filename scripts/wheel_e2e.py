#!/usr/bin/env python3
"""The built wheel, installed into a fresh venv of any supported Python, runs the example ingest DAG
end to end against the embedded server.

    scripts/wheel_e2e.py --python /root/.pyenv/versions/3.13.0/bin/python3.13 [--work-dir DIR] [--keep]

1. makes a new venv with ``--python``, builds the wheel of this checkout there (``pip wheel
   --no-deps``: the optional C extension is compiled for that Python where a compiler is) and
   installs it (with its dependencies, nothing else of the repository) into that venv;
2. from that venv, outside the repository (so the installed package is what runs): starts the
   embedded server on free loopback ports, makes an Airflow home on SQLite, generates a day of
   sample files, points ``pravega_default`` at the server and runs ``airflow dags test
   pravega_exactly_once_ingest <day>`` (dags/ of this checkout: the example DAGs are not packaged);
3. reads the stream back with the provider's own client and checks that every source record is
   there exactly once; reports whether the official client is installed in that venv and what
   ``PravegaHook.get_conn()`` says without it. The server is stopped, the work directory removed
   (unless ``--keep``); exit status 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DAG_ID = "pravega_exactly_once_ingest"
DAY = "2026-11-01"


def log(msg: str) -> None:
    print(f"[wheel-e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if r.returncode != 0:
        tail = (r.stdout[-3000:] + "\n" + r.stderr[-3000:]).strip()
        raise SystemExit(f"`{' '.join(map(str, cmd[:4]))} ...` failed with exit code {r.returncode}:\n{tail}")
    return r


def outer(args: argparse.Namespace) -> int:
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="pravega-wheel-e2e-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    try:
        log(f"creating a venv with {args.python}")
        venv = work / "venv"
        run([args.python, "-m", "venv", str(venv)])
        py = venv / "bin" / "python"
        t0 = time.monotonic()
        log(f"building the wheel of {REPO} with that Python (the optional C extension is built for it)")
        run([str(py), "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(work / "dist"), str(REPO)],
            timeout=600)
        (wheel,) = (work / "dist").glob("airflow_provider_pravega-*.whl")
        log(f"built {wheel.name} in {time.monotonic() - t0:.0f} s")
        t1 = time.monotonic()
        run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", f"{wheel}[spark,embedded]"],
            timeout=1800)
        version = run([str(py), "-c", "import platform; print(platform.python_version())"]).stdout.strip()
        log(f"installed the wheel and its dependencies into Python {version} in {time.monotonic() - t1:.0f} s")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")
               and not k.startswith(("AIRFLOW", "PRAVEGA"))}
        r = subprocess.run([str(py), str(Path(__file__).resolve()), "--inner", str(work)], cwd=work, env=env,
                           timeout=1800)
        return r.returncode
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def inner(work: Path) -> int:
    import airflow_provider_pravega
    from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess

    installed_at = Path(airflow_provider_pravega.__file__).resolve()
    if REPO in installed_at.parents:
        raise SystemExit(f"the package was imported from the checkout ({installed_at}), not from the wheel")
    log(f"airflow_provider_pravega {airflow_provider_pravega.__version__} from {installed_at.parent}")
    failures: list[str] = []
    from airflow_provider_pravega.spark.worker_python import SCRIPT, worker_python

    launcher = worker_python()  # what the DAG's local Spark sessions start their Python workers with
    if Path(launcher).name == SCRIPT:
        log(f"Python workers of local sessions: {launcher}")
    else:
        failures.append(f"the wheel installed no {SCRIPT} for {sys.executable}: local sessions' workers would "
                        f"compile pyspark's zip ({launcher})")
    try:
        import pravega_client  # noqa: F401

        log("official client: installed (CPython 3.10/3.11)")
    except ImportError:
        log("official client: not installed")
        from airflow_provider_pravega.client.config import PravegaConnectionConfig
        from airflow_provider_pravega.client.errors import OfficialClientMissingError

        try:
            PravegaConnectionConfig.from_connection_fields(host="127.0.0.1").create_stream_manager()
            failures.append("create_stream_manager() worked without the official client")
        except OfficialClientMissingError as exc:
            log(f"  get_conn()/create_stream_manager() without it: {exc}")

    data = work / "data"
    run([sys.executable, str(REPO / "scripts" / "generate_sample_data.py"), "--out", str(data / "incoming"),
         "--start", DAY, "--days", "1", "--files-per-day", "3", "--events-per-file", "1000"])
    source = sorted(line for f in (data / "incoming" / DAY).glob("*.jsonl") for line in f.read_text().splitlines()
                    if line.strip())
    server = EmbeddedPravegaProcess(work / "pravega").start()
    try:
        log(f"embedded server: controller {server.controller_uri}")
        host, port = server.controller_uri.rsplit("//", 1)[1].rsplit(":", 1)
        home = work / "airflow"
        home.mkdir()
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW_CONN_PRAVEGA_DEFAULT": json.dumps({"conn_type": "pravega", "host": host, "port": int(port)}),
            "PRAVEGA_EXAMPLES_DATA": str(data),
        }
        airflow = [sys.executable, "-m", "airflow"]
        run([*airflow, "db", "migrate"], env=env, timeout=600)
        t0 = time.monotonic()
        r = run([*airflow, "dags", "test", DAG_ID, DAY], env=env, timeout=900)
        log(f"`airflow dags test {DAG_ID} {DAY}` exited 0 in {time.monotonic() - t0:.0f} s")
        states = run([*airflow, "dags", "list-runs", DAG_ID, "-o", "json"], env=env, timeout=300).stdout
        lines = [ln for ln in states.splitlines() if ln.startswith("[")]  # the JSON, after any log lines
        runs = json.loads(lines[-1]) if lines else []
        if [x.get("state") for x in runs] != ["success"]:
            failures.append(f"the DAG run is not a success: {runs} ({r.stdout[-500:]})")
        events = read_all(server.controller_uri)
        log(f"stream iot/readings: {len(events)} events; source: {len(source)} records")
        if sorted(events) != source:
            failures.append(f"the stream does not hold every source record exactly once "
                            f"({len(events)} events, {len(set(events))} distinct, {len(source)} records)")
    finally:
        server.stop()
    for failure in failures:
        log(f"FAILED: {failure}")
    if not failures:
        log("PASSED: the wheel's example ingest DAG ran end to end; every record is in the stream exactly once")
    return 1 if failures else 0


def read_all(uri: str) -> list[str]:
    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.client.batch import plan_segment_ranges, read_segment_range
    from airflow_provider_pravega.client.streamcut import StreamCut

    with PravegaClient(uri) as client:
        head, tail = StreamCut.head(client, "iot", "readings"), StreamCut.tail(client, "iot", "readings")
        return [e.payload.decode() for rng in plan_segment_ranges(client, head, tail)
                for e in read_segment_range(client, rng)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=sys.executable, help="interpreter of the fresh venv (3.10-3.13)")
    ap.add_argument("--work-dir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--inner", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        return inner(Path(args.inner))
    return outer(args)


if __name__ == "__main__":
    sys.exit(main())
