"""The events of a piece of a line file: its lines split, checked and turned into (payload, routing
key) in the write task that holds the file's bytes, in one pass and without Spark's JSON functions.

A jsonl line is checked by one strict decode that also takes the fields the event needs (msgspec,
in C, one call a line), and the piece's bytes are checked as UTF-8 once; a line that fails either
is explained by the exact check of :mod:`airflow_provider_pravega.spark.json_lines`. Spark's JSON
functions would accept what no strict reader of the stream can decode, and taking the key in the
JVM sends every line across to Python and back again.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import msgspec

from airflow_provider_pravega.protocol.wire import MAX_EVENT_SIZE
from airflow_provider_pravega.spark.json_lines import (
    MAX_DEPTH, JsonNumber, exact_fields, json_line_problem, may_nest_too_deep,
)


@dataclass
class LineEvents:
    """What a piece holds: ``payloads`` (and ``keys``, with a routing key field) of its records in
    line order, or the first bad record as ``bad`` (line number in the file, reason)."""

    payloads: list[bytes]
    keys: list[str] | None
    bad: tuple[int, str] | None = None


def too_big(size: int) -> str:
    return f"an event of {size} bytes is over Pravega's {MAX_EVENT_SIZE}-byte (8 MiB) event limit"


def no_field(field: str, what: str = "routing key field") -> str:
    return f"no {what} {field!r}"


_KEY, _PAYLOAD = operator.attrgetter("k"), operator.attrgetter("p")  # a decoded line's fields


class FieldReader:
    """Takes the routing key field and the payload field out of jsonl lines (top-level fields, as
    the docs say), checking each line strictly as it goes."""

    def __init__(self, key_field: str | None, payload_field: str | None) -> None:
        self.key_field, self.payload_field = key_field, payload_field
        fields = [("k", Any, None)] if key_field else []
        fields += [("p", Any, None)] if payload_field else []
        rename = {"k": key_field, "p": payload_field}
        self._decode = msgspec.json.Decoder(msgspec.defstruct(
            "Fields", fields, rename={a: rename[a] for a, *_ in fields}, forbid_unknown_fields=False)).decode

    def read(self, lines: list[bytes], first_line: int, numbers: list[int] | None = None) -> LineEvents:
        """``lines``: the records (no blank line), the i-th being line ``numbers[i]`` of the file
        (``first_line + i`` when ``numbers`` is None)."""
        decode = self._decode
        try:
            values = [decode(x) for x in lines]
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            values = None
        if values is None:  # a line the fast decode refused: the exact check names it (or accepts it)
            return self._exactly(lines, first_line, numbers)
        keys = payloads = None
        found: list[tuple[int, int, str]] = []  # (line index, precedence, reason): the first is reported
        if self.key_field:
            keys = list(map(_KEY, values))
            if set(map(type, keys)) != {str}:
                keys = _texts(keys)
                if None in keys:
                    found.append((keys.index(None), 0, no_field(self.key_field)))
        if self.payload_field:
            texts = list(map(_PAYLOAD, values))
            if set(map(type, texts)) != {str}:
                texts = _texts(texts)
                if None in texts:
                    found.append((texts.index(None), 1, no_field(self.payload_field, "payload field")))
                    texts = [p or "" for p in texts]
            payloads = [p.encode() for p in texts]
            big = (next(i for i, p in enumerate(payloads) if len(p) > MAX_EVENT_SIZE)
                   if max(map(len, payloads), default=0) > MAX_EVENT_SIZE else None)
            if big is not None:
                found.append((big, 2, too_big(len(payloads[big]))))
        if found:
            i, _, why = min(found)
            return self._bad(i, first_line, numbers, why)
        return LineEvents(payloads if payloads is not None else lines, keys)

    def _bad(self, i: int, first_line: int, numbers: list[int] | None, why: str) -> LineEvents:
        return LineEvents([], None, (numbers[i] if numbers is not None else first_line + i, why))

    def _exactly(self, lines: list[bytes], first_line: int, numbers: list[int] | None) -> LineEvents:
        """Line by line: the first line that is not a JSON object says why; lines the fast decode
        refused but are JSON objects (numbers beyond its range) are read by the exact parser."""
        keys: list[str] = []
        payloads: list[bytes] = []
        for i, line in enumerate(lines):
            problem = json_line_problem(line)
            if problem is not None:
                return self._bad(i, first_line, numbers, problem)
            try:
                value = self._decode(line)
                key = value.k if self.key_field else None
                payload = value.p if self.payload_field else None
            except (msgspec.ValidationError, RecursionError):
                key, payload = exact_fields(line, self.key_field, self.payload_field)
            for field, got, what in ((self.key_field, key, "routing key field"),
                                     (self.payload_field, payload, "payload field")):
                if field and _text(got) is None:
                    return self._bad(i, first_line, numbers, no_field(field, what))
            if self.key_field:
                keys.append(_text(key))
            if self.payload_field:
                data = _text(payload).encode()
                if len(data) > MAX_EVENT_SIZE:
                    return self._bad(i, first_line, numbers, too_big(len(data)))
                payloads.append(data)
            else:
                payloads.append(line)
        return LineEvents(payloads, keys if self.key_field else None)


def _text(value: Any) -> str | None:
    """A field's value as the text an event or a routing key holds: a string as it is, anything
    else as its JSON text (as Spark's ``get_json_object`` gives it); None when absent or null."""
    if value is None or type(value) is str:
        return value
    if isinstance(value, JsonNumber):
        return value.text
    return msgspec.json.encode(value, enc_hook=_raw_number).decode()


def _raw_number(value: Any) -> msgspec.Raw:
    if isinstance(value, JsonNumber):
        return msgspec.Raw(value.text.encode())
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def _texts(values: list[Any]) -> list[str | None]:
    return [_text(v) for v in values]


def split_lines(data: bytes | memoryview, first_line: int) -> tuple[list[bytes], list[int] | None]:
    """The records of ``data`` (whole lines; LF or CR LF), without their line ends, and their line
    numbers when some lines are blank (none, or spaces only: not records); None means they are
    numbered consecutively from ``first_line``."""
    data = bytes(data)  # no copy when it is bytes already
    lines = data.split(b"\n")
    if data.endswith(b"\n") or not data:
        lines.pop()  # after the last line end: nothing
    if b"\r" in data:
        lines = [x[:-1] if x.endswith(b"\r") else x for x in lines]
    # A line of spaces only begins with a space: unless one does, only empty lines can be blank.
    if b"" in lines or ((data.startswith(b" ") or b"\n " in data) and any(not x.strip(b" ") for x in lines)):
        numbers = [first_line + i for i, x in enumerate(lines) if x.strip(b" ")]
        return [x for x in lines if x.strip(b" ")], numbers
    return lines, None


def piece_events(data: bytes | memoryview, first_line: int, reader: FieldReader | None) -> LineEvents:
    """The events of the whole lines in ``data``, whose first line is line ``first_line`` of its
    file: jsonl with a ``reader``, text lines without one. A line is its event whole unless the
    reader takes a payload field; an event over Pravega's limit is a bad record."""
    data = bytes(data)
    lines, numbers = split_lines(data, first_line)
    if reader is None or not reader.payload_field:
        big = (next(i for i, x in enumerate(lines) if len(x) > MAX_EVENT_SIZE)
               if len(data) > MAX_EVENT_SIZE and max(map(len, lines), default=0) > MAX_EVENT_SIZE else None)
        if big is not None:  # a whole-line event: its size is the first thing wrong with it
            return LineEvents([], None, (numbers[big] if numbers is not None else first_line + big,
                                         too_big(len(lines[big]))))
    if reader is None:
        return LineEvents(lines, None)
    try:
        str(data, "utf-8")  # every byte checked once, in C (the decode below skips unread fields)
    except UnicodeDecodeError:
        return reader._exactly(lines, first_line, numbers)
    if _a_line_may_nest_too_deep(data, lines):
        return reader._exactly(lines, first_line, numbers)  # the nesting limit is the exact check's
    return reader.read(lines, first_line, numbers)


def _a_line_may_nest_too_deep(data: bytes, lines: list[bytes]) -> bool:
    """Whether a line of ``data`` may nest deeper than the check follows: the cheap tests first
    (the longest line, then the whole piece's brackets), so a piece of short lines is neither
    scanned for brackets nor looked at line by line (a line needs more bytes than the limit to
    hold that many brackets)."""
    if max(map(len, lines), default=0) <= MAX_DEPTH or not may_nest_too_deep(data):
        return False
    return any(may_nest_too_deep(x) for x in lines if len(x) > MAX_DEPTH)
