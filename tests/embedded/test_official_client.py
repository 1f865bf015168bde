"""Conformance: the official ``pravega`` client (0.3.8) against the embedded server.

Every public method of ``pravega_client`` that the issue lists is exercised here exactly as a user
would call it; the server must be indistinguishable from a Pravega cluster for these calls.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections import Counter, defaultdict
from contextlib import contextmanager

from pravega_clients import require_official_client

pravega_client = require_official_client()  # the oracle: the whole module needs it
import pytest
from hang_guard import HANG_GUARD_S

from airflow_provider_pravega.protocol import wire
from airflow_provider_pravega.protocol.routing import hash_routing_key


@pytest.fixture
def manager(pravega_controller_uri):
    return pravega_client.StreamManager(pravega_controller_uri)


@pytest.fixture
def scope(manager, unique_name):
    name = unique_name("sc")
    assert manager.create_scope(name) is True
    return name


def read_all(manager, scope, stream, expected, rg_name, *, readers=1, timeout=60, stream_cut=None):
    """Read ``expected`` events with a reader group (from head or a cut); returns the payloads."""

    async def run():
        if stream_cut is not None:
            rg = manager.create_reader_group(rg_name, scope, stream, False, stream_cut)
        else:
            rg = manager.create_reader_group(rg_name, scope, stream)
        rs = [rg.create_reader(f"r{i}") for i in range(readers)]
        got: list[bytes] = []
        deadline = time.monotonic() + timeout
        i = 0
        while len(got) < expected and time.monotonic() < deadline:
            r = rs[i % readers]
            i += 1
            try:
                sl = await asyncio.wait_for(r.get_segment_slice_async(), 10)
            except asyncio.TimeoutError:
                continue
            for ev in sl:
                got.append(ev.data())
            r.release_segment(sl)
        for r in rs:
            r.reader_offline()
        return got, rg

    got, rg = asyncio.run(run())
    return got, rg


def test_scopes_and_streams(manager, scope, unique_name):
    assert manager.create_scope(scope) is False
    assert scope in manager.list_scope()
    assert manager.create_stream(scope, "s1", 3) is True
    assert manager.create_stream(scope, "s1", 3) is False
    tags = ["a", "b"]
    assert manager.create_stream_with_policy(
        scope, "s2", pravega_client.StreamScalingPolicy.auto_scaling_policy_by_event_rate(100, 2, 2),
        pravega_client.StreamRetentionPolicy.by_size(10**9), tags,
    ) is True
    assert sorted(manager.get_stream_tags(scope, "s2")) == tags
    assert manager.get_stream_tags(scope, "s1") == []
    assert manager.update_stream_with_policy(
        scope, "s2", pravega_client.StreamScalingPolicy.auto_scaling_policy_by_data_rate(1024, 2, 2),
        pravega_client.StreamRetentionPolicy.by_time(3600_000), ["c"],
    ) is True
    assert manager.get_stream_tags(scope, "s2") == ["c"]
    # Pravega lists the watermark stream it keeps beside each stream.
    assert sorted(manager.list_stream(scope)) == ["_MARKs1", "_MARKs2", "s1", "s2"]
    assert manager.seal_stream(scope, "s1") is True
    assert manager.delete_stream(scope, "s1") is True
    assert manager.delete_stream(scope, "s1") is False
    assert manager.seal_stream(scope, "s2") and manager.delete_stream(scope, "s2")
    assert manager.delete_scope(scope) is True
    assert scope not in manager.list_scope()


def test_errors_fail_fast(manager, unique_name):
    started = time.monotonic()
    with pytest.raises(Exception):
        manager.create_stream(unique_name("missing"), "s", 1)
    with pytest.raises(Exception):
        manager.create_scope("bad scope name!")
    assert time.monotonic() - started < HANG_GUARD_S  # a hang guard: the official client's retries take ~61 s


def test_write_and_read_multi_segment_with_routing_keys(manager, scope):
    manager.create_stream(scope, "events", 4)
    w = manager.create_writer(scope, "events", 1000)
    expected = Counter()
    for i in range(2000):
        key = f"key-{i % 37}"
        payload = f"{key}:{i}"
        w.write_event(payload, key)
        expected[payload] += 1
    for i in range(100):
        w.write_event_bytes(b"nokey-%d" % i)
        expected[f"nokey-{i}"] += 1
    w.flush()
    got, _ = read_all(manager, scope, "events", sum(expected.values()), "rg1", readers=2)
    assert Counter(g.decode() for g in got) == expected
    # Per routing key order holds (each key lives in one segment).
    per_key = defaultdict(list)
    for g in got:
        text = g.decode()
        if text.startswith("key-"):
            k, n = text.split(":")
            per_key[k].append(int(n))
    assert all(v == sorted(v) for v in per_key.values())


def read_segment_raw(endpoint: str, name: str) -> bytes:
    """All bytes of one segment, read with our own codec straight from the segment store."""
    host, port = endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        dec = wire.FrameDecoder("reply")
        s.sendall(wire.encode(wire.Hello(15, 5)) + wire.encode(wire.GetStreamSegmentInfo(1, name, "")))
        replies: list = []
        while len(replies) < 2:
            replies.extend(dec.feed(s.recv(65536)))
        length = replies[1].write_offset
        out = b""
        while len(out) < length:
            s.sendall(wire.encode(wire.ReadSegment(name, len(out), length - len(out), "", 2)))
            replies = []
            while not replies:
                replies.extend(dec.feed(s.recv(1 << 20)))
            out += replies[0].data
        return out


def test_events_spread_over_segments_by_key_hash(pravega_embedded, manager, scope):
    manager.create_stream(scope, "spread", 4)
    w = manager.create_writer(scope, "spread", 100)
    keys = [f"k{i}" for i in range(40)]
    for k in keys:
        w.write_event(k, k)
    w.flush()
    for seg in range(4):
        data = read_segment_raw(pravega_embedded.segment_store_endpoint, f"{scope}/spread/{seg}.#epoch.0")
        got = [e.payload.decode() for e in wire.iter_events(data)]
        want = [k for k in keys if int(hash_routing_key(k) * 4) == seg]
        assert got == want


def test_transactions_commit_abort_and_atomic_visibility(manager, scope):
    manager.create_stream(scope, "tx", 2)
    tw = manager.create_transaction_writer(scope, "tx", 7)
    t1 = tw.begin_txn()
    assert t1.is_open()
    for i in range(500):
        t1.write_event(f"committed-{i}", f"k{i % 5}")
    t2 = tw.begin_txn()
    for i in range(300):
        t2.write_event_bytes(b"aborted-%d" % i)
    t2.abort()
    assert not t2.is_open()
    # Nothing of t1 visible before commit.
    w = manager.create_writer(scope, "tx", 10)
    w.write_event("marker")
    w.flush()
    got, rg = read_all(manager, scope, "tx", 1, "rg-before", timeout=10)
    assert got == [b"marker"]
    t1.commit()
    assert not t1.is_open()
    got, _ = read_all(manager, scope, "tx", 501, "rg-after")
    assert sorted(got) == sorted([b"marker"] + [b"committed-%d" % i for i in range(500)])
    t3 = tw.begin_txn()
    t3.write_event("ts")
    t3.commit_timestamp(1234)
    assert tw.get_txn(t1.get_txn_id()).is_open() is False


def test_reader_group_from_tail_and_stream_cut(manager, scope):
    manager.create_stream(scope, "cut", 2)
    w = manager.create_writer(scope, "cut", 100)
    for i in range(50):
        w.write_event(f"a{i}", f"k{i}")
    w.flush()
    got, rg = read_all(manager, scope, "cut", 50, "rg-cut")
    cut = rg.get_streamcut()
    offsets = cut.get_segment_offset_map()
    assert set(offsets) == {0, 1} and sum(offsets.values()) == sum(len(g) + 8 for g in got)
    tail_rg = manager.create_reader_group("rg-tail", scope, "cut", True)
    for i in range(20):
        w.write_event(f"b{i}", f"k{i}")
    w.flush()
    got2, _ = read_all(manager, scope, "cut", 20, "rg-from-cut", stream_cut=cut)
    assert sorted(got2) == sorted(b"b%d" % i for i in range(20))

    async def tail_read():
        r = tail_rg.create_reader("t")
        got = []
        while len(got) < 20:
            sl = await asyncio.wait_for(r.get_segment_slice_async(), 10)
            got.extend(e.data() for e in sl)
            r.release_segment(sl)
        r.reader_offline()
        return got

    assert sorted(asyncio.run(tail_read())) == sorted(b"b%d" % i for i in range(20))
    manager.delete_reader_group("rg-tail", scope)


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_reader_waits_at_tail_without_busy_loop(pravega_embedded, manager, scope):
    manager.create_stream(scope, "tail", 1)
    rg = manager.create_reader_group("rg-wait", scope, "tail")
    w = manager.create_writer(scope, "tail")

    async def run():
        r = rg.create_reader("r")
        got: list[bytes] = []

        async def consume():
            while not got:
                sl = await r.get_segment_slice_async()
                got.extend(e.data() for e in sl)
                r.release_segment(sl)

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(1.0)
        cpu0 = cpu_seconds(pravega_embedded.pid)
        await asyncio.sleep(3.0)
        idle_cpu = cpu_seconds(pravega_embedded.pid) - cpu0
        assert not got
        w.write_event("late")
        w.flush()
        await asyncio.wait_for(task, 15)
        r.reader_offline()
        return got, idle_cpu

    got, idle_cpu = asyncio.run(run())
    assert got == [b"late"]
    assert idle_cpu < 0.5, f"server burnt {idle_cpu:.2f} s of CPU while a reader waited at the tail"


def test_large_events(manager, scope):
    manager.create_stream(scope, "large", 1)
    w = manager.create_writer(scope, "large")
    big = b"z" * (8 * 1024 * 1024 - 8)
    bigger = b"y" * (9 * 1024 * 1024)
    w.write_event_bytes(big)
    w.write_event_bytes(bigger)
    w.write_event_bytes(b"small")
    w.flush()
    got, _ = read_all(manager, scope, "large", 3, "rg-large")
    assert got == [big, bigger, b"small"]


def read_exactly(bs, n: int) -> bytes:
    """readinto may return fewer bytes than asked (real Pravega answers a read with the data of one
    append, here "hello " before "world"), like io.RawIOBase.readinto: loop as a reader must."""
    got = bytearray()
    for _ in range(100):
        buf = bytearray(n - len(got))
        k = bs.readinto(buf)
        got += buf[:k]
        if len(got) == n:
            return bytes(got)
    raise AssertionError(f"read only {len(got)} of {n} bytes: {bytes(got)!r}")


def test_byte_stream(manager, scope):
    manager.create_stream(scope, "bytes", 1)
    bs = manager.create_byte_stream(scope, "bytes")
    assert bs.write(b"hello ") == 6
    bs.write(b"world")
    bs.flush()
    assert bs.current_tail_offset() == 11
    assert bs.current_head_offset() == 0
    bs.seek(0, 0)
    assert read_exactly(bs, 11) == b"hello world"
    assert bs.tell() == 11
    bs.seek(6, 0)
    assert read_exactly(bs, 5) == b"world"
    bs.truncate(6)
    assert bs.current_head_offset() == 6
    bs.seek(0, 2)
    assert bs.tell() == 11


@contextmanager
def busy_cores(n: int = 2):
    """Load the machine's cores with busy processes (stopped on exit): CPU load is what reorders the
    server's threads and the client's."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def test_tail_reader_gets_the_one_event_written_after_it_under_cpu_load(pravega_embedded, manager, scope):
    """Issue #22 item 9: a reader group at the tail, a reader awaiting a slice, then one event
    written and flushed: the reader gets exactly that event, 20 times of 20 with both cores busy."""
    outcomes = []
    with busy_cores(2):
        for i in range(20):
            stream = f"tail{i}"
            manager.create_stream(scope, stream, 1)
            rg = manager.create_reader_group(f"rg-tail{i}", scope, stream, True)
            w = manager.create_writer(scope, stream)

            async def run():
                r = rg.create_reader("r")
                waiting = asyncio.ensure_future(r.get_segment_slice_async())
                await asyncio.sleep(0.2)  # the reader's read is parked at the tail by now
                w.write_event(f"event-{i}")
                w.flush()
                sl = await asyncio.wait_for(waiting, 60)
                got = [e.data() for e in sl]
                r.release_segment(sl)
                r.reader_offline()
                return got

            try:
                outcomes.append(asyncio.run(run()))
            except Exception as exc:  # a write timeout or a reader error: count it, go on
                outcomes.append(f"{type(exc).__name__}: {exc}")
    wrong = [(i, o) for i, o in enumerate(outcomes) if o != [f"event-{i}".encode()]]
    assert not wrong, f"{len(wrong)} of 20 runs failed: {wrong}"


def test_tail_reader_gets_back_to_back_events_in_order_under_cpu_load(pravega_embedded, manager, scope):
    """Issue #19 item 3 (the official ``test_ReadfromTail``): a reader created at the tail, then two
    events written back to back without a flush: it gets both, in order, nothing else, 20 times of
    20 with both cores busy. Whether both come in its *first* slice depends on when the writer's
    appends and the reader's read meet, which the scheduler decides (Pravega 0.13 standalone
    answers the first event alone 19 of 40 times at rest, 30 of 40 with two cores busy), so that is
    not asserted here: the embedded server's tail coalescing that makes one slice the rule is tested
    deterministically at the wire (test_segment_store_wire.py, the burst tests with a storage hook
    that orders the growth notice)."""
    outcomes = []
    with busy_cores(2):
        for i in range(20):
            stream = f"burst{i}"
            manager.create_stream(scope, stream, 1)
            w = manager.create_writer(scope, stream)
            w.write_event("before")
            w.flush()
            rg = manager.create_reader_group(f"rg-burst{i}", scope, stream, True)

            async def run():
                r = rg.create_reader("r")
                w.write_event(f"a-{i}")
                w.write_event(f"b-{i}")
                got = []
                while len(got) < 2:
                    sl = await asyncio.wait_for(r.get_segment_slice_async(), 60)
                    got += [e.data() for e in sl]
                    r.release_segment(sl)
                r.reader_offline()
                return got

            outcomes.append(asyncio.run(run()))
    wrong = [(i, o) for i, o in enumerate(outcomes) if o != [f"a-{i}".encode(), f"b-{i}".encode()]]
    assert not wrong, f"{len(wrong)} of 20 runs failed: {wrong}"
