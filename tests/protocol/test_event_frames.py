"""The event-header walk of segment reads: the C extension and the Python loop give the same answer
for any bytes (whole events, events cut off by the buffer's end, headers that are not an event's)."""

from __future__ import annotations

import random
import shutil
import struct
import sys
import sysconfig

import pytest

from airflow_provider_pravega.protocol import event_frames
from airflow_provider_pravega.protocol.event_frames import event_starts, python_event_starts
from airflow_provider_pravega.protocol.wire import frame_event

MAX = 8 * 1024 * 1024


def framed(sizes: list[int], rnd: random.Random) -> tuple[bytes, list[int]]:
    """Events of the given payload sizes, framed as a segment holds them, and their header positions."""
    out, starts = bytearray(), []
    for size in sizes:
        starts.append(len(out))
        out += frame_event(rnd.randbytes(size))
    return bytes(out), starts


def walk(buf, max_event_size=MAX):
    starts, stop, bad = event_starts(buf, max_event_size)
    return list(starts), stop, bad


def python_walk(buf, max_event_size=MAX):
    starts, stop, bad = python_event_starts(buf, max_event_size)
    return list(starts), stop, bad


def test_whole_events_are_found_in_any_buffer_type():
    rnd = random.Random(1)
    buf, starts = framed([0, 1, 200, 7, 65536, 3], rnd)
    for given in (buf, bytearray(buf), memoryview(buf)):
        assert walk(given) == (starts, len(buf), -1)
        assert python_walk(given) == (starts, len(buf), -1)


def test_an_event_cut_off_by_the_end_is_left_for_the_next_buffer():
    rnd = random.Random(2)
    buf, starts = framed([10, 20, 30], rnd)
    last = starts[-1]
    for cut in range(last, len(buf)):  # inside the last header or its payload
        assert walk(buf[:cut]) == (starts[:-1], last, -1)
    assert walk(b"") == ([], 0, -1)
    assert walk(b"\x00" * 7) == ([], 0, -1)


def test_a_header_that_is_not_an_events_is_named_by_its_position():
    rnd = random.Random(3)
    buf, starts = framed([5, 6, 7], rnd)
    for bad_header in (struct.pack(">iI", 1, 5), struct.pack(">iI", -1, 0), struct.pack(">iI", 0, MAX + 1)):
        broken = buf[: starts[1]] + bad_header + buf[starts[1] + 8:]
        assert walk(broken) == ([starts[0]], starts[1], starts[1])
        assert python_walk(broken) == ([starts[0]], starts[1], starts[1])


def test_the_largest_event_allowed_is_max_event_size():
    buf = frame_event(b"x" * 100)
    assert walk(buf, max_event_size=100) == ([0], len(buf), -1)
    assert walk(buf, max_event_size=99) == ([], 0, 0)
    assert walk(buf, max_event_size=-1) == python_walk(buf, max_event_size=-1) == ([], 0, 0)


def test_a_huge_length_under_a_huge_limit_is_an_event_not_yet_whole():
    header = struct.pack(">iI", 0, 0xFFFFFFFF)
    for limit in (0xFFFFFFFF, 1 << 62):
        assert walk(header + b"x" * 10, limit) == python_walk(header + b"x" * 10, limit) == ([], 0, -1)


@pytest.mark.parametrize("seed", range(20))
def test_the_c_walk_and_the_python_loop_agree_on_random_bytes(seed):
    rnd = random.Random(seed)
    buf, _ = framed([rnd.choice((0, 1, 8, 199, 200, 4096, rnd.randrange(70000))) for _ in range(300)], rnd)
    buf = bytearray(buf[rnd.randrange(len(buf)):])  # from anywhere: headers mostly misread
    for _ in range(5):
        if buf:
            buf[rnd.randrange(len(buf))] = rnd.randrange(256)
        limit = rnd.choice((MAX, 200, 4096, 0, -1))
        assert walk(bytes(buf), limit) == python_walk(bytes(buf), limit)
        cut = bytes(buf[: rnd.randrange(len(buf) + 1)])
        assert walk(cut, limit) == python_walk(cut, limit)


def test_the_c_walk_is_built_where_a_compiler_is():
    """A CPython install with a C compiler builds the extension (it is optional only so that an
    install without one still works): without it reads run the slower Python loop unnoticed."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if sys.implementation.name != "cpython" or not (shutil.which(compiler) or shutil.which("cc")):
        pytest.skip("no C compiler here: the Python loop is used, as designed")
    assert event_frames.NATIVE, "the _event_frames extension was not built: reinstall (scripts/bootstrap.sh)"
