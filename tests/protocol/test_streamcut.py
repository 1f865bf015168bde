"""Stream-cut text form: the notes' vectors, texts written by Java's StreamCutImpl, errors."""

from __future__ import annotations

import base64
import gzip
import struct
import zlib

import pytest

from airflow_provider_pravega.protocol import streamcut as sc
from airflow_provider_pravega.protocol.streamcut import (
    InvalidStreamCutText,
    streamcut_from_text,
    streamcut_plain_text,
    streamcut_to_text,
)

ID_2_1 = (2 << 32) | 1  # segment 1 created in epoch 2

# The three vectors of the protocol notes (§7.2): plain text -> JDK 17 GZIPOutputStream + Base64.
NOTES_VECTORS = [
    ("s", "st", {0: 0, 1: 0}, "0:s/st:0,1:0,0:0,0", "H4sIAAAAAAAA/zOwKtYvLrEy0DEEYgMQBgAStuuqEgAAAA=="),
    ("s", "st", {0: 42}, "0:s/st:0:0:42", "H4sIAAAAAAAA/zOwKtYvLrEyAEITIwAbHmOHDQAAAA=="),
    (
        "scope1", "stream1", {0: 100, ID_2_1: 4294967296},
        "0:scope1/stream1:0,1:0,2:100,4294967296",
        "H4sIAAAAAAAA/zOwKk7OL0g11C8uKUpNzDW0MtABYSMrQwMDHRMjSxNLM3MjSzMAs8dpyScAAAA=",
    ),
]


@pytest.mark.parametrize("scope,stream,positions,plain,text", NOTES_VECTORS, ids=["two", "one", "epochs"])
def test_notes_vectors_byte_for_byte(scope, stream, positions, plain, text) -> None:
    # The notes' vectors list segments by id, so they are reproduced with order="sorted".
    assert streamcut_plain_text(scope, stream, positions, order="sorted") == plain
    assert streamcut_to_text(scope, stream, positions, order="sorted") == text
    assert streamcut_from_text(text) == (scope, stream, positions)


# Texts printed by Java itself: new StreamCutImpl(Stream.of(scope, stream), hashMap).asText() with
# pravega-client 0.13.0 on JDK 17 (throwaway program; the HashMap filled in ascending id order).
# Java also returned the same text from StreamCut.from(text).asText() for each.
JAVA_TEXTS = [
    ("s", "st", {0: 0, 1: 0}, "H4sIAAAAAAAA/zOwKtYvLrEy0DEEYgMQBgAStuuqEgAAAA=="),
    (   # differs from the notes' third vector only in entry order: HashMap<Segment, Long> order
        "scope1", "stream1", {0: 100, ID_2_1: 4294967296},
        "H4sIAAAAAAAA/zOwKk7OL0g11C8uKUpNzDW0MtQxsDICYhMjSxNLM3MjSzMdQwMDAOOfhjcnAAAA",
    ),
    (
        "myScope", "events", {0: 10, 1: 20, (1 << 32) | 2: 30, (1 << 32) | 3: 40, (2 << 32) | 4: 50},
        "H4sIAAAAAAAA/zOwyq0MTs4vSNVPLUvNKym2MtEx1jHSMdAxtDLSMQRCAx0DK1MDHRMDHWOgoIGOkQEAfNICaTMAAAA=",
    ),
    (   # 13 entries: the map has grown past its initial 16 buckets
        "s", "st", {i: 100 * i for i in range(13)},
        "H4sIAAAAAAAA/3WL2wnAMBDDFhLUl3eyVro/9Q1QjPxhZJ373PdEEIXJYhOi0ugMRFCO+IlvslJc0yyzc5Crmma6GUo9XasfMdlZeHIAAAA=",
    ),
    ("s", "st", {}, "H4sIAAAAAAAA/zOwKtYvLrGysgIAxSw5ZwkAAAA="),  # Java writes "0:s/st:::"
]


@pytest.mark.parametrize("scope,stream,positions,text", JAVA_TEXTS, ids=["two", "epochs", "five", "thirteen", "empty"])
def test_java_order_matches_java_output(scope, stream, positions, text) -> None:
    assert streamcut_to_text(scope, stream, positions) == text
    assert streamcut_from_text(text) == (scope, stream, positions)


def test_java_plain_text_order() -> None:
    assert streamcut_plain_text("scope1", "stream1", {0: 100, ID_2_1: 4294967296}) == \
        "0:scope1/stream1:1,0:2,0:4294967296,100"
    assert streamcut_plain_text("myScope", "events", dict(JAVA_TEXTS[2][2])) == \
        "0:myScope/events:4,3,2,0,1:2,1,1,0,0:50,40,30,10,20"
    # java order does not depend on how the caller's mapping is ordered
    positions = {i: i for i in range(40)}
    assert streamcut_to_text("s", "st", positions) == streamcut_to_text("s", "st", dict(reversed(positions.items())))


def test_java_hashes() -> None:
    assert sc.java_string_hash("") == 0
    assert sc.java_string_hash("st") == 3681
    assert sc.java_string_hash("EventRouter") == 1741865571
    assert sc.java_string_hash("polygenelubricants") == -2147483648  # a well-known Integer.MIN_VALUE hash
    assert sc.java_segment_hash("s", "st", 0) == 0xC8E59
    assert sc.java_segment_hash("scope1", "stream1", ID_2_1) == 0x6ABCC7A6
    assert sc.java_hashmap_order("scope1", "stream1", [0, ID_2_1]) == [ID_2_1, 0]


def test_given_and_sorted_orders() -> None:
    positions = {5: 1, 2: 2, 9: 3}
    assert streamcut_plain_text("s", "st", positions, order="given") == "0:s/st:5,2,9:0,0,0:1,2,3"
    assert streamcut_plain_text("s", "st", positions, order="sorted") == "0:s/st:2,5,9:0,0,0:2,1,3"
    with pytest.raises(ValueError, match="order must be"):
        streamcut_plain_text("s", "st", positions, order="random")  # type: ignore[arg-type]


def test_gzip_is_java_not_python_default() -> None:
    data = b"0:s/st:0:0:42"
    ours = sc.java_gzip(data)
    assert ours[:10] == bytes.fromhex("1f8b08000000000000ff")
    assert ours[-8:] == struct.pack("<II", zlib.crc32(data), len(data))
    assert gzip.decompress(ours) == data
    assert gzip.compress(data, mtime=0) != ours  # level 9, XFL and OS differ


def test_round_trips() -> None:
    cases = [
        ("s", "st", {0: 0}),
        ("_system", "_RGgroup", {(7 << 32) | 3: 2**62, 3: 0}),
        ("a-b.c", "x.y", {i | ((i % 5) << 32): i * 1000 for i in range(300)}),
        ("s", "st", {0: -1}),  # Java parses negative longs too
    ]
    for scope, stream, positions in cases:
        for order in ("java", "sorted", "given"):
            text = streamcut_to_text(scope, stream, positions, order=order)
            parsed = streamcut_from_text(text)
            assert parsed == (scope, stream, positions)
            assert parsed.positions == positions


def test_unbounded() -> None:
    assert streamcut_from_text("UNBOUNDED") is None
    assert streamcut_from_text("  UNBOUNDED\n") is None


def test_accepts_any_valid_gzip() -> None:
    plain = b"0:s/st:0,1:0,0:5,6"
    for raw in (
        gzip.compress(plain),  # Python's header (mtime, XFL, OS)
        gzip.compress(plain, compresslevel=1, mtime=123456),
        gzip.compress(plain[:7]) + gzip.compress(plain[7:]),  # two members, as Java's reader allows
    ):
        assert streamcut_from_text(base64.b64encode(raw).decode()) == ("s", "st", {0: 5, 1: 6})
    # a header with FNAME and a comment
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    body = c.compress(plain) + c.flush()
    named = b"\x1f\x8b\x08\x18\x00\x00\x00\x00\x02\x03name\x00comment\x00" + body + struct.pack(
        "<II", zlib.crc32(plain), len(plain))
    assert streamcut_from_text(base64.b64encode(named).decode()).positions == {0: 5, 1: 6}
    # whitespace inside lists is trimmed, as Guava's Splitter.trimResults does
    spaced = base64.b64encode(gzip.compress(b"0:s/st: 0 , 1 :0,0: 5,6 ")).decode()
    assert streamcut_from_text(spaced).positions == {0: 5, 1: 6}
    # missing base64 padding is accepted (Java's decoder does not require it)
    text = NOTES_VECTORS[0][4].rstrip("=")
    assert streamcut_from_text(text).positions == {0: 0, 1: 0}


def _text(plain: str) -> str:
    return base64.b64encode(gzip.compress(plain.encode())).decode()


@pytest.mark.parametrize(
    "text,message",
    [
        ("", "empty"),
        ("not base64!", "not valid base64"),
        ("H4sI$AAA", "not valid base64"),
        (base64.b64encode(b"plain text, no gzip").decode(), "no gzip magic"),
        (NOTES_VECTORS[0][4][:20], "invalid or truncated gzip"),  # truncated member
        (   # wrong CRC32
            base64.b64encode(sc.java_gzip(b"0:s/st:0:0:1")[:-8] + b"\x00" * 4 + struct.pack("<I", 12)).decode(),
            "invalid or truncated gzip",
        ),
        (base64.b64encode(sc.java_gzip(b"\xff\xfe")).decode(), "UTF-8"),
        (_text("0:s/st:0:0"), "5 ':'-separated parts"),
        (_text("0:s/st"), "5 ':'-separated parts"),
        (_text("1:s/st:0:0:0"), "unsupported stream cut text version"),
        (_text("0:sst:0:0:0"), "not a scoped stream"),
        (_text("0:s/s t:0:0:0"), "invalid stream"),
        (_text("0:s/st/x:0:0:0"), "invalid stream"),
        (_text("0:s/st:a:0:0"), "non-numeric entry 'a'"),
        (_text("0:s/st:0:0:1.5"), "non-numeric entry '1.5'"),
        (_text("0:s/st:0:0:1_000"), "non-numeric"),
        (_text("0:s/st:0,:0,0:1,2"), "non-numeric entry ''"),
        (_text("0:s/st:-1:0:0"), "segment number -1 is outside"),
        (_text("0:s/st:0:2147483648:0"), "epoch 2147483648 is outside"),
        (_text("0:s/st:0:0:9223372036854775808"), "offset 9223372036854775808 is outside"),
        (_text("0:s/st:0,1:0:0,0"), "differ in length: 2 segment numbers, 1 epochs, 2 offsets"),
        (_text("0:s/st:0,1:0,0:7"), "differ in length"),
        (_text("0:s/st:1,1:0,0:7,8"), "segment 1.#epoch.0 twice"),
        (_text("0:s/st:0:0:1:2"), "non-numeric entry '1:2'"),
    ],
)
def test_errors(text: str, message: str) -> None:
    with pytest.raises(InvalidStreamCutText, match=message):
        streamcut_from_text(text)


def test_error_type_is_value_error() -> None:
    assert issubclass(InvalidStreamCutText, ValueError)
    with pytest.raises(InvalidStreamCutText, match="must be a str"):
        streamcut_from_text(None)  # type: ignore[arg-type]


def test_inflation_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sc, "MAX_PLAIN_TEXT", 100)
    big = _text("0:s/st:" + ",".join(["0"] * 100) + ":0:0")
    with pytest.raises(InvalidStreamCutText, match="more than 100 bytes"):
        streamcut_from_text(big)


def test_to_text_rejects_what_java_could_not_read() -> None:
    with pytest.raises(ValueError, match="invalid stream name"):
        streamcut_to_text("s", "bad:name", {0: 0})
    with pytest.raises(ValueError, match="invalid scope name"):
        streamcut_to_text("a/b", "st", {0: 0})
    with pytest.raises(ValueError, match="segment id -1"):
        streamcut_to_text("s", "st", {-1: 0})
    with pytest.raises(ValueError, match="segment id"):
        streamcut_to_text("s", "st", {0x8000_0000: 0})  # number part over 2**31-1
    with pytest.raises(ValueError, match="offset"):
        streamcut_to_text("s", "st", {0: 2**63})
