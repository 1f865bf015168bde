"""Routing-key hashing: which segment of a stream an event with a routing key goes to.

Per-key ordering across writers only holds if every writer maps a key to the same point of the
key space, so our own writers must hash exactly as the official Python binding (Rust) does:
MurmurHash3 x64-128 (seed = Java ``"EventRouter".hashCode()``) over the key's UTF-16LE code units,
first 64-bit word turned into a double in [0, 1). For ASCII keys this equals Java's
``HashHelper.hashToRange``. For other keys the Rust client sizes its UTF-16 buffer by the UTF-8
byte length, so it also hashes trailing zero code units and lands elsewhere than Java;
:func:`hash_routing_key` reproduces the Rust result, :func:`hash_routing_key_java` the Java one.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Sequence
from functools import lru_cache
from typing import TypeVar

__all__ = [
    "ROUTING_SEED", "murmur3_x64_128", "rust_routing_key_bytes", "java_routing_key_bytes",
    "hash_routing_key", "hash_routing_key_java", "unit_interval_from_hash", "segment_for_key",
    "check_key_ranges",
]

#: Java ``"EventRouter".hashCode()``; both clients seed the hash with it.
ROUTING_SEED = 1741865571

_M64 = (1 << 64) - 1
_C1 = 0x87C37B91114253D5
_C2 = 0x4CF5AD432745937F

T = TypeVar("T")


def _fmix64(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _M64
    k ^= k >> 33
    return k


def murmur3_x64_128(data: bytes, seed: int = 0) -> tuple[int, int]:
    """MurmurHash3 x64 128-bit of ``data`` as the two unsigned 64-bit words (h1, h2).

    Blocks are read as little-endian u64s, like the reference implementation and Guava.
    """
    h1 = h2 = seed & _M64
    n = len(data)
    nblocks = n // 16
    if nblocks:
        words = struct.unpack_from(f"<{2 * nblocks}Q", data)
        for i in range(0, 2 * nblocks, 2):
            k1 = (words[i] * _C1) & _M64
            k1 = ((k1 << 31) | (k1 >> 33)) & _M64
            h1 ^= (k1 * _C2) & _M64
            h1 = ((h1 << 27) | (h1 >> 37)) & _M64
            h1 = (((h1 + h2) & _M64) * 5 + 0x52DCE729) & _M64

            k2 = (words[i + 1] * _C2) & _M64
            k2 = ((k2 << 33) | (k2 >> 31)) & _M64
            h2 ^= (k2 * _C1) & _M64
            h2 = ((h2 << 31) | (h2 >> 33)) & _M64
            h2 = (((h2 + h1) & _M64) * 5 + 0x38495AB5) & _M64
    tail = data[16 * nblocks:]
    if len(tail) > 8:
        k2 = (int.from_bytes(tail[8:], "little") * _C2) & _M64
        k2 = ((k2 << 33) | (k2 >> 31)) & _M64
        h2 ^= (k2 * _C1) & _M64
    if tail:
        k1 = (int.from_bytes(tail[:8], "little") * _C1) & _M64
        k1 = ((k1 << 31) | (k1 >> 33)) & _M64
        h1 ^= (k1 * _C2) & _M64
    h1 ^= n
    h2 ^= n
    h1 = (h1 + h2) & _M64
    h2 = (h2 + h1) & _M64
    h1 = _fmix64(h1)
    h2 = _fmix64(h2)
    h1 = (h1 + h2) & _M64
    h2 = (h2 + h1) & _M64
    return h1, h2


def unit_interval_from_hash(h1: int) -> float:
    """Java ``longToDoubleFraction`` / Rust ``u64_to_f64_fraction``: 52 hash bits -> [0, 1)."""
    bits = 0x3FF0_0000_0000_0000 + ((h1 >> 12) & 0x000F_FFFF_FFFF_FFFF)
    return struct.unpack(">d", bits.to_bytes(8, "big"))[0] - 1.0


def rust_routing_key_bytes(key: str) -> bytes:
    """The bytes the Rust client hashes: UTF-16LE code units, zero-padded to 2 x UTF-8 length."""
    if not isinstance(key, str):
        raise ValueError(f"routing key must be a str, got {type(key).__name__}")
    try:
        utf8_len = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(f"routing key {key!r} is not valid Unicode text: {exc.reason}") from None
    units = key.encode("utf-16-le")
    return units + bytes(2 * utf8_len - len(units))


def java_routing_key_bytes(key: str) -> bytes:
    """The bytes Java hashes (Guava ``hashUnencodedChars``): UTF-16LE code units, nothing more."""
    if not isinstance(key, str):
        raise ValueError(f"routing key must be a str, got {type(key).__name__}")
    return key.encode("utf-16-le", "surrogatepass")


@lru_cache(maxsize=65536)
def hash_routing_key(key: str) -> float:
    """Where the official (Rust-based) client routes ``key`` in the key space [0, 1)."""
    h1, _ = murmur3_x64_128(rust_routing_key_bytes(key), ROUTING_SEED)
    return unit_interval_from_hash(h1)


def hash_routing_key_java(key: str) -> float:
    """Where the Java client routes ``key``; equal to :func:`hash_routing_key` for ASCII keys."""
    h1, _ = murmur3_x64_128(java_routing_key_bytes(key), ROUTING_SEED)
    return unit_interval_from_hash(h1)


def segment_for_key(k: float, ranges: Sequence[tuple[float, T]]) -> T:
    """Picks the segment for key-space point ``k`` from ``(max_key, segment)`` pairs sorted by
    max_key: the entry with the smallest max_key >= k (the Rust client's inclusive lookup)."""
    if not 0.0 <= k <= 1.0:
        raise ValueError(f"key-space point must be within [0, 1], got {k!r}")
    i = bisect.bisect_left(ranges, k, key=lambda entry: entry[0])
    if i == len(ranges):
        top = ranges[-1][0] if ranges else None
        raise ValueError(f"no segment covers key-space point {k!r} (largest max_key is {top!r})")
    return ranges[i][1]


def check_key_ranges(max_keys: Sequence[float]) -> None:
    """Raises ValueError where the Rust client would panic on a routing table's max keys:
    smallest > 0.0, largest >= 1.0 and < 1.0001 (an empty table is accepted)."""
    if not max_keys:
        return
    low, high = min(max_keys), max(max_keys)
    if not low > 0.0:
        raise ValueError(f"smallest max_key must be > 0.0, got {low!r}")
    if not high >= 1.0:
        raise ValueError(f"largest max_key must be >= 1.0 (the key space is not covered), got {high!r}")
    if not high < 1.0001:
        raise ValueError(f"largest max_key must be < 1.0001, got {high!r}")
