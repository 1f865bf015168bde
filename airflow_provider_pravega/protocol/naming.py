"""Pravega names and ids: segment ids, qualified segment names, transaction ids and names.

One place defines how names are built and parsed, following the Rust client (what the official
Python binding runs) and Java's NameUtils where the Rust client has no rule (name validation,
transient segments).
"""

from __future__ import annotations

import hashlib
import re
from typing import NamedTuple

__all__ = [
    "EPOCH_DELIMITER", "TRANSACTION_DELIMITER", "TRANSIENT_DELIMITER", "KVTABLE_SUFFIX",
    "MAX_NAME_SIZE", "MAX_GIVEN_NAME_SIZE", "INTERNAL_NAME_PREFIX",
    "segment_id", "segment_number", "segment_epoch", "qualified_segment_name",
    "parse_qualified_segment_name", "SegmentName", "scoped_stream_name", "parse_scoped_stream_name",
    "transaction_segment_name", "is_transaction_segment", "transaction_parent", "transaction_id_of",
    "transient_segment_name", "is_transient_segment", "transient_parent",
    "txn_id_to_bits", "bits_to_txn_id", "txn_epoch", "table_segment_name",
    "validate_scope_name", "validate_stream_name", "validate_reader_group_name",
    "state_stream_prefix", "state_stream",
]

EPOCH_DELIMITER = ".#epoch."
TRANSACTION_DELIMITER = "#transaction."
TRANSIENT_DELIMITER = "#transient."
KVTABLE_SUFFIX = "_kvtable"
INTERNAL_NAME_PREFIX = "_"
#: Java NameUtils: a full name may have 255 characters, a user-given stream name 250.
MAX_NAME_SIZE = 255
MAX_GIVEN_NAME_SIZE = MAX_NAME_SIZE - 5

_ID_HEX_LEN = 32  # two 16-hex-digit halves of a 128-bit id
_MASK32 = 0xFFFF_FFFF
_MASK64 = (1 << 64) - 1
_MASK128 = (1 << 128) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def _as_i32(v: int) -> int:
    v &= _MASK32
    return v - (1 << 32) if v & 0x8000_0000 else v


def _as_i64(v: int) -> int:
    v &= _MASK64
    return v - (1 << 64) if v & (1 << 63) else v


# --------------------------------------------------------------------------------------------
# Segment ids
# --------------------------------------------------------------------------------------------


def segment_id(epoch: int, number: int) -> int:
    """``(epoch << 32) + number``: the i64 id of segment ``number`` created in ``epoch``."""
    if not isinstance(epoch, int) or not 0 <= epoch <= 0x7FFF_FFFF:
        raise ValueError(f"segment epoch must be within 0..2**31-1, got {epoch!r}")
    if not isinstance(number, int) or not 0 <= number <= 0x7FFF_FFFF:
        raise ValueError(f"segment number must be within 0..2**31-1, got {number!r}")
    return (epoch << 32) | number


def _check_segment_id(seg_id: int) -> None:
    if not isinstance(seg_id, int) or not _I64_MIN <= seg_id <= _I64_MAX:
        raise ValueError(f"segment id must be a signed 64-bit integer, got {seg_id!r}")


def segment_number(seg_id: int) -> int:
    """The low 32 bits of a segment id, read as a signed i32 (as both clients do)."""
    _check_segment_id(seg_id)
    return _as_i32(seg_id)


def segment_epoch(seg_id: int) -> int:
    """The epoch in which the segment was created: ``seg_id >> 32`` as an i32."""
    _check_segment_id(seg_id)
    return _as_i32(seg_id >> 32)


# --------------------------------------------------------------------------------------------
# Qualified names
# --------------------------------------------------------------------------------------------


def scoped_stream_name(scope: str, stream: str) -> str:
    return f"{scope}/{stream}"


def parse_scoped_stream_name(name: str) -> tuple[str, str]:
    """Splits ``scope/stream``; raises ValueError unless there are exactly two non-empty parts."""
    parts = name.split("/")
    if len(parts) != 2 or not parts[0] or not parts[1]:
        raise ValueError(f"expected a scoped stream name 'scope/stream', got {name!r}")
    return parts[0], parts[1]


def qualified_segment_name(scope: str, stream: str, seg_id: int) -> str:
    """``scope/stream/<number>.#epoch.<epoch>``, e.g. id 0x100000001 -> ``s/st/1.#epoch.1``."""
    return f"{scope}/{stream}/{segment_number(seg_id)}{EPOCH_DELIMITER}{segment_epoch(seg_id)}"


class SegmentName(NamedTuple):
    scope: str
    stream: str
    segment_id: int


_DECIMAL = re.compile(r"[+-]?[0-9]+")


def _parse_i32(text: str, what: str, name: str) -> int:
    if not _DECIMAL.fullmatch(text):
        raise ValueError(f"segment name {name!r} has a non-numeric {what}: {text!r}")
    value = int(text)
    if not 0 <= value <= 0x7FFF_FFFF:
        raise ValueError(f"segment name {name!r} has a {what} outside 0..2**31-1: {value}")
    return value


def parse_qualified_segment_name(name: str) -> SegmentName:
    """Parses ``scope/stream/N[.#epoch.E]`` into (scope, stream, segment id).

    A missing ``.#epoch.`` part means epoch 0. A transaction or transient segment name parses as
    its parent segment, like the Rust client's ``ScopedSegment::from``.
    """
    if not isinstance(name, str):
        raise ValueError(f"segment name must be a str, got {type(name).__name__}")
    if is_transaction_segment(name):
        name = transaction_parent(name)
    elif is_transient_segment(name):
        name = transient_parent(name)
    parts = name.split("/")
    if len(parts) != 3 or not parts[0] or not parts[1] or not parts[2]:
        raise ValueError(f"expected a qualified segment name 'scope/stream/N.#epoch.E', got {name!r}")
    scope, stream, last = parts
    if EPOCH_DELIMITER in last:
        number_text, _, epoch_text = last.partition(EPOCH_DELIMITER)
        number = _parse_i32(number_text, "segment number", name)
        epoch = _parse_i32(epoch_text, "epoch", name)
    else:
        number = _parse_i32(last, "segment number", name)
        epoch = 0
    return SegmentName(scope, stream, (epoch << 32) | number)


# --------------------------------------------------------------------------------------------
# Transaction and transient segments
# --------------------------------------------------------------------------------------------


def _check_u128(value: int, what: str) -> None:
    if not isinstance(value, int) or not 0 <= value <= _MASK128:
        raise ValueError(f"{what} must be an unsigned 128-bit integer, got {value!r}")


def _hex128(value: int) -> str:
    return f"{value >> 64:016x}{value & _MASK64:016x}"


def transaction_segment_name(parent: str, txn_id: int) -> str:
    """``<parent>#transaction.<hi 16 hex><lo 16 hex>``, both halves unsigned and lowercase."""
    _check_u128(txn_id, "transaction id")
    return f"{parent}{TRANSACTION_DELIMITER}{_hex128(txn_id)}"


def _delimiter_position(name: str, delimiter: str, id_len: int) -> int:
    pos = name.rfind(delimiter)
    if pos < 0 or pos + len(delimiter) + id_len > len(name):
        return -1
    return pos


def is_transaction_segment(name: str) -> bool:
    """True if the name has ``#transaction.`` followed by at least 32 characters (Rust/Java rule)."""
    return _delimiter_position(name, TRANSACTION_DELIMITER, _ID_HEX_LEN) >= 0


def transaction_parent(name: str) -> str:
    """The parent segment name of a transaction segment (text before the last delimiter)."""
    return name[:_position_of(name, TRANSACTION_DELIMITER, "transaction")]


def _position_of(name: str, delimiter: str, kind: str) -> int:
    """Where ``delimiter`` and its id begin in a segment name of that ``kind``; ValueError if not one."""
    pos = _delimiter_position(name, delimiter, _ID_HEX_LEN)
    if pos < 0:
        raise ValueError(f"not a {kind} segment name: {name!r}")
    return pos


def transaction_id_of(name: str) -> int:
    """The 128-bit transaction id encoded in a transaction segment name."""
    pos = _position_of(name, TRANSACTION_DELIMITER, "transaction")
    digits = name[pos + len(TRANSACTION_DELIMITER):pos + len(TRANSACTION_DELIMITER) + _ID_HEX_LEN]
    if not re.fullmatch(r"[0-9a-fA-F]{32}", digits):
        raise ValueError(f"transaction segment name {name!r} does not carry 32 hex digits: {digits!r}")
    return int(digits, 16)


def transient_segment_name(parent: str, writer_id: int, random_id: int) -> str:
    """``<parent>#transient.<writer id 32 hex>.<random 32 hex>``: the server's name for a
    large-event staging segment (Java NameUtils.getTransientNameFromId)."""
    _check_u128(writer_id, "writer id")
    _check_u128(random_id, "random id")
    return f"{parent}{TRANSIENT_DELIMITER}{_hex128(writer_id)}.{_hex128(random_id)}"


def is_transient_segment(name: str) -> bool:
    return _delimiter_position(name, TRANSIENT_DELIMITER, _ID_HEX_LEN) >= 0


def transient_parent(name: str) -> str:
    return name[:_position_of(name, TRANSIENT_DELIMITER, "transient")]


# --------------------------------------------------------------------------------------------
# Transaction ids
# --------------------------------------------------------------------------------------------


def txn_id_to_bits(txn_id: int) -> tuple[int, int]:
    """Splits a 128-bit transaction id into gRPC ``TxnId{highBits, lowBits}`` (signed i64s)."""
    _check_u128(txn_id, "transaction id")
    return _as_i64(txn_id >> 64), _as_i64(txn_id)


def bits_to_txn_id(high_bits: int, low_bits: int) -> int:
    """Joins ``TxnId`` halves into the unsigned 128-bit id, without sign-extending ``low_bits``.

    (The Rust client sign-extends a negative ``lowBits``, so a controller must only issue ids with
    bit 63 clear; for those ids this function and the Rust client agree.)
    """
    for label, v in (("high_bits", high_bits), ("low_bits", low_bits)):
        if not isinstance(v, int) or not _I64_MIN <= v <= _MASK64:
            raise ValueError(f"TxnId {label} must be a 64-bit integer, got {v!r}")
    return ((high_bits & _MASK64) << 64) | (low_bits & _MASK64)


def txn_epoch(txn_id: int) -> int:
    """The epoch a transaction was created in: the top 32 bits of its id (Rust ``id >> 96``)."""
    _check_u128(txn_id, "transaction id")
    return _as_i32(txn_id >> 96)


# --------------------------------------------------------------------------------------------
# Reader-group state
# --------------------------------------------------------------------------------------------


def table_segment_name(scope: str, reader_group: str) -> str:
    """The table segment holding a reader group's state: ``<scope>/<rg>_kvtable/0.#epoch.0``."""
    return f"{scope}/{reader_group}{KVTABLE_SUFFIX}/0{EPOCH_DELIMITER}0"


# --------------------------------------------------------------------------------------------
# The provider's own state streams
# --------------------------------------------------------------------------------------------


def state_stream_prefix(kind: str) -> str:
    """How the names of the provider's ``kind`` state streams start (``ingest``, ``export``)."""
    return f"{kind}-state-"


def state_stream(kind: str, key: str, scope: str, state_scope: str | None = None) -> tuple[str, str]:
    """Where the provider keeps the ``kind`` state named by ``key``: in ``state_scope`` (default:
    ``scope``), a stream named by a digest of the key (not ``_``-prefixed: Pravega reserves those
    names). Existing states are found by this name, so it never changes."""
    return state_scope or scope, f"{state_stream_prefix(kind)}{hashlib.sha1(key.encode()).hexdigest()[:20]}"


# --------------------------------------------------------------------------------------------
# Validation (Java NameUtils: ``\p{Alnum}`` is ASCII letters and digits)
# --------------------------------------------------------------------------------------------

_USER_NAME = re.compile(r"[A-Za-z0-9.\-]+")
_INTERNAL_NAME = re.compile(r"_?[A-Za-z0-9.\-]+")


def _validate(kind: str, name: str, max_len: int, pattern: re.Pattern[str], rule: str) -> str:
    if not isinstance(name, str):
        raise ValueError(f"{kind} name must be a str, got {type(name).__name__}")
    if len(name) > max_len:
        raise ValueError(f"{kind} name {name[:40]!r}... is {len(name)} characters; the limit is {max_len}")
    if not pattern.fullmatch(name):
        raise ValueError(f"invalid {kind} name {name!r}: {rule}")
    return name


_USER_RULE = "use 1 or more of the characters a-z, A-Z, 0-9, '.' and '-'"
_INTERNAL_RULE = "use an optional leading '_' then 1 or more of a-z, A-Z, 0-9, '.' and '-'"


def validate_scope_name(name: str, *, allow_internal: bool = False) -> str:
    """Java ``validateUserScopeName`` (or ``validateScopeName`` with ``allow_internal``)."""
    if allow_internal:
        return _validate("scope", name, MAX_NAME_SIZE, _INTERNAL_NAME, _INTERNAL_RULE)
    return _validate("scope", name, MAX_NAME_SIZE, _USER_NAME, _USER_RULE)


def validate_stream_name(name: str, *, allow_internal: bool = False) -> str:
    """Java ``validateUserStreamName`` (250 chars) or ``validateStreamName`` (internal, 255)."""
    if allow_internal:
        return _validate("stream", name, MAX_NAME_SIZE, _INTERNAL_NAME, _INTERNAL_RULE)
    return _validate("stream", name, MAX_GIVEN_NAME_SIZE, _USER_NAME, _USER_RULE)


def validate_reader_group_name(name: str) -> str:
    """Java ``validateReaderGroupName``: the user stream-name rule."""
    return _validate("reader group", name, MAX_GIVEN_NAME_SIZE, _USER_NAME, _USER_RULE)
