"""An ingest's state: its records and how they fold (:func:`apply_update`, pure: the synchronizer
replays them in every process), the interval index kept in it, and the store it lives in."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol



WRITING = "WRITING"
COMMITTING = "COMMITTING"
REQUESTED = "REQUESTED"


#: The interval index keeps the pieces of this many intervals (the oldest recorded are forgotten:
#: ~2.7 years of daily runs); and at most this many pieces per interval.
KEEP_INTERVALS = 1000
MAX_PIECES_PER_INTERVAL = 100


#: A staged file list whose run never recorded its start (its process died in between) is dropped
#: this long after it was staged.
STAGED_TTL_MS = 24 * 3600 * 1000


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
            written = run.setdefault("written", {})[op["txn"]] = {"holds": op["holds"], "events": op["events"],
                                                                  "bytes": op["bytes"]}
            if op.get("pieces") is not None:  # what the task measured of each line file it wrote
                written["pieces"] = op["pieces"]
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
    what the commit point recorded of them (``units``). A line file is recorded as the piece its
    write task measured while writing it (the ``pieces`` of the transaction's ``written`` record):
    the plan knew only what to ask for."""
    files = dict(run["files"])
    holds = run.get("holds") or {}
    units = run.get("units") or {}
    written = run.get("written") or {}
    for txn in run["commit"]:
        for unit in holds.get(txn, ()):
            files.setdefault(unit, dict(units.get(unit, {})))
        pieces = (written.get(txn) or {}).get("pieces")
        if pieces is not None:
            held = sorted(decode_holds({txn: written[txn]["holds"]}, run["files"])[txn])
            files.update(zip(held, (dict(p) for p in pieces)))
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

