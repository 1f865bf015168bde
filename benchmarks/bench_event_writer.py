"""Plain (at-least-once) write rate: the official client's writer vs our EventWriter.

Run: ``python benchmarks/bench_event_writer.py [--events 500000] [--size 200] [--keys 100]
[--segments 2] [--rounds 3] [--json PATH]``

Each round writes N events of ``--size`` bytes, each with one of ``--keys`` routing keys (as the
at_least_once ingest does with ``routing_key_field``), into a fresh stream of the embedded server,
and waits until every event is acknowledged:

- official (the baseline): ``StreamManager.create_writer(scope, stream, 1000)`` (1,000 events in
  flight, what at_least_once used before) -> ``write_event_bytes(payload, key)`` x N -> ``flush``;
- ours: ``PravegaClient.event_writer(scope, stream)`` (1,000 events in flight per segment) ->
  ``write_event(payload, key)`` x N -> ``flush``: what at_least_once writes through now.

The server runs as its own process and each writer in its own spawned process; rounds alternate
the two. Two figures, each with the official writer as its baseline (target: ours >= 0.95 x):
events/s (wall) and events per CPU-second of the writer's process (all its threads: the official
client's Rust runtime too), which is steadier than wall time on a shared machine. ``--json``
writes the result file of ``benchmarks/result_file.py``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import result_file as rf  # noqa: E402


def _events(events: int, size: int, keys: int) -> tuple[list[bytes], list[str]]:
    names = [f"sensor-{i:04d}" for i in range(keys)]
    payload = b"x" * size
    return [payload] * events, [names[i % keys] for i in range(events)]


def run_official(uri: str, scope: str, stream: str, events: int, size: int, keys: int, out) -> None:
    import pravega_client

    payloads, routing_keys = _events(events, size, keys)
    manager = pravega_client.StreamManager(uri)  # kept referenced: it owns the writer's runtime
    writer = manager.create_writer(scope, stream, 1000)
    wall, cpu = time.perf_counter(), time.process_time()
    write = writer.write_event_bytes
    for payload, key in zip(payloads, routing_keys):
        write(payload, key)
    writer.flush()
    out.put((time.perf_counter() - wall, time.process_time() - cpu, rf.rss_mb()[1]))


def run_ours(uri: str, scope: str, stream: str, events: int, size: int, keys: int, out) -> None:
    from airflow_provider_pravega.client import PravegaClient

    payloads, routing_keys = _events(events, size, keys)
    with PravegaClient(uri) as client:
        client.controller.get_current_segments(scope, stream)  # connect, as the official one does on create_writer
        wall, cpu = time.perf_counter(), time.process_time()
        writer = client.event_writer(scope, stream)
        write = writer.write_event
        for payload, key in zip(payloads, routing_keys):
            write(payload, key)
        writer.flush()
        elapsed, used = time.perf_counter() - wall, time.process_time() - cpu
        writer.close()
    out.put((elapsed, used, rf.rss_mb()[1]))


def _result(proc, out, name: str) -> tuple[float, float, float]:
    """The writer process's figures; a writer that died is an error, not a wait."""
    import queue

    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        try:
            got = out.get(timeout=1)
        except queue.Empty:
            if proc.exitcode is not None:
                raise SystemExit(f"the {name} writer process exited with {proc.exitcode} before reporting") from None
            continue
        proc.join(60)
        return got
    proc.kill()
    raise SystemExit(f"the {name} writer did not finish within 900 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--segments", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write the result file here")
    args = parser.parse_args()
    rf.require_official_client()

    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.embedded.process import embedded_pravega_process

    ctx = mp.get_context("spawn")
    rates: dict[str, list[float]] = {"official": [], "ours": []}
    per_cpu: dict[str, list[float]] = {"official": [], "ours": []}
    peaks: dict[str, float] = {}
    with embedded_pravega_process() as server:
        uri = server.controller_uri
        print(f"embedded server {uri}; {args.events} events of {args.size} bytes, {args.keys} routing keys, "
              f"{args.segments} segment(s), {args.rounds} rounds", flush=True)
        with PravegaClient(uri) as client:
            client.admin.create_scope("bench")
            for r in range(args.rounds):
                for name, target in (("official", run_official), ("ours", run_ours)):
                    stream = f"{name}-{r}"
                    client.admin.create_stream("bench", stream, args.segments)
                    out = ctx.Queue()
                    proc = ctx.Process(target=target, args=(uri, "bench", stream, args.events, args.size,
                                                            args.keys, out))
                    proc.start()
                    elapsed, cpu, peak = _result(proc, out, name)
                    peaks[f"{name} writer"] = max(peaks.get(f"{name} writer", 0.0), peak)
                    stored = sum(client.admin.stream_info("bench", stream).tail.values())
                    expected = args.events * (args.size + 8)
                    if stored != expected:
                        raise SystemExit(f"{name}: stream holds {stored} bytes, expected {expected}")
                    rates[name].append(args.events / elapsed)
                    per_cpu[name].append(args.events / cpu)
                    print(f"round {r + 1} {name:>8}: {args.events / elapsed:12,.0f} events/s ({elapsed:.2f} s wall, "
                          f"{cpu:.2f} CPU-s: {args.events / cpu:,.0f} events per CPU-s)", flush=True)
        peaks["server"] = rf.rss_mb(server.pid)[1] if getattr(server, "pid", None) else 0.0

    med = {k: statistics.median(v) for k, v in rates.items()}
    med_cpu = {k: statistics.median(v) for k, v in per_cpu.items()}
    print(f"\nratio ours/official: {med['ours'] / med['official']:.2f} events/s (medians), "
          f"{med_cpu['ours'] / med_cpu['official']:.2f} events per CPU-s (target >= 0.95)")
    data = rf.result(
        "event_writer",
        {"events": args.events, "size": args.size, "keys": args.keys, "segments": args.segments, "rounds": args.rounds},
        [rf.figure(f"our EventWriter (at_least_once), {args.size} B events, keyed", "events/s", rates["ours"],
                   baseline=("official create_writer(..., 1000)", rates["official"]), target_ratio=0.95),
         rf.figure("our EventWriter, events per CPU-second of the writer process", "events/CPU-s", per_cpu["ours"],
                   baseline=("official writer, events per CPU-second", per_cpu["official"]), target_ratio=0.95)],
        {k: v for k, v in peaks.items() if v},
        ["each writer in its own spawned process, the server in another; rounds alternate; "
         "time from the first write to the flush that acknowledged the last event"],
    )
    print(rf.format_table([data]))
    rf.write(args.json, data)


if __name__ == "__main__":
    main()
