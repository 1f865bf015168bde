"""Benchmark the embedded server with the official ``pravega`` client, next to its baselines.

Run: ``.venv/bin/python benchmarks/bench_server.py [--quick] [--hold-gb 5]``

Figures (each next to the baseline it is judged against, measured in the same run):
- raw disk: sequential append + fdatasync bandwidth of the data directory's disk, in the block sizes
  the client sends (the ceiling for durable acks);
- one writer of 100-byte events (target >= 100,000 events/s);
- one writer of 10-KiB events, MB/s vs the raw disk (target >= 50 %);
- 8 concurrent writer processes vs one (target: scale above one);
- catch-up read of stored data with a reader group vs the write rate (target: at least as fast);
- server RSS while holding ``--hold-gb`` GB and serving a reader (target < 300 MB).

The server runs as its own process (``python -m airflow_provider_pravega.embedded``), as users run
it; clients run in other processes so nobody shares a GIL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

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


def rss_mb(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of a process in MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        fields[k] = v.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


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
    result.put((t0, time.perf_counter()))


def write_rate(uri: str, scope: str, stream: str, segments: int, writers: int, count: int, size: int,
               inflight: int = 1000) -> float:
    """Events/s of ``writers`` processes writing ``count`` events each (durable acks).

    ``inflight`` is the official writer's window: 1000 pipelines appends (throughput), 0 makes
    every ``write_event`` wait for its acknowledgement (latency-bound; shows group commit)."""
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
    start.set()
    spans = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    t0 = min(s for s, _ in spans)
    t1 = max(e for _, e in spans)
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


def median_spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one repetition (a minute or two)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hold-gb", type=float, default=5.0, help="data held for the memory figure (0 skips it)")
    ap.add_argument("--out", type=Path, default=Path("bench-results/server.json"))
    ap.add_argument("--data-dir", type=Path, default=None, help="where the server keeps data (default: a temp dir under the CWD's disk)")
    args = ap.parse_args()
    repeat = 1 if args.quick else args.repeat
    n_small = 200_000 if args.quick else 1_000_000
    n_big = 10_000 if args.quick else 40_000
    hold_gb = min(args.hold_gb, 0.5) if args.quick else args.hold_gb

    base = args.data_dir or Path(tempfile.mkdtemp(prefix="pravega-bench-", dir="."))
    base.mkdir(parents=True, exist_ok=True)
    results: dict = {"machine": {"cores": os.cpu_count(), "python": sys.version.split()[0]}}
    print(f"data directory: {base.resolve()}")

    raw_small = [disk_baseline(base, 54_000, 3) for _ in range(repeat)]
    raw_big = [disk_baseline(base, 5 * 1024 * 1024, 3) for _ in range(repeat)]
    results["raw_disk_mb_s_54KB"] = median_spread(raw_small)
    results["raw_disk_mb_s_5MB"] = median_spread(raw_big)
    print(f"raw disk append+fdatasync: {statistics.median(raw_small):.0f} MB/s (54 KB blocks), "
          f"{statistics.median(raw_big):.0f} MB/s (5 MiB blocks)")

    proc, uri = start_server(base / "server")
    try:
        import pravega_client

        mgr = pravega_client.StreamManager(uri)
        mgr.create_scope("bench")
        small, big, eight = [], [], []
        for i in range(repeat):
            small.append(write_rate(uri, "bench", f"small{i}", 1, 1, n_small, 100))
            big.append(write_rate(uri, "bench", f"big{i}", 1, 1, n_big, 10 * 1024))
            eight.append(write_rate(uri, "bench", f"eight{i}", 8, 8, n_small // 8, 100))
            print(f"run {i + 1}: 1 writer 100 B {small[-1]:,.0f} ev/s; 1 writer 10 KiB {big[-1]:,.0f} ev/s "
                  f"({big[-1] * 10240 / 1e6:.0f} MB/s); 8 writers 100 B {eight[-1]:,.0f} ev/s")
        results["write_100B_1_writer_ev_s"] = median_spread(small)
        results["write_10KiB_1_writer_mb_s"] = median_spread([b * 10240 / 1e6 for b in big])
        results["write_100B_8_writers_ev_s"] = median_spread(eight)
        n_sync = 2_000 if args.quick else 5_000
        sync1 = [write_rate(uri, "bench", f"sync1-{i}", 1, 1, n_sync, 100, inflight=0) for i in range(repeat)]
        sync8 = [write_rate(uri, "bench", f"sync8-{i}", 8, 8, n_sync, 100, inflight=0) for i in range(repeat)]
        results["write_sync_100B_1_writer_ev_s"] = median_spread(sync1)
        results["write_sync_100B_8_writers_ev_s"] = median_spread(sync8)
        print(f"acknowledged one by one (window 0): 1 writer {statistics.median(sync1):,.0f} ev/s, "
              f"8 writers {statistics.median(sync8):,.0f} ev/s")
        reads = [read_rate(uri, "bench", "small0", n_small, f"rg{i}") for i in range(repeat)]
        results["catchup_read_100B_ev_s"] = median_spread(reads)
        print(f"catch-up read 100 B: {statistics.median(reads):,.0f} ev/s")

        if hold_gb > 0:
            mgr.create_stream("bench", "hold", 4)
            target = int(hold_gb * 1e9)
            per_writer = target // (4 * 1024 * 1024) // 4
            write_rate(uri, "bench", "hold", 4, 4, per_writer, 1024 * 1024 - 64)
            peak_during_reads = []
            stop = threading.Event()

            def sample() -> None:
                while not stop.is_set():
                    peak_during_reads.append(rss_mb(proc.pid)[0])
                    time.sleep(0.2)

            t = threading.Thread(target=sample)
            t.start()
            read_rate(uri, "bench", "hold", 200, "rg-hold")
            stop.set()
            t.join()
            rss_now, rss_peak = rss_mb(proc.pid)
            results["hold_gb"] = hold_gb
            results["server_rss_mb_while_reading"] = max(peak_during_reads)
            results["server_rss_mb_peak_lifetime"] = rss_peak
            print(f"server holding {hold_gb:.1f} GB: RSS {max(peak_during_reads):.0f} MB while serving a reader "
                  f"(lifetime peak {rss_peak:.0f} MB)")
    finally:
        proc.terminate()
        proc.wait(30)

    s = results
    table = [
        ("1 writer, 100 B events", f"{s['write_100B_1_writer_ev_s']['median']:,.0f} ev/s", "target 100,000 ev/s",
         s["write_100B_1_writer_ev_s"]["median"] / 100_000),
        ("1 writer, 10 KiB events", f"{s['write_10KiB_1_writer_mb_s']['median']:.0f} MB/s",
         f"raw disk {s['raw_disk_mb_s_5MB']['median']:.0f} MB/s",
         s["write_10KiB_1_writer_mb_s"]["median"] / s["raw_disk_mb_s_5MB"]["median"]),
        ("8 writers, 100 B events", f"{s['write_100B_8_writers_ev_s']['median']:,.0f} ev/s",
         f"1 writer {s['write_100B_1_writer_ev_s']['median']:,.0f} ev/s",
         s["write_100B_8_writers_ev_s"]["median"] / s["write_100B_1_writer_ev_s"]["median"]),
        ("8 writers, window 0 (group commit)", f"{s['write_sync_100B_8_writers_ev_s']['median']:,.0f} ev/s",
         f"1 writer {s['write_sync_100B_1_writer_ev_s']['median']:,.0f} ev/s",
         s["write_sync_100B_8_writers_ev_s"]["median"] / s["write_sync_100B_1_writer_ev_s"]["median"]),
        ("catch-up read, 100 B", f"{s['catchup_read_100B_ev_s']['median']:,.0f} ev/s",
         f"write {s['write_100B_1_writer_ev_s']['median']:,.0f} ev/s",
         s["catchup_read_100B_ev_s"]["median"] / s["write_100B_1_writer_ev_s"]["median"]),
    ]
    if "server_rss_mb_while_reading" in s:
        table.append((f"server RSS holding {s['hold_gb']:.1f} GB", f"{s['server_rss_mb_while_reading']:.0f} MB",
                      "limit 300 MB", s["server_rss_mb_while_reading"] / 300))
    print()
    print(f"{'figure':36} {'value':>18} {'baseline':>28} {'ratio':>7}")
    for name, value, baseline, ratio in table:
        print(f"{name:36} {value:>18} {baseline:>28} {ratio:7.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"\nresults written to {args.out}")
    if args.data_dir is None:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
