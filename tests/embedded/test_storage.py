"""SegmentStorage: durability, recovery, dedup, merges and tables, on a real disk."""

from __future__ import annotations

import os
import threading

import pytest

from airflow_provider_pravega.embedded import storage as st
from airflow_provider_pravega.embedded.storage import SegmentStorage

W1 = b"\x01" * 16
W2 = b"\x02" * 16


def append_sync(s: SegmentStorage, name: str, writer: bytes, ev: int, data: bytes, **kw) -> st.AppendResult:
    box: list[st.AppendResult] = []
    done = threading.Event()

    def cb(r):
        box.append(r)
        done.set()

    s.append(name, writer, ev, data, cb, **kw)
    assert done.wait(10)
    return box[0]


def setup_sync(s: SegmentStorage, name: str, writer: bytes):
    box: list = []
    done = threading.Event()
    s.setup_writer(name, writer, lambda r: (box.append(r), done.set()))
    assert done.wait(10)
    return box[0]


@pytest.fixture
def store(tmp_path):
    s = SegmentStorage(tmp_path / "ss")
    s.open()
    yield s
    s.close()


def reopen(s: SegmentStorage, *, clean: bool = True) -> SegmentStorage:
    if clean:
        s.close()
    new = SegmentStorage(s.root)
    new.open()
    return new


def test_append_read_and_recover(store):
    store.create_segment("s/st/0.#epoch.0")
    r = append_sync(store, "s/st/0.#epoch.0", W1, 1, b"hello")
    assert (r.error, r.write_offset, r.previous_event_number) == (None, 5, st.NO_EVENT_NUMBER)
    r = append_sync(store, "s/st/0.#epoch.0", W1, 2, b" world")
    assert r.write_offset == 11 and r.previous_event_number == 1
    res = store.read("s/st/0.#epoch.0", 0, 100)
    assert res.data == b"hello world" and res.at_tail and not res.end_of_segment
    store2 = reopen(store)
    try:
        assert store2.read("s/st/0.#epoch.0", 6, 100).data == b"world"
        assert setup_sync(store2, "s/st/0.#epoch.0", W1) == 2
        assert setup_sync(store2, "s/st/0.#epoch.0", W2) == st.NO_EVENT_NUMBER
    finally:
        store2.close()


def test_crash_without_close_keeps_acknowledged_data_and_drops_torn_tail(tmp_path):
    s = SegmentStorage(tmp_path / "ss", checkpoint_bytes=10**12)
    s.open()
    s.create_segment("a/b/0")
    for i in range(1, 101):
        append_sync(s, "a/b/0", W1, i, b"x" * 10)
    # Simulate kill -9: no close(); then a torn half record at the journal's end, and garbage in
    # the segment file beyond the acknowledged length (a write that was never journaled).
    journal = sorted((s.root / "journal").glob("*.log"))[-1]
    with open(journal, "ab") as fh:
        fh.write(b"\x00\x01\x02\x03\x00\x00\x10\x00\x01partial")
    with open(s.root / "data" / "1.seg", "ab") as fh:
        fh.write(b"GARBAGE")
    s2 = SegmentStorage(s.root)
    s2.open()
    try:
        info = s2.segment_info("a/b/0")
        assert info is not None and info.length == 1000
        assert s2.read("a/b/0", 0, 2000).data == b"x" * 1000
        assert setup_sync(s2, "a/b/0", W1) == 100
        r = append_sync(s2, "a/b/0", W1, 101, b"y")
        assert r.write_offset == 1001
    finally:
        s2.close()


def test_resent_block_is_not_appended_twice(store):
    store.create_segment("s/x/0")
    append_sync(store, "s/x/0", W1, 5, b"abc")
    r = append_sync(store, "s/x/0", W1, 5, b"abc")
    assert r.error is None and r.write_offset == 3
    r = append_sync(store, "s/x/0", W1, 3, b"zz")
    assert r.error is None and r.write_offset == 3
    assert store.read("s/x/0", 0, 10).data == b"abc"


def test_conditional_append_and_seal(store):
    store.create_segment("s/c/0")
    assert append_sync(store, "s/c/0", W1, 1, b"ab", expected_offset=0).error is None
    r = append_sync(store, "s/c/0", W1, 2, b"cd", expected_offset=0)
    assert isinstance(r.error, st.ConditionalCheckFailed)
    assert store.seal_segment("s/c/0") == 2
    r = append_sync(store, "s/c/0", W1, 3, b"ef")
    assert isinstance(r.error, st.SegmentSealed)
    res = store.read("s/c/0", 0, 10)
    assert res.data == b"ab" and res.end_of_segment
    assert isinstance(append_sync(store, "nope", W1, 1, b"x").error, st.NoSuchSegment)


def test_merge_is_atomic_idempotent_and_survives_restart(store):
    store.create_segment("s/m/0")
    store.create_segment("s/m/0#transaction.1")
    append_sync(store, "s/m/0", W1, 1, b"base-")
    append_sync(store, "s/m/0#transaction.1", W2, 1, b"txn-data")
    assert store.merge_segment("s/m/0#transaction.1", "s/m/0") == 13
    assert store.merge_segment("s/m/0#transaction.1", "s/m/0") == 13
    assert not store.exists("s/m/0#transaction.1")
    store2 = reopen(store, clean=False)  # no checkpoint: the merge is replayed from the journal
    try:
        assert store2.read("s/m/0", 0, 100).data == b"base-txn-data"
        assert not store2.exists("s/m/0#transaction.1")
    finally:
        store2.close()


def test_truncate_and_delete(store):
    store.create_segment("s/t/0")
    append_sync(store, "s/t/0", W1, 1, b"0123456789")
    store.truncate_segment("s/t/0", 4)
    with pytest.raises(st.SegmentTruncated) as e:
        store.read("s/t/0", 2, 10)
    assert e.value.start_offset == 4
    assert store.read("s/t/0", 4, 10).data == b"456789"
    with pytest.raises(st.BadOffset):
        store.truncate_segment("s/t/0", 11)
    store.delete_segment("s/t/0")
    assert store.segment_info("s/t/0") is None
    store.delete_segment("s/t/0")  # idempotent


def test_discarded_segment_is_gone_like_in_pravega(store):
    store.create_segment("s/d/0#transaction.9")
    append_sync(store, "s/d/0#transaction.9", W1, 1, b"x")
    store.discard_segment("s/d/0#transaction.9")
    r = append_sync(store, "s/d/0#transaction.9", W1, 2, b"late")
    assert isinstance(r.error, st.NoSuchSegment)  # real Pravega answers late appends this way
    assert store.segment_info("s/d/0#transaction.9") is None


def test_tables_versions_and_delta(store):
    assert store.create_table("s/rg_kvtable/0") is True
    assert store.create_table("s/rg_kvtable/0") is False
    v = store.table_update("s/rg_kvtable/0", [(b"k1", st.KEY_NOT_EXISTS, b"v1"), (b"k1", st.KEY_NOT_EXISTS, b"v1b")])
    assert v[1] > v[0]
    assert store.table_read("s/rg_kvtable/0", [b"k1", b"zz"]) == [(b"k1", v[1], b"v1b"), (b"zz", -1, b"")]
    with pytest.raises(st.TableKeyBadVersion):
        store.table_update("s/rg_kvtable/0", [(b"k1", v[0], b"x")])
    with pytest.raises(st.TableKeyMissing):
        store.table_update("s/rg_kvtable/0", [(b"k2", 7, b"x")])
    v2 = store.table_update("s/rg_kvtable/0", [(b"k1", v[1], b"v1c"), (b"k2", st.KEY_NO_VERSION, b"v2")])
    entries, pos = store.table_delta("s/rg_kvtable/0", 0, 10)
    assert entries == [(b"k1", v2[0], b"v1c"), (b"k2", v2[1], b"v2")] and pos == v2[1] + 1
    assert store.table_delta("s/rg_kvtable/0", pos, 10)[0] == []
    store.table_remove("s/rg_kvtable/0", [(b"k2", st.KEY_NO_VERSION)])
    store2 = reopen(store)
    try:
        assert store2.table_read("s/rg_kvtable/0", [b"k1", b"k2"]) == [(b"k1", v2[0], b"v1c"), (b"k2", -1, b"")]
    finally:
        store2.close()


def test_checkpoint_rolls_journal_and_recovers(tmp_path):
    s = SegmentStorage(tmp_path / "ss", checkpoint_bytes=4096)
    s.open()
    s.create_segment("s/cp/0")
    s.create_segment("s/cp/1")
    for i in range(1, 301):
        append_sync(s, f"s/cp/{i % 2}", W1, i, b"%05d" % i)
    s.merge_segment("s/cp/1", "s/cp/0")
    for i in range(301, 401):
        append_sync(s, "s/cp/0", W1, i, b"%05d" % i)
    if s._checkpointer is not None:
        s._checkpointer.join()
    assert (s.root / "checkpoint.json").exists()
    assert len(list((s.root / "journal").glob("*.log"))) <= 2
    expected = s.read("s/cp/0", 0, 10**6).data
    assert len(expected) == 400 * 5
    s2 = SegmentStorage(s.root)  # crash: no close
    s2.open()
    try:
        assert s2.read("s/cp/0", 0, 10**6).data == expected
        assert setup_sync(s2, "s/cp/0", W1) == 400
        assert not os.path.exists(s.root / "data" / "2.seg") or s2.exists("s/cp/1") is False
    finally:
        s2.close()


def test_large_appends_are_written_once_and_survive_a_crash(tmp_path):
    s = SegmentStorage(tmp_path / "ss", checkpoint_bytes=10**12)
    s.open()
    s.create_segment("s/big/0")
    blocks = [os.urandom(300 * 1024) for _ in range(3)]
    for i, b in enumerate(blocks, start=1):
        assert append_sync(s, "s/big/0", W1, i, b).error is None
    append_sync(s, "s/big/0", W1, 4, b"small")
    journal_bytes = sum(p.stat().st_size for p in (s.root / "journal").glob("*.log"))
    assert journal_bytes < 100 * 1024  # the large blocks live only in the segment file
    s2 = SegmentStorage(s.root)  # crash: no close
    s2.open()
    try:
        assert s2.read("s/big/0", 0, 2 * 1024 * 1024).data == b"".join(blocks) + b"small"
        assert setup_sync(s2, "s/big/0", W1) == 4
    finally:
        s2.close()
