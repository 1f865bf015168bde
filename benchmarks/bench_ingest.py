"""Benchmark the exactly-once ingest through the Airflow operator against its baselines, in one run.

Run: ``.venv/bin/python benchmarks/bench_ingest.py [--events 1000000] [--files 10] [--repeat 3]
[--json PATH]``

Each repetition ingests the same ``--files`` JSON-lines files (``--events`` events of about 200 B,
routing key ``sensor_id``) into fresh streams of an embedded server running as its own process:

- baseline: the official client alone, this plain Python process reading the files and writing
  every line (routing key from the record) into transactions (one per file), committed;
- ``exactly_once``: ``PravegaTransactionalIngestOperator`` run by Airflow's own ``dag.test()``
  (a real task instance, connection ``pravega_default``, Spark local mode on every core with a
  warm SparkSession, as a worker that already ran a task has); the time is the task instance's
  duration (start to end of the task, so Airflow's task overhead is included);
- ``at_least_once``: the same operator with ``mode="at_least_once"``.

Targets (ingest issue): exactly-once >= 0.6 x the official client alone, and no slower than
1.15 x at-least-once (its rate >= 0.87 x the at-least-once rate). Driver memory must not grow with
the input: the driver's highest RSS sampled during exactly-once runs on a quarter of the input is
the baseline of the same during the full-input runs (target: full <= 1.2 x quarter). ``--json`` writes the result file of
``benchmarks/result_file.py``; the Airflow metadata DB is SQLite in a temporary AIRFLOW_HOME.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import result_file as rf  # noqa: E402

SPARK_CONF = {"spark.ui.showConsoleProgress": "false"}  # progress bars would garble the streamed output
STARTED = time.monotonic()


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


def official_baseline(uri: str, scope: str, stream: str, files: list[Path]) -> float:
    """Events/s of the official client alone: one transaction per file, committed."""
    import pravega_client

    mgr = pravega_client.StreamManager(uri)
    mgr.create_stream(scope, stream, 2)
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


def operator_ingest(stream: str, source: Path, mode: str, expected: int) -> tuple[float, float]:
    """(events/s, the driver's peak RSS in MB during the run) of one run of the operator through
    ``dag.test()``, timed by its task instance."""
    from airflow.sdk import DAG, task

    from airflow_provider_pravega.operators.ingest import PravegaTransactionalIngestOperator
    from pravega_testing.dag_test import run_dag

    summaries: list[dict[str, Any]] = []
    with DAG(dag_id=f"bench_ingest_{stream.replace('-', '_')}", schedule=None,
             start_date=datetime(2026, 1, 1, tzinfo=timezone.utc)) as dag:
        ingest = PravegaTransactionalIngestOperator(
            task_id="ingest", scope="bench", stream=stream, source=str(source), routing_key_field="sensor_id",
            mode=mode, create_stream=True, stream_segments=2, ingest_id=f"bench-{stream}", spark_conn_id=None,
        )

        @task
        def keep(summary: dict) -> None:
            summaries.append(summary)

        keep(ingest.output)

    with rf.PeakSampler(lambda: [os.getpid()], lambda _pid: "driver", interval=0.05) as driver:
        run = run_dag(dag)
    tis = {ti.task_id: ti for ti in run.get_task_instances()}
    states = {k: str(ti.state) for k, ti in tis.items()}
    if states != {"ingest": "success", "keep": "success"}:
        raise RuntimeError(f"ingest DAG {dag.dag_id} did not succeed: {states}")
    if not summaries or summaries[0]["events"] != expected:
        raise RuntimeError(f"{stream}: the operator reported {summaries and summaries[0]['events']} events, expected {expected}")
    ti = tis["ingest"]
    seconds = (ti.end_date - ti.start_date).total_seconds()
    return expected / seconds, driver.peaks["driver"]


def process_kind(server_pid: int) -> Any:
    me = os.getpid()

    def kind(pid: int) -> str | None:
        if pid == server_pid:
            return "server"
        if pid == me:
            return "driver (Airflow task + Spark driver, Python)"
        cmd = rf.cmdline(pid)
        if "java" in cmd.split(" ")[0]:
            return "Spark JVM"
        if "pyspark" in cmd or "python" in cmd:
            return "Spark Python workers (sum)"
        return None

    return kind


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="write the result file here")
    args = ap.parse_args()

    from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess

    work = Path(tempfile.mkdtemp(prefix="pravega-bench-ingest-", dir=".")).resolve()
    try:
        total = make_files(work / "in", args.events, args.files)
        quarter_files = max(1, args.files // 4)
        quarter = make_files(work / "quarter", args.events // 4 // quarter_files * quarter_files, quarter_files)
        size_mb = sum(p.stat().st_size for p in (work / "in").iterdir()) / 1e6
        log(f"{total:,} events in {args.files} files ({size_mb:.0f} MB, {size_mb * 1e6 / total:.0f} B/event) "
              f"under {work}")
        server = EmbeddedPravegaProcess(work / "server").start()
        try:
            airflow_env(work / "airflow", server.controller_uri)
            from airflow_provider_pravega.client import PravegaClient
            from airflow_provider_pravega.spark.session import get_spark_session
            from pravega_testing.dag_test import ensure_airflow_db

            ensure_airflow_db()
            log("Airflow metadata DB ready")
            t0 = time.perf_counter()
            get_spark_session(None, "bench-ingest", **SPARK_CONF)
            spark_start = time.perf_counter() - t0
            log(f"SparkSession started in {spark_start:.1f} s (once per worker process, not timed below)")
            with PravegaClient(server.controller_uri) as client:
                client.admin.create_scope("bench")
            files = sorted((work / "in").iterdir())
            sampler = rf.PeakSampler(lambda: [os.getpid(), *rf.children(os.getpid())], process_kind(server.pid))
            with sampler:
                # Warm-up on the quarter input: JIT, Python workers, the DB, the official client's runtime.
                official_baseline(server.controller_uri, "bench", "warm-official", sorted((work / "quarter").iterdir()))
                operator_ingest("warm", work / "quarter", "exactly_once", quarter)
                mem_quarter = []
                for i in range(args.repeat):
                    mem_quarter.append(operator_ingest(f"quarter-{i}", work / "quarter", "exactly_once", quarter)[1])
                log(f"warm-up and {args.repeat} ingests of {quarter:,} events done; driver peak RSS during them "
                    f"{', '.join(f'{m:.0f}' for m in mem_quarter)} MB")
                base, eo, alo, mem_full = [], [], [], []
                for i in range(args.repeat):
                    base.append(official_baseline(server.controller_uri, "bench", f"official-{i}", files))
                    rate, peak = operator_ingest(f"eo-{i}", work / "in", "exactly_once", total)
                    eo.append(rate)
                    mem_full.append(peak)
                    alo.append(operator_ingest(f"alo-{i}", work / "in", "at_least_once", total)[0])
                    log(f"run {i + 1}/{args.repeat}: official client alone {base[-1]:,.0f} ev/s; operator "
                        f"exactly-once {eo[-1]:,.0f} ev/s; at-least-once {alo[-1]:,.0f} ev/s; driver peak RSS "
                        f"{mem_full[-1]:.0f} MB")
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    figures = [
        rf.figure("exactly-once ingest (operator)", "events/s", eo,
                  baseline=("official client alone, transactions", base), target_ratio=0.6),
        rf.figure("exactly-once vs at-least-once (operator)", "events/s", eo,
                  baseline=("at-least-once ingest (operator)", alo), target_ratio=round(1 / 1.15, 2)),
        rf.figure("driver peak RSS, full input", "MB", mem_full, higher_is_better=False,
                  baseline=("driver peak RSS, 1/4 input", mem_quarter), target_ratio=1.2),
    ]
    notes = [
        f"{total:,} events of about {size_mb * 1e6 / total:.0f} B in {args.files} jsonl files; "
        f"operator runs are task-instance durations under dag.test() with a warm SparkSession "
        f"(start-up {spark_start:.0f} s, paid once per worker process, not included)",
        "exactly-once >= 0.87 x at-least-once is the issue's 'no slower than 1.15 x at-least-once'",
    ]
    notes.append("driver memory: the Python driver's (Airflow task + Spark driver) highest RSS sampled during each "
                 "exactly-once run of a quarter of the input and of all of it; holding events would raise the latter")
    data = rf.result("ingest", {"events": total, "files": args.files, "repeat": args.repeat,
                                "input_mb": round(size_mb, 1), "spark_startup_s": round(spark_start, 1)},
                     figures, sampler.peaks, notes)
    print()
    print(rf.format_table([data]))
    print(rf.format_peaks([data]))
    rf.write(args.json, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
