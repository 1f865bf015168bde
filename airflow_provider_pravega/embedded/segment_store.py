"""The segment-store half of the embedded server: Pravega's wire protocol over TCP.

One asyncio loop (in its own thread) serves every connection; the codec is the sans-IO
``protocol.wire`` module and the bytes live in ``SegmentStorage``. Appends are acknowledged only
once the journal has them on disk; reads at the tail park until data arrives, the segment is
sealed or ``tail_wait_s`` passes (the client re-issues an empty read at once, so answering empty
immediately would be a busy loop).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import logging
import ssl
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from airflow_provider_pravega._clock import now_ms
from airflow_provider_pravega.embedded import storage as st
from airflow_provider_pravega.embedded.auth import (
    Permission,
    TokenAuthority,
    TokenCheckFailed,
)
from airflow_provider_pravega.embedded.storage import SegmentStorage
from airflow_provider_pravega.protocol import wire

log = logging.getLogger(__name__)

MAX_READ_REPLY = 4 * 1024 * 1024  # bytes per SegmentRead (the client asks for 8 MiB)
#: A read that reaches the tail of a segment appended to within this time (or that waited at the
#: tail and was woken by an append) waits up to this long for the writer's next append, so events
#: written back to back come in one reply, as Pravega's group commit of its durable log answers
#: them. A segment at rest is answered at once. A wake-up that brings no new bytes (the notice of
#: the append the read already saw, delivered after it) does not end the wait: ending it there
#: answered 1 of 20 official tail tests with the burst's first event only, under load.
TAIL_COALESCE_S = 0.05
MAX_UNACKED_BYTES = 64 * 1024 * 1024  # per connection; reading pauses beyond it
_NO_OFFSET = -1


def _writer_key(writer_id: int) -> bytes:
    return writer_id.to_bytes(16, "big")


class SegmentStats(Protocol):
    """Pravega's SegmentStatsRecorder: what the segment store reports about traffic."""

    def record_append(self, segment: str, data_length: int, events: int) -> None: ...


class SegmentStoreServer:
    """Serves the segment-store wire protocol for one ``SegmentStorage``."""

    def __init__(
        self,
        storage: SegmentStorage,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        tail_wait_s: float = 5.0,
        tokens: TokenAuthority | None = None,
        ssl_context: ssl.SSLContext | None = None,
        stats: SegmentStats | None = None,
        store_id: int = 0,
        owns: Callable[[str], bool] | None = None,
    ) -> None:
        self.storage = storage
        #: Which store of a cluster this is (0 for the one store of a plain server).
        self.store_id = store_id
        #: ``owns(segment)``: whether this store owns the segment's container now; None = every
        #: segment (one store). A request on a segment it does not own is answered ``WrongHost``.
        self.owns = owns
        #: Test hooks, called on the store's loop thread (they must not block or stop this store):
        #: ``on_request(store_id, command)`` before each request is handled (it may move containers;
        #: returning "drop" closes the connection without handling the request, and
        #: "invalid_event_number" refuses an append as Pravega does when the writer's event number
        #: does not match: an InvalidEventNumber reply, then the connection is closed), and
        #: ``on_appended(store_id, segment, writer_id, event_number)`` once an append is durable,
        #: before it is acknowledged ("drop": close the connection instead of acknowledging).
        self.on_request: Callable[[int, object], str | None] | None = None
        self.on_appended: Callable[[int, str, int, int], str | None] | None = None
        self.stats = stats  # told of every acknowledged append (the auto-scaler's measurements)
        self.tokens = tokens  # None: no authentication, delegation tokens are ignored (as before)
        self.ssl_context = ssl_context
        self.host = host
        self.port = port
        self.tail_wait_s = tail_wait_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="pravega-ss")
        self._posted: collections.deque[Callable[[], None]] = collections.deque()
        self._drain_scheduled = False
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._connections: set[_Connection] = set()
        storage.add_growth_listener(self._on_segments_changed)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> tuple[str, int]:
        """Bind and serve on a background thread; returns the bound (host, port)."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    loop.create_server(lambda: _Connection(self), self.host, self.port, reuse_address=True,
                                       ssl=self.ssl_context)
                )
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as exc:  # port in use, bad host
                failure.append(exc)
                self._loop = None
                loop.close()
                ready.set()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name="pravega-segment-store", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self.host, self.port

    def stop(self) -> None:
        loop = self._loop
        if loop is None or self._thread is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for conn in list(self._connections):
                conn.close()
            for futures in self._waiters.values():
                for fut in futures:
                    if not fut.done():
                        fut.set_result(None)
            current = asyncio.current_task()
            pending = [t for t in asyncio.all_tasks() if t is not current]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            loop.stop()

        loop.call_soon_threadsafe(lambda: loop.create_task(shutdown()))
        self._thread.join(timeout=10)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.storage.remove_growth_listener(self._on_segments_changed)

    # ------------------------------------------------------------------ cross-thread plumbing

    def post(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop; many posts from one journal batch cost one wake-up."""
        self._posted.append(fn)
        if not self._drain_scheduled and self._loop is not None:
            self._drain_scheduled = True
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # loop closed during shutdown
                pass

    def _drain(self) -> None:
        self._drain_scheduled = False
        posted = self._posted
        while posted:
            fn = posted.popleft()
            try:
                fn()
            except Exception:
                log.exception("segment store completion failed")

    def _on_segments_changed(self, names: Iterable[str]) -> None:
        names = list(names)
        self.post(lambda: self._wake(names))

    def _wake(self, names: list[str]) -> None:
        for name in names:
            for fut in self._waiters.pop(name, ()):
                if not fut.done():
                    fut.set_result(None)

    def watch(self, name: str) -> asyncio.Future[None]:
        """A future completed at the next change of segment ``name`` (more readable bytes, sealed,
        truncated, deleted). Take it *before* looking at the segment: a change that lands between the
        look and the wait then still wakes the waiter (no lost wake-up)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(name, []).append(fut)
        return fut

    def unwatch(self, name: str, fut: asyncio.Future[None]) -> None:
        waiting = self._waiters.get(name)
        if waiting and fut in waiting:
            waiting.remove(fut)
            if not waiting:
                del self._waiters[name]

    async def blocking(self, fn: Callable[..., object], *args: object) -> object:
        """Administrative storage calls wait for an fsync: keep them off the loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, fn, *args)


class _Connection(asyncio.Protocol):
    """One client connection: decode requests, dispatch, reply in order of completion."""

    def __init__(self, server: SegmentStoreServer) -> None:
        self.server = server
        self.storage = server.storage
        self.decoder = wire.FrameDecoder("request")
        self.transport: asyncio.Transport | None = None
        self.hello_done = False
        self.writers: dict[int, str] = {}  # writer id -> segment set up on this connection
        self.unacked_bytes = 0
        self.paused = False
        self.peer = "?"

    # asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer = str(transport.get_extra_info("peername"))
        self.server._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._connections.discard(self)
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            commands = self.decoder.feed(data)
        except wire.ProtocolError as exc:
            log.warning("closing segment-store connection from %s: %s", self.peer, exc)
            self.close()
            return
        for cmd in commands:
            if self.transport is None:  # closed by an earlier command of this batch: handle no more
                return
            try:
                self.dispatch(cmd)
            except Exception:
                log.exception("closing segment-store connection from %s after %r", self.peer, type(cmd).__name__)
                self.close()
                return

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    def send(self, reply: object) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(wire.encode(reply))

    def spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("segment-store request failed for %s", self.peer, exc_info=task.exception())
            self.close()

    # dispatch

    def dispatch(self, cmd: object) -> None:
        if isinstance(cmd, wire.Hello):
            self.hello_done = True
            self.send(wire.Hello(wire.WIRE_VERSION, wire.OLDEST_COMPATIBLE_VERSION))
            return
        if not self.hello_done:
            raise wire.ProtocolError(f"{type(cmd).__name__} before Hello")
        hook = self.server.on_request
        verdict = hook(self.server.store_id, cmd) if hook is not None else None
        if verdict == "drop":
            self.close()
            return
        if verdict == "invalid_event_number" and isinstance(cmd, _APPENDS):
            # As Pravega's AppendProcessor answers an append whose conditional update of the writer's
            # event number failed (e.g. a block the writer's previous connection still had in the
            # server's pipeline landed after this connection's SetupAppend): not applied, and the
            # connection is closed.
            number = getattr(cmd, "last_event_number", None)
            self.send(wire.InvalidEventNumber(cmd.writer_id, getattr(cmd, "request_id", -1), "",
                                              cmd.event_number if number is None else number))
            self.close()
            return
        handler = _HANDLERS.get(type(cmd))
        if handler is not None and self.server.tokens is not None and not self.token_allows(cmd):
            return
        if handler is not None and self.server.owns is not None and not self.owned(cmd):
            return
        if handler is None:
            request_id = getattr(cmd, "request_id", None)
            if request_id is None:
                raise wire.ProtocolError(f"unsupported command {type(cmd).__name__}")
            self.send(wire.OperationUnsupported(request_id, type(cmd).__name__, ""))
            return
        handler(self, cmd)

    def token_allows(self, cmd: object) -> bool:
        """Check the request's delegation token; on refusal answer AuthTokenCheckFailed (code 0, or 1
        when expired) and return False. Appends after a SetupAppend carry no token: the setup was
        checked, so the append path costs nothing extra."""
        tokens = self.server.tokens
        assert tokens is not None
        rules = _TOKEN_RULES.get(type(cmd))
        if rules is None:
            return True  # no token field (appends, keep-alive): authorized by their setup or harmless
        token = getattr(cmd, "delegation_token", "")
        try:
            for attr, needed in rules:
                tokens.check(token, getattr(cmd, attr), needed)
        except TokenCheckFailed as exc:
            log.warning("segment-store %s from %s refused: %s", type(cmd).__name__, self.peer, exc)
            self.send(wire.AuthTokenCheckFailed(cmd.request_id, str(exc), exc.error_code))  # type: ignore[attr-defined]
            return False
        return True

    def owned(self, cmd: object) -> bool:
        """Whether this store owns the segment ``cmd`` works on; if not, answer WrongHost as Pravega
        does (ContainerNotFoundException: request id, segment, an empty correct host; the
        connection stays open) and return False."""
        segment = _segment_of(cmd, self.writers)
        owns = self.server.owns
        if segment is None or owns is None or owns(segment):
            return True
        log.info("segment store %d does not own %s: WrongHost to %s", self.server.store_id, segment, self.peer)
        if isinstance(cmd, wire.SetupAppend):
            self.writers.pop(cmd.writer_id, None)
        self.send(wire.WrongHost(getattr(cmd, "request_id", -1), segment, "", ""))
        return False

    # appends

    def on_setup_append(self, cmd: wire.SetupAppend) -> None:
        self.writers[cmd.writer_id] = cmd.segment

        def done(result: int | st.StorageError) -> None:
            if isinstance(result, st.StorageError):
                self.server.post(lambda: self.send(self.error_reply(cmd.request_id, cmd.segment, result)))
                return
            self.server.post(lambda: self.send(wire.AppendSetup(cmd.request_id, cmd.segment, cmd.writer_id, result)))

        self.storage.setup_writer(cmd.segment, _writer_key(cmd.writer_id), done)

    def _append(self, writer_id: int, event_number: int, data: bytes, request_id: int,
                expected_offset: int | None, events: int = 1) -> None:
        segment = self.writers.get(writer_id)
        if segment is None:
            raise wire.ProtocolError(f"append for writer {writer_id:032x} that was not set up on this connection")
        size = len(data)
        self.unacked_bytes += size
        if self.unacked_bytes > MAX_UNACKED_BYTES and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

        def done(result: st.AppendResult) -> None:
            self.server.post(lambda: self.on_appended(writer_id, segment, request_id, size, result, events))

        self.storage.append(segment, _writer_key(writer_id), event_number, data, done,
                            expected_offset=expected_offset)

    def on_appended(self, writer_id: int, segment: str, request_id: int, size: int, r: st.AppendResult,
                    events: int = 1) -> None:
        self.unacked_bytes -= size
        if self.paused and self.unacked_bytes <= MAX_UNACKED_BYTES // 2 and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        if r.error is None:
            hook = self.server.on_appended
            if hook is not None and hook(self.server.store_id, segment, writer_id, r.event_number) == "drop":
                self.close()  # durable, but the writer never hears of it: its resend must not duplicate
                return
            if self.server.stats is not None:
                self.server.stats.record_append(segment, size, events)
            self.send(wire.DataAppended(writer_id, r.event_number, r.previous_event_number, request_id, r.write_offset))
        elif isinstance(r.error, st.ConditionalCheckFailed):
            self.send(wire.ConditionalCheckFailed(writer_id, r.event_number, request_id))
        else:
            self.send(self.error_reply(request_id, segment, r.error))

    def on_append_block_end(self, cmd: wire.AppendBlockEnd) -> None:
        self._append(cmd.writer_id, cmd.last_event_number, cmd.data, cmd.request_id, None, max(1, cmd.num_event))

    def on_conditional_block_end(self, cmd: wire.ConditionalBlockEnd) -> None:
        self._append(cmd.writer_id, cmd.event_number, cmd.data, cmd.request_id, cmd.expected_offset)

    def on_conditional_append(self, cmd: wire.ConditionalAppend) -> None:
        self._append(cmd.writer_id, cmd.event_number, wire.frame_event(cmd.event), cmd.request_id,
                     cmd.expected_offset)

    # reads and segment metadata

    def on_read_segment(self, cmd: wire.ReadSegment) -> None:
        self.spawn(self.read_segment(cmd))

    async def read_segment(self, cmd: wire.ReadSegment) -> None:
        want = max(0, min(cmd.suggested_length, MAX_READ_REPLY))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.server.tail_wait_s
        woken = False  # parked at the tail, then woken by growth: a reader following a writer
        burst_len = -1  # bytes read when the burst wait began (-1: not waiting for a burst)
        burst_until = 0.0
        while True:
            # Watch before reading: growth that becomes readable after the read looked (while this
            # coroutine waits for the read thread, which under CPU load can take long) must wake it;
            # registered after the read, that wake-up could come first and be lost, and the reader
            # would wait out tail_wait_s and be answered empty although the data was there.
            changed = self.server.watch(cmd.segment)
            try:
                try:
                    res = await self.server.blocking(self.storage.read, cmd.segment, cmd.offset, want)
                except st.StorageError as exc:
                    self.send(self.error_reply(cmd.request_id, cmd.segment, exc, offset=cmd.offset))
                    return
                now = loop.time()
                short_at_tail = bool(res.data) and res.at_tail and not res.end_of_segment and len(res.data) < want
                if short_at_tail and burst_len < 0 and (woken or self._appending(cmd.segment)):
                    burst_len, burst_until = len(res.data), now + TAIL_COALESCE_S  # the writer is mid-burst
                if short_at_tail and len(res.data) == burst_len and now < burst_until:
                    # Wait for the burst's next append. A wake-up without growth (the notice of the
                    # append already read, delivered after the read saw its bytes) waits again.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed, burst_until - now)
                    continue
                if res.data or res.end_of_segment or want == 0 or now >= deadline:
                    break
                try:
                    await asyncio.wait_for(changed, deadline - now)
                    woken = True
                except TimeoutError:
                    pass
            finally:
                self.server.unwatch(cmd.segment, changed)
        self.send(wire.SegmentRead(cmd.segment, cmd.offset, res.at_tail, res.end_of_segment, res.data, cmd.request_id))

    def _appending(self, segment: str) -> bool:
        """Whether the segment was appended to within the last TAIL_COALESCE_S (a burst under way)."""
        info = self.storage.segment_info(segment)
        return info is not None and now_ms() - info.last_modified_ms < TAIL_COALESCE_S * 1000

    def on_get_stream_segment_info(self, cmd: wire.GetStreamSegmentInfo) -> None:
        info = self.storage.segment_info(cmd.segment_name)
        if info is None:
            self.send(wire.NoSuchSegment(cmd.request_id, cmd.segment_name, "", _NO_OFFSET))
            return
        self.send(wire.StreamSegmentInfo(cmd.request_id, cmd.segment_name, True, info.sealed, False,
                                         info.last_modified_ms, info.length, info.start_offset))

    # administration

    def admin(self, request_id: int, segment: str, fn: Callable[[], object], reply: Callable[[object], object]) -> None:
        async def run() -> None:
            try:
                result = await self.server.blocking(fn)
            except st.StorageError as exc:
                self.send(self.error_reply(request_id, segment, exc))
                return
            self.send(reply(result))

        self.spawn(run())

    def on_create_segment(self, cmd: wire.CreateSegment) -> None:
        def create() -> None:
            if self.storage.exists(cmd.segment):
                raise st.SegmentExists(cmd.segment)
            self.storage.create_segment(cmd.segment)

        self.admin(cmd.request_id, cmd.segment, create, lambda _r: wire.SegmentCreated(cmd.request_id, cmd.segment))

    def on_create_transient_segment(self, cmd: wire.CreateTransientSegment) -> None:
        self.admin(cmd.request_id, cmd.parent_segment,
                   lambda: self.storage.create_transient_segment(cmd.parent_segment, _writer_key(cmd.writer_id)),
                   lambda name: wire.SegmentCreated(cmd.request_id, name))

    def on_seal_segment(self, cmd: wire.SealSegment) -> None:
        def seal() -> None:
            info = self.storage.segment_info(cmd.segment)
            if info is not None and info.sealed:
                raise st.SegmentSealed(cmd.segment)
            self.storage.seal_segment(cmd.segment)

        self.admin(cmd.request_id, cmd.segment, seal, lambda _r: wire.SegmentSealed(cmd.request_id, cmd.segment))

    def on_truncate_segment(self, cmd: wire.TruncateSegment) -> None:
        self.admin(cmd.request_id, cmd.segment,
                   lambda: self.storage.truncate_segment(cmd.segment, cmd.truncation_offset),
                   lambda _r: wire.SegmentTruncated(cmd.request_id, cmd.segment))

    def on_delete_segment(self, cmd: wire.DeleteSegment) -> None:
        def delete() -> None:
            if not self.storage.exists(cmd.segment):
                raise st.NoSuchSegment(cmd.segment)
            self.storage.delete_segment(cmd.segment)

        self.admin(cmd.request_id, cmd.segment, delete, lambda _r: wire.SegmentDeleted(cmd.request_id, cmd.segment))

    def on_merge_segments(self, cmd: wire.MergeSegments) -> None:
        self.admin(cmd.request_id, cmd.target,
                   lambda: self.storage.merge_segment(cmd.source, cmd.target),
                   lambda n: wire.SegmentsMerged(cmd.request_id, cmd.target, cmd.source, n))

    # table segments

    def on_create_table_segment(self, cmd: wire.CreateTableSegment) -> None:
        def create() -> bool:
            if self.storage.exists(cmd.segment) and not self.storage.is_table(cmd.segment):
                raise st.SegmentExists(cmd.segment)
            return self.storage.create_table(cmd.segment)

        self.admin(cmd.request_id, cmd.segment, create,
                   lambda created: wire.SegmentCreated(cmd.request_id, cmd.segment) if created
                   else wire.SegmentAlreadyExists(cmd.request_id, cmd.segment, ""))

    def on_delete_table_segment(self, cmd: wire.DeleteTableSegment) -> None:
        self.admin(cmd.request_id, cmd.segment,
                   lambda: self.storage.delete_table(cmd.segment, cmd.must_be_empty),
                   lambda _r: wire.SegmentDeleted(cmd.request_id, cmd.segment))

    def on_update_table_entries(self, cmd: wire.UpdateTableEntries) -> None:
        items = [(k.data, k.key_version, v.data) for k, v in cmd.entries]
        self.admin(cmd.request_id, cmd.segment,
                   lambda: self.storage.table_update(cmd.segment, items),
                   lambda versions: wire.TableEntriesUpdated(cmd.request_id, tuple(versions)))

    def on_remove_table_keys(self, cmd: wire.RemoveTableKeys) -> None:
        keys = [(k.data, k.key_version) for k in cmd.keys]
        self.admin(cmd.request_id, cmd.segment,
                   lambda: self.storage.table_remove(cmd.segment, keys),
                   lambda _r: wire.TableKeysRemoved(cmd.request_id, cmd.segment))

    def on_read_table(self, cmd: wire.ReadTable) -> None:
        try:
            rows = self.storage.table_read(cmd.segment, [k.data for k in cmd.keys])
        except st.StorageError as exc:
            self.send(self.error_reply(cmd.request_id, cmd.segment, exc))
            return
        self.send(wire.TableRead(cmd.request_id, cmd.segment, _entries(rows)))

    def on_read_table_entries_delta(self, cmd: wire.ReadTableEntriesDelta) -> None:
        try:
            rows, position = self.storage.table_delta(cmd.segment, cmd.from_position, cmd.suggested_entry_count)
        except st.StorageError as exc:
            self.send(self.error_reply(cmd.request_id, cmd.segment, exc))
            return
        reached_end = len(rows) < cmd.suggested_entry_count
        self.send(wire.TableEntriesDeltaRead(cmd.request_id, cmd.segment, _entries(rows), False, reached_end, position))

    def _sorted_table(self, name: str, token: bytes, count: int) -> tuple[list[tuple[bytes, int, bytes]], bytes]:
        """Key order iteration for ReadTableKeys/ReadTableEntries; the token is the last key sent."""
        rows = self.storage.table_entries(name)
        if token:
            rows = [r for r in rows if r[0] > token]
        # The next page only (keys are unique, so tuples compare by key): O(n log page), not a sort
        # of the whole table per page (an ingest's pruning sweep pages through a large table).
        page = heapq.nsmallest(max(1, count), rows)
        return page, (page[-1][0] if page else token)

    def on_read_table_keys(self, cmd: wire.ReadTableKeys) -> None:
        try:
            page, token = self._sorted_table(cmd.segment, cmd.continuation_token, cmd.suggested_key_count)
        except st.StorageError as exc:
            self.send(self.error_reply(cmd.request_id, cmd.segment, exc))
            return
        keys = tuple(wire.TableKey(k, ver) for k, ver, _v in page)
        self.send(wire.TableKeysRead(cmd.request_id, cmd.segment, keys, token))

    def on_read_table_entries(self, cmd: wire.ReadTableEntries) -> None:
        try:
            page, token = self._sorted_table(cmd.segment, cmd.continuation_token, cmd.suggested_entry_count)
        except st.StorageError as exc:
            self.send(self.error_reply(cmd.request_id, cmd.segment, exc))
            return
        self.send(wire.TableEntriesRead(cmd.request_id, cmd.segment, _entries(page), token))

    def on_keep_alive(self, cmd: wire.KeepAlive) -> None:
        self.send(wire.KeepAlive())

    # errors

    @staticmethod
    def error_reply(request_id: int, segment: str, exc: st.StorageError, offset: int = _NO_OFFSET) -> object:
        if isinstance(exc, st.NoSuchSegment):
            return wire.NoSuchSegment(request_id, segment, "", offset)
        if isinstance(exc, st.SegmentSealed):
            return wire.SegmentIsSealed(request_id, segment, "", offset)
        if isinstance(exc, st.SegmentTruncated):
            return wire.SegmentIsTruncated(request_id, segment, exc.start_offset, "", offset)
        if isinstance(exc, st.SegmentExists):
            return wire.SegmentAlreadyExists(request_id, segment, "")
        if isinstance(exc, st.TableKeyBadVersion):
            return wire.TableKeyBadVersion(request_id, segment, "")
        if isinstance(exc, st.TableKeyMissing):
            return wire.TableKeyDoesNotExist(request_id, segment, "")
        if isinstance(exc, st.TableNotEmpty):
            return wire.TableSegmentNotEmpty(request_id, segment, "")
        if isinstance(exc, st.BadOffset):  # Java answers an offset beyond the end this way
            return wire.SegmentIsTruncated(request_id, segment, 0, "", offset)
        return wire.ErrorMessage(request_id, segment, str(exc), -1)


_SEGMENT_FIELDS = ("segment", "segment_name", "target", "parent_segment")
_APPENDS = (wire.AppendBlockEnd, wire.ConditionalBlockEnd, wire.ConditionalAppend)


def _segment_of(cmd: object, writers: dict[int, str]) -> str | None:
    """The segment a request works on (an append's: the one its writer id was set up for)."""
    if isinstance(cmd, _APPENDS):
        return writers.get(cmd.writer_id)
    for field in _SEGMENT_FIELDS:
        value = getattr(cmd, field, None)
        if isinstance(value, str):
            return value
    return None


def _entries(rows: list[tuple[bytes, int, bytes]]) -> tuple:
    return tuple((wire.TableKey(k, ver), wire.TableValue(v)) for k, ver, v in rows)


_HANDLERS: dict[type, Callable[[_Connection, object], None]] = {
    wire.SetupAppend: _Connection.on_setup_append,
    wire.AppendBlockEnd: _Connection.on_append_block_end,
    wire.ConditionalBlockEnd: _Connection.on_conditional_block_end,
    wire.ConditionalAppend: _Connection.on_conditional_append,
    wire.ReadSegment: _Connection.on_read_segment,
    wire.GetStreamSegmentInfo: _Connection.on_get_stream_segment_info,
    wire.CreateSegment: _Connection.on_create_segment,
    wire.CreateTransientSegment: _Connection.on_create_transient_segment,
    wire.SealSegment: _Connection.on_seal_segment,
    wire.TruncateSegment: _Connection.on_truncate_segment,
    wire.DeleteSegment: _Connection.on_delete_segment,
    wire.MergeSegments: _Connection.on_merge_segments,
    wire.CreateTableSegment: _Connection.on_create_table_segment,
    wire.DeleteTableSegment: _Connection.on_delete_table_segment,
    wire.UpdateTableEntries: _Connection.on_update_table_entries,
    wire.RemoveTableKeys: _Connection.on_remove_table_keys,
    wire.ReadTable: _Connection.on_read_table,
    wire.ReadTableKeys: _Connection.on_read_table_keys,
    wire.ReadTableEntries: _Connection.on_read_table_entries,
    wire.ReadTableEntriesDelta: _Connection.on_read_table_entries_delta,
    wire.KeepAlive: _Connection.on_keep_alive,
}  # type: ignore[dict-item]


# Which segments each token-bearing request touches and the permission its token must grant there.
# Reads (and the source of a merge) need READ; everything that changes a segment needs READ_UPDATE.
_R, _RU = Permission.READ, Permission.READ_UPDATE
_TOKEN_RULES: dict[type, tuple[tuple[str, Permission], ...]] = {
    wire.SetupAppend: (("segment", _RU),),
    wire.ReadSegment: (("segment", _R),),
    wire.GetStreamSegmentInfo: (("segment_name", _R),),
    wire.CreateSegment: (("segment", _RU),),
    wire.CreateTransientSegment: (("parent_segment", _RU),),
    wire.SealSegment: (("segment", _RU),),
    wire.TruncateSegment: (("segment", _RU),),
    wire.DeleteSegment: (("segment", _RU),),
    wire.MergeSegments: (("target", _RU), ("source", _R)),
    wire.CreateTableSegment: (("segment", _RU),),
    wire.DeleteTableSegment: (("segment", _RU),),
    wire.UpdateTableEntries: (("segment", _RU),),
    wire.RemoveTableKeys: (("segment", _RU),),
    wire.ReadTable: (("segment", _R),),
    wire.ReadTableKeys: (("segment", _R),),
    wire.ReadTableEntries: (("segment", _R),),
    wire.ReadTableEntriesDelta: (("segment", _R),),
}
