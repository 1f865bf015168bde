"""The ingest protocol's state transitions and file planning (pure functions)."""

from __future__ import annotations

import pytest

from airflow_provider_pravega.client.ingest_errors import ChangedFileError
from airflow_provider_pravega.client.ingest_plan import file_identity, needs_fingerprint, plan_files, same_file
from airflow_provider_pravega.client.ingest_state import (
    COMMITTING,
    STAGED_TTL_MS,
    WRITING,
    apply_update,
    decode_holds,
    encode_holds,
    initial_state,
)


def fold(*ops):
    state = initial_state()
    for op in ops:
        state = apply_update(state, op)
    return state


FILES = {"/d/a.jsonl": {"size": 3, "fp": "aa"}, "/d/b.jsonl": {"size": 4, "fp": "bb"}}


def test_a_staged_file_list_becomes_its_runs_files_and_a_dead_runs_list_is_dropped():
    """A run's file list too large for one record is staged in parts first; its start takes them
    (minus files committed meanwhile). A list staged by a run that died before its start is
    dropped STAGED_TTL_MS later, so it cannot stay in the state for years."""
    state = fold(
        {"op": "stage", "run": "r1", "files": {"/d/a.jsonl": FILES["/d/a.jsonl"]}, "ts": 10},
        {"op": "stage", "run": "r1", "files": {"/d/b.jsonl": FILES["/d/b.jsonl"]}, "ts": 11},
        {"op": "stage", "run": "dead", "files": {"/d/c.jsonl": {"size": 1}}, "ts": 12},
        {"op": "start", "run": "r1", "staged": True, "exclude": ["/d/b.jsonl"], "owner": "o", "ts": 20},
    )
    assert state["runs"]["r1"]["files"] == {"/d/a.jsonl": FILES["/d/a.jsonl"]}
    assert set(state["staged"]) == {"dead"}
    state = apply_update(state, {"op": "start", "run": "r2", "files": {}, "owner": "o", "ts": 12 + STAGED_TTL_MS + 1})
    assert state["staged"] == {}
    state = fold({"op": "stage", "run": "r3", "files": FILES, "ts": 1}, {"op": "unstage", "run": "r3"})
    assert state["staged"] == {}


def test_a_run_goes_from_start_to_done():
    state = fold(
        {"op": "start", "run": "r1", "files": FILES, "owner": "o", "ts": 1},
        {"op": "register", "run": "r1", "txn": "t1"},
        {"op": "register", "run": "r1", "txn": "t1"},  # a retried registration is folded once
        {"op": "register", "run": "r1", "txn": "t2"},
    )
    assert state["runs"]["r1"]["phase"] == WRITING and state["runs"]["r1"]["txns"] == ["t1", "t2"]
    state = apply_update(state, {"op": "committing", "run": "r1", "txns": ["t2"], "ts": 5})
    assert state["runs"]["r1"]["phase"] == COMMITTING and state["runs"]["r1"]["commit"] == ["t2"]
    state = apply_update(state, {"op": "done", "run": "r1"})
    assert state["runs"] == {} and set(state["committed"]) == set(FILES)
    assert state["committed"]["/d/a.jsonl"] == {"size": 3, "fp": "aa", "run": "r1"}
    assert state["completed_runs"] == 1


def test_holds_are_recorded_compactly_and_decode_to_the_same_files():
    files = [f"/d/{i:03d}.jsonl" for i in range(10)]
    holds = {"t1": files[0:4], "t2": [files[4], files[7]], "t3": files[8:] + ["partition-00001"], "t4": []}
    encoded = encode_holds(holds, files)
    assert encoded["t1"] == [[0, 4]] and encoded["t2"] == [files[4], files[7]]
    assert decode_holds(encoded, reversed(files)) == {t: sorted(u) for t, u in holds.items()}


def test_lost_transactions_take_their_files_out_of_the_run_and_the_rest_is_committed():
    """A transaction aborted after the commit point (a lapsed lease) held whole files: ``lost``
    takes them out of the run, so ``done`` records only the committed ones' files, and the next
    plan writes the others again. A run that lost every transaction is gone, as if abandoned."""
    files = {f"/d/{c}.jsonl": file_identity(1, 1000) for c in "abcd"}
    holds = {"t1": ["/d/a.jsonl", "/d/b.jsonl"], "t2": ["/d/c.jsonl"], "t3": ["/d/d.jsonl"]}
    start = [{"op": "start", "run": "r1", "files": files, "owner": "o", "ts": 1},
             *({"op": "register", "run": "r1", "txn": t} for t in holds),
             {"op": "committing", "run": "r1", "txns": list(holds), "ts": 2,
              "holds": encode_holds(holds, files)}]
    state = fold(*start, {"op": "lost", "run": "r1", "txns": ["t2", "t3"], "ts": 3})
    assert state["runs"]["r1"]["commit"] == ["t1"] and sorted(state["runs"]["r1"]["files"]) == holds["t1"]
    state = apply_update(state, {"op": "done", "run": "r1"})
    assert sorted(state["committed"]) == holds["t1"]
    plan = plan_files(state, files, allow_changed_files=False)
    assert sorted(plan.to_ingest) == ["/d/c.jsonl", "/d/d.jsonl"]
    state = fold(*start, {"op": "lost", "run": "r1", "txns": ["t1", "t2", "t3"], "ts": 3})
    assert state["runs"] == {} and state["committed"] == {}


def test_units_held_but_not_planned_are_committed_with_their_transaction():
    """A data-source write plans no files up front: its input partitions, held by the committed
    transactions, are what its done record commits."""
    state = fold({"op": "start", "run": "r1", "files": {}, "owner": "o", "ts": 1},
                 {"op": "register", "run": "r1", "txn": "t1"}, {"op": "register", "run": "r1", "txn": "t2"},
                 {"op": "committing", "run": "r1", "txns": ["t1"], "ts": 2,
                  "holds": encode_holds({"t1": ["partition-00000"]}, {})},
                 {"op": "done", "run": "r1"})
    assert set(state["committed"]) == {"partition-00000"}


def test_updates_for_a_gone_run_are_moot():
    state = fold(
        {"op": "start", "run": "r1", "files": FILES, "owner": "o", "ts": 1},
        {"op": "abandon", "run": "r1"},
        {"op": "register", "run": "r1", "txn": "late"},
        {"op": "done", "run": "r1"},
    )
    assert state["runs"] == {} and state["committed"] == {}


def test_takeover_and_heartbeat():
    state = fold(
        {"op": "start", "run": "r1", "files": FILES, "owner": "old", "ts": 1},
        {"op": "heartbeat", "run": "r1", "ts": 9},
        {"op": "heartbeat", "run": "r1", "ts": 3},
    )
    assert state["runs"]["r1"]["heartbeat_ms"] == 9
    state = apply_update(state, {"op": "takeover", "run": "r1", "owner": "new", "ts": 20})
    assert state["runs"]["r1"]["owner"] == "new" and state["runs"]["r1"]["heartbeat_ms"] == 20


def test_plan_skips_committed_and_refuses_changed_files():
    state = fold(
        {"op": "start", "run": "r1", "files": FILES, "owner": "o", "ts": 1},
        {"op": "done", "run": "r1"},
    )
    ids = dict(FILES, **{"/d/c.jsonl": {"size": 1, "fp": "cc"}})
    plan = plan_files(state, ids, allow_changed_files=False)
    assert list(plan.to_ingest) == ["/d/c.jsonl"] and sorted(plan.skipped) == ["/d/a.jsonl", "/d/b.jsonl"]
    changed = dict(ids, **{"/d/a.jsonl": {"size": 3, "fp": "zz"}})
    with pytest.raises(ChangedFileError, match="allow_changed_files=True"):
        plan_files(state, changed, allow_changed_files=False)
    plan = plan_files(state, changed, allow_changed_files=True)
    assert sorted(plan.to_ingest) == ["/d/a.jsonl", "/d/c.jsonl"]


def test_identity_is_size_and_time_and_old_fingerprint_records_still_compare():
    new = file_identity(3, 1_700_000_000_123)
    assert new == {"size": 3, "mtime": 1_700_000_000_123}
    assert same_file(new, file_identity(3, 1_700_000_000_123)) is True
    assert same_file(new, file_identity(4, 1_700_000_000_123)) is False
    # Same size, rewritten (new time), no fingerprint on record: changed (an error, never a skip).
    assert same_file(new, file_identity(3, 1_700_000_009_000)) is False
    # A record from before listing through Spark ({size, fp}): only a fingerprint decides.
    old = {"size": 3, "fp": "aa", "run": "r0"}
    listed = file_identity(3, 1_700_000_000_123)
    assert same_file(old, listed) is None
    state = {"committed": {"/d/a.jsonl": old, "/d/b.jsonl": {"size": 9, "fp": "bb"}}, "runs": {}}
    assert needs_fingerprint(state, {"/d/a.jsonl": listed, "/d/b.jsonl": file_identity(3, 1)}) == ["/d/a.jsonl"]
    assert same_file(old, {**listed, "fp": "aa"}) is True and same_file(old, {**listed, "fp": "zz"}) is False
    plan = plan_files(state, {"/d/a.jsonl": {**listed, "fp": "aa"}}, allow_changed_files=False)
    assert plan.skipped == ["/d/a.jsonl"]
    with pytest.raises(ChangedFileError, match=r"size 3, modified 2023-11-14T22:13:20.123Z, fingerprint zz"):
        plan_files(state, {"/d/a.jsonl": {**listed, "fp": "zz"}}, allow_changed_files=False)


def test_prune_forgets_old_files_and_a_forgotten_file_listed_again_is_refused():
    from airflow_provider_pravega.client.ingest_errors import ForgottenFileError

    state = fold(
        {"op": "start", "run": "r1", "files": {"/d/old": {"size": 1, "mtime": 100}}, "owner": "o", "ts": 1},
        {"op": "done", "run": "r1", "ts": 1000},
        {"op": "start", "run": "r2", "files": {"/d/new": {"size": 2, "mtime": 5000}}, "owner": "o", "ts": 2},
        {"op": "done", "run": "r2", "ts": 6000},
        {"op": "prune", "before": 3000},
    )
    assert list(state["committed"]) == ["/d/new"] and state["forgotten_before_ms"] == 3000
    # Listed again unchanged (modified before the horizon): it may have been ingested: refused.
    with pytest.raises(ForgottenFileError, match="remember_files_for"):
        plan_files(state, {"/d/old": {"size": 1, "mtime": 100}}, allow_changed_files=False)
    assert list(plan_files(state, {"/d/old": {"size": 1, "mtime": 100}}, allow_changed_files=True).to_ingest) == [
        "/d/old"]
    # A file modified after the horizon is new to this ingest; a remembered one is skipped.
    plan = plan_files(state, {"/d/fresh": {"size": 3, "mtime": 4000}, "/d/new": {"size": 2, "mtime": 5000}},
                      allow_changed_files=False)
    assert list(plan.to_ingest) == ["/d/fresh"] and plan.skipped == ["/d/new"]


def test_plan_of_line_file_pieces():
    """A measured piece (see measure_pieces) continues the committed end; an empty one is skipped,
    a stale one (another run committed the file meanwhile) stops the run, a changed one is refused
    naming the lines that would repeat; what planning learnt (``changed``) is never recorded."""
    from airflow_provider_pravega.client.ingest_errors import IngestError

    first = {"size": 300, "mtime": 1, "base": 0, "start": 0, "end": 250, "fp": "f1", "line": 1, "lines": 5,
             "open": False}
    state = fold({"op": "start", "run": "r1", "files": {"/d/log": first}, "owner": "o", "ts": 1},
                 {"op": "done", "run": "r1"})
    grown = {"size": 400, "mtime": 2, "base": 250, "start": 250, "end": 400, "fp": "f2", "line": 6, "lines": 8,
             "open": False}
    assert plan_files(state, {"/d/log": grown}, allow_changed_files=False).to_ingest == {"/d/log": grown}
    waiting = dict(grown, end=250, start=250)  # only a line still being written after the committed end
    assert plan_files(state, {"/d/log": waiting}, allow_changed_files=False).skipped == ["/d/log"]
    with pytest.raises(IngestError, match="committed by another run of this ingest while this run measured it"):
        plan_files(state, {"/d/log": dict(grown, base=100)}, allow_changed_files=False)
    # Measured as new by a copy of the ingest while another copy committed the same piece: skipped.
    assert plan_files(state, {"/d/log": first}, allow_changed_files=False).skipped == ["/d/log"]
    changed = dict(grown, base=0, start=0, line=1, changed="its first 250 bytes differ from the bytes committed")
    with pytest.raises(ChangedFileError, match=r"its first 250 bytes differ from the bytes committed\. Committed so "
                                               r"far: lines 1-5 \(the last of them by run r1; .* writing lines 1-5 a "
                                               r"second time"):
        plan_files(state, {"/d/log": changed}, allow_changed_files=False)
    allowed = plan_files(state, {"/d/log": changed}, allow_changed_files=True).to_ingest["/d/log"]
    assert allowed["start"] == 0 and "changed" not in allowed
