"""The whole embedded server (controller + segment store + storage) with the official client, for
what needs both halves: scaling with readers following successors, truncation, lease expiry, and
state surviving a restart. Operations the official binding lacks go through the controller's gRPC
API with our generated stub (as the provider's client layer does).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict

import grpc
from pravega_clients import require_official_client

pravega_client = require_official_client()  # the oracle: the whole module needs it
import pytest

from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess
from airflow_provider_pravega.protocol import controller_pb2 as pb
from airflow_provider_pravega.protocol import controller_pb2_grpc as pbg
from airflow_provider_pravega.protocol.naming import segment_id, txn_id_to_bits


def stub_for(uri: str) -> pbg.ControllerServiceStub:
    return pbg.ControllerServiceStub(grpc.insecure_channel(uri.split("://", 1)[1]))


def scale(stub, scope: str, stream: str, sealed: list[int], ranges: list[tuple[float, float]]) -> None:
    req = pb.ScaleRequest(
        streamInfo=pb.StreamInfo(scope=scope, stream=stream), sealedSegments=sealed,
        newKeyRanges=[pb.ScaleRequest.KeyRangeEntry(start=a, end=b) for a, b in ranges],
        scaleTimestamp=int(time.time() * 1000),
    )
    resp = stub.scale(req, timeout=10)
    assert resp.status == pb.ScaleResponse.STARTED
    for _ in range(100):
        st = stub.checkScale(pb.ScaleStatusRequest(streamInfo=req.streamInfo, epoch=resp.epoch), timeout=10)
        if st.status == pb.ScaleStatusResponse.SUCCESS:
            return
        time.sleep(0.1)
    raise AssertionError("scale did not finish")


def read_n(mgr, scope, stream, rg, expected, timeout=60, **kw) -> list[str]:
    async def run():
        group = mgr.create_reader_group(rg, scope, stream, **kw)
        r = group.create_reader("r")
        got: list[str] = []
        deadline = time.monotonic() + timeout
        while len(got) < expected and time.monotonic() < deadline:
            try:
                sl = await asyncio.wait_for(r.get_segment_slice_async(), 10)
            except asyncio.TimeoutError:
                continue
            got.extend(e.data().decode() for e in sl)
            r.release_segment(sl)
        r.reader_offline()
        return got

    return asyncio.run(run())


@pytest.fixture
def mgr(pravega_controller_uri):
    return pravega_client.StreamManager(pravega_controller_uri)


def test_scale_split_and_merge_readers_follow_successors_in_key_order(mgr, pravega_controller_uri, unique_name):
    scope = unique_name("scale")
    mgr.create_scope(scope)
    mgr.create_stream(scope, "s", 2)
    stub = stub_for(pravega_controller_uri)
    w = mgr.create_writer(scope, "s", 100)
    keys = [f"key{i}" for i in range(30)]
    seq = defaultdict(int)

    def write(rounds: int) -> None:
        for _ in range(rounds):
            for k in keys:
                w.write_event(f"{k}:{seq[k]}", k)
                seq[k] += 1
        w.flush()

    write(10)
    scale(stub, scope, "s", [0], [(0.0, 0.25), (0.25, 0.5)])  # split segment 0
    write(10)
    scale(stub, scope, "s", [segment_id(1, 2), segment_id(1, 3)], [(0.0, 0.5)])  # merge them back
    write(10)
    current = stub.getCurrentSegments(pb.StreamInfo(scope=scope, stream="s"), timeout=10)
    assert sorted((r.minKey, r.maxKey) for r in current.segmentRanges) == [(0.0, 0.5), (0.5, 1.0)]
    got = read_n(mgr, scope, "s", "rg", 30 * 30)
    counts = Counter(got)
    assert len(got) == 900 and all(c == 1 for c in counts.values())
    last: dict[str, int] = {}
    for e in got:
        k, n = e.split(":")
        assert last.get(k, -1) == int(n) - 1, f"{k}: {n} after {last.get(k)}"
        last[k] = int(n)


def test_truncate_at_stream_cut_hides_earlier_events(mgr, pravega_controller_uri, unique_name):
    scope = unique_name("trunc")
    mgr.create_scope(scope)
    mgr.create_stream(scope, "s", 1)
    w = mgr.create_writer(scope, "s", 10)
    for i in range(10):
        w.write_event(f"e{i}")
    w.flush()
    cut_offset = 5 * (8 + 2)  # five framed events of 2 bytes
    stub = stub_for(pravega_controller_uri)
    status = stub.truncateStream(
        pb.StreamCut(streamInfo=pb.StreamInfo(scope=scope, stream="s"), cut={0: cut_offset}), timeout=10
    )
    assert status.status == pb.UpdateStreamStatus.SUCCESS
    assert read_n(mgr, scope, "s", "rg", 5) == [f"e{i}" for i in range(5, 10)]
    head = stub.getSegments(pb.GetSegmentsRequest(streamInfo=pb.StreamInfo(scope=scope, stream="s"), timestamp=0))
    assert [(s.segmentId.segmentId, s.offset) for s in head.segments] == [(0, cut_offset)]


def test_transaction_lease_expiry_aborts_and_nothing_is_visible(pravega_embedded_factory, unique_name):
    server = pravega_embedded_factory(txn_lease_cap_ms=1000)
    mgr = pravega_client.StreamManager(server.controller_uri)
    scope = unique_name("lease")
    mgr.create_scope(scope)
    mgr.create_stream(scope, "s", 1)
    tw = mgr.create_transaction_writer(scope, "s", 1)
    txn = tw.begin_txn()
    txn.write_event("never")
    txn_id = txn.get_txn_id()
    stub = stub_for(server.controller_uri)
    hi, lo = txn_id_to_bits(txn_id)
    req = pb.TxnRequest(streamInfo=pb.StreamInfo(scope=scope, stream="s"), txnId=pb.TxnId(highBits=hi, lowBits=lo))
    deadline = time.monotonic() + 15
    state = None
    while time.monotonic() < deadline:
        state = stub.checkTransactionState(req, timeout=5).state
        if state == pb.TxnState.ABORTED:
            break
        time.sleep(0.2)
    assert state == pb.TxnState.ABORTED
    w = mgr.create_writer(scope, "s")
    w.write_event("after")
    w.flush()
    assert read_n(mgr, scope, "s", "rg", 1, timeout=10) == ["after"]


def test_state_survives_restart(tmp_path):
    server = EmbeddedPravegaProcess(tmp_path / "d").start()
    try:
        mgr = pravega_client.StreamManager(server.controller_uri)
        mgr.create_scope("keep")
        mgr.create_stream("keep", "s", 3)
        w = mgr.create_writer("keep", "s", 100)
        for i in range(300):
            w.write_event(f"e{i}", f"k{i % 10}")
        w.flush()
        tw = mgr.create_transaction_writer("keep", "s", 5)
        txn = tw.begin_txn()
        for i in range(50):
            txn.write_event(f"t{i}")
        txn_id = txn.get_txn_id()
        # A reader group that consumed 300 events keeps its position across the restart.
        first = read_n(mgr, "keep", "s", "rg-pos", 300)
        assert len(first) == 300
        del txn, tw, w
        server.stop()
        server.restart()
        mgr = pravega_client.StreamManager(server.controller_uri)
        assert "keep" in mgr.list_scope() and sorted(mgr.list_stream("keep")) == ["_MARKs", "s"]  # with the watermark stream, as Pravega
        stub = stub_for(server.controller_uri)
        hi, lo = txn_id_to_bits(txn_id)
        req = pb.TxnRequest(streamInfo=pb.StreamInfo(scope="keep", stream="s"), txnId=pb.TxnId(highBits=hi, lowBits=lo))
        assert stub.checkTransactionState(req, timeout=5).state == pb.TxnState.OPEN
        w = mgr.create_writer("keep", "s", 100)
        w.write_event("after-restart")
        w.flush()

        async def resume():
            group = mgr.create_reader_group("rg-pos", "keep", "s")  # existing group: same state
            r = group.create_reader("r2")
            got: list[str] = []
            deadline = time.monotonic() + 20
            while "after-restart" not in got and time.monotonic() < deadline:
                sl = await asyncio.wait_for(r.get_segment_slice_async(), 10)
                got.extend(e.data().decode() for e in sl)
                r.release_segment(sl)
            r.reader_offline()
            return got

        assert asyncio.run(resume()) == ["after-restart"]
        # The open transaction's segments came back too: it commits and its events appear.
        assert stub.commitTransaction(req, timeout=10).status == pb.TxnStatus.SUCCESS
        all_events = read_n(mgr, "keep", "s", "rg-all", 351)
        assert Counter(e[0] for e in all_events) == {"e": 300, "t": 50, "a": 1}
    finally:
        server.stop()
