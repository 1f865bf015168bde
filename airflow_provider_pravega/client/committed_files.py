"""The files an ingest committed, kept in a table segment keyed by file (not in its synchronizer).

Why: the ingest state synchronizer is read whole at the start of every run; with one entry per
file ever committed, that grew with history (and its snapshot outgrew one event). Here each
committed file is one table entry (key: its path; value: its identity, the run and when the run
was recorded done), so the start of a run looks up only the files it lists, in batched ReadTable
requests, whatever the history. The synchronizer keeps only the run protocol. See
client/ingest.py for when entries are written (after the run's ``done`` record) and pruned.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_provider_pravega.client.tables import NOT_EXISTS, UNCONDITIONAL, TableConflictError, TableSegment

__all__ = ["CommittedFiles", "files_table_name"]

log = logging.getLogger(__name__)

#: Paths longer than this (UTF-8 bytes) are keyed by their SHA-256 (table keys are limited).
MAX_PLAIN_KEY = 1024
#: Conditional writes retried this often against concurrent writers of the same keys.
MAX_ATTEMPTS = 20


def files_table_name(state_stream: str) -> str:
    """The table of the ingest whose state is ``state_stream`` (same scope)."""
    return f"{state_stream}-files"


def _key(path: str) -> bytes:
    raw = path.encode("utf-8")
    return raw if len(raw) <= MAX_PLAIN_KEY else b"sha256:" + hashlib.sha256(raw).hexdigest().encode()


def _encode(ident: Mapping[str, Any]) -> bytes:
    return json.dumps(ident, separators=(",", ":"), sort_keys=True).encode()


class CommittedFiles:
    """The committed-file table of one ingest state. No connection of its own: requests go
    through the client's segment-store pool; the table is created on first use."""

    def __init__(self, client: Any, scope: str, state_stream: str) -> None:
        self.table = TableSegment(client, scope, files_table_name(state_stream))

    def lookup(self, paths: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The recorded identity (with ``run`` and ``at``) of each of ``paths`` that is remembered."""
        paths = list(paths)
        found = self.table.get([_key(p) for p in paths])
        return {p: json.loads(value) for p, (_ver, value) in zip(paths, found) if value is not None}

    def record(self, files: Mapping[str, Mapping[str, Any]], run: str, at: int | None) -> int:
        """Record ``files`` as committed by ``run`` (recorded done at ``at``); idempotent. Conditional
        on each key's version as read, and never over an entry recorded later (a newer run of the
        same file): a late or repeated finisher cannot overwrite newer knowledge. Returns how many
        entries were written."""
        items = sorted(files.items())
        written = 0
        for start in range(0, len(items), 1000):
            batch = items[start:start + 1000]
            for _attempt in range(MAX_ATTEMPTS):
                current = self.table.get([_key(p) for p, _i in batch])
                puts = []
                for (path, ident), (version, value) in zip(batch, current):
                    new = {**ident, "run": run, **({"at": at} if at is not None else {})}
                    if value is not None:
                        old = json.loads(value)
                        if old == new or (old.get("at") or 0) > (at or 0):
                            continue  # already there, or a later run's record
                    puts.append((_key(path), _encode(new), version if value is not None else NOT_EXISTS))
                try:
                    self.table.put(puts)
                except TableConflictError:
                    continue  # someone wrote some of these keys meanwhile: read again
                written += len(puts)
                break
            else:
                raise TableConflictError(f"could not record {len(batch)} committed file(s) in {self.table.segment}: "
                                         f"{MAX_ATTEMPTS} conflicting attempts", segment=self.table.segment)
        return written

    def put_many(self, rows: Iterable[tuple[str, Mapping[str, Any]]]) -> None:
        """Unconditional bulk write of ``(path, full record)`` (migration of an old state, benchmarks)."""
        batch: list[tuple[bytes, bytes, int]] = []
        for path, record in rows:
            batch.append((_key(path), _encode(record), -(2**63)))
            if len(batch) >= 1000:
                self.table.put(batch)
                batch = []
        if batch:
            self.table.put(batch)

    def clear(self, progress_every: int = 100_000) -> int:
        """Remove every entry (resetting an ingest); returns how many. The table itself stays:
        Pravega 0.13 does not let a deleted table segment's name be created again."""
        removed = 0
        while True:
            rows, _ = self.table.entries_page(b"")
            if not rows:
                return removed
            self.table.remove([(k, UNCONDITIONAL) for k, _ver, _v in rows])
            removed += len(rows)
            if removed // progress_every != (removed - len(rows)) // progress_every:
                log.info("cleared %d committed-file entries of %s so far", removed, self.table.segment)

    def prune(self, token: bytes, before_ms: int, budget: int) -> tuple[int, bytes]:
        """Remove entries recorded done before ``before_ms``, scanning at most about ``budget``
        entries from ``token`` (b"": the start); returns (removed, token to continue from, b""
        after the end). A bounded sweep per run keeps every run's cost independent of history;
        each removal is conditional on the version scanned (a file re-recorded meanwhile stays)."""
        removed = scanned = 0
        while scanned < budget:
            rows, next_token = self.table.entries_page(token, budget - scanned)  # the server may send fewer
            if not rows:
                return removed, b""
            scanned += len(rows)
            old = [(k, ver) for k, ver, v in rows if (json.loads(v).get("at") or 0) < before_ms]
            if not old:
                token = next_token
                continue
            try:
                self.table.remove(old)
                removed += len(old)
            except TableConflictError:  # one changed meanwhile: the others one by one
                for item in old:
                    try:
                        self.table.remove([item])
                        removed += 1
                    except TableConflictError:
                        pass
            token = next_token
        return removed, token
