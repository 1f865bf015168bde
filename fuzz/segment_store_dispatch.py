#!/usr/bin/env python3
"""Coverage-guided fuzz target: the embedded segment store's per-connection dispatcher.

Run (see fuzz/README.md):
    .venv/bin/python fuzz/segment_store_dispatch.py -max_total_time=600 fuzz/corpus/segment_store_dispatch

A real ``SegmentStoreServer`` over a real ``SegmentStorage`` in a temporary directory; each input
drives one fresh ``_Connection`` (the asyncio.Protocol the server creates per TCP client) through
an in-memory transport on an event loop owned by this process. Input layout: byte 0 odd =
structure-aware (the rest picks well-formed requests with fuzzed fields after a Hello, see
fuzz/commands.py), and with bit 1 set they go to a second server over the same store that checks
delegation tokens, each request carrying a token from a menu (valid for some scope/stream and
permission, expired, wrongly signed, wrong audience, empty) or a fuzzed string; byte 0 even =
raw, then byte 1 flags: bit 7 = prepend a Hello frame, bit 6 = lockstep (one frame per
data_received, waiting for the server to settle in between, as a client awaiting each answer
does), bits 0-5 = otherwise the chunk size for data_received (0 = all at once); bytes 2.. are the
stream a client would send.

Per input: no exception reaches the event loop or the segment store's error log (except a
declared ProtocolError, which closes the connection), every reply the server writes decodes with
our reply decoder, replies only carry request ids that were sent, the connection answers or
closes, a token-bearing request is refused with AuthTokenCheckFailed exactly when an independent
model of Pravega's token rules says its token does not grant it, all its work settles within HANG_S, and every HEALTH_EVERY inputs a fresh connection
still gets Hello + CreateSegment + SetupAppend + append + read served correctly. Every RESET_EVERY
inputs the store is closed and recovered from its directory, and must look exactly the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable

import atheris
import jwt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

with atheris.instrument_imports(include=["airflow_provider_pravega"]):
    from airflow_provider_pravega.embedded import auth, segment_store
    from airflow_provider_pravega.embedded.storage import SegmentStorage
    from airflow_provider_pravega.protocol import wire

import commands  # noqa: E402  (after instrumentation on purpose: the generator is not under test)

HANG_S = 10.0  # one input's work must settle within this
HEALTH_EVERY = 200  # inputs between checks that a fresh client is still served
#: Inputs between recovery checks and fresh storage directories (bounds disk use).
RESET_EVERY = int(os.environ.get("FUZZ_RESET_EVERY", "2000"))
TAIL_WAIT_S = 0.005  # parked tail reads give up quickly so inputs settle fast


class CountingStorage(SegmentStorage):
    """The real storage, counting data-path callbacks still owed so the harness knows when an
    input's appends have all been answered."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._owed_lock = threading.Lock()
        self.owed = 0

    def _track(self, done):
        with self._owed_lock:
            self.owed += 1

        def wrapped(result):
            try:
                done(result)
            finally:
                with self._owed_lock:
                    self.owed -= 1
        return wrapped

    def setup_writer(self, name, writer_id, done):  # type: ignore[override]
        tracked = self._track(done)
        try:
            super().setup_writer(name, writer_id, tracked)
        except BaseException:
            with self._owed_lock:
                self.owed -= 1
            raise

    def append(self, name, writer_id, event_number, data, done, *, expected_offset=None):  # type: ignore[override]
        tracked = self._track(done)
        try:
            super().append(name, writer_id, event_number, data, tracked, expected_offset=expected_offset)
        except BaseException:
            with self._owed_lock:
                self.owed -= 1
            raise


class MemoryTransport(asyncio.Transport):
    """What asyncio's TCP transport does for the protocol, minus the socket: writes are decoded
    as replies at once (a reply our own decoder refuses is a finding), close() reports
    connection_lost on the next loop turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.protocol: asyncio.Protocol | None = None
        self.decoder = wire.FrameDecoder("reply", strict=True)
        self.replies: list[wire.Command] = []
        self.closed = False
        self.writes_after_close = 0

    def write(self, data) -> None:  # type: ignore[override]
        if self.closed:
            self.writes_after_close += 1
            return
        self.replies.extend(self.decoder.feed(data))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.protocol is not None:
                self.loop.call_soon(self.protocol.connection_lost, None)

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 40000) if name == "peername" else default


class Findings(logging.Handler):
    """Collects what the segment store logs at ERROR (a request that blew up) and what reaches
    the loop's exception handler; the harness turns any of them into a crash."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.problems: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, wire.ProtocolError):
            return  # a declared protocol violation: closing the connection is the right answer
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + "".join(traceback.format_exception(*record.exc_info))
        self.problems.append(text)

    def loop_handler(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        exc = context.get("exception")
        text = context.get("message", "")
        if exc is not None:
            text += "\n" + "".join(traceback.format_exception(exc))
        self.problems.append("event loop: " + text)


class Harness:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.findings = Findings()
        self.loop.set_exception_handler(self.findings.loop_handler)
        logger = logging.getLogger(segment_store.__name__)
        logger.addHandler(self.findings)
        logger.propagate = False  # bad input is logged at WARNING by design; keep the output readable
        logger.setLevel(logging.WARNING)
        self.inputs = 0
        self.health_checks = 0
        self.grants = token_menu()
        self.grants_made = time.monotonic()
        self.tmp: str | None = None
        self.storage: CountingStorage | None = None
        self.server: segment_store.SegmentStoreServer | None = None
        self.auth_server: segment_store.SegmentStoreServer | None = None
        self._fresh_store()

    def current_grants(self) -> dict:
        """The token menu; re-issued well before its 600 s tokens expire (the expired one stays expired)."""
        if time.monotonic() - self.grants_made > 300:
            self.grants = token_menu()
            self.grants_made = time.monotonic()
        return self.grants

    def _fresh_store(self) -> None:
        self._close_store()
        self.tmp = tempfile.mkdtemp(prefix="fuzz-segment-store-")
        self.storage = CountingStorage(os.path.join(self.tmp, "ss"), fsync=False)
        self.storage.open()
        self.server = segment_store.SegmentStoreServer(self.storage, "127.0.0.1", 0, tail_wait_s=TAIL_WAIT_S)
        # The same store behind a server that checks delegation tokens (--auth-file deployments).
        self.auth_server = segment_store.SegmentStoreServer(
            self.storage, "127.0.0.1", 0, tail_wait_s=TAIL_WAIT_S, tokens=auth.TokenAuthority(SIGNING_KEY))
        # Stands in for start(): the servers' loop is ours, driven in this thread.
        self.server._loop = self.loop
        self.auth_server._loop = self.loop
        # The names the structure-aware inputs use exist from the start, so a saved input
        # reproduces on a fresh store as it failed on a long-lived one.
        for name in commands.SEGMENT_NAMES:
            if not name:
                continue
            if "_tables" in name:
                self.storage.create_table(name)
                self.storage.table_update(name, [(b"seed-key", wire.KEY_NO_VERSION, b"seed-value")])
            else:
                self.storage.create_segment(name)

    @staticmethod
    def snapshot(storage: SegmentStorage) -> dict[str, tuple]:
        """Everything a client can observe of every segment, through the storage's public API."""
        out: dict[str, tuple] = {}
        for name in sorted(storage.segment_names()):
            info = storage.segment_info(name)
            if info is None:
                continue
            if storage.is_table(name):
                out[name] = ("table", info.sealed, tuple(sorted(storage.table_entries(name))))
            else:
                data = storage.read(name, info.start_offset, info.length - info.start_offset).data
                out[name] = ("stream", info.sealed, info.start_offset, info.length, data)
        return out

    def recovery_check(self) -> None:
        """What the fuzz inputs left must survive a close and a recovery from the same directory."""
        assert self.server is not None and self.storage is not None and self.tmp is not None
        before = self.snapshot(self.storage)
        for server in (self.server, self.auth_server):
            if server is not None:
                server._pool.shutdown(wait=True)
        self.server = self.auth_server = None
        self.storage.close()
        self.storage = None
        reopened = SegmentStorage(os.path.join(self.tmp, "ss"), fsync=False)
        reopened.open()
        try:
            after = self.snapshot(reopened)
        finally:
            reopened.close()
        if before != after:
            lost = sorted(set(before) - set(after))[:5]
            new = sorted(set(after) - set(before))[:5]
            changed = [(n, before[n], after[n]) for n in sorted(set(before) & set(after)) if before[n] != after[n]][:3]
            raise AssertionError(f"recovery after {self.inputs} inputs changed the store: lost {lost}, "
                                 f"gained {new}, changed {changed!r}")

    def _close_store(self) -> None:
        if self.auth_server is not None:
            self.auth_server._pool.shutdown(wait=True)
            self.auth_server = None
        if self.server is not None:
            self.server._pool.shutdown(wait=True)
            self.server = None
        if self.storage is not None:
            self.storage.close()
            self.storage = None
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def close(self) -> None:
        self._close_store()
        self.loop.close()

    # ------------------------------------------------------------------ one connection

    async def _settle(self, conn: segment_store._Connection, started: float) -> None:
        """Waits until nothing is left to do for this input: no task, no owed storage callback,
        no posted completion. Longer than HANG_S is a hang."""
        storage = self.storage
        servers = [sv for sv in (self.server, self.auth_server) if sv is not None]
        assert storage is not None and servers
        me = asyncio.current_task()
        quiet = 0
        while True:
            busy = (storage.owed > 0 or any(sv._drain_scheduled or sv._posted for sv in servers)
                    or any(t is not me and not t.done() for t in asyncio.all_tasks()))
            quiet = 0 if busy else quiet + 1
            if quiet >= 2:  # idle across two turns: connection_lost and late posts have run
                return
            if time.monotonic() - started > HANG_S:
                raise AssertionError(
                    f"input did not settle within {HANG_S} s: owed={storage.owed} "
                    f"tasks={[t for t in asyncio.all_tasks() if t is not me and not t.done()]!r}")
            await asyncio.sleep(0.0005 if busy else 0)

    async def _drive(self, pieces: list[bytes], lockstep: bool, with_auth: bool = False
                     ) -> tuple[MemoryTransport, segment_store._Connection]:
        server = self.auth_server if with_auth else self.server
        assert server is not None
        transport = MemoryTransport(self.loop)
        conn = segment_store._Connection(server)
        transport.protocol = conn
        conn.connection_made(transport)
        started = time.monotonic()
        for piece in pieces:
            if transport.closed:
                break
            conn.data_received(piece)
            if lockstep:  # like a client that waits for each answer
                await self._settle(conn, started)
            else:
                await asyncio.sleep(0)
        await self._settle(conn, started)
        return transport, conn

    def run_input(self, stream: bytes, chunk: int, lockstep: bool, grants: dict | None = None) -> None:
        """``grants`` (auth mode): delegation token -> what it grants, per the independent model."""
        if lockstep:
            pieces = _frames(stream)
        else:
            pieces = [stream[i:i + chunk] for i in range(0, len(stream), chunk)] if chunk else [stream]
        transport, conn = self.loop.run_until_complete(self._drive(pieces, lockstep, grants is not None))
        self.inputs += 1
        try:
            self._check(stream, transport)
            if grants is not None:
                self._check_auth(stream, transport, grants)
        finally:
            if not transport.closed:
                transport.close()
                conn.connection_lost(None)
            self.loop.run_until_complete(asyncio.sleep(0))
        if self.inputs % HEALTH_EVERY == 1:
            self.health_check()
        if self.inputs % RESET_EVERY == 0:
            self.recovery_check()
            self._fresh_store()

    def _check(self, stream: bytes, transport: MemoryTransport) -> None:
        if self.findings.problems:
            problems, self.findings.problems = self.findings.problems, []
            raise AssertionError("segment store failed on this input:\n" + "\n---\n".join(problems))
        assert transport.writes_after_close == 0 or transport.closed
        # What the server should have seen, decoded independently.
        decoder = wire.FrameDecoder("request")
        try:
            sent = decoder.feed(stream)
            bad = False
        except wire.ProtocolError as exc:
            sent, bad = list(exc.decoded), True
        if bad:
            assert transport.closed, "a malformed request stream did not close the connection"
        ids = [_request_id(c) for c in sent]
        for reply in transport.replies:
            rid = wire.request_id_of(reply)
            assert rid in ids, f"reply {reply!r} carries request id {rid}, which was never sent"
        if sent and not transport.closed:
            # Every request that carries an id is answered exactly once, as a client waiting on it needs.
            want = Counter(rid for rid in ids if rid is not None)
            got = Counter(wire.request_id_of(r) for r in transport.replies)
            assert got == want, f"request ids sent {dict(want)} but answered {dict(got)}: {transport.replies!r}"
        by_id = {}
        for c in sent:
            by_id.setdefault(_request_id(c), []).append(c)
        for reply in transport.replies:
            _check_reply(reply, by_id.get(wire.request_id_of(reply), []))

    def _check_auth(self, stream: bytes, transport: MemoryTransport, grants: dict) -> None:
        """Each token-bearing request is refused (AuthTokenCheckFailed, code 1 if expired) exactly
        when the independent model says its token does not grant it; otherwise it is served."""
        try:
            sent = wire.FrameDecoder("request").feed(stream)
        except wire.ProtocolError as exc:
            sent = list(exc.decoded)
        replies: dict[int, list] = {}
        for reply in transport.replies:
            replies.setdefault(wire.request_id_of(reply), []).append(reply)
        ids = Counter(_request_id(c) for c in sent)
        for cmd in sent:
            needs = TOKEN_NEEDS.get(type(cmd))
            rid = _request_id(cmd)
            if needs is None or ids[rid] != 1 or rid not in replies:
                continue  # no token field, ambiguous id, or not answered (the connection closed)
            (reply,) = replies[rid]
            allowed, expired = token_allows(grants, cmd.delegation_token, needs(cmd))
            refused = isinstance(reply, wire.AuthTokenCheckFailed)
            assert refused != allowed, (
                f"{'refused' if refused else 'served'} {cmd!r} with a token the model says "
                f"{'grants' if allowed else 'does not grant'} it: {reply!r}")
            if refused:
                assert reply.error_code == (wire.AUTH_TOKEN_EXPIRED if expired else wire.AUTH_TOKEN_CHECK_FAILED), reply

    # ------------------------------------------------------------------ a well-behaved client

    def health_check(self) -> None:
        """A fresh connection must still be served completely after whatever came before."""
        self.health_checks += 1
        seg = f"health/check/{self.health_checks}.#epoch.0"
        writer = 0xC0FFEE_0000 + self.health_checks
        block = wire.frame_event(b"still-alive")
        stream = wire.encode_many([
            wire.Hello(),
            wire.CreateSegment(1, seg, 0, 0, ""),
            wire.SetupAppend(2, writer, seg, ""),
            wire.AppendBlockEnd(writer, len(block), block, 1, 1, 3),
            wire.ReadSegment(seg, 0, 1024, "", 4),
        ])

        async def session() -> MemoryTransport:
            # Frame by frame, as a client waiting for each answer would.
            transport = MemoryTransport(self.loop)
            conn = segment_store._Connection(self.server)  # type: ignore[arg-type]
            transport.protocol = conn
            conn.connection_made(transport)
            started = time.monotonic()
            for frame in wire.FrameDecoder("request").feed(stream):
                conn.data_received(wire.encode(frame))
                await self._settle(conn, started)
            conn.close()
            await self._settle(conn, started)
            return transport

        transport = self.loop.run_until_complete(session())
        got = [type(r).__name__ for r in transport.replies]
        assert got == ["Hello", "SegmentCreated", "AppendSetup", "DataAppended", "SegmentRead"], (
            f"health check {self.health_checks} after {self.inputs} inputs: replies {got}: {transport.replies!r}")
        read = transport.replies[-1]
        assert isinstance(read, wire.SegmentRead) and read.data == block, f"health check read {read!r}"
        if self.findings.problems:
            raise AssertionError("health check failed:\n" + "\n".join(self.findings.problems))


SIGNING_KEY = b"fuzz-signing-key-" * 4  # 68 bytes: HS512 wants at least 64
OTHER_KEY = b"some-other-signing-key-" * 3

R, RU = auth.Permission.READ, auth.Permission.READ_UPDATE
#: Independent model of which segments a token-bearing request touches and what it needs there
#: (reads and a merge source need READ, every change READ_UPDATE), written from Pravega's rules
#: rather than from the server's own table.
TOKEN_NEEDS: dict[type, Callable[[object], list]] = {
    wire.SetupAppend: lambda c: [(c.segment, RU)],
    wire.ReadSegment: lambda c: [(c.segment, R)],
    wire.GetStreamSegmentInfo: lambda c: [(c.segment_name, R)],
    wire.CreateSegment: lambda c: [(c.segment, RU)],
    wire.CreateTransientSegment: lambda c: [(c.parent_segment, RU)],
    wire.SealSegment: lambda c: [(c.segment, RU)],
    wire.TruncateSegment: lambda c: [(c.segment, RU)],
    wire.DeleteSegment: lambda c: [(c.segment, RU)],
    wire.MergeSegments: lambda c: [(c.target, RU), (c.source, R)],
    wire.CreateTableSegment: lambda c: [(c.segment, RU)],
    wire.DeleteTableSegment: lambda c: [(c.segment, RU)],
    wire.UpdateTableEntries: lambda c: [(c.segment, RU)],
    wire.RemoveTableKeys: lambda c: [(c.segment, RU)],
    wire.ReadTable: lambda c: [(c.segment, R)],
    wire.ReadTableKeys: lambda c: [(c.segment, R)],
    wire.ReadTableEntries: lambda c: [(c.segment, R)],
    wire.ReadTableEntriesDelta: lambda c: [(c.segment, R)],
}


def make_token(resource: str, permission: str, *, key: bytes = SIGNING_KEY, exp_delta: int = 600,
               audience: str = auth.TOKEN_AUDIENCE) -> str:
    now = int(time.time())
    claims = {"sub": "fuzz", "aud": audience, "iat": now, "exp": now + exp_delta, resource: permission}
    return jwt.encode(claims, key, algorithm=auth.TOKEN_ALGORITHM)


#: Token -> (valid, expired, prefix or "*", permission): what each token grants in the model.
def token_menu() -> dict[str, tuple[bool, bool, str, auth.Permission]]:
    return {
        make_token("prn::/scope:fz", "READ_UPDATE"): (True, False, "fz", RU),
        make_token("prn::/scope:fz", "READ"): (True, False, "fz", R),
        make_token("prn::/scope:fz/stream:st", "READ_UPDATE"): (True, False, "fz/st", RU),
        make_token("prn::/scope:other", "READ_UPDATE"): (True, False, "other", RU),
        make_token("*", "READ_UPDATE"): (True, False, "*", RU),
        make_token("prn::/scope:fz", "NONE"): (True, False, "fz", auth.Permission.NONE),
        make_token("prn::/scope:fz", "READ_UPDATE", exp_delta=-60): (False, True, "fz", RU),
        make_token("prn::/scope:fz", "READ_UPDATE", key=OTHER_KEY): (False, False, "", R),
        make_token("prn::/scope:fz", "READ_UPDATE", audience="controller"): (False, False, "", R),
        "": (False, False, "", R),
    }


def token_allows(grants: dict, token: str, needs: list) -> tuple[bool, bool]:
    """(allowed, expired) for a token under the model; unknown strings grant nothing."""
    valid, expired, prefix, permission = grants.get(token, (False, False, "", R))
    if not valid:
        return False, expired
    for segment, needed in needs:
        covered = prefix == "*" or segment == prefix or segment.startswith(prefix + "/")
        if not covered or permission < needed:
            return False, False
    return True, False


def _request_id(cmd: wire.Command) -> int | None:
    if isinstance(cmd, (wire.Hello, wire.KeepAlive)) or hasattr(cmd, "request_id"):
        return wire.request_id_of(cmd)
    return None


def _check_reply(reply: wire.Command, requests: list[wire.Command]) -> None:
    """What a reply must say about the request it answers (when its request id is unambiguous)."""
    if isinstance(reply, wire.SegmentsMerged):  # finding 1 (fuzz/README.md)
        assert reply.source != reply.target, f"merged a segment into itself: {reply!r}"
    if len(requests) != 1:
        return
    request = requests[0]
    if isinstance(reply, wire.SegmentRead) and isinstance(request, wire.ReadSegment):
        assert reply.segment == request.segment and reply.offset == request.offset, (reply, request)
        assert len(reply.data) <= max(0, request.suggested_length), (reply, request)
    elif isinstance(reply, wire.TableEntriesUpdated) and isinstance(request, wire.UpdateTableEntries):
        assert len(reply.updated_versions) == len(request.entries), (reply, request)
    elif isinstance(reply, wire.TableRead) and isinstance(request, wire.ReadTable):
        assert [k.data for k, _v in reply.entries] == [k.data for k in request.keys], (reply, request)


def _frames(stream: bytes) -> list[bytes]:
    """Splits at frame boundaries by the headers; whatever does not parse stays one last piece."""
    pieces, pos = [], 0
    while len(stream) - pos >= wire.FRAME_HEADER_LEN:
        length = int.from_bytes(stream[pos + 4:pos + 8], "big", signed=True)
        if not 0 <= length <= len(stream) - pos - wire.FRAME_HEADER_LEN:
            break
        pieces.append(stream[pos:pos + wire.FRAME_HEADER_LEN + length])
        pos += wire.FRAME_HEADER_LEN + length
    if pos < len(stream):
        pieces.append(stream[pos:])
    return pieces


_harness: Harness | None = None


def test_one_input(data: bytes) -> None:
    global _harness
    if _harness is None:
        _harness = Harness()
        _harness.health_check()
    if len(data) < 2:
        return
    if data[0] & 1:  # structure-aware: Hello, then well-formed requests with fuzzed fields
        fdp = atheris.FuzzedDataProvider(data[1:])
        lockstep = fdp.ConsumeBool()
        requests = [commands.random_command(fdp, commands.REQUEST_CLASSES)
                    for _ in range(fdp.ConsumeIntInRange(1, 8))]
        grants = None
        if data[0] & 2:  # against the token-checking server, with tokens from the menu (or fuzzed)
            grants = _harness.current_grants()
            menu = list(grants)
            requests = [dataclasses.replace(r, delegation_token=menu[fdp.ConsumeIntInRange(0, len(menu) - 1)])
                        if hasattr(r, "delegation_token") and fdp.ConsumeIntInRange(0, 7) else r
                        for r in requests]
        _harness.run_input(wire.encode_many([wire.Hello(), *requests]), 0, lockstep=lockstep, grants=grants)
        return
    flags, stream = data[1], data[2:]
    if flags & 0x80:
        stream = wire.encode(wire.Hello()) + stream
    _harness.run_input(stream, flags & 0x3F, lockstep=bool(flags & 0x40))


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
