"""The embedded controller, driven through real gRPC: by the official client and by our stubs.

The controller runs in this process behind a real ``grpc.server`` on 127.0.0.1. Its segment
backend here is ``MemoryBackend`` below — a small in-memory SegmentBackend with the contract's
semantics, so tests can look inside the segment store and inject faults. (The real segment store,
``embedded/storage.py``, replaces it in the integration tests of the whole embedded server.)

The official ``pravega_client`` runs in a **child process**: its blocking calls hold the GIL
(observed with 0.3.8: even ``time.sleep`` in another thread stalls), so a server in the same
process could never answer it. Operations the official binding lacks (transactions by id, scale,
truncate, segments between cuts, ping) go through the generated stub.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from hang_guard import HANG_GUARD_S
from pravega_clients import OFFICIAL_CLIENT_REASON, official_client_installed

from airflow_provider_pravega.embedded.backend import SegmentInfo
from airflow_provider_pravega.embedded.controller import EmbeddedController
from airflow_provider_pravega.embedded.controller_base import ControllerBase
from airflow_provider_pravega.embedded.controller_config import ControllerConfig
from airflow_provider_pravega.embedded.controller_log import CorruptMetadataError
from airflow_provider_pravega.protocol import controller_pb2 as pb
from airflow_provider_pravega.protocol import controller_pb2_grpc as pb_grpc
from airflow_provider_pravega.protocol.naming import (
    bits_to_txn_id,
    qualified_segment_name,
    transaction_segment_name,
    txn_id_to_bits,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SS_HOST, SS_PORT = "127.0.0.1", 12345


# ------------------------------------------------------------------------------------ backend


class InjectedFault(RuntimeError):
    """A failure a test asked the backend to produce."""


@dataclass
class _Seg:
    data: bytearray = field(default_factory=bytearray)
    start: int = 0
    sealed: bool = False
    discarded: bool = False


class MemoryBackend:
    """In-memory SegmentBackend with the contract's semantics, call log and fault injection."""

    def __init__(self) -> None:
        self.segments: dict[str, _Seg] = {}
        self.merged: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []
        self.faults: dict[str, int] = {}  # method -> how many more calls fail
        self.lock = threading.Lock()

    def _enter(self, method: str, name: str) -> None:
        self.calls.append((method, name))
        if self.faults.get(method, 0) > 0:
            self.faults[method] -= 1
            raise InjectedFault(f"injected failure of {method}({name})")

    def create_segment(self, name: str) -> None:
        with self.lock:
            self._enter("create_segment", name)
            self.segments.setdefault(name, _Seg())

    def seal_segment(self, name: str) -> int:
        with self.lock:
            self._enter("seal_segment", name)
            seg = self.segments[name]
            seg.sealed = True
            return len(seg.data)

    def merge_segment(self, source: str, target: str) -> int:
        with self.lock:
            self._enter("merge_segment", source)
            tgt = self.segments[target]
            src = self.segments.get(source)
            if src is None:
                if self.merged.get(source) == target:
                    return len(tgt.data)
                raise KeyError(f"no segment {source}")
            if tgt.sealed:
                raise ValueError(f"merge into sealed {target}")
            tgt.data += src.data
            del self.segments[source]
            self.merged[source] = target
            return len(tgt.data)

    def discard_segment(self, name: str) -> None:
        with self.lock:
            self._enter("discard_segment", name)
            seg = self.segments.get(name)
            if seg is not None:
                seg.discarded = True
                seg.data.clear()

    def delete_segment(self, name: str) -> None:
        with self.lock:
            self._enter("delete_segment", name)
            self.segments.pop(name, None)

    def truncate_segment(self, name: str, offset: int) -> None:
        with self.lock:
            self._enter("truncate_segment", name)
            seg = self.segments[name]
            if offset > len(seg.data):
                raise ValueError(f"truncate {name} at {offset} beyond {len(seg.data)}")
            seg.start = max(seg.start, offset)

    def segment_info(self, name: str) -> SegmentInfo | None:
        with self.lock:
            seg = self.segments.get(name)
            if seg is None:
                return None
            return SegmentInfo(name, len(seg.data), seg.start, seg.sealed, 0)

    # what the segment store's append path would do (tests write through this)
    def append(self, name: str, data: bytes) -> None:
        with self.lock:
            seg = self.segments[name]
            assert not seg.sealed, f"append to sealed {name}"
            if not seg.discarded:
                seg.data += data


# ------------------------------------------------------------------------------------ harness


@dataclass
class Running:
    controller: EmbeddedController
    server: grpc.Server
    port: int
    channel: grpc.Channel
    stub: pb_grpc.ControllerServiceStub
    backend: MemoryBackend
    data_dir: Path

    def stop(self) -> None:
        self.server.stop(0).wait()
        self.channel.close()
        self.controller.stop()


def start_controller(data_dir: Path, backend: MemoryBackend, config: ControllerConfig | None = None,
                     kind: type[EmbeddedController] = EmbeddedController) -> Running:
    controller = kind(backend, SS_HOST, SS_PORT, data_dir, config or ControllerConfig())
    controller.recover()
    controller.start()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    pb_grpc.add_ControllerServiceServicer_to_server(controller, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    controller.advertise_controller("127.0.0.1", port)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    return Running(controller, server, port, channel, pb_grpc.ControllerServiceStub(channel), backend, data_dir)


@pytest.fixture
def backend() -> MemoryBackend:
    return MemoryBackend()


@pytest.fixture
def make(tmp_path: Path, backend: MemoryBackend):
    """Start controllers on ``tmp_path`` (several in turn for restart tests); stops them all."""
    running: list[Running] = []

    def _make(config: ControllerConfig | None = None, *, be: MemoryBackend | None = None) -> Running:
        r = start_controller(tmp_path, be or backend, config)
        running.append(r)
        return r

    yield _make
    for r in running:
        try:
            r.stop()
        except Exception:
            pass


@pytest.fixture
def ctl(make) -> Running:
    return make()


def official(port: int, body: str, timeout: float = 120) -> dict[str, Any]:
    """Run ``body`` with the official client (as ``m``, module ``P``) in a child process; return ``out``."""
    if not official_client_installed():
        pytest.skip(OFFICIAL_CLIENT_REASON)
    script = (
        "import json, time, pravega_client as P\n"
        f"m = P.StreamManager('tcp://127.0.0.1:{port}')\n"
        "out = {}\n"
        "def attempt(fn):\n"
        "    t = time.monotonic()\n"
        "    try:\n"
        "        return {'ok': fn(), 's': time.monotonic() - t}\n"
        "    except BaseException as e:\n"
        "        return {'error': f'{type(e).__name__}: {e}', 's': time.monotonic() - t}\n"
        + textwrap.dedent(body)
        + "\nprint('RESULT ' + json.dumps(out))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT
    )
    assert proc.returncode == 0, f"official client script failed:\n{proc.stderr[-4000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no result from the official client script:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


def info(scope: str, stream: str) -> pb.StreamInfo:
    return pb.StreamInfo(scope=scope, stream=stream)


def make_stream(r: Running, scope: str, stream: str, segments: int = 1) -> None:
    r.stub.createScope(pb.ScopeInfo(scope=scope))
    status = r.stub.createStream(
        pb.StreamConfig(
            streamInfo=info(scope, stream),
            scalingPolicy=pb.ScalingPolicy(scaleType=pb.ScalingPolicy.FIXED_NUM_SEGMENTS, minNumSegments=segments),
        )
    )
    assert status.status == pb.CreateStreamStatus.SUCCESS


def current(r: Running, scope: str, stream: str) -> list[tuple[int, float, float]]:
    ranges = r.stub.getCurrentSegments(info(scope, stream)).segmentRanges
    return [(x.segmentId.segmentId, x.minKey, x.maxKey) for x in ranges]


def create_txn(r: Running, scope: str, stream: str, lease: int = 90_000) -> tuple[int, pb.CreateTxnResponse]:
    resp = r.stub.createTransaction(pb.CreateTxnRequest(streamInfo=info(scope, stream), lease=lease))
    return bits_to_txn_id(resp.txnId.highBits, resp.txnId.lowBits), resp


def txn_request(scope: str, stream: str, txn_id: int, writer: str = "") -> pb.TxnRequest:
    hi, lo = txn_id_to_bits(txn_id)
    return pb.TxnRequest(streamInfo=info(scope, stream), txnId=pb.TxnId(highBits=hi, lowBits=lo), writerId=writer)


def txn_state(r: Running, scope: str, stream: str, txn_id: int) -> int:
    return r.stub.checkTransactionState(txn_request(scope, stream, txn_id)).state


def ping(r: Running, scope: str, stream: str, txn_id: int, lease: int = 90_000) -> int:
    hi, lo = txn_id_to_bits(txn_id)
    return r.stub.pingTransaction(
        pb.PingTxnRequest(streamInfo=info(scope, stream), txnId=pb.TxnId(highBits=hi, lowBits=lo), lease=lease)
    ).status


def txn_segments(scope: str, stream: str, txn_id: int, parents: list[int]) -> list[str]:
    return [transaction_segment_name(qualified_segment_name(scope, stream, p), txn_id) for p in parents]


def seg(scope: str, stream: str, sid: int) -> str:
    return qualified_segment_name(scope, stream, sid)


def rpc_error(fn: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as exc_info:
        fn()
    return exc_info.value


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def assert_successors_tile(r: Running, scope: str, stream: str, sealed: int) -> list[int]:
    """The client's check: successors naming ``sealed`` as predecessor are contiguous by key."""
    resp = r.stub.getSegmentsImmediatelyFollowing(pb.SegmentId(streamInfo=info(scope, stream), segmentId=sealed))
    mine = sorted(
        (e.segment.minKey, e.segment.maxKey, e.segment.segmentId.segmentId) for e in resp.segments if sealed in e.value
    )
    for (_, prev_max, _), (next_min, _, _) in zip(mine, mine[1:], strict=False):
        assert prev_max == next_min, f"successor ranges of {sealed} are not continuous: {mine}"
    return [s for _, _, s in mine]


S1 = 1 << 32  # segment ids of epoch 1 start here


# ------------------------------------------------------------------------------------ official client


def test_official_client_scopes(ctl: Running) -> None:
    out = official(
        ctl.port,
        """
        out['create'] = m.create_scope('alpha')
        out['again'] = m.create_scope('alpha')
        out['create2'] = m.create_scope('beta')
        out['list'] = sorted(m.list_scope())
        out['bad_name'] = attempt(lambda: m.create_scope('bad name'))
        m.create_stream('beta', 'st', 1)
        out['not_empty'] = attempt(lambda: m.delete_scope('beta'))
        out['delete'] = m.delete_scope('alpha')
        out['delete_missing'] = m.delete_scope('alpha')
        out['list_after'] = sorted(m.list_scope())
    """,
    )
    assert out["create"] is True and out["again"] is False and out["create2"] is True
    assert out["list"] == ["alpha", "beta"]
    assert "error" in out["bad_name"] and out["bad_name"]["s"] < 2
    assert "error" in out["not_empty"] and out["not_empty"]["s"] < 2
    assert out["delete"] is True and out["delete_missing"] is False
    assert out["list_after"] == ["beta"]


def test_official_client_streams_policies_and_tags(ctl: Running) -> None:
    out = official(
        ctl.port,
        """
        m.create_scope('sc')
        out['fixed'] = m.create_stream('sc', 'fixed', 3)
        out['dup'] = m.create_stream('sc', 'fixed', 3)
        out['tags_none'] = m.get_stream_tags('sc', 'fixed')
        out['by_rate'] = m.create_stream_with_policy(
            'sc', 'rate', P.StreamScalingPolicy.auto_scaling_policy_by_data_rate(100, 2, 2),
            P.StreamRetentionPolicy.by_size(1 << 30), ['t1', 't2'])
        out['by_events'] = m.create_stream_with_policy(
            'sc', 'events', P.StreamScalingPolicy.auto_scaling_policy_by_event_rate(500, 3, 1),
            P.StreamRetentionPolicy.by_time(3600000), [])
        out['tags_rate'] = m.get_stream_tags('sc', 'rate')
        out['tags_events'] = m.get_stream_tags('sc', 'events')
        out['update'] = m.update_stream_with_policy('sc', 'rate', P.StreamScalingPolicy.fixed_scaling_policy(2),
                                                    P.StreamRetentionPolicy.none(), ['t3'])
        out['tags_updated'] = m.get_stream_tags('sc', 'rate')
        out['list'] = sorted(m.list_stream('sc'))
        out['list_missing_scope'] = m.list_stream('nosuchscope')
    """,
    )
    assert out["fixed"] is True and out["dup"] is False
    assert out["tags_none"] == []  # Pravega always answers with a tag list
    assert out["by_rate"] is True and out["by_events"] is True
    assert out["tags_rate"] == ["t1", "t2"] and out["tags_events"] == []
    assert out["update"] is True and out["tags_updated"] == ["t3"]
    assert out["list"] == ["_MARKevents", "_MARKfixed", "_MARKrate", "events", "fixed", "rate"]
    assert out["list_missing_scope"] == []
    # policies are stored as given and returned by getStreamConfiguration
    cfg = ctl.stub.getStreamConfiguration(info("sc", "events"))
    assert cfg.streamInfo.stream == "events" and cfg.HasField("scalingPolicy")
    assert (
        cfg.scalingPolicy.scaleType,
        cfg.scalingPolicy.targetRate,
        cfg.scalingPolicy.scaleFactor,
        cfg.scalingPolicy.minNumSegments,
    ) == (pb.ScalingPolicy.BY_RATE_IN_EVENTS_PER_SEC, 500, 3, 1)
    assert (cfg.retentionPolicy.retentionType, cfg.retentionPolicy.retentionParam) == (pb.RetentionPolicy.TIME, 3600000)
    cfg = ctl.stub.getStreamConfiguration(info("sc", "rate"))
    assert cfg.scalingPolicy.scaleType == pb.ScalingPolicy.FIXED_NUM_SEGMENTS
    assert cfg.retentionPolicy.retentionType == pb.RetentionPolicy.UNKNOWN
    # three equal key ranges, the last ending exactly at 1.0
    assert current(ctl, "sc", "fixed") == [(0, 0.0, 1 / 3), (1, 1 / 3, 2 / 3), (2, 2 / 3, 1.0)]
    assert all(seg("sc", "fixed", i) in ctl.backend.segments for i in range(3))


def test_official_client_errors_fail_fast(ctl: Running) -> None:
    out = official(
        ctl.port,
        """
        m.create_scope('sc')
        m.create_stream('sc', 'open', 1)
        out['missing_scope'] = attempt(lambda: m.create_stream('nosuchscope', 'st', 1))
        out['bad_stream_name'] = attempt(lambda: m.create_stream('sc', 'bad/name', 1))
        out['tags_missing'] = attempt(lambda: m.get_stream_tags('sc', 'missing'))
        out['seal_missing'] = attempt(lambda: m.seal_stream('sc', 'missing'))
        out['update_missing'] = attempt(lambda: m.update_stream_with_policy('sc', 'missing'))
        out['delete_unsealed'] = attempt(lambda: m.delete_stream('sc', 'open'))
        out['delete_missing'] = attempt(lambda: m.delete_stream('sc', 'missing'))
    """,
    )
    for key in (
        "missing_scope",
        "bad_stream_name",
        "tags_missing",
        "seal_missing",
        "update_missing",
        "delete_unsealed",
    ):
        assert "error" in out[key], (key, out[key])
        assert out[key]["s"] < 2.0, f"{key} took {out[key]['s']:.1f}s: the client retried instead of failing fast"
    assert out["delete_missing"]["ok"] is False


def test_official_client_seal_delete_and_transactions(ctl: Running) -> None:
    out = official(
        ctl.port,
        """
        m.create_scope('sc')
        m.create_stream('sc', 'st', 2)
        w = m.create_transaction_writer('sc', 'st', 7)
        txn = w.begin_txn()
        out['txn_id'] = txn.get_txn_id()
        out['open'] = txn.is_open()
        txn.abort()
        out['open_after_abort'] = txn.is_open()
        txn2 = w.begin_txn()
        out['txn2_id'] = txn2.get_txn_id()
        out['seal'] = m.seal_stream('sc', 'st')
        out['seal_again'] = m.seal_stream('sc', 'st')
        out['delete'] = m.delete_stream('sc', 'st')
        out['list'] = m.list_stream('sc')
    """,
    )
    txn_id = out["txn_id"]
    assert txn_id >> 96 == 0, "epoch 0 in the top 32 bits"
    assert txn_id_to_bits(txn_id)[1] >= 0, "lowBits must be non-negative (the client sign-extends)"
    assert out["open"] is True and out["open_after_abort"] is False
    assert out["txn2_id"] > txn_id
    assert out["seal"] is True and out["seal_again"] is True and out["delete"] is True
    assert out["list"] == []
    # the stream's segments are gone from the segment store, the open transaction was aborted by the seal
    assert not any(name.startswith("sc/st/") and "#transaction" not in name for name in ctl.backend.segments)
    discarded = [c for c in ctl.backend.calls if c[0] == "discard_segment"]
    assert set(txn_segments("sc", "st", out["txn2_id"], [0, 1])) <= {n for _, n in discarded}


def test_official_client_list_pagination_and_internal_streams(make) -> None:
    r = make(ControllerConfig(list_page_size=2))
    for i in range(5):
        r.stub.createScope(pb.ScopeInfo(scope=f"scope{i}"))
    for i in range(5):
        make_stream(r, "scope0", f"st{i}")
    make_stream(r, "scope0", "_internal")  # Pravega hides '_' streams from listings
    out = official(
        r.port,
        """
        out['scopes'] = m.list_scope()
        out['streams'] = m.list_stream('scope0')
    """,
    )
    assert sorted(out["scopes"]) == [f"scope{i}" for i in range(5)]
    assert sorted(out["streams"]) == sorted([f"st{i}" for i in range(5)] + [f"_MARKst{i}" for i in range(5)])
    assert r.stub.checkStreamExists(info("scope0", "_internal")).exists


# ------------------------------------------------------------------------------------ stub: basics


def test_misc_rpcs(ctl: Running) -> None:
    make_stream(ctl, "sc", "st", 2)
    uri = ctl.stub.getURI(pb.SegmentId(streamInfo=info("sc", "rg_kvtable"), segmentId=0))
    assert (uri.endpoint, uri.port) == (SS_HOST, SS_PORT)
    assert ctl.stub.checkScopeExists(pb.ScopeInfo(scope="sc")).exists
    assert not ctl.stub.checkScopeExists(pb.ScopeInfo(scope="nope")).exists
    assert ctl.stub.checkStreamExists(info("sc", "st")).exists
    assert not ctl.stub.checkStreamExists(info("sc", "nope")).exists
    servers = ctl.stub.getControllerServerList(pb.ServerRequest()).nodeURI
    assert [(s.endpoint, s.port) for s in servers] == [("127.0.0.1", ctl.port)]
    assert ctl.stub.getDelegationToken(info("sc", "st")).delegationToken == ""
    assert ctl.stub.isSegmentValid(pb.SegmentId(streamInfo=info("sc", "st"), segmentId=1)).response
    assert not ctl.stub.isSegmentValid(pb.SegmentId(streamInfo=info("sc", "st"), segmentId=7)).response
    head = ctl.stub.getSegments(pb.GetSegmentsRequest(streamInfo=info("sc", "st"), timestamp=0)).segments
    assert [(s.segmentId.segmentId, s.offset) for s in head] == [(0, 0), (1, 0)]
    assert ctl.stub.isStreamCutValid(pb.StreamCut(streamInfo=info("sc", "st"), cut={0: 0, 1: 5})).response
    assert not ctl.stub.isStreamCutValid(pb.StreamCut(streamInfo=info("sc", "st"), cut={0: 0})).response
    assert not ctl.stub.isStreamCutValid(pb.StreamCut(streamInfo=info("sc", "st"), cut={0: 0, 1: 0, 9: 0})).response
    epoch0 = ctl.stub.getEpochSegments(pb.GetEpochSegmentsRequest(streamInfo=info("sc", "st"), epoch=0))
    assert [x.segmentId.segmentId for x in epoch0.segmentRanges] == [0, 1]
    err = rpc_error(lambda: ctl.stub.getEpochSegments(pb.GetEpochSegmentsRequest(streamInfo=info("sc", "st"), epoch=3)))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    err = rpc_error(lambda: ctl.stub.getCurrentSegments(info("sc", "nope")))
    assert err.code() == grpc.StatusCode.NOT_FOUND and "sc/nope" in err.details()


def test_segments_at_a_time(ctl: Running) -> None:
    make_stream(ctl, "sc", "st", 1)
    time.sleep(0.01)
    before_scale = int(time.time() * 1000)
    time.sleep(0.01)
    scale(ctl, "sc", "st", [0], [(0.0, 0.5), (0.5, 1.0)])

    def at(ts: int) -> list[tuple[int, int]]:
        got = ctl.stub.getSegments(pb.GetSegmentsRequest(streamInfo=info("sc", "st"), timestamp=ts)).segments
        return [(s.segmentId.segmentId, s.offset) for s in got]

    assert at(0) == [(0, 0)]  # the head
    assert at(before_scale) == [(0, 0)]
    assert at(int(time.time() * 1000)) == [(S1 + 1, 0), (S1 + 2, 0)]


def test_metadata_write_failure_stops_the_controller(make) -> None:
    """After a failed metadata write the controller refuses to serve instead of drifting from disk."""
    r = make()
    r.stub.createScope(pb.ScopeInfo(scope="before"))
    read_only = os.open(os.devnull, os.O_RDONLY)
    os.dup2(read_only, r.controller._log._fd)  # the log's file descriptor now rejects writes
    os.close(read_only)
    assert rpc_error(lambda: r.stub.createScope(pb.ScopeInfo(scope="lost"))).code() == grpc.StatusCode.INTERNAL
    err = rpc_error(lambda: r.stub.checkScopeExists(pb.ScopeInfo(scope="before")))
    assert err.code() == grpc.StatusCode.UNAVAILABLE and "metadata log failed" in err.details()
    with pytest.raises(OSError):
        r.stop()
    r2 = make()  # a restart serves what is durable
    assert r2.stub.checkScopeExists(pb.ScopeInfo(scope="before")).exists
    assert not r2.stub.checkScopeExists(pb.ScopeInfo(scope="lost")).exists


def test_invalid_arguments_fail_fast(ctl: Running) -> None:
    ctl.stub.createScope(pb.ScopeInfo(scope="sc"))
    base = pb.StreamConfig(streamInfo=info("sc", "st"))
    err = rpc_error(lambda: ctl.stub.createStream(base))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "scalingPolicy" in err.details()
    zero = pb.StreamConfig(streamInfo=info("sc", "st"), scalingPolicy=pb.ScalingPolicy(minNumSegments=0))
    assert ctl.stub.createStream(zero).status == pb.CreateStreamStatus.FAILURE  # as Pravega 0.13
    assert (
        ctl.stub.createStream(
            pb.StreamConfig(streamInfo=info("sc", "x" * 256), scalingPolicy=pb.ScalingPolicy(minNumSegments=1))
        ).status
        == pb.CreateStreamStatus.INVALID_STREAM_NAME
    )
    assert ctl.stub.createScope(pb.ScopeInfo(scope="")).status == pb.CreateScopeStatus.INVALID_SCOPE_NAME
    assert ctl.stub.createScope(pb.ScopeInfo(scope="_system")).status == pb.CreateScopeStatus.SUCCESS
    err = rpc_error(lambda: ctl.stub.listScopes(pb.ScopesRequest(continuationToken=pb.ContinuationToken(token="junk"))))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


# ------------------------------------------------------------------------------------ transactions


def test_transaction_commit_merges_into_parents(ctl: Running) -> None:
    make_stream(ctl, "sc", "st", 2)
    txn_id, resp = create_txn(ctl, "sc", "st")
    assert resp.txnId.lowBits >= 0 and txn_id >> 96 == 0
    assert [(x.segmentId.segmentId, x.minKey, x.maxKey) for x in resp.activeSegments] == [(0, 0.0, 0.5), (1, 0.5, 1.0)]
    names = txn_segments("sc", "st", txn_id, [0, 1])
    assert all(n in ctl.backend.segments for n in names), "transaction segments exist before the reply"
    ctl.backend.append(seg("sc", "st", 0), b"before-")
    ctl.backend.append(names[0], b"txn0")
    ctl.backend.append(names[1], b"txn1")
    assert txn_state(ctl, "sc", "st", txn_id) == pb.TxnState.OPEN
    assert ping(ctl, "sc", "st", txn_id) == pb.PingTxnStatus.OK
    status = ctl.stub.commitTransaction(txn_request("sc", "st", txn_id, writer="1"))
    assert status.status == pb.TxnStatus.SUCCESS
    assert txn_state(ctl, "sc", "st", txn_id) == pb.TxnState.COMMITTED
    assert bytes(ctl.backend.segments[seg("sc", "st", 0)].data) == b"before-txn0"
    assert bytes(ctl.backend.segments[seg("sc", "st", 1)].data) == b"txn1"
    assert not any(n in ctl.backend.segments for n in names)
    # idempotent commit; ping of a committed txn; abort of a committed one is refused fast (FAILURE, as Pravega)
    assert ctl.stub.commitTransaction(txn_request("sc", "st", txn_id)).status == pb.TxnStatus.SUCCESS
    assert ping(ctl, "sc", "st", txn_id) == pb.PingTxnStatus.COMMITTED
    assert ctl.stub.abortTransaction(txn_request("sc", "st", txn_id)).status == pb.TxnStatus.FAILURE


def test_transaction_abort_and_unknown(ctl: Running) -> None:
    make_stream(ctl, "sc", "st", 1)
    txn_id, _ = create_txn(ctl, "sc", "st")
    name = txn_segments("sc", "st", txn_id, [0])[0]
    ctl.backend.append(name, b"doomed")
    assert ctl.stub.abortTransaction(txn_request("sc", "st", txn_id)).status == pb.TxnStatus.SUCCESS
    assert txn_state(ctl, "sc", "st", txn_id) == pb.TxnState.ABORTED
    assert ctl.backend.segments[name].discarded
    ctl.backend.append(name, b"late write")  # the official client may still flush after abort
    assert ctl.stub.abortTransaction(txn_request("sc", "st", txn_id)).status == pb.TxnStatus.SUCCESS
    assert ping(ctl, "sc", "st", txn_id) == pb.PingTxnStatus.ABORTED
    assert ctl.stub.commitTransaction(txn_request("sc", "st", txn_id)).status == pb.TxnStatus.FAILURE
    assert ctl.backend.segments[seg("sc", "st", 0)].data == b""
    unknown = txn_id + 1000
    assert txn_state(ctl, "sc", "st", unknown) == pb.TxnState.UNKNOWN
    assert ping(ctl, "sc", "st", unknown) == pb.PingTxnStatus.UNKNOWN
    # Pravega 0.13 answers FAILURE to every refused commit/abort, and UNKNOWN for a missing stream's txn
    assert ctl.stub.commitTransaction(txn_request("sc", "st", unknown)).status == pb.TxnStatus.FAILURE
    assert ctl.stub.abortTransaction(txn_request("sc", "st", unknown)).status == pb.TxnStatus.FAILURE
    assert ctl.stub.commitTransaction(txn_request("sc", "nope", unknown)).status == pb.TxnStatus.FAILURE
    assert txn_state(ctl, "sc", "nope", unknown) == pb.TxnState.UNKNOWN


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch):
    """The controller's wall clock, stepped by the test: lease timing without sleeps or load races."""

    class SteppedClock:
        now_ms = int(time.time() * 1000)

        def advance(self, ms: int) -> None:
            self.now_ms += ms

    stepped = SteppedClock()
    monkeypatch.setattr(ControllerBase, "_now_ms", lambda self: stepped.now_ms)
    return stepped


def test_lease_limits(make, clock) -> None:
    default = make(ControllerConfig())  # Pravega's limits: 10 s .. 120 s
    make_stream(default, "sd", "st")
    err = rpc_error(lambda: create_txn(default, "sd", "st", lease=5_000))
    assert err.code() == grpc.StatusCode.UNKNOWN and "lease should be greater than minimum lease" in err.details()
    r = make(ControllerConfig(max_lease_ms=10_000, min_lease_ms=50, max_execution_time_ms=3_000))
    make_stream(r, "sc", "st")
    err = rpc_error(lambda: create_txn(r, "sc", "st", lease=20_000))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "10000" in err.details()
    assert rpc_error(lambda: create_txn(r, "sc", "st", lease=0)).code() == grpc.StatusCode.INVALID_ARGUMENT
    txn_id, _ = create_txn(r, "sc", "st", lease=2_500)
    assert ping(r, "sc", "st", txn_id, lease=20_000) == pb.PingTxnStatus.LEASE_TOO_LARGE
    clock.advance(600)
    assert ping(r, "sc", "st", txn_id, lease=2_500) == pb.PingTxnStatus.MAX_EXECUTION_TIME_EXCEEDED
    assert ping(r, "sc", "st", txn_id, lease=100) == pb.PingTxnStatus.OK


def test_lease_expiry_aborts(make, clock) -> None:
    # the reaper thread is slowed to its longest round; the test reaps itself at chosen instants
    r = make(ControllerConfig(lease_cap_ms=300, lease_check_interval_s=1.0))
    make_stream(r, "sc", "st", 2)
    kept, _ = create_txn(r, "sc", "st")  # the official client's 90 s, capped to 300 ms
    expiring, _ = create_txn(r, "sc", "st")
    for _ in range(4):  # pinging within the 300 ms lease keeps one alive past the other's deadline
        clock.advance(200)
        assert ping(r, "sc", "st", kept) == pb.PingTxnStatus.OK
        r.controller.reap_expired()
    assert txn_state(r, "sc", "st", expiring) == pb.TxnState.ABORTED
    assert txn_state(r, "sc", "st", kept) == pb.TxnState.OPEN
    assert all(r.backend.segments[n].discarded for n in txn_segments("sc", "st", expiring, [0, 1]))
    assert ping(r, "sc", "st", expiring) == pb.PingTxnStatus.ABORTED
    assert r.stub.commitTransaction(txn_request("sc", "st", expiring)).status == pb.TxnStatus.FAILURE
    assert r.stub.commitTransaction(txn_request("sc", "st", kept)).status == pb.TxnStatus.SUCCESS
    reasons = {t["id"]: t["abort_reason"] for t in r.controller.snapshot_state()["streams"][0]["txns"]}
    assert reasons[format(expiring, "032x")] == "lease expired"


def test_finished_transactions_are_bounded(make) -> None:
    r = make(ControllerConfig(finished_txn_limit=3))
    make_stream(r, "sc", "st")
    ids = []
    for _ in range(5):
        txn_id, _ = create_txn(r, "sc", "st")
        r.stub.commitTransaction(txn_request("sc", "st", txn_id))
        ids.append(txn_id)
    states = [txn_state(r, "sc", "st", t) for t in ids]
    assert states == [pb.TxnState.UNKNOWN] * 2 + [pb.TxnState.COMMITTED] * 3


def test_sealed_stream_refuses_transactions(ctl: Running) -> None:
    make_stream(ctl, "sc", "st")
    txn_id, _ = create_txn(ctl, "sc", "st")
    assert ctl.stub.sealStream(info("sc", "st")).status == pb.UpdateStreamStatus.SUCCESS
    assert txn_state(ctl, "sc", "st", txn_id) == pb.TxnState.ABORTED
    assert ctl.backend.segments[seg("sc", "st", 0)].sealed
    err = rpc_error(lambda: create_txn(ctl, "sc", "st"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "sealed" in err.details()
    assert not ctl.stub.isSegmentValid(pb.SegmentId(streamInfo=info("sc", "st"), segmentId=0)).response
    # as Pravega 0.13: a sealed stream has no current segments, its last epoch still answers;
    # successors are empty (end of stream)
    assert current(ctl, "sc", "st") == []
    epoch0 = ctl.stub.getEpochSegments(pb.GetEpochSegmentsRequest(streamInfo=info("sc", "st"), epoch=0))
    assert [r.segmentId.segmentId for r in epoch0.segmentRanges] == [0]
    assert (
        list(ctl.stub.getSegmentsImmediatelyFollowing(pb.SegmentId(streamInfo=info("sc", "st"), segmentId=0)).segments)
        == []
    )


# ------------------------------------------------------------------------------------ scaling


def scale(
    r: Running, scope: str, stream: str, sealed: list[int], ranges: list[tuple[float, float]]
) -> pb.ScaleResponse:
    return r.stub.scale(
        pb.ScaleRequest(
            streamInfo=info(scope, stream),
            sealedSegments=sealed,
            newKeyRanges=[pb.ScaleRequest.KeyRangeEntry(start=a, end=b) for a, b in ranges],
        )
    )


def test_scale_split_and_merge(ctl: Running) -> None:
    make_stream(ctl, "sc", "st", 1)
    resp = scale(ctl, "sc", "st", [0], [(0.0, 0.5), (0.5, 1.0)])
    assert resp.status == pb.ScaleResponse.STARTED and resp.epoch == 0
    assert [(x.segmentId.segmentId, x.minKey, x.maxKey) for x in resp.segments] == [
        (S1 + 1, 0.0, 0.5),
        (S1 + 2, 0.5, 1.0),
    ]
    check = ctl.stub.checkScale(pb.ScaleStatusRequest(streamInfo=info("sc", "st"), epoch=resp.epoch))
    assert check.status == pb.ScaleStatusResponse.SUCCESS
    assert (
        ctl.stub.checkScale(pb.ScaleStatusRequest(streamInfo=info("sc", "st"), epoch=1)).status
        == pb.ScaleStatusResponse.IN_PROGRESS
    )
    assert (
        ctl.stub.checkScale(pb.ScaleStatusRequest(streamInfo=info("sc", "st"), epoch=9)).status
        == pb.ScaleStatusResponse.INVALID_INPUT
    )
    assert current(ctl, "sc", "st") == [(S1 + 1, 0.0, 0.5), (S1 + 2, 0.5, 1.0)]
    assert ctl.backend.segments[seg("sc", "st", 0)].sealed
    assert seg("sc", "st", S1 + 1) == "sc/st/1.#epoch.1"
    assert assert_successors_tile(ctl, "sc", "st", 0) == [S1 + 1, S1 + 2]
    # merge the two back: numbering continues from the highest number so far
    resp = scale(ctl, "sc", "st", [S1 + 1, S1 + 2], [(0.0, 1.0)])
    assert resp.status == pb.ScaleResponse.STARTED and resp.epoch == 1
    s2 = (2 << 32) + 3
    assert current(ctl, "sc", "st") == [(s2, 0.0, 1.0)]
    follow = ctl.stub.getSegmentsImmediatelyFollowing(pb.SegmentId(streamInfo=info("sc", "st"), segmentId=S1 + 1))
    assert [(e.segment.segmentId.segmentId, sorted(e.value)) for e in follow.segments] == [(s2, [S1 + 1, S1 + 2])]
    assert (
        list(ctl.stub.getSegmentsImmediatelyFollowing(pb.SegmentId(streamInfo=info("sc", "st"), segmentId=s2)).segments)
        == []
    )
    between = ctl.stub.getSegmentsBetween(pb.StreamCutRange(streamInfo=info("sc", "st")))
    assert sorted(s.segmentId for s in between.segments) == [0, S1 + 1, S1 + 2, s2]


def test_scale_preconditions(ctl: Running) -> None:
    """Statuses as Pravega 0.13's submitScale: a segment outside the active epoch, or fewer segments
    than the policy's minimum, is PRECONDITION_FAILED; ranges that do not exactly replace the sealed
    ones, and a sealed stream, are FAILURE."""
    make_stream(ctl, "sc", "st", 2)
    precondition, invalid = pb.ScaleResponse.PRECONDITION_FAILED, pb.ScaleResponse.FAILURE
    assert scale(ctl, "sc", "st", [0], [(0.0, 0.4)]).status == invalid  # does not cover [0, 0.5)
    assert scale(ctl, "sc", "st", [0], [(0.0, 0.3), (0.2, 0.5)]).status == invalid  # overlap
    assert scale(ctl, "sc", "st", [0], [(0.0, 0.2), (0.3, 0.5)]).status == invalid  # gap
    assert scale(ctl, "sc", "st", [7], [(0.0, 0.5)]).status == precondition  # not a segment
    assert scale(ctl, "sc", "st", [], [(0.0, 0.5)]).status == invalid
    assert scale(ctl, "sc", "st", [0, 1], [(0.0, 0.5)]).status == invalid
    assert scale(ctl, "sc", "st", [0, 1], [(0.0, 1.0)]).status == precondition  # 1 < the fixed policy's 2
    assert current(ctl, "sc", "st") == [(0, 0.0, 0.5), (1, 0.5, 1.0)]
    ok = scale(ctl, "sc", "st", [0], [(0.0, 0.25), (0.25, 0.5)])
    assert ok.status == pb.ScaleResponse.STARTED
    assert scale(ctl, "sc", "st", [0], [(0.0, 0.5)]).status == precondition  # 0 is no longer active
    assert rpc_error(lambda: scale(ctl, "sc", "nope", [0], [(0.0, 1.0)])).code() == grpc.StatusCode.NOT_FOUND
    ctl.stub.sealStream(info("sc", "st"))
    assert scale(ctl, "sc", "st", [1], [(0.5, 1.0)]).status == invalid


def test_rolling_transaction(ctl: Running) -> None:
    """A transaction of epoch 0 committed after a scale is rolled into new epochs, as Pravega does."""
    make_stream(ctl, "sc", "st", 1)
    txn_id, _ = create_txn(ctl, "sc", "st")
    ctl.backend.append(txn_segments("sc", "st", txn_id, [0])[0], b"txn-data")
    ctl.backend.append(seg("sc", "st", 0), b"e0-")
    assert scale(ctl, "sc", "st", [0], [(0.0, 0.5), (0.5, 1.0)]).status == pb.ScaleResponse.STARTED
    ctl.backend.append(seg("sc", "st", S1 + 1), b"e1a")
    assert txn_state(ctl, "sc", "st", txn_id) == pb.TxnState.OPEN
    assert ctl.stub.commitTransaction(txn_request("sc", "st", txn_id)).status == pb.TxnStatus.SUCCESS
    assert txn_state(ctl, "sc", "st", txn_id) == pb.TxnState.COMMITTED
    dup = 2 << 32  # the copy of segment 0 in epoch 2 holds the transaction's events
    s3a, s3b = (3 << 32) + 1, (3 << 32) + 2  # the active epoch continues as epoch 3
    assert current(ctl, "sc", "st") == [(s3a, 0.0, 0.5), (s3b, 0.5, 1.0)]
    assert bytes(ctl.backend.segments[seg("sc", "st", dup)].data) == b"txn-data"
    assert ctl.backend.segments[seg("sc", "st", dup)].sealed
    assert ctl.backend.segments[seg("sc", "st", S1 + 1)].sealed and ctl.backend.segments[seg("sc", "st", S1 + 2)].sealed
    assert bytes(ctl.backend.segments[seg("sc", "st", 0)].data) == b"e0-"
    # readers: 0 -> epoch-1 segments -> the transaction's copy -> epoch 3; ranges tile at each step
    assert assert_successors_tile(ctl, "sc", "st", 0) == [S1 + 1, S1 + 2]
    assert assert_successors_tile(ctl, "sc", "st", S1 + 1) == [dup]
    assert assert_successors_tile(ctl, "sc", "st", S1 + 2) == [dup]
    assert assert_successors_tile(ctl, "sc", "st", dup) == [s3a, s3b]
    between = ctl.stub.getSegmentsBetween(pb.StreamCutRange(streamInfo=info("sc", "st")))
    assert sorted(s.segmentId for s in between.segments) == [0, S1 + 1, S1 + 2, dup, s3a, s3b]
    # a new transaction lives in the new active epoch
    txn2, resp = create_txn(ctl, "sc", "st")
    assert txn2 >> 96 == 3 and [x.segmentId.segmentId for x in resp.activeSegments] == [s3a, s3b]


def test_concurrent_transactions_with_scale(ctl: Running) -> None:
    """Many threads create, fill and commit transactions while the stream scales under them."""
    make_stream(ctl, "sc", "st", 2)
    errors: list[BaseException] = []
    committed: list[int] = []
    payload = b"x" * 10

    def worker(n: int) -> None:
        try:
            for _ in range(6):
                txn_id, resp = create_txn(ctl, "sc", "st")
                parents = [x.segmentId.segmentId for x in resp.activeSegments]
                for name in txn_segments("sc", "st", txn_id, parents):
                    ctl.backend.append(name, payload)
                assert ctl.stub.commitTransaction(txn_request("sc", "st", txn_id)).status == pb.TxnStatus.SUCCESS
                committed.append(len(parents))
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    segs = [s for s, _, _ in current(ctl, "sc", "st")]
    assert scale(ctl, "sc", "st", [segs[0]], [(0.0, 0.25), (0.25, 0.5)]).status == pb.ScaleResponse.STARTED
    for t in threads:
        t.join(60)
    assert not errors, errors
    total = sum(len(s.data) for name, s in ctl.backend.segments.items() if "#transaction" not in name)
    assert total == sum(committed) * len(payload)
    ranges = current(ctl, "sc", "st")
    assert ranges[0][1] == 0.0 and ranges[-1][2] == 1.0
    assert all(a[2] == b[1] for a, b in zip(ranges, ranges[1:], strict=False))


# ------------------------------------------------------------------------------------ truncation & cuts


def test_truncate_and_head(ctl: Running) -> None:
    make_stream(ctl, "sc", "st", 2)
    ctl.backend.append(seg("sc", "st", 0), b"0123456789")
    ctl.backend.append(seg("sc", "st", 1), b"abcdef")

    def truncate(cut: dict[int, int]) -> pb.UpdateStreamStatus:
        return ctl.stub.truncateStream(pb.StreamCut(streamInfo=info("sc", "st"), cut=cut))

    def head() -> list[tuple[int, int]]:
        got = ctl.stub.getSegments(pb.GetSegmentsRequest(streamInfo=info("sc", "st"), timestamp=0)).segments
        return [(s.segmentId.segmentId, s.offset) for s in got]

    assert truncate({0: 4, 1: 2}).status == pb.UpdateStreamStatus.SUCCESS
    assert head() == [(0, 4), (1, 2)]
    assert ctl.backend.segments[seg("sc", "st", 0)].start == 4
    # As Pravega 0.13: a cut that is not valid, or behind the head on any segment, is FAILURE.
    failure = pb.UpdateStreamStatus.FAILURE
    assert truncate({0: 4}).status == failure  # does not cover [0.5, 1)
    assert truncate({}).status == failure
    assert truncate({0: 99, 1: 2}).status == failure  # past the end: a deliberate difference (Pravega accepts)
    assert truncate({0: 1, 1: 3}).status == failure  # segment 0 behind its head at 4
    assert head() == [(0, 4), (1, 2)]
    assert truncate({0: 4, 1: 3}).status == pb.UpdateStreamStatus.SUCCESS
    assert head() == [(0, 4), (1, 3)]
    # after a scale (two segments stay: the fixed policy's minimum), a cut on the new segments
    # deletes the old ones
    assert scale(ctl, "sc", "st", [0, 1], [(0.0, 0.5), (0.5, 1.0)]).status == pb.ScaleResponse.STARTED
    new_low, new_high = S1 + 2, S1 + 3
    ctl.backend.append(seg("sc", "st", new_low), b"xyz")
    assert truncate({new_low: 1, new_high: 0}).status == pb.UpdateStreamStatus.SUCCESS
    assert head() == [(new_low, 1), (new_high, 0)]
    assert seg("sc", "st", 0) not in ctl.backend.segments and seg("sc", "st", 1) not in ctl.backend.segments
    assert truncate({0: 4, 1: 3}).status == failure
    assert not ctl.stub.isStreamCutValid(pb.StreamCut(streamInfo=info("sc", "st"), cut={0: 4, 1: 3})).response
    between = ctl.stub.getSegmentsBetween(pb.StreamCutRange(streamInfo=info("sc", "st")))
    assert [s.segmentId for s in between.segments] == [new_low, new_high]


def test_segments_between_cuts(ctl: Running) -> None:
    make_stream(ctl, "sc", "st", 2)  # 0: [0, .5)  1: [.5, 1)
    scale(ctl, "sc", "st", [0], [(0.0, 0.25), (0.25, 0.5)])  # S1+2, S1+3
    scale(ctl, "sc", "st", [1], [(0.5, 1.0)])  # (2<<32)+4
    s4 = (2 << 32) + 4

    def between(frm: dict[int, int], to: dict[int, int]) -> list[int]:
        req = pb.StreamCutRange(streamInfo=info("sc", "st"), to=to)
        getattr(req, "from").update(frm)
        return sorted(s.segmentId for s in ctl.stub.getSegmentsBetween(req).segments)

    assert between({}, {}) == [0, 1, S1 + 2, S1 + 3, s4]
    assert between({0: 0, 1: 0}, {0: 10, 1: 5}) == [0, 1]
    assert between({0: 0, 1: 0}, {S1 + 2: 0, S1 + 3: 0, 1: 9}) == [0, 1, S1 + 2, S1 + 3]
    assert between({S1 + 2: 0, S1 + 3: 0, 1: 3}, {}) == [1, S1 + 2, S1 + 3, s4]
    err = rpc_error(lambda: between({S1 + 2: 0, S1 + 3: 0, s4: 0}, {0: 0, 1: 0}))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "after" in err.details()
    assert rpc_error(lambda: between({0: 5, 1: 0}, {0: 2, 1: 0})).code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc_error(lambda: between({0: 0}, {})).code() == grpc.StatusCode.INVALID_ARGUMENT


# ------------------------------------------------------------------------------------ durability


def test_restart_keeps_state(make, backend: MemoryBackend) -> None:
    r = make()
    make_stream(r, "sc", "st", 2)
    r.stub.createStream(
        pb.StreamConfig(
            streamInfo=info("sc", "tagged"),
            tags=pb.Tags(tag=["a"]),
            scalingPolicy=pb.ScalingPolicy(
                scaleType=pb.ScalingPolicy.BY_RATE_IN_KBYTES_PER_SEC, targetRate=5, scaleFactor=2, minNumSegments=1
            ),
        )
    )
    scale(r, "sc", "st", [1], [(0.5, 0.75), (0.75, 1.0)])
    open_txn, _ = create_txn(r, "sc", "st")
    done_txn, _ = create_txn(r, "sc", "st")
    r.stub.commitTransaction(txn_request("sc", "st", done_txn))
    r.stub.truncateStream(pb.StreamCut(streamInfo=info("sc", "st"), cut={0: 0, S1 + 2: 0, S1 + 3: 0}))
    before = r.controller.snapshot_state()
    r.stop()
    r2 = make()
    assert r2.controller.snapshot_state() == before
    assert txn_state(r2, "sc", "st", open_txn) == pb.TxnState.OPEN
    assert txn_state(r2, "sc", "st", done_txn) == pb.TxnState.COMMITTED
    out = official(
        r2.port,
        """
        out['streams'] = sorted(m.list_stream('sc'))
        out['tags'] = m.get_stream_tags('sc', 'tagged')
    """,
    )
    assert out == {"streams": ["_MARKst", "_MARKtagged", "st", "tagged"], "tags": ["a"]}
    # ids keep growing after a restart
    next_txn, _ = create_txn(r2, "sc", "st")
    assert next_txn > done_txn


def test_snapshots_and_log_restart(make, tmp_path: Path) -> None:
    r = make(ControllerConfig(snapshot_every=5))
    for i in range(23):
        r.stub.createScope(pb.ScopeInfo(scope=f"s{i}"))
    log_lines = (tmp_path / "controller" / "log.jsonl").read_text().splitlines()
    assert (tmp_path / "controller" / "state.json").exists()
    assert len(log_lines) < 5
    r.stop()
    r2 = make(ControllerConfig(snapshot_every=5))
    assert sorted(r2.stub.listScopes(pb.ScopesRequest(continuationToken=pb.ContinuationToken())).scopes) == sorted(
        f"s{i}" for i in range(23)
    )


def test_torn_log_line_is_ignored(make, tmp_path: Path) -> None:
    r = make()
    r.stub.createScope(pb.ScopeInfo(scope="kept"))
    r.stop()
    log_path = tmp_path / "controller" / "log.jsonl"
    good = log_path.read_bytes()
    with open(log_path, "ab") as f:
        f.write(b'{"op":"scope_created","scope":"torn","seq":')  # a write cut short by kill -9
    r2 = make()
    assert r2.stub.checkScopeExists(pb.ScopeInfo(scope="kept")).exists
    assert not r2.stub.checkScopeExists(pb.ScopeInfo(scope="torn")).exists
    assert log_path.read_bytes() == good, "the torn tail is cut off before appending"
    r2.stub.createScope(pb.ScopeInfo(scope="after"))
    r2.stop()
    r3 = make()
    assert r3.stub.checkScopeExists(pb.ScopeInfo(scope="after")).exists
    r3.stop()
    # damage that a crash cannot explain (garbage *before* a valid record) is refused, not guessed
    lines = log_path.read_bytes().splitlines(keepends=True)
    log_path.write_bytes(b"garbage\n" + b"".join(lines))
    with pytest.raises(CorruptMetadataError):
        start_controller(tmp_path, MemoryBackend())


def test_open_transaction_expires_by_its_original_deadline(make, clock) -> None:
    config = ControllerConfig(lease_cap_ms=2500, lease_check_interval_s=1.0)
    r = make(config)
    make_stream(r, "sc", "st")
    txn_id, _ = create_txn(r, "sc", "st")
    deadline = r.controller.snapshot_state()["streams"][0]["txns"][0]["deadline_ms"]
    r.stop()
    clock.advance(2000)
    r2 = make(config)
    # the restart neither renews the lease nor drops it: the recorded deadline stands
    assert r2.controller.snapshot_state()["streams"][0]["txns"][0]["deadline_ms"] == deadline
    assert r2.controller.reap_expired() == 0
    assert txn_state(r2, "sc", "st", txn_id) == pb.TxnState.OPEN
    clock.advance(deadline - clock.now_ms)
    assert r2.controller.reap_expired() == 0, "aborted at its deadline, not after it"
    clock.advance(1)
    assert r2.controller.reap_expired() == 1
    assert txn_state(r2, "sc", "st", txn_id) == pb.TxnState.ABORTED


def test_recover_finishes_interrupted_commit(make, backend: MemoryBackend) -> None:
    r = make()
    make_stream(r, "sc", "st", 2)
    txn_id, _ = create_txn(r, "sc", "st")
    names = txn_segments("sc", "st", txn_id, [0, 1])
    backend.append(names[0], b"a")
    backend.append(names[1], b"b")
    backend.faults["merge_segment"] = 1  # the commit dies in its first merge, leaving COMMITTING
    err = rpc_error(lambda: r.stub.commitTransaction(txn_request("sc", "st", txn_id)))
    assert err.code() == grpc.StatusCode.INTERNAL  # retryable for the client: the commit is idempotent
    assert txn_state(r, "sc", "st", txn_id) == pb.TxnState.COMMITTING
    r.stop()
    r2 = make()  # recover() merges and marks it COMMITTED before serving
    assert txn_state(r2, "sc", "st", txn_id) == pb.TxnState.COMMITTED
    assert bytes(backend.segments[seg("sc", "st", 0)].data) == b"a"
    assert bytes(backend.segments[seg("sc", "st", 1)].data) == b"b"


def test_recover_finishes_interrupted_rolling_commit_abort_and_delete(make, backend: MemoryBackend) -> None:
    r = make()
    make_stream(r, "sc", "roll", 1)
    rolled, _ = create_txn(r, "sc", "roll")
    backend.append(txn_segments("sc", "roll", rolled, [0])[0], b"late txn")
    scale(r, "sc", "roll", [0], [(0.0, 0.5), (0.5, 1.0)])
    make_stream(r, "sc", "ab", 1)
    aborted, _ = create_txn(r, "sc", "ab")
    make_stream(r, "sc", "gone", 1)
    r.stub.sealStream(info("sc", "gone"))
    backend.faults["seal_segment"] = 1  # the rolling commit stops after merging into the copy
    assert (
        rpc_error(lambda: r.stub.commitTransaction(txn_request("sc", "roll", rolled))).code()
        == grpc.StatusCode.INTERNAL
    )
    backend.faults["discard_segment"] = 1
    assert (
        rpc_error(lambda: r.stub.abortTransaction(txn_request("sc", "ab", aborted))).code() == grpc.StatusCode.INTERNAL
    )
    backend.faults["delete_segment"] = 1
    assert rpc_error(lambda: r.stub.deleteStream(info("sc", "gone"))).code() == grpc.StatusCode.INTERNAL
    assert txn_state(r, "sc", "roll", rolled) == pb.TxnState.COMMITTING
    assert txn_state(r, "sc", "ab", aborted) == pb.TxnState.ABORTING
    assert not r.stub.checkStreamExists(info("sc", "gone")).exists  # invisible while being deleted
    r.stop()
    r2 = make()
    assert txn_state(r2, "sc", "roll", rolled) == pb.TxnState.COMMITTED
    dup = 2 << 32
    assert bytes(backend.segments[seg("sc", "roll", dup)].data) == b"late txn"
    assert backend.segments[seg("sc", "roll", dup)].sealed
    assert [s for s, _, _ in current(r2, "sc", "roll")] == [(3 << 32) + 1, (3 << 32) + 2]
    assert all(backend.segments[seg("sc", "roll", s)].sealed for s in (0, S1 + 1, S1 + 2))
    assert txn_state(r2, "sc", "ab", aborted) == pb.TxnState.ABORTED
    assert backend.segments[txn_segments("sc", "ab", aborted, [0])[0]].discarded
    assert seg("sc", "gone", 0) not in backend.segments
    assert [s["name"] for s in r2.controller.snapshot_state()["streams"]] == ["roll", "ab"]


def test_recover_reseals_and_recreates(make, backend: MemoryBackend) -> None:
    """A crash between a record and its backend work: recover() repeats the work."""
    r = make()
    make_stream(r, "sc", "st", 2)
    txn_id, _ = create_txn(r, "sc", "st")
    r.stop()
    # pretend the segment store lost the unsynced tail: the open transaction's segments and the seal
    for name in txn_segments("sc", "st", txn_id, [0, 1]):
        del backend.segments[name]
    r2 = make()
    assert all(n in backend.segments for n in txn_segments("sc", "st", txn_id, [0, 1]))
    r2.stub.sealStream(info("sc", "st"))
    r2.stop()
    backend.segments[seg("sc", "st", 0)].sealed = False
    make()
    assert backend.segments[seg("sc", "st", 0)].sealed


# ------------------------------------------------------------------------------------ kill -9

_SERVER_SCRIPT = r"""
import sys, threading, time, pathlib
from concurrent import futures
import grpc
from airflow_provider_pravega.embedded.controller import EmbeddedController
from airflow_provider_pravega.embedded.controller_config import ControllerConfig
from airflow_provider_pravega.protocol import controller_pb2_grpc as pb_grpc

class Backend:  # forgets everything on kill -9: this test is about the controller's own log
    def __init__(self): self.segs = {}; self.lock = threading.Lock()
    def create_segment(self, n):
        with self.lock: self.segs.setdefault(n, 0)
    def seal_segment(self, n): return 0
    def merge_segment(self, s, t):
        with self.lock: self.segs.pop(s, None); self.segs.setdefault(t, 0); return 0
    def discard_segment(self, n): pass
    def delete_segment(self, n):
        with self.lock: self.segs.pop(n, None)
    def truncate_segment(self, n, o): pass
    def segment_info(self, n): return None

config = ControllerConfig(snapshot_every=50)
controller = EmbeddedController(Backend(), "127.0.0.1", 12345, pathlib.Path(sys.argv[1]), config)
controller.recover(); controller.start()
server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
pb_grpc.add_ControllerServiceServicer_to_server(controller, server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
time.sleep(3600)
"""


def _spawn_server(data_dir: Path) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER_SCRIPT, str(data_dir)], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    return proc, port


def test_kill_9_loses_no_acknowledged_metadata(tmp_path: Path) -> None:
    """kill -9 the controller process at random moments under concurrent load; every acknowledged
    scope, stream and transaction outcome must be there after the restart."""
    rng = random.Random(1234)
    acked_scopes: set[str] = set()
    acked_commits: dict[tuple[str, int], None] = {}
    counter = iter(range(1_000_000))
    for round_no in range(3):
        proc, port = _spawn_server(tmp_path)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = pb_grpc.ControllerServiceStub(channel)
        stop = threading.Event()

        def load(stub: pb_grpc.ControllerServiceStub = stub, stop: threading.Event = stop) -> None:
            while not stop.is_set():
                n = next(counter)
                try:
                    scope = f"s{n}"
                    stub.createScope(pb.ScopeInfo(scope=scope), timeout=5)
                    acked_scopes.add(scope)
                    stub.createStream(
                        pb.StreamConfig(streamInfo=info(scope, "st"), scalingPolicy=pb.ScalingPolicy(minNumSegments=2)),
                        timeout=5,
                    )
                    resp = stub.createTransaction(
                        pb.CreateTxnRequest(streamInfo=info(scope, "st"), lease=60_000), timeout=5
                    )
                    txn_id = bits_to_txn_id(resp.txnId.highBits, resp.txnId.lowBits)
                    if (
                        stub.commitTransaction(txn_request(scope, "st", txn_id), timeout=5).status
                        == pb.TxnStatus.SUCCESS
                    ):
                        acked_commits[(scope, txn_id)] = None
                except grpc.RpcError:
                    return  # the server died under us

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(rng.uniform(0.3, 1.2))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        stop.set()
        for t in threads:
            t.join(10)
        channel.close()
        assert acked_scopes, f"round {round_no}: no load reached the server"

    proc, port = _spawn_server(tmp_path)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ControllerServiceStub(channel)
            listed = set(stub.listScopes(pb.ScopesRequest(continuationToken=pb.ContinuationToken())).scopes)
            assert acked_scopes <= listed, f"lost scopes: {sorted(acked_scopes - listed)[:5]}"
            for scope, txn_id in acked_commits:
                state = stub.checkTransactionState(txn_request(scope, "st", txn_id)).state
                assert state == pb.TxnState.COMMITTED, (scope, txn_id, state)
    finally:
        proc.kill()
        proc.wait()


class _StillCreating(EmbeddedController):
    """Answers getCurrentSegments as Pravega 0.13 does while another process is still creating the
    stream (INTERNAL "Stream: … State: CREATING"), until ``created`` is set; counts the refusals."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.created = threading.Event()
        self.refused = 0

    def getCurrentSegments(self, request: pb.StreamInfo, context: grpc.ServicerContext) -> pb.SegmentRanges:
        if not self.created.is_set():
            self.refused += 1
            context.abort(grpc.StatusCode.INTERNAL, f"Stream: {request.stream} State: CREATING")
        return super().getCurrentSegments(request, context)


def test_the_client_waits_for_a_stream_another_process_is_still_creating(tmp_path: Path) -> None:
    """Seen in CI against Pravega 0.13: checkStreamExists says yes while the creator is still at
    work, and getCurrentSegments then answers INTERNAL "State: CREATING". The client waits for it."""
    from airflow_provider_pravega.client.controller import ControllerClient
    from airflow_provider_pravega.client.controller_types import ScalingPolicy

    running = start_controller(tmp_path, MemoryBackend(), kind=_StillCreating)
    controller = running.controller
    client = ControllerClient(f"tcp://127.0.0.1:{running.port}")
    try:
        client.create_scope("sc")
        client.create_stream("sc", "st", ScalingPolicy.fixed(2))

        def finish_creating() -> None:  # the creator finishes once the client was refused twice
            deadline = time.monotonic() + HANG_GUARD_S
            while controller.refused < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            controller.created.set()

        creator = threading.Thread(target=finish_creating)
        creator.start()
        ranges = client.get_current_segments("sc", "st")
        creator.join()
        assert controller.refused >= 2
        assert [r.segment_id for r in ranges] == [0, 1]
    finally:
        client.close()
        running.stop()


def test_a_stream_that_stays_in_creation_fails_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_pravega.client import controller as controller_module
    from airflow_provider_pravega.client.controller_types import ScalingPolicy
    from airflow_provider_pravega.client.errors import ControllerError

    monkeypatch.setattr(controller_module, "STREAM_CREATING_WAIT_S", 0.5)
    running = start_controller(tmp_path, MemoryBackend(), kind=_StillCreating)
    client = controller_module.ControllerClient(f"tcp://127.0.0.1:{running.port}")
    try:
        client.create_scope("sc")
        client.create_stream("sc", "st", ScalingPolicy.fixed(1))
        with pytest.raises(ControllerError, match=r"sc/st: the stream was still being created after 0.5 s"):
            client.get_current_segments("sc", "st")
    finally:
        client.close()
        running.stop()
