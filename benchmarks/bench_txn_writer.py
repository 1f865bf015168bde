"""Transactional write rate: the official client vs our TransactionalWriter.

Run: ``python benchmarks/bench_txn_writer.py [--events 500000] [--size 100] [--rounds 3]
[--segments 1] [--profile] [--json PATH]``

Each round writes N events of ``--size`` bytes into one transaction of a fresh stream on the
embedded server and commits it:

- official: ``StreamManager.create_transaction_writer`` -> ``begin_txn`` -> ``write_event_bytes``
  x N -> ``commit`` (which waits for every event, then commits);
- ours: ``TransactionManager.begin`` -> ``TransactionalWriter.write_event`` x N -> ``flush``
  (every event acknowledged) -> ``commit`` through the controller (waits for COMMITTED).

The server runs as its own process and each client runs in its own spawned process, so nothing
shares a GIL. Rounds alternate the two. Prints both rates (best and median of the rounds), the
ratio of the medians (target: ours >= 70 % of the official client), and with ``--profile`` the top
functions of our writer under cProfile. ``--json`` writes the result file of
``benchmarks/result_file.py`` with every round's rate.
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


def run_official(
    uri: str, scope: str, stream: str, events: int, size: int, out
) -> None:
    import pravega_client

    manager = pravega_client.StreamManager(uri)
    writer = manager.create_transaction_writer(scope, stream, 1)
    payload = b"x" * size
    started = time.perf_counter()
    txn = writer.begin_txn()
    for _ in range(events):
        txn.write_event_bytes(payload)
    txn.commit()
    out.put((time.perf_counter() - started, rf.rss_mb()[1]))


def run_ours(
    uri: str, scope: str, stream: str, events: int, size: int, profile: bool, out
) -> None:
    from airflow_provider_pravega.client import PravegaClient

    payload = b"x" * size
    with PravegaClient(uri) as client:
        client.controller.get_current_segments(
            scope, stream
        )  # connect the channel, as the official one does lazily

        def body() -> float:
            started = time.perf_counter()
            txn = client.transactions.begin(scope, stream)
            writer = client.transactions.writer(scope, stream, txn, check_open=False)
            write = writer.write_event
            for _ in range(events):
                write(payload)
            writer.flush()
            writer.close()
            client.transactions.commit(scope, stream, txn.txn_id)
            return time.perf_counter() - started

        if profile:
            import cProfile
            import io
            import pstats

            prof = cProfile.Profile()
            elapsed = prof.runcall(body)
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(12)
            print(text.getvalue(), flush=True)
        else:
            elapsed = body()
    out.put((elapsed, rf.rss_mb()[1]))


def main() -> None:
    rf.require_official_client()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--segments", type=int, default=1)
    parser.add_argument(
        "--profile", action="store_true", help="profile one extra round of our writer"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the result file here")
    args = parser.parse_args()

    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.embedded.process import embedded_pravega_process

    ctx = mp.get_context("spawn")
    with embedded_pravega_process() as server:
        uri = server.controller_uri
        print(
            f"embedded server {uri}; {args.events} events of {args.size} bytes per transaction, "
            f"{args.segments} segment(s), {args.rounds} rounds",
            flush=True,
        )
        with PravegaClient(uri) as client:
            client.admin.create_scope("bench")

            def fresh_stream(name: str) -> str:
                client.admin.create_stream("bench", name, args.segments)
                return name

            def timed(target, *extra) -> float:
                out = ctx.Queue()
                proc = ctx.Process(target=target, args=(*extra, out))
                proc.start()
                elapsed, peak = out.get(timeout=600)
                proc.join(60)
                kind = "official writer" if target is run_official else "our writer"
                peaks[kind] = max(peaks.get(kind, 0.0), peak)
                return elapsed

            rates: dict[str, list[float]] = {"official": [], "ours": []}
            peaks: dict[str, float] = {}
            for r in range(args.rounds):
                for name in ("official", "ours"):
                    stream = fresh_stream(f"{name}-{r}")
                    if name == "official":
                        elapsed = timed(
                            run_official, uri, "bench", stream, args.events, args.size
                        )
                    else:
                        elapsed = timed(
                            run_ours,
                            uri,
                            "bench",
                            stream,
                            args.events,
                            args.size,
                            False,
                        )
                    info = client.admin.stream_info("bench", stream)
                    expected = args.events * (args.size + 8)
                    stored = sum(info.tail.values())
                    if stored != expected:
                        raise SystemExit(
                            f"{name}: stream holds {stored} bytes, expected {expected}"
                        )
                    rate = args.events / elapsed
                    rates[name].append(rate)
                    print(
                        f"round {r + 1} {name:>8}: {rate:12,.0f} events/s  ({elapsed:.2f} s, "
                        f"{expected / elapsed / 1e6:.1f} MB/s)",
                        flush=True,
                    )
            if args.profile:
                timed(
                    run_ours,
                    uri,
                    "bench",
                    fresh_stream("profiled"),
                    args.events,
                    args.size,
                    True,
                )
            peaks["server"] = rf.rss_mb(server.pid)[1] if getattr(server, "pid", None) else 0.0

    best_official, best_ours = max(rates["official"]), max(rates["ours"])
    print()
    print(
        f"official client : {best_official:12,.0f} events/s (best; median {statistics.median(rates['official']):,.0f})"
    )
    print(
        f"ours            : {best_ours:12,.0f} events/s (best; median {statistics.median(rates['ours']):,.0f})"
    )
    print(f"ratio ours/official: {best_ours / best_official:.2f} (best), "
          f"{statistics.median(rates['ours']) / statistics.median(rates['official']):.2f} (medians; target >= 0.70)")
    data = rf.result(
        "txn_writer",
        {"events": args.events, "size": args.size, "rounds": args.rounds, "segments": args.segments},
        [rf.figure(f"our transactional writer, {args.size} B events", "events/s", rates["ours"],
                   baseline=("official client, one transaction", rates["official"]), target_ratio=0.7)],
        {k: v for k, v in peaks.items() if v},
        ["one transaction of all the events per round, written and committed (COMMITTED awaited); "
         "each client in its own spawned process, the server in another"],
    )
    print(rf.format_table([data]))
    rf.write(args.json, data)


if __name__ == "__main__":
    main()
