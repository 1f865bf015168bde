"""Stream-cut export rate: PySpark export to Parquet vs reading the same segment ranges raw.

Run: ``python benchmarks/bench_export.py [--events 1000000] [--size 200] [--segments 4]
[--rounds 2] [--master local[*]] [--format parquet] [--profile]``

Writes ``--events`` events of ``--size`` bytes (official writer, routing keys spread over the
segments) to a fresh stream on the embedded server (its own process), takes the tail cut and plans
the segment ranges between the head and that cut. Then, in the same run:

- raw: ``read_segment_range_batches`` over every range, one after the other, in one (spawned,
  warmed-up) process - the events are only counted;
- export: ``run_export`` between the same two cuts to ``--format`` files with a local SparkSession
  (``--master``; one Spark task per range).

Prints events/s and MB/s of payload for each (best of ``--rounds``), the ratio export/raw (the
target is >= 0.6), the export's phases and the CPU seconds each process kind used (psutil).
``--profile`` also times the export's read stage alone (Spark's ``noop`` writer: reading, Arrow
batches to the JVM, no files), Spark's Parquet writer alone (the same rows from memory: the floor
of any export through Spark's writers), and prints the top functions of one read task's Python
side under cProfile.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Self

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SPAWN = mp.get_context("spawn")


def write_events(uri: str, scope: str, stream: str, events: int, size: int, segments: int) -> None:
    """Sensor readings as JSON of about ``size`` bytes (varying numbers and a random trace id, so
    they compress like real data rather than like padding)."""
    import random

    import pravega_client

    manager = pravega_client.StreamManager(uri)
    manager.create_scope(scope)
    manager.create_stream(scope, stream, segments)
    writer = manager.create_writer(scope, stream, 1000)
    rnd = random.Random(7)
    keys = [f"sensor-{i:03d}" for i in range(64)]
    for i in range(events):
        key = keys[i & 63]
        event = (f'{{"sensor":"{key}","ts":{1_732_233_412_345 + i * 7},"seq":{i},'
                 f'"temperature":{rnd.uniform(-10, 40):.3f},"humidity":{rnd.uniform(0, 100):.2f},'
                 f'"status":"ok","trace":"{rnd.getrandbits(128):032x}","site":"plant-{i % 5}"')
        event += f',"note":"{"n" * max(0, size - len(event) - 11)}"}}' if size - len(event) > 12 else "}"
        writer.write_event(event, routing_key=key)
    writer.flush()


def warm_up() -> None:
    """Pool initializer: import everything before anything is timed."""
    import importlib

    importlib.import_module("airflow_provider_pravega.client.batch")


def read_raw(uri: str, ranges: list) -> tuple[int, int, float]:
    """(events, payload bytes, seconds) of reading ``ranges`` in this process, batch by batch."""
    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.client.batch import read_segment_range_batches

    with PravegaClient(uri) as client:
        client.controller.get_uri(ranges[0].scope, ranges[0].stream, ranges[0].segment_id)  # warm the channel
        started = time.perf_counter()
        count = size = 0
        for rng in ranges:
            for batch in read_segment_range_batches(client, rng):
                count += len(batch.payloads)
                size += sum(map(len, batch.payloads))
        return count, size, time.perf_counter() - started


def profile_task(uri: str, ranges: list, text: bool) -> None:
    """cProfile of what one export task does in Python: read the ranges into Arrow batches."""
    import cProfile
    import pstats

    import pyarrow as pa

    from airflow_provider_pravega.client.config import PravegaConnectionConfig
    from airflow_provider_pravega.spark.export_job import make_reader

    class Counter:
        value = 0

        def add(self, n: int) -> None:
            self.value += n

    host, _, port = uri.split("//", 1)[1].rpartition(":")
    config = PravegaConnectionConfig.from_connection_fields(host=host, port=int(port))
    reader = make_reader(config, ranges, [list(range(len(ranges)))], text, (Counter(), Counter()))
    ids = [pa.RecordBatch.from_pydict({"id": [0]})]
    prof = cProfile.Profile()
    started = time.perf_counter()
    rows = prof.runcall(lambda: sum(b.num_rows for b in reader(iter(ids))))
    elapsed = time.perf_counter() - started
    print(f"\none task's Python side (all ranges, cProfile on): {rows:,} events in {elapsed:.2f} s")
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)


class CpuMeter:
    """CPU seconds used by this process and its children (the embedded server, Spark's JVM and
    its Python workers, the raw-read process), by kind; the minimum over the measured runs."""

    def __init__(self) -> None:
        self.runs: list[dict[str, float]] = []

    @staticmethod
    def sample() -> dict[str, float]:
        try:
            import psutil
        except ImportError:
            return {}
        me = psutil.Process()
        out: dict[str, float] = {}
        for proc in [me, *me.children(recursive=True)]:
            try:
                cmd = " ".join(proc.cmdline())
                t = proc.cpu_times()
            except psutil.Error:
                continue
            kind = ("spark jvm" if "java" in cmd else "pravega server" if "embedded" in cmd
                    else "spark python workers" if "pyspark" in cmd else "driver" if proc.pid == me.pid
                    else "raw reader")
            out[kind] = out.get(kind, 0.0) + t.user + t.system + t.children_user + t.children_system
        return out

    def __enter__(self) -> Self:
        self._before = self.sample()
        return self

    def __exit__(self, *exc: object) -> None:
        after = self.sample()
        self.runs.append({k: v - self._before.get(k, 0.0) for k, v in after.items() if v - self._before.get(k, 0.0) > 0.005})

    def report(self, label: str) -> None:
        if not self.runs or not self.runs[0]:
            return
        best = min(self.runs, key=lambda r: sum(r.values()))
        parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(best.items(), key=lambda kv: -kv[1]))
        print(f"  {label}: {sum(best.values()):.2f} CPU s ({parts})")


def report(name: str, results: list[tuple[int, int, float]], expected: int) -> float:
    count, size, seconds = min(results, key=lambda r: r[2])
    status = "" if count == expected else f"  (got {count} of {expected}!)"
    rate = count / seconds
    print(f"{name:<34} {rate:>12,.0f} events/s {size / seconds / 1e6:>9.1f} MB/s {seconds:>8.2f} s{status}")
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--segments", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--format", default="parquet", choices=("parquet", "jsonl", "csv"))
    parser.add_argument("--event-format", default="text", choices=("text", "binary", "json"))
    parser.add_argument("--driver-memory", default=None, help="spark.driver.memory (local mode: the whole heap)")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    import logging

    logging.basicConfig(level=logging.WARNING)

    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.client.batch import plan_segment_ranges
    from airflow_provider_pravega.client.streamcut import StreamCut
    from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess
    from airflow_provider_pravega.spark.export_job import ExportSpec, run_export
    from airflow_provider_pravega.spark.session import get_spark_session

    work = Path(tempfile.mkdtemp(prefix="bench-export-"))
    try:
        with EmbeddedPravegaProcess(work / "pravega") as server:
            uri = server.controller_uri
            scope, stream = "bench", "export"
            started = time.perf_counter()
            with SPAWN.Pool(1) as pool:
                pool.apply(write_events, (uri, scope, stream, args.events, args.size, args.segments))
            print(f"wrote {args.events:,} events of {args.size} bytes in {time.perf_counter() - started:.1f} s")

            conf = {"spark.master": args.master}
            if args.driver_memory:
                conf["spark.driver.memory"] = args.driver_memory
            spark = get_spark_session(None, "bench-export", **conf)
            print(f"spark {spark.version}, master {spark.sparkContext.master}, "
                  f"{spark.sparkContext.defaultParallelism} cores")
            with PravegaClient(uri) as client:
                head = StreamCut.head(client, scope, stream)
                tail = StreamCut.tail(client, scope, stream)
                ranges = plan_segment_ranges(client, head, tail)
                print(f"{len(ranges)} segment ranges, {sum(r.length for r in ranges) / 1e6:.1f} MB between the cuts")

                phases: list[dict] = []
                payload = sum(r.length for r in ranges) - 8 * args.events

                def export(n: int, fmt: str) -> tuple[int, int, float]:
                    out = work / f"out-{fmt}-{n}"
                    spec = ExportSpec(scope, stream, str(out), start_cut=head.to_text(), end_cut=tail.to_text(),
                                      format=fmt, event_format=args.event_format, export_id=f"bench-{fmt}-{n}")
                    t0 = time.perf_counter()
                    result = run_export(client, spark, spec)
                    elapsed = time.perf_counter() - t0
                    phases.append(result.phases)
                    shutil.rmtree(out, ignore_errors=True)
                    return result.events, result.bytes, elapsed

                # Warm Spark (JVM JIT, Python workers) on a full export first; not timed.
                warm = ExportSpec(scope, stream, str(work / "warm"), start_cut=head.to_text(),
                                  end_cut=tail.to_text(), export_id="bench-warm", format=args.format,
                                  event_format=args.event_format)
                run_export(client, spark, warm)
                shutil.rmtree(work / "warm", ignore_errors=True)

                raw, exported = [], []
                cpu_raw, cpu_export = CpuMeter(), CpuMeter()
                with SPAWN.Pool(1, initializer=warm_up) as one:
                    one.apply(read_raw, (uri, ranges[:1]))
                    for n in range(args.rounds):
                        with cpu_raw:
                            raw.append(one.apply(read_raw, (uri, ranges)))
                        with cpu_export:
                            exported.append(export(n, args.format))
                raw_rate = report("raw read, 1 process", raw, args.events)
                export_rate = report(f"export to {args.format} (Spark)", exported, args.events)
                print(f"ratio export/raw: {export_rate / raw_rate:.2f} (target >= 0.6)")
                fastest = min(phases, key=lambda p: sum(p.values()))
                print("export phases (fastest run): " + ", ".join(f"{k} {v:.2f} s" for k, v in fastest.items()))
                cpu_raw.report("CPU per raw read")
                cpu_export.report("CPU per export")

                if args.profile:
                    from airflow_provider_pravega.spark import export_job

                    sc = spark.sparkContext
                    spec = ExportSpec(scope, stream, "unused", event_format=args.event_format)
                    noop, cpu_noop = [], CpuMeter()
                    for _ in range(args.rounds):
                        frame = export_job.build_frame(spark, export_job.config_of(client), spec, ranges,
                                                       (sc.accumulator(0), sc.accumulator(0)))
                        with cpu_noop:
                            t0 = time.perf_counter()
                            frame.write.format("noop").mode("overwrite").save()
                            noop.append((args.events, payload, time.perf_counter() - t0))
                    report("read stage only (noop writer)", noop, args.events)
                    cpu_noop.report("CPU per read stage")
                    # Spark's Parquet writer alone: the same rows from memory, no Pravega, no Python.
                    cached = export_job.build_frame(spark, export_job.config_of(client), spec, ranges,
                                                    (sc.accumulator(0), sc.accumulator(0))).cache()
                    cached.count()
                    floor, cpu_floor = [], CpuMeter()
                    for n in range(args.rounds):
                        out = work / f"floor-{n}"
                        with cpu_floor:
                            t0 = time.perf_counter()
                            cached.write.options(**export_job.PARQUET_OPTIONS).parquet(str(out))
                            floor.append((args.events, payload, time.perf_counter() - t0))
                        shutil.rmtree(out, ignore_errors=True)
                    cached.unpersist()
                    report("Spark Parquet write from memory", floor, args.events)
                    cpu_floor.report("CPU per write from memory")
                    with SPAWN.Pool(1, initializer=warm_up) as one:
                        one.apply(profile_task, (uri, ranges, args.event_format != "binary"))
            spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
