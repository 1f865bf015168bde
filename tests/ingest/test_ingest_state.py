"""The ingest protocol's state transitions and file planning (pure functions)."""

from __future__ import annotations

import pytest

from airflow_provider_pravega.client.ingest import (
    COMMITTING,
    WRITING,
    ChangedFileError,
    apply_update,
    file_identity,
    initial_state,
    plan_files,
)


def fold(*ops):
    state = initial_state()
    for op in ops:
        state = apply_update(state, op)
    return state


FILES = {"/d/a.jsonl": {"size": 3, "fp": "aa"}, "/d/b.jsonl": {"size": 4, "fp": "bb"}}


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


def test_file_identity_changes_with_content(tmp_path):
    p = tmp_path / "f.jsonl"
    p.write_text('{"a": 1}\n')
    one = file_identity(str(p))
    p.write_text('{"a": 2}\n')
    two = file_identity(str(p))
    assert one["size"] == two["size"] and one["fp"] != two["fp"]
