"""Regression tests for what the segment-store dispatch fuzzer (fuzz/segment_store_dispatch.py) found.

Each test replays the finding as a well-formed client would send it, over a real socket to an
in-process SegmentStoreServer; the fuzz harness checks the same property on every input.
"""

from __future__ import annotations


import pytest

from airflow_provider_pravega.embedded.segment_store import SegmentStoreServer
from airflow_provider_pravega.embedded.storage import SegmentStorage
from airflow_provider_pravega.protocol import wire
from pravega_testing.wire_peer import WirePeer

SEG = "fz/st/0.#epoch.0"


@pytest.fixture
def server(tmp_path):
    storage = SegmentStorage(tmp_path / "ss", fsync=False)
    storage.open()
    store = SegmentStoreServer(storage, "127.0.0.1", 0, tail_wait_s=0.1)
    store.start()
    yield store
    store.stop()
    storage.close()


def test_merging_a_segment_into_itself_is_refused_and_keeps_its_data(server):
    c = WirePeer("127.0.0.1", server.port)
    assert isinstance(c.call(wire.CreateSegment(1, SEG, 0, 0, "")), wire.SegmentCreated)
    assert isinstance(c.call(wire.SetupAppend(2, 7, SEG, "")), wire.AppendSetup)
    event = wire.frame_event(b"keep me")
    assert isinstance(c.call(wire.AppendBlockEnd(7, len(event), event, 1, 1, 3)), wire.DataAppended)
    reply = c.call(wire.MergeSegments(4, SEG, SEG, ""))
    # Found by the fuzzer: SegmentsMerged(new_target_write_offset=2*length), then the segment was gone.
    assert reply.IS_FAILURE and reply.request_id == 4, reply
    info = c.call(wire.GetStreamSegmentInfo(5, SEG, ""))
    assert isinstance(info, wire.StreamSegmentInfo) and info.write_offset == len(event), info
    read = c.call(wire.ReadSegment(SEG, 0, 1024, "", 6))
    assert isinstance(read, wire.SegmentRead) and read.data == event, read
