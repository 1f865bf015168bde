"""Ingest state size vs the start of a run: start_run latency and driver memory with a small and a
large number of remembered (committed) files.

Run: ``python benchmarks/bench_ingest_state.py [--files 1000000] [--small 10000] [--repeat 3]
[--json PATH]``

For each size an ingest on the embedded server remembers that many committed files: they are
written in bulk into its committed-file table (a table segment keyed by file, where runs record
them), its state synchronizer holds the run protocol only, compacted. Each sample runs in a fresh
spawned process, as a new Airflow task would: open the state, recover, plan and record a run over
110 listed files — 100 already committed (skipped), 10 new (``IngestCoordinator.start_run``) —
then abandon it. Figures: the latency of that (from opening the state to the run's record) and the
process's peak RSS, for the large state against the small one (target: ratio <= 1.5).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import result_file as rf  # noqa: E402

def path(n: int) -> str:
    return f"s3a://bucket/incoming/2026-11-{n % 28 + 1:02d}/part-{n:08d}.jsonl"


def fill(uri: str, scope: str, stream: str, files: int) -> None:
    """An ingest remembering ``files`` committed files (in its table), its state compacted."""
    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.client.ingest import IngestCoordinator
    from airflow_provider_pravega.client.ingest_location import open_ingest_state

    with PravegaClient(uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, stream, 1)
        with open_ingest_state(client, scope, stream, "bench") as store:
            IngestCoordinator(store, client.transactions, scope, stream).recover()  # the keyed layout
            store.files.put_many(
                (path(n), {"size": 1_000_000 + n, "mtime": 1_790_000_000_000 + n, "run": f"fill-{n // 10_000}",
                           "at": 1_790_000_100_000 + n}) for n in range(files))
            for n in range(16):  # some run history, as a long-lived ingest's state has
                store.update(lambda _s, n=n: [{"op": "start", "run": f"r{n}", "files": {}, "owner": "b", "ts": 1},
                                              {"op": "abandon", "run": f"r{n}"}])
            store.compact()


def start_once(uri: str, scope: str, stream: str, files: int, out) -> None:
    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.client.ingest import IngestCoordinator
    from airflow_provider_pravega.client.ingest_location import open_ingest_state

    new = {f"s3a://bucket/incoming/2026-12-01/new-{n}.jsonl": {"size": 10 + n, "mtime": 1_800_000_000_000 + n}
           for n in range(10)}
    # 100 files the ingest already committed (spread over the table) are listed again and skipped.
    new.update({path(n): {"size": 1_000_000 + n, "mtime": 1_790_000_000_000 + n}
                for n in range(0, files, max(1, files // 100))})
    with PravegaClient(uri) as client:
        client.controller.get_current_segments(scope, stream)  # connect first, as a task would be
        started = time.perf_counter()
        with open_ingest_state(client, scope, stream, "bench") as store:
            coord = IngestCoordinator(store, client.transactions, scope, stream)
            coord.recover()
            run_id, plan = coord.start_run(new)[:2]
            elapsed = time.perf_counter() - started
            assert run_id is not None and len(plan.to_ingest) == 10 and len(plan.skipped) == len(new) - 10
            coord.abandon(run_id)
    out.put((elapsed, rf.rss_mb()[1]))


def sample(uri: str, scope: str, stream: str, files: int) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=start_once, args=(uri, scope, stream, files, out))
    proc.start()
    result = out.get(timeout=1800)
    proc.join()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1_000_000, help="remembered files of the large state")
    parser.add_argument("--small", type=int, default=10_000, help="remembered files of the small state")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write the result file here")
    args = parser.parse_args()
    from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess

    samples: dict[int, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-ingest-state-") as tmp:
        server = EmbeddedPravegaProcess(Path(tmp) / "data", extra_args=["--no-fsync"]).start()
        try:
            for files in (args.small, args.files):
                t0 = time.perf_counter()
                fill(server.controller_uri, f"state{files}", "s", files)
                print(f"{files:,} remembered files written in {time.perf_counter() - t0:.1f} s", flush=True)
            # Samples alternate between the two sizes, so a change in the machine's load hits both.
            for _ in range(args.repeat):
                for files in (args.small, args.files):
                    latency, rss = sample(server.controller_uri, f"state{files}", "s", files)
                    samples.setdefault(files, []).append((latency, rss))
                    print(f"  {files:>9,} files: start_run {latency * 1000:8.1f} ms, driver peak RSS {rss:7.1f} MB",
                          flush=True)
        finally:
            server.stop()
    small, large = samples[args.small], samples[args.files]
    ratio = statistics.median(s[0] for s in large) / statistics.median(s[0] for s in small)
    rss_ratio = statistics.median(s[1] for s in large) / statistics.median(s[1] for s in small)
    for name, part in (("small", small), ("large", large)):
        n = args.small if name == "small" else args.files
        print(f"{n:>9,} remembered files: start_run median {statistics.median(s[0] for s in part) * 1000:7.1f} ms, "
              f"driver peak RSS median {statistics.median(s[1] for s in part):6.1f} MB")
    print(f"ratio {args.files:,} vs {args.small:,} files: start_run latency {ratio:.2f}, driver RSS {rss_ratio:.2f} "
          f"(target <= 1.5)")
    rf.write(args.json, rf.result(
        "ingest_state",
        {"files": args.files, "small": args.small, "repeat": args.repeat},
        [
            rf.figure(f"start_run latency, {args.files:,} remembered files", "s", [s[0] for s in large],
                      higher_is_better=False, baseline=(f"{args.small:,} remembered files", [s[0] for s in small]),
                      target_ratio=1.5),
            rf.figure(f"driver peak RSS, {args.files:,} remembered files", "MB", [s[1] for s in large],
                      higher_is_better=False, baseline=(f"{args.small:,} remembered files", [s[1] for s in small]),
                      target_ratio=1.5),
        ],
        peak_rss_mb={"driver": max(s[1] for s in large)},
        notes=["remembered files live in a table segment keyed by file; a run looks up only the files it lists"],
    ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
