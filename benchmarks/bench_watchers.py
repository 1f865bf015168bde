"""Controller calls per minute of the stream trigger's AssetWatchers: one watcher against ten of the
same stream on Airflow 3.3's shared poll, and ten each polling on their own (``run``, Airflow 3.2's
path), next to each other.

Run: ``python benchmarks/bench_watchers.py [--watchers 10] [--seconds 30] [--repeat 2] [--json PATH]``

An in-process embedded server counts the controller calls it serves (``rpc_calls``); the watchers
run in this process's event loop on Airflow's own ``SharedStreamManager``
(``pravega_testing/shared_streams.py``), every event confirmed stored at once, while a writer adds
an event a second. ``poll_interval`` is 1 s, ``after_cut='tail'`` (a start costs no call). Figures: calls per minute of ten shared watchers
against one (target: ratio <= 1.5), and of ten watchers with their own polls against one (no
target: what the shared poll saves).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import result_file as rf  # noqa: E402

POLL_INTERVAL = 1.0


def watchers(scope: str, stream: str, count: int) -> list[Any]:
    """``count`` watchers of one stream, each with its own asset state store (distinct triggers)."""
    from airflow_provider_pravega.triggers import PravegaStreamTrigger
    from pravega_testing.shared_streams import StateStore

    made = []
    for n in range(count):
        trigger = PravegaStreamTrigger(stream=stream, scope=scope, after_cut="tail", poll_interval=POLL_INTERVAL,
                                       min_bytes=n)  # distinct triggers; any new event is more
        trigger.asset_state_store = StateStore()
        made.append(trigger)
    return made


async def shared(triggers: list[Any], seconds: float) -> None:
    from pravega_testing.shared_streams import SharedStreamTriggerer

    triggerer = SharedStreamTriggerer()
    for n, trigger in enumerate(triggers):
        triggerer.watch(n, trigger)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        for n in range(len(triggers)):
            triggerer.persist(n)
    await triggerer.crash()


async def own_polls(triggers: list[Any], seconds: float) -> None:
    async def drain(trigger: Any) -> None:
        async for _event in trigger.run():
            pass

    tasks = [asyncio.create_task(drain(t)) for t in triggers]
    await asyncio.sleep(seconds)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def calls_per_minute(server: Any, scope: str, stream: str, count: int, seconds: float, mode: str) -> float:
    triggers = watchers(scope, stream, count)
    before = Counter(server.controller.rpc_calls)
    started = time.monotonic()
    asyncio.run((shared if mode == "shared" else own_polls)(triggers, seconds))
    elapsed = time.monotonic() - started
    served = Counter(server.controller.rpc_calls) - before
    print(f"  {count:>3} watcher(s), {mode:>6} poll, {elapsed:.0f} s: {dict(served)}", flush=True)
    return sum(served.values()) * 60.0 / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--watchers", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each sample")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="write the result file here")
    args = parser.parse_args()
    import json
    import os

    from airflow_provider_pravega.client import PravegaClient
    from airflow_provider_pravega.embedded.server import EmbeddedPravega, ServerSettings

    samples: dict[str, list[float]] = {"one": [], "shared": [], "own": []}
    with tempfile.TemporaryDirectory(prefix="bench-watchers-") as tmp:
        server = EmbeddedPravega(ServerSettings(data_dir=Path(tmp), port=0, segment_store_port=0, fsync=False))
        server.start()
        stop = threading.Event()
        try:
            host, port = server.controller_uri.rsplit("//", 1)[1].rsplit(":", 1)
            os.environ["AIRFLOW_CONN_PRAVEGA_DEFAULT"] = json.dumps({"conn_type": "pravega", "host": host,
                                                                     "port": int(port)})
            scope, stream = "bench", "readings"
            with PravegaClient(server.controller_uri) as client:
                client.admin.create_scope(scope)
                client.admin.create_stream(scope, stream, 1)

            def writer() -> None:
                with PravegaClient(server.controller_uri) as client, client.event_writer(scope, stream) as out:
                    n = 0
                    while not stop.wait(1.0):
                        out.write_events([f"reading-{n}".encode()])
                        out.flush()
                        n += 1

            thread = threading.Thread(target=writer, daemon=True)
            thread.start()
            # Samples alternate, so a change in the machine's load hits every kind.
            for _ in range(args.repeat):
                for kind, count, mode in (("one", 1, "shared"), ("shared", args.watchers, "shared"),
                                          ("own", args.watchers, "own")):
                    value = calls_per_minute(server, scope, stream, count, args.seconds, mode)
                    samples[kind].append(value)
                    print(f"  {count:>3} watcher(s), {mode:>6} poll: {value:8.1f} controller calls/min", flush=True)
        finally:
            stop.set()
            server.stop()
    one, many, own = (statistics.median(samples[k]) for k in ("one", "shared", "own"))
    print(f"1 watcher {one:.1f}/min; {args.watchers} shared {many:.1f}/min (ratio {many / one:.2f}, target <= 1.5); "
          f"{args.watchers} own polls {own:.1f}/min (ratio {own / one:.2f})")
    rf.write(args.json, rf.result(
        "watchers",
        {"watchers": args.watchers, "seconds": args.seconds, "repeat": args.repeat, "poll_interval": POLL_INTERVAL},
        [
            rf.figure(f"controller calls/min, {args.watchers} watchers on one shared poll", "calls/min",
                      samples["shared"], higher_is_better=False, baseline=("1 watcher", samples["one"]),
                      target_ratio=1.5),
            rf.figure(f"controller calls/min, {args.watchers} watchers each polling (Airflow 3.2 path)", "calls/min",
                      samples["own"], higher_is_better=False, baseline=("1 watcher", samples["one"])),
        ],
        notes=["the writer (one event a second) shares the server: its controller calls are in every sample"],
    ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
