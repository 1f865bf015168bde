"""Which files a run takes: file identities and how they compare, the plan (new files, grown line
files' pieces, files to skip), and the committed-file table planning reads and done runs fill."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_pravega.client.ingest_errors import ChangedFileError, ForgottenFileError, IngestError
from airflow_provider_pravega.client.ingest_state import StateStore

log = logging.getLogger(__name__)


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
