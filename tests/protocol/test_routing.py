"""Routing-key hash: vectors from the protocol notes, Guava, Java HashHelper and the Rust quirk."""

from __future__ import annotations

import struct

import pytest

from airflow_provider_pravega.protocol import routing as r

# Guava Hashing.murmur3_128(seed).hashBytes(data).toString() (h1 then h2, little-endian), recorded
# with a throwaway jshell script for data[i] = (i * 37 + 11) & 0xff: every tail length 0..15, one
# and two whole blocks, with seed 0 and with the routing seed.
GUAVA_VECTORS = [
    (0, "00000000000000000000000000000000", "cff7a26694debd3dd388886d386735b2"),
    (1, "e7f117e6ccc72f93dc08456c814b437a", "7ed9b68116c379a582a05864e01e3b0a"),
    (2, "9db37154aee5f7cf3675c477b2c34985", "ec429e341e7485f1e1b7a6402f2b41f2"),
    (3, "b1a481deb8c0fa6a43b26a81fbf4dc0c", "1777fb27ee1cd3761fe441443c1bb8c3"),
    (4, "729f1fb8d1eea4d3cd20a4d92af24c8f", "8f52ebce339bfa83faafd052aa415586"),
    (5, "0b997f08400f33b00bf5639975f993ad", "eca429c6f1b8c757d4ef3c546bc60c83"),
    (6, "127a07040bf1d1327e932938ad91574b", "df73c2ae04969df0fc0cd59616a12af2"),
    (7, "3b98626668cc4083f9f67faadf388fa0", "5a0f19b3c8e8e434a6d28b300c828605"),
    (8, "d7ce897f0044b1f0a1f97a2d832122d0", "ad9dce24f8422c688c00404864b51bbd"),
    (9, "b1a0c8ae8e08b3dba909fe2e1824decb", "fe7e99d6c1784a22376a16ebf9f34b28"),
    (10, "1e374ffdf82ec87fb098625916c71a7a", "a492d1da7729850fd630b962b0f64f4f"),
    (11, "64d520094d5a10ced6c17f729b12c7c5", "563b5b45aa2fb44f4bd39525f1a3af80"),
    (12, "b8bbc3af9fa5ee11f8db0d9b584d30de", "933ef9eff5bad626d76053c72aa61e43"),
    (13, "e7c40c79c7c00b3c7eb2f9120da44bf3", "82266710edc78eca7583ecd034df9901"),
    (14, "71a1eebe7852f04a09fb75ea3c2e3027", "0664835f199aac0d901962a39b70f44f"),
    (15, "ff837fb647f00629ac1f70e78f33ca49", "d1a0e5c29cf90db5ff6085180694abdb"),
    (16, "fbf05e0c58669cdaf75f6cbb87ae5a88", "41eea61836b559a057354c07d465857d"),
    (17, "d1075e779aeeb878e0fc9816309067e3", "873dbd5d1c8f970b3c27ea58d6a705da"),
    (31, "2f53c5d41e06cab163377b9e482669cb", "530f6f514cba337d60e403ce2483d535"),
    (32, "9b79fe8eeb7473afffd6cd4d9200523a", "6e31f1c20676c41f9e80b43fd4b22f4f"),
    (33, "a99b09c3888ab808f98adfb5bd6fc015", "f234e889afc5ddd20736d5ae5c25b985"),
    (40, "fc7c5ee622aa77bf8b74054c1b95f215", "aa6785ac8e777c62186fa81ae936fb1a"),
]


@pytest.mark.parametrize("length,seed0,routing_seed", GUAVA_VECTORS, ids=lambda v: str(v)[:6])
def test_murmur3_matches_guava(length: int, seed0: str, routing_seed: str) -> None:
    data = bytes((i * 37 + 11) & 0xFF for i in range(length))
    for seed, expected in ((0, seed0), (r.ROUTING_SEED, routing_seed)):
        h1, h2 = r.murmur3_x64_128(data, seed)
        assert (h1.to_bytes(8, "little") + h2.to_bytes(8, "little")).hex() == expected


def test_seed_is_java_hashcode_of_event_router() -> None:
    h = 0
    for ch in "EventRouter":
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    assert h == r.ROUTING_SEED == 1741865571


@pytest.mark.parametrize(
    "key,expected",
    [
        ("hello", 0.658716230571337),  # the Rust client's unit test
        ("rk", 0.6279682094230687),
        ("a", 0.9433912753816884),
        ("routing_key", 0.014492564697942356),
    ],
)
def test_ascii_vectors_from_the_notes(key: str, expected: float) -> None:
    assert r.hash_routing_key(key) == expected
    assert r.hash_routing_key_java(key) == expected  # Java HashHelper.hashToRange agrees for ASCII


# Non-ASCII keys. Java values: HashHelper.seededWith("EventRouter").hashToRange(key) from the
# pravega-common 0.13 jar. Rust values, by reasoning from shared/src/lib.rs: the client allocates
# `vec![0u16; key.len()]` (UTF-8 byte length), fills it with the UTF-16 code units and hashes the
# whole buffer, so "é" (2 UTF-8 bytes, 1 unit) hashes the units [0x00e9, 0x0000]. That is exactly
# what Java hashes for the string "é\u0000", so each Rust value below was computed with the same
# jar as hashToRange(key + "\u0000" * (utf8_len - utf16_units)).
NON_ASCII = [
    ("é", 0.20425248406362173, 0.6688272069632242),
    ("日本", 0.994633361150917, 0.34924442974855974),
    ("\U0001F600", 0.04908282262196351, struct.unpack(">d", bytes.fromhex("3fe8cd0277fae608"))[0]),
]


@pytest.mark.parametrize("key,rust,java", NON_ASCII, ids=["e-acute", "nihon", "emoji"])
def test_non_ascii_keys_follow_the_rust_quirk(key: str, rust: float, java: float) -> None:
    assert r.hash_routing_key(key) == rust
    assert r.hash_routing_key_java(key) == java
    padded = key + "\x00" * (len(key.encode("utf-8")) - len(key.encode("utf-16-le")) // 2)
    assert r.hash_routing_key_java(padded) == rust


def test_key_bytes() -> None:
    assert r.rust_routing_key_bytes("ab") == b"a\x00b\x00"
    assert r.rust_routing_key_bytes("é") == b"\xe9\x00\x00\x00"
    assert r.rust_routing_key_bytes("\U0001F600") == "\U0001F600".encode("utf-16-le") + bytes(4)
    assert r.java_routing_key_bytes("é") == b"\xe9\x00"
    assert r.rust_routing_key_bytes("") == b"" and r.hash_routing_key("") == r.hash_routing_key_java("")
    with pytest.raises(ValueError, match="not valid Unicode"):
        r.hash_routing_key("\ud800")
    with pytest.raises(ValueError, match="must be a str"):
        r.hash_routing_key(b"abc")  # type: ignore[arg-type]


def test_unit_interval_edges() -> None:
    assert r.unit_interval_from_hash(0) == 0.0
    top = r.unit_interval_from_hash(2**64 - 1)
    assert 0.99999 < top < 1.0


def test_distribution_is_roughly_uniform() -> None:
    buckets = [0] * 10
    n = 20000
    for i in range(n):
        k = r.hash_routing_key(f"key-{i}")
        assert 0.0 <= k < 1.0
        buckets[int(k * 10)] += 1
    expected = n / 10
    assert all(abs(c - expected) < 0.1 * expected for c in buckets), buckets
    chi2 = sum((c - expected) ** 2 / expected for c in buckets)
    assert chi2 < 30  # 9 degrees of freedom; p < 0.001 beyond ~27.9


def test_segment_for_key_picks_smallest_max_key_at_or_above() -> None:
    ranges = [(0.25, "s0"), (0.5, "s1"), (0.75, "s2"), (1.0, "s3")]
    assert r.segment_for_key(0.0, ranges) == "s0"
    assert r.segment_for_key(0.25, ranges) == "s0"  # inclusive, like im-rs get_next
    assert r.segment_for_key(0.2500001, ranges) == "s1"
    assert r.segment_for_key(0.99, ranges) == "s3"
    assert r.segment_for_key(1.0, ranges) == "s3"
    assert r.segment_for_key(r.hash_routing_key("hello"), ranges) == "s2"
    with pytest.raises(ValueError, match="no segment covers"):
        r.segment_for_key(0.9, [(0.5, "x")])
    with pytest.raises(ValueError, match="within"):
        r.segment_for_key(1.5, ranges)
    with pytest.raises(ValueError, match="no segment covers"):
        r.segment_for_key(0.1, [])


def test_check_key_ranges() -> None:
    r.check_key_ranges([])
    r.check_key_ranges([0.5, 1.0])
    r.check_key_ranges([1.00005])
    with pytest.raises(ValueError, match="> 0.0"):
        r.check_key_ranges([0.0, 1.0])
    with pytest.raises(ValueError, match=">= 1.0"):
        r.check_key_ranges([0.5, 0.9])
    with pytest.raises(ValueError, match="< 1.0001"):
        r.check_key_ranges([0.5, 1.5])
