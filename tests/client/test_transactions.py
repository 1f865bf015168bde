"""Cross-process transactions against the embedded server, read back with the official client.

Processes are started with ``spawn`` (as Spark/Airflow workers are separate interpreters): one
writes and flushes (pre-commit), one keeps the lease alive, one commits.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from collections import defaultdict

from pravega_clients import require_official_client

pravega_client = require_official_client()  # the oracle: the whole module needs it
import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.controller_types import TransactionInfo, TxnStatus
from airflow_provider_pravega.client.errors import (
    TransactionAbortedError,
    TransactionCommittedError,
    TransactionNotFoundError,
)
from airflow_provider_pravega.client.transactions import (
    LeaseKeeper,
    TransactionalWriter,
)
from airflow_provider_pravega.protocol import routing

from client.readback import assert_per_key_order, read_segments_direct

LEASE_MS = 1000  # the test server caps every lease to this
SPAWN = mp.get_context("spawn")


# ------------------------------------------------------------------------------------ helpers


_MANAGERS: dict[str, pravega_client.StreamManager] = {}


def official_manager(uri: str) -> pravega_client.StreamManager:
    """One official StreamManager per server for the whole run: dropping one that has a reader's
    read still parked on the server blocks for the client's 30 s request timeout."""
    if uri not in _MANAGERS:
        _MANAGERS[uri] = pravega_client.StreamManager(uri)
    return _MANAGERS[uri]


def read_all_official(
    uri: str,
    scope: str,
    stream: str,
    rg_name: str,
    expected: int,
    *,
    timeout: float = 60,
) -> list[bytes]:
    """Read ``expected`` events from the head with the official client's reader group.

    It stops at ``expected`` (the official reader has no end position); tests prove that nothing
    else is in the stream with :func:`read_segments_direct`. (Polling an official reader past the
    end with timeouts makes its ``reader_offline`` hang for the client's 30 s request timeout.)
    """
    manager = official_manager(uri)

    async def run() -> list[bytes]:
        rg = manager.create_reader_group(rg_name, scope, stream)
        reader = rg.create_reader("r0")
        got: list[bytes] = []
        deadline = time.monotonic() + timeout
        while len(got) < expected and time.monotonic() < deadline:
            try:
                sl = await asyncio.wait_for(
                    reader.get_segment_slice_async(),
                    max(1.0, deadline - time.monotonic()),
                )
            except TimeoutError:
                break
            for event in sl:
                got.append(event.data())
            reader.release_segment(sl)
        reader.reader_offline()
        return got

    return asyncio.run(run())


# ------------------------------------------------------------------------- process bodies (spawn)


def _write_and_flush(uri, scope, stream, txn_id, keys, per_key, results):
    try:
        with PravegaClient(uri) as client:
            writer = TransactionalWriter(
                client.transactions, scope, stream, txn_id
            )  # only the id crosses
            for i in range(per_key):
                for key in keys:
                    writer.write_event(f"{key}:{i}".encode(), routing_key=key)
            writer.flush()
            results.put(("flushed", writer.events_written, writer.pending_events))
            writer.close()
    except Exception as exc:  # noqa: BLE001 - report it, so the test fails with the reason
        results.put(("writer-error", repr(exc), 0))


def _keep_leases(uri, scope, stream, txn_id, started, stop, results):
    try:
        with PravegaClient(uri) as client:
            keeper = LeaseKeeper(client.transactions, interval_s=0.2, lease_ms=LEASE_MS)
            keeper.add(scope, stream, txn_id)
            keeper.ping_all()
            started.set()
            while not stop.is_set() and keeper.kept():
                time.sleep(0.05)
            keeper.close()
            results.put(
                (
                    "keeper",
                    keeper.pings,
                    [str(e) for e in keeper.failures.values()],
                    sorted(keeper.kept()),
                )
            )
    except Exception as exc:  # noqa: BLE001 - report it, so the test fails with the reason
        results.put(("keeper-error", repr(exc), [], []))


def _commit(uri, scope, stream, txn_id, results):
    try:
        with PravegaClient(uri) as client:
            results.put(
                ("committed", client.transactions.commit(scope, stream, txn_id).value)
            )
    except Exception as exc:  # noqa: BLE001 - report it, so the test fails with the reason
        results.put(("commit-error", repr(exc)))


def _run(target, *args, timeout: float = 60):
    proc = SPAWN.Process(target=target, args=args)
    proc.start()
    return proc


def _get(results, timeout: float = 60):
    return results.get(timeout=timeout)


# -------------------------------------------------------------------------------------- tests


@pytest.fixture
def short_lease_server(pravega_embedded_factory):
    return pravega_embedded_factory(txn_lease_cap_ms=LEASE_MS)


def _stream(client: PravegaClient, unique_name, segments: int) -> tuple[str, str]:
    scope = unique_name("txn")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "st", segments)
    return scope, "st"


def test_two_phase_across_processes_with_a_lease_keeper(
    short_lease_server, unique_name
):
    uri = short_lease_server.controller_uri
    keys = [f"key-{i}" for i in range(8)]
    per_key = 400
    with PravegaClient(uri) as client:
        scope, stream = _stream(client, unique_name, 4)
        txn = client.transactions.begin(
            scope, stream
        )  # lease capped to 1 s by the server
        # Keep it alive here until the keeper process has taken over (spawn takes a while).
        bridge = LeaseKeeper(client.transactions, interval_s=0.2, lease_ms=LEASE_MS)
        bridge.add(scope, stream, txn.txn_id)
        results, keeper_results = SPAWN.Queue(), SPAWN.Queue()
        started, stop = SPAWN.Event(), SPAWN.Event()
        keeper = _run(
            _keep_leases, uri, scope, stream, txn.txn_id, started, stop, keeper_results
        )
        assert started.wait(60), "keeper process did not start"
        bridge.close()
        bridge.check()

        writer = _run(
            _write_and_flush, uri, scope, stream, txn.txn_id, keys, per_key, results
        )
        kind, written, pending = _get(results)
        assert (kind, written, pending) == ("flushed", len(keys) * per_key, 0)
        writer.join(30)

        time.sleep(
            4 * LEASE_MS / 1000
        )  # several lease periods, kept alive only by the keeper process
        assert client.transactions.status(scope, stream, txn.txn_id) == TxnStatus.OPEN
        # Pre-committed but not committed: nothing is in the stream's segments yet.
        assert read_segments_direct(client, scope, stream) == {i: [] for i in range(4)}

        committer = _run(_commit, uri, scope, stream, txn.txn_id, results)
        assert _get(results) == ("committed", "COMMITTED")
        committer.join(30)

        # The keeper learns COMMITTED from its next ping and stops keeping the transaction.
        kind, pings, failures, still_kept = _get(keeper_results)
        assert kind == "keeper" and failures == [] and still_kept == []
        assert pings >= 4 * LEASE_MS / 1000 / 0.2 / 2
        stop.set()
        keeper.join(30)

        events = read_all_official(
            uri, scope, stream, unique_name("rg"), len(keys) * per_key
        )
        assert_per_key_order(
            events, keys, per_key
        )  # every event, once, in per-key order
        assert (
            sum(map(len, read_segments_direct(client, scope, stream).values()))
            == len(keys) * per_key
        )
        # Committing again is fine (idempotent).
        assert (
            client.transactions.commit(scope, stream, txn.txn_id) == TxnStatus.COMMITTED
        )


def test_without_a_keeper_the_lease_expires_and_the_transaction_is_aborted(
    short_lease_server, unique_name
):
    uri = short_lease_server.controller_uri
    keys = ["a", "b"]
    with PravegaClient(uri) as client:
        scope, stream = _stream(client, unique_name, 2)
        txn = client.transactions.begin(scope, stream)
        bridge = LeaseKeeper(client.transactions, interval_s=0.2, lease_ms=LEASE_MS)
        bridge.add(scope, stream, txn.txn_id)
        results = SPAWN.Queue()
        writer = _run(
            _write_and_flush, uri, scope, stream, txn.txn_id, keys, 100, results
        )
        assert _get(results) == ("flushed", 200, 0)
        writer.join(30)
        bridge.close()  # nobody pings any more

        time.sleep(3 * LEASE_MS / 1000)
        assert (
            client.transactions.wait_for(
                scope, stream, txn.txn_id, [TxnStatus.ABORTED], timeout_s=5
            )
            == TxnStatus.ABORTED
        )
        with pytest.raises(TransactionAbortedError, match="aborted"):
            client.transactions.commit(scope, stream, txn.txn_id)
        with pytest.raises(TransactionAbortedError):
            TransactionalWriter(client.transactions, scope, stream, txn.txn_id)
        assert client.transactions.ping(scope, stream, txn.txn_id) == TxnStatus.ABORTED
        # A keeper that is asked to keep it surfaces the abort to its owner.
        seen = []
        with LeaseKeeper(
            client.transactions,
            0.1,
            lease_ms=LEASE_MS,
            on_failure=lambda k, e: seen.append(e),
        ) as keeper:
            keeper.add(scope, stream, txn.txn_id)
            deadline = time.monotonic() + 5
            while not seen and time.monotonic() < deadline:
                time.sleep(0.05)
            with pytest.raises(TransactionAbortedError):
                keeper.check()
        assert isinstance(seen[0], TransactionAbortedError) and not keeper.kept()
        assert read_segments_direct(client, scope, stream) == {0: [], 1: []}


def test_flushed_then_aborted_leaves_nothing_visible(
    pravega_controller_uri, unique_name
):
    uri = pravega_controller_uri
    with PravegaClient(uri) as client:
        scope, stream = _stream(client, unique_name, 3)
        txn = client.transactions.begin(scope, stream)
        with client.transactions.writer(scope, stream, txn) as writer:
            for i in range(3000):
                writer.write_event(f"k{i % 7}:{i}".encode(), routing_key=f"k{i % 7}")
            writer.flush()
        assert (
            client.transactions.abort(scope, stream, txn.txn_id, wait=True)
            == TxnStatus.ABORTED
        )
        assert (
            client.transactions.abort(scope, stream, txn.txn_id) == TxnStatus.ABORTED
        )  # idempotent
        with pytest.raises(TransactionAbortedError):
            client.transactions.commit(scope, stream, txn.txn_id)
        # A marker written afterwards is the only thing a reader finds.
        plain = official_manager(uri).create_writer(scope, stream)
        plain.write_event_bytes(b"marker:0")
        plain.flush()
        assert read_all_official(uri, scope, stream, unique_name("rg"), 1) == [
            b"marker:0"
        ]
        assert (
            sum(len(v) for v in read_segments_direct(client, scope, stream).values())
            == 1
        )


def test_lifecycle_status_commit_and_abort_rules(pravega_controller_uri, unique_name):
    with PravegaClient(pravega_controller_uri) as client:
        scope, stream = _stream(client, unique_name, 2)
        txn = client.transactions.begin(scope, stream, lease_ms=30_000)
        assert txn.epoch == 0 and [s.segment_id for s in txn.segments] == [0, 1]
        assert TransactionInfo.from_dict(txn.to_dict()) == txn
        assert client.transactions.status(scope, stream, txn.txn_id) == TxnStatus.OPEN
        assert (
            client.transactions.ping(scope, stream, txn.txn_id, 30_000)
            == TxnStatus.OPEN
        )
        with client.transactions.writer(
            scope, stream, txn.txn_id
        ) as writer:  # segments rebuilt from the id
            assert [s.segment_id for s in writer.segments] == [0, 1]
            writer.write_event(b"one:0", routing_key="one")
        assert (
            client.transactions.commit(scope, stream, txn.txn_id) == TxnStatus.COMMITTED
        )
        assert (
            client.transactions.commit(scope, stream, txn.txn_id) == TxnStatus.COMMITTED
        )
        assert (
            client.transactions.ping(scope, stream, txn.txn_id) == TxnStatus.COMMITTED
        )
        with pytest.raises(TransactionCommittedError, match="already committed"):
            client.transactions.abort(scope, stream, txn.txn_id)
        with pytest.raises(TransactionCommittedError):
            TransactionalWriter(client.transactions, scope, stream, txn.txn_id)
        # Accepts the hex form of the id too (as printed in logs and messages).
        assert (
            client.transactions.status(scope, stream, f"{txn.txn_id:032x}")
            == TxnStatus.COMMITTED
        )
        with pytest.raises(TransactionNotFoundError):
            client.transactions.wait_for(
                scope, stream, txn.txn_id + 99, [TxnStatus.COMMITTED], timeout_s=1
            )


def test_routing_keys_land_where_the_official_client_puts_them(
    pravega_controller_uri, unique_name
):
    uri = pravega_controller_uri
    keys = [f"user-{i}" for i in range(40)] + ["hello", "a", "rk", "routing_key"]
    with PravegaClient(uri) as client:
        scope, stream = _stream(client, unique_name, 4)
        official = official_manager(uri).create_writer(
            scope, stream, max_inflight_events=1000
        )
        for i in range(5):
            for key in keys:
                official.write_event_bytes(f"{key}:{i}".encode(), key)
        official.flush()
        txn = client.transactions.begin(scope, stream)
        with client.transactions.writer(scope, stream, txn) as writer:
            for i in range(5, 10):
                for key in keys:
                    writer.write_event(f"{key}:{i}".encode(), routing_key=key)
        # Then many at once with their keys (more than one of write_keyed's chunks).
        keyed = [(f"{key}:{i}".encode(), key) for i in range(10, 110) for key in keys]
        txn2 = client.transactions.begin(scope, stream)
        with client.transactions.writer(scope, stream, txn2) as writer:
            assert writer.write_keyed([p for p, _ in keyed], [k for _, k in keyed]) == len(keyed)
            assert writer.events_written == len(keyed)
        client.transactions.commit(scope, stream, txn.txn_id)
        client.transactions.commit(scope, stream, txn2.txn_id)

        segments = read_segments_direct(client, scope, stream)
        ranges = {
            s.segment_id: s
            for s in client.controller.get_current_segments(scope, stream)
        }
        home: dict[str, set[int]] = defaultdict(set)
        for segment_id, events in segments.items():
            for payload in events:
                home[payload.decode().rpartition(":")[0]].add(segment_id)
        for key in keys:
            assert len(home[key]) == 1, f"{key} landed in segments {home[key]}"
            (segment_id,) = home[key]
            k = routing.hash_routing_key(key)
            assert ranges[segment_id].min_key <= k < ranges[segment_id].max_key
        # Per key: the official client's events first, then ours one by one, then ours at once, in order.
        for events in segments.values():
            by_key: dict[str, list[int]] = defaultdict(list)
            for payload in events:
                key, _, seq = payload.decode().rpartition(":")
                by_key[key].append(int(seq))
            for seqs in by_key.values():
                assert seqs == list(range(110))
        assert (
            len({sid for s in home.values() for sid in s}) == 4
        )  # 44 keys spread over all segments


def test_events_without_routing_key_spread_randomly(
    pravega_controller_uri, unique_name
):
    with PravegaClient(pravega_controller_uri) as client:
        scope, stream = _stream(client, unique_name, 4)
        txn = client.transactions.begin(scope, stream)
        with client.transactions.writer(scope, stream, txn) as writer:
            writer.write_events(f"x:{i}".encode() for i in range(4000))
        client.transactions.commit(scope, stream, txn.txn_id)
        counts = {
            sid: len(ev)
            for sid, ev in read_segments_direct(client, scope, stream).items()
        }
        assert sum(counts.values()) == 4000
        assert all(600 < c < 1400 for c in counts.values()), counts


def test_writer_flush_reports_a_transaction_aborted_meanwhile(
    pravega_controller_uri, unique_name
):
    with PravegaClient(pravega_controller_uri) as client:
        scope, stream = _stream(client, unique_name, 1)
        txn = client.transactions.begin(scope, stream)
        writer = client.transactions.writer(scope, stream, txn)
        writer.write_event(b"before")
        writer.flush()
        client.transactions.abort(scope, stream, txn.txn_id)
        writer.write_event(b"after")
        with pytest.raises(TransactionAbortedError, match=f"{txn.txn_id:032x}"):
            writer.flush()
        writer.close()


def test_transaction_id_text_forms():
    from airflow_provider_pravega.client.controller_types import parse_txn_id

    txn_id = (3 << 96) | 0x12
    assert parse_txn_id(f"{txn_id:032x}") == txn_id
    assert (
        parse_txn_id("00000000000000000000000000000012") == 0x12
    )  # all-digit hex is still hex
    assert parse_txn_id("0x12") == 0x12 and parse_txn_id(txn_id) == txn_id
    for bad in ("18", "12345678901234567890123456789012345", "xyz", "-1"):
        with pytest.raises(ValueError, match="32 hex digits"):
            parse_txn_id(bad)
    with pytest.raises(ValueError):
        parse_txn_id(1 << 128)
    with pytest.raises(TypeError):
        parse_txn_id(True)
    info = TransactionInfo("s", "st", txn_id, ())
    assert info.to_dict()["txn_id"] == f"{txn_id:032x}" and info.epoch == 3
    assert TransactionInfo.from_dict(info.to_dict()) == info
