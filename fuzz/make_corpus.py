#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/ with OUR encoder (no captured or downloaded bytes).

    .venv/bin/python fuzz/make_corpus.py          # (re)write the committed seeds

Seeds are named after what they hold, so a re-run overwrites them in place; files libFuzzer adds
while fuzzing (named by their SHA-1) are left alone.
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import commands  # noqa: E402

from airflow_provider_pravega.protocol import wire  # noqa: E402

HERE = Path(__file__).resolve().parent
ALL_CODES = sorted({*wire.REQUEST_TYPES, *wire.REPLY_TYPES})


def decoder_seeds() -> dict[str, bytes]:
    """Mode byte first (see wire_decoder.py): 0 raw stream, 1 hostile values, 2 structured, 3 one payload."""
    seeds: dict[str, bytes] = {}
    samples = commands.sample_commands()
    missing = set(commands.ALL_TYPES) - {type(c) for c in samples}
    if missing:
        raise SystemExit(f"sample_commands() lacks {sorted(c.__name__ for c in missing)}")
    for i, cmd in enumerate(samples):
        frame = wire.encode(cmd)
        name = f"{i:02d}-{type(cmd).__name__}"
        seeds[f"raw-{name}"] = b"\x00" + bytes([3]) + frame  # chunks of 3 bytes
        code_index = ALL_CODES.index(cmd.TYPE)
        direction = 1 if type(cmd) in wire.REQUEST_TYPES.values() else 2
        seeds[f"payload-{name}"] = b"\x03" + bytes([code_index, 0x80 | direction]) + frame[8:]
    for name, session in commands.seed_sessions().items():
        seeds[f"raw-session-{name}"] = b"\x00\x00" + wire.encode_many(session)
    seeds["raw-oversized-header"] = b"\x00\x00" + struct.pack(">ii", 9, wire.MAX_FRAME + 1)
    seeds["payload-events"] = b"\x03\x00\x05" + wire.frame_event(b"abc") + wire.frame_event(b"") + b"\x00\x00"
    for i in range(4):  # structured and hostile modes consume these bytes as field choices
        seeds[f"structured-{i}"] = b"\x02" + bytes((i * 37 + j * 11) & 0xFF for j in range(64))
        seeds[f"hostile-{i}"] = b"\x01" + bytes((i * 41 + j * 13) & 0xFF for j in range(64))
    return seeds


def dispatch_seeds() -> dict[str, bytes]:
    """Byte 0 even: raw; byte 1: bit 7 prepends Hello, bit 6 lockstep, bits 0-5 chunk size (sessions
    carry their own Hello). Byte 0 odd: structure-aware, the rest are field choices."""
    seeds = {f"session-{name}": b"\x00\x40" + wire.encode_many(cmds) for name, cmds in commands.seed_sessions().items()}
    seeds["session-tables-pipelined"] = b"\x00\x00" + wire.encode_many(commands.seed_sessions()["tables"])
    seeds["session-append_read-chunked"] = b"\x00\x07" + wire.encode_many(commands.seed_sessions()["append_read"])
    for cmd in commands.sample_commands():
        if type(cmd) in wire.REQUEST_TYPES.values() and not isinstance(cmd, wire.Hello):
            seeds[f"single-{type(cmd).__name__}-{cmd.TYPE}"] = b"\x00\xc0" + wire.encode(cmd)
    for i in range(6):
        seeds[f"structured-{i}"] = b"\x01" + bytes((i * 53 + j * 29) & 0xFF for j in range(96))
        seeds[f"structured-auth-{i}"] = b"\x03" + bytes((i * 59 + j * 31) & 0xFF for j in range(96))
    return seeds


def write(target: str, seeds: dict[str, bytes]) -> None:
    out = HERE / "corpus" / target
    out.mkdir(parents=True, exist_ok=True)
    for name, data in seeds.items():
        (out / name).write_bytes(data)
    print(f"{target}: {len(seeds)} seeds, {sum(map(len, seeds.values()))} bytes in {out}")


def main() -> None:
    write("wire_decoder", decoder_seeds())
    write("segment_store_dispatch", dispatch_seeds())


if __name__ == "__main__":
    main()
