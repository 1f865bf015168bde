"""The exactly-once ingest protocol, independent of Spark and Airflow.

An *ingest* moves files into one target stream. Its durable record lives in a state synchronizer
(a revisioned single-segment stream, updated with conditional appends) keyed by what the ingest
means — the target ``scope/stream`` and the ingest id — so every step below is decided against the
latest state and fenced against any other copy of the job. :meth:`IngestCoordinator.run` drives
every step; the caller (the Spark job) supplies only the files and the write stage:

1. **Recover** earlier runs: a run whose commit requests were acknowledged (REQUESTED) is recorded
   done (Pravega completes an acknowledged commit; a transaction it later forgets, UNKNOWN, still
   counts as committed). A run whose driver died — no heartbeat for ``stale_after_s``, or owned by
   an earlier try of the same Airflow task instance (taken over at once) — is rolled forward when
   it reached its commit point (COMMITTING: every listed transaction is committed) and rolled back
   otherwise (WRITING: every registered transaction is aborted).
2. **Plan**: the files not yet committed (identity = path + size + modification time, see
   :func:`same_file`; a committed path that changed is an error unless re-ingesting is allowed).
   A line file (jsonl, text) is committed as byte ranges: a file that grew past its committed end,
   with the committed bytes unchanged, contributes only the piece after that end (see
   :func:`plan_files`); one that changed in place is a :class:`ChangedFileError`.
   Files held by another *live* run are waited for, not taken.
3. **Start** a run (conditional update). From here the run heartbeats; losing the run (another
   copy took it over) fences this driver and its tasks: their next update fails.
4. **Write** (the caller): each task begins one transaction, **registers** it (fenced) *before*
   writing, writes and flushes (pre-commit), then records what it holds (``written``, fenced: a
   later try of a killed task commits a run so recorded without writing again, see
   client/ingest_resume.py). The driver keeps every registered transaction's lease alive until
   the commit requests are recorded.
5. **Commit point**: phase COMMITTING with the exact list of transactions (recorded *before* any
   commit request is sent).
6. **Request** every commit; once the controller acknowledged all of them, phase REQUESTED.
7. **Done** when every transaction is COMMITTED (the driver with ``wait_for_commit``, the commit
   sensor, or the next run): the run's files become committed — entries of the committed-file
   table keyed by path (client/committed_files.py), so the state keeps only the run protocol.

**Interval index** (a run given an ``interval``, e.g. its Airflow data interval): the run waits at
its commit point until no other run of the ingest is between its commit point and its done record,
records the stream's tail with the commit point (``before``), and the tail once every transaction
is COMMITTED with the done record (``end``): ``state["intervals"][interval]`` lists these
``(before, end)`` pieces in commit order (several when an interval ran again with new files, one
empty piece when its run had nothing to ingest), for the last :data:`KEEP_INTERVALS` intervals. Since
runs of the ingest commit one at a time, a piece holds every event that run committed and no event
of another run of this ingest; events other writers (or runs of this ingest without an interval)
appended to the stream while the piece was open lie inside it too. The export's ``interval_of``
reads exactly these pieces.

A crash anywhere, then a rerun, yields every record exactly once — with one documented exception
that is never silent: a driver killed between its commit point and the REQUESTED record, whose
retry comes only after the controller forgot the transactions, finds them UNKNOWN; nothing can
tell "committed, then forgotten" from "never committed, expired, then forgotten", so the run stops
with :class:`UnresolvedCommitError` naming the run, its files and ``unknown_commits``.

Its parts have modules of their own: the state's records and how they fold
(client/ingest_state.py), file identities, the plan and the committed-file table
(client/ingest_plan.py), where an ingest's state lives and how it is opened, legacy states adopted
(client/ingest_location.py), and the ingest's errors (client/ingest_errors.py).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_pravega._clock import now_ms
from airflow_provider_pravega.client.controller_types import TxnStatus
from airflow_provider_pravega.client.errors import PravegaError, TransactionAbortedError
from airflow_provider_pravega.client.ingest_errors import (
    FencedError,
    IngestError,
    LostCommitError,
    UnresolvedCommitError,
)
from airflow_provider_pravega.client.ingest_location import open_state_store, state_location
from airflow_provider_pravega.client.ingest_plan import (
    PRUNE_BUDGET,
    FilePlan,
    index_done_runs,
    known_files,
    move_committed_to_table,
    plan_files,
)
from airflow_provider_pravega.client.ingest_state import (
    COMMITTING,
    KEEP_INTERVALS,
    REQUESTED,
    WRITING,
    StateStore,
    encode_holds,
)
from airflow_provider_pravega.client.transactions import TransactionManager, abort_quietly

log = logging.getLogger(__name__)


#: The driver heartbeats at least this many times per ``stale_after_s``.
HEARTBEATS_PER_STALE = 4
#: ... but never more often than this (synchronizer traffic).
MIN_HEARTBEAT_S = 0.5
MAX_HEARTBEAT_S = 10.0
#: So the smallest ``stale_after_s`` that can be safe.
MIN_STALE_AFTER_S = HEARTBEATS_PER_STALE * MIN_HEARTBEAT_S
UNKNOWN_COMMITS = ("committed", "not_committed")


#: A run's file list larger than this (JSON bytes) is not put in its start record but staged first
#: in parts of at most STAGE_PART_BYTES, each its own state record: a state record is one Pravega
#: event (8 MiB at most, about 75,000 files), and a run of more files must still record its start.
INLINE_FILES_BYTES = 1024 * 1024
STAGE_PART_BYTES = 2 * 1024 * 1024


def check_timing(stale_after_s: float, lease_ms: int) -> float:
    """The driver's heartbeat interval for these settings; IngestError when they cannot be safe.

    Rule: the driver heartbeats every ``min(10 s, lease/3, stale_after_s/4)`` but at most every
    0.5 s, so a live run misses at least four heartbeats before it is presumed dead, and every
    lease is renewed three times per lease. Hence ``stale_after_s >= 2 s`` and ``lease >= 1.5 s``.
    """
    if not isinstance(stale_after_s, (int, float)) or not math.isfinite(stale_after_s) or (
        stale_after_s < MIN_STALE_AFTER_S
    ):
        raise IngestError(
            f"stale_after_s={stale_after_s!r} is below the safe minimum of {MIN_STALE_AFTER_S:g} s: the driver "
            f"heartbeats at most every {MIN_HEARTBEAT_S:g} s and a run is presumed dead only after "
            f"{HEARTBEATS_PER_STALE} missed heartbeats (a live run would be taken over). Raise stale_after_s."
        )
    if lease_ms < 3 * MIN_HEARTBEAT_S * 1000:
        raise IngestError(
            f"a transaction lease of {lease_ms} ms is too short: leases are renewed at most every "
            f"{MIN_HEARTBEAT_S:g} s, three times per lease; use at least {int(3 * MIN_HEARTBEAT_S * 1000)} ms"
        )
    return max(MIN_HEARTBEAT_S, min(MAX_HEARTBEAT_S, lease_ms / 3000, stale_after_s / HEARTBEATS_PER_STALE))


@dataclass
class WriteResult:
    """What the write stage reports: the transactions its tasks pre-committed, and counters."""

    txns: list[str]
    events: int = 0
    bytes: int = 0
    #: txn -> the units (files) it holds, whole: each unit in one transaction only. With it, a
    #: transaction aborted after the commit point (its lease lapsed) is healed: its files are
    #: planned again instead of failing the ingest with LostCommitError.
    holds: dict[str, list[str]] | None = None
    #: unit -> what to record of a held unit that was not planned up front (a data-source write's
    #: input partition: its row count and digest), recorded at the commit point.
    units: dict[str, dict[str, Any]] | None = None


@dataclass
class RunOutcome:
    run_id: str | None
    plan: FilePlan
    recovered: list[str] = field(default_factory=list)  # killed runs rolled forward/back
    finished: list[str] = field(default_factory=list)  # earlier runs with acknowledged commits, recorded done
    txns: list[str] = field(default_factory=list)
    status: str | None = None  # COMMITTED (awaited) or COMMITTING (requested, acknowledged)
    events: int = 0
    bytes: int = 0
    #: files of this run whose transactions were aborted after the commit point: not committed,
    #: planned again by the next run (run_ingest runs again at once)
    returned: list[str] = field(default_factory=list)


class IngestCoordinator:
    """Drives one ingest's protocol against its state store and the controller.

    ``task_instance``/``try_number`` identify the Airflow task try running this driver: a run
    owned by an earlier try of the same task instance is taken over at once (Airflow already
    decided that try is gone), without waiting ``stale_after_s``.

    ``tail_positions`` returns the target stream's tail (segment id text -> offset): needed by runs
    with an ``interval`` (the interval index, see the module doc); ``keep_intervals`` bounds it.
    """

    def __init__(
        self,
        store: StateStore,
        txns: TransactionManager,
        scope: str,
        stream: str,
        *,
        owner: str | None = None,
        stale_after_s: float = 60.0,
        lease_ms: int = 120_000,
        task_instance: str | None = None,
        try_number: int | None = None,
        unknown_commits: str | None = None,
        remember_files_for_s: float | None = None,
        lease_keeper: Callable[[float], Any] | None = None,
        crash_hook: Callable[[str], None] | None = None,
        tail_positions: Callable[[], Mapping[str, int]] | None = None,
        keep_intervals: int = KEEP_INTERVALS,
    ) -> None:
        self.heartbeat_s = check_timing(stale_after_s, lease_ms)
        if unknown_commits is not None and unknown_commits not in UNKNOWN_COMMITS:
            raise IngestError(f"unknown_commits must be one of {', '.join(UNKNOWN_COMMITS)} or None, "
                              f"got {unknown_commits!r}")
        self.store = store
        self.txns = txns
        self.scope = scope
        self.stream = stream
        self.owner = owner or f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.stale_after_ms = int(stale_after_s * 1000)
        self.task_instance = task_instance
        self.try_number = try_number
        self.unknown_commits = unknown_commits
        if remember_files_for_s is not None and not remember_files_for_s > 0:
            raise IngestError(f"remember_files_for must be positive, got {remember_files_for_s!r} s")
        self.remember_files_for_ms = None if remember_files_for_s is None else int(remember_files_for_s * 1000)
        self._lease_keeper = lease_keeper
        self._crash = crash_hook or (lambda _step: None)
        self._tail_positions = tail_positions
        if keep_intervals < 1:
            raise IngestError(f"keep_intervals must be at least 1, got {keep_intervals!r}")
        self.keep_intervals = keep_intervals
        self.commit_timeout_s = 300.0
        self.returned: dict[str, list[str]] = {}  # run -> files whose transactions were lost (healed)
        self.lost: dict[str, list[str]] = {}  # run -> its transactions found aborted after the commit point

    # the whole protocol --------------------------------------------------------------------

    def run(
        self, identities: Mapping[str, Mapping[str, Any]], write: Callable[[str, FilePlan], WriteResult], *,
        allow_changed_files: bool = False, wait_for_commit: bool = True, transactional: bool = True,
        wait_for_live_runs_s: float = 3600.0, commit_timeout_s: float = 300.0, interval: str | None = None,
    ) -> RunOutcome:
        """Recover, plan, start, write (``write(run_id, plan)``), commit point, commit, done.

        ``transactional=False`` (at-least-once writes): the write stage's transactions are committed
        without a commit point (:meth:`commit_at_least_once`), then the run is recorded done (and no
        interval piece is recorded: see the module doc).
        ``interval``: record the run's committed range in the interval index under this key.
        """
        if interval is not None and transactional and self._tail_positions is None:
            raise IngestError("an ingest run with an interval needs tail_positions (to record its stream cuts)")
        self.commit_timeout_s = commit_timeout_s
        recovered, finished = self.recover()
        self._crash("before_run_record")
        waited: tuple[list[str], list[str]] = ([], [])
        run_id, plan = self.start_run(identities, allow_changed_files=allow_changed_files,
                                      wait_for_live_runs_s=wait_for_live_runs_s, _waited=waited,
                                      interval=interval if transactional else None)
        out = RunOutcome(run_id, plan, recovered + waited[0], finished + waited[1])
        if run_id is None:
            if interval is not None and transactional:
                self.record_empty_interval(interval)
            return out
        keeper = RunKeeper(self, run_id)
        keeper.start()
        try:
            written = write(run_id, plan)
            self._crash("after_tasks")
            keeper.check()
        except BaseException:
            keeper.stop()
            self.abandon(run_id)
            raise
        out.events, out.bytes = written.events, written.bytes
        if not transactional:
            try:
                out.txns = self.commit_at_least_once(run_id, written)
            except BaseException:
                self.abandon(run_id)
                raise
            finally:
                keeper.stop()
            out.status = "COMMITTED"
            self.finish(run_id)
            return out
        out.txns, out.status, out.returned = self.commit_written(run_id, written, keeper=keeper, interval=interval,
                                                                 wait_for_commit=wait_for_commit)
        return out

    def commit_written(self, run_id: str, written: WriteResult, *, keeper: Any = None, interval: str | None = None,
                       wait_for_commit: bool = True) -> tuple[list[str], str, list[str]]:
        """The driver's side of the transactional stage, once the write tasks are done: the commit
        point (``written.txns``, the successful task attempts, with what each holds), aborting
        every other registered transaction (failed, retried or losing speculative attempts), the
        commit requests, and done. Returns (transactions committed, COMMITTED / COMMITTING / LOST,
        files of transactions found aborted, which the next run writes again). ``keeper``, if
        given, is stopped once the commits are acknowledged (leases no longer matter then)."""
        committing = False
        try:
            txns = list(written.txns)
            self._crash("before_commit_record")
            if interval is None:
                self.mark_committing(run_id, txns, holds=written.holds, units=written.units)
            else:  # one run of the ingest commits at a time: its pieces hold no other run's events
                while True:
                    seen, before = self.await_commit_turn(run_id, keeper)
                    try:
                        self.mark_committing(run_id, txns, holds=written.holds, units=written.units, before=before,
                                             commit_points=seen)
                        break
                    except _Skip:
                        continue
            committing = True
            # Task attempts that failed, were retried or lost a speculative race; read after the
            # commit point, which refuses later registrations, so a late attempt is not missed.
            orphans = [t for t in self.registered_txns(run_id) if t not in set(txns)]
            self._abort_quietly(orphans)
            alive = self.request_commits(run_id, txns)
            returned = self.returned.pop(run_id, [])
            if not alive:  # every transaction was aborted after the commit point: nothing committed
                return [], "LOST", returned
            lost = set(self.lost.pop(run_id, ()))
            txns = [t for t in txns if t not in lost]
            self.record_requested(run_id)
        except BaseException:
            if not committing:
                self.abandon(run_id)
            raise
        finally:
            if keeper is not None:
                keeper.stop()  # leases no longer matter: every commit is acknowledged and recorded
        if not wait_for_commit:
            return txns, "COMMITTING", returned
        self.wait_committed(run_id, txns, timeout_s=self.commit_timeout_s)
        self.finish(run_id)
        return txns, "COMMITTED", returned

    def commit_at_least_once(self, run_id: str, written: WriteResult) -> list[str]:
        """At least once: the same write stage, committed without a commit point. Nothing is
        visible before the commits, so a bad record or a failed job commits nothing; a driver that
        dies among the commits leaves its run WRITING, which recovery abandons, and its files are
        written again: duplicates, never a loss. A transaction found aborted (its lease lapsed) fails
        the run for the same rerun."""
        txns = list(written.txns)
        self._abort_quietly(t for t in self.registered_txns(run_id) if t not in set(txns))
        lapsed = []
        for hex_id in txns:
            state = _state_name(self.txns.status(self.scope, self.stream, int(hex_id, 16)))
            if state in ("ABORTED", "ABORTING"):
                lapsed.append(hex_id)
            elif state == "OPEN":
                self.txns.commit(self.scope, self.stream, int(hex_id, 16), wait=False)
        self._crash("after_commit_acks")
        self.wait_committed(run_id, [t for t in txns if t not in set(lapsed)], timeout_s=self.commit_timeout_s)
        if lapsed:
            raise IngestError(f"at-least-once run {run_id}: {len(lapsed)} of its {len(txns)} transaction(s) were "
                              f"aborted before their commit (their leases lapsed); the others are committed. Run the "
                              f"ingest again: it writes every file of this run again")
        return txns

    # recovery --------------------------------------------------------------------------------

    def _stale(self, run: Mapping[str, Any], now_ms: int) -> bool:
        if (self.task_instance is not None and run.get("ti") == self.task_instance
                and self.try_number is not None and run.get("try") is not None and run["try"] < self.try_number):
            return True  # an earlier try of this very task instance: Airflow gave up on it
        window = max(self.stale_after_ms, int(run.get("stale_ms") or 0))
        return run["heartbeat_ms"] < now_ms - window

    def stale_runs(self, state: Mapping[str, Any]) -> list[str]:
        now = now_ms()
        return [rid for rid, run in state["runs"].items() if run["phase"] != REQUESTED and self._stale(run, now)]

    def recover(self) -> tuple[list[str], list[str]]:
        """Record done every run whose commits were acknowledged, and finish or undo every run
        whose driver is gone. Returns (recovered killed runs, finished acknowledged runs)."""
        state = index_done_runs(self.store, move_committed_to_table(self.store))
        finished = [rid for rid, run in state["runs"].items() if run["phase"] == REQUESTED]
        for run_id in finished:
            self.resolve_requested(run_id, state["runs"][run_id])
        return self.recover_stale_runs(), finished

    def recover_stale_runs(self) -> list[str]:
        """Finish or undo every run whose driver stopped heartbeating; returns their ids."""
        recovered = []
        for run_id in self.stale_runs(self.store.fetch()):
            # Take the run over first (fenced): two recoverers never act on one run at once.
            def take(state: dict[str, Any], run_id: str = run_id) -> dict | None:
                run = state["runs"].get(run_id)
                if run is None or run["phase"] == REQUESTED or not self._stale(run, now_ms()):
                    raise _Skip()
                return self.takeover_op(run_id)

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
            if not self.request_commits(run_id, run["commit"], run=run):
                return  # resolved as never committed, or every transaction lost: abandoned
            self.lost.pop(run_id, None)
            self.returned.pop(run_id, None)
            self._abort_quietly(t for t in run["txns"] if t not in set(run["commit"]))
            self.record_requested(run_id)
            now = self.store.fetch()["runs"].get(run_id)  # without the transactions found lost
            if now is not None:
                self.resolve_requested(run_id, now)
        else:
            log.warning("recovering ingest run %s: it died while writing; aborting its %d transaction(s)",
                        run_id, len(run["txns"]))
            self._abort_quietly(run["txns"])
            self.store.update(self._owned(run_id, lambda: {"op": "abandon", "run": run_id}))

    def resolve_requested(self, run_id: str, run: Mapping[str, Any]) -> None:
        """A run whose commits the controller acknowledged: done (UNKNOWN = committed, forgotten)."""
        for hex_id in run["commit"]:
            state = _state_name(self.txns.status(self.scope, self.stream, int(hex_id, 16)))
            if state in ("ABORTED", "ABORTING"):
                raise LostCommitError(
                    f"transaction {hex_id} of ingest run {run_id} is {state} although the controller acknowledged "
                    f"its commit request; this should never happen. The run's files "
                    f"({_files_text(run)}) stay uncommitted; inspect the stream before re-running."
                )
        self.finish(run_id)

    # a run -----------------------------------------------------------------------------------

    def start_run(
        self, identities: Mapping[str, Mapping[str, Any]], *, allow_changed_files: bool = False,
        wait_for_live_runs_s: float = 3600.0, poll_s: float = 2.0,
        _waited: tuple[list[str], list[str]] | None = None, interval: str | None = None,
    ) -> tuple[str | None, FilePlan]:
        """Record a new run over the files not yet committed; run id None when there is nothing
        to do. Files another live run holds are waited for (that run may commit them); the runs
        recovered and finished meanwhile go to ``_waited``."""
        run_id = f"run-{uuid.uuid4().hex[:12]}"
        deadline = time.monotonic() + wait_for_live_runs_s
        recovered, finished = _waited if _waited is not None else ([], [])
        staged: set[str] = set()  # paths staged for run_id (a file list too large for its start record)
        while True:
            holder: list[str] = []
            plan_box: list[FilePlan] = []
            stage_box: list[dict[str, Any]] = []

            def start(state: dict[str, Any]) -> dict | None:
                holder.clear()
                plan_box.clear()
                # Looked up after the state was read: a run recorded done since is in the table.
                view = {**state, "committed": known_files(self.store, state, identities)}
                plan = plan_files(view, identities, allow_changed_files=allow_changed_files)
                plan_box.append(plan)
                busy = {p: rid for rid, run in state["runs"].items() for p in run["files"]}
                clash = sorted({busy[p] for p in plan.to_ingest if p in busy})
                if clash:
                    holder.extend(clash)
                    raise _Skip()
                if not plan.to_ingest:
                    return None
                op = {"op": "start", "run": run_id, "owner": self.owner, "ts": now_ms(),
                      "ti": self.task_instance, "try": self.try_number, "stale_ms": self.stale_after_ms}
                if staged and staged.issuperset(plan.to_ingest):
                    op.update(staged=True, exclude=sorted(staged.difference(plan.to_ingest)))
                elif _json_size(plan.to_ingest) > INLINE_FILES_BYTES:
                    stage_box.append(plan.to_ingest)
                    raise _Skip()
                else:
                    op["files"] = plan.to_ingest
                if interval is not None:
                    op["interval"] = interval
                return op

            try:
                state = self.store.update(start)
            except _Skip:
                if stage_box:
                    if staged:  # the plan grew past what was staged (files forgotten meanwhile): again
                        self.store.update(lambda _s, r=run_id: {"op": "unstage", "run": r})
                        run_id, staged = f"run-{uuid.uuid4().hex[:12]}", set()
                    staged = self._stage(run_id, stage_box[-1])
                    continue
                if time.monotonic() > deadline:
                    raise IngestError(
                        f"files of this ingest are held by run(s) {', '.join(holder)} of another live copy of the "
                        f"task for more than {wait_for_live_runs_s:.0f} s; stop that copy or wait for it"
                    ) from None
                log.info("waiting for live run(s) %s that hold some of these files", ", ".join(holder))
                time.sleep(poll_s)
                more_recovered, more_finished = self.recover()
                recovered += more_recovered
                finished += more_finished
                continue
            plan = plan_box[-1]
            if run_id not in state["runs"]:
                return None, plan
            self._crash("after_run_record")
            return run_id, plan

    def start_open_run(self, *, wait_for_others_s: float | None = 3600.0, poll_s: float = 1.0) -> str:
        """A run whose units are not planned up front but held by the transactions its tasks
        write (a data-source write: its input partitions, named at the commit point). With
        ``wait_for_others_s`` (one job id: a rerun), earlier runs are finished or recovered first
        and live ones waited for (a rerun waits out a crashed job's ``stale_after_s``); with None
        (independent writes sharing one state) other runs are left alone."""
        deadline = time.monotonic() + (wait_for_others_s or 0)
        while wait_for_others_s is not None:
            self.recover()
            others = sorted(self.store.fetch()["runs"])
            if not others:
                break
            if time.monotonic() > deadline:
                raise IngestError(f"run(s) {', '.join(others)} of another live job with this id still write after "
                                  f"{wait_for_others_s:.0f} s; stop that job or wait for it")
            log.info("waiting for run(s) %s of another job with this id to finish or be presumed dead", ", ".join(others))
            time.sleep(poll_s)
        run_id = f"run-{uuid.uuid4().hex[:12]}"
        self.store.update(lambda _s: self._open_run_op(run_id))
        return run_id

    def takeover_op(self, run_id: str, *, as_task: bool = True) -> dict[str, Any]:
        """The record by which this owner takes run ``run_id`` over (fenced by the state's
        update); ``as_task``: also as this Airflow task instance and try (its fast takeover)."""
        op = {"op": "takeover", "run": run_id, "owner": self.owner, "ts": now_ms()}
        if as_task:
            op["ti"], op["try"] = self.task_instance, self.try_number
        return op

    def _open_run_op(self, run_id: str) -> dict[str, Any]:
        """The start record of a run whose units are named at its commit point."""
        return {"op": "start", "run": run_id, "owner": self.owner, "ts": now_ms(), "files": {},
                "stale_ms": self.stale_after_ms}

    def join_unit_run(self, run_id: str, unit: str) -> bool:
        """For writes whose tasks start their run (a streaming micro-batch: no driver step comes
        before its tasks; ``run_id`` is the batch's, the same in every attempt): False when
        ``unit`` was committed by a run of this id (a replay writes it no more); else True once a
        WRITING run ``run_id`` exists for the task to register in. A run of this id that an
        earlier attempt took past its commit point is finished first (its units are then known
        committed, or returned when their transactions were lost)."""
        while True:
            state = self.store.fetch()
            if known_files(self.store, state, [unit]).get(unit, {}).get("run") == run_id:
                return False
            run = state["runs"].get(run_id)
            if run is None:
                self.store.update(lambda s: None if run_id in s["runs"] else self._open_run_op(run_id))
                continue
            if run["phase"] == WRITING:
                return True
            if run["owner"] != self.owner:
                self.store.update(lambda s: self.takeover_op(run_id, as_task=False) if run_id in s["runs"] else None)
                continue
            self.finish_past_commit_point(run_id, run)

    def finish_past_commit_point(self, run_id: str, run: Mapping[str, Any]) -> None:
        """Finish a run of this owner that reached its commit point: commit and record a
        COMMITTING one (healing lost transactions), record a REQUESTED one done."""
        if run["phase"] == COMMITTING:
            self.finish_recovered_run(run_id, run)
        else:
            self.resolve_requested(run_id, run)

    def drop_dead_runs(self, older_than_s: float) -> list[str]:
        """Independent runs sharing one state (data-source writes without a write id) are never
        recovered by each other; a run whose driver stopped heartbeating ``older_than_s`` ago is
        dropped here (its open transactions aborted) so the state does not keep dead runs."""
        cutoff = now_ms() - int(older_than_s * 1000)
        dropped = []
        for run_id, run in self.store.fetch()["runs"].items():
            if run["heartbeat_ms"] >= cutoff:
                continue

            def take(state: dict[str, Any], run_id: str = run_id) -> dict:
                now = state["runs"].get(run_id)
                if now is None or now["heartbeat_ms"] >= cutoff:
                    raise _Skip()
                return self.takeover_op(run_id, as_task=False)

            try:
                taken = self.store.update(take)["runs"][run_id]
            except _Skip:
                continue
            log.warning("dropping run %s: its driver stopped %.0f s ago or more (phase %s)", run_id, older_than_s,
                        taken["phase"])
            self._abort_quietly(taken["txns"])
            self.store.update(self._owned(run_id, lambda r=run_id: {"op": "abandon", "run": r}))
            dropped.append(run_id)
        return dropped

    def _stage(self, run_id: str, files: Mapping[str, Any]) -> set[str]:
        """Record ``files`` for ``run_id`` in parts, each one state record (see INLINE_FILES_BYTES)."""
        parts: list[dict[str, Any]] = [{}]
        size = 0
        for path, ident in files.items():
            entry = _json_size({path: ident})
            if parts[-1] and size + entry > STAGE_PART_BYTES:
                parts.append({})
                size = 0
            parts[-1][path] = ident
            size += entry
        for part in parts:
            self.store.update(lambda _s, f=part: {"op": "stage", "run": run_id, "files": f, "ts": now_ms()})
        log.info("ingest run %s: %d files staged in %d state records before its start record",
                 run_id, len(files), len(parts))
        return set(files)

    def _owned(self, run_id: str, make: Callable[[], dict]) -> Callable[[dict[str, Any]], dict]:
        def fn(state: dict[str, Any]) -> dict:
            run = state["runs"].get(run_id)
            if run is None or run["owner"] != self.owner:
                raise FencedError(run_id, "its record is gone or belongs to another owner")
            return make()

        return fn

    def heartbeat(self, run_id: str) -> None:
        self.store.update(self._owned(run_id, lambda: {"op": "heartbeat", "run": run_id, "ts": now_ms()}))

    def registered_txns(self, run_id: str) -> list[str]:
        run = self.store.fetch()["runs"].get(run_id)
        if run is None or run["owner"] != self.owner:
            raise FencedError(run_id)
        return list(run["txns"])

    def mark_committing(self, run_id: str, txns: Sequence[str], *, holds: Mapping[str, Sequence[str]] | None = None,
                        units: Mapping[str, Mapping[str, Any]] | None = None,
                        before: Mapping[str, int] | None = None, commit_points: int | None = None) -> None:
        """The commit point: from here on the run's transactions will be committed, crash or not.

        ``holds`` (txn -> the files it holds, whole) is recorded with it: a transaction that is
        aborted after this point (its lease lapsed while no driver renewed it) then costs only a
        rewrite of its files by the next run (see :meth:`heal_lost`); ``units``, what a held unit
        not planned up front is (see :class:`WriteResult`), is recorded with them. With ``before`` (the tail read by :meth:`await_commit_turn`, when ``commit_points`` commit
        points had been recorded): recorded only if no other run reached its commit point since,
        else ``_Skip`` (read the tail again)."""
        def fn(state: dict[str, Any]) -> dict:
            run = state["runs"].get(run_id)
            if run is None or run["owner"] != self.owner or run["phase"] != WRITING:
                raise FencedError(run_id, "cannot reach the commit point")
            missing = [t for t in txns if t not in run["txns"]]
            if missing:
                raise IngestError(f"transactions {missing} were never registered in run {run_id}")
            op = {"op": "committing", "run": run_id, "txns": list(txns), "ts": now_ms()}
            if holds is not None:
                op["holds"] = encode_holds({t: holds.get(t, ()) for t in txns}, run["files"])
            if units:
                op["units"] = {u: dict(ident) for u, ident in units.items()}
            if before is not None:
                if state.get("commit_points", 0) != commit_points or _committing_others(state, run_id):
                    raise _Skip()
                op["before"] = dict(before)
            return op

        self.store.update(fn)
        self._crash("after_commit_record")

    def request_commits(self, run_id: str, txns: Sequence[str], *, run: Mapping[str, Any] | None = None) -> bool:
        """Ask the controller to commit every listed transaction (idempotent); returns once each
        request is acknowledged. False when UNKNOWN transactions were resolved as never committed
        (``unknown_commits="not_committed"``: the run is then abandoned)."""
        states = {hex_id: _state_name(self.txns.status(self.scope, self.stream, int(hex_id, 16))) for hex_id in txns}
        aborted = [t for t, state in states.items() if state in ("ABORTED", "ABORTING")]
        if aborted:
            self._heal(run_id, run, aborted)
            states = {t: state for t, state in states.items() if t not in set(aborted)}
            if not states:
                return False  # the whole run was lost: its files are planned again
        unknown = [t for t, state in states.items() if state == "UNKNOWN"]
        if unknown:
            if self.unknown_commits is None:
                raise UnresolvedCommitError(
                    f"ingest run {run_id} reached its commit point, but its driver stopped before recording that "
                    f"the controller acknowledged the commits, and the controller no longer knows transaction(s) "
                    f"{', '.join(unknown)} of {self.scope}/{self.stream} (it forgets finished transactions after a "
                    f"while): they were either committed, or expired uncommitted — nothing can tell which. The "
                    f"run's files: {_files_text(run) if run else '?'}. Inspect the stream for their records, then "
                    f"re-run with unknown_commits='committed' (their records are there: record the files as "
                    f"ingested) or unknown_commits='not_committed' (they are not: ingest the files again)."
                )
            if self.unknown_commits == "not_committed":
                log.warning("ingest run %s: transaction(s) %s are UNKNOWN; unknown_commits='not_committed': "
                            "abandoning the run, its files will be ingested again", run_id, ", ".join(unknown))
                self._abort_quietly(t for t, state in states.items() if state == "OPEN")
                self.store.update(self._owned(run_id, lambda: {"op": "abandon", "run": run_id}))
                return False
            log.warning("ingest run %s: transaction(s) %s are UNKNOWN; unknown_commits='committed': counting "
                        "them as committed", run_id, ", ".join(unknown))
        self._crash("before_commit_requests")
        lapsed = []  # OPEN when read, aborted by their lapsed lease before their commit request
        for i, (hex_id, state) in enumerate(states.items()):
            if state == "OPEN":
                try:
                    self.txns.commit(self.scope, self.stream, int(hex_id, 16), wait=False)
                except TransactionAbortedError:
                    lapsed.append(hex_id)
            if i == 0:
                self._crash("after_first_commit")
        if lapsed:
            self._heal(run_id, None, lapsed)
        self._crash("after_commit_acks")
        return not lapsed or len(lapsed) < len(states)  # False: the whole run was lost

    def _heal(self, run_id: str, run: Mapping[str, Any] | None, aborted: list[str]) -> None:
        run = run if run is not None else self.store.fetch()["runs"].get(run_id) or {}
        self.returned[run_id] = self.returned.get(run_id, []) + self.heal_lost(run_id, run, aborted)
        self.lost[run_id] = self.lost.get(run_id, []) + aborted

    def heal_lost(self, run_id: str, run: Mapping[str, Any], aborted: Sequence[str]) -> list[str]:
        """Transactions of a run past its commit point were aborted (their leases lapsed: the
        driver was down longer than the lease). Each holds whole files, recorded at the commit
        point, so their files are taken out of the run (``lost``) and the next run writes them
        again; the run's other transactions are committed as promised. Returns those files.

        Only when the run does not say what an aborted transaction held (recorded by an older
        version, or a unit shared by several transactions) is the outcome undecidable:
        :class:`LostCommitError`."""
        holds = run.get("holds")
        unknown = [t for t in aborted if not (holds or {}).get(t)]
        kept = {u for t, units in (holds or {}).items() if t not in set(aborted) for u in units}
        shared = sorted({u for t in aborted for u in (holds or {}).get(t, ()) if u in kept})
        if unknown or shared:
            why = (f"the run's record does not say which files transaction(s) {', '.join(unknown)} held (a run "
                   f"recorded by an older version of the provider, or a data-source write without write_id)"
                   if unknown else
                   f"{shared[0]} was written partly by an aborted and partly by a committed transaction")
            raise LostCommitError(
                f"transaction(s) {', '.join(aborted)} of ingest run {run_id} are ABORTED although the run reached its "
                f"commit point (the task was down longer than the transaction lease), and {why}: writing the "
                f"files again would duplicate what the run's committed transactions hold, skipping them would lose "
                f"the rest. The run's files: {_files_text(run)}. Inspect the stream for their records; "
                f"reset_ingest_state(...) then re-ingests every file of the source."
            )
        returned = sorted({u for t in aborted for u in holds[t]})

        def fn(state: dict[str, Any]) -> dict | None:
            now = state["runs"].get(run_id)
            if now is None or now["phase"] != COMMITTING or now["owner"] != self.owner:
                raise FencedError(run_id, "its record changed while its lost transactions were recorded")
            still = [t for t in aborted if t in now["commit"]]
            return {"op": "lost", "run": run_id, "txns": still, "ts": now_ms()} if still else None

        self.store.update(fn)
        log.warning("ingest run %s: %d of its transactions were aborted after its commit point (their leases "
                    "lapsed); their %d file(s) are written again by the next run: %s", run_id, len(aborted),
                    len(returned), ", ".join(returned[:5]) + (f" and {len(returned) - 5} more" if len(returned) > 5
                                                              else ""))
        return returned

    def record_requested(self, run_id: str) -> None:
        """Every commit request of the run was acknowledged: from here UNKNOWN means committed."""
        def fn(state: dict[str, Any]) -> dict | None:
            run = state["runs"].get(run_id)
            if run is None or run["phase"] == REQUESTED:
                return None  # already advanced (by a recoverer, or done)
            if run["phase"] != COMMITTING:
                raise FencedError(run_id, "the run is not at its commit point")
            return {"op": "requested", "run": run_id, "ts": now_ms()}

        self.store.update(fn)
        self._crash("after_commit_requested")

    def wait_committed(self, run_id: str, txns: Sequence[str], timeout_s: float = 300.0) -> None:
        for hex_id in txns:
            self.txns.wait_for(self.scope, self.stream, int(hex_id, 16), _final_states(), timeout_s=timeout_s)
        self._crash("after_commits")

    def finish(self, run_id: str) -> None:
        """Record the run done (its files committed). Anyone may do it once the commits are
        acknowledged; a run already recorded done is fine. A run with an interval piece waits for
        its transactions to be COMMITTED and records the tail as the piece's end."""
        end = self._piece_end(run_id)

        def fn(state: dict[str, Any]) -> dict | None:
            run = state["runs"].get(run_id)
            if run is None:
                return None
            if run["phase"] == WRITING and run["owner"] != self.owner:
                raise FencedError(run_id, "its record belongs to another owner")
            op = {"op": "done", "run": run_id, "ts": now_ms(), "keep": self.keep_intervals}
            if end is not None:
                op["end"] = end
            return op

        state = self.store.update(fn)
        done_files = len(state.get("unindexed", {}).get(run_id, {}).get("files", ()))
        state = index_done_runs(self.store, state)
        if self.remember_files_for_ms is not None:
            horizon = now_ms() - self.remember_files_for_ms
            files = getattr(self.store, "files", None)
            if files is not None and state.get("keyed"):
                # A bounded sweep of the table per run (resumed where the last one stopped): the
                # forgotten horizon moves only when something older was removed.
                token = base64.b64decode(state.get("prune_token") or "")
                removed, token = files.prune(token, horizon, max(PRUNE_BUDGET, 2 * done_files))
                op = {"op": "prune", "before": horizon if removed else None,
                      "token": base64.b64encode(token).decode()}
                state = self.store.update(lambda _s: op)
            elif any((c.get("at") or 0) < horizon for c in state["committed"].values()):
                state = self.store.update(lambda _s: {"op": "prune", "before": horizon})
        compact = getattr(self.store, "compact", None)
        if compact is not None and state.get("completed_runs", 0) % COMPACT_EVERY_RUNS == 0:
            compact()  # new readers then start from one full record instead of the whole history

    # the interval index -----------------------------------------------------------------------

    def _tail(self) -> dict[str, int]:
        if self._tail_positions is None:
            raise IngestError("recording an interval's stream cuts needs tail_positions")
        return {str(k): int(v) for k, v in self._tail_positions().items()}

    def _piece_end(self, run_id: str) -> dict[str, int] | None:
        """The end of a run's interval piece: the tail once its transactions are all COMMITTED
        (None for a run without a piece). Read before the done record, so before any other run
        of this ingest may commit (they wait for this run's done record)."""
        run = self.store.fetch()["runs"].get(run_id)
        if run is None or run.get("interval") is None or run.get("before") is None:
            return None
        for hex_id in run["commit"]:
            self.txns.wait_for(self.scope, self.stream, int(hex_id, 16), _final_states(),
                               timeout_s=self.commit_timeout_s)
        return self._tail()

    def await_commit_turn(self, run_id: str, keeper: Any = None, poll_s: float = 0.2) -> tuple[int, dict[str, int]]:
        """Wait until no other run of this ingest is between its commit point and its done record
        (runs with acknowledged commits are finished here, dead ones recovered; live ones waited
        for), then read the tail: (commit points recorded so far, tail)."""
        deadline = time.monotonic() + self.commit_timeout_s + self.stale_after_ms / 1000
        while True:
            state = self.store.fetch()
            others = _committing_others(state, run_id)
            if not others:
                return state.get("commit_points", 0), self._tail()
            if keeper is not None:
                keeper.check()
            if time.monotonic() > deadline:
                raise IngestError(f"run {run_id} waited too long at its commit point for run(s) "
                                  f"{', '.join(others)} of this ingest to finish committing")
            log.info("run %s: waiting at its commit point for run(s) %s to finish committing", run_id,
                     ", ".join(others))
            self.recover()
            time.sleep(poll_s)

    def record_empty_interval(self, interval: str) -> None:
        """A run of ``interval`` had nothing (new) to ingest: its interval is recorded as an empty
        range unless a run already recorded it."""
        if interval in (self.store.fetch().get("intervals") or {}):
            return
        at = self._tail()
        self.store.update(lambda s: None if interval in (s.get("intervals") or {}) else
                          {"op": "empty_interval", "interval": interval, "at": at, "ts": now_ms(),
                           "keep": self.keep_intervals})

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
        """``abort_quietly`` of the run's ids as the state records them (hex), at debug level: the
        recovery aborts what may already be committed, aborted or expired, nothing to undo then."""
        abort_quietly(self.txns, self.scope, self.stream, (int(h, 16) for h in hex_ids), level=logging.DEBUG)


class RunKeeper(threading.Thread):
    """Upkeep while the write stage runs: heartbeat the run and keep every registered transaction's
    lease alive (following the run's registry in the state), until the commit requests are
    recorded. The driver runs one; so does every data-source write task while it writes, so a
    finished task's transaction stays alive while any task of its job still runs."""

    def __init__(self, coord: IngestCoordinator, run_id: str) -> None:
        super().__init__(name="pravega-ingest-keeper", daemon=True)
        self.coord, self.run_id = coord, run_id
        self.interval_s = coord.heartbeat_s
        factory = coord._lease_keeper
        self.leases = factory(self.interval_s) if factory is not None else None
        self.stop_event = threading.Event()
        self.fenced: FencedError | None = None

    def run(self) -> None:
        while not self.stop_event.wait(self.interval_s):
            try:
                self.coord.heartbeat(self.run_id)
                if self.leases is not None:
                    for hex_id in self.coord.registered_txns(self.run_id):
                        self.leases.add(self.coord.scope, self.coord.stream, int(hex_id, 16))
            except FencedError as exc:
                self.fenced = exc
                log.error("%s", exc)
                return
            except PravegaError as exc:  # transient: try again next round
                log.warning("ingest upkeep failed (will retry): %s", exc)

    def check(self) -> None:
        if self.fenced is not None:
            raise self.fenced

    def stop(self) -> None:
        if self.stop_event.is_set():
            return
        self.stop_event.set()
        self.join(timeout=30)
        if self.leases is not None:
            self.leases.close()


def record_run_done(store: StateStore, run_id: str, end: Mapping[str, int] | None = None) -> bool:
    """Record a run whose commit requests were acknowledged as done (the commit sensor calls this
    when it sees every transaction COMMITTED). True when recorded now, False when it already was.

    ``end``: the stream's tail read after every transaction was seen COMMITTED, the end of the
    run's interval piece; a run with a piece is left to the next run without it (returns False)."""
    done = []

    def fn(state: dict[str, Any]) -> dict | None:
        done.clear()
        run = state["runs"].get(run_id)
        if run is None:
            return None
        if run["phase"] != REQUESTED:
            raise IngestError(f"ingest run {run_id} is {run['phase']}, not REQUESTED: its commits were not all "
                              "acknowledged, so it cannot be recorded done from here")
        if run.get("interval") is not None and run.get("before") is not None and end is None:
            return None
        done.append(True)
        op = {"op": "done", "run": run_id, "ts": now_ms()}
        if end is not None:
            op["end"] = {str(k): int(v) for k, v in end.items()}
        return op

    index_done_runs(store, store.update(fn))
    return bool(done)


def reset_ingest_state(client: Any, scope: str, stream: str, ingest_id: str, *, state_scope: str | None = None
                       ) -> bool:
    """Forget everything ingest ``ingest_id`` recorded for ``scope/stream`` (runs, committed files,
    interval index): for a target stream that was deleted and re-created, whose old positions and
    files the state would otherwise keep describing. Refused while a run still heartbeats (a live
    run would lose its bookkeeping). Idempotent; returns False when there was nothing to forget."""
    # import cost: operators/ingest.py imports this module at DAG parse; the table client only to reset a state
    from airflow_provider_pravega.client.committed_files import CommittedFiles

    state_scope, state_stream = state_location(scope, stream, ingest_id, state_scope)
    files = CommittedFiles(client, state_scope, state_stream)
    if not client.admin.stream_exists(state_scope, state_stream):
        return files.clear() > 0  # an earlier reset stopped between its two steps
    with open_state_store(client, state_scope, state_stream, create=False) as store:
        state = store.fetch()
        stale = set(IngestCoordinator(store, client.transactions, scope, stream).stale_runs(state))
    # A run is live as recovery sees it: still heartbeating (a REQUESTED run only waits for Pravega).
    live = sorted(rid for rid, run in state["runs"].items() if run["phase"] != REQUESTED and rid not in stale)
    if live:
        raise IngestError(f"ingest {ingest_id!r} into {scope}/{stream} has live run(s) {', '.join(live)}: "
                          "wait for them to end before resetting its state")
    client.admin.delete_stream(state_scope, state_stream, seal=True)
    cleared = files.clear()  # after the state is gone: no run can record files meanwhile
    log.info("ingest %s: reset its state for %s/%s (%s/%s, %d committed-file entries cleared)", ingest_id, scope,
             stream, state_scope, state_stream, cleared)
    return True


COMPACT_EVERY_RUNS = 16


class _Skip(Exception):
    """Internal: abandon an update attempt without appending."""


def _json_size(value: Any) -> int:
    """Bytes of ``value`` as a state record holds it (compact JSON)."""
    return len(json.dumps(value, separators=(",", ":")))


def _committing_others(state: Mapping[str, Any], run_id: str) -> list[str]:
    """Runs other than ``run_id`` past their commit point and not yet recorded done."""
    return sorted(rid for rid, run in state["runs"].items() if rid != run_id and run["phase"] in (COMMITTING, REQUESTED))


def _files_text(run: Mapping[str, Any] | None, limit: int = 5) -> str:
    files = sorted((run or {}).get("files", {}))
    more = f" and {len(files) - limit} more" if len(files) > limit else ""
    return ", ".join(files[:limit]) + more


def _state_name(status: Any) -> str:
    return str(getattr(status, "name", status)).upper()


def _final_states() -> Any:
    # Waited for only after the commit requests were acknowledged and recorded: a transaction the
    # controller forgot since (UNKNOWN) was committed.
    return {TxnStatus.COMMITTED, TxnStatus.UNKNOWN}
