"""Issue 32's first acceptance scenario on the embedded multi-store server: the exactly-once ingest
(3 writers, 30,000 records), the export of its interval and a ``format("pravega")`` streaming read
each run while a container moves, then while a segment store is stopped (its containers failing
over to the others) and restarted (a container moved back onto it). Every record exactly once in
the stream, in the export and in the streaming sink.

The cluster (3 stores, 8 containers) runs in this process (``pravega_cluster_factory``); the Spark
tasks' Python workers reach it through the controller URI like any client. The disruptions fire at
exact events seen by the stores' hooks (the nth durable append to a transaction segment, the nth
read of the stream), never on a timer: a move answers the request in flight ``WrongHost``, or drops
a durable append's acknowledgement with its connection (the resend must be deduplicated on the new
owner); a stop fails the store's containers over, drops the connection and closes the store's port.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

import pytest
from client.readback import read_segments_direct
from export_files import part_files

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.protocol import naming, wire
from airflow_provider_pravega.spark.datasource import register
from airflow_provider_pravega.spark.export_job import ExportSpec, run_export
from airflow_provider_pravega.spark.ingest_job import run_ingest
from airflow_provider_pravega.spark.ingest_spec import IngestSpec

STORES = 3
WRITERS = 3
RECORDS = 30_000
DAY = "2026-11-20T00:00:00+00:00/2026-11-21T00:00:00+00:00"


class Disruption:
    """One disruption of ``cluster`` at exact events: the ``nth`` event ``matches(store, segment)``
    accepts (counted over every store).

    * ``"move"``: the container of that event's segment moves to the next store;
    * ``"stop"``: that event's store loses all its containers to the other stores, the connection
      drops and the store is stopped (its port closes); ``restart_after`` matching events later the
      store is restarted and that later event's segment's container is moved back onto it.

    ``drop`` closes the event's connection (for an append: durable, never acknowledged).
    Actions run outside the counter's lock: a stopping store's loop thread may still call the hook.
    """

    def __init__(self, cluster, mode: str, nth: int, matches, *, drop: bool, restart_after: int = 20) -> None:
        self.cluster, self.mode, self.nth, self.matches, self.drop = cluster, mode, nth, matches, drop
        self.restart_at = nth + restart_after
        self.lock = threading.Lock()
        self.seen = 0
        self.moved: list[tuple[int, int, int]] = []  # (container, from store, to store)
        self.stopped: int | None = None
        self.restarted = False
        self.stopper: threading.Thread | None = None
        self.errors: list[BaseException] = []
        self.trace: list[tuple[int, int, str]] = []  # (n, store, segment) of every matching event

    def _count(self, store: int, segment: str) -> int | None:
        if not self.matches(segment):
            return None
        with self.lock:
            if store == self.stopped and not self.restarted:
                return None  # the stopping store's last requests (answered WrongHost) do not count
            self.seen += 1
            self.trace.append((self.seen, store, segment.rsplit("/", 1)[1][:24]))
            return self.seen

    def _act(self, store: int, segment: str) -> str | None:
        n = self._count(store, segment)
        if n is None:
            return None
        try:
            if n == self.nth and self.mode == "move":
                target = (store + 1) % STORES
                self.moved.append((self.cluster.move_segment(segment, target), store, target))
                return "drop" if self.drop else None
            if n == self.nth and self.mode == "stop":
                others = [i for i in range(STORES) if i != store]
                for k, container in enumerate(self.cluster.containers.containers_of(store)):
                    self.cluster.move_container(container, others[k % len(others)])
                    self.moved.append((container, store, others[k % len(others)]))
                # failover done above, on this thread, so no request reaches the store's own
                # containers on it any more; the store itself cannot stop from its loop thread.
                self.stopped = store
                self.stopper = threading.Thread(target=self.cluster.stop_store, args=(store,),
                                                kwargs={"failover": True}, name="stop-store")
                self.stopper.start()
                return "drop"
            if n == self.restart_at and self.mode == "stop":
                assert self.stopper is not None
                self.stopper.join()
                assert not self.cluster.store_running(self.stopped)
                self.cluster.restart_store(self.stopped)
                self.moved.append((self.cluster.move_segment(segment, self.stopped), store, self.stopped))
                self.restarted = True
                return "drop" if self.drop else None
        except BaseException as exc:  # noqa: BLE001 - reported by check(), not lost on a loop thread
            self.errors.append(exc)
        return None

    def on_appended(self, store: int, segment: str, writer_id: int, event_number: int) -> str | None:
        return self._act(store, segment)

    def on_request(self, store: int, cmd: object) -> str | None:
        return self._act(store, cmd.segment) if isinstance(cmd, wire.ReadSegment) else None

    def check(self) -> None:
        """The disruption happened in full while the operation ran."""
        assert not self.errors, self.errors
        if self.mode == "move":
            assert len(self.moved) == 1, f"no move: matching events {self.trace}, wanted the {self.nth}th"
        else:
            assert self.stopped is not None and self.restarted, (
                f"stopped {self.stopped}, restarted {self.restarted}: matching events {self.trace}")
            assert self.cluster.store_running(self.stopped)

    def remove(self) -> None:
        self.cluster.set_hooks()
        if self.stopper is not None:
            self.stopper.join()


def _in_stream(scope: str, stream: str):
    prefix = f"{scope}/{stream}/"
    return lambda segment: segment.startswith(prefix)


def _txn_segment_of(scope: str, stream: str):
    prefix = f"{scope}/{stream}/"
    return lambda segment: segment.startswith(prefix) and naming.is_transaction_segment(segment)


def _source(directory: Path) -> list[str]:
    """``WRITERS`` files of ``RECORDS`` small JSON lines in all (one file per writer)."""
    directory.mkdir(parents=True)
    lines = []
    for f in range(WRITERS):
        part = [json.dumps({"k": f"k{n % 13}", "f": f, "n": n}, separators=(",", ":"))
                for n in range(RECORDS // WRITERS)]
        (directory / f"part-{f}.jsonl").write_text("\n".join(part) + "\n")
        lines += part
    return lines


def _exactly_once(got: list[str], lines: list[str]) -> None:
    counts = Counter(got)
    dup = [k for k, v in counts.items() if v > 1]
    missing = set(lines) - set(counts)
    assert not dup and not missing, f"{len(dup)} duplicated (e.g. {dup[:2]}), {len(missing)} missing " \
                                    f"(e.g. {sorted(missing)[:2]}), {len(got)} read"
    assert set(counts) == set(lines)


@pytest.fixture
def cluster(pravega_cluster_factory):
    return pravega_cluster_factory(segment_stores=STORES, containers=8)


@pytest.fixture
def registered(spark):
    register(spark)
    return spark


@pytest.mark.parametrize("mode", ["move", "stop"])
def test_ingest_export_and_streaming_read_while_containers_move_and_a_store_restarts(
        mode, cluster, registered, unique_name, tmp_path):
    spark = registered
    scope, stream = unique_name("moves"), "s"
    lines = _source(tmp_path / "in")
    client = PravegaClient(cluster.controller_uri)
    try:
        # Ingest: 3 writers (one transaction and one Spark task each), over 3 stream segments.
        # Each writer appends a block or so per transaction segment (9 or more appends in all). The
        # disruption fires at the 4th durable append to a transaction segment (a stop restarts the
        # store 3 appends later), the append's acknowledgement lost with its connection: in doubt,
        # and deduplicated by the new owner.
        disruption = Disruption(cluster, mode, 4, _txn_segment_of(scope, stream), drop=True, restart_after=3)
        cluster.set_hooks(on_appended=disruption.on_appended)
        try:
            result = run_ingest(client, spark, IngestSpec(
                scope=scope, stream=stream, source=str(tmp_path / "in" / "*.jsonl"), routing_key_field="k",
                create_stream=True, stream_segments=3, num_writers=WRITERS, ingest_id="ing", interval_key=DAY))
        finally:
            disruption.remove()
        disruption.check()
        assert result.events == RECORDS and len(result.transactions) == WRITERS
        assert all(t["status"] == "COMMITTED" for t in result.transactions)
        segments = read_segments_direct(client, scope, stream)
        stored = [e.decode() for events in segments.values() for e in events]
        _exactly_once(stored, lines)
        for events in segments.values():  # each key (in one segment) in source order: no resend reordered
            by_key: dict[str, list[tuple[int, int]]] = {}
            for e in events:
                record = json.loads(e)
                by_key.setdefault(record["k"], []).append((record["f"], record["n"]))
            assert all(seq == sorted(seq) for seq in by_key.values())

        # Export of the ingest's interval: a read or so per segment (2 tasks at a time). The disruption
        # fires at the 2nd read of the stream, a stopped store restarts at the next read.
        out = tmp_path / "export"
        disruption = Disruption(cluster, mode, 2, _in_stream(scope, stream), drop=False, restart_after=1)
        cluster.set_hooks(on_request=disruption.on_request)
        try:
            exported = run_export(client, spark, ExportSpec(scope, stream, str(out), format="jsonl",
                                                            from_ingest="ing", interval_key=DAY, export_id="daily"))
        finally:
            disruption.remove()
        disruption.check()
        assert exported.events == RECORDS and (out / "_SUCCESS").exists()
        rows = [json.loads(line)["event"] for p in part_files(out) for line in p.read_text().splitlines()]
        _exactly_once(rows, lines)  # the interval is complete: all of the ingest's run, once

        # A streaming read from the head in micro-batches of at most 12,000 events.
        sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
        disruption = Disruption(cluster, mode, 2, _in_stream(scope, stream), drop=False, restart_after=1)
        cluster.set_hooks(on_request=disruption.on_request)
        try:
            query = (spark.readStream.format("pravega").option("controller", cluster.controller_uri)
                     .option("scope", scope).option("stream", stream).option("decode", "text")
                     .option("max_events_per_trigger", "12000").load()
                     .select("event").writeStream.format("parquet").option("path", str(sink))
                     .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
            query.awaitTermination(300)
            assert query.exception() is None
            sizes = [p["numInputRows"] for p in query.recentProgress]
        finally:
            disruption.remove()
        disruption.check()
        assert sum(sizes) == RECORDS and max(sizes) <= 12000
        _exactly_once([r.event for r in spark.read.parquet(str(sink)).collect()], lines)
    finally:
        client.close()
