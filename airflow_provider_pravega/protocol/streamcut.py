"""Stream cuts in Pravega's text form (Java ``StreamCut.asText()`` / ``StreamCut.from(text)``).

A user can copy a cut printed by a Java application into an Airflow parameter, and a cut we print
can be given to Java. The text is base64 (standard alphabet, padded) of a gzip member holding
``0:<scope>/<stream>:<numbers>:<epochs>:<offsets>``, where the three comma-separated lists describe
one segment per position (number = low 32 bits of the id, epoch = id >> 32).

Entry order is Java map iteration order, which is not canonical: parsers must not depend on it.
To match Java byte for byte, the default ``order="java"`` reproduces the iteration order of the
``HashMap<Segment, Long>`` a Java ``StreamCutImpl`` is normally built from (including by
``StreamCut.from``): bucket order of Lombok's ``Segment.hashCode`` over (scope, stream, id), with
the default capacity growth; for such a text, Java's ``from(text).asText()`` returns the same text.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import io
import re
import struct
import zlib
from collections.abc import Iterable, Mapping
from typing import Literal, NamedTuple

from airflow_provider_pravega.protocol.naming import (
    validate_scope_name,
    validate_stream_name,
)

__all__ = [
    "UNBOUNDED_TEXT", "TEXT_FORMAT_VERSION", "MAX_PLAIN_TEXT", "InvalidStreamCutText",
    "ParsedStreamCut", "streamcut_to_text", "streamcut_from_text", "streamcut_plain_text",
    "java_gzip", "java_hashmap_order", "java_string_hash", "java_segment_hash",
]

#: ``StreamCut.UNBOUNDED.asText()``: not base64, the literal word.
UNBOUNDED_TEXT = "UNBOUNDED"
TEXT_FORMAT_VERSION = 0
#: Refuse texts that inflate beyond this (a cut of a million segments stays far below it).
MAX_PLAIN_TEXT = 64 * 1024 * 1024

Order = Literal["java", "sorted", "given"]

# JDK 16+ GZIPOutputStream header: magic, deflate, no flags, no mtime, XFL 0, OS 0xff (unknown).
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_INT = re.compile(r"[+-]?[0-9]+")


class InvalidStreamCutText(ValueError):
    """The text is not a stream cut in Pravega's text form; the message says which part is wrong."""


class ParsedStreamCut(NamedTuple):
    scope: str
    stream: str
    positions: dict[int, int]  # segment id -> offset


# --------------------------------------------------------------------------------------------
# Java hash order
# --------------------------------------------------------------------------------------------


def _i32(v: int) -> int:
    v &= 0xFFFF_FFFF
    return v - (1 << 32) if v & 0x8000_0000 else v


def java_string_hash(s: str) -> int:
    """Java ``String.hashCode()`` (over UTF-16 code units), as a signed int."""
    h = 0
    units = s.encode("utf-16-be", "surrogatepass")
    for (unit,) in struct.iter_unpack(">H", units):
        h = (31 * h + unit) & 0xFFFF_FFFF
    return _i32(h)


def java_segment_hash(scope: str, stream: str, seg_id: int) -> int:
    """Lombok ``@Data`` hashCode of Pravega's ``Segment(scope, streamName, segmentId)``."""
    v = seg_id & 0xFFFF_FFFF_FFFF_FFFF
    h = 1
    h = h * 59 + java_string_hash(scope)
    h = h * 59 + java_string_hash(stream)
    h = h * 59 + _i32((v >> 32) ^ v)
    return _i32(h)


def java_hashmap_order(scope: str, stream: str, segment_ids: Iterable[int]) -> list[int]:
    """Iteration order of a default ``HashMap<Segment, Long>`` filled with ``segment_ids`` in the
    given order: by bucket ``(h ^ h >>> 16) & (capacity - 1)``, insertion order within a bucket
    (resizes keep it). Capacity starts at 16 and doubles while size > 0.75 x capacity."""
    ids = list(dict.fromkeys(segment_ids))
    capacity = 16
    while len(ids) > capacity * 3 // 4:
        capacity *= 2

    def bucket(seg_id: int) -> int:
        h = java_segment_hash(scope, stream, seg_id) & 0xFFFF_FFFF
        return (h ^ (h >> 16)) & (capacity - 1)

    return sorted(ids, key=bucket)  # stable: equal buckets keep insertion order


# --------------------------------------------------------------------------------------------
# Producing the text
# --------------------------------------------------------------------------------------------


def _check_names(scope: str, stream: str) -> None:
    # Java's StreamCut.from() runs Stream.of(), which applies these (internal-name) rules.
    validate_scope_name(scope, allow_internal=True)
    validate_stream_name(stream, allow_internal=True)


def _ordered_ids(scope: str, stream: str, positions: Mapping[int, int], order: Order) -> list[int]:
    if order == "given":
        return list(positions)
    if order == "sorted":
        return sorted(positions)
    if order == "java":
        return java_hashmap_order(scope, stream, sorted(positions))
    raise ValueError(f"order must be 'java', 'sorted' or 'given', got {order!r}")


def streamcut_plain_text(
    scope: str, stream: str, positions: Mapping[int, int], *, order: Order = "java"
) -> str:
    """The uncompressed form ``0:<scope>/<stream>:<numbers>:<epochs>:<offsets>``."""
    _check_names(scope, stream)
    numbers: list[str] = []
    epochs: list[str] = []
    offsets: list[str] = []
    for seg_id in _ordered_ids(scope, stream, positions, order):
        offset = positions[seg_id]
        if not isinstance(seg_id, int) or seg_id < 0 or seg_id > _I64_MAX or (seg_id & 0xFFFF_FFFF) > 0x7FFF_FFFF:
            raise ValueError(
                f"segment id {seg_id!r} cannot be written: epoch and number must both be within 0..2**31-1"
            )
        if not isinstance(offset, int) or not _I64_MIN <= offset <= _I64_MAX:
            raise ValueError(f"offset {offset!r} of segment {seg_id} is not a signed 64-bit integer")
        numbers.append(str(seg_id & 0xFFFF_FFFF))
        epochs.append(str(seg_id >> 32))
        offsets.append(str(offset))
    return f"{TEXT_FORMAT_VERSION}:{scope}/{stream}:{','.join(numbers)}:{','.join(epochs)}:{','.join(offsets)}"


def java_gzip(data: bytes) -> bytes:
    """Exactly what JDK 16+ ``GZIPOutputStream`` writes: raw deflate level 6 (window 15, memLevel
    8) between a fixed header (OS byte 0xff) and CRC32 + length mod 2**32, little-endian.
    (``gzip.compress`` differs: level 9, and it sets XFL and OS.)"""
    comp = zlib.compressobj(6, zlib.DEFLATED, -15, 8)
    body = comp.compress(data) + comp.flush()
    return _GZIP_HEADER + body + struct.pack("<II", zlib.crc32(data), len(data) & 0xFFFF_FFFF)


def streamcut_to_text(
    scope: str, stream: str, positions: Mapping[int, int], *, order: Order = "java"
) -> str:
    """Java ``StreamCut.asText()`` for the cut {segment id -> offset} of ``scope/stream``.

    ``order``: ``"java"`` (default) matches Java's output for a cut held in a HashMap;
    ``"sorted"`` lists segments by id; ``"given"`` keeps the mapping's iteration order.
    """
    plain = streamcut_plain_text(scope, stream, positions, order=order)
    return base64.b64encode(java_gzip(plain.encode("utf-8"))).decode("ascii")


# --------------------------------------------------------------------------------------------
# Parsing the text
# --------------------------------------------------------------------------------------------


def _gunzip(raw: bytes) -> bytes:
    if raw[:2] != b"\x1f\x8b":
        raise InvalidStreamCutText("stream cut text is base64 but not of gzip data (no gzip magic bytes)")
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
            plain = f.read(MAX_PLAIN_TEXT + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise InvalidStreamCutText(f"stream cut text holds invalid or truncated gzip data: {exc}") from None
    if len(plain) > MAX_PLAIN_TEXT:
        raise InvalidStreamCutText(f"stream cut text inflates to more than {MAX_PLAIN_TEXT} bytes")
    return plain


def _int_list(part: str, what: str, low: int, high: int) -> list[int]:
    if part.strip() == "":
        return []
    values = []
    for item in part.split(","):
        item = item.strip()
        if not _INT.fullmatch(item):
            raise InvalidStreamCutText(f"stream cut {what} list has a non-numeric entry {item!r}")
        v = int(item)
        if not low <= v <= high:
            raise InvalidStreamCutText(f"stream cut {what} {v} is outside {low}..{high}")
        values.append(v)
    return values


def streamcut_from_text(text: str) -> ParsedStreamCut | None:
    """Parses Java's ``asText()`` form; returns None for ``UNBOUNDED``.

    Accepts any valid gzip (any header flags, several members), not only what Java writes. An
    empty cut (``0:s/st:::``), which Java writes but cannot read back, parses as no positions.
    Raises InvalidStreamCutText for bad base64 or gzip, a wrong number of ``:`` parts, an
    unsupported version, a bad stream name, non-numeric or out-of-range numbers, lists of
    different lengths and repeated segments.
    """
    if not isinstance(text, str):
        raise InvalidStreamCutText(f"stream cut text must be a str, got {type(text).__name__}")
    text = text.strip()
    if text == UNBOUNDED_TEXT:
        return None
    if not text:
        raise InvalidStreamCutText("stream cut text is empty")
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidStreamCutText(f"stream cut text is not valid base64: {exc}") from None
    try:
        plain = _gunzip(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidStreamCutText(f"stream cut text does not inflate to UTF-8 text: {exc.reason}") from None

    parts = plain.split(":", 4)
    if len(parts) != 5:
        raise InvalidStreamCutText(
            f"stream cut text must have 5 ':'-separated parts "
            f"(version:scope/stream:numbers:epochs:offsets), found {len(parts)}"
        )
    version, scoped, numbers_part, epochs_part, offsets_part = parts
    if version.strip() != str(TEXT_FORMAT_VERSION):
        raise InvalidStreamCutText(f"unsupported stream cut text version {version!r} (expected 0)")
    scope, sep, stream = scoped.partition("/")
    if not sep:
        raise InvalidStreamCutText(f"stream cut names {scoped!r}, not a scoped stream 'scope/stream'")
    try:
        _check_names(scope, stream)
    except ValueError as exc:
        raise InvalidStreamCutText(f"stream cut names an invalid stream {scoped!r}: {exc}") from None

    numbers = _int_list(numbers_part, "segment number", 0, 0x7FFF_FFFF)
    epochs = _int_list(epochs_part, "epoch", 0, 0x7FFF_FFFF)
    offsets = _int_list(offsets_part, "offset", _I64_MIN, _I64_MAX)
    if not len(numbers) == len(epochs) == len(offsets):
        raise InvalidStreamCutText(
            f"stream cut lists differ in length: {len(numbers)} segment numbers, "
            f"{len(epochs)} epochs, {len(offsets)} offsets"
        )
    positions: dict[int, int] = {}
    for number, epoch, offset in zip(numbers, epochs, offsets):
        seg_id = (epoch << 32) | number
        if seg_id in positions:
            raise InvalidStreamCutText(f"stream cut lists segment {number}.#epoch.{epoch} twice")
        positions[seg_id] = offset
    return ParsedStreamCut(scope, stream, positions)
