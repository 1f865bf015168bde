"""Ingest from data lakes (issue #16 item 8): the driver's cost flat in the bytes ingested, and
ingest from ``s3a://`` next to ingest from the local disk.

1. Driver cost: the ingest job's command line (``python -m airflow_provider_pravega.spark.ingest_job``,
   local mode) ingests ``--files`` jsonl files of ``--small-mb`` MB in all, then the same number of
   files of ``--large-mb`` MB (target: large <= 1.2 x small for both figures). "Driver" is the
   Python driver process, what the provider runs (listing, file identities, the ingest state,
   transactions, the commit): its CPU-seconds (user + system, from /proc/<pid>/stat of the exited,
   not yet reaped process, so its children are not included) and its peak RSS (VmHWM, sampled
   until it exits). Spark's JVM (driver and, in local mode, the executors) and the Python workers
   that read and write the records are other processes and are not counted: their work grows with
   the data by design; their peak RSS is reported per process kind.
2. s3a vs local: the same ``--events`` events in ``--files`` files ingested from moto's S3 server
   (in this process, ``pravega_testing.object_store``) through ``s3a://`` with
   ``hadoop-aws``, and from the local disk (``file://``), alternating; events/s over each run's
   write phase (from the job's "ingesting N file(s)" log line to its last: reading the files,
   writing, committing; the session start and listing, a fixed cost, are left out).

``--json`` writes the result file of ``benchmarks/result_file.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import result_file as rf  # noqa: E402

STARTED = time.monotonic()
ROOT = Path(__file__).resolve().parents[1]


def log(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:6.1f} s] {message}", flush=True)


def make_files(directory: Path, total_mb: float, files: int, event_bytes: int) -> int:
    """``files`` jsonl files of ``total_mb`` MB in all, lines of about ``event_bytes`` bytes
    (written in blocks: the records need not differ). Returns the number of events."""
    directory.mkdir(parents=True, exist_ok=True)
    per_file = max(1, int(total_mb * 1e6 / files / event_bytes))
    block_lines = min(per_file, 1000)
    pad = "x" * max(0, event_bytes - 80)
    block = "".join(json.dumps({"sensor_id": f"sensor-{n % 97:03d}", "n": n, "pad": pad}) + "\n"
                    for n in range(block_lines))
    for i in range(files):
        with open(directory / f"part-{i:03d}.jsonl", "w") as fh:
            for _ in range(per_file // block_lines):
                fh.write(block)
            fh.write("".join(block.splitlines(True)[: per_file % block_lines]))
    return per_file * files


def write_phase_seconds(log_path: Path) -> float:
    """Seconds from the job's "ingesting N file(s)" log line to its "N events ... in" line."""
    from datetime import datetime

    def when(line: str) -> datetime:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")

    lines = log_path.read_text().splitlines()
    start = next(when(line) for line in lines if ": ingesting " in line)
    end = next(when(line) for line in lines if " events (" in line and " file(s) in " in line)
    return (end - start).total_seconds()


def run_ingest(controller_uri: str, stream: str, source: str, log_path: Path,
               conf: dict[str, str] | None = None) -> dict[str, Any]:
    """One run of the ingest job's command line; its result, the Python driver's CPU-seconds and
    peak RSS, and the peak RSS of its descendants by kind."""
    cmd = [sys.executable, "-m", "airflow_provider_pravega.spark.ingest_job", "--controller-uri", controller_uri,
           "--scope", "bench", "--stream", stream, "--source", source, "--routing-key-field", "sensor_id",
           "--create-stream", "--segments", "2", "--conf", "spark.ui.showConsoleProgress=false"]
    for key, value in (conf or {}).items():
        cmd += ["--conf", f"{key}={value}"]
    out_path = log_path.with_suffix(".out")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    with out_path.open("w") as out, log_path.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=ROOT)
    peaks: dict[str, float] = {}
    driver_hwm = [0.0]
    done = threading.Event()

    def kind(pid: int) -> str:
        return "Spark JVM" if "java" in rf.cmdline(pid).split(" ")[0] else "Spark Python workers (sum)"

    def sample() -> None:
        while not done.is_set():
            driver_hwm[0] = max(driver_hwm[0], rf.rss_mb(proc.pid)[1])
            total: dict[str, float] = {}
            for pid in rf.children(proc.pid):
                total[kind(pid)] = total.get(kind(pid), 0.0) + rf.rss_mb(pid)[0]
            for k, mb in total.items():
                peaks[k] = max(peaks.get(k, 0.0), mb)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: /proc still has its times
        cpu = rf.proc_cpu_seconds(proc.pid)
    finally:
        done.set()
        sampler.join()
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
    if code != 0:
        raise RuntimeError(f"ingest of {source} failed (exit {code}):\n{log_path.read_text()[-3000:]}")
    result = json.loads(out_path.read_text().strip().splitlines()[-1])
    return {"result": result, "cpu_s": cpu, "rss_mb": driver_hwm[0], "peaks": peaks}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=300_000, help="events of the s3a vs local comparison")
    ap.add_argument("--files", type=int, default=8, help="files of every input")
    ap.add_argument("--small-mb", type=float, default=100)
    ap.add_argument("--large-mb", type=float, default=2000)
    ap.add_argument("--event-bytes", type=int, default=2000, help="line size of the driver-cost inputs")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="write the result file here")
    args = ap.parse_args()

    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server logs every request
    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess
    from pravega_testing.object_store import object_store_server

    work = Path(tempfile.mkdtemp(prefix="pravega-bench-lake-", dir=ROOT)).resolve()
    peaks: dict[str, float] = {}
    try:
        small = make_files(work / "small", args.small_mb, args.files, args.event_bytes)
        large = make_files(work / "large", args.large_mb, args.files, args.event_bytes)
        small_mb = sum(p.stat().st_size for p in (work / "small").iterdir()) / 1e6
        large_mb = sum(p.stat().st_size for p in (work / "large").iterdir()) / 1e6
        lake = make_files(work / "lake", args.events * 200 / 1e6, args.files, 200)
        log(f"inputs: {small:,} events / {small_mb:,.0f} MB and {large:,} events / {large_mb:,.0f} MB in "
            f"{args.files} files each; {lake:,} events of 200 B for s3a vs local")
        server = EmbeddedPravegaProcess(work / "server").start()
        try:
            uri = server.controller_uri
            with PravegaClient(uri) as client:
                client.admin.create_scope("bench")
            cpu_small, cpu_large, rss_small, rss_large = [], [], [], []

            def keep_peaks(run: dict[str, Any]) -> None:
                peaks["driver (Python)"] = max(peaks.get("driver (Python)", 0.0), run["rss_mb"])
                for k, v in run["peaks"].items():
                    peaks[k] = max(peaks.get(k, 0.0), v)

            for i in range(args.repeat):
                for name, events, cpus, rsss in (("small", small, cpu_small, rss_small),
                                                 ("large", large, cpu_large, rss_large)):
                    run = run_ingest(uri, f"{name}-{i}", f"file://{work / name}/*.jsonl", work / f"{name}-{i}.log")
                    if run["result"]["events"] != events:
                        raise RuntimeError(f"{name}: ingested {run['result']['events']} events, expected {events}")
                    cpus.append(run["cpu_s"])
                    rsss.append(run["rss_mb"])
                    keep_peaks(run)
                    log(f"{name} run {i + 1}/{args.repeat}: {events:,} events in {run['result']['seconds']:.1f} s; "
                        f"Python driver {run['cpu_s']:.2f} CPU-s, peak RSS {run['rss_mb']:.0f} MB")
                    # Keep the disk for the next input: the large stream is gigabytes.
                    with PravegaClient(uri) as client:
                        client.admin.seal_stream("bench", f"{name}-{i}")
                        client.admin.delete_stream("bench", f"{name}-{i}")

            s3_rates, local_rates = [], []
            with object_store_server() as s3:
                s3.client.create_bucket(Bucket="bench")
                for path in sorted((work / "lake").iterdir()):
                    s3.client.upload_file(str(path), "bench", f"in/{path.name}")
                conf = s3.spark_conf()
                for i in range(args.repeat):
                    run = run_ingest(uri, f"s3a-{i}", "s3a://bench/in/*.jsonl", work / f"s3a-{i}.log", conf)
                    s3_rates.append(lake / write_phase_seconds(work / f"s3a-{i}.log"))
                    keep_peaks(run)
                    run = run_ingest(uri, f"local-{i}", f"file://{work / 'lake'}/*.jsonl", work / f"local-{i}.log")
                    local_rates.append(lake / write_phase_seconds(work / f"local-{i}.log"))
                    keep_peaks(run)
                    log(f"run {i + 1}/{args.repeat}: s3a {s3_rates[-1]:,.0f} events/s, local disk "
                        f"{local_rates[-1]:,.0f} events/s")
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    ratio = f"{large_mb / small_mb:.0f}x"
    figures = [
        rf.figure(f"driver CPU, {large_mb:,.0f} MB input", "CPU-s", cpu_large, higher_is_better=False,
                  baseline=(f"driver CPU, {small_mb:,.0f} MB input", cpu_small), target_ratio=1.2),
        rf.figure(f"driver peak RSS, {large_mb:,.0f} MB input", "MB", rss_large, higher_is_better=False,
                  baseline=(f"driver peak RSS, {small_mb:,.0f} MB input", rss_small), target_ratio=1.2),
        rf.figure("ingest from s3a:// (moto), write phase", "events/s", s3_rates,
                  baseline=("ingest from local disk, write phase", local_rates)),
    ]
    notes = [
        f"driver = the ingest job's Python driver process (the provider's code); CPU-s = its user+system time, "
        f"RSS = its VmHWM; the Spark JVM and Python workers are not counted. Inputs: {args.files} files of "
        f"{small_mb:,.0f} MB and {large_mb:,.0f} MB in all ({ratio} the bytes), lines of ~{args.event_bytes} B",
        f"s3a vs local: {lake:,} events of ~200 B in {args.files} files, events/s over the write phase (reading, "
        "writing, committing; not the session start and listing), moto's S3 server in the benchmark process "
        "vs the local disk; no target",
    ]
    data = rf.result("lake", {"files": args.files, "small_mb": round(small_mb, 1), "large_mb": round(large_mb, 1),
                              "event_bytes": args.event_bytes, "lake_events": lake, "repeat": args.repeat},
                     figures, peaks, notes)
    print()
    print(rf.format_table([data]))
    print(rf.format_peaks([data]))
    rf.write(args.json, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
