"""Names and ids, with the examples of the protocol notes and cases checked against Java NameUtils."""

from __future__ import annotations

import pytest

from airflow_provider_pravega.protocol import naming as n


def test_segment_id_layout() -> None:
    assert n.segment_id(0, 0) == 0
    assert n.segment_id(1, 1) == 0x0000_0001_0000_0001
    assert n.segment_id(2, 1) == 8589934593
    sid = n.segment_id(7, 12345)
    assert (n.segment_epoch(sid), n.segment_number(sid)) == (7, 12345)
    assert n.segment_number(0x0000_0001_7FFF_FFFF) == 2**31 - 1


def test_segment_number_and_epoch_are_signed_i32_like_the_clients() -> None:
    # Java/Rust `(int) id` and `(int) (id >> 32)`: Java prints id 0x1FFFFFFFF as "-1.#epoch.1"
    assert n.segment_number(0x0000_0001_FFFF_FFFF) == -1
    assert n.qualified_segment_name("s", "st", 0x0000_0001_FFFF_FFFF) == "s/st/-1.#epoch.1"
    assert n.segment_epoch(-1) == -1


@pytest.mark.parametrize("bad", [(-1, 0), (0, -1), (2**31, 0), (0, 2**31)])
def test_segment_id_rejects_out_of_range_parts(bad: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="segment"):
        n.segment_id(*bad)


def test_segment_id_functions_reject_non_i64() -> None:
    with pytest.raises(ValueError, match="signed 64-bit"):
        n.segment_number(2**63)
    with pytest.raises(ValueError, match="signed 64-bit"):
        n.qualified_segment_name("s", "st", "0")  # type: ignore[arg-type]


def test_qualified_segment_name_examples_from_the_notes() -> None:
    assert n.qualified_segment_name("s", "st", 0) == "s/st/0.#epoch.0"
    assert n.qualified_segment_name("testScope", "testStream", 0x0000_0001_0000_0001) == \
        "testScope/testStream/1.#epoch.1"


def test_parse_qualified_segment_name() -> None:
    assert n.parse_qualified_segment_name("testScope/testStream/1.#epoch.1") == \
        ("testScope", "testStream", 0x0000_0001_0000_0001)
    assert n.parse_qualified_segment_name("s/st/5") == ("s", "st", 5)  # no epoch part: epoch 0
    parsed = n.parse_qualified_segment_name("s/st/3.#epoch.2")
    assert parsed.segment_id == n.segment_id(2, 3) and parsed.scope == "s" and parsed.stream == "st"
    for sid in (0, 1, n.segment_id(9, 4), n.segment_id(2**31 - 1, 2**31 - 1)):
        assert n.parse_qualified_segment_name(n.qualified_segment_name("a", "b", sid)) == ("a", "b", sid)


def test_parse_transaction_and_transient_names_as_their_parent() -> None:
    txn = n.transaction_segment_name("s/st/1.#epoch.2", 42)
    assert n.parse_qualified_segment_name(txn) == ("s", "st", n.segment_id(2, 1))
    tr = n.transient_segment_name("s/st/0.#epoch.0", 1, 2)
    assert n.parse_qualified_segment_name(tr) == ("s", "st", 0)


@pytest.mark.parametrize(
    "bad",
    ["", "s/st", "s/st/", "/st/0", "s//0", "s/st/0/1", "s/st/x.#epoch.0", "s/st/0.#epoch.y",
     "s/st/0.#epoch.", "s/st/-1", "s/st/4294967296", "s/st/0.#epoch.1.#epoch.2", "s/st/ 1"],
)
def test_parse_qualified_segment_name_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        n.parse_qualified_segment_name(bad)


def test_scoped_stream_name() -> None:
    assert n.scoped_stream_name("s", "st") == "s/st"
    assert n.parse_scoped_stream_name("s/st") == ("s", "st")
    for bad in ("s", "s/", "/st", "a/b/c"):
        with pytest.raises(ValueError, match="scope/stream"):
            n.parse_scoped_stream_name(bad)


def test_transaction_segment_name_examples() -> None:
    assert n.transaction_segment_name("s/tx/0.#epoch.0", 1) == \
        "s/tx/0.#epoch.0#transaction.00000000000000000000000000000001"
    # Both halves as unsigned hex: Java UUID(-1, -9223372036854775807) gives the same text.
    tid = n.bits_to_txn_id(-1, -9223372036854775807)
    assert n.transaction_segment_name("s/st/0.#epoch.0", tid) == \
        "s/st/0.#epoch.0#transaction.ffffffffffffffff8000000000000001"
    with pytest.raises(ValueError, match="128-bit"):
        n.transaction_segment_name("p", -1)
    with pytest.raises(ValueError, match="128-bit"):
        n.transaction_segment_name("p", 2**128)


def test_transaction_recognition_and_parent() -> None:
    name = "s/st/0.#epoch.0#transaction.0000000000000001000000000000002a"
    assert n.is_transaction_segment(name)
    assert n.transaction_parent(name) == "s/st/0.#epoch.0"
    assert n.transaction_id_of(name) == (1 << 64) | 42
    short = "s/st/0.#epoch.0#transaction." + "0" * 31  # needs at least 32 characters
    assert not n.is_transaction_segment(short)
    assert not n.is_transaction_segment("s/st/0.#epoch.0")
    with pytest.raises(ValueError, match="not a transaction segment"):
        n.transaction_parent("s/st/0.#epoch.0")
    with pytest.raises(ValueError, match="not a transaction segment"):
        n.transaction_id_of(short)
    with pytest.raises(ValueError, match="32 hex digits"):
        n.transaction_id_of("p#transaction." + "g" * 32)


def test_transient_names() -> None:
    name = n.transient_segment_name("s/st/0.#epoch.0", 0xABC, 2**128 - 1)
    assert name == "s/st/0.#epoch.0#transient." + "0" * 29 + "abc." + "f" * 32
    assert n.is_transient_segment(name) and not n.is_transaction_segment(name)
    assert n.transient_parent(name) == "s/st/0.#epoch.0"
    with pytest.raises(ValueError):
        n.transient_parent("s/st/0.#epoch.0")


def test_txn_bits_round_trip_without_sign_extension() -> None:
    for tid in (0, 1, (5 << 96) | 7, (1 << 64) | ((1 << 63) + 1), 2**128 - 1, (3 << 96) | (2**63 - 1)):
        hi, lo = n.txn_id_to_bits(tid)
        assert -(2**63) <= hi < 2**63 and -(2**63) <= lo < 2**63
        assert n.bits_to_txn_id(hi, lo) == tid
    # the observed pitfall: lowBits negative must NOT set the 64 high bits
    assert n.bits_to_txn_id(0, -9223372036854775807) == 0x0000000000000000_8000000000000001
    assert n.txn_id_to_bits(0x0000000000000000_8000000000000001) == (0, -9223372036854775807)
    # unsigned halves are accepted too
    assert n.bits_to_txn_id(2**64 - 1, 2**63) == n.bits_to_txn_id(-1, -(2**63))
    with pytest.raises(ValueError, match="low_bits"):
        n.bits_to_txn_id(0, 2**64)


def test_txn_epoch_is_top_32_bits() -> None:
    assert n.txn_epoch((3 << 96) | (1 << 64) | 99) == 3
    hi, lo = n.txn_id_to_bits((3 << 96) | 5)
    assert hi == 3 << 32 and lo == 5  # Java layout: highBits = (epoch << 32) | counter_high32
    assert n.txn_epoch(0) == 0


def test_table_segment_name() -> None:
    assert n.table_segment_name("scope", "rg") == "scope/rg_kvtable/0.#epoch.0"
    assert n.parse_qualified_segment_name(n.table_segment_name("scope", "rg")) == ("scope", "rg_kvtable", 0)


# Each row was checked against Java NameUtils 0.13 (validateUserStreamName / validateStreamName /
# validateUserScopeName) with a throwaway jshell script.
VALIDATION = [
    ("abc", True, True, True),
    ("a.b-c", True, True, True),
    ("A1", True, True, True),
    ("-", True, True, True),
    (".", True, True, True),
    ("_sys", False, True, False),
    ("a_b", False, False, False),
    ("", False, False, False),
    ("ab c", False, False, False),
    ("é", False, False, False),
    ("a/b", False, False, False),
    ("x" * 250, True, True, True),
    ("x" * 251, False, True, True),
    ("x" * 255, False, True, True),
    ("x" * 256, False, False, False),
    ("_" + "x" * 254, False, True, False),
]


@pytest.mark.parametrize("name,user_stream,internal_stream,user_scope", VALIDATION, ids=lambda v: str(v)[:12])
def test_validation_matches_java(name: str, user_stream: bool, internal_stream: bool, user_scope: bool) -> None:
    def ok(fn, **kw) -> bool:
        try:
            assert fn(name, **kw) == name
            return True
        except ValueError:
            return False

    assert ok(n.validate_stream_name) is user_stream
    assert ok(n.validate_stream_name, allow_internal=True) is internal_stream
    assert ok(n.validate_scope_name) is user_scope
    assert ok(n.validate_reader_group_name) is user_stream


def test_validation_messages_name_the_bad_name() -> None:
    with pytest.raises(ValueError, match=r"invalid stream name 'my stream'"):
        n.validate_stream_name("my stream")
    with pytest.raises(ValueError, match=r"invalid scope name '_x'"):
        n.validate_scope_name("_x")
    assert n.validate_scope_name("_x", allow_internal=True) == "_x"
    with pytest.raises(ValueError, match="limit is 250"):
        n.validate_stream_name("y" * 251)
    with pytest.raises(ValueError, match="must be a str"):
        n.validate_stream_name(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="invalid stream name 'abc\\\\n'"):
        n.validate_stream_name("abc\n")


def test_state_streams_keep_the_names_existing_states_have() -> None:
    """States written by earlier versions are found by these names: the digest rule never changes."""
    assert n.state_stream("ingest", "iot/readings\ndaily", "iot") == ("iot", "ingest-state-c61d8bd763f75a118f09")
    assert n.state_stream("export", "daily", "iot", "iot-state") == ("iot-state", "export-state-2fe14b9b993ea6eb953f")
    assert n.state_stream("export", "daily", "iot", None)[0] == "iot"
    assert n.state_stream_prefix("ingest") == "ingest-state-"
