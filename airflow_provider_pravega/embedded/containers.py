"""Segment containers of the embedded server when it runs as a small cluster (``--segment-stores N``).

Pravega splits its segments over *segment containers* and its containers over the segment stores;
a store answers a request on a segment of a container it does not own with ``WrongHost``, and the
controller's ``getURI`` names the store that owns the segment's container. The embedded server
does the same with several segment-store ports in one process over one shared ``SegmentStorage``,
so a container "moves" without copying anything: data, attributes and the writers' event numbers
(what deduplicates a resent append) stay where they are, only the store answering changes.

Mapping: a segment belongs to the container of its *primary* segment (a transaction or transient
segment to its parent's, as in Pravega's ``SegmentToContainerMapper``, so a merge never crosses
containers). The container is a stable hash (CRC-32 of the canonical qualified name) modulo the
container count; this is NOT Pravega's Murmur3-based mapping, only as stable. Containers start
round-robin over the stores (container ``c`` on store ``c mod N``).
"""

from __future__ import annotations

import threading
import zlib

from airflow_provider_pravega.protocol import naming


def primary_segment_name(name: str) -> str:
    """The name a segment's container is computed from: the parent of a transaction or transient
    segment, in its canonical ``scope/stream/N.#epoch.E`` form (other names as they are)."""
    try:
        scope, stream, segment_id = naming.parse_qualified_segment_name(name)
    except ValueError:
        return name
    return naming.qualified_segment_name(scope, stream, segment_id)


class ContainerMap:
    """Which container holds a segment, and which store owns each container (thread-safe)."""

    def __init__(self, container_count: int, store_count: int) -> None:
        if container_count < 1 or store_count < 1:
            raise ValueError("a cluster needs at least one container and one segment store")
        self.container_count = container_count
        self.store_count = store_count
        self._owner = [c % store_count for c in range(container_count)]
        self._lock = threading.Lock()

    def container_of(self, segment: str) -> int:
        return zlib.crc32(primary_segment_name(segment).encode()) % self.container_count

    def owner_of_container(self, container: int) -> int:
        with self._lock:
            return self._owner[container]

    def owner(self, segment: str) -> int:
        """The index of the store owning ``segment``'s container."""
        return self.owner_of_container(self.container_of(segment))

    def containers_of(self, store: int) -> list[int]:
        with self._lock:
            return [c for c, s in enumerate(self._owner) if s == store]

    def assignment(self) -> dict[int, int]:
        """container -> store index."""
        with self._lock:
            return dict(enumerate(self._owner))

    def move(self, container: int, store: int) -> int:
        """Give ``container`` to ``store``; returns the store that owned it."""
        if not 0 <= container < self.container_count:
            raise ValueError(f"no container {container} (there are {self.container_count})")
        if not 0 <= store < self.store_count:
            raise ValueError(f"no segment store {store} (there are {self.store_count})")
        with self._lock:
            old, self._owner[container] = self._owner[container], store
            return old
