"""The events of a line piece (spark/line_events.py): the fast read in a write task gives exactly
what the line-by-line exact check gives, on good and bad lines alike. No Spark: the kernel is pure."""

from __future__ import annotations

import json
import sys

import pytest

from airflow_provider_pravega.spark.json_lines import DEPTH_NOTE
from airflow_provider_pravega.spark.line_events import FieldReader, LineEvents, piece_events, split_lines

GOOD = [
    b'{"k":"a","v":1}',
    b'{"k":17,"v":[1,2.5,{"x":null}]}',
    b'{"k":"\\u00e9\\n","v":"caf\xc3\xa9"}',
    b'{"k":{"nested":[1, 2]},"v":true}',
    b'{"k":"b","v":' + b"9" * 1500 + b"}",  # a number beyond a double: kept as written
    b'{"k":' + b"1" * 400 + b',"v":0}',  # as the key too
    b'  {"k":"c","v":"spaces around"}  ',
]
BAD = {
    b"{'k':'a'}": "object keys must be strings",
    b'{"k":"a"} x': "trailing characters",
    b'// {"k":"a"}': "not valid JSON",
    b'{"k":"a","v":"\xff\xfe"}': "not valid UTF-8",
    b'{"k":"a\x00b"}': "unescaped control character 0x00",
    b'{"k":"a","v":NaN}': "not valid JSON",
    b"[1,2]": "not a JSON object",
    b'{"v":1}': "no routing key field 'k'",
    b'{"k":null}': "no routing key field 'k'",
    b'{"k":"a","v":' + b"[" * 1200 + b"]" * 1200 + b"}": DEPTH_NOTE,
}


def _exact(lines: list[bytes], reader: FieldReader, first: int = 1) -> LineEvents:
    records, numbers = split_lines(b"\n".join(lines) + b"\n", first)
    return reader._exactly(records, first, numbers)


@pytest.mark.parametrize("key_field,payload_field", [(None, None), ("k", None), ("k", "v"), (None, "v")])
def test_the_fast_read_gives_what_the_exact_check_gives(key_field, payload_field) -> None:
    reader = FieldReader(key_field, payload_field)
    lines = GOOD * 3
    fast = piece_events(b"\n".join(lines) + b"\n", 1, reader)
    assert fast == _exact(lines, reader)
    assert fast.bad is None and len(fast.payloads) == len(lines)
    if key_field:
        assert fast.keys[:5] == ["a", "17", "\u00e9\n", '{"nested":[1,2]}', "b"]
        assert fast.keys[5] == "1" * 400
    if payload_field:
        assert fast.payloads[:4] == [b"1", b'[1,2.5,{"x":null}]', "caf\u00e9".encode(), b"true"]
        assert fast.payloads[4] == b"9" * 1500
    else:
        assert fast.payloads == lines


@pytest.mark.parametrize("line,reason", list(BAD.items()), ids=[str(i) for i in range(len(BAD))])
def test_a_bad_line_among_good_ones_is_named_with_its_number(line: bytes, reason: str) -> None:
    reader = FieldReader("k", None)
    data = b"\n".join([*GOOD[:3], b"", line, *GOOD]) + b"\n"
    got = piece_events(data, 10, reader)
    assert got.payloads == [] and got.bad is not None
    number, why = got.bad
    assert number == 14, got.bad  # lines 10-12 good, 13 blank, 14 the bad one
    assert reason in why
    assert got == _exact([*GOOD[:3], b"", line, *GOOD], reader, 10)


def test_the_first_bad_line_wins_whatever_is_wrong_with_later_ones() -> None:
    reader = FieldReader("k", "v")
    lines = [b'{"k":"a","v":1}', b'{"k":"a"}', b'{"v":1}', b"not json"]
    assert piece_events(b"\n".join(lines), 1, reader).bad == (2, "no payload field 'v'")
    assert piece_events(b"\n".join(lines[2:]), 1, reader).bad == (1, "no routing key field 'k'")


def test_lines_are_split_on_lf_and_cr_lf_and_blank_lines_are_no_records() -> None:
    data = b'{"k":"a"}\r\n\n   \n{"k":"b"}\n{"k":"c"}'  # the piece's last line may lack its line end
    assert split_lines(data, 7) == ([b'{"k":"a"}', b'{"k":"b"}', b'{"k":"c"}'], [7, 10, 11])
    assert split_lines(b"a\nb\n", 1) == ([b"a", b"b"], None)
    assert split_lines(b"", 1) == ([], None)
    text = piece_events(b"x\r\n\ny\n", 1, None)
    assert text == LineEvents([b"x", b"y"], None)


def test_an_event_over_the_limit_is_a_bad_record_before_anything_else() -> None:
    big = b'{"k":"a","v":"' + b"x" * (8 * 1024 * 1024) + b'"}'
    got = piece_events(b'{"k":"a"}\n' + big + b"\n", 1, FieldReader("k", None))
    assert got.bad is not None and got.bad[0] == 2 and "over Pravega's 8388608-byte (8 MiB) event limit" in got.bad[1]
    # A payload field's value is the event: only it is measured.
    small = piece_events(b'{"k":"a","v":"ok","pad":"' + b"x" * (8 * 1024 * 1024) + b'"}\n', 1, FieldReader("k", "v"))
    assert small.bad is None and small.payloads == [b"ok"]


def test_a_field_is_written_as_its_json_text_as_spark_wrote_it() -> None:
    reader = FieldReader("k", "v")
    got = piece_events(b'{"k":true,"v":{"a":[1,"x"],"b":-0.5}}\n', 1, reader)
    assert got.keys == ["true"] and json.loads(got.payloads[0]) == {"a": [1, "x"], "b": -0.5}
    assert got.payloads == [b'{"a":[1,"x"],"b":-0.5}']


def test_a_deep_line_among_thousands_of_short_ones_is_found_and_short_lines_alone_pass() -> None:
    """The nesting check's cheap tests (the longest line, the piece's brackets) skip only what
    cannot nest too deep: a piece of short lines with thousands of brackets in all passes, and one
    deep line among them is named. The interpreter's recursion limit is raised so that only the
    check, not the decoder's recursion, can refuse the deep line."""
    reader = FieldReader("k", None)
    short = [b'{"k":"a","v":{"x":[1]}}'] * 3000
    deep = b'{"k":"a","v":' + b"[" * 1200 + b"]" * 1200 + b"}"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)
    try:
        assert piece_events(b"\n".join(short) + b"\n", 1, reader).bad is None
        found = piece_events(b"\n".join(short + [deep] + short) + b"\n", 1, reader)
    finally:
        sys.setrecursionlimit(limit)
    assert found.bad is not None and found.bad[0] == 3001 and DEPTH_NOTE in found.bad[1], found.bad
