"""Benchmark the embedded server with the official ``pravega`` client, next to its baselines.

Run: ``.venv/bin/python benchmarks/bench_server.py [--events 1000000] [--repeat 3] [--hold-gb 5]
[--json PATH]`` (``--quick``: 200,000 events, 0.5 GB held, one repetition).

Figures (each next to the baseline it is judged against, measured in the same run; repetitions
alternate figure and baseline so machine noise hits both):
- one writer of 100-byte events (target >= 100,000 events/s, absolute);
- one writer of 10-KiB events, MB/s vs raw sequential append + fdatasync of the data directory's
  disk in 5 MiB blocks (target >= 0.5);
- 8 concurrent writer processes vs one, with a 1000-event window and with every write
  acknowledged before the next (group commit) (target: above one);
- catch-up read of stored 100-byte events with a reader group vs the write rate (target >= 1);
- server RSS while holding ``--hold-gb`` GB and serving a reader (target < 300 MB, absolute).

The server runs as its own process (``python -m airflow_provider_pravega.embedded``), as users run
it; clients run in other processes so nobody shares a GIL. ``--json`` writes the result file of
``benchmarks/result_file.py`` (the schema ``benchmarks/run.py`` gathers).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import result_file as rf  # noqa: E402

READY = re.compile(r"controller (\S+) segment-store (\S+)")


def start_server(data_dir: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "airflow_provider_pravega.embedded", "--data-dir", str(data_dir),
         "--port", "0", "--segment-store-port", "0"],
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = READY.search(line)
    if not m:
        proc.kill()
        raise SystemExit(f"embedded server did not start: {line!r}")
    return proc, m.group(1)


def disk_baseline(directory: Path, chunk: int, seconds: float) -> float:
    """MB/s of sequential write+fdatasync in ``chunk``-byte appends."""
    path = directory / "baseline.bin"
    buf = os.urandom(chunk)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        n = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            os.write(fd, buf)
            os.fdatasync(fd)
            n += 1
        dt = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
    return n * chunk / dt / 1e6


def _writer_job(uri: str, scope: str, stream: str, count: int, size: int, inflight: int,
                result: mp.Queue, start: mp.Event) -> None:
    import pravega_client

    mgr = pravega_client.StreamManager(uri)
    w = mgr.create_writer(scope, stream, inflight)
    payload = b"x" * size
    w.write_event_bytes(payload)  # connect before the clock starts
    w.flush()
    start.wait()
    t0 = time.perf_counter()
    for _ in range(count):
        w.write_event_bytes(payload)
    w.flush()
    result.put((t0, time.perf_counter(), rf.rss_mb()[1]))


WRITER_PEAK_MB = [0.0]  # the largest VmHWM any writer process reported


def write_rate(uri: str, scope: str, stream: str, segments: int, writers: int, count: int, size: int,
               inflight: int = 1000, released: Callable[[], object] | None = None) -> float:
    """Events/s of ``writers`` processes writing ``count`` events each (durable acks).

    ``inflight`` is the official writer's window: 1000 pipelines appends (throughput), 0 makes
    every ``write_event`` wait for its acknowledgement (latency-bound; shows group commit).
    ``released`` is called as the connected writers are let go, so a caller can measure what
    the writing costs without the writers' start-up."""
    import pravega_client

    mgr = pravega_client.StreamManager(uri)
    mgr.create_stream(scope, stream, segments)
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    start = ctx.Event()
    procs = [ctx.Process(target=_writer_job, args=(uri, scope, stream, count, size, inflight, q, start)) for _ in range(writers)]
    for p in procs:
        p.start()
    time.sleep(2.0 + 0.5 * writers)  # let every writer connect
    if released is not None:
        released()
    start.set()
    spans = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    t0 = min(s[0] for s in spans)
    t1 = max(s[1] for s in spans)
    WRITER_PEAK_MB[0] = max(WRITER_PEAK_MB[0], *(s[2] for s in spans))
    return writers * count / (t1 - t0)


def read_rate(uri: str, scope: str, stream: str, expected: int, rg: str) -> float:
    import pravega_client

    mgr = pravega_client.StreamManager(uri)

    async def run() -> float:
        group = mgr.create_reader_group(rg, scope, stream)
        r = group.create_reader("r")
        n = 0
        t0 = time.perf_counter()
        while n < expected:
            sl = await r.get_segment_slice_async()
            for _ in sl:
                n += 1
            r.release_segment(sl)
        dt = time.perf_counter() - t0
        r.reader_offline()
        return n / dt

    return asyncio.run(run())


def hold_and_read(proc: subprocess.Popen, uri: str, hold_gb: float, repeat: int) -> list[float]:
    """Write ``hold_gb`` GB of 1 MiB events, then read part of it ``repeat`` times with fresh reader
    groups while sampling the server's RSS; returns the peak RSS (MB) of each read."""
    import pravega_client

    pravega_client.StreamManager(uri).create_stream("bench", "hold", 4)
    per_writer = int(hold_gb * 1e9) // (1024 * 1024) // 4
    write_rate(uri, "bench", "hold", 4, 4, per_writer, 1024 * 1024 - 64)
    peaks = []
    for i in range(repeat):
        seen: list[float] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                seen.append(rf.rss_mb(proc.pid)[0])
                time.sleep(0.1)

        t = threading.Thread(target=sample)
        t.start()
        try:
            read_rate(uri, "bench", "hold", min(per_writer * 4, 400), f"rg-hold-{i}")
        finally:
            stop.set()
            t.join()
        peaks.append(max(seen))
    return peaks


def main() -> int:
    rf.require_official_client()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="200,000 events, 0.5 GB held, one repetition")
    ap.add_argument("--events", type=int, default=None, help="100-byte events per single-writer run (default 1,000,000)")
    ap.add_argument("--repeat", type=int, default=None, help="repetitions of every figure (default 3)")
    ap.add_argument("--hold-gb", type=float, default=None, help="data held for the memory figure (default 5; 0 skips it)")
    ap.add_argument("--json", type=Path, default=None, help="write the result file here")
    ap.add_argument("--data-dir", type=Path, default=None, help="where the server keeps data (default: a temp dir under the CWD's disk)")
    args = ap.parse_args()
    repeat = args.repeat or (1 if args.quick else 3)
    n_small = args.events or (200_000 if args.quick else 1_000_000)
    hold_gb = args.hold_gb if args.hold_gb is not None else (0.5 if args.quick else 5.0)
    n_big = max(10_000, n_small // 25)  # 10 KiB events: 400 MB per run at 1M
    n_sync = max(1_000, n_small // 200)  # acknowledged one by one: latency-bound, so fewer

    base = args.data_dir or Path(tempfile.mkdtemp(prefix="pravega-bench-", dir="."))
    base.mkdir(parents=True, exist_ok=True)
    print(f"data directory: {base.resolve()}; {n_small:,} x 100 B, {n_big:,} x 10 KiB, {n_sync:,} acknowledged one "
          f"by one, {repeat} repetition(s), holding {hold_gb} GB", flush=True)

    raw, big, small, eight, sync1, sync8, reads = [], [], [], [], [], [], []
    held: list[float] = []
    proc, uri = start_server(base / "server")
    try:
        import pravega_client

        pravega_client.StreamManager(uri).create_scope("bench")
        for i in range(repeat):
            # Baselines alternate with their figures so machine noise hits both.
            raw.append(disk_baseline(base, 5 * 1024 * 1024, 3))
            big.append(write_rate(uri, "bench", f"big{i}", 1, 1, n_big, 10 * 1024) * 10240 / 1e6)
            small.append(write_rate(uri, "bench", f"small{i}", 1, 1, n_small, 100))
            eight.append(write_rate(uri, "bench", f"eight{i}", 8, 8, n_small // 8, 100))
            sync1.append(write_rate(uri, "bench", f"sync1-{i}", 1, 1, n_sync, 100, inflight=0))
            sync8.append(write_rate(uri, "bench", f"sync8-{i}", 8, 8, n_sync // 8 or 1, 100, inflight=0))
            reads.append(read_rate(uri, "bench", f"small{i}", n_small, f"rg{i}"))
            print(f"run {i + 1}/{repeat}: raw disk {raw[-1]:.0f} MB/s, 1 writer 10 KiB {big[-1]:.0f} MB/s; "
                  f"1 writer 100 B {small[-1]:,.0f} ev/s, 8 writers {eight[-1]:,.0f} ev/s; one by one: 1 writer "
                  f"{sync1[-1]:,.0f} ev/s, 8 writers {sync8[-1]:,.0f} ev/s; catch-up read {reads[-1]:,.0f} ev/s",
                  flush=True)
        if hold_gb > 0:
            held = hold_and_read(proc, uri, hold_gb, repeat)
            print(f"server holding {hold_gb:g} GB: RSS while serving a reader {', '.join(f'{m:.0f}' for m in held)} MB",
                  flush=True)
        server_peak = rf.rss_mb(proc.pid)[1]
    finally:
        proc.terminate()
        proc.wait(30)
        if args.data_dir is None:
            import shutil

            shutil.rmtree(base, ignore_errors=True)

    figures = [
        rf.figure("1 writer, 100 B events", "events/s", small, target=100_000.0),
        rf.figure("1 writer, 10 KiB events", "MB/s", big,
                  baseline=("raw append+fdatasync, 5 MiB blocks", raw), target_ratio=0.5),
        rf.figure("8 writers, 100 B events", "events/s", eight,
                  baseline=("1 writer, 100 B events", small), target_ratio=1.0),
        rf.figure("8 writers, each write acked before the next", "events/s", sync8,
                  baseline=("1 writer, each write acked before the next", sync1), target_ratio=1.0),
        rf.figure("catch-up read, 100 B events", "events/s", reads,
                  baseline=("1 writer, 100 B events (write rate)", small), target_ratio=1.0),
    ]
    if held:
        figures.append(rf.figure(f"server RSS holding {hold_gb:g} GB, serving a reader", "MB", held,
                                 higher_is_better=False, target=300.0))
    notes = [
        "durable acknowledgements (fdatasync before every ack); official client 0.3.8, window 1000 events "
        "unless 'each write acked before the next' (window 0)",
        f"the server is its own process; writers are spawned processes; the data directory is on the disk of {base.parent.resolve()}",
    ]
    data = rf.result(
        "server",
        {"events": n_small, "events_10kib": n_big, "events_acked_one_by_one": n_sync, "repeat": repeat,
         "hold_gb": hold_gb},
        figures, {"server": server_peak, "writer": WRITER_PEAK_MB[0], "reader (bench process)": rf.rss_mb()[1]},
        notes,
    )
    print()
    print(rf.format_table([data]))
    print(rf.format_peaks([data]))
    rf.write(args.json, data)
    if args.json:
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
