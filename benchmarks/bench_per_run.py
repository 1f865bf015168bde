"""Seconds per scheduled run: what one daily ingest task costs, as a new Airflow task pays it (a
fresh process each time), for a day with new files and for a day with nothing new.

Run: ``python benchmarks/bench_per_run.py [--events 10000] [--repeat 3] [--backfill-days N] [--no-connect]
[--json PATH]``

Each sample runs the ingest job's command (what the operator runs in its task process) against the
embedded server, on one day of sample data (``--events`` readings in 4 files, routed by
``sensor_id`` as the example DAG does), side by side in one run:

* a day with new files by default: the day (a few MB) is under the ingest's ``in_process_max_bytes``,
  so the task's own process writes it, without Spark, though a Spark Connect connection is
  configured (the baseline: the same day through Spark in a new session of a stock Connect server,
  below, and in a classic local session). Every other sample is written through Spark (``--in-process-max-bytes 0``);
* a day with new files: a classic local Spark session ingests it into a fresh scope;
* the same day through Spark Connect in a new session of a stock server: pyspark's own jars with
  Spark's defaults throughout (its Python workers on plain Python, sessions ending after 60 idle
  minutes), started once by the benchmark and warmed by one uncounted ingest: what a daily run meets
  on a platform's endpoint;
* the same day through a warm local Spark Connect server with the settings of ``scripts/stack``'s
  (pyspark's own jars, no plugin, Spark's default SQL settings, its workers started through
  ``pravega-spark-python``, idle sessions kept for days; ``pravega_testing.spark_connect``), started
  once by the benchmark, warmed by one ingest that is not counted (a scheduled run meets a server that has been
  up for a while), and stopped at the end; each sample is a new process, as an Airflow task is, and
  joins the server-side session that the ingest's task processes share (``share_session``; see
  ``airflow_provider_pravega.spark.session``);
* the same through a new Connect session per process (``PRAVEGA_SPARK_CONNECT_SHARED_SESSION=false``,
  as every run was before, and what a run pays when the server has closed the shared session: its
  idle timeout, 60 min by default, e.g. a daily run): the server starts a Python daemon for it;
* a daily run through the shared session, kept by the server (``scripts/stack``'s server keeps idle
  sessions for days, ``spark_connect.LONG_SESSION_TIMEOUT``, and its tasks share one for a week):
  the sample waits until the server has stopped the session's idle Python workers (after 60 s of
  idleness, hard-coded in Spark), which is all that a day of idleness changes on such a server;
  its baseline is the new-session run above;
* the same day with a classic local session whose driver does not map the class archive
  (``pravega-spark-class-archive``, made by the benchmark before its first sample; this sample
  points ``PRAVEGA_SPARK_CLASS_ARCHIVE_DIR`` at an empty directory, with
  ``PRAVEGA_SPARK_CLASS_ARCHIVE=manual`` so that it makes none in the background): the baseline of
  the classic new day above, which maps it, as a host where the archive was made does;
* the same day again, nothing new (a backfill of a done day): local files are listed without Spark
  and no JVM starts, nor any Connect session. Its baseline is the same run listed through Spark, as
  every run was before (forced here by spelling the source as a ``file:`` URI with ``..``, which
  only Spark may list), in a classic local session and on the Connect server.

``--busy N``: also the warm day through the Connect server beside N CPU-bound processes (busy loops
the benchmark starts before the sample and stops after it): a machine shared with other work, each
busy process taking one core's worth of CPU from the servers and the task.

``--backfill-days N``: a backfill of N more days, a task process per day back to back (as Airflow
runs a backfill's tasks), through the Connect server and with a classic local session (issue 28:
a 30-day backfill >= 5x faster through the warm server).

For the Connect runs the server's own REST API (its UI on a loopback port) counts the Spark jobs,
stages and tasks of one new day's run; they are printed and kept in the result's notes.

Figures: the run's own seconds (``run_ingest``, from its summary; target for nothing new: <= 1 s)
and the whole process's wall seconds (Python's start and imports included). The Spark driver's JVM
is not a waited-for child of the process, so its CPU time escapes ``rusage``: the classic new-day
samples, with and without the class archive, also report the machine's busy CPU-s while they ran
(``/proc/stat``; the embedded server's share included, so run it on a quiet machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import result_file as rf  # noqa: E402

from airflow_provider_pravega.spark.ingest_spec import IN_PROCESS_MAX_BYTES_VARIABLE  # noqa: E402

DAY = "2026-11-01"
#: Spark stops a Python worker idle this long (PythonWorkerFactory, 60 s, not configurable), plus a margin.
IDLE_WORKERS_STOPPED_S = 65.0
INTERVAL = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"


def day_interval(day: str) -> str:
    """The daily interval starting at ``day`` (YYYY-MM-DD), as the example DAG's runs have it."""
    import datetime as dt

    start = dt.datetime.fromisoformat(day).replace(tzinfo=dt.timezone.utc)
    return f"{start.isoformat()}/{(start + dt.timedelta(days=1)).isoformat()}"


def ingest(uri: str, scope: str, source: str, remote: str | None = None, new_session: bool = False,
           interval: str = INTERVAL, env_extra: dict[str, str] | None = None,
           through_spark: bool = True) -> tuple[dict, float]:
    """One ingest task's process: (its summary, wall seconds). ``remote``: through that Spark Connect
    server, else a classic local session; ``new_session``: a new Connect session, not the shared one;
    ``env_extra``: more environment for the process; ``through_spark``: written by Spark whatever the
    day's size (``--in-process-max-bytes 0``), else as the ingest decides by default (a small day:
    by the task's own process). The summary gets the machine's busy CPU-s while it ran
    (``machine_cpu_s``)."""

    spark = ["--conf", f"spark.remote={remote}"] if remote else ["--master", "local[2]"]
    if through_spark:
        spark += ["--in-process-max-bytes", "0"]
    cmd = [sys.executable, "-m", "airflow_provider_pravega.spark.ingest_job", "--controller-uri", uri,
           "--scope", scope, "--stream", "readings", "--source", source, "--routing-key-field", "sensor_id",
           "--create-stream", "--ingest-id", "daily", "--interval", interval, *spark]
    t0 = time.perf_counter()
    env = dict(os.environ, PRAVEGA_SPARK_CONNECT_SHARED_SESSION="false" if new_session else "true",
               **(env_extra or {}))
    env.pop(IN_PROCESS_MAX_BYTES_VARIABLE, None)  # the ingest's own default, not a deployment's
    busy0 = rf.machine_busy_cpu_s()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    # The task's whole process tree (its JVM and Python workers in a classic session; not a Connect server's).
    with rf.PeakSampler(lambda: [proc.pid, *rf.children(proc.pid)], lambda _pid: "tree", interval=0.1) as rss:
        try:
            out, err = proc.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"ingest failed ({proc.returncode}):\n{err[-3000:]}")
    summary = json.loads(out.strip().splitlines()[-1])
    summary["machine_cpu_s"] = rf.machine_busy_cpu_s() - busy0
    summary["tree_rss_mb"] = rss.peaks.get("tree", 0.0)
    return summary, wall


@contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """``count`` CPU-bound processes (busy loops) while the block runs: a machine shared with other work."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _get(ui: str, path: str) -> list:
    with urllib.request.urlopen(f"{ui}/api/v1{path}", timeout=30) as resp:
        return json.load(resp)


def spark_work(ui: str, after_job: int) -> dict[str, int]:
    """Jobs, stages (run and skipped) and tasks the server ran after job ``after_job``."""
    app = _get(ui, "/applications")[0]["id"]
    jobs = [j for j in _get(ui, f"/applications/{app}/jobs") if j["jobId"] > after_job]
    stages = {sid for j in jobs for sid in j["stageIds"]}
    run = [st for st in _get(ui, f"/applications/{app}/stages") if st["stageId"] in stages and st["status"] != "SKIPPED"]
    return {"jobs": len(jobs), "stages": len(run), "skipped_stages": len(stages) - len(run),
            "tasks": sum(st["numTasks"] for st in run), "last_job": max([after_job] + [j["jobId"] for j in jobs])}


def run_backfills(uri: str, work: Path, events: int, days: int, remote: str) -> dict[str, float]:
    """A backfill of ``days`` new days, as Airflow runs one: a task process per day, back to back,
    through the Connect server and then with a classic local session: each way's total process
    seconds."""
    import datetime as dt

    first = dt.date.fromisoformat(DAY) + dt.timedelta(days=1)
    subprocess.run([sys.executable, str(ROOT / "scripts" / "generate_sample_data.py"), "--out", str(work),
                    "--start", first.isoformat(), "--days", str(days), "--files-per-day", "4",
                    "--events-per-file", str(events // 4)], check=True, capture_output=True)
    totals = {}
    for way, via in (("connect", remote), ("classic", None)):
        t0 = time.perf_counter()
        for n in range(days):
            day = (first + dt.timedelta(days=n)).isoformat()
            summary, _wall = ingest(uri, f"perrunbackfill{way}", str(work / day / "*.jsonl"), via,
                                    interval=day_interval(day))
            assert summary["events"] == events, summary
        totals[way] = time.perf_counter() - t0
        print(f"  backfill of {days} days, {way}: {totals[way]:.1f} s", flush=True)
    return totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000, help="readings in the day (4 files)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backfill-days", type=int, default=0,
                        help="also a backfill of this many days, one task process per day, classic vs Connect")
    parser.add_argument("--busy", type=int, default=0,
                        help="also the warm Connect day beside this many CPU-bound processes (a shared machine)")
    parser.add_argument("--no-connect", dest="connect", action="store_false",
                        help="classic local sessions only (no Spark Connect server)")
    parser.add_argument("--json", type=Path, default=None, help="write the result file here")
    args = parser.parse_args()
    from contextlib import ExitStack

    from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess
    from pravega_testing import spark_connect
    from pravega_testing.net import free_port

    new_day: list[tuple[float, float]] = []
    new_day_cpu: list[float] = []
    no_archive: list[tuple[float, float]] = []
    no_archive_cpu: list[float] = []
    nothing: list[tuple[float, float]] = []
    nothing_spark: list[tuple[float, float]] = []
    c_new_day: list[tuple[float, float]] = []
    c_new_session: list[tuple[float, float]] = []
    c_nothing_spark: list[tuple[float, float]] = []
    c_daily: list[tuple[float, float]] = []
    c_busy: list[tuple[float, float]] = []
    c_stock_new: list[tuple[float, float]] = []  # a new session on a server with Spark's defaults
    here: list[tuple[float, float]] = []  # the default for a small day: written by the task itself
    tree_rss: dict[str, list[float]] = {}  # peak RSS (MB) of the task's process tree, by sample kind
    work: dict[str, int] = {}
    backfill: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-per-run-") as tmp:
        data = Path(tmp) / "incoming"
        subprocess.run([sys.executable, str(ROOT / "scripts" / "generate_sample_data.py"), "--out", str(data),
                        "--start", DAY, "--days", "1", "--files-per-day", "4",
                        "--events-per-file", str(args.events // 4)], check=True, capture_output=True)
        day = data / DAY
        local = str(day / "*.jsonl")
        via_spark = f"file://{day}/../{DAY}/*.jsonl"  # the same files; only Spark may list this spelling
        from airflow_provider_pravega.spark import class_archive

        t0 = time.perf_counter()
        archive = class_archive.build()
        print(f"  class archive {archive} ready in {time.perf_counter() - t0:.1f} s", flush=True)
        no_archive_env = {class_archive.DIR_VARIABLE: str(Path(tmp) / "no-class-archive"),
                          class_archive.MODE_VARIABLE: "manual"}
        server = EmbeddedPravegaProcess(Path(tmp) / "pravega", extra_args=["--no-fsync"]).start()
        try:
            servers = ExitStack()
            remote = ui = None
            if args.connect:
                t0 = time.perf_counter()
                connect = servers.enter_context(spark_connect.running_server(
                    Path(tmp) / "spark-connect.log", ui_port=free_port(),
                    session_timeout=spark_connect.LONG_SESSION_TIMEOUT, worker_launcher=True))
                remote, ui = connect.url, connect.ui_url
                print(f"  Spark Connect server {remote} up in {time.perf_counter() - t0:.1f} s; warming it with one "
                      f"ingest (not counted)", flush=True)
                summary, wall = ingest(server.controller_uri, "perrunwarm", local, remote)
                assert summary["events"] == args.events, summary
                print(f"  warm-up ingest: run {summary['seconds']:.2f} s (process {wall:.1f} s)", flush=True)
                t0 = time.perf_counter()
                stock = servers.enter_context(spark_connect.running_server(
                    Path(tmp) / "spark-connect-stock.log", ui_port=free_port()))  # Spark's defaults throughout
                summary, wall = ingest(server.controller_uri, "perrunstockwarm", local, stock.url, new_session=True)
                assert summary["events"] == args.events, summary
                print(f"  a stock Spark Connect server {stock.url} (Spark's defaults, its workers on plain Python) up "
                      f"in {time.perf_counter() - t0 - wall:.1f} s; its first ingest (not counted): run "
                      f"{summary['seconds']:.2f} s", flush=True)
        except BaseException:
            server.stop()
            raise
        try:
            for n in range(args.repeat):
                scope = f"perrun{n}"
                summary, wall = ingest(server.controller_uri, scope, local)
                tree_rss.setdefault("classic, the class archive mapped", []).append(summary["tree_rss_mb"])
                assert summary["events"] == args.events, summary
                new_day.append((summary["seconds"], wall))
                new_day_cpu.append(summary["machine_cpu_s"])
                summary, wall = ingest(server.controller_uri, f"perrunnoarchive{n}", local, env_extra=no_archive_env)
                tree_rss.setdefault("classic, no class archive", []).append(summary["tree_rss_mb"])
                assert summary["events"] == args.events, summary
                no_archive.append((summary["seconds"], wall))
                no_archive_cpu.append(summary["machine_cpu_s"])
                # Nothing new, alternating the two ways, so a change in the machine's load hits both.
                for way, source, out in (("no JVM", local, nothing), ("listed by Spark", via_spark, nothing_spark)):
                    summary, wall = ingest(server.controller_uri, scope, source)
                    tree_rss.setdefault(f"nothing new, {way}", []).append(summary["tree_rss_mb"])
                    assert summary["run_id"] is None and summary.get("files_skipped"), summary
                    out.append((summary["seconds"], wall))
                print(f"  round {n + 1}: new day {new_day[-1][0]:.2f} s (process {new_day[-1][1]:.1f} s, machine "
                      f"{new_day_cpu[-1]:.1f} CPU-s; without the class archive {no_archive[-1][0]:.2f} s, process "
                      f"{no_archive[-1][1]:.1f} s, {no_archive_cpu[-1]:.1f} CPU-s); nothing "
                      f"new: no JVM {nothing[-1][0]:.2f} s (process {nothing[-1][1]:.1f} s), listed by Spark "
                      f"{nothing_spark[-1][0]:.2f} s (process {nothing_spark[-1][1]:.1f} s)", flush=True)
                summary, wall = ingest(server.controller_uri, f"perrunhere{n}", local, remote, new_session=True,
                                       through_spark=False)
                tree_rss.setdefault("by default: written by the task itself", []).append(summary["tree_rss_mb"])
                assert summary["events"] == args.events, summary
                here.append((summary["seconds"], wall))
                print(f"  round {n + 1}: new day by default (written by the task's own process, a "
                      f"{'Spark Connect' if remote else 'classic'} connection configured): {here[-1][0]:.2f} s "
                      f"(process {here[-1][1]:.1f} s)", flush=True)
                if remote is None:
                    continue
                scope = f"perrunconnect{n}"
                before = spark_work(ui, -1)["last_job"]
                summary, wall = ingest(server.controller_uri, scope, local, remote)
                tree_rss.setdefault("stock Connect server, shared session", []).append(summary["tree_rss_mb"])
                assert summary["events"] == args.events, summary
                c_new_day.append((summary["seconds"], wall))
                work = spark_work(ui, before)
                summary, wall = ingest(server.controller_uri, scope, via_spark, remote)
                tree_rss.setdefault("nothing new, listed by Spark on the Connect server", []).append(summary["tree_rss_mb"])
                assert summary["run_id"] is None and summary.get("files_skipped"), summary
                c_nothing_spark.append((summary["seconds"], wall))
                last_shared = time.monotonic()
                summary, wall = ingest(server.controller_uri, f"perrunstock{n}", local, stock.url, new_session=True)
                tree_rss.setdefault("stock Connect server (Spark's defaults), new session", []).append(
                    summary["tree_rss_mb"])
                assert summary["events"] == args.events, summary
                c_stock_new.append((summary["seconds"], wall))
                summary, wall = ingest(server.controller_uri, f"perrunfresh{n}", local, remote, new_session=True)
                tree_rss.setdefault("stock Connect server, new session", []).append(summary["tree_rss_mb"])
                assert summary["events"] == args.events, summary
                c_new_session.append((summary["seconds"], wall))
                # A daily run: the shared session is still there, its idle Python workers are not.
                time.sleep(max(0.0, last_shared + IDLE_WORKERS_STOPPED_S - time.monotonic()))
                summary, wall = ingest(server.controller_uri, f"perrundaily{n}", local, remote)
                tree_rss.setdefault("the session a long-running server keeps", []).append(summary["tree_rss_mb"])
                assert summary["events"] == args.events, summary
                c_daily.append((summary["seconds"], wall))
                if args.busy:
                    with busy_processes(args.busy):
                        summary, wall = ingest(server.controller_uri, f"perrunbusy{n}", local, remote)
                        tree_rss.setdefault("stock Connect server, beside busy processes", []).append(summary["tree_rss_mb"])
                    assert summary["events"] == args.events, summary
                    c_busy.append((summary["seconds"], wall))
                print(f"  round {n + 1}, warm Spark Connect server: new day {c_new_day[-1][0]:.2f} s (process "
                      f"{c_new_day[-1][1]:.1f} s; {work['jobs']} jobs, {work['stages']} stages run + "
                      f"{work['skipped_stages']} skipped, {work['tasks']} tasks); nothing new listed by Spark "
                      f"{c_nothing_spark[-1][0]:.2f} s (process {c_nothing_spark[-1][1]:.1f} s); a stock server's new "
                      f"session {c_stock_new[-1][0]:.2f} s (process {c_stock_new[-1][1]:.1f} s); new day in a new "
                      f"session {c_new_session[-1][0]:.2f} s (process {c_new_session[-1][1]:.1f} s); a daily run "
                      f"in the kept session {c_daily[-1][0]:.2f} s (process {c_daily[-1][1]:.1f} s)"
                      + (f"; beside {args.busy} busy process(es) {c_busy[-1][0]:.2f} s (process {c_busy[-1][1]:.1f} s)"
                         if c_busy else ""), flush=True)
            if args.backfill_days and remote is not None:
                backfill = run_backfills(server.controller_uri, Path(tmp) / "backfill", args.events,
                                         args.backfill_days, remote)
        finally:
            servers.close()
            server.stop()

    def med(rows: list[tuple[float, float]], i: int) -> float:
        return statistics.median(r[i] for r in rows)

    print(f"a day of {args.events:,} readings, classic local session: run {med(new_day, 0):.2f} s, process "
          f"{med(new_day, 1):.1f} s, {statistics.median(new_day_cpu):.1f} CPU-s of the machine; without the class "
          f"archive: run {med(no_archive, 0):.2f} s, process {med(no_archive, 1):.1f} s, "
          f"{statistics.median(no_archive_cpu):.1f} CPU-s")
    print(f"a day of {args.events:,} readings by default (written by the task's own process, no Spark): run "
          f"{med(here, 0):.2f} s, process {med(here, 1):.1f} s")
    print(f"nothing new: run {med(nothing, 0):.2f} s without a JVM vs {med(nothing_spark, 0):.2f} s listed by Spark "
          f"(target <= 1 s); process {med(nothing, 1):.1f} s vs {med(nothing_spark, 1):.1f} s")
    connect_figures = []
    notes = ["each sample is a fresh ingest process (as an Airflow task); run seconds come from its summary"]
    if c_new_day:
        print(f"a day of {args.events:,} readings, warm Spark Connect server: run {med(c_new_day, 0):.2f} s "
              f"(target <= 2 s), process {med(c_new_day, 1):.1f} s; nothing new listed by Spark there: run "
              f"{med(c_nothing_spark, 0):.2f} s; a new day in a new Connect session (before, or after the server's "
              f"idle timeout): run {med(c_new_session, 0):.2f} s; a daily run in the session a long-running server "
              f"keeps (its idle Python workers stopped): run {med(c_daily, 0):.2f} s (target <= 2 s)"
              + (f"; beside {args.busy} busy process(es): run {med(c_busy, 0):.2f} s (target <= 2 s)" if c_busy else ""))
        connect_figures = [
            rf.figure(f"a day of {args.events:,} readings by default, a Spark Connect connection configured: "
                      f"written by the task's own process (in_process_max_bytes), no Spark: run seconds", "s",
                      [r[0] for r in here], higher_is_better=False,
                      baseline=("through Spark on a stock Connect server (Spark's defaults), a new session (a daily "
                                "run after its 60-minute session timeout)", [r[0] for r in c_stock_new]), target=2.0),
            rf.figure(f"a day of {args.events:,} readings by default (written by the task's own process): process "
                      f"seconds", "s", [r[1] for r in here], higher_is_better=False,
                      baseline=("through Spark on a stock Connect server, a new session", [r[1] for r in c_stock_new])),
            rf.figure(f"a day of {args.events:,} readings, warm local Spark Connect server: run seconds", "s",
                      [r[0] for r in c_new_day], higher_is_better=False,
                      baseline=("classic local session", [r[0] for r in new_day]), target=2.0),
            rf.figure(f"a day of {args.events:,} readings through Spark, a new session of the server with the "
                      f"stack's settings (its workers through pravega-spark-python): run seconds", "s",
                      [r[0] for r in c_new_session], higher_is_better=False,
                      baseline=("a new session of a stock server (Spark's defaults)", [r[0] for r in c_stock_new])),
            rf.figure(f"a day of {args.events:,} readings, warm Spark Connect server, shared session vs a new "
                      f"session per task: run seconds", "s", [r[0] for r in c_new_day], higher_is_better=False,
                      baseline=("a new Connect session per task (before; a run after the server's idle timeout)",
                                [r[0] for r in c_new_session]), target=2.0),
            rf.figure(f"a daily run of {args.events:,} readings in the session the server keeps (its idle Python "
                      f"workers stopped): run seconds", "s", [r[0] for r in c_daily], higher_is_better=False,
                      baseline=("a new session (a server closing idle sessions after 60 min, Spark's default)",
                                [r[0] for r in c_new_session]), target=2.0),
            *([rf.figure(f"a day of {args.events:,} readings, warm Spark Connect server, beside {args.busy} CPU-bound "
                         f"process(es) (a shared machine): run seconds", "s", [r[0] for r in c_busy],
                         higher_is_better=False, baseline=("the same on the quiet machine", [r[0] for r in c_new_day]),
                         target=2.0)] if c_busy else []),
            rf.figure(f"a day of {args.events:,} readings, warm local Spark Connect server: process seconds", "s",
                      [r[1] for r in c_new_day], higher_is_better=False,
                      baseline=("classic local session", [r[1] for r in new_day])),
            rf.figure("nothing new, listed by Spark on the warm Spark Connect server: run seconds", "s",
                      [r[0] for r in c_nothing_spark], higher_is_better=False,
                      baseline=("listed by Spark, classic local session", [r[0] for r in nothing_spark]),
                      target=1.0),
        ]
        notes += [
            "Spark Connect: a stock local server (pyspark's own jars, no plugin, default SQL settings), started "
            "once and warmed by one uncounted ingest; every sample is a new process; the shared-session samples "
            "join the server-side session the ingest's tasks share (the warm-up opened it), the new-session "
            "samples open their own (PRAVEGA_SPARK_CONNECT_SHARED_SESSION=false)",
            f"Spark Connect, one new day's run: {work['jobs']} jobs, {work['stages']} stages run (+ "
            f"{work['skipped_stages']} skipped), {work['tasks']} tasks (the server's REST API)",
            "nothing new without a JVM: the same with a Spark Connect connection (no session is opened)",
        ]
        if backfill:
            days = args.backfill_days
            print(f"a backfill of {days} days ({args.events:,} readings each, one task process per day, back to "
                  f"back): {backfill['connect']:.1f} s through the warm Connect server vs {backfill['classic']:.1f} s "
                  f"with a classic local session per task: {backfill['classic'] / backfill['connect']:.1f}x faster "
                  f"(target >= 5x)")
            connect_figures.append(rf.figure(
                f"a backfill of {days} days, one task process per day: process seconds in all, warm Connect server",
                "s", [backfill["connect"]], higher_is_better=False,
                baseline=("a classic local session per task", [backfill["classic"]]),
                target_ratio=0.2))  # >= 5x faster
            notes.append(f"backfill: {days} days of {args.events:,} readings, each day a new ingest process with its "
                         f"own interval, run back to back into one stream (the same ingest id), first through the "
                         f"warm Connect server, then with a classic local session; target: >= 5x faster")
    else:
        notes.append("no Spark Connect figures (--no-connect)")
    peaks = {kind: statistics.median(values) for kind, values in tree_rss.items()}
    print("peak RSS of the task's process tree, median: " + ", ".join(f"{k} {v:,.0f} MB" for k, v in peaks.items()))
    notes.append("peak RSS: of the task's process tree (the task, and in a classic session its driver JVM and "
                 "Python workers; not a Connect server's processes), sampled every 0.1 s, median of the samples")
    rf.write(args.json, rf.result(
        "per_run",
        {"events": args.events, "repeat": args.repeat, "connect": bool(c_new_day)},
        [
            rf.figure("nothing new (a done day again): run seconds, no JVM", "s", [r[0] for r in nothing],
                      higher_is_better=False, baseline=("listed by Spark (before)", [r[0] for r in nothing_spark]),
                      target=1.0),
            rf.figure("nothing new: process seconds (Python start included), no JVM", "s", [r[1] for r in nothing],
                      higher_is_better=False, baseline=("listed by Spark (before)", [r[1] for r in nothing_spark])),
            rf.figure(f"a day of {args.events:,} readings by default (written by the task's own process, no "
                      f"Spark): run seconds", "s", [r[0] for r in here], higher_is_better=False,
                      baseline=("through Spark, classic local session (the class archive mapped)",
                                [r[0] for r in new_day]), target=5.0),
            rf.figure(f"a day of {args.events:,} readings, classic local session (the class archive mapped): run "
                      f"seconds", "s", [r[0] for r in new_day], higher_is_better=False,
                      baseline=("without the class archive", [r[0] for r in no_archive])),
            rf.figure(f"a day of {args.events:,} readings, classic local session (the class archive mapped): "
                      f"process seconds", "s", [r[1] for r in new_day], higher_is_better=False,
                      baseline=("without the class archive", [r[1] for r in no_archive])),
            rf.figure(f"a day of {args.events:,} readings, classic local session (the class archive mapped): the "
                      f"machine's busy CPU-s (embedded server included)", "CPU-s", new_day_cpu,
                      higher_is_better=False, baseline=("without the class archive", no_archive_cpu)),
            *connect_figures,
        ],
        peak_rss_mb=peaks,
        notes=notes,
    ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
