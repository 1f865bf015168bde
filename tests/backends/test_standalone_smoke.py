"""Smoke test of the real Pravega standalone backend with the official `pravega` client.

Why: before the suite trusts standalone as its reference backend, prove that it starts on loopback
within its memory bounds and that the official client does everything the project relies on
against it: scopes, streams with several segments, routed events, transactions, reader groups and
byte streams. Skipped (with the reason) when Java 17 or Maven cannot provide Pravega here.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
import uuid
from collections import defaultdict

import pytest

from .standalone import PravegaStandalone, standalone_available

pytestmark = pytest.mark.standalone

pravega_client = pytest.importorskip("pravega_client")

# Generous: the JVM gets -Xmx768m and 256 MiB of direct memory; RSS beyond this means the bounds
# are not working and the backend would crowd Spark and the tests on a 2-core, 24 GiB machine.
RSS_LIMIT_KIB = 1_400_000


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    ok, reason = standalone_available()
    if not ok:
        pytest.skip(reason)
    backend = PravegaStandalone(work_dir=tmp_path_factory.mktemp("pravega-standalone"))
    backend.start()
    print(f"\nPravega standalone ready in {backend.ready_seconds}s at {backend.controller_uri}, "
          f"RSS {backend.rss_kib()} KiB (logs: {backend.log_path()})")
    try:
        yield backend
    finally:
        print(f"\nPravega standalone RSS before stop: {backend.rss_kib()} KiB")
        print(backend.stop())


@pytest.fixture
def manager(standalone):
    return pravega_client.StreamManager(standalone.controller_uri)


def _unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


async def _read_events(reader, expected: int, timeout: float) -> list[bytes]:
    """Read slices until `expected` events arrived; a real tail read blocks, hence the deadline."""
    events: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(events) < expected:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            slice_ = await asyncio.wait_for(reader.get_segment_slice_async(), remaining)
        except asyncio.TimeoutError:
            break
        events.extend(ev.data() for ev in slice_)
        reader.release_segment(slice_)
    return events


def _read_all(manager, scope: str, stream: str, expected: int, timeout: float = 60.0) -> list[bytes]:
    group = manager.create_reader_group(_unique("rg"), scope, stream)
    reader = group.create_reader("reader-1")
    try:
        return asyncio.run(_read_events(reader, expected, timeout))
    finally:
        reader.reader_offline()


def test_listens_on_loopback_only(standalone):
    listening = standalone.listening()
    ports = {port for _addr, port in listening}
    assert standalone.state.ports.controller in ports
    assert standalone.state.ports.segment_store in ports
    wildcard = [(a, p) for a, p in listening if a not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")]
    assert not wildcard, f"Pravega standalone listens beyond loopback: {wildcard}"
    assert standalone.controller_uri.startswith("tcp://127.0.0.1:")


def test_segment_store_hello_overlaps_client_version(standalone):
    host, port = standalone.segment_store_address
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.sendall(struct.pack(">iiii", -127, 8, 15, 5))  # Hello(high 15, low 5) as the Rust client
        code, length = struct.unpack(">ii", conn.recv(8, socket.MSG_WAITALL))
        high, low = struct.unpack(">ii", conn.recv(length, socket.MSG_WAITALL)[:8])
    assert code == -127
    assert low <= 15 <= high, f"server wire versions {low}..{high} exclude the client's 15"


def test_routed_events_round_trip_in_key_order(manager):
    scope, stream = _unique("smoke"), "events"
    assert manager.create_scope(scope)
    assert manager.create_stream(scope, stream, 2)
    writer = manager.create_writer(scope, stream, max_inflight_events=200)
    for i in range(100):
        writer.write_event(f"k{i % 7}:{i}", routing_key=f"k{i % 7}")
    writer.flush()

    events = [e.decode() for e in _read_all(manager, scope, stream, 100)]

    assert sorted(events) == sorted(f"k{i % 7}:{i}" for i in range(100))
    per_key = defaultdict(list)
    for ev in events:
        key, seq = ev.split(":")
        per_key[key].append(int(seq))
    for key, seqs in per_key.items():
        assert seqs == sorted(seqs), f"events of routing key {key} out of order: {seqs}"


def test_committed_transaction_is_read_and_aborted_one_is_not(manager):
    scope, stream = _unique("smoke"), "txns"
    manager.create_scope(scope)
    manager.create_stream(scope, stream, 2)
    txn_writer = manager.create_transaction_writer(scope, stream, 1)

    committed = txn_writer.begin_txn()
    for i in range(20):
        committed.write_event(f"c{i}", routing_key=f"r{i % 3}")
    assert committed.is_open()
    committed.commit()
    assert not committed.is_open()

    aborted = txn_writer.begin_txn()
    assert aborted.get_txn_id() != committed.get_txn_id()
    aborted.write_event("never", routing_key="r0")
    aborted.abort()
    assert not aborted.is_open()

    events = sorted(e.decode() for e in _read_all(manager, scope, stream, 20, timeout=60))
    assert events == sorted(f"c{i}" for i in range(20))


def test_byte_stream_write_seek_read(manager):
    scope, stream = _unique("smoke"), "bytes"
    manager.create_scope(scope)
    manager.create_stream(scope, stream, 1)
    byte_stream = manager.create_byte_stream(scope, stream)
    payload = bytes(range(256)) * 40  # 10 KiB, every byte value
    assert byte_stream.write(payload) == len(payload)
    byte_stream.flush()
    assert byte_stream.current_tail_offset() == len(payload)
    assert byte_stream.current_head_offset() == 0

    byte_stream.seek(0, 0)
    received = bytearray()
    deadline = time.monotonic() + 30
    while len(received) < len(payload) and time.monotonic() < deadline:
        chunk = bytearray(len(payload) - len(received))  # readinto accepts only a bytearray
        received += chunk[: byte_stream.readinto(chunk)]
    assert bytes(received) == payload


def test_resident_memory_stays_bounded(standalone, manager):
    # Runs last in this module (pytest keeps file order): the other tests have loaded the JVM.
    rss = standalone.rss_kib()
    print(f"\nPravega standalone RSS after the smoke tests: {rss} KiB")
    assert rss is not None and rss < RSS_LIMIT_KIB, f"RSS {rss} KiB exceeds {RSS_LIMIT_KIB} KiB"
