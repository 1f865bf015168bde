"""The end-to-end demo: the example pipeline on this machine, checked.

Run it with ``scripts/demo`` (which sets up .venv first). It

1. makes a work directory (``demo-work/``, or ``--work-dir``): an Airflow home on SQLite, the
   embedded Pravega server's data, and generated sample input (sensor readings, several days);
2. starts the embedded Pravega-compatible server on free loopback ports and points the
   ``pravega_default`` connection at it, and one stock Spark Connect server from pyspark's own jars
   (no plugin, 127.0.0.1, a free port; ``pravega_testing.spark_connect``) that the
   ``spark_connect_default`` connection and the example DAGs use (``--no-spark-connect``: a
   classic local session per task instead);
3. runs the example ingest DAG (``dags/pravega_exactly_once_ingest.py``) for every day with the real
   Airflow CLI (``airflow dags test``: its ingest task's Spark jobs run on the warm Connect server,
   which the demo checks in the task's log);
4. kills one day's run with SIGKILL after its commit point and runs that day again: the rerun
   recovers the crashed run and nothing is duplicated;
5. runs the example export DAG for every day when it is present (``dags/pravega_stream_cut_export.py``,
   on the same Connect server);
6. reads the stream back and prints a report: events per day in the stream vs in the source,
   duplicates, transaction states, exported files, throughput, the ingest task's seconds. It exits
   non-zero when any check fails, and leaves nothing running (also on a failure, Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from contextlib import ExitStack
from datetime import date, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INGEST_DAG = "pravega_exactly_once_ingest"
EXPORT_DAG = "pravega_stream_cut_export"
SCOPE, STREAM = "iot", "readings"


def log(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def airflow(env: dict[str, str], *args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "airflow", *args]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        tail = (r.stdout[-3000:] + "\n" + r.stderr[-3000:]).strip()
        raise SystemExit(f"`airflow {' '.join(args)}` failed with exit code {r.returncode}:\n{tail}")
    return r


def read_stream(uri: str, expected: int, timeout: float = 120) -> list[bytes]:
    """Every event of the stream, head to tail, read straight from the segment store with the
    provider's own client (works on every Python; the official client is not needed). Waits until
    ``expected`` events are there (commits may still be completing), then reads the whole stream
    once more, so a duplicate beyond the expected count is seen too."""
    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.client.batch import plan_segment_ranges, read_segment_range
    from airflow_provider_pravega.client.streamcut import StreamCut

    def read_all(client: PravegaClient) -> list[bytes]:
        head, tail = StreamCut.head(client, SCOPE, STREAM), StreamCut.tail(client, SCOPE, STREAM)
        return [e.payload for rng in plan_segment_ranges(client, head, tail) for e in read_segment_range(client, rng)]

    with PravegaClient(uri) as client:
        deadline = time.monotonic() + timeout
        got = read_all(client)
        while len(got) < expected and time.monotonic() < deadline:
            time.sleep(1.0)
            got = read_all(client)
        return got


def xcoms(env: dict[str, str], dag_id: str, task_id: str, day: str) -> list:
    """The return values of a task in every run for ``day``, oldest first (from the metadata DB)."""
    code = f"""
import json
from airflow.models.dagrun import DagRun
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session
with create_session() as s:
    runs = [r for r in s.query(DagRun).filter(DagRun.dag_id == {dag_id!r}) if str(r.logical_date.date()) == {day!r}]
    runs.sort(key=lambda r: r.start_date or r.logical_date)
    values = []
    for run in runs:
        row = s.query(XComModel).filter(XComModel.dag_id == {dag_id!r}, XComModel.run_id == run.run_id,
                                        XComModel.task_id == {task_id!r}, XComModel.key == "return_value").first()
        if row is not None:
            value = row.value
            while isinstance(value, (bytes, str)):
                value = json.loads(value)
            values.append(value)
    print(json.dumps(values))
"""
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return []
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="End-to-end demo of airflow-provider-pravega on this machine.")
    ap.add_argument("--work-dir", type=Path, default=REPO / "demo-work")
    ap.add_argument("--days", type=int, default=3)
    ap.add_argument("--files-per-day", type=int, default=4)
    ap.add_argument("--events-per-file", type=int, default=2500)
    ap.add_argument("--keep", action="store_true", help="keep the work directory afterwards")
    ap.add_argument("--no-spark-connect", dest="spark_connect", action="store_false",
                    help="no Spark Connect server: every Spark task starts its own classic local session")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(REPO))
    from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess
    from pravega_testing import spark_connect
    from pravega_testing.faults import fault_env

    # SIGTERM ends the demo as Ctrl-C does: through the `finally` below, which stops every server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    work = args.work_dir.resolve()
    if work.exists():
        shutil.rmtree(work)
    (work / "airflow").mkdir(parents=True)
    start = date(2026, 11, 1)
    days = [(start + timedelta(days=i)).isoformat() for i in range(args.days)]
    crash_day = (start + timedelta(days=args.days)).isoformat()  # one more day, run with a crash
    data = work / "data"
    subprocess.run([sys.executable, str(REPO / "scripts" / "generate_sample_data.py"), "--out", str(data / "incoming"),
                    "--start", days[0], "--days", str(args.days + 1), "--files-per-day", str(args.files_per_day),
                    "--events-per-file", str(args.events_per_file)], check=True)
    servers = ExitStack()
    server = EmbeddedPravegaProcess(work / "pravega").start()
    servers.callback(server.stop)
    log(f"embedded Pravega: controller {server.controller_uri}, segment store {server.segment_store_endpoint}")
    host, port = server.controller_uri.rsplit("//", 1)[1].rsplit(":", 1)
    connect = None
    try:
        if args.spark_connect:
            log("starting a stock Spark Connect server (pyspark's own jars, no plugin)")
            connect = servers.enter_context(spark_connect.running_server(
                work / "spark-connect.log", env={**os.environ, "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))},
                session_timeout=spark_connect.LONG_SESSION_TIMEOUT, worker_launcher=True))
            log(f"Spark Connect server: {connect.url} (pid {connect.pid}; connection {spark_connect.CONN_ID})")
    except BaseException:
        servers.close()
        raise
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(work / "airflow"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{work / 'airflow' / 'airflow.db'}",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_PRAVEGA_DEFAULT": json.dumps({"conn_type": "pravega", "host": host, "port": int(port)}),
        "PRAVEGA_EXAMPLES_DATA": str(data),
        "PRAVEGA_EXAMPLES_STALE_AFTER_S": "5",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    if connect is not None:
        env.update(spark_connect.example_dags_env(connect.port))
    failures: list[str] = []
    timings: dict[str, float] = {}
    ingest_s: dict[str, float] = {}  # the ingest task's own run (run_ingest), from its log
    written_here: set[str] = set()  # days the ingest task wrote without Spark (in_process_max_bytes)
    try:
        log("migrating the Airflow metadata DB (SQLite)")
        airflow(env, "db", "migrate")
        airflow(env, "dags", "reserialize")
        for day in days:
            log(f"ingest DAG for {day}")
            t0 = time.monotonic()
            r = airflow(env, "dags", "test", INGEST_DAG, day)
            timings[day] = time.monotonic() - t0
            ran = re.search(r"events \(\d+ bytes\) from \d+ file\(s\) in ([\d.]+) s", r.stdout + r.stderr)
            if ran:
                ingest_s[day] = float(ran.group(1))
            if "written by this process, without Spark" in r.stdout + r.stderr:
                written_here.add(day)  # a day under the ingest's in_process_max_bytes: no Spark needed
            elif connect is not None and f"connecting to Spark Connect server {connect.url}" not in r.stdout + r.stderr:
                failures.append(f"{day}: the ingest task did not use the Spark Connect server {connect.url}")
        log(f"ingest DAG for {crash_day}, killed with SIGKILL right after its commit point")
        r = airflow(fault_env(kill_at="after_commit_record", base=env), "dags", "test", INGEST_DAG, crash_day,
                    check=False)
        if r.returncode == 0:
            failures.append(f"the run for {crash_day} was supposed to be killed but finished")
        log(f"ingest DAG for {crash_day} again: it recovers the killed run (commits its transactions)")
        time.sleep(5)
        airflow(env, "dags", "test", INGEST_DAG, crash_day)
        log(f"ingest DAG for {days[0]} again (a backfill of an interval already ingested)")
        airflow(env, "dags", "test", INGEST_DAG, days[0])
        exported = 0
        if (REPO / "dags" / f"{EXPORT_DAG}.py").exists():
            for day in days + [crash_day]:
                log(f"export DAG for {day}")
                airflow(env, "dags", "test", EXPORT_DAG, day)
            exported = sum(1 for p in (data / "export").rglob("*") if p.is_file() and not p.name.startswith(("_", ".")))

        source = {day: (data / "incoming" / day) for day in days + [crash_day]}
        source_lines = {d: [ln for p in sorted(folder.glob("*.jsonl")) for ln in p.read_text().splitlines()]
                        for d, folder in source.items()}
        total = sum(len(v) for v in source_lines.values())
        log(f"reading the stream back ({total} events expected)")
        events = [e.decode() for e in read_stream(server.controller_uri, total)]
        counts = Counter(events)
        per_day = Counter(json.loads(e)["reading_id"][:10] for e in events)
        duplicates = sum(c - 1 for c in counts.values() if c > 1)

        print()
        print(f"{'day':12} {'source':>8} {'stream':>8} {'duplicates':>10} {'events/s':>9} {'task s':>7}  "
              f"runs of the ingest task")
        for day in days + [crash_day]:
            summaries = xcoms(env, INGEST_DAG, "ingest", day)
            committed = [set(v or []) for v in xcoms(env, INGEST_DAG, "wait_for_commit", day)]
            runs = []
            for summary in summaries:
                txns = summary.get("transaction_ids") or []
                done = sum(1 for t in txns if any(t in c for c in committed))
                what = f"{summary.get('events', 0)} events, {done}/{len(txns)} transactions COMMITTED"
                if not txns and summary.get("files_skipped"):
                    what = f"nothing new ({len(summary['files_skipped'])} files already ingested)"
                if summary.get("recovered_runs"):
                    what += f", recovered {len(summary['recovered_runs'])} killed run(s)"
                    if day != crash_day:
                        failures.append(f"{day}: a run 'recovered' {summary['recovered_runs']} although no run of "
                                        f"this ingest was killed before it")
                if summary.get("finished_runs"):
                    what += f", recorded {len(summary['finished_runs'])} earlier run(s) done"
                runs.append(what)
            if day == crash_day:
                runs.insert(0, "killed after its commit point")
            dups = sum(c - 1 for e, c in counts.items() if c > 1 and json.loads(e)["reading_id"].startswith(day))
            rate = max((s.get("events_per_second") or 0 for s in summaries), default=0)
            seconds = "/".join(f"{s['seconds']:.1f}" for s in summaries if s.get("seconds") is not None) or "-"
            print(f"{day:12} {len(source_lines[day]):>8} {per_day[day]:>8} {dups:>10} {rate:>9,.0f} {seconds:>7}  "
                  + "; ".join(runs))
            if per_day[day] != len(source_lines[day]):
                failures.append(f"{day}: {per_day[day]} events in the stream, {len(source_lines[day])} in the source")
        missing = set(ln for v in source_lines.values() for ln in v) - set(counts)
        print(f"\ntotal: {total} source records, {len(events)} events in {SCOPE}/{STREAM}, {duplicates} duplicates, "
              f"{len(missing)} missing")
        if exported:
            print(f"export: {exported} files under {data / 'export'}")
        if timings:
            spark = (f"the ingest's Spark jobs on the warm Spark Connect server {connect.url}" if connect is not None
                     else "a classic local Spark session started by each ingest task")
            if written_here:
                spark = (f"{len(written_here)} of the {len(timings)} days written by the ingest task itself, without "
                         f"Spark (under its in_process_max_bytes); the rest: {spark}")
            print(f"each daily DAG run took {min(timings.values()):.0f}-{max(timings.values()):.0f} s end to end "
                  f"(a new Airflow process each time; {spark}; task s above is the ingest task's own run, of "
                  f"the last run of the day)")
        if ingest_s:
            print(f"the ingest task's own run for a day of new files took {min(ingest_s.values()):.1f}-"
                  f"{max(ingest_s.values()):.1f} s")
        if duplicates:
            failures.append(f"{duplicates} duplicated events")
        if missing:
            failures.append(f"{len(missing)} source records missing from the stream")
    finally:
        servers.close()  # the Spark Connect server's whole process group, then Pravega
        if connect is not None:
            log(f"Spark Connect server stopped (pid {connect.pid})")
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("\nDEMO FAILED:\n- " + "\n- ".join(failures))
        return 1
    print("\nDEMO OK: every record of every day is in the stream exactly once, crash and backfill included.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
