"""The exactly-once ingest protocol, independent of Spark and Airflow.

An *ingest* (a stable id such as ``dag_id.task_id``) moves files into a stream. Its durable
record lives in a state synchronizer (a revisioned single-segment stream, updated with conditional
appends), so every step below is decided against the latest state and fenced against any other
copy of the job:

1. **Recover** runs whose driver died (no heartbeat for ``stale_after_s``): a run that reached its
   commit point (phase COMMITTING) is rolled forward — every listed transaction is committed —
   and a run still WRITING is rolled back — every registered transaction is aborted. A listed
   transaction that is ABORTED or UNKNOWN at that point is a loud error, never skipped.
2. **Plan**: the files not yet committed (identity = path + size + modification time, see
   :func:`same_file`; a committed path that changed is an error unless re-ingesting is allowed). Files held by another
   *live* run are waited for, not taken.
3. **Start** a run (conditional update). From here the run heartbeats; losing the run (someone
   recovered it as stale) fences this driver: its next update fails and it aborts its own work.
4. **Tasks** each begin one transaction, **register** it (conditional update, fenced) *before*
   writing, write and flush (pre-commit), and report (txn, events, bytes).
5. The driver keeps every registered transaction's lease alive until it ends.
6. **Commit point**: phase COMMITTING with the exact list of transactions of successful tasks.
7. Commit them all, wait for COMMITTED, then **done**: the run's files become committed.

A crash anywhere, then a rerun, yields every record exactly once.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_provider_pravega.client.errors import PravegaError

log = logging.getLogger(__name__)

WRITING = "WRITING"
COMMITTING = "COMMITTING"


class IngestError(PravegaError):
    """The ingest cannot proceed; the message says why and what to do."""


class FencedError(IngestError):
    """Another copy of this ingest took over the run (this one was presumed dead)."""

    def __init__(self, run_id: str, detail: str = "") -> None:
        self.run_id = run_id
        super().__init__(
            f"ingest run {run_id} is no longer owned by this process{': ' + detail if detail else ''}. "
            "Another copy of the task (a retry, or a copy started while this one looked dead) recovered "
            "it; this copy stops without committing anything."
        )


class ChangedFileError(IngestError):
    def __init__(self, path: str, before: Mapping[str, Any], now: Mapping[str, Any]) -> None:
        self.path = path
        super().__init__(
            f"{path} was already ingested ({describe_identity(before)}) and has changed since "
            f"({describe_identity(now)}). Ingesting it again would duplicate its unchanged records. Pass "
            "allow_changed_files=True to ingest the new content anyway, or write changes to a new file."
        )


class LostCommitError(IngestError):
    """A transaction listed at the commit point was aborted: its events can never be committed."""


# ---------------------------------------------------------------------------------------------
# The state and its transitions (pure: the synchronizer replays them in every process)
# ---------------------------------------------------------------------------------------------


def initial_state() -> dict[str, Any]:
    return {"committed": {}, "runs": {}, "completed_runs": 0}


def apply_update(state: dict[str, Any], op: Mapping[str, Any]) -> dict[str, Any]:
    """Fold one update into the state. Updates are appended only after the writer validated them
    against exactly this state (conditional append), so applying them needs no checks beyond
    tolerating updates that became moot."""
    kind = op["op"]
    runs = state["runs"]
    run = runs.get(op.get("run"))
    if kind == "start":
        runs[op["run"]] = {
            "phase": WRITING, "files": dict(op["files"]), "txns": [], "commit": [],
            "owner": op["owner"], "heartbeat_ms": op["ts"], "started_ms": op["ts"],
        }
    elif run is None:
        return state
    elif kind == "register":
        if op["txn"] not in run["txns"]:
            run["txns"].append(op["txn"])
    elif kind == "heartbeat":
        run["heartbeat_ms"] = max(run["heartbeat_ms"], op["ts"])
    elif kind == "committing":
        run["phase"] = COMMITTING
        run["commit"] = list(op["txns"])
        run["heartbeat_ms"] = max(run["heartbeat_ms"], op["ts"])
    elif kind == "done":
        for path, ident in run["files"].items():
            state["committed"][path] = {**ident, "run": op["run"]}
        del runs[op["run"]]
        state["completed_runs"] = state.get("completed_runs", 0) + 1
    elif kind == "abandon":
        del runs[op["run"]]
    elif kind == "takeover":
        run["owner"] = op["owner"]
        run["heartbeat_ms"] = op["ts"]
    return state


class StateStore(Protocol):
    """What the coordinator needs from a state synchronizer."""

    def fetch(self) -> dict[str, Any]:
        """The latest state."""

    def update(self, fn: Callable[[dict[str, Any]], list[dict] | dict | None]) -> dict[str, Any]:
        """Append ``fn(latest state)``'s update(s) conditionally; re-read and retry on conflict."""


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------


def file_identity(size: int, mtime_ms: int | None = None, fp: str | None = None) -> dict[str, Any]:
    """What the state records about a file: its size and modification time as the filesystem lists
    them (nothing is read), plus a content fingerprint when one was computed (BLAKE2b-160 of every
    byte, hex; states written before listing through Spark hold only size and fingerprint)."""
    ident: dict[str, Any] = {"size": int(size)}
    if mtime_ms is not None:
        ident["mtime"] = int(mtime_ms)
    if fp is not None:
        ident["fp"] = fp
    return ident


def same_file(before: Mapping[str, Any], now: Mapping[str, Any]) -> bool | None:
    """Whether a listed file is the one already committed: True/False, or None when only a content
    fingerprint of the listed file can tell (the record has a fingerprint but no usable time)."""
    if before["size"] != now["size"]:
        return False
    if before.get("mtime") is not None and before.get("mtime") == now.get("mtime"):
        return True
    if before.get("fp") is not None:
        return before["fp"] == now["fp"] if now.get("fp") is not None else None
    # Same size, another modification time and no recorded fingerprint: it was rewritten; whether
    # with the same bytes cannot be known, so it counts as changed (an error, never a silent skip).
    return False


def needs_fingerprint(state: Mapping[str, Any], identities: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Files whose planning needs a content fingerprint (see same_file)."""
    committed = state["committed"]
    return sorted(p for p, ident in identities.items()
                  if p in committed and same_file(committed[p], ident) is None)


def describe_identity(ident: Mapping[str, Any]) -> str:
    parts = [f"size {ident['size']}"]
    if ident.get("mtime") is not None:
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ident["mtime"] / 1000))
        parts.append(f"modified {when}.{ident['mtime'] % 1000:03d}Z")
    if ident.get("fp"):
        parts.append(f"fingerprint {ident['fp'][:16]}…")
    return ", ".join(parts)


@dataclass(frozen=True)
class FilePlan:
    to_ingest: dict[str, dict[str, Any]]  # path -> identity
    skipped: list[str]  # already committed, unchanged


def plan_files(
    state: Mapping[str, Any], identities: Mapping[str, Mapping[str, Any]], *, allow_changed_files: bool
) -> FilePlan:
    committed = state["committed"]
    to_ingest: dict[str, dict[str, Any]] = {}
    skipped: list[str] = []
    for path, ident in identities.items():
        before = committed.get(path)
        if before is None:
            to_ingest[path] = dict(ident)
        elif same_file(before, ident):
            skipped.append(path)
        elif allow_changed_files:
            to_ingest[path] = dict(ident)
        else:
            raise ChangedFileError(path, before, ident)
    return FilePlan(to_ingest, skipped)


# ---------------------------------------------------------------------------------------------
# The driver side
# ---------------------------------------------------------------------------------------------


def _now_ms() -> int:
    return int(time.time() * 1000)


class TransactionOps(Protocol):
    """The transaction calls the coordinator needs (client.transactions.TransactionManager)."""

    def status(self, scope: str, stream: str, txn_id: int) -> Any: ...

    def commit(self, scope: str, stream: str, txn_id: int, *args: Any, **kwargs: Any) -> Any: ...

    def abort(self, scope: str, stream: str, txn_id: int, *args: Any, **kwargs: Any) -> Any: ...

    def wait_for(self, scope: str, stream: str, txn_id: int, states: Any, timeout_s: float, **kw: Any) -> Any: ...


class IngestCoordinator:
    """Drives one ingest's protocol against its state store and the controller."""

    def __init__(
        self,
        store: StateStore,
        txns: TransactionOps,
        scope: str,
        stream: str,
        *,
        owner: str | None = None,
        stale_after_s: float = 60.0,
        crash_hook: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.txns = txns
        self.scope = scope
        self.stream = stream
        self.owner = owner or f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.stale_after_ms = int(stale_after_s * 1000)
        self._crash = crash_hook or (lambda _step: None)

    # recovery --------------------------------------------------------------------------------

    def stale_runs(self, state: Mapping[str, Any]) -> list[str]:
        horizon = _now_ms() - self.stale_after_ms
        return [rid for rid, run in state["runs"].items() if run["heartbeat_ms"] < horizon]

    def recover_stale_runs(self) -> list[str]:
        """Finish or undo every run whose driver stopped heartbeating; returns their ids."""
        recovered = []
        for run_id in self.stale_runs(self.store.fetch()):
            # Take the run over first (fenced): two recoverers never act on one run at once.
            def take(state: dict[str, Any], run_id: str = run_id) -> dict | None:
                run = state["runs"].get(run_id)
                if run is None or run["heartbeat_ms"] >= _now_ms() - self.stale_after_ms:
                    raise _Skip()
                return {"op": "takeover", "run": run_id, "owner": self.owner, "ts": _now_ms()}

            try:
                state = self.store.update(take)
            except _Skip:
                continue
            self.finish_recovered_run(run_id, state["runs"][run_id])
            recovered.append(run_id)
        return recovered

    def finish_recovered_run(self, run_id: str, run: Mapping[str, Any]) -> None:
        if run["phase"] == COMMITTING:
            log.warning("recovering ingest run %s: it reached its commit point; committing its %d transaction(s)",
                        run_id, len(run["commit"]))
            self.commit_all(run_id, run["commit"])
            self._abort_quietly(t for t in run["txns"] if t not in set(run["commit"]))
            self.store.update(self._owned(run_id, lambda: {"op": "done", "run": run_id}))
        else:
            log.warning("recovering ingest run %s: it died while writing; aborting its %d transaction(s)",
                        run_id, len(run["txns"]))
            self._abort_quietly(run["txns"])
            self.store.update(self._owned(run_id, lambda: {"op": "abandon", "run": run_id}))

    # a run -----------------------------------------------------------------------------------

    def start_run(
        self, identities: Mapping[str, Mapping[str, Any]], *, allow_changed_files: bool = False,
        wait_for_live_runs_s: float = 3600.0, poll_s: float = 2.0,
    ) -> tuple[str | None, FilePlan]:
        """Record a new run over the files not yet committed; ``(None, plan)`` when there is nothing
        to do. Files another live run holds are waited for (that run may commit them)."""
        run_id = f"run-{uuid.uuid4().hex[:12]}"
        deadline = time.monotonic() + wait_for_live_runs_s
        while True:
            self.recover_stale_runs()
            holder: list[str] = []
            plan_box: list[FilePlan] = []

            def start(state: dict[str, Any]) -> dict | None:
                holder.clear()
                plan_box.clear()
                plan = plan_files(state, identities, allow_changed_files=allow_changed_files)
                plan_box.append(plan)
                busy = {p: rid for rid, run in state["runs"].items() for p in run["files"]}
                clash = sorted({busy[p] for p in plan.to_ingest if p in busy})
                if clash:
                    holder.extend(clash)
                    raise _Skip()
                if not plan.to_ingest:
                    return None
                return {"op": "start", "run": run_id, "files": plan.to_ingest, "owner": self.owner, "ts": _now_ms()}

            try:
                state = self.store.update(start)
            except _Skip:
                if time.monotonic() > deadline:
                    raise IngestError(
                        f"files of this ingest are held by run(s) {', '.join(holder)} of another live copy of the "
                        f"task for more than {wait_for_live_runs_s:.0f} s; stop that copy or wait for it"
                    ) from None
                log.info("waiting for live run(s) %s that hold some of these files", ", ".join(holder))
                time.sleep(poll_s)
                continue
            plan = plan_box[-1]
            if run_id not in state["runs"]:
                return None, plan
            self._crash("after_run_record")
            return run_id, plan

    def _owned(self, run_id: str, make: Callable[[], dict]) -> Callable[[dict[str, Any]], dict]:
        def fn(state: dict[str, Any]) -> dict:
            run = state["runs"].get(run_id)
            if run is None or run["owner"] != self.owner:
                raise FencedError(run_id, "its record is gone or belongs to another owner")
            return make()

        return fn

    def heartbeat(self, run_id: str) -> None:
        self.store.update(self._owned(run_id, lambda: {"op": "heartbeat", "run": run_id, "ts": _now_ms()}))

    def registered_txns(self, run_id: str) -> list[str]:
        run = self.store.fetch()["runs"].get(run_id)
        if run is None or run["owner"] != self.owner:
            raise FencedError(run_id)
        return list(run["txns"])

    def mark_committing(self, run_id: str, txns: Sequence[str]) -> None:
        """The commit point: from here on the run's transactions will be committed, crash or not."""
        def fn(state: dict[str, Any]) -> dict:
            run = state["runs"].get(run_id)
            if run is None or run["owner"] != self.owner or run["phase"] != WRITING:
                raise FencedError(run_id, "cannot reach the commit point")
            missing = [t for t in txns if t not in run["txns"]]
            if missing:
                raise IngestError(f"transactions {missing} were never registered in run {run_id}")
            return {"op": "committing", "run": run_id, "txns": list(txns), "ts": _now_ms()}

        self.store.update(fn)
        self._crash("after_commit_record")

    def commit_all(self, run_id: str, txns: Sequence[str], timeout_s: float = 300.0) -> None:
        """Commit every listed transaction (idempotent) and wait until all are COMMITTED."""
        for i, hex_id in enumerate(txns):
            txn_id = int(hex_id, 16)
            state = _state_name(self.txns.status(self.scope, self.stream, txn_id))
            if state in ("ABORTED", "ABORTING", "UNKNOWN"):
                raise LostCommitError(
                    f"transaction {hex_id} of ingest run {run_id} is {state} although the run reached its commit "
                    f"point: its events cannot be committed any more (was the task down longer than the "
                    f"transaction lease?). The run's files stay uncommitted; re-running the ingest will write them "
                    f"again, so events of this run's other, committed transactions would be duplicated — inspect "
                    f"the stream before re-running."
                )
            if state == "OPEN":
                self.txns.commit(self.scope, self.stream, txn_id, wait=False)
            if i == 0:
                self._crash("after_first_commit")
        for hex_id in txns:
            self.txns.wait_for(self.scope, self.stream, int(hex_id, 16), _committed_states(), timeout_s=timeout_s)
        self._crash("after_commits")

    def finish(self, run_id: str) -> None:
        state = self.store.update(self._owned(run_id, lambda: {"op": "done", "run": run_id}))
        compact = getattr(self.store, "compact", None)
        if compact is not None and state.get("completed_runs", 0) % COMPACT_EVERY_RUNS == 0:
            compact()  # new readers then start from one full record instead of the whole history

    def abandon(self, run_id: str) -> None:
        """Undo a run this driver owns (a task failed, bad input): abort every registered txn."""
        try:
            txns = self.registered_txns(run_id)
        except FencedError:
            return
        self._abort_quietly(txns)
        try:
            self.store.update(self._owned(run_id, lambda: {"op": "abandon", "run": run_id}))
        except FencedError:
            pass

    def _abort_quietly(self, hex_ids: Iterable[str]) -> None:
        for hex_id in hex_ids:
            try:
                self.txns.abort(self.scope, self.stream, int(hex_id, 16))
            except PravegaError as exc:  # already committed/aborted/expired: nothing to undo
                log.debug("abort of %s: %s", hex_id, exc)


def register_txn(store: StateStore, run_id: str, hex_id: str) -> None:
    """Called by a task before it writes: fenced if the run is gone or past its commit point."""

    def fn(state: dict[str, Any]) -> dict | None:
        run = state["runs"].get(run_id)
        if run is None or run["phase"] != WRITING:
            raise FencedError(run_id, "the run was recovered by another copy or already reached its commit point")
        if hex_id in run["txns"]:
            return None
        return {"op": "register", "run": run_id, "txn": hex_id}

    store.update(fn)


def open_state_store(client: Any, scope: str, stream: str) -> Any:
    """The ingest's state synchronizer on ``scope/stream`` (created with one segment if missing)."""
    from airflow_provider_pravega.client.synchronizer import StateSynchronizer

    return StateSynchronizer(client, scope, stream, initial_state(), apply_update)


COMPACT_EVERY_RUNS = 16


class _Skip(Exception):
    """Internal: abandon an update attempt without appending."""


def _state_name(status: Any) -> str:
    return str(getattr(status, "name", status)).upper()


def _committed_states() -> Any:
    from airflow_provider_pravega.client.controller import TxnStatus

    return {TxnStatus.COMMITTED}
