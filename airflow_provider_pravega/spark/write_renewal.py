"""Keeping a user's own ``df.write.format("pravega")`` alive from the process that registered the
data source, between its last task and its commit.

Why: a batch write's transactions are renewed by its tasks while any of them runs (the
transactional stage's :class:`~airflow_provider_pravega.client.ingest.RunKeeper`). Once the last
task is done, nothing renews them until the driver's commit, which Spark runs later in a fresh
Python worker; on a busy cluster, or when a job's commit waits, that gap can exceed the lease.
The process that called :func:`~airflow_provider_pravega.spark.datasource.register` with
``renew_writes=`` (the classic driver's Python process, or a Spark Connect client) waits for the
job anyway: its renewer thread follows a registry in Pravega where each exactly-once write of the
session announces its run, and keeps every announced run alive (heartbeat and leases, as a task
does) until the run passes its commit point, is retired, or is taken over.

The registry is a state synchronizer in ``<scope>/spark-write-renewals`` (the scope named in
``renew_writes``); entries carry the renewer's token, so many sessions share one registry and each
renews only its own writes. Nothing is kept on local disk: losing the registering process lets the
leases lapse, which is the safe outcome (the rerun with the same ``write_id`` heals it).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_pravega.client.synchronizer import StateSynchronizer
from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.errors import PravegaError
from airflow_provider_pravega.client.ingest import IngestCoordinator, RunKeeper
from airflow_provider_pravega.client.ingest_location import open_state_store, state_location
from airflow_provider_pravega.client.ingest_state import COMMITTING, WRITING

log = logging.getLogger(__name__)

REGISTRY_STREAM = "spark-write-renewals"
#: Compact the registry once this many bytes of updates follow its head.
COMPACT_AFTER_BYTES = 256 * 1024


@dataclass(frozen=True)
class Renewal:
    """What a registered data source carries to its writers (pickled with the class; no secret):
    the renewer's token, the registry's scope and the controller it is reached through."""

    token: str
    scope: str
    controller: str


def registry_state() -> dict[str, Any]:
    return {"writes": {}}


def apply_registry(state: dict[str, Any], op: Mapping[str, Any]) -> dict[str, Any]:
    writes = state["writes"]
    if op["op"] == "follow":
        writes[op["key"]] = dict(op["write"])
    elif op["op"] == "retire":
        entry = writes.get(op["key"])
        if entry is not None and (op.get("run") is None or entry.get("run_id") == op["run"]):
            del writes[op["key"]]
    return state


def open_registry(client: Any, scope: str) -> Any:
    return StateSynchronizer(client, scope, REGISTRY_STREAM, registry_state(), apply_registry)


def write_key(renewal: Renewal, scope: str, stream: str, write_id: str | None, owner: str) -> str:
    """One entry per (session, target, write_id): a rerun of the same write replaces its entry,
    so the renewer stops keeping the earlier run alive before the rerun waits for it."""
    return f"{renewal.token}/{scope}/{stream}/" + (f"id:{write_id}" if write_id is not None else f"own:{owner}")


def announce(client: Any, renewal: Renewal, key: str, write: Mapping[str, Any] | None) -> None:
    """Record (``write``) or retire (None) a write in the registry. ``write`` holds the target
    ``scope``, ``stream``, ``ingest_id``, ``state_scope`` (None: the target's scope), ``run_id``
    (None while the run is being started), ``owner``, ``stale_after_s`` and ``lease_ms``."""
    with open_registry(client, renewal.scope) as registry:
        if write is None:
            registry.update(lambda s: {"op": "retire", "key": key} if key in s["writes"] else None)
        else:
            registry.update(lambda _s: {"op": "follow", "key": key,
                                        "write": {**write, "token": renewal.token}})


class WriteRenewer(threading.Thread):
    """The registering process's renewer: one RunKeeper per announced run of its token."""

    def __init__(self, config: Any, scope: str, *, poll_s: float = 1.0) -> None:
        super().__init__(name="pravega-write-renewer", daemon=True)
        self.config = config
        self.renewal = Renewal(uuid.uuid4().hex, scope, config.controller_uri)
        self.poll_s = poll_s
        self.stop_event = threading.Event()
        self.followed: dict[str, _Followed] = {}
        self.renewed_runs: set[str] = set()  # every run this renewer kept alive (for tests and logs)

    def run(self) -> None:
        with PravegaClient(self.config) as client:
            client.admin.create_scope(self.renewal.scope)
            registry = open_registry(client, self.renewal.scope)
            try:
                while not self.stop_event.is_set():
                    try:
                        self._follow(registry, registry.fetch()["writes"])
                        if (registry.revision or 0) - registry.head_offset() > COMPACT_AFTER_BYTES:
                            registry.compact()
                    except PravegaError as exc:  # transient: the next round tries again
                        log.warning("write renewer: %s (will retry)", exc)
                    self.stop_event.wait(self.poll_s)
            finally:
                for followed in self.followed.values():
                    followed.stop()
                self.followed.clear()
                registry.close()

    def _follow(self, registry: Any, writes: Mapping[str, Any]) -> None:
        mine = {k: w for k, w in writes.items() if w.get("token") == self.renewal.token and w.get("run_id")}
        for key, followed in list(self.followed.items()):
            entry = mine.get(key)
            if entry is None or entry["run_id"] != followed.run_id or followed.over():
                followed.stop()
                del self.followed[key]
                if entry is not None and entry["run_id"] == followed.run_id:  # the run is past us: drop its entry
                    registry.update(lambda s, k=key, r=followed.run_id: {"op": "retire", "key": k, "run": r}
                                    if s["writes"].get(k, {}).get("run_id") == r else None)
        for key, entry in mine.items():
            if key not in self.followed:
                self.followed[key] = _Followed(self.config, entry)
                self.renewed_runs.add(entry["run_id"])
                log.info("write renewer: keeping run %s of the write into %s/%s alive until its commit",
                         entry["run_id"], entry["scope"], entry["stream"])

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=30)


class _Followed:
    """One announced run kept alive: its own client, state store and RunKeeper."""

    def __init__(self, config: Any, entry: Mapping[str, Any]) -> None:
        self.run_id = entry["run_id"]
        self.client = PravegaClient(config)
        self.store = None
        self.keeper = None
        try:
            self.store = open_state_store(
                self.client, *state_location(entry["scope"], entry["stream"], entry["ingest_id"],
                                             entry.get("state_scope")), create=False)
            coord = IngestCoordinator(self.store, self.client.transactions, entry["scope"], entry["stream"],
                                      owner=entry["owner"], stale_after_s=entry["stale_after_s"],
                                      lease_ms=entry["lease_ms"], lease_keeper=self.client.lease_keeper)
            self.coord = coord
            self.keeper = RunKeeper(coord, self.run_id)
            self.keeper.start()
        except BaseException:
            self.stop()
            raise

    def over(self) -> bool:
        """The run needs no more upkeep: taken over or gone (the keeper was fenced), or past the
        commit requests (the driver's commit stage owns it from there)."""
        if self.keeper is None or not self.keeper.is_alive():
            return True
        run = self.store.fetch()["runs"].get(self.run_id)
        return run is None or run["owner"] != self.coord.owner or run["phase"] not in (WRITING, COMMITTING)

    def stop(self) -> None:
        if self.keeper is not None:
            self.keeper.stop()
        if self.store is not None:
            self.store.close()
        self.client.close()
