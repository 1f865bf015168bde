"""Where the ingest's CPU goes: each stage of its Spark plan for line files, timed alone on the
same input, as CPU-seconds of this process and every process it started (the Spark JVM and its
Python workers), so the figures hold on a busy machine.

Run: ``.venv/bin/python benchmarks/profile_ingest_stages.py [--events 300000] [--files 10] [--repeat 2]``

Stages, each a Spark job of its own over the same pieces (no Pravega involved):

- ``measure``: the pieces of new files measured in this process (fingerprint, last line end);
- ``lines``: ``binaryFile`` content split into lines in Python tasks, each line checked as JSON,
  Arrow back to the JVM (``line_frame``), counted;
- ``records``: the same plus the record columns in the JVM (routing key by ``get_json_object``,
  the bad-record reasons), counted;
- ``to the writer``: the same, partitioned for writing and handed to a Python task as Arrow
  batches turned into Python lists, as the write task receives them, without writing.

The first repetition includes the JVM's warm-up; the last is the figure.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import make_files  # noqa: E402


def cpu_seconds(proc: Any) -> float:
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except Exception:  # noqa: BLE001 - a worker that ended in between
            continue
        total += t.user + t.system
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    import psutil
    from pyspark.sql import SparkSession

    from airflow_provider_pravega.spark.ingest_frames import line_frame, record_frame
    from airflow_provider_pravega.spark.ingest_partitions import partition_for_writing, writer_labels
    from airflow_provider_pravega.spark.ingest_pieces import measure_local_pieces
    from airflow_provider_pravega.spark.ingest_spec import IngestSpec

    me = psutil.Process()
    work = Path(tempfile.mkdtemp(prefix="pravega-profile-"))
    events = make_files(work / "in", args.events, args.files)
    files = sorted(str(p) for p in (work / "in").iterdir())
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spec = IngestSpec(scope="profile", stream="s", source=str(work / "in"), routing_key_field="sensor_id")
    requests = {f: {"size": os.path.getsize(f), "mtime": None, "tail": True, "base": 0, "fp": None, "open": False}
                for f in files}

    def timed(label: str, fn: Callable[[], Any]) -> Any:
        cpu, wall = cpu_seconds(me), time.perf_counter()
        out = fn()
        used = cpu_seconds(me) - cpu
        print(f"  {label:<14} wall {time.perf_counter() - wall:6.2f} s   CPU {used:6.2f} s   "
              f"{used / events * 1e6:5.2f} CPU-s per million events", flush=True)
        return out

    def to_the_writer(pieces: dict[str, Any], labels: Any) -> Any:
        frame = partition_for_writing(record_frame(spark, pieces, spec, labels), spec, 2, labels)

        def receive(batches: Any) -> Any:
            import pyarrow as pa

            n = 0
            for batch in batches:
                n += len(batch.column("payload").to_pylist())
                batch.column("k").to_pylist()
            yield pa.RecordBatch.from_pydict({"n": [n]})

        return frame.mapInArrow(receive, "n long").collect()

    print(f"{events:,} events in {len(files)} files ({sum(r['size'] for r in requests.values()) / 1e6:.0f} MB), "
          f"local[2], routing key {spec.routing_key_field!r}")
    try:
        for rep in range(args.repeat):
            print(f"repetition {rep + 1}/{args.repeat}")
            pieces = timed("measure", lambda: measure_local_pieces(requests))
            labels = writer_labels(pieces, spec, 2, False)
            timed("lines", lambda: line_frame(spark, pieces, labels, False, True).count())
            timed("records", lambda: record_frame(spark, pieces, spec, labels).where("not bad").count())
            timed("to the writer", lambda: to_the_writer(pieces, labels))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
