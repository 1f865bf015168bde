"""A commit that Pravega acknowledged but does not carry out until it is requested again.

On the real cluster (2026-11-29, CI) a segment store was killed between an ingest's writes and its
commit: the controller acknowledged the three commit requests (state COMMITTING) and then left them
COMMITTING for over 300 s, until the test gave up. Pravega 0.13 answers a commit request for a
COMMITTING transaction by posting the commit event of its epoch again (``sealTxnBody``:
``sealActiveTxn`` returns COMMITTING, then ``writeCommitEvent``); the commit itself happens once.
So every wait for a commit requests it again after ``TransactionManager.recommit_after_s``.

The embedded server carries out every commit it acknowledges. ``_LosesCommits`` below acknowledges
the first request of each transaction in ``lose`` without carrying it out, as that cluster did.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.controller_types import TxnStatus
from airflow_provider_pravega.client.errors import TransactionTimeoutError
from airflow_provider_pravega.embedded import server as server_module
from airflow_provider_pravega.embedded.controller import EmbeddedController


class _LosesCommits(EmbeddedController):
    """Leaves the transactions in ``lose`` COMMITTING after their first commit request."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lose: set[int] = set()
        self.requests: dict[int, int] = {}

    def commitTransaction(self, request: Any, context: Any) -> Any:
        txn_id = self._txn_id(request)
        self.requests[txn_id] = self.requests.get(txn_id, 0) + 1
        return super().commitTransaction(request, context)

    def _complete_commit(self, scope: str, name: str, txn_id: int) -> None:
        if txn_id in self.lose:
            self.lose.discard(txn_id)  # the next request carries it out
            return
        super()._complete_commit(scope, name, txn_id)


@pytest.fixture
def losing(pravega_cluster_factory: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, PravegaClient]]:
    monkeypatch.setattr(server_module, "EmbeddedController", _LosesCommits)
    server = pravega_cluster_factory(segment_stores=1)
    assert isinstance(server.controller, _LosesCommits)
    with PravegaClient(server.controller_uri) as client:
        client.transactions.recommit_after_s = 0.3
        client.admin.create_scope("sc")
        client.admin.create_stream("sc", "st", 2)
        yield server.controller, client


def _pre_committed(client: PravegaClient, events: list[bytes]) -> int:
    txn = client.transactions.begin("sc", "st")
    with client.transactions.writer("sc", "st", txn) as writer:
        for i, event in enumerate(events):
            writer.write_event(event, routing_key=str(i))
        writer.flush()
    return txn.txn_id


def _read_all(client: PravegaClient) -> list[bytes]:
    from airflow_provider_pravega.client.batch import plan_segment_ranges, read_segment_ranges
    from airflow_provider_pravega.client.streamcut import StreamCut

    ranges = plan_segment_ranges(client, StreamCut.head(client, "sc", "st"), StreamCut.tail(client, "sc", "st"))
    return sorted(e.payload for e in read_segment_ranges(client, ranges))


def test_a_commit_left_committing_is_requested_again_and_happens_once(losing: tuple[Any, PravegaClient]) -> None:
    controller, client = losing
    events = [f"e{i}".encode() for i in range(20)]
    txn_id = _pre_committed(client, events)
    controller.lose.add(txn_id)
    assert client.transactions.commit("sc", "st", txn_id, wait=False) == TxnStatus.COMMITTING

    assert client.transactions.wait_for("sc", "st", txn_id, (TxnStatus.COMMITTED,), timeout_s=60) == \
        TxnStatus.COMMITTED
    assert controller.requests[txn_id] == 2
    assert _read_all(client) == sorted(events)  # once, though requested twice


def test_without_the_second_request_the_wait_times_out(losing: tuple[Any, PravegaClient]) -> None:
    """The scenario above is real: the same loss, nothing requested again, never committed."""
    controller, client = losing
    txn_id = _pre_committed(client, [b"x"])
    controller.lose.add(txn_id)
    client.transactions.commit("sc", "st", txn_id, wait=False)
    with pytest.raises(TransactionTimeoutError, match="still COMMITTING after 1 s"):
        client.transactions.wait_for("sc", "st", txn_id, (TxnStatus.COMMITTED,), timeout_s=1, recommit=False)
    assert controller.requests[txn_id] == 1 and client.transactions.status("sc", "st", txn_id) == TxnStatus.COMMITTING


def test_an_ingest_run_whose_commits_were_lost_finishes_them(losing: tuple[Any, PravegaClient]) -> None:
    """The coordinator's wait at its commit point: each transaction committed, each once."""
    from airflow_provider_pravega.client.ingest import IngestCoordinator
    from airflow_provider_pravega.client.ingest_location import open_ingest_state

    controller, client = losing
    batches = [[f"a{i}".encode() for i in range(5)], [f"b{i}".encode() for i in range(7)]]
    txns = [_pre_committed(client, batch) for batch in batches]
    for txn_id in txns:
        controller.lose.add(txn_id)
        client.transactions.commit("sc", "st", txn_id, wait=False)
    with open_ingest_state(client, "sc", "st", "daily") as store:
        coord = IngestCoordinator(store, client.transactions, "sc", "st")
        coord.wait_committed("run-1", [f"{t:032x}" for t in txns], timeout_s=60)
    assert [controller.requests[t] for t in txns] == [2, 2]
    assert _read_all(client) == sorted(batches[0] + batches[1])


def test_a_commit_requested_again_is_accepted_and_commits_once(client: PravegaClient,
                                                               unique_name: Any) -> None:
    """What the wait relies on, on each backend (real Pravega 0.13 in part 2): a commit request for a
    COMMITTING or COMMITTED transaction is accepted, and the events are in the stream once."""
    from airflow_provider_pravega.client.batch import plan_segment_ranges, read_segment_ranges
    from airflow_provider_pravega.client.streamcut import StreamCut

    scope = unique_name("recommit")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, "st", 2)
    written = []
    for round_ in range(3):
        txn = client.transactions.begin(scope, "st")
        events = [f"{round_}-{i}".encode() for i in range(20)]
        with client.transactions.writer(scope, "st", txn) as writer:
            for i, event in enumerate(events):
                writer.write_event(event, routing_key=str(i))
            writer.flush()
        written += events
        for _ in range(3):  # the first moves it to COMMITTING; the others find it COMMITTING or COMMITTED
            client.controller.commit_transaction(scope, "st", txn.txn_id)
        assert client.transactions.wait_for(scope, "st", txn.txn_id, (TxnStatus.COMMITTED,), timeout_s=60) == \
            TxnStatus.COMMITTED
        client.controller.commit_transaction(scope, "st", txn.txn_id)  # and once it is COMMITTED
    ranges = plan_segment_ranges(client, StreamCut.head(client, scope, "st"), StreamCut.tail(client, scope, "st"))
    assert sorted(e.payload for e in read_segment_ranges(client, ranges)) == sorted(written)
