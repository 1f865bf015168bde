"""Stream-cut export rate: PySpark export to Parquet vs reading the same segment ranges raw.

Run: ``python benchmarks/bench_export.py [--events 1000000] [--size 200] [--segments 4]
[--rounds 3] [--warmup 2] [--master local[*]] [--format parquet] [--compression CODEC] [--no-delta]
[--conf KEY=VALUE ...] [--profile] [--json PATH]``

Writes ``--events`` events of ``--size`` bytes (official writer, routing keys spread over the
segments) to a fresh stream on the embedded server (its own process), takes the tail cut and plans
the segment ranges between the head and that cut. Then, in the same run, alternating (export, raw,
export, raw, ...) so machine noise hits both:

- export (the figure): ``run_export`` between the two cuts to ``--format`` files with a local
  SparkSession (``--master``; one Spark task per range): the whole call - checks, cut record in
  the state synchronizer, the Spark job, renames and marker - as a DAG task would run it;
- raw (the baseline): ``read_segment_range_batches`` over every range, one after the other, in one
  spawned process; the events are only counted;
- delta (unless ``--no-delta``): the same ``run_export`` with ``format="delta"`` into a fresh Delta
  table each round (one interval, its idempotent commit), in the same session (started with
  Delta's package), so Parquet files and a Delta table are compared side by side.

Neither side includes its process start: the SparkSession (JVM, Python workers) exists before the
first timed export, and the raw reader is a pool process with the modules imported. Both sides
first run ``--warmup`` untimed full passes (the JVM's JIT keeps compiling for several exports).

Prints each round, the medians, the ratio export/raw (target >= 0.6), the export's phases, the CPU
seconds each process kind used per round and, inside Spark's JVM, per thread kind (task threads,
JIT compiler, GC), and a table of CPU-s per export, Parquet beside Delta, split as JVM task
threads, JIT, GC, other JVM, Python workers, server and driver. ``--profile`` also times, alternating with the others, the export's read stage
alone (Spark's ``noop`` writer: reading, Arrow batches to the JVM, no files) and Spark's writer
alone (the same rows from memory, no Pravega, no Python: the floor of any export through Spark's
writers), and prints the top functions of one read task's Python side under cProfile.
``--json PATH`` writes the result file (benchmarks/result_file.py).
"""

from __future__ import annotations

import argparse
import glob
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Self

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import result_file as rf

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

    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

    from airflow_provider_pravega.client.config import PravegaConnectionConfig
    from airflow_provider_pravega.spark.datasource_read import Decoding, _read_partition

    host, _, port = uri.split("//", 1)[1].rpartition(":")
    config = PravegaConnectionConfig.from_connection_fields(host=host, port=int(port))
    schema = StructType([StructField("event", StringType() if text else BinaryType(), False),
                         StructField("segment_id", LongType(), False), StructField("offset", LongType(), False)])
    decoding = Decoding.of({"decode": "text" if text else "binary", "columns": "event,segment_id,offset"}, schema)
    prof = cProfile.Profile()
    started = time.perf_counter()
    rows = prof.runcall(lambda: sum(b.num_rows for b in _read_partition(config, ranges, decoding)))
    elapsed = time.perf_counter() - started
    print(f"\none task's Python side (all ranges, cProfile on): {rows:,} events in {elapsed:.2f} s")
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)


class CpuMeter:
    """CPU seconds used by this process and its children (the embedded server, Spark's JVM and
    its Python workers, the raw-read process), by kind; one dict per measured run."""

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


class JvmThreads:
    """CPU seconds inside Spark's JVM by thread kind (from /proc/<pid>/task/*): Spark's task
    threads, the JIT compiler, the garbage collector, the rest; one dict per measured run."""

    KINDS = (("Executor task", "task threads"), ("CompilerThre", "JIT compiler"), ("GC Thread", "GC"),
             ("G1 ", "GC"), ("VM Thread", "GC"))

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.tick = os.sysconf("SC_CLK_TCK")
        self.runs: list[dict[str, float]] = []

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for task in glob.glob(f"/proc/{self.pid}/task/*"):
            try:
                with open(f"{task}/comm") as fh:
                    name = fh.read().strip()
                with open(f"{task}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            kind = next((k for prefix, k in self.KINDS if prefix in name), "other")
            out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / self.tick
        return out

    def __enter__(self) -> Self:
        self._before = self.sample()
        return self

    def __exit__(self, *exc: object) -> None:
        after = self.sample()
        self.runs.append({k: v - self._before.get(k, 0.0) for k, v in after.items()})

    def median(self) -> dict[str, float]:
        kinds = {k for run in self.runs for k in run}
        return {k: statistics.median(run.get(k, 0.0) for run in self.runs) for k in kinds}


def median_cpu(meter: CpuMeter) -> dict[str, float]:
    kinds = {k for run in meter.runs for k in run}
    return {k: statistics.median(run.get(k, 0.0) for run in meter.runs) for k in kinds}


def cpu_text(per_kind: dict[str, float]) -> str:
    parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(per_kind.items(), key=lambda kv: -kv[1]) if v >= 0.005)
    return f"{sum(per_kind.values()):.2f} CPU s ({parts})"


def breakdown(cpu: CpuMeter, jvm: JvmThreads) -> dict[str, float]:
    """Median CPU-s per export by part (the rounds' process and JVM-thread samples paired)."""
    rows: list[dict[str, float]] = []
    for run, threads in zip(cpu.runs, jvm.runs, strict=True):
        inside = {k: threads.get(k, 0.0) for k in ("task threads", "JIT compiler", "GC")}
        row = {"JVM task threads": inside["task threads"], "JIT": inside["JIT compiler"], "GC": inside["GC"],
               "Other JVM": max(0.0, run.get("spark jvm", 0.0) - sum(inside.values())),
               "Python workers": run.get("spark python workers", 0.0), "Server": run.get("pravega server", 0.0),
               "Driver": run.get("driver", 0.0)}
        row["Total"] = sum(row.values())
        rows.append(row)
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]} if rows else {}


def breakdown_table(columns: dict[str, dict[str, float]]) -> list[str]:
    """``Part | parquet | delta`` lines (CPU-s per export, medians)."""
    names = list(columns)
    parts = list(next(iter(columns.values())))
    out = ["CPU-s per export (median): " + " | ".join(["part", *names])]
    out += [f"  {part}: " + " | ".join(f"{columns[n].get(part, 0.0):.2f}" for n in names) for part in parts]
    return out


def rates(results: list[tuple[int, int, float]], expected: int, label: str) -> list[float]:
    for count, _, _ in results:
        if count != expected:
            raise SystemExit(f"{label}: got {count} events of {expected}")
    return [count / seconds for count, _, seconds in results]


def process_kind(server_pid: int) -> Any:
    me = os.getpid()

    def kind(pid: int) -> str | None:
        if pid == me:
            return "driver"
        if pid == server_pid:
            return "server"
        cmd = rf.cmdline(pid)
        if "java" in cmd:
            return "spark jvm"
        if "pyspark" in cmd:
            return "spark python workers"
        if "multiprocessing" in cmd and "resource_tracker" not in cmd:
            return "raw reader"
        return None

    return kind


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--segments", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2, help="untimed full passes of each side first")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--format", default="parquet", choices=("parquet", "jsonl", "csv"))
    parser.add_argument("--event-format", default="text", choices=("text", "binary", "json"))
    parser.add_argument("--compression", default=None, help="codec of the files (default: Spark's)")
    parser.add_argument("--num-partitions", type=int, default=None,
                        help="Spark partitions / files of the export (default: one per segment range)")
    parser.add_argument("--driver-memory", default=None, help="spark.driver.memory (local mode: the whole heap)")
    parser.add_argument("--delta", action=argparse.BooleanOptionalAction, default=True,
                        help="also export each round into a fresh Delta table (default: yes)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting of the session (repeatable): A/B runs of a setting")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="write the result file here")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    extra_conf = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            parser.error(f"--conf takes KEY=VALUE, not {item!r}")
        extra_conf[key.strip()] = value

    import logging

    logging.basicConfig(level=logging.WARNING)

    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.client.batch import plan_segment_ranges
    from airflow_provider_pravega.client.streamcut import StreamCut
    from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess
    from airflow_provider_pravega.spark import export_write
    from airflow_provider_pravega.spark.export_frame import build_frame
    from airflow_provider_pravega.spark.export_job import ExportSpec, run_export
    from airflow_provider_pravega.spark.session import get_spark_session

    work = Path(tempfile.mkdtemp(prefix="bench-export-"))
    notes: list[str] = []
    figures: list[dict[str, Any]] = []
    try:
        with EmbeddedPravegaProcess(work / "pravega") as server:
            uri = server.controller_uri
            scope, stream = "bench", "export"
            started = time.perf_counter()
            with SPAWN.Pool(1) as pool:
                pool.apply(write_events, (uri, scope, stream, args.events, args.size, args.segments))
            print(f"wrote {args.events:,} events of {args.size} bytes in {time.perf_counter() - started:.1f} s")

            conf = {"spark.master": args.master, "spark.ui.showConsoleProgress": "false"}
            if args.driver_memory:
                conf["spark.driver.memory"] = args.driver_memory
            conf.update(extra_conf)
            if args.delta:  # Delta's package and SQL extension (the Parquet export does not use them)
                from airflow_provider_pravega.spark.delta_export import session_conf

                conf = session_conf(conf)
            spark = get_spark_session(None, "bench-export", **conf)
            sc = spark.sparkContext
            print(f"spark {spark.version}, master {sc.master}, {sc.defaultParallelism} cores"
                  + "".join(f", {k}={v}" for k, v in extra_conf.items()))
            jvm = JvmThreads(int(spark._jvm.java.lang.ProcessHandle.current().pid()))
            with PravegaClient(uri) as client:
                head = StreamCut.head(client, scope, stream)
                tail = StreamCut.tail(client, scope, stream)
                ranges = plan_segment_ranges(client, head, tail)
                print(f"{len(ranges)} segment ranges, {sum(r.length for r in ranges) / 1e6:.1f} MB between the cuts")
                payload = sum(r.length for r in ranges) - 8 * args.events
                phases: list[dict] = []
                sizes: list[int] = []

                def export(label: str) -> tuple[int, int, float]:
                    out = work / f"out-{label}"
                    spec = ExportSpec(scope, stream, str(out), start_cut=head.to_text(), end_cut=tail.to_text(),
                                      format=args.format, event_format=args.event_format,
                                      export_id=f"bench-{label}", compression=args.compression,
                                      num_partitions=args.num_partitions)
                    t0 = time.perf_counter()
                    result = run_export(client, spark, spec)
                    elapsed = time.perf_counter() - t0
                    phases.append(result.phases)
                    sizes.append(sum(f.stat().st_size for f in out.iterdir() if f.name.startswith("part-")))
                    shutil.rmtree(out, ignore_errors=True)
                    return result.events, result.bytes, elapsed

                delta_phases: list[dict] = []
                delta_sizes: list[int] = []

                def export_delta(label: str) -> tuple[int, int, float]:
                    table = work / f"delta-{label}"  # a fresh table: a real commit, not a no-op rerun
                    spec = ExportSpec(scope, stream, str(table), start_cut=head.to_text(), end_cut=tail.to_text(),
                                      format="delta", event_format=args.event_format,
                                      export_id=f"bench-delta-{label}", interval_key="bench",
                                      num_partitions=args.num_partitions)
                    t0 = time.perf_counter()
                    result = run_export(client, spark, spec)
                    elapsed = time.perf_counter() - t0
                    delta_phases.append(result.phases)
                    delta_sizes.append(sum(f.stat().st_size for f in table.rglob("*.parquet")))
                    shutil.rmtree(table, ignore_errors=True)
                    return result.events, result.bytes, elapsed

                spec = ExportSpec(scope, stream, "unused", event_format=args.event_format)

                def noop() -> tuple[int, int, float]:
                    frame = build_frame(spark, client.connection_config, spec, ranges)
                    t0 = time.perf_counter()
                    frame.write.format("noop").mode("overwrite").save()
                    return args.events, payload, time.perf_counter() - t0

                cached = None
                if args.profile:  # Spark's writer alone: the same rows held in the JVM's memory.
                    cached = build_frame(spark, client.connection_config, spec, ranges).cache()
                    cached.count()

                def from_memory(label: str) -> tuple[int, int, float]:
                    out = work / f"floor-{label}"
                    writer = cached.write.format(export_write._SPARK_FORMAT[args.format])
                    if args.format == "parquet":
                        writer = writer.options(**export_write.PARQUET_OPTIONS)
                    if args.compression:
                        writer = writer.option("compression", args.compression)
                    t0 = time.perf_counter()
                    writer.save(str(out))
                    elapsed = time.perf_counter() - t0
                    shutil.rmtree(out, ignore_errors=True)
                    return args.events, payload, elapsed

                raw, exported, read_stage, floor, delta = [], [], [], [], []
                cpu_raw, cpu_export, cpu_noop, cpu_floor = CpuMeter(), CpuMeter(), CpuMeter(), CpuMeter()
                cpu_delta = CpuMeter()
                jvm_floor, jvm_delta = JvmThreads(jvm.pid), JvmThreads(jvm.pid)
                sampler = rf.PeakSampler(lambda: [os.getpid(), *rf.children(os.getpid())], process_kind(server.pid))
                with SPAWN.Pool(1, initializer=warm_up) as one, sampler:
                    for w in range(args.warmup):  # untimed: JIT, Python workers, page cache, connections
                        export(f"warm-{w}")
                        if args.delta:
                            export_delta(f"warm-{w}")
                        one.apply(read_raw, (uri, ranges))
                        if args.profile:
                            noop()
                            from_memory(f"warm-{w}")
                    phases.clear()
                    sizes.clear()
                    delta_phases.clear()
                    delta_sizes.clear()
                    for n in range(args.rounds):
                        with cpu_export, jvm:
                            exported.append(export(str(n)))
                        if args.delta:
                            with cpu_delta, jvm_delta:
                                delta.append(export_delta(str(n)))
                        with cpu_raw:
                            raw.append(one.apply(read_raw, (uri, ranges)))
                        if args.profile:
                            with cpu_noop:
                                read_stage.append(noop())
                            with cpu_floor, jvm_floor:
                                floor.append(from_memory(str(n)))
                        print(f"round {n + 1}: export {exported[-1][2]:.2f} s, raw {raw[-1][2]:.2f} s"
                              + (f", delta {delta[-1][2]:.2f} s" if args.delta else "")
                              + (f", read stage {read_stage[-1][2]:.2f} s, writer from memory {floor[-1][2]:.2f} s"
                                 if args.profile else ""), flush=True)
                if cached is not None:
                    cached.unpersist()

                raw_rates = rates(raw, args.events, "raw read")
                baseline = ("raw segment read, one process", raw_rates)
                fmt_name = args.format + (f" ({args.compression})" if args.compression else "")
                if args.num_partitions:
                    fmt_name += f", {args.num_partitions} partitions"
                figures.append(rf.figure(f"export to {fmt_name}", "events/s", rates(exported, args.events, "export"),
                                         baseline=baseline, target_ratio=0.6))
                if args.delta:
                    figures.append(rf.figure("export to a Delta table", "events/s",
                                             rates(delta, args.events, "delta export"), baseline=baseline))
                if args.profile:
                    figures.append(rf.figure("export read stage only (noop writer)", "events/s",
                                             rates(read_stage, args.events, "read stage"), baseline=baseline))
                    figures.append(rf.figure(f"Spark {fmt_name} writer alone, rows from memory", "events/s",
                                             rates(floor, args.events, "writer from memory"), baseline=baseline))
                fastest = min(phases, key=lambda p: sum(p.values()))
                notes.append("export phases (fastest round): " + ", ".join(f"{k} {v:.2f} s" for k, v in fastest.items()))
                notes.append(f"export: {statistics.median(sizes) / 1e6:.1f} MB of files for {payload / 1e6:.1f} MB "
                             f"of payload")
                notes.append(f"CPU per raw read (median): {cpu_text(median_cpu(cpu_raw))}")
                notes.append(f"CPU per export (median): {cpu_text(median_cpu(cpu_export))}")
                notes.append(f"  inside Spark's JVM per export: {cpu_text(jvm.median())}")
                columns = {fmt_name: breakdown(cpu_export, jvm)}
                if args.delta:
                    fastest_delta = min(delta_phases, key=lambda p: sum(p.values()))
                    notes.append("delta export phases (fastest round): "
                                 + ", ".join(f"{k} {v:.2f} s" for k, v in fastest_delta.items()))
                    notes.append(f"delta export: {statistics.median(delta_sizes) / 1e6:.1f} MB of data files, "
                                 f"{statistics.median(r[2] for r in delta):.2f} s per export (median; "
                                 f"{fmt_name} {statistics.median(r[2] for r in exported):.2f} s)")
                    columns["delta"] = breakdown(cpu_delta, jvm_delta)
                notes.extend(breakdown_table(columns))
                if args.profile:
                    notes.append(f"CPU per read stage (median): {cpu_text(median_cpu(cpu_noop))}")
                    notes.append(f"CPU per write from memory (median): {cpu_text(median_cpu(cpu_floor))}")
                    notes.append(f"  inside Spark's JVM per write from memory: {cpu_text(jvm_floor.median())}")
                notes.append("included: export = the whole run_export call (prepare, Spark job, publish) in a "
                             "running SparkSession; raw = reading every range in a running process; neither "
                             f"includes process start; {args.warmup} untimed warm-up pass(es) of each first")
                result = rf.result(
                    "export",
                    {"events": args.events, "size": args.size, "segments": args.segments, "rounds": args.rounds,
                     "warmup": args.warmup, "master": sc.master, "cores": sc.defaultParallelism,
                     "format": args.format, "event_format": args.event_format, "compression": args.compression,
                     "num_partitions": args.num_partitions, "delta": args.delta,
                     "ranges": len(ranges)},
                    figures, sampler.peaks, notes,
                )
                print()
                print(rf.format_table([result]))
                print(rf.format_peaks([result]))
                for note in notes:
                    print(note)
                rf.write(args.json, result)

                if args.profile:
                    with SPAWN.Pool(1, initializer=warm_up) as one:
                        one.apply(profile_task, (uri, ranges, args.event_format != "binary"))
            spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
