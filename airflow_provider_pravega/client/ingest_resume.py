"""Resuming an ingest run by its identity: a later try of a killed task finishes the run the
killed try started instead of writing it again.

The ingest operator keeps the identity of its run (:func:`run_identity`: where the ingest's state
lives, the run id and the owner that recorded it) in Airflow's task state store from the moment
the run is recorded. A later try of the same task instance reads it back and asks
:func:`resume_status`:

* ``WRITTEN``: the run is still before its commit point, but each of its files is held by a
  transaction a write task flushed and recorded (``written``, fenced by the run's owner, see
  :func:`record_written`): the run can reach its commit point without writing anything again;
* ``REQUESTED``: every commit request was acknowledged: only waiting for the commits (with
  ``wait_for_commit``) and the done record are left;
* anything else cannot be resumed: ``WRITING`` (a write task had not flushed yet), ``COMMITTING``
  (commit requests under way), ``TAKEN`` (another copy owns the run now), ``GONE`` (done,
  abandoned or never recorded), ``MOVED`` (the identity names another ingest or target). The try
  then runs the ingest afresh, whose recovery rolls an earlier try's run forward or back at once.

:func:`resume_run` takes the run over — a conditional update that names the owner the identity
recorded, so the killed try's driver, should it still live, and its write tasks are fenced off —
and finishes it with the coordinator's own steps (:meth:`IngestCoordinator.commit_written`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_pravega.client.ingest import IngestCoordinator, RunKeeper, WriteResult
from airflow_provider_pravega.client.ingest_errors import FencedError
from airflow_provider_pravega.client.ingest_state import REQUESTED, WRITING, decode_holds, encode_holds

log = logging.getLogger(__name__)

WRITTEN = "WRITTEN"
#: The statuses :func:`resume_run` finishes.
RESUMABLE = (WRITTEN, REQUESTED)
_IDENTITY_KEYS = ("scope", "stream", "ingest_id", "state_scope", "state_stream", "run", "owner")


def run_identity(*, scope: str, stream: str, ingest_id: str, state_scope: str, state_stream: str, run_id: str,
                 owner: str) -> dict[str, str]:
    """What a later try needs to find and take over this run (JSON, for the task state store)."""
    return {"scope": scope, "stream": stream, "ingest_id": ingest_id, "state_scope": state_scope,
            "state_stream": state_stream, "run": run_id, "owner": owner}


def is_identity(value: Any) -> bool:
    """Whether ``value`` is what :func:`run_identity` returns (a stored value of another shape is ignored)."""
    return isinstance(value, Mapping) and all(isinstance(value.get(k), str) and value[k] for k in _IDENTITY_KEYS)


def record_written(store: Any, run_id: str, hex_id: str, units: Iterable[str], events: int, size: int,
                   owner: str | None, *, pieces: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Called by a write task once its transaction is flushed: what it holds (whole files), its
    counters, and (``pieces``) what it measured of each line file it wrote, which the run's done
    record takes as the files' committed records. Fenced like registration (``register_txn``):
    refused once the run passed its commit point or (with ``owner``) was taken over, so a later try
    never counts a write it did not see recorded before its takeover."""
    units = sorted(set(units))

    def fn(state: dict[str, Any]) -> dict:
        run = state["runs"].get(run_id)
        if run is None or run["phase"] != WRITING or hex_id not in run["txns"] or (
                owner is not None and run["owner"] != owner):
            raise FencedError(run_id, "the run was taken over, recovered or reached its commit point")
        op = {"op": "written", "run": run_id, "txn": hex_id, "events": int(events), "bytes": int(size),
              "holds": encode_holds({hex_id: units}, run["files"])[hex_id]}
        if pieces is not None:  # in the order of the units (sorted)
            op["pieces"] = [dict(pieces[u]) for u in units]
        return op

    store.update(fn)


def written_holds(run: Mapping[str, Any]) -> dict[str, list[str]] | None:
    """txn -> the files it holds, one recorded transaction for each file of the run, or None when
    the records do not cover the run's files exactly once. Two attempts of one Spark task hold the
    same files: the one registered first is kept (the other is aborted at the commit point)."""
    written = run.get("written") or {}
    files = set(run["files"])
    holds: dict[str, list[str]] = {}
    holder: dict[str, str] = {}
    for txn in run["txns"]:  # in registration order
        if txn not in written:
            continue
        units = decode_holds({txn: written[txn]["holds"]}, run["files"])[txn]
        taken = {holder[u] for u in units if u in holder}
        if not taken:
            holds[txn] = units
            holder.update((u, txn) for u in units)
        elif len(taken) > 1 or sorted(holds[taken.pop()]) != sorted(units):
            return None  # overlapping differently: not one partitioning of the run's files
    return holds if set(holder) == files and files else None


def resume_status(state: Mapping[str, Any], identity: Mapping[str, Any], *, scope: str, stream: str,
                  ingest_id: str) -> str:
    """What a later try can do with the run ``identity`` names, given the ingest's ``state`` (see the
    module doc); ``scope``/``stream``/``ingest_id``: the ingest the try runs now."""
    if not is_identity(identity) or (identity["scope"], identity["stream"], identity["ingest_id"]) != (
            scope, stream, ingest_id):
        return "MOVED"
    run = state["runs"].get(identity["run"])
    if run is None:
        return "GONE"
    if run["phase"] == REQUESTED:
        return REQUESTED
    if run["owner"] != identity["owner"]:
        return "TAKEN"
    if run["phase"] != WRITING:
        return run["phase"]
    return WRITTEN if written_holds(run) is not None else WRITING


@dataclass
class Resumed:
    """A run finished by a later try."""

    run_id: str
    files: list[str]  # what the run committed (without ``returned``)
    txns: list[str]
    status: str  # COMMITTED (awaited), COMMITTING (requested, acknowledged) or LOST
    events: int = 0
    bytes: int = 0
    #: files of transactions found aborted (their leases lapsed): not committed, the next run writes them
    returned: list[str] = field(default_factory=list)


class _NotResumable(Exception):
    pass


def resume_run(coord: IngestCoordinator, identity: Mapping[str, Any], *, wait_for_commit: bool = True,
               commit_timeout_s: float = 300.0) -> Resumed | None:
    """Finish the run ``identity`` names if :func:`resume_status` allows it (None otherwise: nothing
    was changed). ``coord`` is the later try's coordinator on the run's state."""
    run_id = identity["run"]
    coord.commit_timeout_s = commit_timeout_s
    state = coord.store.fetch()
    run = state["runs"].get(run_id)
    if run is not None and run["phase"] == REQUESTED:
        return _finish_requested(coord, run_id, run, wait_for_commit)

    def take(state: dict[str, Any]) -> dict:
        run = state["runs"].get(run_id)
        if run is None or run["phase"] != WRITING or run["owner"] != identity["owner"] or written_holds(run) is None:
            raise _NotResumable()
        return coord.takeover_op(run_id)

    try:
        state = coord.store.update(take)
    except _NotResumable:
        return None
    run = state["runs"][run_id]
    holds = written_holds(run)
    if holds is None:  # a write recorded between the check and the takeover overlaps: write again
        log.warning("ingest run %s: its recorded writes no longer cover its files once; rolling it back", run_id)
        coord.abandon(run_id)
        return None
    written = run["written"]
    # Committed in path order of their files, as the write stage orders them (routing keys keep source order).
    txns = sorted(holds, key=lambda t: (sorted(holds[t])[:1], t))
    events = sum(written[t]["events"] for t in txns)
    size = sum(written[t]["bytes"] for t in txns)
    log.warning("resuming ingest run %s of an earlier try: its %d transaction(s) hold all %d file(s); "
                "committing them without writing again", run_id, len(txns), len(run["files"]))
    keeper = RunKeeper(coord, run_id)
    keeper.start()
    done, status, returned = coord.commit_written(run_id, WriteResult(txns, events, size, holds), keeper=keeper,
                                                  interval=run.get("interval"), wait_for_commit=wait_for_commit)
    files = sorted(set(run["files"]) - set(returned))
    return Resumed(run_id, files, done, status, events, size, returned)


def _finish_requested(coord: IngestCoordinator, run_id: str, run: Mapping[str, Any],
                      wait_for_commit: bool) -> Resumed:
    """A run whose commits were all acknowledged: what the killed try had left to do."""
    txns = list(run["commit"])
    written = run.get("written") or {}
    events = sum(written[t]["events"] for t in txns if t in written)
    size = sum(written[t]["bytes"] for t in txns if t in written)
    log.warning("resuming ingest run %s of an earlier try: its %d commit(s) were acknowledged", run_id, len(txns))
    status = "COMMITTING"
    if wait_for_commit:
        coord.wait_committed(run_id, txns, timeout_s=coord.commit_timeout_s)
        coord.resolve_requested(run_id, run)  # done; an aborted transaction is a LostCommitError
        status = "COMMITTED"
    files = sorted(run["files"])
    return Resumed(run_id, files, txns, status, events, size)
