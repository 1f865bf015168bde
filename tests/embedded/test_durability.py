"""Durability: kill -9 the embedded server during heavy concurrent writes, restart it, count.

Writers are official-client processes that keep writing across the crashes (their reconnects
resend unacknowledged events with the original event numbers); at the end every event must be in
the stream exactly once. A second scenario kills the writers too and checks that every event a
writer saw acknowledged (``flush()`` returned) survived, with no duplicates and nothing partial.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import random
import re
import time
from collections import Counter

from pravega_clients import require_official_client

pravega_client = require_official_client()  # the oracle: the whole module needs it
import pytest

from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess

WRITERS = 4
EVENTS = 6000
FLUSH_EVERY = 200


def _writer(uri: str, scope: str, stream: str, wid: int, count: int, acked: mp.Value) -> None:
    mgr = pravega_client.StreamManager(uri)
    w = mgr.create_writer(scope, stream, 1000)
    for n in range(count):
        w.write_event(f"w{wid}-{n}", f"key{wid}-{n % 7}")
        if (n + 1) % FLUSH_EVERY == 0:
            w.flush()
            acked.value = n + 1
    w.flush()
    acked.value = count


def read_everything(uri: str, scope: str, stream: str, rg: str, settle_s: float = 6.0,
                    until=None, until_s: float = 300.0) -> list[str]:
    """Read from the head until ``until(events)`` holds (what the test expects at least: a loaded
    machine makes it slower, never different; at most ``until_s``), then until nothing new arrives
    for ``settle_s`` (anything beyond it, duplicates included, still arrives)."""
    mgr = pravega_client.StreamManager(uri)

    async def run() -> list[str]:
        group = mgr.create_reader_group(rg, scope, stream)
        reader = group.create_reader("r")
        got: list[str] = []
        quiet_since = time.monotonic()
        give_up = time.monotonic() + until_s
        while (time.monotonic() - quiet_since < settle_s
               or (until is not None and not until(got) and time.monotonic() < give_up)):
            try:
                sl = await asyncio.wait_for(reader.get_segment_slice_async(), settle_s)
            except asyncio.TimeoutError:
                break
            before = len(got)
            got.extend(e.data().decode() for e in sl)
            reader.release_segment(sl)
            if len(got) > before:
                quiet_since = time.monotonic()
        reader.reader_offline()
        return got

    return asyncio.run(run())


def start_writers(uri: str, scope: str, stream: str, count: int):
    ctx = mp.get_context("spawn")
    acked = [ctx.Value("q", 0) for _ in range(WRITERS)]
    procs = [ctx.Process(target=_writer, args=(uri, scope, stream, i, count, acked[i]), daemon=True)
             for i in range(WRITERS)]
    for p in procs:
        p.start()
    return procs, acked


@pytest.mark.timeout(600)
def test_kill9_during_writes_then_restart_every_event_exactly_once(tmp_path):
    rnd = random.Random(1234)
    server = EmbeddedPravegaProcess(tmp_path / "data").start()
    try:
        uri = server.controller_uri
        mgr = pravega_client.StreamManager(uri)
        mgr.create_scope("dur")
        mgr.create_stream("dur", "s", 4)
        procs, acked = start_writers(uri, "dur", "s", EVENTS)
        for crash in range(3):
            time.sleep(rnd.uniform(1.0, 3.0))
            server.kill()
            time.sleep(rnd.uniform(0.0, 0.5))
            server.restart()
        deadline = time.monotonic() + 300
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        expected = {f"w{w}-{n}" for w in range(WRITERS) for n in range(EVENTS)}
        events = read_everything(uri, "dur", "s", "rg-final", until=lambda got: expected.issubset(got))
    finally:
        server.stop()
    counts = Counter(events)
    duplicated = {e: c for e, c in counts.items() if c > 1}
    assert not duplicated, f"{len(duplicated)} events duplicated, e.g. {list(duplicated.items())[:5]}"
    missing = expected - set(counts)
    assert not missing, f"{len(missing)} events lost, e.g. {sorted(missing)[:5]}"
    assert set(counts) == expected
    # Per routing key, events keep their write order.
    last: dict[str, int] = {}
    for e in events:
        wid, n = e[1:].split("-")
        key = f"{wid}-{int(n) % 7}"
        assert last.get(key, -1) < int(n)
        last[key] = int(n)


@pytest.mark.timeout(600)
def test_kill9_of_server_and_writers_keeps_every_acknowledged_event(tmp_path):
    server = EmbeddedPravegaProcess(tmp_path / "data").start()
    uri = server.controller_uri
    mgr = pravega_client.StreamManager(uri)
    mgr.create_scope("dur2")
    mgr.create_stream("dur2", "s", 2)
    procs, acked = start_writers(uri, "dur2", "s", 10**6)
    # Kill once every writer saw acknowledgements (by state, not by a wait that a loaded machine
    # may outlast), and a little later, so that appends are in flight.
    deadline = time.monotonic() + 300
    while any(a.value < 2 * FLUSH_EVERY for a in acked) and time.monotonic() < deadline:
        time.sleep(0.1)
    server.kill()
    for p in procs:
        p.kill()
        p.join()
    acknowledged = [a.value for a in acked]
    assert all(a >= FLUSH_EVERY for a in acknowledged), acknowledged
    server.restart()
    try:
        wanted = {f"w{w}-{n}" for w in range(WRITERS) for n in range(acknowledged[w])}
        events = read_everything(server.controller_uri, "dur2", "s", "rg", until=lambda got: wanted.issubset(got))
    finally:
        server.stop()
    counts = Counter(events)
    assert all(c == 1 for c in counts.values()), "duplicates after a crash"
    for w in range(WRITERS):
        present = {int(e.split("-")[1]) for e in counts if e.startswith(f"w{w}-")}
        missing = [n for n in range(acknowledged[w]) if n not in present]
        assert not missing, f"writer {w}: {len(missing)} acknowledged events lost (first {missing[:3]})"
    # Nothing partial: every event read back is one whole event as written.
    assert all(re.fullmatch(r"w\d-\d+", e) for e in counts), "a torn event became visible"
