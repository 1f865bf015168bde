"""Benchmark the exactly-once ingest through the Airflow operator against its baselines, on two input
shapes side by side in one run.

Run: ``.venv/bin/python benchmarks/bench_ingest.py [--events 600000] [--big-files 2]
[--small-files 400] [--repeat 3] [--json PATH]``

The same ``--events`` events of about 200 B (JSON lines, routing key ``sensor_id``) are written as
a few big files (``--big-files``) and as many small ones (``--small-files``). Each repetition
measures, against one embedded server running as its own process, into fresh streams:

- the server's own single-writer append limit: what ``benchmarks/bench_server.py`` measures (one
  official writer process, durable acknowledgements), with events of the ingest's mean size;
- then for each shape in turn:
  - the official client alone: this plain Python process reading the files and writing every line
    (routing key from the record) into transactions (one per file), committed;
  - ``exactly_once``: ``PravegaTransactionalIngestOperator`` run by Airflow's own ``dag.test()``
    (a real task instance, connection ``pravega_default``, Spark local mode on every core with a
    warm SparkSession, as a worker that already ran a task has); the time is the task instance's
    duration (start to end of the task, so Airflow's task overhead is included);
  - ``at_least_once``: the same operator with ``mode="at_least_once"``.

Each gives events/s and CPU-s per million events: the CPU of this process and all its descendants
(Spark's JVM and Python workers, the server, the spawned writer), beside the machine's busy CPU
from ``/proc/stat``. Each operator run also gives its Spark jobs, stages and tasks, counted by the
warm session's status tracker.

Targets (issue 49): on each shape, exactly-once >= 2.0 x the official client alone, or >= 0.8 x the
server's single-writer append rate; at-least-once >= exactly-once. Driver memory must not grow with
the input: on each shape, the driver's highest RSS sampled during exactly-once runs on the same
files at a quarter of their size is the baseline of the same during the full-input runs (target:
full <= 1.2 x quarter). ``--json`` writes the result file of ``benchmarks/result_file.py``; the
Airflow metadata DB is SQLite in a temporary AIRFLOW_HOME.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_server  # noqa: E402
import result_file as rf  # noqa: E402

SPARK_CONF = {"spark.ui.showConsoleProgress": "false"}  # progress bars would garble the streamed output
SEGMENTS = 2  # of every stream the benchmark writes
STARTED = time.monotonic()

# The targets.
OVER_OFFICIAL = 2.0  # exactly-once / the official client alone, or ...
OF_SERVER = 0.8  # ... exactly-once / the server's single-writer append rate
ALO_OVER_EO = 1.0  # at-least-once / exactly-once
DRIVER_GROWTH = 1.2  # driver peak RSS, full input / a quarter of it


def log(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:6.1f} s] {message}", flush=True)


def make_files(directory: Path, events: int, files: int) -> int:
    """``files`` JSON-lines files of sensor readings, about 200 bytes a line."""
    directory.mkdir(parents=True, exist_ok=True)
    per_file = events // files
    total = 0
    pad = "x" * 120
    for i in range(files):
        with open(directory / f"readings-{i:02d}.jsonl", "w") as fh:
            for n in range(per_file):
                fh.write(json.dumps({"sensor_id": f"sensor-{n % 1000:04d}", "ts": 1_700_000_000 + n, "file": i,
                                     "value": n * 0.25, "pad": pad}) + "\n")
                total += 1
    return total


@dataclass
class Shape:
    """One input shape: the same events as ``files`` files, at full size and at a quarter of it."""

    key: str
    label: str
    files: int
    full: Path
    quarter: Path
    events: int = 0
    quarter_events: int = 0
    input_mb: float = 0.0


class CpuSpan:
    """CPU-s between ``start()`` (entering calls it) and leaving: ``tree``, of this process and every
    descendant (``by_kind`` splits it), and ``machine``, the whole machine's busy CPU-s, which
    includes whatever else runs on it."""

    def __init__(self, kind: Callable[[int], str | None]) -> None:
        self.kind = kind
        self.tree = self.machine = 0.0
        self.by_kind: dict[str, float] = {}

    def start(self) -> None:
        self._machine0 = rf.machine_busy_cpu_s()
        self._tree0 = rf.tree_cpu_seconds(os.getpid(), self.kind)

    def __enter__(self) -> CpuSpan:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        tree = rf.tree_cpu_seconds(os.getpid(), self.kind)
        self.machine = rf.machine_busy_cpu_s() - self._machine0
        self.by_kind = {k: tree.get(k, 0.0) - self._tree0.get(k, 0.0) for k in tree.keys() | self._tree0.keys()}
        self.tree = sum(self.by_kind.values())


class SparkWork:
    """The Spark jobs, stages and tasks started while the block runs, from the warm session's status
    tracker: the jobs of a job group set in this thread (the one ``dag.test()`` runs the task in)
    and the jobs without a group that are new (started from another thread)."""

    def __init__(self, spark: Any, group: str) -> None:
        self.sc, self.group = spark.sparkContext, group
        self.jobs = self.stages = self.tasks = 0

    def __enter__(self) -> SparkWork:
        self._ungrouped = set(self.sc.statusTracker().getJobIdsForGroup(None))
        self.sc.setJobGroup(self.group, f"benchmark run {self.group}")
        return self

    def __exit__(self, *exc: object) -> None:
        for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
            self.sc.setLocalProperty(key, None)
        tracker = self.sc.statusTracker()
        jobs = set(tracker.getJobIdsForGroup(self.group)) | (set(tracker.getJobIdsForGroup(None)) - self._ungrouped)
        deadline = time.monotonic() + 30
        while True:  # the tracker follows Spark's events asynchronously: wait for every job's end
            infos = [tracker.getJobInfo(j) for j in jobs]
            if all(i is not None and i.status != "RUNNING" for i in infos) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        stage_ids = {s for i in infos if i is not None for s in i.stageIds}
        stages = [s for s in (tracker.getStageInfo(sid) for sid in stage_ids) if s is not None]
        ran = [s for s in stages if s.numCompletedTasks + s.numFailedTasks > 0]  # not the skipped ones
        self.jobs, self.stages = len(jobs), len(ran)
        self.tasks = sum(s.numCompletedTasks + s.numFailedTasks for s in ran)

    def text(self) -> str:
        return f"{self.jobs}/{self.stages}/{self.tasks}"


@dataclass
class Run:
    """One measured run: events/s, its CPU and, for the operator, the driver's peak RSS and its Spark work."""

    events: int
    rate: float
    cpu: CpuSpan
    rss_mb: float = 0.0
    work: SparkWork | None = None

    @property
    def cpu_per_million(self) -> float:
        return self.cpu.tree / self.events * 1e6


@dataclass
class Runs:
    """The runs of one kind (the official client, exactly-once, ...) on one shape."""

    runs: list[Run] = field(default_factory=list)

    def rates(self) -> list[float]:
        return [r.rate for r in self.runs]

    def cpu(self) -> list[float]:
        return [r.cpu_per_million for r in self.runs]

    def machine_cpu(self) -> list[float]:
        return [r.cpu.machine / r.events * 1e6 for r in self.runs]

    def rss(self) -> list[float]:
        return [r.rss_mb for r in self.runs]

    def breakdown(self) -> str:
        """Median CPU-s per million events by kind of process."""
        kinds = ("server", "Spark JVM", "Spark Python workers (sum)")
        rows = [{k: r.cpu.by_kind.get(k, 0.0) / r.events * 1e6 for k in kinds} for r in self.runs]
        for row, r in zip(rows, self.runs, strict=True):
            row["driver and the rest"] = r.cpu_per_million - sum(row.values())
        return ", ".join(f"{k} {statistics.median(row[k] for row in rows):.2f}" for k in rows[0]
                         if any(row[k] for row in rows))


def official_baseline(uri: str, scope: str, stream: str, files: list[Path]) -> float:
    """Events/s of the official client alone: one transaction per file, committed."""
    import pravega_client

    mgr = pravega_client.StreamManager(uri)
    mgr.create_stream(scope, stream, SEGMENTS)
    writer = mgr.create_transaction_writer(scope, stream, 1)
    n = 0
    t0 = time.perf_counter()
    for path in files:
        txn = writer.begin_txn()
        with open(path, "rb") as fh:
            for line in fh:
                line = line.rstrip(b"\n")
                txn.write_event_bytes(line, json.loads(line)["sensor_id"])
                n += 1
        txn.commit()
    return n / (time.perf_counter() - t0)


def airflow_env(home: Path, controller_uri: str) -> None:
    """A throw-away AIRFLOW_HOME with SQLite and ``pravega_default`` pointing at the server; must run
    before anything imports airflow."""
    if "airflow" in sys.modules:
        raise RuntimeError("airflow_env must run before airflow is imported")
    home.mkdir(parents=True, exist_ok=True)
    host, port = controller_uri.rsplit("//", 1)[1].rsplit(":", 1)
    os.environ.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "AIRFLOW_CONN_PRAVEGA_DEFAULT": json.dumps({"conn_type": "pravega", "host": host, "port": int(port)}),
    })
    os.environ.pop("AIRFLOW_CONFIG", None)


def operator_ingest(spark: Any, kind: Callable[[int], str | None], stream: str, source: Path, mode: str,
                    expected: int) -> Run:
    """One run of the operator through ``dag.test()``: its rate timed by its task instance, the CPU
    over all of ``dag.test()``, the driver's peak RSS during it and the Spark work it started."""
    from airflow.sdk import DAG, task

    from airflow_provider_pravega.operators.ingest import PravegaTransactionalIngestOperator
    from pravega_testing.dag_test import run_dag

    summaries: list[dict[str, Any]] = []
    with DAG(dag_id=f"bench_ingest_{stream.replace('-', '_')}", schedule=None,
             start_date=datetime(2026, 1, 1, tzinfo=timezone.utc)) as dag:
        ingest = PravegaTransactionalIngestOperator(
            task_id="ingest", scope="bench", stream=stream, source=str(source), routing_key_field="sensor_id",
            mode=mode, create_stream=True, stream_segments=SEGMENTS, ingest_id=f"bench-{stream}",
            spark_conn_id=None, in_process_max_bytes=0,  # through Spark at every size (a quarter is small)
        )

        @task
        def keep(summary: dict) -> None:
            summaries.append(summary)

        keep(ingest.output)

    with SparkWork(spark, f"bench-{stream}") as work, CpuSpan(kind) as cpu, \
            rf.PeakSampler(lambda: [os.getpid()], lambda _pid: "driver", interval=0.05) as driver:
        run = run_dag(dag)
    tis = {ti.task_id: ti for ti in run.get_task_instances()}
    states = {k: str(ti.state) for k, ti in tis.items()}
    if states != {"ingest": "success", "keep": "success"}:
        raise RuntimeError(f"ingest DAG {dag.dag_id} did not succeed: {states}")
    if not summaries or summaries[0]["events"] != expected:
        raise RuntimeError(f"{stream}: the operator reported {summaries and summaries[0]['events']} events, expected {expected}")
    ti = tis["ingest"]
    seconds = (ti.end_date - ti.start_date).total_seconds()
    return Run(expected, expected / seconds, cpu, driver.peaks["driver"], work)


def server_append_limit(uri: str, stream: str, events: int, size: int, kind: Callable[[int], str | None]) -> Run:
    """The server's single-writer append rate as ``bench_server.py`` measures it (one official writer
    process, window 1000, durable acknowledgements); CPU from the writer's release to its last ack."""
    with CpuSpan(kind) as cpu:
        rate = bench_server.write_rate(uri, "bench", stream, SEGMENTS, 1, events, size, released=cpu.start)
    return Run(events, rate, cpu)


def process_kind(server_pid: int) -> Callable[[int], str | None]:
    me = os.getpid()

    def kind(pid: int) -> str | None:
        if pid == server_pid:
            return "server"
        if pid == me:
            return "driver (Airflow task + Spark driver, Python)"
        cmd = rf.cmdline(pid)
        if "java" in cmd.split(" ")[0]:
            return "Spark JVM"
        if "resource_tracker" in cmd:  # multiprocessing's, idle
            return None
        if "multiprocessing" in cmd:
            return "official writer (spawned)"
        if "pyspark" in cmd or "python" in cmd:
            return "Spark Python workers (sum)"
        return None

    return kind


def target_lines(shapes: list[str], eo_official: list[dict], eo_server: list[dict], alo_eo: list[dict]) -> list[str]:
    """The issue's targets judged on the summaries (``rf.summarize``) of each shape's figures:
    a shape meets the exactly-once target by either ratio."""
    def ratios(summaries: list[dict]) -> str:
        return ", ".join(f"{name} {s['ratio']:.2f}" for name, s in zip(shapes, summaries, strict=True))

    eo_met = all(o["ratio"] >= OVER_OFFICIAL or s["ratio"] >= OF_SERVER
                 for o, s in zip(eo_official, eo_server, strict=True))
    alo_met = all(a["ratio"] >= ALO_OVER_EO for a in alo_eo)
    return [
        f"target exactly-once >= {OVER_OFFICIAL:g} x the official client alone ({ratios(eo_official)}) or >= "
        f"{OF_SERVER:g} x the server's single-writer append ({ratios(eo_server)}), on each shape: "
        f"{'met' if eo_met else 'missed'}",
        f"target at-least-once >= {ALO_OVER_EO:g} x exactly-once ({ratios(alo_eo)}): {'met' if alo_met else 'missed'}",
    ]


def main() -> int:
    rf.require_official_client()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=600_000, help="events of each shape")
    ap.add_argument("--big-files", type=int, default=2, help="files of the few-big-files shape")
    ap.add_argument("--small-files", type=int, default=400, help="files of the many-small-files shape")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="write the result file here")
    args = ap.parse_args()
    if args.events < 4 * max(args.big_files, args.small_files):
        ap.error("--events must give every file of the quarter input at least one event")

    from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess

    work = Path(tempfile.mkdtemp(prefix="pravega-bench-ingest-", dir=".")).resolve()
    shapes = [Shape("big", f"{args.big_files} big files", args.big_files, work / "big", work / "big-quarter"),
              Shape("small", f"{args.small_files} small files", args.small_files, work / "small",
                    work / "small-quarter")]
    server_runs = Runs()
    official = {s.key: Runs() for s in shapes}
    eo = {s.key: Runs() for s in shapes}
    alo = {s.key: Runs() for s in shapes}
    quarter = {s.key: Runs() for s in shapes}
    try:
        for s in shapes:
            s.events = make_files(s.full, args.events, s.files)
            s.quarter_events = make_files(s.quarter, args.events // 4, s.files)
            s.input_mb = sum(p.stat().st_size for p in s.full.iterdir()) / 1e6
            log(f"{s.label}: {s.events:,} events ({s.input_mb:.0f} MB, {s.input_mb * 1e6 / s.events:.0f} B/event); "
                f"a quarter of them in {s.files} files too")
        event_size = round(shapes[0].input_mb * 1e6 / shapes[0].events) - 1  # a line without its newline
        server = EmbeddedPravegaProcess(work / "server").start()
        try:
            airflow_env(work / "airflow", server.controller_uri)
            from airflow_provider_pravega.client import PravegaClient
            from airflow_provider_pravega.spark.session import get_spark_session
            from pravega_testing.dag_test import ensure_airflow_db

            ensure_airflow_db()
            log("Airflow metadata DB ready")
            t0 = time.perf_counter()
            spark = get_spark_session(None, "bench-ingest", **SPARK_CONF)
            spark_start = time.perf_counter() - t0
            log(f"SparkSession started in {spark_start:.1f} s (once per worker process, not timed below)")
            with PravegaClient(server.controller_uri) as client:
                client.admin.create_scope("bench")
            uri = server.controller_uri
            kind = process_kind(server.pid)
            sampler = rf.PeakSampler(lambda: [os.getpid(), *rf.children(os.getpid())], kind)
            with sampler:
                # Warm-up on the quarter inputs: JIT, Python workers, the DB, the official client's runtime.
                official_baseline(uri, "bench", "warm-official", sorted(shapes[0].quarter.iterdir()))
                for s in shapes:
                    operator_ingest(spark, kind, f"warm-{s.key}", s.quarter, "exactly_once", s.quarter_events)
                for i in range(args.repeat):
                    for s in shapes:
                        quarter[s.key].runs.append(operator_ingest(spark, kind, f"quarter-{s.key}-{i}", s.quarter,
                                                                   "exactly_once", s.quarter_events))
                log(f"warm-up and {args.repeat} exactly-once ingests of each quarter input done; driver peak RSS "
                    + "; ".join(f"{s.label} {', '.join(f'{m:.0f}' for m in quarter[s.key].rss())} MB" for s in shapes))
                for i in range(args.repeat):
                    server_runs.runs.append(server_append_limit(uri, f"server-{i}", args.events, event_size, kind))
                    r = server_runs.runs[-1]
                    log(f"run {i + 1}/{args.repeat}: server single-writer append {r.rate:,.0f} ev/s, "
                        f"{r.cpu_per_million:.2f} CPU-s/M events (machine {r.cpu.machine / r.events * 1e6:.2f})")
                    for s in shapes:
                        files = sorted(s.full.iterdir())
                        with CpuSpan(kind) as cpu:
                            rate = official_baseline(uri, "bench", f"official-{s.key}-{i}", files)
                        official[s.key].runs.append(Run(s.events, rate, cpu))
                        eo[s.key].runs.append(operator_ingest(spark, kind, f"eo-{s.key}-{i}", s.full, "exactly_once",
                                                              s.events))
                        alo[s.key].runs.append(operator_ingest(spark, kind, f"alo-{s.key}-{i}", s.full,
                                                               "at_least_once", s.events))
                        o, e, a = official[s.key].runs[-1], eo[s.key].runs[-1], alo[s.key].runs[-1]
                        log(f"run {i + 1}/{args.repeat}, {s.label}: official client alone {o.rate:,.0f} ev/s "
                            f"({o.cpu_per_million:.2f} CPU-s/M); operator exactly-once {e.rate:,.0f} ev/s "
                            f"({e.cpu_per_million:.2f} CPU-s/M, Spark jobs/stages/tasks {e.work.text()}); "
                            f"at-least-once {a.rate:,.0f} ev/s ({a.cpu_per_million:.2f} CPU-s/M, {a.work.text()}); "
                            f"driver peak RSS {e.rss_mb:.0f} MB")
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    server_name = "server's single-writer append"
    figures, eo_official, eo_server, alo_eo = [], [], [], []
    for s in shapes:  # names start with the shape: the chart's panel titles keep their first 40 characters
        k = s.key
        eo_name, alo_name = f"{s.label}: exactly-once (operator)", f"{s.label}: at-least-once (operator)"
        by_official = rf.figure(eo_name, "events/s", eo[k].rates(), target_ratio=OVER_OFFICIAL,
                                baseline=(f"{s.label}: official client alone, transactions", official[k].rates()))
        by_server = rf.figure(eo_name, "events/s", eo[k].rates(), baseline=(server_name, server_runs.rates()),
                              target_ratio=OF_SERVER)
        by_eo = rf.figure(alo_name, "events/s", alo[k].rates(), baseline=(eo_name, eo[k].rates()),
                          target_ratio=ALO_OVER_EO)
        figures += [
            by_official, by_server, by_eo,
            rf.figure(f"{s.label}: CPU of exactly-once (operator)", "CPU-s/M events", eo[k].cpu(),
                      higher_is_better=False, baseline=(f"{s.label}: official client alone", official[k].cpu())),
            rf.figure(f"{s.label}: CPU of at-least-once (operator)", "CPU-s/M events", alo[k].cpu(),
                      higher_is_better=False, baseline=(eo_name, eo[k].cpu())),
            rf.figure(f"{s.label}: driver peak RSS, exactly-once", "MB", eo[k].rss(), higher_is_better=False,
                      baseline=(f"{s.label} at 1/4 size: driver peak RSS", quarter[k].rss()),
                      target_ratio=DRIVER_GROWTH),
        ]
        eo_official.append(rf.summarize(by_official))
        eo_server.append(rf.summarize(by_server))
        alo_eo.append(rf.summarize(by_eo))
    figures.append(rf.figure(f"CPU of the {server_name}", "CPU-s/M events", server_runs.cpu(), higher_is_better=False))
    targets = target_lines([s.label for s in shapes], eo_official, eo_server, alo_eo)

    def med(values: list[float]) -> str:
        return f"{statistics.median(values):.2f}"

    operator = [(f"exactly-once, {s.label}", eo[s.key]) for s in shapes] + \
        [(f"at-least-once, {s.label}", alo[s.key]) for s in shapes]
    measured = operator + [(f"official client alone, {s.label}", official[s.key]) for s in shapes] + \
        [(server_name, server_runs)]
    findings = [
        "CPU-s/M events, median by process: " + "; ".join(f"{name}: {runs.breakdown()}" for name, runs in measured),
        "the machine's busy CPU-s/M events (/proc/stat, all processes, other work on the machine included), median: "
        + "; ".join(f"{name} {med(runs.machine_cpu())}" for name, runs in measured),
        "Spark jobs/stages/tasks of each operator run (the session's status tracker; stages and tasks that ran): "
        + "; ".join(f"{name}: {', '.join(r.work.text() for r in runs.runs)}" for name, runs in operator),
        *targets,
    ]
    notes = [
        "; ".join(f"{s.label}: {s.events:,} events of about {s.input_mb * 1e6 / s.events:.0f} B ({s.input_mb:.0f} MB) "
                  f"in {s.files} jsonl files" for s in shapes)
        + f"; {SEGMENTS} segments; the server's single writer appends {args.events:,} events of {event_size} B",
        f"operator runs are task-instance durations under dag.test() with a warm SparkSession (start-up "
        f"{spark_start:.0f} s, paid once per worker process, not included)",
        "CPU-s/M events = CPU-seconds per million events of the process tree (user + system, from /proc/<pid>/stat, "
        "each process with the children it waited for): this process (Airflow task + Spark driver, or the official "
        "client's loop), Spark's JVM and Python workers, the embedded server and the spawned writer; operator runs "
        "over all of dag.test(), the server's single writer from its release to its last acknowledgement",
        *findings,
        "driver memory: the Python driver's (Airflow task + Spark driver) highest RSS sampled during each "
        "exactly-once run of the same files at a quarter of their size and at full size; holding events would raise "
        "the latter",
    ]
    data = rf.result("ingest", {"events": args.events, "big_files": args.big_files, "small_files": args.small_files,
                                "repeat": args.repeat, "event_bytes": event_size, "segments": SEGMENTS,
                                "input_mb": {s.key: round(s.input_mb, 1) for s in shapes},
                                "spark_startup_s": round(spark_start, 1)},
                     figures, sampler.peaks, notes)
    print()
    print(rf.format_table([data]))
    print(rf.format_peaks([data]))
    print("\n".join(findings))
    rf.write(args.json, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
