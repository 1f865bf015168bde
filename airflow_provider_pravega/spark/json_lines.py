"""The check of a jsonl record: one JSON object, as RFC 8259 defines JSON text, in UTF-8.

Spark's JSON functions are lenient (single quotes, unescaped control characters, text after the
value, bytes that are not UTF-8), so a line they accept may be one no strict reader of the stream
can decode. The ingest checks each line here, where its lines are split, with a strict parser;
Spark's functions only pick fields out of lines that passed."""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

#: How deep the check follows nesting, about as deep as Spark's own JSON parser goes: explicit, so
#: that no Python version's recursion limit decides what is accepted.
MAX_DEPTH = 1_000
DEPTH_NOTE = "deeper than the check follows (about 1,000 levels, as Spark's JSON parser)"


def may_nest_too_deep(line: bytes) -> bool:
    """Whether ``line`` holds enough brackets to nest deeper than :data:`MAX_DEPTH` (a cheap test
    before the exact one)."""
    return line.count(b"[") + line.count(b"{") > MAX_DEPTH

_DECODE = msgspec.json.Decoder().decode


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


#: The exact check for the rare line whose numbers are beyond what the fast parser converts: every
#: number kept as text, so no length or range limit applies.
_EXACT = json.JSONDecoder(parse_int=str, parse_float=str, parse_constant=_no_constant)


def json_line_problem(line: bytes) -> str | None:
    """Why ``line`` (without its line end) is not one JSON object, or None when it is one. A line of
    spaces only is not a record (the ingest skips it): None."""
    if may_nest_too_deep(line) and (depth := _depth(line)) > MAX_DEPTH:
        return f"JSON nested {depth} levels deep, {DEPTH_NOTE}"
    try:
        value = _DECODE(line)
    except msgspec.ValidationError:  # valid so far, but a number the fast parser cannot convert
        return _exact_problem(line)
    except msgspec.DecodeError as exc:
        if not line.strip(b" "):
            return None
        return _syntax_problem(line, str(exc))
    except RecursionError:
        return f"JSON nested {_depth(line)} levels deep, {DEPTH_NOTE}"
    return None if isinstance(value, dict) else "not a JSON object"


def _syntax_problem(line: bytes, message: str) -> str:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not valid UTF-8 (byte 0x{line[exc.start]:02x} at byte {exc.start} of the line)"
    message = message.removeprefix("JSON is malformed: ")
    if message == "Input data was truncated":
        return "not valid JSON (the line ends inside a value)"
    found = re.fullmatch(r"(.*) \(byte (\d+)\)", message)
    if found is None:
        return f"not valid JSON ({message})"
    what, at = found.group(1), int(found.group(2))
    if at < len(line) and line[at] < 0x20:
        what = f"unescaped control character 0x{line[at]:02x}"
    return f"not valid JSON ({what}, near byte {at} of the line)"


def _exact_problem(line: bytes) -> str | None:
    try:
        value = _EXACT.decode(line.decode("utf-8"))
    except RecursionError:
        return f"JSON nested {_depth(line)} levels deep, {DEPTH_NOTE}"
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a NaN: all ValueErrors
        if isinstance(exc, UnicodeDecodeError):
            return _syntax_problem(line, str(exc))
        return f"not valid JSON ({getattr(exc, 'msg', str(exc))})"
    return None if isinstance(value, dict) else "not a JSON object"


class JsonNumber:
    """A number as its source text: what the exact parser keeps a number as, so that a field
    holding one is written as it was (a number beyond the fast parser's range)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


_FIELDS = json.JSONDecoder(parse_int=JsonNumber, parse_float=JsonNumber, parse_constant=_no_constant)


def exact_fields(line: bytes, *fields: str | None) -> list[Any]:
    """The values of top-level ``fields`` (None for a field not asked for, or absent) of a line
    :func:`json_line_problem` accepted, by the exact parser: numbers as :class:`JsonNumber`."""
    value = _FIELDS.decode(line.decode("utf-8"))
    return [value.get(f) if f else None for f in fields]


def _depth(line: bytes) -> int:
    """The deepest nesting of ``line``'s arrays and objects, outside strings (only on errors)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in line:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest
