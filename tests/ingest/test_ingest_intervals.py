"""The ingest's interval index (client/ingest.py): per data interval, the stream cuts around what
its runs committed. Pure state transitions first, then the coordinator against the embedded
server with real transactions (no Spark): runs of several intervals, one committing while another
waits at its commit point, each piece reads back exactly its run's events; a transaction registered
just before a commit point, not in the commit, is aborted by it."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from airflow_provider_pravega.client.ingest import IngestCoordinator, WriteResult
from airflow_provider_pravega.client.ingest_location import open_ingest_state
from airflow_provider_pravega.client.ingest_plan import known_files
from airflow_provider_pravega.client.ingest_state import REQUESTED, apply_update, initial_state, interval_pieces
from airflow_provider_pravega.client.task_stage import register_txn


def fold(*ops):
    state = initial_state()
    for op in ops:
        state = apply_update(state, op)
    return state


def run_ops(run: str, interval: str | None, before: dict, end: dict | None, ts: int, keep: int = 1000) -> list[dict]:
    start = {"op": "start", "run": run, "files": {f"/{run}": {"size": 1, "mtime": 1}}, "owner": "o", "ts": ts}
    if interval is not None:
        start["interval"] = interval
    done = {"op": "done", "run": run, "ts": ts, "keep": keep}
    if end is not None:
        done["end"] = end
    return [start, {"op": "register", "run": run, "txn": "t"},
            {"op": "committing", "run": run, "txns": ["t"], "ts": ts, "before": before},
            {"op": "requested", "run": run, "ts": ts}, done]


def test_a_done_run_with_an_interval_records_its_piece():
    state = fold(*run_ops("r1", "day1", {"0": 10}, {"0": 25}, 1))
    assert interval_pieces(state, "day1") == [{"run": "r1", "start": {"0": 10}, "end": {"0": 25}}]
    assert interval_pieces(state, "day2") is None
    # a second run of the same interval (new files) adds a piece, in commit order
    state = fold(*run_ops("r1", "day1", {"0": 10}, {"0": 25}, 1), *run_ops("r2", "day1", {"0": 40}, {"0": 50}, 2))
    assert [p["run"] for p in interval_pieces(state, "day1")] == ["r1", "r2"]
    # runs without an interval record nothing; every commit point is counted
    state = fold(*run_ops("r3", None, {"0": 0}, {"0": 5}, 3))
    assert state.get("intervals", {}) == {} and state["commit_points"] == 1


def test_an_empty_interval_is_recorded_once_and_the_index_is_bounded():
    state = fold({"op": "empty_interval", "interval": "day1", "at": {"0": 7}, "ts": 1},
                 {"op": "empty_interval", "interval": "day1", "at": {"0": 9}, "ts": 2})
    assert interval_pieces(state, "day1") == [{"run": None, "start": {"0": 7}, "end": {"0": 7}}]
    ops = [op for day in range(5) for op in run_ops(f"r{day}", f"day{day}", {"0": day}, {"0": day + 1}, 10 + day,
                                                       keep=3)]
    state = fold(*ops)
    assert sorted(state["intervals"]) == ["day2", "day3", "day4"] and state["intervals_forgotten_at"] == 11


# ------------------------------------------------------------------ the coordinator, real transactions


@pytest.fixture
def client(embedded_client):
    return embedded_client


def tail(client: Any, scope: str, stream: str) -> dict[str, int]:
    from airflow_provider_pravega.client.streamcut import StreamCut

    return {str(k): v for k, v in StreamCut.tail(client, scope, stream).positions.items()}


def piece_events(client: Any, scope: str, stream: str, piece: dict) -> Counter:
    from airflow_provider_pravega.client.batch import plan_segment_ranges, read_segment_ranges
    from airflow_provider_pravega.client.streamcut import StreamCut

    start = StreamCut(scope, stream, {int(k): v for k, v in piece["start"].items()})
    end = StreamCut(scope, stream, {int(k): v for k, v in piece["end"].items()})
    return Counter(e.payload.decode() for e in read_segment_ranges(client, plan_segment_ranges(client, start, end)))


def writer_of(client: Any, store: Any, scope: str, stream: str, payloads: list[str], owner: str,
              after_write: threading.Event | None = None):
    """A write stage: one transaction per two payloads, registered before writing."""

    def write(run_id: str, plan: Any) -> WriteResult:
        txns = []
        for i in range(0, len(payloads), 2):
            info = client.transactions.begin(scope, stream)
            hex_id = f"{info.txn_id:032x}"
            register_txn(store, run_id, hex_id, owner)
            w = client.transactions.writer(scope, stream, info)
            for n, p in enumerate(payloads[i:i + 2]):
                w.write_event(p.encode(), f"k{n}")
            w.flush()
            w.close()
            txns.append(hex_id)
        return WriteResult(txns, len(payloads))

    return write


def plain_write(client: Any, scope: str, stream: str, payload: str) -> None:
    writer = client.event_writer(scope, stream)
    writer.write_event(payload.encode(), "x")
    writer.flush()
    writer.close()


def coordinator(client: Any, store: Any, scope: str, stream: str) -> IngestCoordinator:
    return IngestCoordinator(store, client.transactions, scope, stream, stale_after_s=30,
                             tail_positions=lambda: tail(client, scope, stream))


def test_each_interval_piece_holds_exactly_its_runs_events(client, unique_name):
    """Day 2 runs before day 1; day 1's run returns before its commits finish (REQUESTED) and day 3
    finishes it at its commit point. Every piece reads back exactly its run's events, plus what
    another writer appended while the piece was open (by design); an event another writer appended
    between runs is in no piece; an interval with nothing new to ingest is an empty range."""
    scope, stream = unique_name("idx"), "s"
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 2)
    days = {d: [f"day{d}-{n}" for n in range(5)] for d in (1, 2, 3)}
    with open_ingest_state(client, scope, stream, "idx") as store:
        coord = coordinator(client, store, scope, stream)
        out2 = coord.run({"/d2": {"size": 1, "mtime": 1}}, writer_of(client, store, scope, stream, days[2], coord.owner),
                         interval="day2")
        assert out2.status == "COMMITTED"
        plain_write(client, scope, stream, "between-runs")
        out1 = coord.run({"/d1": {"size": 1, "mtime": 1}}, writer_of(client, store, scope, stream, days[1], coord.owner),
                         interval="day1", wait_for_commit=False)
        assert store.fetch()["runs"][out1.run_id]["phase"] == REQUESTED
        second = IngestCoordinator(  # another copy of the task: day 3, with another writer at its commit point
            store, client.transactions, scope, stream, stale_after_s=30,
            tail_positions=lambda: tail(client, scope, stream),
            crash_hook=lambda step: plain_write(client, scope, stream, "inside-day3")
            if step == "after_commit_record" else None)
        out3 = second.run({"/d3": {"size": 1, "mtime": 1}}, writer_of(client, store, scope, stream, days[3], second.owner),
                          interval="day3")
        assert out3.finished == [out1.run_id]  # it finished day 1 (its end cut) before committing
        state = store.fetch()
        for day in (1, 2, 3):
            pieces = interval_pieces(state, f"day{day}")
            assert len(pieces) == 1
            extra = ["inside-day3"] if day == 3 else []
            assert piece_events(client, scope, stream, pieces[0]) == Counter(days[day] + extra), day
        # day 2 again: nothing new, its piece stays; an interval with no new file is an empty range
        again = coord.run({"/d2": {"size": 1, "mtime": 1}}, writer_of(client, store, scope, stream, [], coord.owner),
                          interval="day2")
        assert again.run_id is None and len(interval_pieces(store.fetch(), "day2")) == 1
        coord.run({"/d2": {"size": 1, "mtime": 1}}, writer_of(client, store, scope, stream, [], coord.owner), interval="day4")
        (empty,) = interval_pieces(store.fetch(), "day4")
        assert empty["start"] == empty["end"] and piece_events(client, scope, stream, empty) == Counter()


def test_a_run_waits_at_its_commit_point_while_another_commits(client, unique_name):
    """Two live copies: B reaches its commit point while A is COMMITTING (A's driver paused right
    after its commit record); B waits, and its piece holds none of A's events."""
    scope, stream = unique_name("turn"), "s"
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 1)
    a_events, b_events = [f"a{n}" for n in range(4)], [f"b{n}" for n in range(4)]
    paused, release = threading.Event(), threading.Event()

    def pause(step: str) -> None:
        if step == "after_commit_record":
            paused.set()
            release.wait(30)

    with open_ingest_state(client, scope, stream, "turn") as store:
        a = IngestCoordinator(store, client.transactions, scope, stream, stale_after_s=30, crash_hook=pause,
                              tail_positions=lambda: tail(client, scope, stream))
        b = coordinator(client, store, scope, stream)
        result: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: result.update(a=a.run(
            {"/a": {"size": 1, "mtime": 1}}, writer_of(client, store, scope, stream, a_events, a.owner), interval="A")))
        thread.start()
        assert paused.wait(30)
        waiting = threading.Thread(target=lambda: result.update(b=b.run(
            {"/b": {"size": 1, "mtime": 1}}, writer_of(client, store, scope, stream, b_events, b.owner), interval="B")))
        waiting.start()
        waiting.join(1.5)
        assert waiting.is_alive()  # B waits at its commit point while A is COMMITTING
        release.set()
        thread.join(60)
        waiting.join(60)
        assert result["a"].status == result["b"].status == "COMMITTED"
        state = store.fetch()
        assert piece_events(client, scope, stream, interval_pieces(state, "A")[0]) == Counter(a_events)
        assert piece_events(client, scope, stream, interval_pieces(state, "B")[0]) == Counter(b_events)


def test_a_killed_run_rolled_forward_by_the_next_try_records_its_piece(client, unique_name):
    """Try 1 dies after its commit point, with one of its three commits requested; try 2 of the
    same task instance rolls it forward: the interval's piece holds exactly try 1's events."""
    scope, stream = unique_name("roll"), "s"
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 2)
    payloads = [f"e{n}" for n in range(6)]

    class Killed(BaseException):
        pass

    def die(step: str) -> None:
        if step == "after_first_commit":
            raise Killed()

    with open_ingest_state(client, scope, stream, "roll") as store:
        tries = [IngestCoordinator(store, client.transactions, scope, stream, stale_after_s=30, crash_hook=hook,
                                   task_instance="dag/ingest/run/-1", try_number=n,
                                   tail_positions=lambda: tail(client, scope, stream))
                 for n, hook in ((1, die), (2, None))]
        with pytest.raises(Killed):
            tries[0].run({"/f": {"size": 1, "mtime": 1}}, writer_of(client, store, scope, stream, payloads,
                                                                     tries[0].owner), interval="day")
        assert interval_pieces(store.fetch(), "day") is None  # at its commit point: nothing recorded yet
        out = tries[1].run({"/f": {"size": 1, "mtime": 1}}, writer_of(client, store, scope, stream, [],
                                                                       tries[1].owner), interval="day")
        assert out.run_id is None and len(out.recovered) == 1
        (piece,) = interval_pieces(store.fetch(), "day")
        assert piece["run"] == out.recovered[0] and piece_events(client, scope, stream, piece) == Counter(payloads)


def test_a_transaction_registered_just_before_the_commit_point_is_aborted(client, unique_name):
    """A task attempt that registers its transaction while the driver is about to record the
    commit point (a late speculative copy): it is not in the commit, so it ends aborted, not OPEN."""
    scope, stream = unique_name("late"), "s"
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 1)
    late: list[int] = []
    with open_ingest_state(client, scope, stream, "late") as store:
        def register_late(step: str) -> None:
            if step == "before_commit_record":
                txn = client.transactions.begin(scope, stream)
                register_txn(store, run_id, f"{txn.txn_id:032x}", coord.owner)
                late.append(txn.txn_id)

        coord = IngestCoordinator(store, client.transactions, scope, stream, stale_after_s=30,
                                  crash_hook=register_late)
        run_id = coord.start_open_run(wait_for_others_s=None)
        written = writer_of(client, store, scope, stream, ["a", "b"], coord.owner)(run_id, None)
        txns, status, _ = coord.commit_written(run_id, written)
    assert status == "COMMITTED" and txns == written.txns and late
    assert client.transactions.status(scope, stream, late[0]).name in ("ABORTING", "ABORTED")


def test_a_lease_that_lapses_between_the_state_check_and_the_commit_request_is_healed(client, unique_name):
    """A transaction read OPEN at the commit point whose lease lapses before its commit request
    (driven here by aborting it at that step) is taken out of the run like one found aborted: the
    others are committed, its file is returned for the next run, and nothing raises."""
    from airflow_provider_pravega.client.ingest_plan import file_identity

    scope, stream = unique_name("lapse"), "s"
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 1)
    store = open_ingest_state(client, scope, stream, "lapse")
    txns: list[str] = []

    def write(run_id: str, plan: Any) -> WriteResult:
        for name in sorted(plan.to_ingest):
            info = client.transactions.begin(scope, stream)
            register_txn(store, run_id, f"{info.txn_id:032x}", coord.owner)
            w = client.transactions.writer(scope, stream, info)
            w.write_event(name.encode(), "k")
            w.flush()
            w.close()
            txns.append(f"{info.txn_id:032x}")
        return WriteResult(list(txns), len(txns), holds={t: [n] for t, n in zip(txns, sorted(plan.to_ingest))})

    def lapse(step: str) -> None:
        if step == "before_commit_requests":
            client.transactions.abort(scope, stream, int(txns[1], 16))

    coord = IngestCoordinator(store, client.transactions, scope, stream, stale_after_s=30, crash_hook=lapse)
    outcome = coord.run({"a": file_identity(1, 1), "b": file_identity(1, 1)}, write)
    assert outcome.returned == ["b"] and outcome.txns == [txns[0]] and outcome.status == "COMMITTED"
    assert "a" in known_files(store, store.fetch(), ["a", "b"]) and "b" not in known_files(store, store.fetch(), ["b"])
