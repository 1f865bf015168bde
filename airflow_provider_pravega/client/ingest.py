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
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import math
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from airflow_provider_pravega.client.errors import PravegaError

log = logging.getLogger(__name__)

WRITING = "WRITING"
COMMITTING = "COMMITTING"
REQUESTED = "REQUESTED"

#: The driver heartbeats at least this many times per ``stale_after_s``.
HEARTBEATS_PER_STALE = 4
#: ... but never more often than this (synchronizer traffic).
MIN_HEARTBEAT_S = 0.5
MAX_HEARTBEAT_S = 10.0
#: So the smallest ``stale_after_s`` that can be safe.
MIN_STALE_AFTER_S = HEARTBEATS_PER_STALE * MIN_HEARTBEAT_S
UNKNOWN_COMMITS = ("committed", "not_committed")
#: The interval index keeps the pieces of this many intervals (the oldest recorded are forgotten:
#: ~2.7 years of daily runs); and at most this many pieces per interval.
KEEP_INTERVALS = 1000
MAX_PIECES_PER_INTERVAL = 100
#: A run's file list larger than this (JSON bytes) is not put in its start record but staged first
#: in parts of at most STAGE_PART_BYTES, each its own state record: a state record is one Pravega
#: event (8 MiB at most, about 75,000 files), and a run of more files must still record its start.
INLINE_FILES_BYTES = 1024 * 1024
STAGE_PART_BYTES = 2 * 1024 * 1024
#: A staged file list whose run never recorded its start (its process died in between) is dropped
#: this long after it was staged.
STAGED_TTL_MS = 24 * 3600 * 1000


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
    """A committed file whose committed bytes changed (or that can only be compared by size and
    time): ingesting it again writes its committed records a second time, and the message says which."""

    def __init__(self, path: str, before: Mapping[str, Any], now: Mapping[str, Any]) -> None:
        self.path = path
        run = f"run {before['run']}" if before.get("run") else "an earlier run"
        if before.get("lines") is not None:
            what = repeat = "line 1" if before["lines"] == 1 else f"lines 1-{before['lines']}"
            by = f"by {run}" if before["lines"] == 1 else f"the last of them by {run}"
        else:
            what, repeat, by = f"every record of its {before['size']} bytes as recorded", "those records", f"by {run}"
        reason = now.get("changed") or "its size or modification time differ from those recorded"
        super().__init__(
            f"{path} changed since it was ingested: {reason}. Committed so far: {what} ({by}; recorded "
            f"{describe_identity(before)}; now {describe_identity(now)}). allow_changed_files=True would ingest the "
            f"whole file again from its first line, writing {repeat} a second time. To add records without "
            "duplicates, append them to a jsonl or text file (its new lines are ingested once) or write them to a "
            "new file."
        )


class ForgottenFileError(IngestError):
    """A file the state does not remember, last modified before the state forgot old files: it may
    have been ingested already (its record was pruned by ``remember_files_for``)."""

    def __init__(self, path: str, ident: Mapping[str, Any], forgotten_before_ms: int) -> None:
        self.path = path
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(forgotten_before_ms / 1000))
        super().__init__(
            f"{path} ({describe_identity(ident)}) is not in this ingest's state, but it was last modified before "
            f"{when}, up to which the state forgot the files it ingested (remember_files_for): it may have been "
            f"ingested already. Remove it from the source if it was; pass allow_changed_files=True to ingest it "
            f"anyway. Keep remember_files_for longer than any file stays in the source."
        )


class RecreatedStreamError(IngestError):
    """The state was recorded for an earlier stream of the target's name (deleted and re-created
    since): its committed files and positions describe the deleted stream."""


class LostCommitError(IngestError):
    """A transaction listed at the commit point was aborted: its events can never be committed."""


class UnresolvedCommitError(IngestError):
    """Nothing can tell whether a crashed run's transactions were committed (see the module doc)."""


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


# ---------------------------------------------------------------------------------------------
# The state and its transitions (pure: the synchronizer replays them in every process)
# ---------------------------------------------------------------------------------------------


def initial_state() -> dict[str, Any]:
    return {"committed": {}, "runs": {}, "completed_runs": 0, "target": None}


def apply_update(state: dict[str, Any], op: Mapping[str, Any]) -> dict[str, Any]:
    """Fold one update into the state. Updates are appended only after the writer validated them
    against exactly this state (conditional append), so applying them needs no checks beyond
    tolerating updates that became moot."""
    kind = op["op"]
    if kind == "init":
        if state.get("target") is None:
            adopted = op.get("adopted")
            if adopted:
                state["committed"] = dict(adopted.get("committed", {}))
                state["runs"] = dict(adopted.get("runs", {}))
                state["completed_runs"] = adopted.get("completed_runs", 0)
            state["target"] = op["target"]
            state["ingest_id"] = op.get("ingest_id")
        return state
    if kind == "origin":  # the target stream this state belongs to (see check_stream_origin)
        if state.get("origin") is None:
            state["origin"] = list(op["origin"])
        return state
    if kind == "prune":  # forget committed files recorded before ``before`` (remember_files_for)
        before = op.get("before")
        if before is not None:
            state["committed"] = {p: c for p, c in state["committed"].items() if (c.get("at") or 0) >= before}
            state["forgotten_before_ms"] = max(before, state.get("forgotten_before_ms") or 0)
        if "token" in op:  # where the committed-file table's bounded sweep continues
            state["prune_token"] = op["token"]
        return state
    if kind == "keyed":  # the committed map now lives in the committed-file table
        state["committed"] = {}
        state["keyed"] = True
        return state
    if kind == "indexed":  # a done run's files are in the committed-file table
        state.get("unindexed", {}).pop(op["run"], None)
        return state
    if kind == "empty_interval":  # a run of this interval had nothing (new) to ingest
        if op["interval"] not in state.get("intervals", {}):
            _add_piece(state, op["interval"], {"run": None, "start": op["at"], "end": op["at"]}, op.get("ts"),
                       op.get("keep", KEEP_INTERVALS))
        return state
    if kind == "migrated":  # a state of the old layout, adopted by the state of ``to``
        state["migrated_to"] = op["to"]
        return state
    if kind == "stage":  # a part of a large run's file list, before its start record
        _drop_stale_staged(state, op["ts"])
        state.setdefault("staged", {}).setdefault(op["run"], {"ts": op["ts"], "files": {}})["files"].update(op["files"])
        return state
    if kind == "unstage":
        state.get("staged", {}).pop(op["run"], None)
        return state
    runs = state["runs"]
    run = runs.get(op.get("run"))
    if kind == "start":
        _drop_stale_staged(state, op["ts"])
        if op.get("staged"):  # its files were staged: all of them but ``exclude`` (committed since)
            files = state.get("staged", {}).pop(op["run"], {"files": {}})["files"]
            for path in op.get("exclude", ()):
                files.pop(path, None)
        else:
            files = dict(op["files"])
        runs[op["run"]] = {
            "phase": WRITING, "files": files, "txns": [], "commit": [],
            "owner": op["owner"], "heartbeat_ms": op["ts"], "started_ms": op["ts"],
            "ti": op.get("ti"), "try": op.get("try"), "stale_ms": op.get("stale_ms"),
        }
        if op.get("interval") is not None:
            runs[op["run"]]["interval"] = op["interval"]
    elif run is None:
        return state
    elif kind == "register":
        if op["txn"] not in run["txns"]:
            run["txns"].append(op["txn"])
    elif kind == "written":  # a write task flushed its transaction: what it holds (client/ingest_resume.py)
        if op["txn"] in run["txns"] and run["phase"] == WRITING:
            run.setdefault("written", {})[op["txn"]] = {"holds": op["holds"], "events": op["events"],
                                                        "bytes": op["bytes"]}
    elif kind == "heartbeat":
        run["heartbeat_ms"] = max(run["heartbeat_ms"], op["ts"])
    elif kind == "committing":
        run["phase"] = COMMITTING
        run["commit"] = list(op["txns"])
        if op.get("holds") is not None:  # what each transaction holds: how a lapsed one is healed
            run["holds"] = decode_holds(op["holds"], run["files"])
        if op.get("units"):  # what the held units not planned up front are (a write's partitions' rows)
            run["units"] = dict(op["units"])
        run["heartbeat_ms"] = max(run["heartbeat_ms"], op["ts"])
        state["commit_points"] = state.get("commit_points", 0) + 1
        if op.get("before") is not None:
            run["before"] = dict(op["before"])
    elif kind == "requested":
        if run["phase"] == COMMITTING:
            run["phase"] = REQUESTED
            run["requested_ms"] = op.get("ts")
    elif kind == "lost":  # transactions past the commit point that were aborted (their leases lapsed)
        lost = set(op["txns"])
        holds = run.get("holds") or {}
        for txn in lost:
            for unit in holds.pop(txn, ()):
                run["files"].pop(unit, None)  # not committed: planned again by the next run
        run["commit"] = [t for t in run["commit"] if t not in lost]
        run["txns"] = [t for t in run["txns"] if t not in lost]
        if not run["commit"]:
            del runs[op["run"]]  # nothing of it was committed: as if abandoned
    elif kind == "done":
        files = _run_units(run)
        if state.get("keyed"):  # its files go to the committed-file table next (see index_done_runs)
            state.setdefault("unindexed", {})[op["run"]] = {"files": files, "at": op.get("ts")}
        for path, ident in ({} if state.get("keyed") else files).items():
            at = {"at": op["ts"]} if op.get("ts") is not None else {}  # when (remember_files_for)
            state["committed"][path] = {**ident, "run": op["run"], **at}
        if run.get("interval") is not None and run.get("before") is not None:
            _add_piece(state, run["interval"], {"run": op["run"], "start": run["before"], "end": op.get("end")},
                       op.get("ts"), op.get("keep", KEEP_INTERVALS))
        del runs[op["run"]]
        state["completed_runs"] = state.get("completed_runs", 0) + 1
    elif kind == "abandon":
        del runs[op["run"]]
    elif kind == "takeover":
        run["owner"] = op["owner"]
        run["heartbeat_ms"] = op["ts"]
        if "ti" in op:
            run["ti"], run["try"] = op.get("ti"), op.get("try")
    return state


def _run_units(run: Mapping[str, Any]) -> dict[str, Any]:
    """What a done run committed: its files, plus the units its committed transactions hold that
    were not planned up front (a data-source write's input partitions, see encode_holds), with
    what the commit point recorded of them (``units``)."""
    files = dict(run["files"])
    holds = run.get("holds") or {}
    units = run.get("units") or {}
    for txn in run["commit"]:
        for unit in holds.get(txn, ()):
            files.setdefault(unit, dict(units.get(unit, {})))
    return files


def encode_holds(holds: Mapping[str, Sequence[str]], files: Iterable[str]) -> dict[str, list[Any]]:
    """``txn -> units`` for the commit record, compactly: a run of consecutive files (in the order
    of the run's sorted file list) is ``[first index, end index]``, anything else its name. Each
    transaction holds whole units (files), so the files of an aborted one can be written again."""
    order = {path: i for i, path in enumerate(sorted(files))}
    out: dict[str, list[Any]] = {}
    for txn, units in holds.items():
        items: list[Any] = []
        for unit in sorted(units, key=lambda u: (order.get(u, len(order)), u)):
            i = order.get(unit)
            last = items[-1] if items else None
            if i is not None and isinstance(last, list) and last[1] == i:
                last[1] = i + 1
            elif i is not None and isinstance(last, str) and order.get(last) == i - 1:
                items[-1] = [i - 1, i + 1]
            else:
                items.append(unit)
        out[txn] = items
    return out


def decode_holds(encoded: Mapping[str, Sequence[Any]], files: Iterable[str]) -> dict[str, list[str]]:
    """The inverse of :func:`encode_holds` against the same file list."""
    order: list[str] | None = None
    holds: dict[str, list[str]] = {}
    for txn, items in encoded.items():
        units: list[str] = []
        for item in items:
            if isinstance(item, str):
                units.append(item)
            else:
                order = sorted(files) if order is None else order
                units.extend(order[item[0]:item[1]])
        holds[txn] = units
    return holds


def _drop_stale_staged(state: dict[str, Any], now_ms: int) -> None:
    """Forget file lists staged by runs that died before recording their start (STAGED_TTL_MS)."""
    staged = state.get("staged")
    for rid in [r for r, st in (staged or {}).items() if st["ts"] < now_ms - STAGED_TTL_MS]:
        del staged[rid]


def _add_piece(state: dict[str, Any], interval: str, piece: dict[str, Any], ts: int | None, keep: int) -> None:
    """Append a committed range to the interval index; forget the intervals recorded longest ago
    beyond ``keep`` (bounded state)."""
    intervals = state.setdefault("intervals", {})
    entry = intervals.setdefault(interval, {"pieces": []})
    if len(entry["pieces"]) >= MAX_PIECES_PER_INTERVAL:
        entry["overflow"] = True  # the export refuses it (never a silently partial day)
    else:
        entry["pieces"].append(piece)
    entry["at"] = ts or 0
    if len(intervals) > keep:
        oldest = sorted(intervals, key=lambda k: (intervals[k].get("at") or 0, k))[: len(intervals) - keep]
        for key in oldest:
            state["intervals_forgotten_at"] = max(state.get("intervals_forgotten_at") or 0, intervals[key].get("at") or 0)
            del intervals[key]


def interval_pieces(state: Mapping[str, Any], interval: str) -> list[dict[str, Any]] | None:
    """The committed ranges of ``interval`` in commit order (``start``/``end``: segment id text ->
    offset), or None when no run of this interval was recorded done."""
    entry = (state.get("intervals") or {}).get(interval)
    return None if entry is None else list(entry["pieces"])


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
    byte, hex; states written before listing through Spark hold only size and fingerprint).

    A line file's piece (measured in Spark tasks before planning) adds: ``base`` (the committed end
    it continues, 0 for a new file), ``start``/``end`` (the byte range it writes: whole lines, the
    bytes before ``end`` all committed once it is done), ``fp`` (BLAKE2b-160 of bytes ``[0, end)``),
    ``line`` (the number of its first line in the whole file), ``lines`` (lines in ``[0, end)``),
    ``open`` (its last line has no line end yet), and ``changed`` (why its committed bytes are not
    what was committed: planning only, never recorded)."""
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


def needs_fingerprint(state: Mapping[str, Any], identities: Mapping[str, Mapping[str, Any]],
                      store: StateStore | None = None) -> list[str]:
    """Files whose planning needs a content fingerprint (see same_file)."""
    committed = known_files(store, state, identities) if store is not None else state["committed"]
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


def committed_end(before: Mapping[str, Any]) -> int:
    """Where a committed file's committed bytes end (records written before pieces: its size)."""
    return int(before.get("end", before["size"]))


@dataclass(frozen=True)
class FilePlan:
    to_ingest: dict[str, dict[str, Any]]  # path -> identity
    skipped: list[str]  # already committed, unchanged (or a line file without a new whole line)


def plan_files(
    state: Mapping[str, Any], identities: Mapping[str, Mapping[str, Any]], *, allow_changed_files: bool
) -> FilePlan:
    committed = state["committed"]
    to_ingest: dict[str, dict[str, Any]] = {}
    skipped: list[str] = []
    for path, ident in identities.items():
        before = committed.get(path)
        if "end" in ident and ident.get("base", 0) != (0 if before is None or ident.get("changed") else
                                                       committed_end(before)):
            if before is not None and before.get("fp") == ident["fp"] and committed_end(before) == ident["end"]:
                skipped.append(path)  # this very piece, committed meanwhile by another copy of the ingest
                continue
            raise IngestError(f"{path} was committed by another run of this ingest while this run measured it "
                              f"(committed up to byte {0 if before is None else committed_end(before)}, measured "
                              f"from byte {ident.get('base', 0)}); nothing was written: run the ingest again")
        if "end" in ident and not ident.get("changed") and ident["end"] <= ident["start"]:
            skipped.append(path)  # no new whole line (yet): nothing to write, nothing to record
        elif before is None:
            forgotten = state.get("forgotten_before_ms")
            if (forgotten is not None and ident.get("mtime") is not None and ident["mtime"] < forgotten
                    and not allow_changed_files):
                raise ForgottenFileError(path, ident, forgotten)
            to_ingest[path] = _recorded(ident)
        elif ident.get("changed"):
            if not allow_changed_files:
                raise ChangedFileError(path, before, ident)
            to_ingest[path] = _recorded(ident)
        elif "end" in ident:  # a line file measured after its committed end: its new whole lines
            to_ingest[path] = _recorded(ident)
        elif same_file(before, ident):
            skipped.append(path)
        elif allow_changed_files:
            to_ingest[path] = dict(ident)
        else:
            raise ChangedFileError(path, before, ident)
    return FilePlan(to_ingest, skipped)


def _recorded(ident: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in ident.items() if k != "changed"}


# ---------------------------------------------------------------------------------------------
# Committed files: a table keyed by file (client/committed_files.py), not the synchronizer
# ---------------------------------------------------------------------------------------------

#: Committed-file table entries a finished run scans for pruning (at least twice its own files).
PRUNE_BUDGET = 10_000


def known_files(store: Any, state: Mapping[str, Any], paths: Iterable[str]) -> dict[str, dict[str, Any]]:
    """What the ingest remembers about ``paths``: their committed-file table entries (looked up
    by key: the cost follows ``paths``, not the history), overlaid with the state's own records
    (an old state's ``committed`` map not moved yet; runs recorded done, not yet in the table)."""
    paths = list(paths)
    known: dict[str, dict[str, Any]] = {}
    files = getattr(store, "files", None)
    if files is not None and state.get("keyed"):
        known.update(files.lookup(paths))
    committed = state["committed"]
    known.update({p: committed[p] for p in paths if p in committed})
    for run_id, entry in sorted(state.get("unindexed", {}).items(), key=lambda kv: kv[1].get("at") or 0):
        at = {"at": entry["at"]} if entry.get("at") is not None else {}
        known.update({p: {**entry["files"][p], "run": run_id, **at} for p in paths if p in entry["files"]})
    return known


def index_done_runs(store: Any, state: Mapping[str, Any]) -> dict[str, Any]:
    """Write the files of runs recorded done into the committed-file table, then drop them from
    the state. Anyone may do it, any number of times (the table writes are idempotent and never
    replace a later run's entry); a crash in between leaves them in the state, where planning
    still sees them, for the next run to index."""
    files = getattr(store, "files", None)
    if files is None:
        return dict(state)
    for run_id, entry in sorted(state.get("unindexed", {}).items(), key=lambda kv: kv[1].get("at") or 0):
        files.record(entry["files"], run_id, entry.get("at"))
        state = store.update(lambda s, r=run_id: {"op": "indexed", "run": r} if r in s.get("unindexed", {}) else None)
    return dict(state)


def move_committed_to_table(store: Any) -> dict[str, Any]:
    """Migration: a state of the old layout (every committed file in the synchronizer) moves its
    ``committed`` map into the committed-file table on first use, then records ``keyed``."""
    files = getattr(store, "files", None)
    state = store.fetch()
    if files is None or state.get("keyed"):
        return state

    def fn(state: dict[str, Any]) -> dict:
        files.put_many(state["committed"].items())  # full records: identity, run, at
        return {"op": "keyed"}

    moved = len(state["committed"])
    state = store.update(fn)
    if moved:
        log.info("moved %d committed file(s) of the ingest state into its committed-file table", moved)
    return state


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
        txns: TransactionOps,
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
        now = _now_ms()
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
                if run is None or run["phase"] == REQUESTED or not self._stale(run, _now_ms()):
                    raise _Skip()
                return {"op": "takeover", "run": run_id, "owner": self.owner, "ts": _now_ms(),
                        "ti": self.task_instance, "try": self.try_number}

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
                op = {"op": "start", "run": run_id, "owner": self.owner, "ts": _now_ms(),
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

    def _open_run_op(self, run_id: str) -> dict[str, Any]:
        """The start record of a run whose units are named at its commit point."""
        return {"op": "start", "run": run_id, "owner": self.owner, "ts": _now_ms(), "files": {},
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
                self.store.update(lambda s: {"op": "takeover", "run": run_id, "owner": self.owner, "ts": _now_ms()}
                                  if run_id in s["runs"] else None)
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
        cutoff = _now_ms() - int(older_than_s * 1000)
        dropped = []
        for run_id, run in self.store.fetch()["runs"].items():
            if run["heartbeat_ms"] >= cutoff:
                continue

            def take(state: dict[str, Any], run_id: str = run_id) -> dict:
                now = state["runs"].get(run_id)
                if now is None or now["heartbeat_ms"] >= cutoff:
                    raise _Skip()
                return {"op": "takeover", "run": run_id, "owner": self.owner, "ts": _now_ms()}

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
            self.store.update(lambda _s, f=part: {"op": "stage", "run": run_id, "files": f, "ts": _now_ms()})
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
        self.store.update(self._owned(run_id, lambda: {"op": "heartbeat", "run": run_id, "ts": _now_ms()}))

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
            op = {"op": "committing", "run": run_id, "txns": list(txns), "ts": _now_ms()}
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
            if run is None:
                run = self.store.fetch()["runs"].get(run_id) or {}
            self.returned[run_id] = self.heal_lost(run_id, run, aborted)
            self.lost[run_id] = aborted
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
        for i, (hex_id, state) in enumerate(states.items()):
            if state == "OPEN":
                self.txns.commit(self.scope, self.stream, int(hex_id, 16), wait=False)
            if i == 0:
                self._crash("after_first_commit")
        self._crash("after_commit_acks")
        return True

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
            return {"op": "lost", "run": run_id, "txns": still, "ts": _now_ms()} if still else None

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
            return {"op": "requested", "run": run_id, "ts": _now_ms()}

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
            op = {"op": "done", "run": run_id, "ts": _now_ms(), "keep": self.keep_intervals}
            if end is not None:
                op["end"] = end
            return op

        state = self.store.update(fn)
        done_files = len(state.get("unindexed", {}).get(run_id, {}).get("files", ()))
        state = index_done_runs(self.store, state)
        if self.remember_files_for_ms is not None:
            horizon = _now_ms() - self.remember_files_for_ms
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
                          {"op": "empty_interval", "interval": interval, "at": at, "ts": _now_ms(),
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
        for hex_id in hex_ids:
            try:
                self.txns.abort(self.scope, self.stream, int(hex_id, 16))
            except PravegaError as exc:  # already committed/aborted/expired: nothing to undo
                log.debug("abort of %s: %s", hex_id, exc)


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
        op = {"op": "done", "run": run_id, "ts": _now_ms()}
        if end is not None:
            op["end"] = {str(k): int(v) for k, v in end.items()}
        return op

    index_done_runs(store, store.update(fn))
    return bool(done)


# ---------------------------------------------------------------------------------------------
# Where an ingest's state lives
# ---------------------------------------------------------------------------------------------


def check_state_scope(state_scope: Any, option: str = "state_scope") -> str | None:
    """``state_scope`` as given when it can name a Pravega scope (None: the target's own scope);
    ValueError naming ``option`` otherwise, before anything is created there."""
    if state_scope is None:
        return None
    from airflow_provider_pravega.protocol.naming import validate_scope_name

    if not isinstance(state_scope, str):
        raise ValueError(f"{option} must be a Pravega scope name (or None), got a {type(state_scope).__name__}")
    try:
        return validate_scope_name(state_scope)
    except ValueError as exc:
        raise ValueError(f"{option}={state_scope!r} is not a usable scope for the provider's state: {exc}") from None


@contextlib.contextmanager
def state_scope_access(scope: str, state_scope: str | None) -> Iterator[None]:
    """A permission denied in a state scope of its own (not the target's ``scope``) named as the
    ``state_scope`` option's, with the rights the provider needs there."""
    from airflow_provider_pravega.client.errors import PravegaPermissionError

    try:
        yield
    except PravegaPermissionError as exc:
        # the state scope as a whole name ("scope iot-state", "stream iot-state/x"), not inside another
        named = state_scope in {word.rstrip(".") for word in re.split(r"[\s/:,;()'\"]+", f"{exc.resource} {exc.detail}")}
        if not state_scope or state_scope == scope or not named:
            raise
        raise PravegaPermissionError(
            exc.where, exc.user, exc.action, exc.resource,
            f"state_scope {state_scope!r} keeps the provider's state: the user needs READ_UPDATE on "
            f"prn::/scope:{state_scope} and prn::/scope:{state_scope}/*, and the scope must exist or the user be "
            f"allowed to create it" + (f"; {exc.detail}" if exc.detail else ""),
        ) from None


def state_location(scope: str, stream: str, ingest_id: str, state_scope: str | None = None) -> tuple[str, str]:
    """The state of ingest ``ingest_id`` into ``scope/stream``: a one-segment stream in
    ``state_scope`` (default: the target's own scope; not `_`-prefixed: Pravega reserves those
    names). The digest covers scope, stream and id, so targets sharing a state scope never collide."""
    digest = hashlib.sha1(f"{scope}/{stream}\n{ingest_id}".encode()).hexdigest()[:20]
    return state_scope or scope, f"ingest-state-{digest}"


def reset_ingest_state(client: Any, scope: str, stream: str, ingest_id: str, *, state_scope: str | None = None
                       ) -> bool:
    """Forget everything ingest ``ingest_id`` recorded for ``scope/stream`` (runs, committed files,
    interval index): for a target stream that was deleted and re-created, whose old positions and
    files the state would otherwise keep describing. Refused while a run still heartbeats (a live
    run would lose its bookkeeping). Idempotent; returns False when there was nothing to forget."""
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


def legacy_state_location(scope: str, ingest_id: str) -> tuple[str, str]:
    """Where versions before 0.2 kept an ingest's state (keyed by the ingest id only)."""
    return scope, f"ingest-state-{hashlib.sha1(ingest_id.encode()).hexdigest()[:20]}"


def check_write_access(client: Any, scope: str, stream: str) -> None:
    """Fail before anything is written when the client's user may not write ``scope/stream``
    (asks the controller for a write delegation token, as a writer would; no-op without auth)."""
    from airflow_provider_pravega.client.errors import PravegaPermissionError

    try:
        client.controller.get_delegation_token(scope, stream, "write")
    except PravegaPermissionError as exc:
        raise PravegaPermissionError(
            exc.where, exc.user, "write", f"stream {scope}/{stream}",
            f"no write permission on {scope}/{stream}: ingesting needs READ_UPDATE on the stream and its scope",
        ) from None


def open_state_store(client: Any, scope: str, stream: str, *, create: bool = True) -> Any:
    """The ingest's state synchronizer on ``scope/stream`` (created with one segment if missing),
    with its committed-file table as ``.files`` (created on first use)."""
    from airflow_provider_pravega.client.committed_files import CommittedFiles
    from airflow_provider_pravega.client.synchronizer import StateSynchronizer

    store = StateSynchronizer(client, scope, stream, initial_state(), apply_update, create=create)
    store.files = CommittedFiles(client, scope, stream)  # type: ignore[attr-defined]
    return store


def open_ingest_state(client: Any, scope: str, stream: str, ingest_id: str, *, stale_after_s: float = 60.0,
                      state_scope: str | None = None) -> Any:
    """The state of ingest ``ingest_id`` into ``scope/stream``, initialized on first use (kept in
    ``state_scope``, created if missing; default: the target's scope).

    Migration: when this state is new and an old-layout state of the same ingest id exists in the
    scope (not yet adopted by another target), and the target stream already holds data, the old
    state is adopted (it was this stream's); an empty target stream starts fresh (a re-pointed
    ingest ingests its files into the new stream).
    The state belongs to the stream it was first used with: once that stream was deleted and
    re-created, opening it is a RecreatedStreamError (see check_stream_origin).
    """
    location = state_location(scope, stream, ingest_id, state_scope)
    with state_scope_access(scope, state_scope):
        _check_not_moved(client, location, scope, stream, ingest_id)
        store = open_state_store(client, *location)
    try:
        if store.fetch().get("target") is None:
            _init_state(client, store, scope, stream, ingest_id, stale_after_s)
        check_stream_origin(client, store, scope, stream, ingest_id)
    except BaseException:
        store.close()
        raise
    return store


def _check_not_moved(client: Any, location: tuple[str, str], scope: str, stream: str, ingest_id: str) -> None:
    """IngestError (before anything is created) when a new state in a state scope would leave the
    ingest's state in the target's own scope behind: it would know no committed file and ingest
    every file again."""
    own_scope, own_stream = state_location(scope, stream, ingest_id)
    if location == (own_scope, own_stream) or client.admin.stream_exists(*location) or \
            not client.admin.stream_exists(own_scope, own_stream):
        return
    raise IngestError(
        f"ingest {ingest_id!r} into {scope}/{stream} keeps its state in {own_scope}/{own_stream} (the stream's own "
        f"scope), not in state_scope {location[0]!r}: a new state there would ingest every file of the source again. "
        f"Leave state_scope unset for this ingest, or forget the old state (python -m airflow_provider_pravega state "
        f"--scope {own_scope} reset {own_stream} --yes) to start afresh in {location[0]}.")


def _init_state(client: Any, store: Any, scope: str, stream: str, ingest_id: str, stale_after_s: float) -> None:
    target = f"{scope}/{stream}"
    adopted = _legacy_to_adopt(client, scope, stream, ingest_id, stale_after_s)
    store.update(lambda s: None if s.get("target") is not None else
                 {"op": "init", "target": target, "ingest_id": ingest_id, "adopted": adopted})
    if adopted is not None:
        legacy = open_state_store(client, *legacy_state_location(scope, ingest_id), create=False)
        try:
            legacy.update(lambda s: None if s.get("migrated_to") else {"op": "migrated", "to": target})
        finally:
            legacy.close()
        log.info("ingest %s: adopted the state of the old layout (%d committed file(s)) for %s",
                 ingest_id, len(adopted.get("committed", {})), target)


def check_stream_origin(client: Any, store: Any, scope: str, stream: str, ingest_id: str, *,
                        record: bool = True) -> None:
    """RecreatedStreamError when the state in ``store`` was recorded for an earlier stream named
    ``scope/stream``: the origin (:meth:`StreamAdmin.origin`) is recorded when the state is first
    used with the stream, and a state recorded before that adopts the current stream. Without
    ``record`` (readers such as the export) only a recorded origin is compared. A missing stream
    has nothing to compare."""
    if not client.admin.stream_exists(scope, stream):
        return
    changed = client.admin.origin_changed(
        scope, stream, store.fetch().get("origin"),
        (lambda origin: store.update(lambda s: None if s.get("origin") is not None else
                                     {"op": "origin", "origin": origin}).get("origin")) if record else None)
    if changed is None:
        return
    recorded, origin = changed
    raise RecreatedStreamError(
        f"the state of ingest {ingest_id!r} ({store.scope}/{store.stream}) belongs to an earlier stream "
        f"{scope}/{stream}, deleted and re-created since (the state's stream was created with segment(s) "
        f"{', '.join(map(str, recorded))}, the current one with {', '.join(map(str, origin))}). The files it "
        f"recorded as committed, and its interval index, describe the deleted stream: used as they are, they "
        f"would be skipped and never reach the new stream. Forget them with reset_ingest_state(client, "
        f"{scope!r}, {stream!r}, {ingest_id!r}"
        f"{'' if store.scope == scope else f', state_scope={store.scope!r}'}) (airflow_provider_pravega.client.ingest) "
        f"to ingest into the new "
        f"stream, or give this ingest another ingest_id."
    )


def _legacy_to_adopt(client: Any, scope: str, stream: str, ingest_id: str, stale_after_s: float) -> dict | None:
    legacy_scope, legacy_stream = legacy_state_location(scope, ingest_id)
    admin = client.admin
    if not admin.stream_exists(legacy_scope, legacy_stream):
        return None
    legacy = open_state_store(client, legacy_scope, legacy_stream, create=False)
    try:
        state = legacy.fetch()
    finally:
        legacy.close()
    if state.get("migrated_to") or not (state["committed"] or state["runs"]):
        return None
    if not admin.stream_exists(scope, stream) or not any(admin.tail(scope, stream).values()):
        return None  # an empty target cannot hold what the old state recorded: start fresh
    horizon = _now_ms() - int(stale_after_s * 1000)
    live = [rid for rid, run in state["runs"].items() if run["heartbeat_ms"] >= horizon]
    if live:
        raise IngestError(
            f"ingest {ingest_id!r} has run(s) {', '.join(live)} in progress under an older version of this provider "
            f"(state {legacy_scope}/{legacy_stream}); let them finish (or wait {stale_after_s:g} s) and re-run"
        )
    return state


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
    from airflow_provider_pravega.client.controller_types import TxnStatus

    # Waited for only after the commit requests were acknowledged and recorded: a transaction the
    # controller forgot since (UNKNOWN) was committed.
    return {TxnStatus.COMMITTED, TxnStatus.UNKNOWN}
