"""Seconds per scheduled run: what one daily ingest task costs, as a new Airflow task pays it (a
fresh process each time), for a day with new files and for a day with nothing new.

Run: ``python benchmarks/bench_per_run.py [--events 10000] [--repeat 3] [--json PATH]``

Each sample runs the ingest job's command (what the operator runs in its task process) against the
embedded server, on one day of sample data (``--events`` readings in 4 files):

* a day with new files: a classic local Spark session ingests it into a fresh scope;
* the same day again, nothing new (a backfill of a done day): local files are listed without Spark
  and no JVM starts. Its baseline is the same run listed through Spark, as every run was before
  (forced here by spelling the source as a ``file:`` URI with ``..``, which only Spark may list).

Figures: the run's own seconds (``run_ingest``, from its summary; target for nothing new: <= 1 s)
and the whole process's wall seconds (Python's start and imports included). No CPU seconds: the
Spark driver's JVM is not a waited-for child of the process, so its CPU time escapes ``rusage``.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import result_file as rf  # noqa: E402

DAY = "2026-11-01"
INTERVAL = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"


def ingest(uri: str, scope: str, source: str) -> tuple[dict, float]:
    """One ingest task's process: (its summary, wall seconds)."""
    cmd = [sys.executable, "-m", "airflow_provider_pravega.spark.ingest_job", "--controller-uri", uri,
           "--scope", scope, "--stream", "readings", "--source", source, "--routing-key-field", "sensor_id",
           "--create-stream", "--ingest-id", "daily", "--interval", INTERVAL, "--master", "local[2]"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"ingest failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000, help="readings in the day (4 files)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write the result file here")
    args = parser.parse_args()
    from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess

    new_day: list[tuple[float, float]] = []
    nothing: list[tuple[float, float]] = []
    nothing_spark: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-per-run-") as tmp:
        data = Path(tmp) / "incoming"
        subprocess.run([sys.executable, str(ROOT / "scripts" / "generate_sample_data.py"), "--out", str(data),
                        "--start", DAY, "--days", "1", "--files-per-day", "4",
                        "--events-per-file", str(args.events // 4)], check=True, capture_output=True)
        day = data / DAY
        local = str(day / "*.jsonl")
        via_spark = f"file://{day}/../{DAY}/*.jsonl"  # the same files; only Spark may list this spelling
        server = EmbeddedPravegaProcess(Path(tmp) / "pravega", extra_args=["--no-fsync"]).start()
        try:
            for n in range(args.repeat):
                scope = f"perrun{n}"
                summary, wall = ingest(server.controller_uri, scope, local)
                assert summary["events"] == args.events, summary
                new_day.append((summary["seconds"], wall))
                # Nothing new, alternating the two ways, so a change in the machine's load hits both.
                for way, source, out in (("no JVM", local, nothing), ("listed by Spark", via_spark, nothing_spark)):
                    summary, wall = ingest(server.controller_uri, scope, source)
                    assert summary["run_id"] is None and summary.get("files_skipped"), summary
                    out.append((summary["seconds"], wall))
                print(f"  round {n + 1}: new day {new_day[-1][0]:.2f} s (process {new_day[-1][1]:.1f} s); nothing "
                      f"new: no JVM {nothing[-1][0]:.2f} s (process {nothing[-1][1]:.1f} s), listed by Spark "
                      f"{nothing_spark[-1][0]:.2f} s (process {nothing_spark[-1][1]:.1f} s)", flush=True)
        finally:
            server.stop()

    def med(rows: list[tuple[float, float]], i: int) -> float:
        return statistics.median(r[i] for r in rows)

    print(f"a day of {args.events:,} readings, classic local session: run {med(new_day, 0):.2f} s, process "
          f"{med(new_day, 1):.1f} s")
    print(f"nothing new: run {med(nothing, 0):.2f} s without a JVM vs {med(nothing_spark, 0):.2f} s listed by Spark "
          f"(target <= 1 s); process {med(nothing, 1):.1f} s vs {med(nothing_spark, 1):.1f} s")
    rf.write(args.json, rf.result(
        "per_run",
        {"events": args.events, "repeat": args.repeat},
        [
            rf.figure("nothing new (a done day again): run seconds, no JVM", "s", [r[0] for r in nothing],
                      higher_is_better=False, baseline=("listed by Spark (before)", [r[0] for r in nothing_spark]),
                      target=1.0),
            rf.figure("nothing new: process seconds (Python start included), no JVM", "s", [r[1] for r in nothing],
                      higher_is_better=False, baseline=("listed by Spark (before)", [r[1] for r in nothing_spark])),
            rf.figure(f"a day of {args.events:,} readings, classic local session: run seconds", "s",
                      [r[0] for r in new_day], higher_is_better=False),
            rf.figure(f"a day of {args.events:,} readings, classic local session: process seconds", "s",
                      [r[1] for r in new_day], higher_is_better=False),
        ],
        notes=["each sample is a fresh ingest process (as an Airflow task); run seconds come from its summary",
               "no Spark Connect figure yet: the warm local Connect server of issue 28 is not built"],
    ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
