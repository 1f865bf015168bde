"""Sans-IO codec for the Pravega segment-store wire protocol.

Bytes in, typed commands out, and back; no sockets, no threads. The embedded segment store decodes
requests and encodes replies with it, and the project's own client does the opposite, so one codec
is exercised from both sides.

Frame layout: ``i32 type code, i32 payload length, payload``, all big-endian. Payload primitives:
i32/i64 two's complement, u8, bool (exactly 0 or 1), u128 as 16 big-endian bytes, strings as a u16
byte length plus UTF-8, byte strings as a u32 length plus the bytes, lists as a u32 count plus the
items. Field orders follow the Rust client (pravega-client-rust 0.3.7), which is what the official
Python binding speaks; where the Java side appends optional fields, decoding accepts the frame with
or without them and encoding writes the shorter Rust form unless the optional fields are set.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import ClassVar, Literal

__all__ = [
    # constants
    "WIRE_VERSION", "OLDEST_COMPATIBLE_VERSION", "MAX_FRAME", "FRAME_HEADER_LEN",
    "KEY_NO_VERSION", "KEY_NOT_EXISTS", "NO_EVENT_NUMBER", "NULL_ATTRIBUTE_VALUE",
    "NULL_TABLE_SEGMENT_OFFSET", "EVENT_TYPE", "EVENT_HEADER_LEN", "MAX_EVENT_SIZE",
    "AUTH_UNSPECIFIED", "AUTH_TOKEN_CHECK_FAILED", "AUTH_TOKEN_EXPIRED",
    "ERROR_UNSPECIFIED", "ERROR_ILLEGAL_ARGUMENT",
    # errors and value types
    "ProtocolError", "EventFormatError", "TableKey", "TableValue", "AttributeUpdate",
    "Command", "Request", "Reply",
    # codec entry points
    "encode", "encode_many", "decode_frame", "FrameDecoder", "request_id_of",
    "REQUEST_TYPES", "REPLY_TYPES",
    # event framing
    "frame_event", "SegmentEvent", "iter_events", "split_events", "EventParser",
]

# --------------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------------

#: Protocol versions the Rust client announces in Hello (high, low). Java 0.13+ says (17, 5).
WIRE_VERSION = 15
OLDEST_COMPATIBLE_VERSION = 5
#: Largest payload length either side accepts (16 MiB - 1); the Rust client drops the connection
#: on a longer frame.
MAX_FRAME = 0x00FF_FFFF
#: Frames of at least this many bytes (header included) are assembled in a buffer of their own
#: size (:class:`FrameDecoder`): segment reads' replies, not the small commands around them.
LARGE_FRAME = 64 * 1024
FRAME_HEADER_LEN = 8

#: TableKey.key_version meaning "unconditional" (i64::MIN).
KEY_NO_VERSION = -(2**63)
#: TableKey.key_version meaning "the key must not exist".
KEY_NOT_EXISTS = -1
#: AppendSetup.last_event_number when the writer has written nothing to the segment (i64::MIN).
NO_EVENT_NUMBER = -(2**63)
NULL_ATTRIBUTE_VALUE = -(2**63)
#: UpdateTableEntries/RemoveTableKeys.table_segment_offset meaning "no offset condition".
NULL_TABLE_SEGMENT_OFFSET = -1

#: Events stored in a segment are framed as ``[i32 0][u32 length][payload]``.
EVENT_TYPE = 0
EVENT_HEADER_LEN = 8
#: Largest event payload the writers send through the normal append path.
MAX_EVENT_SIZE = 8 * 1024 * 1024

#: AuthTokenCheckFailed.error_code values; any other value panics the Rust client.
AUTH_UNSPECIFIED = -1
AUTH_TOKEN_CHECK_FAILED = 0
AUTH_TOKEN_EXPIRED = 1
#: ErrorMessage.error_code values (Java).
ERROR_UNSPECIFIED = -1
ERROR_ILLEGAL_ARGUMENT = 0

_MASK64 = (1 << 64) - 1
_HEADER = struct.Struct(">ii")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U8 = struct.Struct(">B")
_EVENT_HEADER = struct.Struct(">iI")
_EVENT_HEADER_SIGNED = struct.Struct(">ii")
_KEY_HEADER = struct.Struct(">iI")  # TableKey/TableValue: payload i32, data length u32


# --------------------------------------------------------------------------------------------
# Errors and value types
# --------------------------------------------------------------------------------------------


class ProtocolError(ValueError):
    """The peer sent bytes that are not a valid frame; the connection cannot continue.

    ``decoded`` holds the commands that were decoded from the same ``feed`` call before the bad
    frame, for callers that want to act on them before closing.
    """

    def __init__(self, message: str, decoded: Sequence[Command] = ()) -> None:
        super().__init__(message)
        self.decoded: tuple[Command, ...] = tuple(decoded)


class EventFormatError(ProtocolError):
    """Bytes of an event segment are not a sequence of ``[0][length][payload]`` frames."""


@dataclass(frozen=True, slots=True)
class TableKey:
    """A table-segment key; ``key_version`` is a version, KEY_NO_VERSION or KEY_NOT_EXISTS."""

    data: bytes
    key_version: int = KEY_NO_VERSION


@dataclass(frozen=True, slots=True)
class TableValue:
    """A table-segment value; an empty value means "absent" to the Rust client."""

    data: bytes


@dataclass(frozen=True, slots=True)
class AttributeUpdate:
    """One conditional attribute update of Java's MergeSegments tail (type 1 replace, 4 CAS)."""

    attribute_id: int
    update_type: int
    new_value: int
    old_value: int


TableEntry = tuple[TableKey, TableValue]


class Command:
    """Base of every wire command: a frozen dataclass with ``TYPE`` and fields in wire order."""

    __slots__ = ()
    TYPE: ClassVar[int]
    #: Field kinds in wire order; fields after ``|`` are optional Java tails (None = absent).
    WIRE: ClassVar[str]
    #: True for the error replies of the protocol.
    IS_FAILURE: ClassVar[bool] = False


class Request(Command):
    """A command sent by a client to the segment store."""

    __slots__ = ()


class Reply(Command):
    """A command sent by the segment store to a client."""

    __slots__ = ()


# --------------------------------------------------------------------------------------------
# Codec construction: each command class declares its field kinds, from which a decoder and an
# encoder are built once at import time (consecutive fixed-size fields share one struct call).
# --------------------------------------------------------------------------------------------

_FIXED_FORMATS = {"i32": "i", "i64": "q", "u8": "B", "bool": "B", "u128": "QQ"}
_MIN_SIZES = {
    "i32": 4, "i64": 8, "u8": 1, "bool": 1, "u128": 16, "str": 2, "bytes": 4, "rest": 0,
    "i64s": 4, "entries": 4, "keys": 4, "event": 8, "attrs": 4,
}

DecodeStep = Callable[[memoryview, int, int, list], int]
EncodeStep = Callable[[Command, list], None]


def _short(cmd: str, field: str, need: int, have: int) -> ProtocolError:
    return ProtocolError(
        f"{cmd} payload too short for field {field!r}: needs {need} more bytes, {max(have, 0)} remain"
    )


def _fixed_decoder(cmd: str, names: Sequence[str], kinds: Sequence[str]) -> DecodeStep:
    st = struct.Struct(">" + "".join(_FIXED_FORMATS[k] for k in kinds))
    size = st.size
    unpack_from = st.unpack_from
    plain = all(k in ("i32", "i64", "u8") for k in kinds)
    plan = tuple(zip(names, kinds))

    def fail(pos: int, end: int) -> ProtocolError:
        offset = pos
        for name, kind in plan:
            width = struct.calcsize(">" + _FIXED_FORMATS[kind])
            if end - offset < width:
                return _short(cmd, name, width, end - offset)
            offset += width
        return _short(cmd, names[-1], size, end - pos)  # pragma: no cover - unreachable

    if plain:
        def step(buf: memoryview, pos: int, end: int, out: list) -> int:
            if end - pos < size:
                raise fail(pos, end)
            out.extend(unpack_from(buf, pos))
            return pos + size
        return step

    def step_mixed(buf: memoryview, pos: int, end: int, out: list) -> int:
        if end - pos < size:
            raise fail(pos, end)
        raw = unpack_from(buf, pos)
        i = 0
        for name, kind in plan:
            if kind == "u128":
                out.append((raw[i] << 64) | raw[i + 1])
                i += 2
            elif kind == "bool":
                b = raw[i]
                if b > 1:
                    raise ProtocolError(f"{cmd} field {name!r} is not a bool: byte 0x{b:02x} (only 0 or 1)")
                out.append(b == 1)
                i += 1
            else:
                out.append(raw[i])
                i += 1
        return pos + size

    return step_mixed


def _read_str(cmd: str, name: str, buf: memoryview, pos: int, end: int) -> tuple[str, int]:
    if end - pos < 2:
        raise _short(cmd, name, 2, end - pos)
    (n,) = _U16.unpack_from(buf, pos)
    pos += 2
    if end - pos < n:
        raise _short(cmd, name, n, end - pos)
    try:
        return str(buf[pos:pos + n], "utf-8"), pos + n
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"{cmd} field {name!r} is not valid UTF-8: {exc.reason} at byte {exc.start}") from None


def _read_bytes(cmd: str, name: str, buf: memoryview, pos: int, end: int) -> tuple[bytes, int]:
    if end - pos < 4:
        raise _short(cmd, name, 4, end - pos)
    (n,) = _U32.unpack_from(buf, pos)
    pos += 4
    if end - pos < n:
        raise _short(cmd, name, n, end - pos)
    return bytes(buf[pos:pos + n]), pos + n


def _read_count(cmd: str, name: str, buf: memoryview, pos: int, end: int, item_min: int) -> tuple[int, int]:
    """Reads a u32 list count and refuses counts that cannot fit, before any allocation."""
    if end - pos < 4:
        raise _short(cmd, name, 4, end - pos)
    (n,) = _U32.unpack_from(buf, pos)
    pos += 4
    if n * item_min > end - pos:
        raise ProtocolError(
            f"{cmd} field {name!r} claims {n} items, which cannot fit in the {end - pos} bytes that remain"
        )
    return n, pos


def _read_table_key(cmd: str, name: str, buf: memoryview, pos: int, end: int) -> tuple[TableKey, int]:
    # payload i32 (redundant; ignored on read, like the Rust client), data bytes, key_version i64.
    if end - pos < 4:
        raise _short(cmd, name, 4, end - pos)
    data, pos = _read_bytes(cmd, name, buf, pos + 4, end)
    if end - pos < 8:
        raise _short(cmd, name, 8, end - pos)
    (version,) = _I64.unpack_from(buf, pos)
    return TableKey(data, version), pos + 8


def _read_table_value(cmd: str, name: str, buf: memoryview, pos: int, end: int) -> tuple[TableValue, int]:
    if end - pos < 4:
        raise _short(cmd, name, 4, end - pos)
    data, pos = _read_bytes(cmd, name, buf, pos + 4, end)
    return TableValue(data), pos


def _var_decoder(cmd: str, name: str, kind: str) -> DecodeStep:
    if kind == "str":
        def step(buf, pos, end, out):
            value, pos = _read_str(cmd, name, buf, pos, end)
            out.append(value)
            return pos
    elif kind == "bytes":
        def step(buf, pos, end, out):
            value, pos = _read_bytes(cmd, name, buf, pos, end)
            out.append(value)
            return pos
    elif kind == "rest":
        def step(buf, pos, end, out):
            out.append(bytes(buf[pos:end]))
            return end
    elif kind == "i64s":
        def step(buf, pos, end, out):
            n, pos = _read_count(cmd, name, buf, pos, end, 8)
            out.append(struct.unpack_from(f">{n}q", buf, pos))
            return pos + 8 * n
    elif kind == "keys":
        def step(buf, pos, end, out):
            n, pos = _read_count(cmd, name, buf, pos, end, 16)
            keys = []
            for _ in range(n):
                key, pos = _read_table_key(cmd, name, buf, pos, end)
                keys.append(key)
            out.append(tuple(keys))
            return pos
    elif kind == "entries":
        def step(buf, pos, end, out):
            n, pos = _read_count(cmd, name, buf, pos, end, 24)
            entries = []
            for _ in range(n):
                key, pos = _read_table_key(cmd, name, buf, pos, end)
                value, pos = _read_table_value(cmd, name, buf, pos, end)
                entries.append((key, value))
            out.append(tuple(entries))
            return pos
    elif kind == "event":
        def step(buf, pos, end, out):
            if end - pos < 8:
                raise _short(cmd, name, 8, end - pos)
            type_code, n = _EVENT_HEADER.unpack_from(buf, pos)
            if type_code != EVENT_TYPE:
                raise ProtocolError(f"{cmd} field {name!r} must be an Event (type 0), found type {type_code}")
            pos += 8
            if end - pos < n:
                raise _short(cmd, name, n, end - pos)
            out.append(bytes(buf[pos:pos + n]))
            return pos + n
    elif kind == "attrs":
        item = struct.Struct(">QQBqq")

        def step(buf, pos, end, out):
            n, pos = _read_count(cmd, name, buf, pos, end, item.size)
            updates = []
            for _ in range(n):
                hi, lo, kind_byte, new, old = item.unpack_from(buf, pos)
                updates.append(AttributeUpdate((hi << 64) | lo, kind_byte, new, old))
                pos += item.size
            out.append(tuple(updates))
            return pos
    else:  # pragma: no cover - programming error in a WIRE spec
        raise AssertionError(f"unknown field kind {kind!r}")
    return step


def _optional(step: DecodeStep, min_size: int) -> DecodeStep:
    """Java-style optional tail field: read it when enough bytes remain, else None."""
    def opt(buf, pos, end, out):
        if end - pos >= max(min_size, 1):
            return step(buf, pos, end, out)
        out.append(None)
        return pos
    return opt


def _check_u128(cmd: str, name: str, value: int) -> None:
    if not isinstance(value, int) or not 0 <= value <= (1 << 128) - 1:
        raise ValueError(f"{cmd}.{name} must be an unsigned 128-bit integer, got {value!r}")


def _is_wire_bool(value: object) -> bool:
    return isinstance(value, int) and value in (0, 1)


def _fixed_encoder(cmd: str, names: Sequence[str], kinds: Sequence[str]) -> EncodeStep:
    st = struct.Struct(">" + "".join(_FIXED_FORMATS[k] for k in kinds))
    pack = st.pack
    get = attrgetter(*names)
    plain = all(k in ("i32", "i64", "u8") for k in kinds)
    plan = tuple(zip(names, kinds))

    def explain(values: tuple) -> ValueError:
        for (name, kind), value in zip(plan, values):
            if kind == "u128":
                try:
                    _check_u128(cmd, name, value)
                except ValueError as exc:
                    return exc
                continue
            if kind == "bool":
                if not _is_wire_bool(value):
                    return ValueError(f"{cmd}.{name} must be a bool, got {value!r}")
                continue
            try:
                struct.pack(">" + _FIXED_FORMATS[kind], value)
            except struct.error:
                return ValueError(f"{cmd}.{name} does not fit a {kind}: {value!r}")
        return ValueError(f"{cmd}: cannot encode fields {names}")  # pragma: no cover

    if plain:
        single = len(names) == 1

        def step(obj, parts):
            values = (get(obj),) if single else get(obj)
            try:
                parts.append(pack(*values))
            except struct.error:
                raise explain(values) from None
        return step

    def step_mixed(obj, parts):
        values = get(obj)
        if len(names) == 1:
            values = (values,)
        flat = []
        for (name, kind), value in zip(plan, values):
            if kind == "u128":
                _check_u128(cmd, name, value)
                flat.append(value >> 64)
                flat.append(value & _MASK64)
            elif kind == "bool":
                if _is_wire_bool(value):
                    flat.append(1 if value else 0)
                else:
                    raise ValueError(f"{cmd}.{name} must be a bool, got {value!r}")
            else:
                flat.append(value)
        try:
            parts.append(pack(*flat))
        except (struct.error, TypeError):
            raise explain(values) from None
    return step_mixed


def _encode_str(cmd: str, name: str, value: str) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"{cmd}.{name} must be a str, got {type(value).__name__}")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{cmd}.{name} cannot be encoded as UTF-8: {exc.reason}") from None
    if len(raw) > 0xFFFF:
        raise ValueError(f"{cmd}.{name} is {len(raw)} bytes of UTF-8; the wire limit is 65535")
    return _U16.pack(len(raw)) + raw


def _bytes_len(cmd: str, name: str, value) -> int:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise ValueError(f"{cmd}.{name} must be bytes, got {type(value).__name__}")
    return value.nbytes if isinstance(value, memoryview) else len(value)


def _encode_key(cmd: str, name: str, key: TableKey, parts: list) -> None:
    if not isinstance(key, TableKey):
        raise ValueError(f"{cmd}.{name} items must be TableKey, got {type(key).__name__}")
    n = _bytes_len(cmd, name, key.data)
    parts.append(_KEY_HEADER.pack(4 + n + 8, n))
    parts.append(key.data)
    try:
        parts.append(_I64.pack(key.key_version))
    except struct.error:
        raise ValueError(f"{cmd}.{name} key_version does not fit an i64: {key.key_version!r}") from None


def _encode_value(cmd: str, name: str, value: TableValue, parts: list) -> None:
    if not isinstance(value, TableValue):
        raise ValueError(f"{cmd}.{name} values must be TableValue, got {type(value).__name__}")
    n = _bytes_len(cmd, name, value.data)
    parts.append(_KEY_HEADER.pack(4 + n, n))
    parts.append(value.data)


def _items_of(cmd: str, name: str, value: object) -> tuple:
    """A list field's items; a value that is not a sequence is a ValueError like any bad field."""
    if isinstance(value, (str, bytes, bytearray, memoryview)) or not isinstance(value, Iterable):
        raise ValueError(f"{cmd}.{name} must be a sequence, got {type(value).__name__}")
    return tuple(value)


def _var_encoder(cmd: str, name: str, kind: str) -> EncodeStep:
    get = attrgetter(name)
    if kind == "str":
        def step(obj, parts):
            parts.append(_encode_str(cmd, name, get(obj)))
    elif kind == "bytes":
        def step(obj, parts):
            value = get(obj)
            parts.append(_U32.pack(_bytes_len(cmd, name, value)))
            parts.append(value)
    elif kind == "rest":
        def step(obj, parts):
            value = get(obj)
            _bytes_len(cmd, name, value)
            parts.append(value)
    elif kind == "i64s":
        def step(obj, parts):
            values = _items_of(cmd, name, get(obj))
            try:
                parts.append(struct.pack(f">I{len(values)}q", len(values), *values))
            except struct.error:
                raise ValueError(f"{cmd}.{name} must be a sequence of i64, got {values!r}") from None
    elif kind == "keys":
        def step(obj, parts):
            keys = _items_of(cmd, name, get(obj))
            parts.append(_U32.pack(len(keys)))
            for key in keys:
                _encode_key(cmd, name, key, parts)
    elif kind == "entries":
        def step(obj, parts):
            entries = _items_of(cmd, name, get(obj))
            parts.append(_U32.pack(len(entries)))
            for entry in entries:
                try:
                    key, value = entry
                except (TypeError, ValueError):
                    raise ValueError(f"{cmd}.{name} items must be (TableKey, TableValue) pairs") from None
                _encode_key(cmd, name, key, parts)
                _encode_value(cmd, name, value, parts)
    elif kind == "event":
        def step(obj, parts):
            value = get(obj)
            parts.append(_EVENT_HEADER.pack(EVENT_TYPE, _bytes_len(cmd, name, value)))
            parts.append(value)
    elif kind == "attrs":
        item = struct.Struct(">QQBqq")

        def step(obj, parts):
            updates = _items_of(cmd, name, get(obj))
            parts.append(_U32.pack(len(updates)))
            for u in updates:
                if not isinstance(u, AttributeUpdate):
                    raise ValueError(f"{cmd}.{name} items must be AttributeUpdate, got {type(u).__name__}")
                _check_u128(cmd, name, u.attribute_id)
                try:
                    parts.append(item.pack(u.attribute_id >> 64, u.attribute_id & _MASK64,
                                           u.update_type, u.new_value, u.old_value))
                except struct.error:
                    raise ValueError(f"{cmd}.{name} has an out-of-range AttributeUpdate: {u!r}") from None
    else:  # pragma: no cover - programming error in a WIRE spec
        raise AssertionError(f"unknown field kind {kind!r}")
    return step


#: Java's defaults for optional tail fields, written when a tail is encoded with some fields unset.
_TAIL_DEFAULTS = {"bool": False, "i32": 0, "i64": 0, "u8": 0, "attrs": (), "str": "", "bytes": b""}


class _Codec:
    __slots__ = ("cls", "decode_steps", "encode_steps", "tail_encoders", "tail_kinds", "tail_names")

    def __init__(self, cls: type) -> None:
        self.cls = cls
        names = [f.name for f in fields(cls)]
        spec = cls.WIRE.split("|")
        if len(spec) > 2:  # pragma: no cover - programming error in a WIRE spec
            raise AssertionError(f"{cls.__name__}.WIRE has more than one '|'")
        required = spec[0].split()
        optional = spec[1].split() if len(spec) == 2 else []
        if len(required) + len(optional) != len(names):  # pragma: no cover
            raise AssertionError(f"{cls.__name__}.WIRE does not match its fields {names}")
        cmd = cls.__name__
        self.decode_steps: list[DecodeStep] = []
        self.encode_steps: list[EncodeStep] = []
        group_names: list[str] = []
        group_kinds: list[str] = []

        def flush() -> None:
            if group_names:
                self.decode_steps.append(_fixed_decoder(cmd, list(group_names), list(group_kinds)))
                self.encode_steps.append(_fixed_encoder(cmd, list(group_names), list(group_kinds)))
                group_names.clear()
                group_kinds.clear()

        for name, kind in zip(names, required):
            if kind in _FIXED_FORMATS:
                group_names.append(name)
                group_kinds.append(kind)
            else:
                flush()
                self.decode_steps.append(_var_decoder(cmd, name, kind))
                self.encode_steps.append(_var_encoder(cmd, name, kind))
        flush()

        self.tail_names = names[len(required):]
        self.tail_kinds = optional
        self.tail_encoders = []
        for name, kind in zip(self.tail_names, optional):
            if kind in _FIXED_FORMATS:
                dec = _fixed_decoder(cmd, [name], [kind])
                enc = _fixed_encoder(cmd, [name], [kind])
            else:
                dec = _var_decoder(cmd, name, kind)
                enc = _var_encoder(cmd, name, kind)
            self.decode_steps.append(_optional(dec, _MIN_SIZES[kind]))
            self.tail_encoders.append(enc)

    def decode(self, buf: memoryview, pos: int, end: int, strict: bool) -> Command:
        out: list = []
        for step in self.decode_steps:
            pos = step(buf, pos, end, out)
        if strict and pos != end:
            raise ProtocolError(f"{self.cls.__name__} payload has {end - pos} unexpected trailing bytes")
        return self.cls(*out)

    def encode_payload(self, obj: Command, parts: list) -> None:
        for step in self.encode_steps:
            step(obj, parts)
        if self.tail_names:
            values = [getattr(obj, n) for n in self.tail_names]
            if any(v is not None for v in values):
                # Java writes every tail field; unset ones get Java's defaults.
                filled = {n: (_TAIL_DEFAULTS[k] if v is None else v)
                          for n, k, v in zip(self.tail_names, self.tail_kinds, values)}
                proxy = _TailProxy(filled)
                for enc in self.tail_encoders:
                    enc(proxy, parts)


class _TailProxy:
    """Attribute view over filled-in tail values, so tail encoders can use attrgetter."""

    def __init__(self, values: dict) -> None:
        self.__dict__.update(values)


_REQUESTS: dict[int, _Codec] = {}
_REPLIES: dict[int, _Codec] = {}
_CODECS: dict[type, _Codec] = {}


def _command(*, request: bool = False, reply: bool = False):
    def register(cls):
        codec = _Codec(cls)
        _CODECS[cls] = codec
        for enabled, table in ((request, _REQUESTS), (reply, _REPLIES)):
            if enabled:
                if cls.TYPE in table:  # pragma: no cover
                    raise AssertionError(f"type code {cls.TYPE} registered twice")
                table[cls.TYPE] = codec
        return cls
    return register


_cmd = dataclass(frozen=True, slots=True)

# --------------------------------------------------------------------------------------------
# Commands sent in both directions
# --------------------------------------------------------------------------------------------


@_command(request=True, reply=True)
@_cmd
class Hello(Request, Reply):
    """First frame on every connection, both ways; the client accepts ``low <= 15 <= high``."""

    TYPE: ClassVar[int] = -127
    WIRE: ClassVar[str] = "i32 i32"
    high_version: int = WIRE_VERSION
    low_version: int = OLDEST_COMPATIBLE_VERSION


@_command(request=True, reply=True)
@_cmd
class KeepAlive(Request, Reply):
    """Empty frame; Java answers one with one. Never send it on a request/response connection."""

    TYPE: ClassVar[int] = 100
    WIRE: ClassVar[str] = ""


# --------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------


@_command(request=True)
@_cmd
class SetupAppend(Request):
    TYPE: ClassVar[int] = 1
    WIRE: ClassVar[str] = "i64 u128 str str"
    request_id: int
    writer_id: int
    segment: str
    delegation_token: str = ""


@_command(request=True)
@_cmd
class AppendBlock(Request):
    """Java clients only: the writer id followed by raw block bytes up to the end of the frame."""

    TYPE: ClassVar[int] = 3
    WIRE: ClassVar[str] = "u128 rest"
    writer_id: int
    data: bytes


@_command(request=True)
@_cmd
class AppendBlockEnd(Request):
    """A block of already-framed events; ``size_of_whole_events`` equals ``len(data)``."""

    TYPE: ClassVar[int] = 4
    WIRE: ClassVar[str] = "u128 i32 bytes i32 i64 i64"
    writer_id: int
    size_of_whole_events: int
    data: bytes
    num_event: int
    last_event_number: int
    request_id: int


@_command(request=True)
@_cmd
class ConditionalAppend(Request):
    """One event appended only at ``expected_offset``; ``event`` is the unframed payload."""

    TYPE: ClassVar[int] = 5
    WIRE: ClassVar[str] = "u128 i64 i64 event i64"
    writer_id: int
    event_number: int
    expected_offset: int
    event: bytes
    request_id: int


@_command(request=True)
@_cmd
class ConditionalBlockEnd(Request):
    """Raw bytes appended only at ``expected_offset`` (byte streams, large-event chunks)."""

    TYPE: ClassVar[int] = 89
    WIRE: ClassVar[str] = "u128 i64 i64 bytes i64"
    writer_id: int
    event_number: int
    expected_offset: int
    data: bytes
    request_id: int


@_command(request=True)
@_cmd
class ReadSegment(Request):
    TYPE: ClassVar[int] = 9
    WIRE: ClassVar[str] = "str i64 i32 str i64"
    segment: str
    offset: int
    suggested_length: int
    delegation_token: str
    request_id: int


@_command(request=True)
@_cmd
class GetSegmentAttribute(Request):
    TYPE: ClassVar[int] = 34
    WIRE: ClassVar[str] = "i64 str u128 str"
    request_id: int
    segment_name: str
    attribute_id: int
    delegation_token: str = ""


@_command(request=True)
@_cmd
class UpdateSegmentAttribute(Request):
    TYPE: ClassVar[int] = 36
    WIRE: ClassVar[str] = "i64 str u128 i64 i64 str"
    request_id: int
    segment_name: str
    attribute_id: int
    new_value: int
    expected_value: int
    delegation_token: str = ""


@_command(request=True)
@_cmd
class GetStreamSegmentInfo(Request):
    TYPE: ClassVar[int] = 11
    WIRE: ClassVar[str] = "i64 str str"
    request_id: int
    segment_name: str
    delegation_token: str = ""


@_command(request=True)
@_cmd
class CreateSegment(Request):
    """``scale_type``: 0 no scaling, 1 KB/s, 2 events/s. Java appends ``rollover_size_bytes``."""

    TYPE: ClassVar[int] = 20
    WIRE: ClassVar[str] = "i64 str i32 u8 str | i64"
    request_id: int
    segment: str
    target_rate: int
    scale_type: int
    delegation_token: str = ""
    rollover_size_bytes: int | None = None


@_command(request=True)
@_cmd
class UpdateSegmentPolicy(Request):
    TYPE: ClassVar[int] = 32
    WIRE: ClassVar[str] = "i64 str i32 u8 str"
    request_id: int
    segment: str
    target_rate: int
    scale_type: int
    delegation_token: str = ""


@_command(request=True)
@_cmd
class SealSegment(Request):
    TYPE: ClassVar[int] = 28
    WIRE: ClassVar[str] = "i64 str str"
    request_id: int
    segment: str
    delegation_token: str = ""


@_command(request=True)
@_cmd
class TruncateSegment(Request):
    TYPE: ClassVar[int] = 38
    WIRE: ClassVar[str] = "i64 str i64 str"
    request_id: int
    segment: str
    truncation_offset: int
    delegation_token: str = ""


@_command(request=True)
@_cmd
class DeleteSegment(Request):
    TYPE: ClassVar[int] = 30
    WIRE: ClassVar[str] = "i64 str str"
    request_id: int
    segment: str
    delegation_token: str = ""


@_command(request=True)
@_cmd
class MergeSegments(Request):
    """Appends ``source`` to ``target``. Java appends a list of conditional attribute updates."""

    TYPE: ClassVar[int] = 58
    WIRE: ClassVar[str] = "i64 str str str | attrs"
    request_id: int
    target: str
    source: str
    delegation_token: str = ""
    attribute_updates: tuple[AttributeUpdate, ...] | None = None


@_command(request=True)
@_cmd
class CreateTransientSegment(Request):
    """Large events: the reply is SegmentCreated carrying the transient segment's name."""

    TYPE: ClassVar[int] = 40
    WIRE: ClassVar[str] = "i64 u128 str str"
    request_id: int
    writer_id: int
    parent_segment: str
    delegation_token: str = ""


@_command(request=True)
@_cmd
class CreateTableSegment(Request):
    """Java appends ``sorted`` (deprecated), ``key_length`` and ``rollover_size_bytes``."""

    TYPE: ClassVar[int] = 70
    WIRE: ClassVar[str] = "i64 str str | bool i32 i64"
    request_id: int
    segment: str
    delegation_token: str = ""
    sorted: bool | None = None
    key_length: int | None = None
    rollover_size_bytes: int | None = None


@_command(request=True)
@_cmd
class DeleteTableSegment(Request):
    TYPE: ClassVar[int] = 71
    WIRE: ClassVar[str] = "i64 str bool str"
    request_id: int
    segment: str
    must_be_empty: bool
    delegation_token: str = ""


@_command(request=True)
@_cmd
class UpdateTableEntries(Request):
    TYPE: ClassVar[int] = 74
    WIRE: ClassVar[str] = "i64 str str entries i64"
    request_id: int
    segment: str
    delegation_token: str
    entries: tuple[TableEntry, ...]
    table_segment_offset: int = NULL_TABLE_SEGMENT_OFFSET


@_command(request=True)
@_cmd
class RemoveTableKeys(Request):
    TYPE: ClassVar[int] = 76
    WIRE: ClassVar[str] = "i64 str str keys i64"
    request_id: int
    segment: str
    delegation_token: str
    keys: tuple[TableKey, ...]
    table_segment_offset: int = NULL_TABLE_SEGMENT_OFFSET


@_command(request=True)
@_cmd
class ReadTable(Request):
    TYPE: ClassVar[int] = 78
    WIRE: ClassVar[str] = "i64 str str keys"
    request_id: int
    segment: str
    delegation_token: str
    keys: tuple[TableKey, ...]


@_command(request=True)
@_cmd
class ReadTableKeys(Request):
    """Rust form; Java's extra iterator arguments after the token are ignored as trailing bytes."""

    TYPE: ClassVar[int] = 83
    WIRE: ClassVar[str] = "i64 str str i32 bytes"
    request_id: int
    segment: str
    delegation_token: str
    suggested_key_count: int
    continuation_token: bytes = b""


@_command(request=True)
@_cmd
class ReadTableEntries(Request):
    """Rust form; Java's extra iterator arguments after the token are ignored as trailing bytes."""

    TYPE: ClassVar[int] = 85
    WIRE: ClassVar[str] = "i64 str str i32 bytes"
    request_id: int
    segment: str
    delegation_token: str
    suggested_entry_count: int
    continuation_token: bytes = b""


@_command(request=True)
@_cmd
class ReadTableEntriesDelta(Request):
    TYPE: ClassVar[int] = 88
    WIRE: ClassVar[str] = "i64 str str i64 i32"
    request_id: int
    segment: str
    delegation_token: str
    from_position: int
    suggested_entry_count: int


# --------------------------------------------------------------------------------------------
# Replies
# --------------------------------------------------------------------------------------------


@_command(reply=True)
@_cmd
class AppendSetup(Reply):
    """``last_event_number`` is NO_EVENT_NUMBER when the writer has nothing in the segment."""

    TYPE: ClassVar[int] = 2
    WIRE: ClassVar[str] = "i64 str u128 i64"
    request_id: int
    segment: str
    writer_id: int
    last_event_number: int


@_command(reply=True)
@_cmd
class DataAppended(Reply):
    TYPE: ClassVar[int] = 7
    WIRE: ClassVar[str] = "u128 i64 i64 i64 i64"
    writer_id: int
    event_number: int
    previous_event_number: int
    request_id: int
    current_segment_write_offset: int


@_command(reply=True)
@_cmd
class ConditionalCheckFailed(Reply):
    TYPE: ClassVar[int] = 8
    WIRE: ClassVar[str] = "u128 i64 i64"
    writer_id: int
    event_number: int
    request_id: int


@_command(reply=True)
@_cmd
class SegmentRead(Reply):
    """``offset`` must echo the request's offset exactly (the Rust client asserts it)."""

    TYPE: ClassVar[int] = 10
    WIRE: ClassVar[str] = "str i64 bool bool bytes i64"
    segment: str
    offset: int
    at_tail: bool
    end_of_segment: bool
    data: bytes
    request_id: int


@_command(reply=True)
@_cmd
class SegmentAttribute(Reply):
    TYPE: ClassVar[int] = 35
    WIRE: ClassVar[str] = "i64 i64"
    request_id: int
    value: int


@_command(reply=True)
@_cmd
class SegmentAttributeUpdated(Reply):
    TYPE: ClassVar[int] = 37
    WIRE: ClassVar[str] = "i64 bool"
    request_id: int
    success: bool


@_command(reply=True)
@_cmd
class StreamSegmentInfo(Reply):
    """``last_modified`` is ms since the epoch; ``write_offset`` the length; ``start_offset`` the head."""

    TYPE: ClassVar[int] = 12
    WIRE: ClassVar[str] = "i64 str bool bool bool i64 i64 i64"
    request_id: int
    segment_name: str
    exists: bool
    is_sealed: bool
    is_deleted: bool
    last_modified: int
    write_offset: int
    start_offset: int


@_command(reply=True)
@_cmd
class SegmentCreated(Reply):
    TYPE: ClassVar[int] = 21
    WIRE: ClassVar[str] = "i64 str"
    request_id: int
    segment: str


@_command(reply=True)
@_cmd
class SegmentPolicyUpdated(Reply):
    TYPE: ClassVar[int] = 33
    WIRE: ClassVar[str] = "i64 str"
    request_id: int
    segment: str


@_command(reply=True)
@_cmd
class SegmentSealed(Reply):
    TYPE: ClassVar[int] = 29
    WIRE: ClassVar[str] = "i64 str"
    request_id: int
    segment: str


@_command(reply=True)
@_cmd
class SegmentDeleted(Reply):
    TYPE: ClassVar[int] = 31
    WIRE: ClassVar[str] = "i64 str"
    request_id: int
    segment: str


@_command(reply=True)
@_cmd
class SegmentTruncated(Reply):
    TYPE: ClassVar[int] = 39
    WIRE: ClassVar[str] = "i64 str"
    request_id: int
    segment: str


@_command(reply=True)
@_cmd
class SegmentsMerged(Reply):
    TYPE: ClassVar[int] = 59
    WIRE: ClassVar[str] = "i64 str str i64"
    request_id: int
    target: str
    source: str
    new_target_write_offset: int


@_command(reply=True)
@_cmd
class TableEntriesUpdated(Reply):
    """One new version per updated entry, in request order (no segment field)."""

    TYPE: ClassVar[int] = 75
    WIRE: ClassVar[str] = "i64 i64s"
    request_id: int
    updated_versions: tuple[int, ...]


@_command(reply=True)
@_cmd
class TableKeysRemoved(Reply):
    TYPE: ClassVar[int] = 77
    WIRE: ClassVar[str] = "i64 str"
    request_id: int
    segment: str


@_command(reply=True)
@_cmd
class TableRead(Reply):
    TYPE: ClassVar[int] = 79
    WIRE: ClassVar[str] = "i64 str entries"
    request_id: int
    segment: str
    entries: tuple[TableEntry, ...]


@_command(reply=True)
@_cmd
class TableKeysRead(Reply):
    TYPE: ClassVar[int] = 84
    WIRE: ClassVar[str] = "i64 str keys bytes"
    request_id: int
    segment: str
    keys: tuple[TableKey, ...]
    continuation_token: bytes


@_command(reply=True)
@_cmd
class TableEntriesRead(Reply):
    TYPE: ClassVar[int] = 86
    WIRE: ClassVar[str] = "i64 str entries bytes"
    request_id: int
    segment: str
    entries: tuple[TableEntry, ...]
    continuation_token: bytes


@_command(reply=True)
@_cmd
class TableEntriesDeltaRead(Reply):
    """A non-empty reply must advance ``last_position`` or the Rust client loops forever."""

    TYPE: ClassVar[int] = 87
    WIRE: ClassVar[str] = "i64 str entries bool bool i64"
    request_id: int
    segment: str
    entries: tuple[TableEntry, ...]
    should_clear: bool
    reached_end: bool
    last_position: int


# --------------------------------------------------------------------------------------------
# Error replies
# --------------------------------------------------------------------------------------------


@_command(reply=True)
@_cmd
class WrongHost(Reply):
    TYPE: ClassVar[int] = 50
    IS_FAILURE: ClassVar[bool] = True
    WIRE: ClassVar[str] = "i64 str str str"
    request_id: int
    segment: str
    correct_host: str
    server_stack_trace: str = ""


@_command(reply=True)
@_cmd
class SegmentIsSealed(Reply):
    TYPE: ClassVar[int] = 51
    IS_FAILURE: ClassVar[bool] = True
    WIRE: ClassVar[str] = "i64 str str i64"
    request_id: int
    segment: str
    server_stack_trace: str
    offset: int


@_command(reply=True)
@_cmd
class SegmentAlreadyExists(Reply):
    TYPE: ClassVar[int] = 52
    IS_FAILURE: ClassVar[bool] = True
    WIRE: ClassVar[str] = "i64 str str"
    request_id: int
    segment: str
    server_stack_trace: str = ""


@_command(reply=True)
@_cmd
class NoSuchSegment(Reply):
    TYPE: ClassVar[int] = 53
    IS_FAILURE: ClassVar[bool] = True
    WIRE: ClassVar[str] = "i64 str str i64"
    request_id: int
    segment: str
    server_stack_trace: str
    offset: int


@_command(reply=True)
@_cmd
class InvalidEventNumber(Reply):
    """Java's second field is the request id (Rust calls it event_number); Java adds the event number.

    The Rust writer ignores this reply and hangs, so a server must never send it.
    """

    TYPE: ClassVar[int] = 55
    IS_FAILURE: ClassVar[bool] = True
    WIRE: ClassVar[str] = "u128 i64 str | i64"
    writer_id: int
    request_id: int
    server_stack_trace: str = ""
    event_number: int | None = None


@_command(reply=True)
@_cmd
class SegmentIsTruncated(Reply):
    TYPE: ClassVar[int] = 56
    IS_FAILURE: ClassVar[bool] = True
    WIRE: ClassVar[str] = "i64 str i64 str i64"
    request_id: int
    segment: str
    start_offset: int
    server_stack_trace: str
    offset: int


@_command(reply=True)
@_cmd
class OperationUnsupported(Reply):
    TYPE: ClassVar[int] = 57
    IS_FAILURE: ClassVar[bool] = True
    WIRE: ClassVar[str] = "i64 str str"
    request_id: int
    operation_name: str
    server_stack_trace: str = ""


@_command(reply=True)
@_cmd
class AuthTokenCheckFailed(Reply):
    """``error_code`` must be -1, 0 or 1: any other value panics the Rust client."""

    TYPE: ClassVar[int] = 60
    IS_FAILURE: ClassVar[bool] = True
    WIRE: ClassVar[str] = "i64 str i32"
    request_id: int
    server_stack_trace: str
    error_code: int


@_command(reply=True)
@_cmd
class ErrorMessage(Reply):
    TYPE: ClassVar[int] = 61
    IS_FAILURE: ClassVar[bool] = True
    WIRE: ClassVar[str] = "i64 str str i32"
    request_id: int
    segment: str
    message: str
    error_code: int = ERROR_UNSPECIFIED


@_command(reply=True)
@_cmd
class TableSegmentNotEmpty(Reply):
    TYPE: ClassVar[int] = 80
    IS_FAILURE: ClassVar[bool] = True
    WIRE: ClassVar[str] = "i64 str str"
    request_id: int
    segment: str
    server_stack_trace: str = ""


@_command(reply=True)
@_cmd
class TableKeyDoesNotExist(Reply):
    TYPE: ClassVar[int] = 81
    IS_FAILURE: ClassVar[bool] = True
    WIRE: ClassVar[str] = "i64 str str"
    request_id: int
    segment: str
    server_stack_trace: str = ""


@_command(reply=True)
@_cmd
class TableKeyBadVersion(Reply):
    TYPE: ClassVar[int] = 82
    IS_FAILURE: ClassVar[bool] = True
    WIRE: ClassVar[str] = "i64 str str"
    request_id: int
    segment: str
    server_stack_trace: str = ""


#: Type code -> command class, per direction.
REQUEST_TYPES: dict[int, type] = {code: codec.cls for code, codec in _REQUESTS.items()}
REPLY_TYPES: dict[int, type] = {code: codec.cls for code, codec in _REPLIES.items()}
_ANY: dict[int, _Codec] = {**_REPLIES, **_REQUESTS}

__all__ += [cls.__name__ for cls in _CODECS]

# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------


def encode(cmd: Command, *, max_frame: int = MAX_FRAME) -> bytes:
    """Returns the whole frame (type, length, payload) for ``cmd``.

    Raises ValueError naming the field when a value does not fit its wire type, and when the
    payload would exceed ``max_frame`` (the peer would drop the connection).
    """
    codec = _CODECS.get(type(cmd))
    if codec is None:
        raise ValueError(f"not a wire command: {type(cmd).__name__}")
    parts: list = [b""]
    codec.encode_payload(cmd, parts)
    length = sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in parts)
    if length > max_frame:
        raise ValueError(
            f"{type(cmd).__name__} payload is {length} bytes, over the {max_frame}-byte frame limit"
        )
    parts[0] = _HEADER.pack(cmd.TYPE, length)
    return b"".join(parts)


def encode_many(cmds: Iterable[Command], *, max_frame: int = MAX_FRAME) -> bytes:
    """Concatenated frames, e.g. to write several replies with one socket call."""
    return b"".join(encode(c, max_frame=max_frame) for c in cmds)


def request_id_of(cmd: Command) -> int:
    """The request id the Rust client matches replies by: Hello counts as 0, KeepAlive as -1."""
    if isinstance(cmd, Hello):
        return 0
    if isinstance(cmd, KeepAlive):
        return -1
    request_id = getattr(cmd, "request_id", None)
    if request_id is None:
        raise ValueError(f"{type(cmd).__name__} carries no request id (it is part of an append block, not a request)")
    return request_id


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------

Direction = Literal["request", "reply"]


def _table_for(direction: Direction | None) -> dict[int, _Codec]:
    if direction == "request":
        return _REQUESTS
    if direction == "reply":
        return _REPLIES
    if direction is None:
        return _ANY
    raise ValueError(f"direction must be 'request' or 'reply', got {direction!r}")


def decode_frame(
    type_code: int,
    payload: bytes | bytearray | memoryview,
    direction: Direction | None = None,
    *,
    strict: bool = False,
) -> Command:
    """Decodes one payload whose type code was read from a frame header.

    Only Hello and KeepAlive share a code between directions (same class), so ``direction`` is
    optional. With ``strict`` trailing bytes are an error; by default they are ignored, as the Rust
    client and the Java server both do (that is how newer optional fields stay compatible).
    """
    codec = _table_for(direction).get(type_code)
    if codec is None:
        where = f" for direction {direction!r}" if direction else ""
        raise ProtocolError(f"unknown wire command type code {type_code}{where}")
    with memoryview(payload) as mv:
        if mv.ndim != 1 or mv.itemsize != 1:
            mv = mv.cast("B")
        return codec.decode(mv, 0, mv.nbytes, strict)


class FrameDecoder:
    """Incremental frame decoder for one connection direction.

    ``feed`` accepts any chunking (down to single bytes) and returns the commands completed by it.
    The frame header is validated as soon as it is complete, before its payload is buffered, so a
    peer cannot make the buffer grow past one frame of ``max_frame`` bytes plus what one ``feed``
    call supplies. Any ProtocolError leaves the decoder dead: the connection must be closed.

    A frame of at least :data:`LARGE_FRAME` bytes (a segment read's reply) is assembled in a buffer
    of its own size, allocated once its header is in, instead of being grown by appends; a
    connection can receive straight into that buffer (:meth:`frame_space`, then :meth:`filled`),
    so the bytes are not copied again on their way in.
    """

    __slots__ = ("_buf", "_direction", "_error", "_filled", "_frame", "_max_frame", "_strict", "_table")

    def __init__(self, direction: Direction, max_frame: int = MAX_FRAME, *, strict: bool = False) -> None:
        if direction not in ("request", "reply"):
            raise ValueError(f"direction must be 'request' or 'reply', got {direction!r}")
        if not 0 <= max_frame <= 0x7FFF_FFFF:
            raise ValueError(f"max_frame must be within 0..2**31-1, got {max_frame}")
        self._table = _table_for(direction)
        self._direction = direction
        self._max_frame = max_frame
        self._strict = strict
        self._buf = bytearray()
        self._frame: bytearray | None = None  # a large frame being assembled
        self._filled = 0  # its bytes received so far
        self._error: str | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for a frame that is not complete yet."""
        return self._filled if self._frame is not None else len(self._buf)

    @property
    def failed(self) -> bool:
        return self._error is not None

    def frame_space(self) -> memoryview | None:
        """The part of the large frame being assembled that is still to come (None when no large
        frame is under way): receive into it, then report the bytes with :meth:`filled`."""
        if self._frame is None or self._error is not None:
            return None
        return memoryview(self._frame)[self._filled:]

    def filled(self, n: int) -> list[Command]:
        """``n`` bytes were received into :meth:`frame_space`: the commands this completes."""
        if self._frame is None or not 0 <= n <= len(self._frame) - self._filled:
            raise ValueError(f"filled({n}) does not match the space of the frame under way")
        self._filled += n
        if self._filled < len(self._frame):
            return []
        return self.feed(b"")

    def feed(self, data: bytes | bytearray | memoryview) -> list[Command]:
        if self._error is not None:
            raise ProtocolError(f"frame decoder is unusable after an earlier error: {self._error}")
        out: list[Command] = []
        try:
            with memoryview(data) as mv:
                if mv.ndim != 1 or mv.itemsize != 1:
                    mv = mv.cast("B")
                if self._frame is not None:
                    mv = self._fill_frame(mv, out)
                    if mv is None:
                        return out
                if not self._buf:
                    # Fast path: decode straight from the caller's bytes, keep only the incomplete tail.
                    used = self._drain(mv, 0, mv.nbytes, out)
                    self._keep(mv[used:])
                else:
                    self._buf += mv
                    with memoryview(self._buf) as held:
                        used = self._drain(held, 0, held.nbytes, out)
                        rest = bytes(held[used:]) if self._is_large(held[used:]) else None
                    if rest is not None:
                        self._buf = bytearray()
                        self._keep(memoryview(rest))
                    elif used:
                        del self._buf[:used]
        except ProtocolError as exc:
            self._error = str(exc)
            self._buf = bytearray()
            self._frame = None
            raise ProtocolError(str(exc), out) from None
        return out

    def _is_large(self, tail: memoryview) -> bool:
        """Whether ``tail`` (what a drain left) starts a frame of at least LARGE_FRAME bytes whose
        header is in (the drain has checked that header)."""
        return tail.nbytes >= 8 and 8 + _HEADER.unpack_from(tail, 0)[1] >= LARGE_FRAME

    def _keep(self, tail: memoryview) -> None:
        """Hold the incomplete frame ``tail``: in a buffer of the frame's size when it is large."""
        if not tail.nbytes:
            return
        if self._is_large(tail):
            self._frame = bytearray(8 + _HEADER.unpack_from(tail, 0)[1])
            self._frame[: tail.nbytes] = tail
            self._filled = tail.nbytes
        else:
            self._buf += tail

    def _fill_frame(self, mv: memoryview, out: list) -> memoryview | None:
        """Copy the head of ``mv`` into the large frame under way; once it is complete, decode it
        into ``out`` and return the rest of ``mv`` (None while the frame still waits for bytes)."""
        frame = self._frame
        assert frame is not None
        take = min(len(frame) - self._filled, mv.nbytes)
        frame[self._filled: self._filled + take] = mv[:take]
        self._filled += take
        if self._filled < len(frame):
            return None
        self._frame, self._filled = None, 0
        with memoryview(frame) as whole:
            self._drain(whole, 0, whole.nbytes, out)
        return mv[take:]

    def _drain(self, mv: memoryview, pos: int, end: int, out: list) -> int:
        table = self._table
        max_frame = self._max_frame
        strict = self._strict
        unpack_header = _HEADER.unpack_from
        while end - pos >= 8:
            type_code, length = unpack_header(mv, pos)
            codec = table.get(type_code)
            if codec is None:
                raise ProtocolError(f"unknown wire command type code {type_code} for direction {self._direction!r}")
            if length < 0:
                raise ProtocolError(f"negative frame length {length} for type code {type_code}")
            if length > max_frame:
                raise ProtocolError(
                    f"frame length {length} for type code {type_code} exceeds the {max_frame}-byte limit"
                )
            start = pos + 8
            if end - start < length:
                break
            out.append(codec.decode(mv, start, start + length, strict))
            pos = start + length
        return pos


# --------------------------------------------------------------------------------------------
# Events inside segment data
# --------------------------------------------------------------------------------------------


def frame_event(payload: bytes | bytearray | memoryview) -> bytes:
    """``[i32 0][u32 length][payload]``: how writers store one event in a segment."""
    n = payload.nbytes if isinstance(payload, memoryview) else len(payload)
    if n > 0x7FFF_FFFF:
        raise ValueError(f"event payload of {n} bytes does not fit the i32 length of an event frame")
    return _EVENT_HEADER.pack(EVENT_TYPE, n) + bytes(payload)


@dataclass(frozen=True, slots=True)
class SegmentEvent:
    """One event found in segment data: ``offset`` is where its 8-byte header starts."""

    offset: int
    payload: bytes

    @property
    def end_offset(self) -> int:
        """Segment offset just past this event (where the next one starts)."""
        return self.offset + EVENT_HEADER_LEN + len(self.payload)


def _scan_events(
    mv: memoryview, pos: int, end: int, base: int, max_event_size: int | None, out: list
) -> int:
    unpack = _EVENT_HEADER_SIGNED.unpack_from
    while end - pos >= EVENT_HEADER_LEN:
        type_code, n = unpack(mv, pos)
        if type_code != EVENT_TYPE:
            raise EventFormatError(
                f"expected an event header (type 0) at segment offset {base + pos}, found type {type_code}"
            )
        if n < 0:
            raise EventFormatError(f"negative event length {n} at segment offset {base + pos}")
        if max_event_size is not None and n > max_event_size:
            raise EventFormatError(
                f"event at segment offset {base + pos} claims {n} bytes, over the {max_event_size}-byte limit"
            )
        start = pos + EVENT_HEADER_LEN
        if end - start < n:
            break
        out.append(SegmentEvent(base + pos, bytes(mv[start:start + n])))
        pos = start + n
    return pos


def split_events(
    buf: bytes | bytearray | memoryview, base_offset: int = 0, *, max_event_size: int | None = None
) -> tuple[list[SegmentEvent], int]:
    """Splits bytes read from an event segment at ``base_offset`` into events.

    Returns ``(events, next_offset)``: ``next_offset`` is the segment offset of the first byte not
    consumed, i.e. the start of an incomplete trailing event (or the end of ``buf``). Raises
    EventFormatError on a header whose type is not 0 or whose length is negative or too large.
    """
    out: list[SegmentEvent] = []
    with memoryview(buf) as mv:
        if mv.ndim != 1 or mv.itemsize != 1:
            mv = mv.cast("B")
        used = _scan_events(mv, 0, mv.nbytes, base_offset, max_event_size, out)
    return out, base_offset + used


def iter_events(
    buf: bytes | bytearray | memoryview, base_offset: int = 0, *, max_event_size: int | None = None
):
    """Yields the complete events of ``buf``; an incomplete tail starts at the last ``end_offset``."""
    events, _ = split_events(buf, base_offset, max_event_size=max_event_size)
    yield from events


class EventParser:
    """Streaming event splitter for sequential reads of one segment (reads may split events)."""

    __slots__ = ("_buf", "_max", "_offset")

    def __init__(self, offset: int = 0, *, max_event_size: int | None = None) -> None:
        self._offset = offset  # segment offset of self._buf[0]
        self._buf = bytearray()
        self._max = max_event_size

    @property
    def offset(self) -> int:
        """Segment offset where the next (possibly partial) event starts."""
        return self._offset

    @property
    def next_read_offset(self) -> int:
        """Segment offset to read from next (just past the buffered bytes)."""
        return self._offset + len(self._buf)

    @property
    def pending(self) -> int:
        """Bytes of an incomplete event held back."""
        return len(self._buf)

    @property
    def at_boundary(self) -> bool:
        """True when no partial event is buffered."""
        return not self._buf

    def feed(self, data: bytes | bytearray | memoryview) -> list[SegmentEvent]:
        out: list[SegmentEvent] = []
        if not self._buf:
            with memoryview(data) as mv:
                if mv.ndim != 1 or mv.itemsize != 1:
                    mv = mv.cast("B")
                used = _scan_events(mv, 0, mv.nbytes, self._offset, self._max, out)
                if used < mv.nbytes:
                    self._buf += mv[used:]
        else:
            self._buf += data
            with memoryview(self._buf) as mv:
                used = _scan_events(mv, 0, mv.nbytes, self._offset, self._max, out)
            if used:
                del self._buf[:used]
        self._offset += used
        return out
