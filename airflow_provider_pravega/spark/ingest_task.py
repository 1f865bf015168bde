"""The ingest's write task: what runs in each Spark partition (one transaction per task attempt,
flushed before the task succeeds) and the one-row answer it returns to the driver."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from airflow_provider_pravega import fault_points
from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.client.ingest import register_txn
from airflow_provider_pravega.client.ingest_errors import FencedError
from airflow_provider_pravega.client.ingest_location import open_state_store
from airflow_provider_pravega.client.ingest_resume import record_written
from airflow_provider_pravega.spark.ingest_sources import key_of
from airflow_provider_pravega.spark.ingest_spec import IngestSpec
from airflow_provider_pravega.spark.worker_heap import prepare_worker_heap


RESULT_SCHEMA = "txn string, events long, bytes long, error string, bad_file string, files array<string>"


_WORKER_CLIENTS: dict[tuple[int, PravegaConnectionConfig], Any] = {}


def _worker_client(config: PravegaConnectionConfig) -> Any:
    """One PravegaClient per Python worker process (sockets do not survive fork)."""
    from airflow_provider_pravega.client import PravegaClient

    # The config itself is the key (frozen, hashable, compares every field incl. credentials); its
    # repr hides the password, so two configs differing only there must not share a client.
    key = (os.getpid(), config)
    client = _WORKER_CLIENTS.get(key)
    if client is None:
        client = _WORKER_CLIENTS[key] = PravegaClient(config)
    return client


@dataclass(frozen=True)
class TaskContext:
    """Everything a write task needs (pickled into the task's closure; with credentials, the config
    carries the password to the executors - its repr hides it, and nothing here prints it)."""

    config: PravegaConnectionConfig
    spec: IngestSpec
    run_id: str
    state_scope: str
    state_stream: str
    lease_ms: int
    owner: str | None = None  # the driver owning the run: a task of a taken-over run cannot register


def task_result(txn: str | None, events: int, size: int, error: str | None = None, bad_file: str | None = None,
                files: Iterable[str] = ()) -> Any:
    """A write task's one-row answer (:data:`RESULT_SCHEMA`): its transaction, what it wrote, or
    the file of the bad record that stopped it."""
    from airflow_provider_pravega.spark.arrow_columns import record_batch, schema_of

    return record_batch({"txn": [txn], "events": [events], "bytes": [size], "error": [error], "bad_file": [bad_file],
                         "files": [sorted(files)]}, schema_of(RESULT_SCHEMA))


def make_writer(ctx: TaskContext):
    """The function ``mapInArrow`` runs on each partition: one transaction per task attempt."""

    def write_partition(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow.compute as pc

        prepare_worker_heap()

        batches = iter(batches)
        first = next(batches, None)
        if first is None or first.num_rows == 0 and _all_empty(batches):
            return  # an empty partition writes nothing and opens no transaction
        client = _worker_client(ctx.config)
        spec = ctx.spec
        txns = client.transactions
        info = txns.begin(spec.scope, spec.stream, ctx.lease_ms)
        hex_id = f"{info.txn_id:032x}"
        store = open_state_store(client, ctx.state_scope, ctx.state_stream, create=False)
        try:
            register_txn(store, ctx.run_id, hex_id, ctx.owner)
        except FencedError:
            txns.abort(spec.scope, spec.stream, info.txn_id)
            raise
        keeper = client.lease_keeper(max(1.0, ctx.lease_ms / 3000))
        keeper.add(spec.scope, spec.stream, info.txn_id)
        events = size = 0
        held: set[str] = set()  # the files this transaction holds (whole: see file_groups)
        try:
            writer = txns.writer(spec.scope, spec.stream, info, check_open=False)
            try:
                for batch in _chain(first, batches):
                    held.update(pc.unique(batch.column("f")).to_pylist())
                    bad_file = _first_bad_file(batch)
                    if bad_file is not None:  # nothing of this transaction will be committed
                        txns.abort(spec.scope, spec.stream, info.txn_id)
                        yield task_result(hex_id, events, size, "bad record", bad_file)
                        return
                    payloads = batch.column("payload").to_pylist()
                    if spec.routing_key_field:
                        write = writer.write_event
                        for payload, key in zip(payloads, batch.column("k").to_pylist()):
                            write(payload, key)
                    else:
                        writer.write_events(payloads)
                    events += len(payloads)
                    size += sum(map(len, payloads))
                    if events:
                        fault_points.reached("task_mid_write")
                writer.flush()  # pre-commit: every event acknowledged, transaction still open
            finally:
                writer.close()
        finally:
            keeper.close()
        try:  # what a later try needs to commit this transaction without its driver
            record_written(store, ctx.run_id, hex_id, (key_of(f) for f in held), events, size, ctx.owner)
        except FencedError:
            txns.abort(spec.scope, spec.stream, info.txn_id)
            raise
        yield task_result(hex_id, events, size, files=held)

    return write_partition


def _first_bad_file(batch: Any) -> str | None:
    """The file of the batch's first bad record (see record_frame), or None: the one check both
    modes make before writing a batch."""
    import pyarrow.compute as pc

    bad = batch.column("bad")
    if not pc.any(bad).as_py():
        return None
    return batch.column("f")[pc.index(bad, True).as_py()].as_py()


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _all_empty(batches: Iterator[Any]) -> bool:
    return all(b.num_rows == 0 for b in batches)
