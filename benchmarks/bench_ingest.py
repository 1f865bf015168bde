"""Benchmark the exactly-once ingest against its baselines, in one run.

Run: ``.venv/bin/python benchmarks/bench_ingest.py [--events 1000000] [--files 10] [--repeat 3]``

Figures (events/s, median of ``--repeat``; each run ingests into a fresh stream):
- baseline: the official client alone, one plain Python process reading the same files and writing
  every line (routing key from the record) into transactions (one per file), committed;
- ``exactly_once`` through ``run_ingest`` (PySpark local mode on every core, warm SparkSession);
- ``at_least_once`` through ``run_ingest``.
Targets: exactly-once >= 0.6 x the baseline, and no slower than 1.15 x at-least-once.
Also the driver's peak RSS growth for a quarter of the input and for all of it (it must not grow
with input size), and the SparkSession start-up time (paid once per task).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path


def make_files(directory: Path, events: int, files: int) -> int:
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


class PeakRss(threading.Thread):
    """Samples this process's RSS (MB) until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0.0
        self.stop_event = threading.Event()

    @staticmethod
    def rss() -> float:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(0.05)

    def __enter__(self) -> PeakRss:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.join()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench-results/ingest.json"))
    args = ap.parse_args()

    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess
    from airflow_provider_pravega.spark.ingest_job import IngestSpec, run_ingest
    from airflow_provider_pravega.spark.session import get_spark_session

    work = Path(tempfile.mkdtemp(prefix="pravega-bench-ingest-", dir="."))
    total = make_files(work / "in", args.events, args.files)
    quarter = make_files(work / "quarter", args.events // 4, max(1, args.files // 4))
    size_mb = sum(p.stat().st_size for p in (work / "in").iterdir()) / 1e6
    print(f"{total:,} events in {args.files} files ({size_mb:.0f} MB) under {work}")
    server = EmbeddedPravegaProcess(work / "server").start()
    results: dict = {"events": total, "files": args.files, "input_mb": round(size_mb, 1), "cores": os.cpu_count()}
    try:
        t0 = time.perf_counter()
        spark = get_spark_session(None, "bench-ingest")
        results["spark_startup_s"] = round(time.perf_counter() - t0, 1)
        files = sorted((work / "in").iterdir())
        with PravegaClient(server.controller_uri) as client:
            client.admin.create_scope("bench")

            def ingest(stream: str, mode: str, source: Path = work / "in") -> float:
                spec = IngestSpec(scope="bench", stream=stream, source=str(source), routing_key_field="sensor_id",
                                  mode=mode, create_stream=True, stream_segments=2, ingest_id=f"bench-{stream}")
                r = run_ingest(client, spark, spec)
                assert r.events == (total if source == work / "in" else quarter), r.events
                return r.events / r.seconds

            # Warm up Spark's code paths (JIT, Python workers) on the small input.
            ingest("warm", "exactly_once", work / "quarter")
            base, eo, alo = [], [], []
            for i in range(args.repeat):
                base.append(official_baseline(server.controller_uri, "bench", f"official-{i}", files))
                eo.append(ingest(f"eo-{i}", "exactly_once"))
                alo.append(ingest(f"alo-{i}", "at_least_once"))
                print(f"run {i + 1}: official client alone {base[-1]:,.0f} ev/s; exactly-once {eo[-1]:,.0f} ev/s; "
                      f"at-least-once {alo[-1]:,.0f} ev/s")
            with PeakRss() as small:
                ingest("mem-quarter", "exactly_once", work / "quarter")
            with PeakRss() as full:
                ingest("mem-full", "exactly_once")
        results.update({
            "official_client_txn_ev_s": statistics.median(base), "exactly_once_ev_s": statistics.median(eo),
            "at_least_once_ev_s": statistics.median(alo), "runs": {"official": base, "exactly_once": eo,
                                                                    "at_least_once": alo},
            "driver_peak_rss_mb_quarter_input": round(small.peak, 1), "driver_peak_rss_mb_full_input": round(full.peak, 1),
        })
    finally:
        server.stop()
    r = results
    print()
    print(f"{'figure':44} {'value':>16} {'baseline':>28} {'ratio':>6}")
    print(f"{'exactly-once ingest (Spark)':44} {r['exactly_once_ev_s']:>12,.0f} ev/s "
          f"{'official client ' + format(r['official_client_txn_ev_s'], ',.0f'):>28} "
          f"{r['exactly_once_ev_s'] / r['official_client_txn_ev_s']:6.2f}")
    print(f"{'exactly-once vs at-least-once (time ratio)':44} {r['exactly_once_ev_s']:>12,.0f} ev/s "
          f"{'at-least-once ' + format(r['at_least_once_ev_s'], ',.0f'):>28} "
          f"{r['at_least_once_ev_s'] / r['exactly_once_ev_s']:6.2f}")
    print(f"{'driver peak RSS, 1/4 input -> full input':44} {r['driver_peak_rss_mb_quarter_input']:>10.0f} MB -> "
          f"{r['driver_peak_rss_mb_full_input']:.0f} MB")
    print(f"SparkSession start-up (once per task): {r['spark_startup_s']} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
