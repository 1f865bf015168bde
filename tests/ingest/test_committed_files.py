"""The ingest's committed files in a table segment keyed by file (client/committed_files.py), on
the embedded server and Pravega standalone: lookups by key, conditional recording that never
replaces a later run's entry, a bounded pruning sweep, a state that stays small however many
files were committed (and compacts), the move of an old state's committed map into the table,
a run recorded done whose files are not in the table yet (a crash in between), and resetting a
state (for a re-created target stream)."""

from __future__ import annotations

import json
import time

import pytest

from airflow_provider_pravega.client.ingest import IngestCoordinator, WriteResult, reset_ingest_state
from airflow_provider_pravega.client.ingest_errors import ChangedFileError, IngestError
from airflow_provider_pravega.client.ingest_location import open_ingest_state, state_location
from airflow_provider_pravega.client.ingest_plan import known_files


@pytest.fixture
def target(client, unique_name):
    scope = unique_name("keyed")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "s", 1)
    return scope, "s"


def files(prefix: str, n: int, mtime: int = 1_790_000_000_000) -> dict[str, dict]:
    return {f"{prefix}/part-{i:06d}.jsonl": {"size": 100 + i, "mtime": mtime + i} for i in range(n)}


class Writes:
    """The write stage of an at-least-once run (no transactions, no Spark): records what it got."""

    def __init__(self) -> None:
        self.runs: list[list[str]] = []

    def __call__(self, run_id, plan) -> WriteResult:
        self.runs.append(sorted(plan.to_ingest))
        return WriteResult([])


def test_record_lookup_and_never_over_a_later_run(client, target):
    with open_ingest_state(client, *target, "t") as store:
        table = store.files
        a = files("/in", 3)
        assert table.record(a, "r2", 200) == 3 and table.record(a, "r2", 200) == 0  # idempotent
        assert table.lookup(["/in/part-000001.jsonl", "/in/nope"]) == {
            "/in/part-000001.jsonl": {**a["/in/part-000001.jsonl"], "run": "r2", "at": 200}}
        changed = {p: {**ident, "size": 1} for p, ident in a.items()}
        assert table.record(changed, "r1", 100) == 0  # a late finisher of an older run: no effect
        assert table.lookup(a)["/in/part-000000.jsonl"]["run"] == "r2"
        assert table.record(changed, "r3", 300) == 3
        assert {v["size"] for v in table.lookup(a).values()} == {1}


def test_prune_sweeps_a_bounded_number_of_entries_per_call(client, target):
    with open_ingest_state(client, *target, "t") as store:
        table = store.files
        table.put_many((p, {**ident, "run": "old", "at": 100}) for p, ident in files("/old", 25).items())
        table.put_many((p, {**ident, "run": "new", "at": 900}) for p, ident in files("/new", 5).items())
        token, removed, calls = b"", 0, 0
        while True:
            n, token = table.prune(token, 500, budget=10)
            removed, calls = removed + n, calls + 1
            if not token:
                break
        assert removed == 25 and calls >= 3
        assert len(table.lookup(files("/old", 25))) == 0 and len(table.lookup(files("/new", 5))) == 5


def test_state_stays_small_and_compacts_with_many_files(client, target):
    """20,000 committed files: the synchronizer holds none of them (its compacted state is a few
    hundred bytes), a run looks up its own files only, and skips every one already committed."""
    writes = Writes()
    many = files("/in", 20_000)
    with open_ingest_state(client, *target, "many") as store:
        coord = IngestCoordinator(store, client.transactions, *target)
        coord.run(many, writes, transactional=False)
        head = store.compact()
        state = store.fetch()
        assert state["committed"] == {} and state["runs"] == {} and not state.get("unindexed")
    assert len(json.dumps(state)) < 1000 and head > 0
    with open_ingest_state(client, *target, "many") as fresh:  # a new task starts from the snapshot
        coord = IngestCoordinator(fresh, client.transactions, *target)
        out = coord.run({**many, "/in/new.jsonl": {"size": 1, "mtime": 1}}, writes, transactional=False)
        assert out.plan.to_ingest.keys() == {"/in/new.jsonl"} and len(out.plan.skipped) == 20_000
        changed = {"/in/part-000007.jsonl": {"size": 5, "mtime": 5}}
        with pytest.raises(ChangedFileError, match="part-000007"):
            coord.run(changed, writes, transactional=False)
    assert [len(r) for r in writes.runs] == [20_000, 1]


def test_a_run_of_more_files_than_one_state_record_holds_starts_commits_and_is_skipped_after(client, target):
    """90,000 files (over 8 MiB of file list, more than one Pravega event can hold): the run stages
    its list in parts before its start record instead of failing to record its start; every file is
    written once, the next run skips them all, and nothing staged is left in the state."""
    many = {f"s3a://lake/incoming/2026-12-01/hour=00/{i:06d}-part.jsonl": {"size": 1_000_000 + i, "mtime": 1_790_000_000_000 + i}
            for i in range(90_000)}
    assert len(json.dumps(many)) > 8 * 1024 * 1024  # the list cannot be one state record
    writes = Writes()
    with open_ingest_state(client, *target, "huge") as store:
        coord = IngestCoordinator(store, client.transactions, *target)
        out = coord.run(many, writes, transactional=False)
        assert out.plan.to_ingest.keys() == many.keys()
        state = store.fetch()
        assert state["runs"] == {} and not state.get("staged")
        store.compact()
    with open_ingest_state(client, *target, "huge") as fresh:
        out = IngestCoordinator(fresh, client.transactions, *target).run(many, writes, transactional=False)
        assert out.plan.to_ingest == {} and len(out.plan.skipped) == 90_000
    assert [len(r) for r in writes.runs] == [90_000]


def test_old_committed_map_moves_into_the_table_on_first_use(client, target):
    """A state written before the table existed (every committed file in the synchronizer) keeps
    working: the first run moves the map into the table and skips those files."""
    old = files("/in", 1_500)
    with open_ingest_state(client, *target, "old") as store:
        # What an older version recorded: start + done with the committed map in the state.
        store.update(lambda s: [{"op": "start", "run": "r-old", "files": old, "owner": "o", "ts": 1},
                                {"op": "done", "run": "r-old", "ts": 2}])
        assert len(store.fetch()["committed"]) == 1_500 and not store.fetch().get("keyed")
        writes = Writes()
        coord = IngestCoordinator(store, client.transactions, *target)
        out = coord.run({**old, "/in/new.jsonl": {"size": 1, "mtime": 1}}, writes, transactional=False)
        state = store.fetch()
    assert writes.runs == [["/in/new.jsonl"]] and len(out.plan.skipped) == 1_500
    assert state["keyed"] and state["committed"] == {}
    assert store.files.lookup(["/in/part-000042.jsonl"])["/in/part-000042.jsonl"]["run"] == "r-old"


def test_a_run_recorded_done_but_not_in_the_table_yet_counts_as_committed(client, target):
    """A finisher that crashed between the done record and the table write: planning still sees
    the run's files (from the state), and the next run writes them into the table."""
    a = files("/in", 3)
    with open_ingest_state(client, *target, "crash") as store:
        coord = IngestCoordinator(store, client.transactions, *target)
        coord.recover()  # the state is keyed from here
        store.update(lambda s: [{"op": "start", "run": "r1", "files": a, "owner": "o", "ts": 1},
                                {"op": "done", "run": "r1", "ts": int(time.time() * 1000)}])
        assert store.files.lookup(a) == {} and set(known_files(store, store.fetch(), a)) == set(a)
        writes = Writes()
        out = coord.run(a, writes, transactional=False)
        assert out.run_id is None and sorted(out.plan.skipped) == sorted(a) and writes.runs == []
        assert set(store.files.lookup(a)) == set(a) and not store.fetch().get("unindexed")


def test_reset_forgets_runs_and_files_but_never_under_a_live_run(client, target):
    """After the target stream was re-created, resetting its ingest's state makes the same files
    ingestible again (the committed-files table goes too, not only the synchronizer); a run still
    heartbeating refuses the reset, a run whose driver died long ago does not."""
    a = files("/in", 3)
    writes = Writes()
    with open_ingest_state(client, *target, "reset") as store:
        IngestCoordinator(store, client.transactions, *target).run(a, writes, transactional=False)
        store.update(lambda s: {"op": "start", "run": "live", "files": {}, "owner": "o", "ts": int(time.time() * 1000)})
    with pytest.raises(IngestError, match="live run"):
        reset_ingest_state(client, *target, "reset")
    with open_ingest_state(client, *target, "reset") as store:
        store.update(lambda s: [{"op": "abandon", "run": "live"},
                                {"op": "start", "run": "dead", "files": {}, "owner": "o", "ts": 1}])
    assert reset_ingest_state(client, *target, "reset") is True
    assert not client.admin.stream_exists(target[0], state_location(*target, "reset")[1])
    assert reset_ingest_state(client, *target, "reset") is False
    with open_ingest_state(client, *target, "reset") as store:
        out = IngestCoordinator(store, client.transactions, *target).run(a, writes, transactional=False)
    assert out.plan.skipped == {} or not out.plan.skipped
    assert writes.runs == [sorted(a), sorted(a)]
