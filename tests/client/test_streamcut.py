"""StreamCut: Java text form (bytes built here from the format's definition), JSON/pickle round
trips, errors, and head/tail/reader-group cuts of live streams on the embedded server."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import pickle
import struct
import time
import zlib

import pytest
from pravega_clients import require_official_client, stream_writer

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.errors import InvalidStreamCutError
from airflow_provider_pravega.client.streamcut import (
    HEAD,
    TAIL,
    StreamCut,
    StreamCutMismatchError,
)
from airflow_provider_pravega.protocol import naming

# Produced by JDK 17 (GZIPOutputStream + Base64) from the plain texts (pravega-protocol-notes §7.2).
JDK_VECTORS = [
    ("0:s/st:0,1:0,0:0,0", StreamCut("s", "st", {0: 0, 1: 0}),
     "H4sIAAAAAAAA/zOwKtYvLrEy0DEEYgMQBgAStuuqEgAAAA=="),
    ("0:s/st:0:0:42", StreamCut("s", "st", {0: 42}), "H4sIAAAAAAAA/zOwKtYvLrEyAEITIwAbHmOHDQAAAA=="),
    ("0:scope1/stream1:0,1:0,2:100,4294967296",
     StreamCut("scope1", "stream1", {0: 100, (2 << 32) | 1: 4294967296}),
     "H4sIAAAAAAAA/zOwKk7OL0g11C8uKUpNzDW0MtABYSMrQwMDHRMjSxNLM3MjSzMAs8dpyScAAAA="),
]


def java_text_by_definition(plain: str) -> str:
    """The asText() bytes, assembled from the format's definition: a gzip member with the JDK's
    10-byte header (no flags, no mtime, XFL 0, OS 0xff), a raw deflate stream (level 6, 32 KiB
    window, memLevel 8), CRC32 and ISIZE little-endian; then standard base64 with padding."""
    data = plain.encode("utf-8")
    header = bytes([0x1F, 0x8B, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xFF])
    deflater = zlib.compressobj(6, zlib.DEFLATED, -15, 8)
    body = deflater.compress(data) + deflater.flush()
    trailer = struct.pack("<I", zlib.crc32(data) & 0xFFFFFFFF) + struct.pack("<I", len(data) & 0xFFFFFFFF)
    return base64.b64encode(header + body + trailer).decode("ascii")


# ------------------------------------------------------------------------------ text form


@pytest.mark.parametrize("plain,cut,jdk_text", JDK_VECTORS)
def test_text_matches_jdk_vectors_and_the_format_definition(plain: str, cut: StreamCut, jdk_text: str) -> None:
    assert java_text_by_definition(plain) == jdk_text
    # The vectors list segments by id; Java's HashMap order may differ for several segments.
    assert cut.to_text(order="sorted") == jdk_text
    assert StreamCut.from_text(jdk_text) == cut
    assert StreamCut.from_text(cut.to_text()) == cut
    if len(cut.positions) == 1:
        assert cut.to_text() == str(cut) == jdk_text


def test_hand_built_cuts_have_the_bytes_of_the_definition() -> None:
    # One segment: the entry order cannot matter.
    cut = StreamCut("my-scope", "orders", {(7 << 32) | 12: 123456789})
    expected = java_text_by_definition("0:my-scope/orders:12:7:123456789")
    assert cut.to_text() == expected
    raw = base64.b64decode(cut.to_text())
    assert raw[:10] == b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    plain = gzip.decompress(raw)
    assert plain == b"0:my-scope/orders:12:7:123456789"
    assert struct.unpack("<II", raw[-8:]) == (zlib.crc32(plain), len(plain))

    # Several segments listed by id (order="sorted"), epochs and numbers split from the ids.
    cut = StreamCut("sc", "st", {0: 5, 1: 0, (1 << 32) | 2: 99, (3 << 32) | 7: 1 << 40})
    assert cut.to_text(order="sorted") == java_text_by_definition("0:sc/st:0,1,2,7:0,0,1,3:5,0,99,1099511627776")
    # Java's own order is a permutation of the same entries, and parses back to the same cut.
    java = cut.to_text()
    assert StreamCut.from_text(java) == cut
    plain = gzip.decompress(base64.b64decode(java)).decode()
    version, scoped, numbers, epochs, offsets = plain.split(":")
    assert (version, scoped) == ("0", "sc/st")
    triples = sorted(zip(map(int, numbers.split(",")), map(int, epochs.split(",")), map(int, offsets.split(","))))
    assert triples == [(0, 0, 5), (1, 0, 0), (2, 1, 99), (7, 3, 1 << 40)]


def test_round_trips_json_pickle_and_value_semantics() -> None:
    cut = StreamCut("sc", "st", {(1 << 32) | 3: 17, 0: 4})
    assert StreamCut.from_text(cut.to_text()) == cut
    as_json = cut.to_json()
    assert as_json == {
        "scope": "sc",
        "stream": "st",
        "positions": {"0": 4, str((1 << 32) | 3): 17},
        "text": cut.to_text(),
    }
    assert json.loads(json.dumps(as_json)) == as_json
    assert StreamCut.from_json(as_json) == cut
    assert StreamCut.from_json(json.dumps(as_json)) == cut
    assert StreamCut.from_json({"scope": "sc", "stream": "st", "text": cut.to_text()}) == cut
    assert StreamCut.from_json({"scope": "sc", "stream": "st", "positions": {"0": 4, str((1 << 32) | 3): 17}}) == cut
    assert pickle.loads(pickle.dumps(cut)) == cut
    assert hash(StreamCut("sc", "st", {0: 4, (1 << 32) | 3: 17})) == hash(cut)
    assert {cut: 1}[StreamCut("sc", "st", [(0, 4), ((1 << 32) | 3, 17)])] == 1
    assert cut != StreamCut("sc", "st", {0: 4, (1 << 32) | 3: 18})
    assert cut.positions == {0: 4, (1 << 32) | 3: 17}
    assert cut.segment_ids == (0, (1 << 32) | 3)
    with pytest.raises(TypeError):
        cut.positions[0] = 5  # type: ignore[index]
    with pytest.raises(AttributeError):
        cut.scope = "other"  # type: ignore[misc]

    head = StreamCut.symbolic("sc", "st", HEAD)
    assert head.is_symbolic and head.bound == "head" and not head.positions
    assert StreamCut.from_json(head.to_json()) == head
    assert pickle.loads(pickle.dumps(head)) == head
    assert head != StreamCut.symbolic("sc", "st", TAIL)
    assert str(head) == "head:sc/st"


def test_invalid_texts_and_cuts_raise_invalid_stream_cut_error() -> None:
    good = StreamCut("sc", "st", {0: 1}).to_text()
    bad_texts = {
        "not base64 at all!": "base64",
        base64.b64encode(b"plain, not gzip").decode(): "gzip",
        java_text_by_definition("0:sc/st:0:0"): "5",
        java_text_by_definition("1:sc/st:0:0:1"): "version",
        java_text_by_definition("0:sc/st:0,1:0:1,2"): "length",
        java_text_by_definition("0:sc/st:x:0:1"): "non-numeric",
        java_text_by_definition("0:sc:0:0:1"): "scope/stream",
        good[:-8]: "gzip",
        "": "empty",
    }
    for text, words in bad_texts.items():
        with pytest.raises(InvalidStreamCutError, match=words):
            StreamCut.from_text(text)
    with pytest.raises(InvalidStreamCutError, match="at least one segment"):
        StreamCut("sc", "st", {})
    with pytest.raises(InvalidStreamCutError, match=">= 0"):
        StreamCut("sc", "st", {0: -1})
    with pytest.raises(InvalidStreamCutError, match="integers"):
        StreamCut("sc", "st", {0: True})
    with pytest.raises(InvalidStreamCutError, match="invalid stream"):
        StreamCut("sc", "no/slash", {0: 1})
    with pytest.raises(InvalidStreamCutError, match="no text form"):
        StreamCut.symbolic("sc", "st", HEAD).to_text()
    with pytest.raises(InvalidStreamCutError, match="UNBOUNDED"):
        StreamCut.from_text("UNBOUNDED")
    assert StreamCut.from_text("UNBOUNDED", scope="sc", stream="st", unbounded="tail") == StreamCut.symbolic(
        "sc", "st", TAIL
    )
    with pytest.raises(InvalidStreamCutError, match="inconsistent"):
        StreamCut.from_json({"scope": "sc", "stream": "st", "positions": {"0": 2}, "text": good})


def test_a_cut_of_another_stream_names_both_streams() -> None:
    text = StreamCut("sc", "orders", {0: 10}).to_text()
    with pytest.raises(StreamCutMismatchError, match="sc/orders.*sc/payments"):
        StreamCut.from_text(text, scope="sc", stream="payments")
    with pytest.raises(StreamCutMismatchError, match="sc/orders.*other/orders"):
        StreamCut.coerce(text, "other", "orders")
    with pytest.raises(StreamCutMismatchError) as info:
        StreamCut("sc", "orders", {0: 1}).check_stream("sc", "payments", "start cut")
    assert isinstance(info.value, InvalidStreamCutError)
    assert info.value.expected == "sc/payments" and info.value.actual == "sc/orders"
    assert "start cut" in str(info.value)


def test_coerce_accepts_what_a_dag_author_writes() -> None:
    cut = StreamCut("sc", "st", {0: 3})
    assert StreamCut.coerce(cut, "sc", "st") is cut
    assert StreamCut.coerce(cut.to_text(), "sc", "st") == cut
    assert StreamCut.coerce(cut.to_json(), "sc", "st") == cut
    assert StreamCut.coerce(json.dumps(cut.to_json()), "sc", "st") == cut
    assert StreamCut.coerce("HEAD", "sc", "st") == StreamCut.symbolic("sc", "st", HEAD)
    assert StreamCut.coerce("tail", "sc", "st") == StreamCut.symbolic("sc", "st", TAIL)
    assert StreamCut.coerce("UNBOUNDED", "sc", "st", unbounded="head") == StreamCut.symbolic("sc", "st", HEAD)
    with pytest.raises(InvalidStreamCutError, match="cannot use int"):
        StreamCut.coerce(5, "sc", "st")


# ------------------------------------------------------------------------------ live cuts


def _write(uri: str, scope: str, stream: str, events: list[tuple[str, bytes]]) -> None:
    writer = stream_writer(uri, scope, stream)
    for key, payload in events:
        writer.write_event_bytes(payload, routing_key=key)
    writer.flush()


@pytest.fixture
def client(pravega_controller_uri: str):
    with PravegaClient(pravega_controller_uri) as c:
        yield c


def test_head_tail_and_truncation_on_a_live_stream(client: PravegaClient, pravega_controller_uri: str, unique_name) -> None:
    scope, stream = unique_name("cuts"), "three"
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 3)
    assert StreamCut.head(client, scope, stream) == StreamCut(scope, stream, {0: 0, 1: 0, 2: 0})
    assert StreamCut.tail(client, scope, stream) == StreamCut(scope, stream, {0: 0, 1: 0, 2: 0})

    events = [(f"key-{i % 13}", f"event-{i:04d}".encode()) for i in range(600)]
    _write(pravega_controller_uri, scope, stream, events)
    tail = StreamCut.tail(client, scope, stream)
    assert set(tail.positions) == {0, 1, 2}
    assert sum(tail.positions.values()) == sum(8 + len(p) for _, p in events)
    for segment_id, offset in tail.positions.items():
        info = client.segments.get_segment_info(naming.qualified_segment_name(scope, stream, segment_id))
        assert info.length == offset
    # Symbolic cuts resolve against the stream when used; the controller client alone gives the head.
    assert StreamCut.symbolic(scope, stream, TAIL).resolve(client) == tail
    assert StreamCut.head(client.controller, scope, stream) == StreamCut(scope, stream, {0: 0, 1: 0, 2: 0})
    assert StreamCut.from_text(tail.to_text(), scope=scope, stream=stream) == tail

    client.admin.truncate_stream(scope, stream, tail.positions)
    assert StreamCut.head(client, scope, stream) == tail
    assert StreamCut.symbolic(scope, stream, HEAD).resolve(client) == tail


def test_reader_group_cuts(client: PravegaClient, pravega_controller_uri: str, unique_name) -> None:
    scope, stream = unique_name("rgcut"), "three"
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 3)
    events = [(f"key-{i % 11}", f"e{i:05d}".encode()) for i in range(300)]
    _write(pravega_controller_uri, scope, stream, events)

    pravega_client = require_official_client()  # the cut of an official reader group
    manager = pravega_client.StreamManager(pravega_controller_uri)
    group = manager.create_reader_group(unique_name("rg"), scope, stream)
    fresh = StreamCut.from_reader_group(group.get_streamcut(), scope, stream)
    assert fresh == StreamCut.head(client, scope, stream)
    assert StreamCut.from_reader_group(group, scope, stream) == fresh  # the group itself works too

    reader = group.create_reader("r0")

    async def consume(n: int) -> list[tuple[bytes, int]]:
        got: list[tuple[bytes, int]] = []
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            sl = await asyncio.wait_for(reader.get_segment_slice_async(), 10)
            for event in sl:
                got.append((event.data(), event.offset()))
                if len(got) >= n:
                    break
            reader.release_segment(sl)
        return got

    consumed = asyncio.run(consume(40))
    reader.reader_offline()
    cut = StreamCut.from_reader_group(group.get_streamcut(), scope, stream)
    tail = StreamCut.tail(client, scope, stream)
    assert set(cut.positions) == {0, 1, 2}
    assert all(0 <= cut.positions[s] <= tail.positions[s] for s in cut.positions)
    # The group's position is just past the last event it consumed, in the bytes it read.
    read_bytes = sum(8 + len(data) for data, _ in consumed)
    assert sum(cut.positions.values()) == read_bytes
    assert max(8 + len(data) + offset for data, offset in consumed) in cut.positions.values()
    assert StreamCut.from_text(cut.to_text()) == cut
