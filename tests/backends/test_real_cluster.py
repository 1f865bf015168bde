"""The provider's client against real Pravega 0.13 as a cluster of processes (issue 32): ZooKeeper,
three BookKeeper bookies, three segment stores and two controllers, each its own JVM
(``backends/cluster.py``). Streams spread over the stores; a controller and a segment store are
killed with SIGKILL, as a lost host would vanish.

One cluster serves the module (its start is most of the cost); the tests run in file order and the
destructive ones last.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from backends.cluster import RealCluster, _lists_scopes, real_cluster
from backends.standalone import standalone_available
from hang_guard import HANG_GUARD_S

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.errors import ControllerError, ControllerUnreachableError, PravegaError
from airflow_provider_pravega.hooks.pravega import PravegaHook
from pravega_testing.faults import installed_for_test
from pravega_testing.wait import wait_until

from backends.official_suite import OfficialSuiteError, fetch, run_suite
from backends.test_official_client_suite import EXPECTED_FAILURES, OFFICIAL_TESTS
from client.readback import read_segments_direct
from pravega_clients import official_client_installed

pytestmark = pytest.mark.standalone


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    ok, reason = standalone_available()
    if not ok:
        pytest.skip(reason)
    with real_cluster(Path(tmp_path_factory.mktemp("pravega-cluster"))) as running:
        yield running


def _events(client: PravegaClient, scope: str, stream: str) -> list[bytes]:
    return sorted(e for segment in read_segments_direct(client, scope, stream).values() for e in segment)


def _owners(client: PravegaClient, scope: str, stream: str) -> dict[int, int]:
    """segment id -> port of the segment store the controller names for it now."""
    owners = {}
    for segment in client.controller.get_current_segments(scope, stream):
        client.controller.invalidate_uri(scope, stream, segment.segment_id)
        owners[segment.segment_id] = client.controller.get_uri(scope, stream, segment.segment_id).port
    return owners


def _owners_once_answered(client: PravegaClient, scope: str, stream: str) -> dict[int, int]:
    """As :func:`_owners`, or {} while the controller cannot answer: right after a segment store
    dies, the controller's own metadata tables may sit in a container that is still recovering on
    another store (Pravega's behaviour: a call then takes until the container is back)."""
    try:
        return _owners(client, scope, stream)
    except (ControllerUnreachableError, ControllerError):
        return {}


#: How long a restarted segment store may take to own containers again: Pravega's controller must
#: notice it, rebalance, and the other stores hand containers over (with one store of three left, all
#: of them). Under the whole suite's load in CI this took more than 45 s (twice, 2026-11-28); a store
#: that never comes back still fails the wait.
BACK_IN_SERVICE_S = 180.0


def _serves_again(client: PravegaClient, store) -> bool:
    """Whether the controller names ``store`` as the owner of any container yet, and every
    container answers: asked through a probe stream of 64 segments, whose length is asked of each
    (Pravega hashes segments onto the 8 containers: 64 leave one of them without a segment once in
    about 600 probes, and the store without one of its containers' segments far more rarely).
    Being named is not enough: a container handed back to the store recovers there first, and the
    controller's own tables in it (a createScope, say) wait for it (CI, 2026-11-29: no answer to
    createScope within 10 s right after the store was named).

    The probe is created through ``ensure_stream`` on every call, not once: its first creation runs
    while containers move, and a creation cut off there stays CREATING in Pravega 0.13 (listed, but
    every call on it refused) until a create finishes it. Creating it only when missing left it so
    for good, and this wait then timed out although the store had its containers (CI, 2026-11-28;
    seen again in the controller's log 2026-11-29: "Create stream failed due to ... Connection
    dropped", then "Stream: probe State: CREATING")."""
    scope = "cluster-probe"
    try:  # while containers recover, the controller may fail a create (status FAILURE): ask again later
        client.admin.ensure_stream(scope, "probe", 64, create_scope=True)
    except (ControllerUnreachableError, ControllerError):
        return False
    if store.port not in _owners_once_answered(client, scope, "probe").values():
        return False
    try:
        client.admin.tail(scope, "probe")
    except PravegaError:  # a container still recovering, or moving again
        return False
    return True


def _write(client: PravegaClient, scope: str, stream: str, prefix: str, count: int) -> list[bytes]:
    events = [f"{prefix}-{i}".encode() for i in range(count)]
    writer = client.event_writer(scope, stream)
    try:
        for i, event in enumerate(events):
            writer.write_event(event, routing_key=str(i))
        writer.flush()
    finally:
        writer.close()
    return events


def test_a_stream_spreads_over_the_segment_stores_and_each_event_is_read_once(cluster: RealCluster) -> None:
    scope = f"cl-{uuid.uuid4().hex[:8]}"
    with PravegaClient(cluster.controller_uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "spread", 8)
        owners = _owners(client, scope, "spread")
        assert len(set(owners.values())) >= 2, f"all 8 segments on one store: {owners}"
        assert set(owners.values()) <= {s.port for s in cluster.segment_stores}
        written = _write(client, scope, "spread", "e", 2000)
        txn = client.transactions.begin(scope, "spread")
        with client.transactions.writer(scope, "spread", txn) as writer:
            writer.write_events([f"t-{i}".encode() for i in range(200)], routing_key="k")
            writer.flush()
        client.transactions.commit(scope, "spread", txn.txn_id)
        assert _events(client, scope, "spread") == sorted(written + [f"t-{i}".encode() for i in range(200)])


def test_the_official_clients_own_tests_pass_on_the_cluster(cluster: RealCluster, tmp_path: Path) -> None:
    """The official client's suite (as on the single-node backends), through both controllers."""
    if not official_client_installed():
        pytest.skip("the official pravega client is not installed here (CPython 3.10/3.11 only)")
    pytest.importorskip("aiounittest", reason="the official reader tests need aiounittest (the 'test' extra)")
    try:
        suite = fetch()
    except OfficialSuiteError as exc:
        pytest.skip(f"official client tests not available: {exc}")
    # what fails on the shared standalone for reasons of Pravega's own may fail here too
    may_fail = {test for (backend, test) in EXPECTED_FAILURES if backend == "cluster"}
    results = run_suite(suite, cluster.controller_uri, tmp_path / "first")
    assert sorted(results) == sorted(OFFICIAL_TESTS)
    failed = {test: details for test, (outcome, details) in results.items()
              if outcome != "passed" and test not in may_fail}
    if failed:  # the official client's calls time out on a machine loaded by the rest of the suite
        again = run_suite(suite, cluster.controller_uri, tmp_path / "again")
        still = {test: f"first run:\n{failed[test][-2500:]}\nsecond run:\n{again[test][1][-2500:]}"
                 for test in failed if again[test][0] != "passed"}
        assert not still, still


def test_with_the_first_controller_killed_admin_transactions_and_the_hook_go_through_the_second(
    cluster: RealCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = cluster.controllers[0], cluster.controllers[1]
    first.kill()
    try:
        scope = f"cl-{uuid.uuid4().hex[:8]}"
        with PravegaClient(cluster.controller_uri) as client:
            client.admin.create_scope(scope)
            client.admin.create_stream(scope, "after", 2)
            assert str(client.controller.current_controller) == second.endpoint
            txn = client.transactions.begin(scope, "after")
            with client.transactions.writer(scope, "after", txn) as writer:
                writer.write_events([b"one", b"two"], routing_key="k")
                writer.flush()
            client.transactions.commit(scope, "after", txn.txn_id)
            assert _events(client, scope, "after") == [b"one", b"two"]
        host = ",".join(c.endpoint for c in cluster.controllers)
        monkeypatch.setenv("AIRFLOW_CONN_PRAVEGA_CLUSTER", json.dumps({"conn_type": "pravega", "host": host}))
        ok, message = PravegaHook(pravega_conn_id="pravega_cluster").test_connection()
        assert ok is True, message
        assert f"{first.endpoint} failed" in message and second.endpoint in message
    finally:  # the tests after this one move containers between stores: both controllers serve again
        first.restart()
        wait_until(f"{first.name} to answer", lambda: _lists_scopes(first.port), BACK_IN_SERVICE_S)


def test_a_segment_store_killed_loses_nothing_it_acknowledged_and_its_segments_move(cluster: RealCluster) -> None:
    scope = f"cl-{uuid.uuid4().hex[:8]}"
    with PravegaClient(cluster.controller_uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "moves", 8)
        before = _write(client, scope, "moves", "before", 1500)
        owners = _owners(client, scope, "moves")
        victim = cluster.store_at(owners[0])
        victim.kill()  # its containers recover on the other stores, from BookKeeper and storage
        wait_until(f"the segments of {victim.name} to move to another store",
                   lambda: (owners := _owners_once_answered(client, scope, "moves")) and victim.port not in owners.values(),
                   HANG_GUARD_S)
        assert _events(client, scope, "moves") == sorted(before)
        after = _write(client, scope, "moves", "after", 500)
        assert _events(client, scope, "moves") == sorted(before + after)


def test_a_writer_follows_its_segments_when_their_store_is_killed_and_restarted(cluster: RealCluster) -> None:
    """Events in flight when the store dies are resent to the new owner, which knows from the
    durable log what landed: each event once. The store comes back, takes containers again, and the
    same writer follows them once more."""
    scope = f"cl-{uuid.uuid4().hex[:8]}"
    with PravegaClient(cluster.controller_uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "follow", 6)
        owners = _owners(client, scope, "follow")
        victim = next(s for s in cluster.segment_stores if s.alive() and s.port in owners.values())
        writer = client.event_writer(scope, "follow")
        written: list[bytes] = []
        try:
            for phase in ("before", "during", "after"):
                events = [f"{phase}-{i}".encode() for i in range(1000)]
                for i, event in enumerate(events):
                    writer.write_event(event, routing_key=str(i))
                written += events
                if phase == "before":
                    victim.kill()  # with these 1000 events possibly still unacknowledged
                elif phase == "during":
                    writer.flush()
                    victim.restart()
                    wait_until(f"{victim.name} to own containers again", lambda: _serves_again(client, victim),
                               BACK_IN_SERVICE_S)
            writer.flush()
        finally:
            writer.close()
        assert _events(client, scope, "follow") == sorted(written)


def test_ingest_export_and_streaming_read_each_survive_a_segment_store_killed_mid_way(
    cluster: RealCluster, spark, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 32's scenario on the real cluster, each step with a segment store SIGKILLed at a fixed
    point and started again afterwards:

    - the exactly-once ingest (3 writers, 30,000 records), when the Spark tasks have written every
      transaction and before the driver commits them: the commit goes through once Pravega has
      recovered the store's containers on the others;
    - the export of the ingest's interval, when the output is claimed and before Spark reads: the
      readers follow the segments to their new owners;
    - a ``format("pravega")`` streaming read in micro-batches of at most 12,000 events, after its
      first micro-batch.

    Every record once in the stream, in the export and in the streaming sink."""
    from export_files import part_files
    from test_cluster_moves import DAY, RECORDS, WRITERS, _exactly_once, _source

    from airflow_provider_pravega.spark import export_job
    from airflow_provider_pravega.spark.datasource import register
    from airflow_provider_pravega.spark.export_job import ExportSpec, run_export
    from airflow_provider_pravega.spark.ingest_job import run_ingest
    from airflow_provider_pravega.spark.ingest_spec import IngestSpec

    scope, stream = f"cl-{uuid.uuid4().hex[:8]}", "ingested"
    lines = _source(tmp_path / "in")
    killed: list[str] = []
    with PravegaClient(cluster.controller_uri) as client:
        for store in cluster.segment_stores:  # the tests before may have left one down
            if not store.alive():
                store.restart()
                wait_until(f"{store.name} to own containers again", lambda s=store: _serves_again(client, s),
                           BACK_IN_SERVICE_S)
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, stream, WRITERS)

        def kill_owner_of_first_segment(step: str) -> None:
            victim = cluster.store_at(_owners(client, scope, stream)[0])
            victim.kill()
            killed.append(f"{step}: {victim.name}")

        def restart_the_dead() -> None:
            for store in cluster.segment_stores:
                if not store.alive():
                    store.restart()
                    wait_until(f"{store.name} to own containers again", lambda s=store: _serves_again(client, s),
                               BACK_IN_SERVICE_S)

        # 1. the ingest, its store killed between the writes and the commit
        def crash_point(step: str) -> None:
            if step == "after_tasks":
                kill_owner_of_first_segment(step)

        installed_for_test(monkeypatch, crash_point)
        result = run_ingest(client, spark, IngestSpec(
            scope=scope, stream=stream, source=str(tmp_path / "in" / "*.jsonl"), routing_key_field="k",
            num_writers=WRITERS, ingest_id="ing", interval_key=DAY))
        assert len(killed) == 1, "the store was not killed between the writes and the commit"
        assert result.events == RECORDS and all(t["status"] == "COMMITTED" for t in result.transactions)
        _exactly_once([e.decode() for e in _events(client, scope, stream)], lines)
        restart_the_dead()

        # 2. the export of the ingest's interval, its store killed before Spark reads
        claim = export_job.claim_output

        def claim_then_kill(*args, **kwargs) -> None:
            claim(*args, **kwargs)
            kill_owner_of_first_segment("export claimed its output")

        monkeypatch.setattr(export_job, "claim_output", claim_then_kill)
        out = tmp_path / "export"
        exported = run_export(client, spark, ExportSpec(scope, stream, str(out), format="jsonl",
                                                        from_ingest="ing", interval_key=DAY, export_id="daily"))
        assert len(killed) == 2, "the store was not killed during the export"
        assert exported.events == RECORDS and (out / "_SUCCESS").exists()
        _exactly_once([json.loads(line)["event"] for p in part_files(out) for line in p.read_text().splitlines()],
                      lines)
        restart_the_dead()

        # 3. a streaming read, its store killed after the first micro-batch
        register(spark)
        sink = tmp_path / "sink"
        batches: list[int] = []

        def write_batch(frame, batch_id: int) -> None:
            frame.write.mode("append").parquet(str(sink))
            batches.append(batch_id)
            if len(batches) == 1:
                kill_owner_of_first_segment("after the first micro-batch")

        query = (spark.readStream.format("pravega").option("controller", cluster.controller_uri)
                 .option("scope", scope).option("stream", stream).option("decode", "text")
                 .option("max_events_per_trigger", "12000").load().select("event")
                 .writeStream.foreachBatch(write_batch).option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(availableNow=True).start())
        try:
            assert query.awaitTermination(HANG_GUARD_S * 4), "the streaming read did not finish"
        finally:
            query.stop()
        assert query.exception() is None
        assert len(killed) == 3 and len(batches) >= 3, (killed, batches)
        _exactly_once([row.event for row in spark.read.parquet(str(sink)).collect()], lines)
        restart_the_dead()
