"""Batch-read rate: segment ranges read straight from the segment store vs an official reader group.

Run: ``python benchmarks/bench_batch_read.py [--events 1000000] [--size 100] [--segments 4]
[--workers 4] [--rounds 3] [--profile] [--json PATH]``

Writes ``--events`` events of ``--size`` bytes (official writer, routing keys spread over the
segments) to a fresh stream on the embedded server (its own process), takes the tail cut, then:

- ranges, Event iterator: ``plan_segment_ranges(head, tail)``, then ``read_segment_range`` over
  every range, one after the other, in one spawned process;
- ranges, EventBatch: the same with ``read_segment_range_batches`` (one list of payloads per reply);
- ranges, N processes: one range per spawned process (``--workers`` at a time), as Spark tasks;
- official: one reader of a reader group from the head until it has every event.

Prints events/s and MB/s of payload for each (best of ``--rounds``) and the table of medians;
each round runs every mode, so machine noise hits all. ``--profile`` prints the top functions of
the single-process range read under cProfile. ``--json PATH`` writes the result file
(benchmarks/result_file.py): each range read as a figure with the official reader group as its
baseline (no target: the figures say how the batch path compares).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import result_file as rf

SPAWN = mp.get_context("spawn")


def write_events(uri: str, scope: str, stream: str, events: int, size: int, segments: int) -> None:
    import pravega_client

    manager = pravega_client.StreamManager(uri)
    manager.create_scope(scope)
    manager.create_stream(scope, stream, segments)
    writer = manager.create_writer(scope, stream, 1000)
    payload = b"x" * size
    keys = [f"key-{i}" for i in range(64)]
    for i in range(events):
        writer.write_event_bytes(payload, routing_key=keys[i & 63])
    writer.flush()


def warm_up() -> None:
    """Pool initializer: import everything before anything is timed."""
    import pravega_client  # noqa: F401

    import airflow_provider_pravega.client
    import airflow_provider_pravega.client.batch  # noqa: F401


def read_ranges(uri: str, ranges: list, mode: str = "events", profile: bool = False) -> tuple[int, int, float]:
    """(events, payload bytes, seconds) of reading ``ranges`` in this process, one Event at a time
    (``mode="events"``) or one EventBatch per reply (``mode="batches"``)."""
    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.client.batch import (
        read_segment_range,
        read_segment_range_batches,
    )

    with PravegaClient(uri) as client:
        client.controller.get_uri(ranges[0].scope, ranges[0].stream, ranges[0].segment_id)  # warm the channel

        def body() -> tuple[int, int]:
            count = size = 0
            for rng in ranges:
                if mode == "batches":
                    for batch in read_segment_range_batches(client, rng):
                        count += len(batch.payloads)
                        size += sum(map(len, batch.payloads))
                else:
                    for event in read_segment_range(client, rng):
                        count += 1
                        size += len(event.payload)
            return count, size

        started = time.perf_counter()
        if profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            count, size = prof.runcall(body)
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)
        else:
            count, size = body()
        return count, size, time.perf_counter() - started


def read_official(uri: str, scope: str, stream: str, expected: int) -> tuple[int, int, float]:
    import asyncio

    import pravega_client

    manager = pravega_client.StreamManager(uri)
    group = manager.create_reader_group(f"bench{time.monotonic_ns() % 10**9}", scope, stream)
    reader = group.create_reader("r0")

    async def run() -> tuple[int, int]:
        count = size = 0
        while count < expected:
            sl = await reader.get_segment_slice_async()
            for event in sl:
                count += 1
                size += len(event.data())
            reader.release_segment(sl)
        return count, size

    started = time.perf_counter()
    count, size = asyncio.run(run())
    elapsed = time.perf_counter() - started
    reader.reader_offline()
    return count, size, elapsed


def report(name: str, results: list[tuple[int, int, float]], expected: int) -> None:
    best = min(results, key=lambda r: r[2])
    count, size, seconds = best
    status = "" if count == expected else f"  (read {count} of {expected}!)"
    print(f"{name:<24} {count / seconds:>12,.0f} events/s {size / seconds / 1e6:>9.1f} MB/s {seconds:>8.2f} s{status}")


def main() -> None:
    rf.require_official_client()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--segments", type=int, default=4)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="write the result file here")
    args = parser.parse_args()

    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.client.batch import plan_segment_ranges
    from airflow_provider_pravega.client.streamcut import StreamCut
    from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess

    with tempfile.TemporaryDirectory() as data_dir, EmbeddedPravegaProcess(data_dir) as server:
        uri = server.controller_uri
        scope, stream = "bench", "batch"
        started = time.perf_counter()
        with SPAWN.Pool(1) as pool:
            pool.apply(write_events, (uri, scope, stream, args.events, args.size, args.segments))
        print(f"wrote {args.events:,} events of {args.size} bytes in {time.perf_counter() - started:.1f} s")

        with PravegaClient(uri) as client:
            started = time.perf_counter()
            ranges = plan_segment_ranges(
                client, StreamCut.head(client, scope, stream), StreamCut.tail(client, scope, stream)
            )
            print(f"planned {len(ranges)} ranges in {(time.perf_counter() - started) * 1000:.1f} ms")

        single, batches, parallel, official = [], [], [], []
        with SPAWN.Pool(1, initializer=warm_up) as one, SPAWN.Pool(args.workers, initializer=warm_up) as many:
            many.map(time.sleep, [0.5] * args.workers, chunksize=1)  # every worker is up and warm
            for _ in range(args.rounds):
                single.append(one.apply(read_ranges, (uri, ranges)))
                batches.append(one.apply(read_ranges, (uri, ranges, "batches")))
                started = time.perf_counter()
                parts = many.starmap(read_ranges, [(uri, [r], "batches") for r in ranges], chunksize=1)
                parallel.append((sum(p[0] for p in parts), sum(p[1] for p in parts), time.perf_counter() - started))
                official.append(one.apply(read_official, (uri, scope, stream, args.events)))

        report("ranges, Event iterator", single, args.events)
        report("ranges, EventBatch", batches, args.events)
        report(f"ranges, {args.workers} processes", parallel, args.events)
        report("official reader group", official, args.events)

        def rates(results: list[tuple[int, int, float]]) -> list[float]:
            return [count / seconds for count, _, seconds in results]

        baseline = ("official reader group, one reader", rates(official))
        result = rf.result(
            "batch_read",
            {"events": args.events, "size": args.size, "segments": args.segments, "workers": args.workers,
             "rounds": args.rounds, "ranges": len(ranges)},
            [rf.figure("ranges, Event iterator, one process", "events/s", rates(single), baseline=baseline),
             rf.figure("ranges, EventBatch, one process", "events/s", rates(batches), baseline=baseline),
             rf.figure(f"ranges, {args.workers} processes", "events/s", rates(parallel), baseline=baseline)],
            notes=[("every figure reads the same planned ranges (head to tail); the baseline reads the stream "
                    "from its head with the official client's reader group until it has every event")],
        )
        print(rf.format_table([result]))
        rf.write(args.json, result)
        if args.profile:
            with SPAWN.Pool(1) as pool:
                pool.apply(read_ranges, (uri, ranges, "batches", True))


if __name__ == "__main__":
    main()
