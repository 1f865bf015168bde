"""Durable segment storage for the embedded server.

Pravega acknowledges an append only once it is durable in its write-ahead log (BookKeeper) and
later moves the data to long-term storage. This module does the same on one disk:

* a **journal** (``journal/<seq>.log``): every change — appends with their writer id and event
  number, segment creation, seal, merge, truncation, deletion, table updates — is a CRC-checked
  record. A flusher thread writes whatever has queued up with one ``write`` and one ``fdatasync``
  (group commit: any number of writers share a sync) and only then makes appended bytes readable
  and acknowledges them;
* **segment files** (``data/<id>.seg``), written through the page cache as appends arrive and
  read with ``pread`` so memory stays bounded whatever the data size;
* **checkpoints** (``checkpoint.json``): when the journal grows past a threshold the state is
  snapshotted at a quiet point, the segment files are fsynced, and older journal files removed.

Recovery = the last checkpoint + replay of the journal (a torn tail record is dropped) + truncation
of every segment file to its recovered length, so an append that was never acknowledged cannot
appear and one that was acknowledged cannot vanish.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from airflow_provider_pravega._clock import now_ms
from airflow_provider_pravega.embedded.backend import SegmentInfo
from airflow_provider_pravega.embedded.controller_log import fsync_dir

log = logging.getLogger(__name__)

NO_EVENT_NUMBER = -(2**63)
_RECORD_HEADER = struct.Struct(">IIB")  # crc32(kind byte + payload), payload length, kind
_APPEND_HEADER = struct.Struct(">QQ16sq")  # file id, segment offset, writer id, event number
_K_APPEND = 1  # an append with its data in the journal (small blocks: one fsync covers all)
_K_APPEND_IN_FILE = 3  # a large append whose data went to the segment file, fsynced first
_IN_FILE_HEADER = struct.Struct(">QQ16sqQ")  # file id, offset, writer id, event number, length
_IN_FILE_THRESHOLD = 256 * 1024  # blocks this large are written once, not journal + file
_K_META = 2
_MAX_RECORD = 64 * 1024 * 1024
_COPY_CHUNK = 8 * 1024 * 1024


class StorageError(Exception):
    """Base class of the segment-level refusals the wire protocol turns into error replies."""


class NoSuchSegment(StorageError):
    pass


class SegmentSealed(StorageError):
    pass


class SegmentTruncated(StorageError):
    def __init__(self, name: str, start_offset: int) -> None:
        super().__init__(f"segment {name} is truncated below {start_offset}")
        self.start_offset = start_offset


class SegmentExists(StorageError):
    pass


class ConditionalCheckFailed(StorageError):
    pass


class BadOffset(StorageError):
    pass


class TableKeyMissing(StorageError):
    pass


class TableKeyBadVersion(StorageError):
    pass


class TableNotEmpty(StorageError):
    pass


KEY_NO_VERSION = -(2**63)
KEY_NOT_EXISTS = -1


@dataclass(slots=True)
class AppendResult:
    """Outcome of one append, handed to the caller's callback once durable."""

    event_number: int
    previous_event_number: int
    write_offset: int  # segment length after this append
    error: StorageError | None = None


@dataclass(slots=True)
class ReadResult:
    data: bytes
    end_of_segment: bool
    at_tail: bool


@dataclass(slots=True)
class _Segment:
    name: str
    fid: int
    table: bool = False
    length: int = 0  # durable: readable bytes end here
    pending_length: int = 0  # accepted (journal queued) bytes end here
    start_offset: int = 0
    sealed: bool = False
    last_modified_ms: int = 0
    writers: dict[bytes, int] = field(default_factory=dict)  # durable last event numbers
    pending_writers: dict[bytes, int] = field(default_factory=dict)
    entries: dict[bytes, tuple[int, bytes]] = field(default_factory=dict)  # table key -> (ver, value)
    next_version: int = 0


@dataclass(slots=True)
class _Pending:
    record: tuple[bytes, ...]  # journal bytes, as pieces written with one writev
    apply: Callable[[], object] | None  # runs under the lock once the record is durable
    done: Callable[[object], None] | None  # gets apply()'s result (after the lock is released)
    sync_fid: int = 0  # a segment file to fdatasync before the journal record is written


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _unb64(s: str) -> bytes:
    return base64.b64decode(s)


class SegmentStorage:
    """Segments, table segments and their durability; thread-safe.

    Data-path methods (``append``, ``setup_writer``) take a callback and never block on disk;
    administrative methods block until their change is durable (they are the ``SegmentBackend``
    the controller uses). Callbacks run on the flusher thread: keep them short.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        fsync: bool = True,
        checkpoint_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        self.root = Path(data_dir)
        self._fsync = fsync
        self._checkpoint_bytes = checkpoint_bytes
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: list[_Pending] = []
        self._segments: dict[str, _Segment] = {}
        self._by_fid: dict[int, _Segment] = {}
        self._merged: dict[str, str] = {}  # merged source -> target, for idempotent re-merge
        self._fds: dict[int, int] = {}
        self._dead_fids: set[int] = set()  # files to unlink after the next checkpoint
        self._dirty_fids: set[int] = set()  # files written since the last checkpoint
        self._next_fid = 1
        self._journal_seq = 0
        self._journal_fd = -1
        self._journal_bytes = 0
        self._draining = False
        self._closed = False
        self._checkpointing = False
        self._growth_listeners: list[Callable[[Iterable[str]], None]] = []
        self._flusher: threading.Thread | None = None
        self._checkpointer: threading.Thread | None = None
        self._fatal: BaseException | None = None
        self._changed: set[str] = set()  # segments whose readers may have news since the last batch

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Recover the state from disk and start the flusher."""
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        (self.root / "journal").mkdir(parents=True, exist_ok=True)
        self._recover()
        self._flusher = threading.Thread(target=self._flush_loop, name="pravega-journal", daemon=True)
        self._flusher.start()

    def close(self) -> None:
        """Flush what is queued, write a checkpoint, and release files."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._wake.notify_all()
        if self._flusher is not None:
            self._flusher.join()
        if self._checkpointer is not None:
            self._checkpointer.join()
        if self._fatal is None:
            with self._lock:
                snapshot, dirty, dead = self._take_snapshot_locked(roll=True)
            self._write_checkpoint(snapshot, dirty, dead)
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if self._journal_fd >= 0:
            os.close(self._journal_fd)
            self._journal_fd = -1

    def add_growth_listener(self, listener: Callable[[Iterable[str]], None]) -> None:
        """``listener(names)`` is called (on the flusher thread) when segments get readable
        bytes, are sealed, truncated or removed — used to wake parked tail reads."""
        self._growth_listeners.append(listener)

    def remove_growth_listener(self, listener: Callable[[Iterable[str]], None]) -> None:
        # A new list, not an edit of the one the flusher may be iterating.
        self._growth_listeners = [fn for fn in self._growth_listeners if fn != listener]

    # ------------------------------------------------------------------ queries

    def segment_info(self, name: str) -> SegmentInfo | None:
        with self._lock:
            seg = self._segments.get(name)
            if seg is None:
                return None
            return SegmentInfo(name, seg.length, seg.start_offset, seg.sealed, seg.last_modified_ms)

    def exists(self, name: str) -> bool:
        with self._lock:
            return name in self._segments

    def is_table(self, name: str) -> bool:
        with self._lock:
            seg = self._segments.get(name)
            return seg is not None and seg.table

    def segment_names(self) -> list[str]:
        with self._lock:
            return list(self._segments)

    def read(self, name: str, offset: int, max_length: int) -> ReadResult:
        """Up to ``max_length`` durable bytes at ``offset``; empty at the tail (caller may wait)."""
        with self._lock:
            seg = self._segments.get(name)
            if seg is None or seg.table:
                raise NoSuchSegment(name)
            if offset < seg.start_offset:
                raise SegmentTruncated(name, seg.start_offset)
            if offset > seg.length:
                raise BadOffset(f"offset {offset} is beyond the end ({seg.length}) of {name}")
            n = min(max_length, seg.length - offset)
            fd = self._fd(seg.fid)
            sealed_end = seg.sealed and seg.length == seg.pending_length
            length = seg.length
        data = os.pread(fd, n, offset) if n > 0 else b""
        if len(data) != n:
            raise StorageError(f"short read of {name} at {offset}: {len(data)} of {n} bytes")
        end = offset + n
        return ReadResult(data, end_of_segment=sealed_end and end == length, at_tail=end == length)

    # ------------------------------------------------------------------ data path

    def setup_writer(self, name: str, writer_id: bytes, done: Callable[[int | StorageError], None]) -> None:
        """Report the last durable event number of ``writer_id`` on ``name`` once every append
        accepted before now is durable (so the number reported can be trusted)."""
        with self._lock:
            self._check_open()
            seg = self._segments.get(name)
            if seg is None or seg.table:
                err: StorageError = NoSuchSegment(name)
                self._queue_locked(_Pending((), None, lambda _r: done(err)))
                return

            def apply(seg=seg) -> int:
                return seg.writers.get(writer_id, NO_EVENT_NUMBER)

            self._queue_locked(_Pending((), apply, done))  # type: ignore[arg-type]

    def append(
        self,
        name: str,
        writer_id: bytes,
        event_number: int,
        data: bytes,
        done: Callable[[AppendResult], None],
        *,
        expected_offset: int | None = None,
    ) -> None:
        """Queue ``data`` for ``name``; ``done`` gets the result once it is durable (or refused).

        Resent blocks (event number not above the writer's last accepted one) are acknowledged
        without being stored again, after everything before them is durable.
        """
        with self._lock:
            self._check_open()
            seg = self._segments.get(name)
            if seg is None or seg.table:
                self._refuse_locked(done, event_number, NoSuchSegment(name))
                return
            previous = seg.pending_writers.get(writer_id, NO_EVENT_NUMBER)
            if event_number <= previous:

                def dup(seg=seg) -> AppendResult:
                    return AppendResult(event_number, previous, seg.length)

                self._queue_locked(_Pending((), dup, done))  # type: ignore[arg-type]
                return
            if seg.sealed:
                self._refuse_locked(done, event_number, SegmentSealed(name))
                return
            offset = seg.pending_length
            if expected_offset is not None and expected_offset != offset:
                self._refuse_locked(done, event_number, ConditionalCheckFailed(name))
                return
            if data:
                os.pwrite(self._fd(seg.fid), data, offset)
            seg.pending_length = offset + len(data)
            seg.pending_writers[writer_id] = event_number
            in_file = len(data) >= _IN_FILE_THRESHOLD
            if in_file:  # written once: the file is synced before the journal names it
                record = self._frame(
                    _K_APPEND_IN_FILE, _IN_FILE_HEADER.pack(seg.fid, offset, writer_id, event_number, len(data))
                )
            else:
                record = self._append_record(seg.fid, offset, writer_id, event_number, data)

            def apply(seg=seg, offset=offset, n=len(data)) -> AppendResult:
                self._apply_append(seg, offset, n, writer_id, event_number)
                return AppendResult(event_number, previous, seg.length)

            self._queue_locked(_Pending(record, apply, done, seg.fid if in_file else 0))  # type: ignore[arg-type]

    def _refuse_locked(self, done: Callable[[AppendResult], None], event_number: int, err: StorageError) -> None:
        """Refusals are answered in order with the acknowledgements queued before them."""
        result = AppendResult(event_number, NO_EVENT_NUMBER, 0, err)
        self._queue_locked(_Pending((), None, lambda _r: done(result)))

    # ------------------------------------------------------------------ administration (blocking)

    def create_segment(self, name: str) -> None:
        self._create(name, table=False, must_not_exist=False)

    def create_table(self, name: str) -> bool:
        """Create a table segment; False when it already existed."""
        return self._create(name, table=True, must_not_exist=False)

    def create_transient_segment(self, parent: str, writer_id: bytes) -> str:
        """A fresh segment for one large event, merged into ``parent`` afterwards."""
        with self._lock:
            seg = self._segments.get(parent)
            if seg is None or seg.table:
                raise NoSuchSegment(parent)
            if seg.sealed:
                raise SegmentSealed(parent)
        name = f"{parent}#transient.{writer_id.hex()}.{secrets.token_hex(16)}"
        self._create(name, table=False, must_not_exist=True)
        return name

    def _create(self, name: str, *, table: bool, must_not_exist: bool) -> bool:
        with self._lock:
            self._check_open()
            seg = self._segments.get(name)
            if seg is not None:
                if must_not_exist:
                    raise SegmentExists(name)
                return False
            fid = self._next_fid
            rec = {"op": "create", "name": name, "fid": fid, "table": table, "ts": now_ms()}
            self._apply_meta(rec)
            self._wait_durable_locked(self._meta_record(rec))
        return True

    def seal_segment(self, name: str) -> int:
        with self._lock:
            self._check_open()
            seg = self._segments.get(name)
            if seg is None:
                if name in self._merged:
                    raise SegmentSealed(name)
                raise NoSuchSegment(name)
            if not seg.sealed:
                rec = {"op": "seal", "fid": seg.fid}
                self._apply_meta(rec)
                self._wait_durable_locked(self._meta_record(rec))
            return seg.pending_length

    def truncate_segment(self, name: str, offset: int) -> None:
        with self._lock:
            self._check_open()
            seg = self._segments.get(name)
            if seg is None or seg.table:
                raise NoSuchSegment(name)
            if offset > seg.pending_length:
                raise BadOffset(f"cannot truncate {name} at {offset}: it has {seg.pending_length} bytes")
            if offset > seg.start_offset:
                rec = {"op": "truncate", "fid": seg.fid, "offset": offset}
                self._apply_meta(rec)
                self._wait_durable_locked(self._meta_record(rec))

    def delete_segment(self, name: str) -> None:
        with self._lock:
            self._check_open()
            seg = self._segments.get(name)
            if seg is None:
                return
            rec = {"op": "delete", "fid": seg.fid}
            self._apply_meta(rec)
            self._wait_durable_locked(self._meta_record(rec))

    def delete_table(self, name: str, must_be_empty: bool) -> None:
        with self._lock:
            seg = self._segments.get(name)
            if seg is None or not seg.table:
                raise NoSuchSegment(name)
            if must_be_empty and seg.entries:
                raise TableNotEmpty(name)
        self.delete_segment(name)

    def discard_segment(self, name: str) -> None:
        """An aborted transaction's segment: deleted, as Pravega's controller does right after an
        abort (a late append from the client then gets NoSuchSegment, which it tolerates)."""
        self.delete_segment(name)

    def merge_segment(self, source: str, target: str) -> int:
        """Append ``source``'s bytes to ``target`` and remove ``source`` (idempotent)."""
        if source == target:  # would copy the segment onto itself, then delete it as the source
            raise StorageError(f"cannot merge segment {source} into itself")
        with self._lock:
            self._check_open()
            tgt = self._segments.get(target)
            if tgt is None or tgt.table:
                raise NoSuchSegment(target)
            src = self._segments.get(source)
            if src is None:
                if self._merged.get(source) == target:
                    return tgt.pending_length
                raise NoSuchSegment(source)
            if tgt.sealed:
                raise SegmentSealed(target)
            if src.start_offset > 0:
                raise BadOffset(f"cannot merge truncated segment {source}")
            n = src.pending_length
            offset = tgt.pending_length
            self._copy(src.fid, tgt.fid, offset, n)
            tgt.pending_length = offset + n
            rec = {"op": "merge", "src": src.fid, "dst": tgt.fid, "offset": offset, "length": n,
                   "ts": now_ms()}
            self._apply_meta(rec)  # removes the source now; target bytes readable once durable

            def apply(tgt=tgt, offset=offset, n=n) -> int:
                if tgt.length < offset + n:
                    tgt.length = offset + n
                self._dirty_fids.add(tgt.fid)
                self._changed.add(tgt.name)
                return tgt.length

            self._wait_durable_locked(self._meta_record(rec), apply)
            return offset + n

    # ------------------------------------------------------------------ table segments

    def table_update(self, name: str, entries: list[tuple[bytes, int, bytes]]) -> list[int]:
        """Apply ``(key, expected_version, value)`` items atomically; returns the new versions.

        Every item is checked against the state before the batch (a batch may name a key twice).
        """
        with self._lock:
            self._check_open()
            seg = self._table(name)
            for key, expected, _value in entries:
                self._check_version(seg, key, expected)
            versions = list(range(seg.next_version, seg.next_version + len(entries)))
            rec = {"op": "tput", "fid": seg.fid,
                   "e": [[_b64(k), _b64(v), ver] for (k, _x, v), ver in zip(entries, versions)]}
            self._apply_meta(rec)
            self._wait_durable_locked(self._meta_record(rec))
            return versions

    def table_remove(self, name: str, keys: list[tuple[bytes, int]]) -> None:
        with self._lock:
            self._check_open()
            seg = self._table(name)
            for key, expected in keys:
                self._check_version(seg, key, expected)
            rec = {"op": "tdel", "fid": seg.fid, "k": [_b64(k) for k, _v in keys]}
            self._apply_meta(rec)
            self._wait_durable_locked(self._meta_record(rec))

    def table_read(self, name: str, keys: list[bytes]) -> list[tuple[bytes, int, bytes]]:
        """One ``(key, version, value)`` per key, in order; a missing key has version -1, no value."""
        with self._lock:
            seg = self._table(name)
            out = []
            for key in keys:
                ver, value = seg.entries.get(key, (KEY_NOT_EXISTS, b""))
                out.append((key, ver, value))
            return out

    def table_delta(self, name: str, from_position: int, max_count: int) -> tuple[list[tuple[bytes, int, bytes]], int]:
        """Entries whose current version is at or after ``from_position`` (oldest first), at most
        ``max_count``, and the position to continue from."""
        with self._lock:
            seg = self._table(name)
            changed = sorted(
                ((ver, key, value) for key, (ver, value) in seg.entries.items() if ver >= from_position),
            )[: max(1, max_count)]
            if not changed:
                return [], max(from_position, seg.next_version)
            return [(k, ver, v) for ver, k, v in changed], changed[-1][0] + 1

    def table_entries(self, name: str) -> list[tuple[bytes, int, bytes]]:
        with self._lock:
            seg = self._table(name)
            return [(k, ver, v) for k, (ver, v) in seg.entries.items()]

    def _table(self, name: str) -> _Segment:
        seg = self._segments.get(name)
        if seg is None or not seg.table:
            raise NoSuchSegment(name)
        return seg

    @staticmethod
    def _check_version(seg: _Segment, key: bytes, expected: int) -> None:
        if expected == KEY_NO_VERSION:
            return
        current = seg.entries.get(key)
        if expected == KEY_NOT_EXISTS:
            if current is not None:
                raise TableKeyBadVersion(f"key exists in {seg.name}")
            return
        if current is None:
            raise TableKeyMissing(f"key does not exist in {seg.name}")
        if current[0] != expected:
            raise TableKeyBadVersion(f"key version is {current[0]}, not {expected}, in {seg.name}")

    # ------------------------------------------------------------------ state transitions
    # _apply_meta is the one place each administrative change happens: live (at submit time,
    # under the lock) and during recovery replay, so the two cannot disagree.

    def _apply_meta(self, rec: dict) -> None:
        op = rec["op"]
        if op == "create":
            seg = _Segment(rec["name"], rec["fid"], table=rec["table"], last_modified_ms=rec["ts"])
            self._segments[seg.name] = seg
            self._by_fid[seg.fid] = seg
            self._merged.pop(seg.name, None)
            self._next_fid = max(self._next_fid, seg.fid + 1)
            self._dirty_fids.add(seg.fid)
            return
        seg = self._by_fid.get(rec.get("fid", rec.get("src")))  # type: ignore[arg-type]
        if seg is None:
            return  # replay of a change to a segment that a later checkpoint no longer has
        self._changed.add(seg.name)
        if op == "seal":
            seg.sealed = True
        elif op == "truncate":
            seg.start_offset = max(seg.start_offset, rec["offset"])
        elif op == "delete":
            self._remove(seg)
        elif op == "merge":
            tgt = self._by_fid.get(rec["dst"])
            if tgt is not None:
                self._merged[seg.name] = tgt.name
                tgt.last_modified_ms = rec["ts"]
            self._remove(seg)
        elif op == "tput":
            for k, v, ver in rec["e"]:
                seg.entries[_unb64(k)] = (ver, _unb64(v))
                seg.next_version = max(seg.next_version, ver + 1)
        elif op == "tdel":
            for k in rec["k"]:
                seg.entries.pop(_unb64(k), None)
            seg.next_version += 1
        else:  # pragma: no cover - a record kind from a newer version
            raise StorageError(f"unknown journal operation {op!r}")

    def _remove(self, seg: _Segment) -> None:
        self._segments.pop(seg.name, None)
        self._by_fid.pop(seg.fid, None)
        self._dead_fids.add(seg.fid)

    def _apply_append(self, seg: _Segment, offset: int, n: int, writer_id: bytes, event_number: int) -> None:
        if seg.length < offset + n:
            seg.length = offset + n
        if seg.writers.get(writer_id, NO_EVENT_NUMBER) < event_number:
            seg.writers[writer_id] = event_number
        seg.last_modified_ms = now_ms()
        self._dirty_fids.add(seg.fid)
        self._changed.add(seg.name)

    # ------------------------------------------------------------------ journal

    @staticmethod
    def _frame(kind: int, *pieces: bytes) -> tuple[bytes, ...]:
        crc = zlib.crc32(bytes((kind,)))
        for piece in pieces:
            crc = zlib.crc32(piece, crc)
        return (_RECORD_HEADER.pack(crc, sum(map(len, pieces)), kind), *pieces)

    def _append_record(
        self, fid: int, offset: int, writer_id: bytes, event_number: int, data: bytes
    ) -> tuple[bytes, ...]:
        return self._frame(_K_APPEND, _APPEND_HEADER.pack(fid, offset, writer_id, event_number), data)

    def _meta_record(self, rec: dict) -> tuple[bytes, ...]:
        return self._frame(_K_META, json.dumps(rec, separators=(",", ":")).encode())

    def _queue_locked(self, pending: _Pending) -> None:
        self._queue.append(pending)
        if len(self._queue) == 1:
            self._wake.notify_all()

    def _wait_durable_locked(self, record: tuple[bytes, ...], apply: Callable[[], object] | None = None) -> object:
        """Queue ``record`` and wait (releasing the lock) until it is durable."""
        box: list[object] = []
        event = threading.Event()

        def done(result: object) -> None:
            box.append(result)
            event.set()

        self._queue_locked(_Pending(record, apply, done))
        self._lock.release()
        try:
            event.wait()
        finally:
            self._lock.acquire()
        if self._fatal is not None:
            raise StorageError(f"storage failed: {self._fatal}")
        return box[0] if box else None

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("segment storage is closed")
        if self._fatal is not None:
            raise StorageError(f"segment storage failed: {self._fatal}")
        while self._draining:
            self._wake.wait()

    def _flush_loop(self) -> None:
        try:
            while True:
                with self._lock:
                    while not self._queue and not self._closed:
                        self._wake.wait()
                    if not self._queue and self._closed:
                        return
                    batch, self._queue = self._queue, []
                self._write_journal(batch)
                with self._lock:
                    results = [p.apply() if p.apply is not None else None for p in batch]
                    changed, self._changed = self._changed, set()
                    if self._journal_bytes >= self._checkpoint_bytes and not self._checkpointing:
                        changed |= self._start_checkpoint_locked()
                self._finish(batch, results, changed)
        except BaseException as exc:  # disk full, I/O error: fail loudly, never acknowledge
            log.exception("journal flusher failed; the embedded server stops accepting writes")
            with self._lock:
                self._fatal = exc
                batch, self._queue = self._queue, []
            for p in batch:
                if p.done is not None:
                    try:
                        p.done(AppendResult(0, 0, 0, StorageError(str(exc))))
                    except Exception:
                        pass

    def _finish(self, batch: list[_Pending], results: list[object], changed: set[str]) -> None:
        for p, r in zip(batch, results):
            if p.done is not None:
                try:
                    p.done(r)
                except Exception:  # a caller's callback must not kill the journal
                    log.exception("journal completion callback failed")
        if changed:
            for listener in self._growth_listeners:
                listener(changed)

    def _write_journal(self, batch: list[_Pending]) -> None:
        pieces = [piece for p in batch for piece in p.record]
        if not pieces:
            return
        if self._fsync:
            for fid in {p.sync_fid for p in batch if p.sync_fid}:
                with self._lock:
                    fd = self._fds.get(fid)
                if fd is not None:
                    os.fdatasync(fd)
        total = sum(map(len, pieces))
        written = 0
        for i in range(0, len(pieces), 512):  # stay under IOV_MAX
            chunk = pieces[i : i + 512]
            n = os.writev(self._journal_fd, chunk)
            size = sum(map(len, chunk))
            if n < size:  # short write (rare on regular files): finish it the plain way
                rest = memoryview(b"".join(chunk))[n:]
                while rest:
                    rest = rest[os.write(self._journal_fd, rest) :]
            written += size
        if self._fsync:
            os.fdatasync(self._journal_fd)
        self._journal_bytes += total

    def _journal_path(self, seq: int) -> Path:
        return self.root / "journal" / f"{seq:010d}.log"

    def _open_journal(self, seq: int) -> None:
        if self._journal_fd >= 0:
            os.close(self._journal_fd)
        self._journal_seq = seq
        self._journal_fd = os.open(self._journal_path(seq), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._journal_bytes = os.fstat(self._journal_fd).st_size
        if self._fsync:
            fsync_dir(self.root / "journal")

    # ------------------------------------------------------------------ files

    def _fd(self, fid: int) -> int:
        fd = self._fds.get(fid)
        if fd is None:
            fd = os.open(self.root / "data" / f"{fid}.seg", os.O_RDWR | os.O_CREAT, 0o644)
            self._fds[fid] = fd
        return fd

    def _copy(self, src_fid: int, dst_fid: int, dst_offset: int, n: int) -> None:
        src, dst = self._fd(src_fid), self._fd(dst_fid)
        done = 0
        while done < n:
            chunk = min(_COPY_CHUNK, n - done)
            try:
                copied = os.copy_file_range(src, dst, chunk, done, dst_offset + done)
            except OSError:
                copied = 0
            if copied <= 0:  # fall back to an ordinary copy (other filesystems)
                data = os.pread(src, chunk, done)
                if len(data) != chunk:
                    raise StorageError(f"segment file {src_fid} is shorter than its length")
                os.pwrite(dst, data, dst_offset + done)
                copied = chunk
            done += copied

    # ------------------------------------------------------------------ checkpoints

    def _take_snapshot_locked(self, roll: bool) -> tuple[dict, set[int], set[int]]:
        """State at this instant (callers guarantee nothing is half-applied) and a fresh journal."""
        if roll:
            self._open_journal(self._journal_seq + 1)
        segs = []
        for seg in self._segments.values():
            segs.append({
                "name": seg.name, "fid": seg.fid, "table": seg.table, "length": seg.length,
                "start": seg.start_offset, "sealed": seg.sealed,
                "ts": seg.last_modified_ms, "next_version": seg.next_version,
                "writers": {w.hex(): n for w, n in seg.writers.items()},
                "entries": [[_b64(k), _b64(v), ver] for k, (ver, v) in seg.entries.items()],
            })
        snapshot = {
            "format": 1, "journal_seq": self._journal_seq, "next_fid": self._next_fid,
            "segments": segs, "merged": self._merged,
        }
        dirty, self._dirty_fids = self._dirty_fids, set()
        dead, self._dead_fids = self._dead_fids, set()
        return snapshot, dirty, dead

    def _start_checkpoint_locked(self) -> set[str]:
        """Called by the flusher between batches: reach a quiet point, snapshot, roll the journal.

        Administrative records change the state when they are submitted, so the snapshot is taken
        only when nothing is queued; new submissions wait (one fsync at most) meanwhile.
        """
        self._draining = True
        changed: set[str] = set()
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                self._lock.release()
                try:
                    self._write_journal(batch)
                finally:
                    self._lock.acquire()
                results = [p.apply() if p.apply is not None else None for p in batch]
                for p, r in zip(batch, results):
                    if p.done is not None:
                        p.done(r)
            changed, self._changed = self._changed, set()
            snapshot, dirty, dead = self._take_snapshot_locked(roll=True)
        finally:
            self._draining = False
            self._wake.notify_all()
        self._checkpointing = True
        self._checkpointer = threading.Thread(
            target=self._checkpoint_job, args=(snapshot, dirty, dead), name="pravega-checkpoint", daemon=True
        )
        self._checkpointer.start()
        return changed

    def _checkpoint_job(self, snapshot: dict, dirty: set[int], dead: set[int]) -> None:
        try:
            self._write_checkpoint(snapshot, dirty, dead)
        except Exception:
            log.exception("checkpoint failed; the journal keeps everything until the next one")
        finally:
            with self._lock:
                self._checkpointing = False

    def _write_checkpoint(self, snapshot: dict, dirty: set[int], dead: set[int]) -> None:
        if self._fsync:
            for fid in dirty:
                with self._lock:
                    fd = self._fds.get(fid)
                if fd is not None and fid not in dead:
                    try:
                        os.fsync(fd)
                    except OSError:
                        pass
        tmp = self.root / "checkpoint.json.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(snapshot, fh, separators=(",", ":"))
            fh.flush()
            if self._fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, self.root / "checkpoint.json")
        if self._fsync:
            fsync_dir(self.root)
        for path in sorted((self.root / "journal").glob("*.log")):
            if int(path.stem) < snapshot["journal_seq"]:
                path.unlink(missing_ok=True)
        for fid in dead:
            with self._lock:
                if fid in self._by_fid:
                    continue
                fd = self._fds.pop(fid, None)
            if fd is not None:
                os.close(fd)
            (self.root / "data" / f"{fid}.seg").unlink(missing_ok=True)

    # ------------------------------------------------------------------ recovery

    def _recover(self) -> None:
        started = time.monotonic()
        cp_path = self.root / "checkpoint.json"
        seq = 0
        if cp_path.exists():
            snapshot = json.loads(cp_path.read_text(encoding="utf-8"))
            seq = snapshot["journal_seq"]
            self._next_fid = snapshot["next_fid"]
            self._merged = dict(snapshot.get("merged", {}))
            for s in snapshot["segments"]:
                seg = _Segment(
                    s["name"], s["fid"], table=s["table"], length=s["length"], pending_length=s["length"],
                    start_offset=s["start"], sealed=s["sealed"],
                    last_modified_ms=s["ts"], next_version=s["next_version"],
                    writers={bytes.fromhex(w): n for w, n in s["writers"].items()},
                    entries={_unb64(k): (ver, _unb64(v)) for k, v, ver in s["entries"]},
                )
                self._segments[seg.name] = seg
                self._by_fid[seg.fid] = seg
        journals = sorted(int(p.stem) for p in (self.root / "journal").glob("*.log"))
        journals = [j for j in journals if j >= seq]
        records = 0
        for i, j in enumerate(journals):
            records += self._replay_journal(self._journal_path(j), last=i == len(journals) - 1)
        # Bytes written to segment files but never made durable in the journal must not appear.
        live = set()
        for seg in self._segments.values():
            seg.pending_length = seg.length
            seg.pending_writers = dict(seg.writers)
            live.add(seg.fid)
            if not seg.table:
                fd = self._fd(seg.fid)
                if os.fstat(fd).st_size != seg.length:
                    os.ftruncate(fd, seg.length)
        for path in (self.root / "data").glob("*.seg"):
            fid = int(path.stem)
            if fid not in live and fid not in self._dead_fids:
                path.unlink(missing_ok=True)
        self._open_journal(journals[-1] if journals else max(seq, 1))
        log.info(
            "segment storage recovered %d segments (%d journal records) in %.2fs",
            len(self._segments), records, time.monotonic() - started,
        )

    def _replay_journal(self, path: Path, last: bool) -> int:
        count = 0
        with open(path, "rb") as fh:
            data = fh.read()
        pos = 0
        end = len(data)
        while pos < end:
            if end - pos < _RECORD_HEADER.size:
                break
            crc, length, kind = _RECORD_HEADER.unpack_from(data, pos)
            body_start = pos + _RECORD_HEADER.size
            if length > _MAX_RECORD or body_start + length > end:
                break
            payload = data[body_start : body_start + length]
            if zlib.crc32(payload, zlib.crc32(bytes((kind,)))) != crc:
                break
            self._replay_record(kind, payload)
            pos = body_start + length
            count += 1
        if pos < end:
            if not last:
                raise StorageError(f"journal {path} is corrupt at byte {pos} (not its tail)")
            log.warning("dropping a torn record at the end of %s (%d bytes)", path, end - pos)
            with open(path, "r+b") as fh:
                fh.truncate(pos)
        return count

    def _replay_record(self, kind: int, payload: bytes) -> None:
        if kind == _K_APPEND:
            fid, offset, writer_id, event_number = _APPEND_HEADER.unpack_from(payload)
            seg = self._by_fid.get(fid)
            if seg is None:
                return
            data = payload[_APPEND_HEADER.size :]
            if data:
                os.pwrite(self._fd(fid), data, offset)
            self._apply_append(seg, offset, len(data), writer_id, event_number)
        elif kind == _K_APPEND_IN_FILE:
            fid, offset, writer_id, event_number, length = _IN_FILE_HEADER.unpack_from(payload)
            seg = self._by_fid.get(fid)
            if seg is not None:
                self._apply_append(seg, offset, length, writer_id, event_number)
        elif kind == _K_META:
            rec = json.loads(payload)
            if rec["op"] == "merge":
                src, tgt = self._by_fid.get(rec["src"]), self._by_fid.get(rec["dst"])
                if src is not None and tgt is not None:
                    self._copy(src.fid, tgt.fid, rec["offset"], rec["length"])
                    tgt.length = max(tgt.length, rec["offset"] + rec["length"])
                    self._dirty_fids.add(tgt.fid)
            self._apply_meta(rec)
        else:
            raise StorageError(f"unknown journal record kind {kind}")
