"""Durable storage of the embedded controller's metadata: a JSON-lines log plus snapshots.

Layout under ``<data_dir>/controller/``:

* ``log.jsonl`` — one JSON record per line, each with a ``seq`` number one above the previous;
* ``state.json`` — a snapshot of the whole state as of record ``seq`` (written to a temporary file,
  fsynced, renamed over the old one, directory fsynced), after which the log starts again empty.

The controller appends a record while holding its state lock (cheap: one ``write`` into the page
cache) and calls :meth:`MetadataLog.sync` after releasing it; ``sync`` is a group commit — one
``fdatasync`` covers every record written so far, so concurrent RPCs share a disk flush.

A crash (even ``kill -9`` or power loss) can leave the last line torn; :meth:`MetadataLog.open`
drops an unreadable tail and truncates the file there. Unreadable bytes *followed* by a valid record
are not a torn write but damage, and open refuses to guess.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

LOG_NAME = "log.jsonl"
SNAPSHOT_NAME = "state.json"


class CorruptMetadataError(RuntimeError):
    """The controller's metadata files are damaged in a way a crash cannot explain."""


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a file created, renamed or removed in it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _datasync(fd: int) -> None:
    if hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    else:  # pragma: no cover - macOS
        os.fsync(fd)


class MetadataLog:
    """Append-only record log with snapshots and group commit (thread-safe as described above)."""

    def __init__(self, directory: Path, *, snapshot_every: int = 1000) -> None:
        if snapshot_every < 1:
            raise ValueError(f"snapshot_every must be at least 1, got {snapshot_every}")
        self.directory = Path(directory)
        self.snapshot_every = snapshot_every
        self._fd = -1
        self._written = 0  # seq of the last record written to the file (or covered by the snapshot)
        self._synced = 0  # seq up to which records are durable
        self._since_snapshot = 0
        self._sync_lock = threading.Lock()

    @property
    def log_path(self) -> Path:
        return self.directory / LOG_NAME

    @property
    def snapshot_path(self) -> Path:
        return self.directory / SNAPSHOT_NAME

    @property
    def last_seq(self) -> int:
        return self._written

    # ---- opening and recovery ------------------------------------------------------------

    def open(self) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """Read the snapshot and the records after it; drop a torn tail; get ready to append.

        Returns ``(snapshot state or None, records to replay in order)``.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        snapshot: dict[str, Any] | None = None
        base_seq = 0
        if self.snapshot_path.exists():
            try:
                doc = json.loads(self.snapshot_path.read_text(encoding="utf-8"))
                base_seq = int(doc["seq"])
                snapshot = doc["state"]
            except (ValueError, KeyError, TypeError) as exc:
                # The snapshot is only ever replaced by an atomic rename, so it cannot be torn.
                raise CorruptMetadataError(f"controller snapshot {self.snapshot_path} is unreadable: {exc}") from exc
        records, good_length, file_length = self._read_log(base_seq)
        if good_length < file_length:
            with open(self.log_path, "r+b") as f:
                f.truncate(good_length)
                f.flush()
                os.fsync(f.fileno())
        self._fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        fsync_dir(self.directory)
        last = records[-1]["seq"] if records else base_seq
        self._written = self._synced = last
        self._since_snapshot = len(records)
        return snapshot, records

    def _read_log(self, base_seq: int) -> tuple[list[dict[str, Any]], int, int]:
        """Parse the log: (records after base_seq, length of the valid prefix, file length)."""
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return [], 0, 0
        records: list[dict[str, Any]] = []
        pos = 0
        good = 0
        expected = None
        torn_at: int | None = None
        while pos < len(data):
            end = data.find(b"\n", pos)
            line_end = len(data) if end < 0 else end + 1
            line = data[pos:line_end]
            record = self._parse_line(line) if end >= 0 else None
            if record is None:
                if torn_at is None:
                    torn_at = pos
            else:
                if torn_at is not None:
                    raise CorruptMetadataError(
                        f"controller log {self.log_path} has unreadable bytes at offset {torn_at} "
                        f"followed by valid record seq {record['seq']}: refusing to drop acknowledged metadata"
                    )
                seq = record["seq"]
                if expected is not None and seq != expected:
                    raise CorruptMetadataError(
                        f"controller log {self.log_path}: record seq {seq} at offset {pos}, expected {expected}"
                    )
                expected = seq + 1
                if seq > base_seq:
                    if not records and seq != base_seq + 1:
                        raise CorruptMetadataError(
                            f"controller log {self.log_path} starts at seq {seq} but the snapshot ends at {base_seq}"
                        )
                    records.append(record)
                good = line_end
            pos = line_end
        return records, good, len(data)

    @staticmethod
    def _parse_line(line: bytes) -> dict[str, Any] | None:
        try:
            record = json.loads(line)
        except ValueError:
            return None
        if not isinstance(record, dict) or not isinstance(record.get("seq"), int) or "op" not in record:
            return None
        return record

    # ---- appending -------------------------------------------------------------------------

    def append(self, record: dict[str, Any]) -> int:
        """Write one record (not yet durable) and return its seq. Callers serialise appends."""
        if self._fd < 0:
            raise RuntimeError("controller metadata log is not open")
        seq = self._written + 1
        line = json.dumps({**record, "seq": seq}, separators=(",", ":"), sort_keys=True) + "\n"
        data = line.encode("utf-8")
        written = os.write(self._fd, data)
        while written < len(data):  # a regular file takes it all at once; be safe anyway
            written += os.write(self._fd, data[written:])
        self._written = seq
        self._since_snapshot += 1
        return seq

    def sync(self, seq: int) -> None:
        """Return once every record up to ``seq`` is on disk (one flush serves many callers)."""
        if self._synced >= seq:
            return
        with self._sync_lock:
            if self._synced >= seq:
                return
            target = self._written
            _datasync(self._fd)
            self._synced = max(self._synced, target)

    def wants_snapshot(self) -> bool:
        return self._since_snapshot >= self.snapshot_every

    def write_snapshot(self, state: dict[str, Any]) -> None:
        """Persist ``state`` (the effect of every record written so far) and restart the log.

        The caller must hold the lock that serialises :meth:`append`.
        """
        with self._sync_lock:
            seq = self._written
            tmp = self.snapshot_path.with_suffix(".json.tmp")
            payload = json.dumps({"seq": seq, "state": state}, separators=(",", ":")).encode("utf-8")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(payload)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.snapshot_path)
            fsync_dir(self.directory)
            # Everything up to seq is now in the snapshot: the log can start over.
            os.ftruncate(self._fd, 0)
            os.fsync(self._fd)
            self._synced = seq
            self._since_snapshot = 0

    def close(self) -> None:
        with self._sync_lock:
            if self._fd >= 0:
                try:
                    _datasync(self._fd)
                    self._synced = self._written
                finally:
                    os.close(self._fd)
                    self._fd = -1
