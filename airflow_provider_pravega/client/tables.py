"""Pravega table segments over the wire: a durable key-value map with conditional updates.

Why: state that grows with history (e.g. every file an ingest ever committed) does not belong in a
state synchronizer, which every reader folds whole. A table segment answers point lookups by key
(ReadTable), so a reader pays for the keys it asks about, not for the table's size. Real Pravega
and the embedded server both serve it (CreateTableSegment, UpdateTableEntries, ReadTable,
RemoveTableKeys, ReadTableEntries); names follow the official client's ``<scope>/<name>_kvtable``
so delegation tokens and routing work as for a reader group's table.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from airflow_provider_pravega.client.errors import NoSuchSegmentError, SegmentStoreError
from airflow_provider_pravega.client.segment_client import SegmentStoreClient
from airflow_provider_pravega.client.segment_replies import raise_for_reply
from airflow_provider_pravega.client.streamcut import segments_of
from airflow_provider_pravega.protocol import naming, wire

__all__ = ["NOT_EXISTS", "UNCONDITIONAL", "TableConflictError", "TableSegment"]

#: Expected version meaning "the key must not exist yet".
NOT_EXISTS = wire.KEY_NOT_EXISTS
#: Expected version meaning "whatever the key holds".
UNCONDITIONAL = wire.KEY_NO_VERSION
#: Keys per request: well under the segment store's request and frame limits.
BATCH = 1000


class TableConflictError(SegmentStoreError):
    """A conditional table update found another version of a key (someone changed it since)."""


class TableSegment:
    """One table segment, created on first use. Keys and values are bytes; versions are ints."""

    def __init__(self, client: object, scope: str, name: str) -> None:
        self._segments: SegmentStoreClient = segments_of(client)
        self.segment = naming.table_segment_name(scope, name)
        self._created = False

    def _call(self, build, *, check: bool = True) -> wire.Reply:
        return self._segments.call(self.segment, build, check=check)

    def create(self) -> None:
        """Create the table when missing (idempotent; done once per instance)."""
        if self._created:
            return
        reply = self._call(lambda rid, tok: wire.CreateTableSegment(rid, self.segment, tok), check=False)
        if not isinstance(reply, (wire.SegmentCreated, wire.SegmentAlreadyExists)):
            raise_for_reply(reply, segment=self.segment)
            raise SegmentStoreError(f"unexpected reply {type(reply).__name__} to CreateTableSegment",
                                    segment=self.segment)
        self._created = True

    def _checked(self, reply: wire.Reply, what: str) -> wire.Reply:
        if isinstance(reply, (wire.TableKeyBadVersion, wire.TableKeyDoesNotExist)):
            raise TableConflictError(f"conditional {what} on table {self.segment} failed: "
                                     f"{type(reply).__name__}", segment=self.segment)
        raise_for_reply(reply, segment=self.segment)
        return reply

    def get(self, keys: Sequence[bytes]) -> list[tuple[int, bytes | None]]:
        """``(version, value)`` per key, in order; ``(NOT_EXISTS, None)`` for a missing key."""
        self.create()
        out: list[tuple[int, bytes | None]] = []
        for start in range(0, len(keys), BATCH):
            batch = tuple(wire.TableKey(k, UNCONDITIONAL) for k in keys[start:start + BATCH])
            reply = self._checked(self._call(lambda rid, tok, b=batch: wire.ReadTable(rid, self.segment, tok, b),
                                             check=False), "read")
            if not isinstance(reply, wire.TableRead) or len(reply.entries) != len(batch):
                raise SegmentStoreError(f"unexpected reply {type(reply).__name__} to ReadTable", segment=self.segment)
            for key, value in reply.entries:
                missing = key.key_version < 0 or not value.data
                out.append((NOT_EXISTS, None) if missing else (key.key_version, bytes(value.data)))
        return out

    def put(self, entries: Sequence[tuple[bytes, bytes, int]]) -> list[int]:
        """Write ``(key, value, expected_version)`` items; the new versions. Each request of up to
        :data:`BATCH` items is atomic; a version mismatch raises TableConflictError (that request
        wrote nothing)."""
        self.create()
        versions: list[int] = []
        for start in range(0, len(entries), BATCH):
            batch = tuple((wire.TableKey(k, ver), wire.TableValue(v)) for k, v, ver in entries[start:start + BATCH])
            reply = self._checked(self._call(
                lambda rid, tok, b=batch: wire.UpdateTableEntries(rid, self.segment, tok, b), check=False), "update")
            if not isinstance(reply, wire.TableEntriesUpdated):
                raise SegmentStoreError(f"unexpected reply {type(reply).__name__} to UpdateTableEntries",
                                        segment=self.segment)
            versions.extend(reply.updated_versions)
        return versions

    def remove(self, keys: Sequence[tuple[bytes, int]]) -> None:
        """Remove ``(key, expected_version)`` items (atomic per request, like :meth:`put`)."""
        self.create()
        for start in range(0, len(keys), BATCH):
            batch = tuple(wire.TableKey(k, ver) for k, ver in keys[start:start + BATCH])
            self._checked(self._call(lambda rid, tok, b=batch: wire.RemoveTableKeys(rid, self.segment, tok, b),
                                     check=False), "remove")

    def entries_page(self, token: bytes = b"", count: int = BATCH) -> tuple[list[tuple[bytes, int, bytes]], bytes]:
        """One page of ``(key, version, value)`` from ``token`` (b"": the start) and the token to
        continue from; an empty page means the end."""
        self.create()
        reply = self._checked(self._call(
            lambda rid, tok: wire.ReadTableEntries(rid, self.segment, tok, count, token), check=False), "scan")
        if not isinstance(reply, wire.TableEntriesRead):
            raise SegmentStoreError(f"unexpected reply {type(reply).__name__} to ReadTableEntries", segment=self.segment)
        rows = [(bytes(k.data), k.key_version, bytes(v.data)) for k, v in reply.entries]
        return rows, bytes(reply.continuation_token)

    def entries(self, count: int = BATCH) -> Iterator[tuple[bytes, int, bytes]]:
        """Every entry (in the server's iteration order)."""
        token = b""
        while True:
            rows, token = self.entries_page(token, count)
            if not rows:
                return
            yield from rows

    def exists(self) -> bool:
        try:
            self._call(lambda rid, tok: wire.ReadTable(rid, self.segment, tok, ()), check=True)
        except NoSuchSegmentError:
            return False
        return True

    def delete(self, must_be_empty: bool = False) -> None:
        reply = self._call(lambda rid, tok: wire.DeleteTableSegment(rid, self.segment, must_be_empty, tok), check=False)
        if not isinstance(reply, wire.NoSuchSegment):
            raise_for_reply(reply, segment=self.segment)
        self._created = False

