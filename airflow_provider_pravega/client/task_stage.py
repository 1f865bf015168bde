"""The task side of the transactional stage: what one write task does with the one transaction it
writes, for the ingest's write tasks and the data source's batch and streaming writes alike.

begin → register in the run (fenced: refused once the run reached its commit point or was taken
over) → kept alive while it writes → write → flush → recorded. The abort policy is one: a
transaction its task did not finish (an error, a bad record, a fenced registration or record) is
aborted at once, rather than left for its lease to end, and nothing of it is ever committed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from airflow_provider_pravega import fault_points
from airflow_provider_pravega.client.ingest import RunKeeper
from airflow_provider_pravega.client.ingest_errors import FencedError
from airflow_provider_pravega.client.ingest_resume import record_written
from airflow_provider_pravega.client.ingest_state import WRITING, StateStore
from airflow_provider_pravega.client.transactions import abort_quietly


def begin_transaction(manager: Any, scope: str, stream: str, lease_ms: int) -> Any:
    """A new transaction of ``scope/stream`` with a lease of ``lease_ms``."""
    return manager.begin(scope, stream, lease_ms)


def register_txn(store: StateStore, run_id: str, hex_id: str, owner: str | None = None) -> None:
    """Called by a task before it writes: fenced if the run is gone, past its commit point, or
    (with ``owner``) taken over by another driver."""

    def fn(state: dict[str, Any]) -> dict | None:
        run = state["runs"].get(run_id)
        if run is None or run["phase"] != WRITING:
            raise FencedError(run_id, "the run was recovered by another copy or already reached its commit point")
        if owner is not None and run["owner"] != owner:
            raise FencedError(run_id, "another copy of the task took the run over")
        if hex_id in run["txns"]:
            return None
        return {"op": "register", "run": run_id, "txn": hex_id}

    store.update(fn)


class TaskTransaction:
    """``with TaskTransaction(...) as txn:`` write with ``txn.writer``, then ``txn.finish(...)``.

    ``renew_run``: the run's coordinator, when the task must keep every transaction of its run
    alive while it writes (a data-source write, whose driver may not renew them); else the task
    keeps only its own transaction's lease, and the run's driver renews the run."""

    def __init__(self, client: Any, store: Any, *, scope: str, stream: str, run_id: str, owner: str | None,
                 lease_ms: int, renew_run: Any = None, begin: Any = None) -> None:
        self.client, self.store = client, store
        self.scope, self.stream, self.run_id, self.owner = scope, stream, run_id, owner
        self.lease_ms, self._renew_run = lease_ms, renew_run
        self._begin = begin or (lambda manager: begin_transaction(manager, scope, stream, lease_ms))
        self.manager = client.transactions
        self.info: Any = None
        self.writer: Any = None
        self._keeper: Any = None
        self._finished = False

    @property
    def hex_id(self) -> str:
        return f"{self.info.txn_id:032x}"

    def __enter__(self) -> TaskTransaction:
        self.info = self._begin(self.manager)
        try:
            register_txn(self.store, self.run_id, self.hex_id, self.owner)
            fault_points.reached("task_registered")
            if self._renew_run is not None:
                self._keeper = RunKeeper(self._renew_run, self.run_id)
                self._keeper.start()
            else:
                self._keeper = self.client.lease_keeper(max(1.0, self.lease_ms / 3000))
                self._keeper.add(self.scope, self.stream, self.info.txn_id)
            self.writer = self.manager.writer(self.scope, self.stream, self.info, check_open=False)
        except BaseException:
            self._close()
            self.abort()
            raise
        return self

    def finish(self, units: Iterable[str] | None = None, events: int = 0, size: int = 0,
               pieces: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """Flush (every event acknowledged, the transaction still open), renew its lease once more
        (a full lease from here to the commit), and, with ``units``, record what it holds: what a
        later try needs to commit it without this task's driver (``pieces``: what the task learnt
        of each unit while writing it, recorded at the commit point)."""
        self.writer.flush()
        if self._renew_run is not None:
            self._keeper.check()
        self.manager.ping(self.scope, self.stream, self.info.txn_id)
        if units is not None:
            record_written(self.store, self.run_id, self.hex_id, units, events, size, self.owner, pieces=pieces)
        self._finished = True

    def abort(self) -> None:
        abort_quietly(self.manager, self.scope, self.stream, [self.info.txn_id])

    def _close(self) -> None:
        if self._keeper is not None:
            if self._renew_run is not None:
                self._keeper.stop()
            else:
                self._keeper.close()
            self._keeper = None
        if self.writer is not None:
            self.writer.close()

    def __exit__(self, *exc: object) -> None:
        self._close()
        if not self._finished:
            self.abort()
