#!/usr/bin/env python3
"""Coverage-guided fuzz target: the segment-store frame decoder and every command's codec.

Run (see fuzz/README.md):
    .venv/bin/python fuzz/wire_decoder.py -max_total_time=600 fuzz/corpus/wire_decoder

The first input byte picks a mode (low two bits):
  0     raw bytes through FrameDecoder("request") and ("reply"), whole and in chunks;
  1     encoder robustness: commands with some fields of the wrong type or out of range must be
        refused with ValueError (or, if they fit after all, round-trip);
  2     structure-aware: well-formed commands with fuzzed fields, encode -> decode -> encode;
  3     one payload through decode_frame for a chosen type code, and the event-segment parsers.
Anything but a declared ProtocolError from malformed input, or a broken property, raises
AssertionError/the stray exception, which atheris reports as a crash with the input saved.
"""

from __future__ import annotations

import os
import sys

import atheris

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

with atheris.instrument_imports(include=["airflow_provider_pravega"]):
    from airflow_provider_pravega.protocol import wire

import commands  # noqa: E402  (after instrumentation on purpose: the generator is not under test)

#: A small limit besides the real one, so "over the limit" paths are cheap to reach.
SMALL_FRAME = 64
REQUEST_CLASSES = set(wire.REQUEST_TYPES.values())
ALL_CODES = sorted({*wire.REQUEST_TYPES, *wire.REPLY_TYPES})


def _chunks(data: bytes, size: int) -> list[bytes]:
    if size <= 0:
        return [data]
    return [data[i:i + size] for i in range(0, len(data), size)] or [b""]


def _decode_stream(direction: str, max_frame: int, pieces: list[bytes]) -> tuple[list, str | None]:
    """Feeds pieces to a fresh decoder; returns (commands, error text or None). Checks the bound."""
    decoder = wire.FrameDecoder(direction, max_frame)  # type: ignore[arg-type]
    out: list = []
    fed = 0
    for piece in pieces:
        fed += len(piece)
        try:
            out.extend(decoder.feed(piece))
        except wire.ProtocolError as exc:
            out.extend(exc.decoded)
            assert decoder.failed, "decoder raised ProtocolError but is not marked failed"
            assert decoder.buffered == 0, "a failed decoder still holds bytes"
            try:
                decoder.feed(b"\x00")
            except wire.ProtocolError:
                pass
            else:
                raise AssertionError("a failed decoder accepted more input")
            return out, str(exc)
        # Never more than one incomplete frame of at most max_frame bytes is held.
        assert decoder.buffered < wire.FRAME_HEADER_LEN + max_frame, (
            f"decoder buffers {decoder.buffered} bytes with max_frame={max_frame}")
        assert decoder.buffered <= fed
    return out, None


def _tails_all_or_none(cmd: wire.Command) -> bool:
    _, optional = commands.wire_kinds(type(cmd))
    if not optional:
        return True
    names = [f for f in type(cmd).__dataclass_fields__][-len(optional):]
    present = [getattr(cmd, n) is not None for n in names]
    return all(present) or not any(present)


def _reencode_is_stable(cmd: wire.Command, direction: str) -> None:
    """Whatever decodes must encode, and decode again to the same command (when its tail is whole)."""
    frame = wire.encode(cmd)
    again = wire.decode_frame(cmd.TYPE, frame[8:], direction, strict=True)  # type: ignore[arg-type]
    if _tails_all_or_none(cmd):
        assert again == cmd, f"re-decoded {again!r} != {cmd!r}"
        assert wire.encode(again) == frame


def raw_mode(data: bytes) -> None:
    chunk = data[0] if data else 0
    stream = data[1:]
    for direction in ("request", "reply"):
        for max_frame in (wire.MAX_FRAME, SMALL_FRAME):
            whole, whole_err = _decode_stream(direction, max_frame, [stream])
            split, split_err = _decode_stream(direction, max_frame, _chunks(stream, chunk))
            assert whole == split, "chunking changed what was decoded"
            assert (whole_err is None) == (split_err is None), f"chunking changed the outcome: {whole_err} / {split_err}"
            if max_frame == wire.MAX_FRAME:
                for cmd in whole:
                    _reencode_is_stable(cmd, direction)


def structured_mode(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    requests = fdp.ConsumeBool()
    direction = "request" if requests else "reply"
    classes = [c for c in commands.ALL_TYPES if (c in REQUEST_CLASSES) == requests
               or c in (wire.Hello, wire.KeepAlive)]
    cmds = [commands.random_command(fdp, classes) for _ in range(fdp.ConsumeIntInRange(1, 4))]
    frames = []
    for cmd in cmds:
        frame = wire.encode(cmd)
        frames.append(frame)
        code, length = int.from_bytes(frame[:4], "big", signed=True), int.from_bytes(frame[4:8], "big")
        assert code == cmd.TYPE and length == len(frame) - 8
        decoded = wire.decode_frame(code, frame[8:], direction, strict=True)  # type: ignore[arg-type]
        assert decoded == cmd, f"round trip changed {cmd!r} into {decoded!r}"
        assert wire.encode(decoded) == frame, f"re-encoding {decoded!r} changed the bytes"
        # A payload cut short is a clean ProtocolError or (optional tails only) a shorter command.
        cut = fdp.ConsumeIntInRange(0, max(0, length - 1))
        try:
            wire.decode_frame(code, frame[8:8 + cut], direction, strict=True)  # type: ignore[arg-type]
        except wire.ProtocolError:
            pass
    stream = b"".join(frames)
    got, err = _decode_stream(direction, wire.MAX_FRAME, _chunks(stream, fdp.ConsumeIntInRange(0, 32)))
    assert err is None, f"our own frames failed to decode: {err}"
    assert got == cmds


def hostile_mode(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    cmd = commands.hostile_command(fdp)
    try:
        frame = wire.encode(cmd)
    except ValueError:
        return  # the promised refusal; any other exception type escapes and is a crash
    direction = "request" if type(cmd) in REQUEST_CLASSES else "reply"
    decoded = wire.decode_frame(cmd.TYPE, frame[8:], direction, strict=True)  # type: ignore[arg-type]
    assert wire.encode(decoded) == frame, f"{cmd!r} encoded to bytes that re-encode differently"
    if _tails_all_or_none(cmd):
        for field in type(cmd).__dataclass_fields__:
            sent, got = getattr(cmd, field), getattr(decoded, field)
            if isinstance(sent, (bytearray, memoryview)):
                sent = bytes(sent)
            elif isinstance(sent, list):
                sent = tuple(sent)
            assert got == sent, f"{type(cmd).__name__}.{field}: encoded {sent!r}, decoded {got!r}"


def payload_mode(data: bytes) -> None:
    if len(data) < 2:
        return
    code = ALL_CODES[data[0] % len(ALL_CODES)]
    strict = bool(data[1] & 0x80)
    direction = (None, "request", "reply")[data[1] % 3]
    payload = data[2:]
    try:
        cmd = wire.decode_frame(code, payload, direction, strict=strict)  # type: ignore[arg-type]
    except wire.ProtocolError:
        pass
    else:
        table = wire.REQUEST_TYPES if type(cmd) in REQUEST_CLASSES else wire.REPLY_TYPES
        assert table[code] is type(cmd)
        _reencode_is_stable(cmd, "request" if type(cmd) in REQUEST_CLASSES else "reply")
    # The same bytes as the contents of an event segment.
    limit = (None, 16, 4096)[data[1] % 3]
    base = data[0]
    try:
        events, next_offset = wire.split_events(payload, base, max_event_size=limit)
        whole_err = None
    except wire.EventFormatError as exc:
        events, next_offset, whole_err = None, None, str(exc)
    parser = wire.EventParser(base, max_event_size=limit)
    streamed: list = []
    stream_err = None
    try:
        for piece in _chunks(payload, (data[1] & 0x0F) + 1):
            streamed.extend(parser.feed(piece))
    except wire.EventFormatError as exc:
        stream_err = str(exc)
    assert (whole_err is None) == (stream_err is None), f"{whole_err} / {stream_err}"
    if events is not None:
        assert streamed == events
        assert parser.offset == next_offset
        assert next_offset == base + sum(wire.EVENT_HEADER_LEN + len(e.payload) for e in events)
        for e in events:
            assert wire.frame_event(e.payload) == payload[e.offset - base:e.end_offset - base]


def test_one_input(data: bytes) -> None:
    if not data:
        return
    mode = data[0] & 0x03
    body = data[1:]
    if mode == 0:
        raw_mode(body)
    elif mode == 1:
        hostile_mode(body)
    elif mode == 2:
        structured_mode(body)
    else:
        payload_mode(body)


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
