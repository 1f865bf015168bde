"""Well-formed wire commands for the fuzz targets: random ones from fuzz bytes, and seed sessions.

Both targets and the seed-corpus generator use this, so structure-aware inputs and the committed
seeds come from OUR encoder (``protocol.wire``), never from captured or downloaded traffic.
Command fields are built from each class's ``WIRE`` spec, so a new command type is covered
without touching this file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from airflow_provider_pravega.protocol import wire

#: Every command class in a fixed order (requests first), so one fuzz byte picks one reliably.
ALL_TYPES: list[type] = sorted(
    {*wire.REQUEST_TYPES.values(), *wire.REPLY_TYPES.values()},
    key=lambda cls: (cls not in wire.REQUEST_TYPES.values(), cls.TYPE, cls.__name__),
)
REQUEST_CLASSES: list[type] = sorted(wire.REQUEST_TYPES.values(), key=lambda cls: cls.TYPE)

#: Segment names the store will recognise, so random requests reach past "no such segment".
SEGMENT_NAMES = (
    "fz/st/0.#epoch.0",
    "fz/st/1.#epoch.0",
    "fz/_tables/kv.#epoch.0",
    "fz/st/0.#epoch.0#transaction.0000000000000001000000000000002a",
    "",
)

I32 = (-(2**31), 2**31 - 1)
I64 = (-(2**63), 2**63 - 1)


def _int(fdp: Any, lo: int, hi: int, interesting: tuple[int, ...]) -> int:
    """Mostly boundary values (they find the bugs), sometimes anything in range."""
    if fdp.ConsumeBool():
        return fdp.PickValueInList([v for v in interesting if lo <= v <= hi] or [lo])
    return fdp.ConsumeIntInRange(lo, hi)


_EDGES = (0, 1, -1, 2, 7, 8, 9, 4096, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63), 2**32, 0xFF_FFFF)


def _string(fdp: Any) -> str:
    if fdp.ConsumeBool():
        return fdp.PickValueInList(list(SEGMENT_NAMES))
    return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 40))


def _blob(fdp: Any, limit: int = 64) -> bytes:
    return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, limit))


def _key(fdp: Any) -> wire.TableKey:
    version = _int(fdp, *I64, (wire.KEY_NO_VERSION, wire.KEY_NOT_EXISTS, 0, 1, 2**63 - 1))
    return wire.TableKey(_blob(fdp, 24), version)


def _value(fdp: Any) -> wire.TableValue:
    return wire.TableValue(_blob(fdp, 24))


def _attr(fdp: Any) -> wire.AttributeUpdate:
    return wire.AttributeUpdate(
        _int(fdp, 0, 2**128 - 1, (0, 1, 2**128 - 1, 2**127)),
        fdp.ConsumeIntInRange(0, 255),
        _int(fdp, *I64, _EDGES),
        _int(fdp, *I64, _EDGES),
    )


def _items(fdp: Any, make: Callable[[Any], Any], most: int = 4) -> tuple:
    return tuple(make(fdp) for _ in range(fdp.ConsumeIntInRange(0, most)))


_MAKERS: dict[str, Callable[[Any], Any]] = {
    "i32": lambda fdp: _int(fdp, *I32, _EDGES),
    "i64": lambda fdp: _int(fdp, *I64, _EDGES + (wire.NO_EVENT_NUMBER,)),
    "u8": lambda fdp: fdp.ConsumeIntInRange(0, 255),
    "bool": lambda fdp: fdp.ConsumeBool(),
    "u128": lambda fdp: _int(fdp, 0, 2**128 - 1, (0, 1, 42, 2**64, 2**127, 2**128 - 1)),
    "str": _string,
    "bytes": _blob,
    "rest": _blob,
    "event": _blob,
    "i64s": lambda fdp: _items(fdp, _MAKERS["i64"], 6),
    "keys": lambda fdp: _items(fdp, _key),
    "entries": lambda fdp: _items(fdp, lambda f: (_key(f), _value(f))),
    "attrs": lambda fdp: _items(fdp, _attr, 3),
}


def wire_kinds(cls: type) -> tuple[list[str], list[str]]:
    """The (required, optional tail) field kinds of a command class, from its WIRE spec."""
    required, _, optional = cls.WIRE.partition("|")
    return required.split(), optional.split()


def random_command(fdp: Any, classes: list[type] = ALL_TYPES) -> wire.Command:
    """A well-formed command of a fuzz-chosen class with fuzz-chosen field values.

    Optional Java tails are either all absent or all present: a partly set tail is encoded with
    Java's defaults, so it would not decode back to the same object (that case has its own unit
    test in tests/protocol/test_wire.py).
    """
    cls = classes[fdp.ConsumeIntInRange(0, len(classes) - 1)]
    required, optional = wire_kinds(cls)
    values = [_MAKERS[kind](fdp) for kind in required]
    with_tail = bool(optional) and fdp.ConsumeBool()
    values += [_MAKERS[kind](fdp) if with_tail else None for kind in optional]
    names = [f.name for f in dataclasses.fields(cls)]
    return cls(**dict(zip(names, values)))


#: Values that do not fit some wire type: encode must refuse each with a ValueError (or, where
#: the value happens to fit the field, encode it faithfully), never any other exception.
HOSTILE_VALUES: tuple = (
    -1, 256, 2**31, -(2**31) - 1, 2**63, -(2**63) - 1, 2**128, -(2**127), 10**40, 2, True, 1.5,
    float("nan"), None, "", "x", "\ud800", "é" * 40000, b"", b"\xff", bytearray(b"ab"), memoryview(b"mv"),
    (), (1, 2), [3], ("a",), (b"k",), (wire.TableKey(b"k"),), ((wire.TableKey(b"k"), wire.TableValue(b"v")),),
    ((wire.TableKey(b"k"),),), (wire.TableKey("k"),), (wire.TableKey(b"k", 2**64),), (wire.TableValue(b"v"),),
    (wire.AttributeUpdate(-1, 1, 0, 0),), (wire.AttributeUpdate(1, 300, 0, 0),), (wire.AttributeUpdate(1, 1, 2**64, 0),),
    object(),
)


def hostile_command(fdp: Any, classes: list[type] = ALL_TYPES) -> wire.Command:
    """Like random_command, but some fields get values of the wrong type or out of range."""
    cls = classes[fdp.ConsumeIntInRange(0, len(classes) - 1)]
    required, optional = wire_kinds(cls)
    kinds = required + optional
    with_tail = bool(optional) and fdp.ConsumeBool()
    values = []
    for i, kind in enumerate(kinds):
        if i >= len(required) and not with_tail:
            values.append(None)
        elif fdp.ConsumeIntInRange(0, 3) == 0:
            values.append(HOSTILE_VALUES[fdp.ConsumeIntInRange(0, len(HOSTILE_VALUES) - 1)])
        else:
            values.append(_MAKERS[kind](fdp))
    names = [f.name for f in dataclasses.fields(cls)]
    return cls(**dict(zip(names, values)))


# ------------------------------------------------------------------ seed sessions (corpus)

WRITER = 0x5EED_0000_0000_0000_0000_0000_0000_0001
SEG = SEGMENT_NAMES[0]
SEG2 = SEGMENT_NAMES[1]
TABLE = SEGMENT_NAMES[2]


def sample_commands() -> list[wire.Command]:
    """One valid instance of every command type, both directions, tails absent and present."""
    k = wire.TableKey(b"key", wire.KEY_NO_VERSION)
    v = wire.TableValue(b"value")
    block = wire.frame_event(b"e1") + wire.frame_event(b"e2")
    attrs = (wire.AttributeUpdate(7, 1, 5, wire.NULL_ATTRIBUTE_VALUE),)
    return [
        wire.Hello(), wire.KeepAlive(),
        wire.SetupAppend(1, WRITER, SEG, ""),
        wire.AppendBlock(WRITER, block),
        wire.AppendBlockEnd(WRITER, len(block), block, 2, 2, 2),
        wire.ConditionalAppend(WRITER, 3, 0, b"cond", 3),
        wire.ConditionalBlockEnd(WRITER, 4, 0, block, 4),
        wire.ReadSegment(SEG, 0, 1024, "", 5),
        wire.GetSegmentAttribute(6, SEG, 7, ""),
        wire.UpdateSegmentAttribute(7, SEG, 7, 5, wire.NULL_ATTRIBUTE_VALUE, ""),
        wire.GetStreamSegmentInfo(8, SEG, ""),
        wire.CreateSegment(9, SEG, 0, 0, ""),
        wire.CreateSegment(9, SEG, 0, 0, "", 1 << 20),
        wire.UpdateSegmentPolicy(10, SEG, 0, 0, ""),
        wire.SealSegment(11, SEG2, ""),
        wire.TruncateSegment(12, SEG, 0, ""),
        wire.DeleteSegment(13, SEG2, ""),
        wire.MergeSegments(14, SEG, SEG2, ""),
        wire.MergeSegments(14, SEG, SEG2, "", attrs),
        wire.CreateTransientSegment(15, WRITER, SEG, ""),
        wire.CreateTableSegment(16, TABLE, ""),
        wire.CreateTableSegment(16, TABLE, "", False, 0, 0),
        wire.DeleteTableSegment(17, TABLE, False, ""),
        wire.UpdateTableEntries(18, TABLE, "", ((k, v),), wire.NULL_TABLE_SEGMENT_OFFSET),
        wire.RemoveTableKeys(19, TABLE, "", (k,), wire.NULL_TABLE_SEGMENT_OFFSET),
        wire.ReadTable(20, TABLE, "", (k,)),
        wire.ReadTableKeys(21, TABLE, "", 10, b""),
        wire.ReadTableEntries(22, TABLE, "", 10, b""),
        wire.ReadTableEntriesDelta(23, TABLE, "", 0, 10),
        wire.AppendSetup(1, SEG, WRITER, wire.NO_EVENT_NUMBER),
        wire.DataAppended(WRITER, 2, 0, 2, 20),
        wire.ConditionalCheckFailed(WRITER, 3, 3),
        wire.SegmentRead(SEG, 0, True, False, block, 5),
        wire.SegmentAttribute(6, 5),
        wire.SegmentAttributeUpdated(7, True),
        wire.StreamSegmentInfo(8, SEG, True, False, False, 1_700_000_000_000, 20, 0),
        wire.SegmentCreated(9, SEG),
        wire.SegmentPolicyUpdated(10, SEG),
        wire.SegmentSealed(11, SEG2),
        wire.SegmentDeleted(13, SEG2),
        wire.SegmentTruncated(12, SEG),
        wire.SegmentsMerged(14, SEG, SEG2, 40),
        wire.TableEntriesUpdated(18, (1, 2)),
        wire.TableKeysRemoved(19, TABLE),
        wire.TableRead(20, TABLE, ((k, v),)),
        wire.TableKeysRead(21, TABLE, (k,), b"key"),
        wire.TableEntriesRead(22, TABLE, ((k, v),), b"key"),
        wire.TableEntriesDeltaRead(23, TABLE, ((k, v),), False, True, 30),
        wire.WrongHost(1, SEG, "127.0.0.1:1", ""),
        wire.SegmentIsSealed(1, SEG, "", 0),
        wire.SegmentAlreadyExists(1, SEG, ""),
        wire.NoSuchSegment(1, SEG, "", -1),
        wire.InvalidEventNumber(WRITER, 1, ""),
        wire.InvalidEventNumber(WRITER, 1, "", 4),
        wire.SegmentIsTruncated(1, SEG, 10, "", 0),
        wire.OperationUnsupported(1, "Op", ""),
        wire.AuthTokenCheckFailed(1, "", wire.AUTH_TOKEN_EXPIRED),
        wire.ErrorMessage(1, SEG, "boom", wire.ERROR_ILLEGAL_ARGUMENT),
        wire.TableSegmentNotEmpty(1, TABLE, ""),
        wire.TableKeyDoesNotExist(1, TABLE, ""),
        wire.TableKeyBadVersion(1, TABLE, ""),
    ]


def seed_sessions() -> dict[str, list[wire.Command]]:
    """Request sequences a real client would send, each starting with Hello, for the dispatcher."""
    k1, k2 = b"alpha", b"beta"
    block = wire.frame_event(b"event-1") + wire.frame_event(b"event-2")
    hello = wire.Hello()
    return {
        "append_read": [
            hello,
            wire.CreateSegment(1, SEG, 0, 0, ""),
            wire.SetupAppend(2, WRITER, SEG, ""),
            wire.AppendBlockEnd(WRITER, len(block), block, 2, 2, 3),
            wire.ConditionalAppend(WRITER, 3, 0, b"late", 4),
            wire.ReadSegment(SEG, 0, 4096, "", 5),
            wire.GetStreamSegmentInfo(6, SEG, ""),
        ],
        "conditional": [
            hello,
            wire.CreateSegment(1, SEG2, 0, 0, "", 0),
            wire.SetupAppend(2, WRITER + 1, SEG2, ""),
            wire.ConditionalBlockEnd(WRITER + 1, 1, 0, block, 3),
            wire.ConditionalAppend(WRITER + 1, 2, len(block), b"next", 4),
            wire.ConditionalAppend(WRITER + 1, 3, 0, b"stale", 5),
            wire.ReadSegment(SEG2, 0, 1 << 20, "", 6),
        ],
        "admin": [
            hello,
            wire.CreateSegment(1, SEG, 0, 0, ""),
            wire.CreateSegment(2, SEG2, 0, 0, ""),
            wire.UpdateSegmentPolicy(3, SEG, 10, 1, ""),
            wire.CreateTransientSegment(4, WRITER, SEG, ""),
            wire.SealSegment(5, SEG2, ""),
            wire.MergeSegments(6, SEG, SEG2, ""),
            wire.TruncateSegment(7, SEG, 9, ""),
            wire.GetSegmentAttribute(8, SEG, 1, ""),
            wire.UpdateSegmentAttribute(9, SEG, 1, 2, wire.NULL_ATTRIBUTE_VALUE, ""),
            wire.DeleteSegment(10, SEG2, ""),
            wire.KeepAlive(),
        ],
        "tables": [
            hello,
            wire.CreateTableSegment(1, TABLE, ""),
            wire.UpdateTableEntries(2, TABLE, "", ((wire.TableKey(k1, wire.KEY_NOT_EXISTS), wire.TableValue(b"1")),
                                                   (wire.TableKey(k2), wire.TableValue(b"2"))), -1),
            wire.ReadTable(3, TABLE, "", (wire.TableKey(k1), wire.TableKey(b"missing"))),
            wire.ReadTableKeys(4, TABLE, "", 1, b""),
            wire.ReadTableEntries(5, TABLE, "", 10, k1),
            wire.ReadTableEntriesDelta(6, TABLE, "", 0, 10),
            wire.RemoveTableKeys(7, TABLE, "", (wire.TableKey(k2, 0),), -1),
            wire.DeleteTableSegment(8, TABLE, True, ""),
        ],
    }
