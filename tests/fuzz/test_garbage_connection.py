"""A real embedded server under garbage on raw connections keeps serving the OFFICIAL client.

While tests/fuzz/good_client.py (the official ``pravega`` client, in its own process because it
holds the GIL) writes and reads back numbered events, a thread here streams random bytes and
mutated valid frames (flipped bytes, wrong lengths, truncations, huge declared frames, valid
requests on unknown segments, frames before Hello) at the segment store, reconnecting whenever
the server closes the connection, as it must after a bad frame. Afterwards: every event was read
exactly once with no client error, the server process is alive, it logged no unexpected
exception, and its RSS did not balloon. tests/embedded/test_segment_store_wire.py checks single
bad inputs against an in-process server; this is the end-to-end, official-client view.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from airflow_provider_pravega.protocol import wire

REPO = Path(__file__).resolve().parents[2]
GARBAGE_S = 8.0
RSS_GROWTH_LIMIT = 256 * 1024 * 1024

# tests/fuzz/good_client.py is the official client: it must keep working beside the garbage.
pytestmark = pytest.mark.official_client


def _load_fuzz_commands():
    spec = importlib.util.spec_from_file_location("fuzz_commands", REPO / "fuzz" / "commands.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


class Garbage:
    """Random and mutated-valid frames, one connection after another, until stopped."""

    def __init__(self, endpoint: str, seed: int) -> None:
        host, port = endpoint.rsplit(":", 1)
        self.addr = (host, int(port))
        self.rnd = random.Random(seed)
        commands = _load_fuzz_commands()
        self.frames = [wire.encode(c) for c in commands.sample_commands()]
        self.requests = [wire.encode(c) for c in commands.sample_commands()
                         if type(c) in wire.REQUEST_TYPES.values()]
        self.hello = wire.encode(wire.Hello())
        self.stop = threading.Event()
        self.connections = 0
        self.bytes_sent = 0
        self.closed_by_server = 0
        self.errors: list[str] = []

    def mutate(self, frame: bytes) -> bytes:
        r = self.rnd
        data = bytearray(frame)
        how = r.randrange(6)
        if how == 0:  # flip some bytes
            for _ in range(r.randint(1, 4)):
                i = r.randrange(len(data))
                data[i] ^= 1 << r.randrange(8)
        elif how == 1:  # lie about the length
            length = r.choice([-1, -(2**31), 0, 1, len(data), wire.MAX_FRAME, wire.MAX_FRAME + 1, 2**31 - 1])
            data[4:8] = struct.pack(">i", length)
        elif how == 2:  # cut short
            del data[r.randrange(len(data)):]
        elif how == 3:  # unknown or wrong-direction type code
            data[0:4] = struct.pack(">i", r.choice([0, 2, 7, 10, 12, 99, 4242, -1, -128]))
        elif how == 4:  # grow a string/bytes length field somewhere in the payload
            if len(data) > 10:
                i = r.randrange(8, len(data) - 2)
                data[i:i + 2] = b"\xff\xff"
        else:  # random tail
            data += r.randbytes(r.randint(1, 64))
        return bytes(data)

    def payload(self) -> bytes:
        r = self.rnd
        kind = r.randrange(6)
        if kind == 0:
            return r.randbytes(r.randint(1, 4096))
        if kind == 1:  # requests before Hello
            return b"".join(r.choice(self.requests) for _ in range(r.randint(1, 4)))
        if kind == 2:  # Hello, then valid requests on the fuzz names (never the good client's scope)
            return self.hello + b"".join(r.choice(self.requests) for _ in range(r.randint(1, 8)))
        if kind == 3:  # Hello, some valid requests, then a mutated one
            return (self.hello + b"".join(r.choice(self.requests) for _ in range(r.randint(0, 3)))
                    + self.mutate(r.choice(self.frames)))
        if kind == 4:  # a huge frame announced and partly sent
            return self.hello + struct.pack(">ii", 9, wire.MAX_FRAME) + r.randbytes(r.randint(0, 65536))
        return b"".join(self.mutate(r.choice(self.frames)) for _ in range(r.randint(1, 6)))

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with socket.create_connection(self.addr, timeout=2) as s:
                    self.connections += 1
                    for _ in range(self.rnd.randint(1, 5)):
                        data = self.payload()
                        s.sendall(data)
                        self.bytes_sent += len(data)
                    s.settimeout(0.05)
                    try:
                        while s.recv(65536):
                            pass
                        self.closed_by_server += 1
                    except TimeoutError:
                        pass
            except (ConnectionResetError, BrokenPipeError):
                self.closed_by_server += 1
            except OSError as exc:  # e.g. refused: the server is gone, which the test reports
                self.errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.05)


def unexpected_tracebacks(log_text: str) -> list[str]:
    """Tracebacks in the server log whose exception is not a declared ProtocolError."""
    found = []
    for block in log_text.split("Traceback (most recent call last):")[1:]:
        lines = block.splitlines()[1:]
        # Frame lines are indented; the first unindented line names the exception.
        final = next((line for line in lines if line and not line[0].isspace()), "")
        if not final.startswith("airflow_provider_pravega.protocol.wire.ProtocolError"):
            found.append("\n".join(lines[:40]))
    return found


def run_under_garbage(server, controller_uri: str, endpoint: str, scope: str, env: dict[str, str]) -> None:
    """The scenario for one server process (an EmbeddedPravegaProcess); fails the test on a problem."""
    log_path = server.data_dir / "server.log"
    log_start = log_path.stat().st_size if log_path.exists() else 0
    rss_before = rss_bytes(server.pid)

    garbage = Garbage(endpoint, seed=20261122)
    flood = threading.Thread(target=garbage.run, name="garbage", daemon=True)
    flood.start()
    try:
        time.sleep(0.5)  # the flood is under way before the good client connects
        good = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("good_client.py")), controller_uri, scope, str(GARBAGE_S)],
            capture_output=True, text=True, timeout=240, env={**os.environ, **env},
        )
    finally:
        garbage.stop.set()
        flood.join(timeout=30)

    lines = good.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {"error": f"no output; stderr:\n{good.stderr[-3000:]}"}
    assert good.returncode == 0 and "error" not in result, f"good client failed: {result}\n{good.stderr[-3000:]}"
    assert result["read"] == result["written"] > 0 and result["rounds"] >= 2, result
    assert server.proc is not None and server.proc.poll() is None, "the embedded server process died"
    assert garbage.connections > 50, f"the flood barely ran: {garbage.connections} connections"
    assert garbage.closed_by_server > 0, "the server never closed a garbage connection"
    assert not garbage.errors, f"raw connections failed: {garbage.errors[:5]}"
    rss_after = rss_bytes(server.pid)
    assert rss_after - rss_before < RSS_GROWTH_LIMIT, (
        f"server RSS grew from {rss_before >> 20} MiB to {rss_after >> 20} MiB under garbage")
    with open(log_path, "rb") as f:
        f.seek(log_start)
        new_log = f.read().decode(errors="replace")
    bad = unexpected_tracebacks(new_log)
    assert not bad, "the server logged unexpected exceptions:\n" + "\n---\n".join(bad[:3])
    print(f"good client: {result['written']} events in {result['rounds']} rounds; garbage: "
          f"{garbage.connections} connections, {garbage.bytes_sent} bytes, {garbage.closed_by_server} closed "
          f"by the server; RSS {rss_before >> 20} -> {rss_after >> 20} MiB")


def test_garbage_on_raw_connections_does_not_disturb_the_official_client(pravega_embedded, unique_name):
    run_under_garbage(pravega_embedded, pravega_embedded.controller_uri, pravega_embedded.segment_store_endpoint,
                      unique_name("fz"), {})


def test_garbage_with_token_checks_on(pravega_secure_embedded_factory, unique_name):
    """Same with --auth-file (no TLS, so raw sockets reach the wire protocol): garbage requests carry
    no valid delegation token and are refused; the authenticated official client is unaffected."""
    secure = pravega_secure_embedded_factory(tls=False)
    run_under_garbage(secure.process, secure.controller_uri, secure.segment_store_endpoint, unique_name("fz"),
                      secure.client_env("admin"))
