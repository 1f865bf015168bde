"""The ingest's write tasks: what runs in each Spark partition (one transaction per task attempt,
through the task side of the transactional stage, client/task_stage.py) and the one-row answer each
returns to the driver. A line file's task reads its bytes once: measures its next piece, splits,
checks and writes its lines, and records the piece with its transaction."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from airflow_provider_pravega import fault_points
from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.client.ingest_location import open_state_store
from airflow_provider_pravega.client.task_stage import TaskTransaction
from airflow_provider_pravega.spark.ingest_pieces import next_piece
from airflow_provider_pravega.spark.ingest_sources import key_of, local_bytes
from airflow_provider_pravega.spark.ingest_spec import IngestSpec
from airflow_provider_pravega.spark.line_events import FieldReader, piece_events
from airflow_provider_pravega.spark.worker_heap import prepare_worker_heap


RESULT_SCHEMA = ("txn string, events long, bytes long, error string, bad_file string, line long, reason string, "
                 "files array<string>, empty array<string>")


_WORKER_CLIENTS: dict[tuple[int, PravegaConnectionConfig], Any] = {}


def _worker_client(config: PravegaConnectionConfig) -> Any:
    """One PravegaClient per Python worker process (sockets do not survive fork)."""
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
                files: Iterable[str] = (), line: int | None = None, reason: str | None = None,
                empty: Iterable[str] = ()) -> Any:
    """A write task's one-row answer (:data:`RESULT_SCHEMA`): its transaction and what it wrote
    (``files``; ``empty``: those of them that held no new whole line), or what stopped it
    (``error``: the file, and for a line file the line and the reason)."""
    # import cost: pyarrow (0.3-0.5 s) only where a batch is built, not with the module (arrow_columns imports it)
    from airflow_provider_pravega.spark.arrow_columns import record_batch, schema_of

    return record_batch({"txn": [txn], "events": [events], "bytes": [size], "error": [error], "bad_file": [bad_file],
                         "line": [line], "reason": [reason], "files": [sorted(files)], "empty": [sorted(empty)]},
                        schema_of(RESULT_SCHEMA))


def _task_transaction(ctx: TaskContext, client: Any, store: Any) -> TaskTransaction:
    spec = ctx.spec
    return TaskTransaction(client, store, scope=spec.scope, stream=spec.stream, run_id=ctx.run_id, owner=ctx.owner,
                           lease_ms=ctx.lease_ms)


def _write(writer: Any, payloads: list[bytes], keys: list[str] | None) -> None:
    if keys is None:
        writer.write_events(payloads)
    else:
        writer.write_keyed(payloads, keys)


def make_line_writer(ctx: TaskContext, requests: Mapping[str, Mapping[str, Any]], client: Any = None):
    """The function ``mapInArrow`` runs on each partition of line files (rows ``(path, content)``,
    whole files, in path order with a routing key): one pass over each file's bytes. Its next piece
    is measured (:func:`~airflow_provider_pravega.spark.ingest_pieces.next_piece`: the committed
    prefix checked against its fingerprint where the bytes are read anyway), its lines split,
    checked and written, and the pieces recorded with the transaction (``written``), from where the
    commit point takes them. ``requests``: each planned file's request (what the plan knows);
    ``client``: the driver's own, when this process runs the task (:func:`write_in_process`)."""

    def write_partition(batches: Iterator[Any]) -> Iterator[Any]:
        prepare_worker_heap()
        files = _file_rows(batches)
        first = next(files, None)
        if first is None:
            return
        spec = ctx.spec
        reader = FieldReader(spec.routing_key_field, spec.payload_field) if spec.format == "jsonl" else None
        task_client = client if client is not None else _worker_client(ctx.config)
        store = open_state_store(task_client, ctx.state_scope, ctx.state_stream, create=False)
        events = size = 0
        pieces: dict[str, dict[str, Any]] = {}
        with _task_transaction(ctx, task_client, store) as txn:
            for path, content in _chain(first, files):
                key = key_of(path)
                if content is None:  # a local file named by the row (ingest_frames.file_frame): read here
                    content = local_bytes(key, upto=int(requests[key]["size"]))
                    if content is None:
                        yield task_result(txn.hex_id, events, size, "gone", key, reason=socket.gethostname())
                        return
                piece = next_piece(content, requests[key])
                if piece.get("changed") and requests[key]["base"] and not spec.allow_changed_files:
                    yield task_result(txn.hex_id, events, size, "changed", key, reason=piece["changed"])
                    return  # aborted: nothing of this transaction will be committed
                if piece["end"] > piece["start"]:
                    found = piece_events(memoryview(content)[piece["start"]:piece["end"]], piece["line"], reader)
                    if found.bad is not None:
                        yield task_result(txn.hex_id, events, size, "bad record", key, line=found.bad[0],
                                          reason=found.bad[1])
                        return
                    _write(txn.writer, found.payloads, found.keys)
                    events += len(found.payloads)
                    size += sum(map(len, found.payloads))
                    if events:
                        fault_points.reached("task_mid_write")
                piece.pop("changed", None)
                pieces[key] = piece
            txn.finish(pieces, events, size, pieces=pieces)
        yield task_result(txn.hex_id, events, size, files=pieces,
                          empty=[k for k, p in pieces.items() if p["end"] <= p["start"]])

    return write_partition


def write_in_process(ctx: TaskContext, client: Any, requests: Mapping[str, Mapping[str, Any]],
                     groups: Iterable[Sequence[str]]) -> list[dict[str, Any]]:
    """The answers of the write tasks of ``groups`` (each a list of local line files), run one after
    the other by this process: the same task as in Spark (:func:`make_line_writer`), given rows
    that name the files, so it reads them itself. For a run too small to be worth a Spark job."""
    task = make_line_writer(ctx, requests, client)
    answers = []
    for keys in groups:
        for batch in task(iter(file_rows(keys, [None] * len(keys)).to_batches())):
            answers += batch.to_pylist()
    return answers


def file_rows(keys: Sequence[str], contents: Sequence[bytes | None]) -> Any:
    """The (path, content) rows a line file's write task takes, as an Arrow table: the paths URIs
    as ``binaryFile`` names them (:func:`key_of` reads them back, whatever the names hold), the
    content None where the task reads the file itself."""
    # import cost: pyarrow (0.3-0.5 s) only where a batch is built, not with the module
    import pyarrow as pa

    return pa.table({"path": ["file:" + quote(k) for k in keys], "content": list(contents)},
                    schema=pa.schema([("path", pa.string()), ("content", pa.binary())]))


def _file_rows(batches: Iterator[Any]) -> Iterator[tuple[str, bytes]]:
    """(path, content) of each file row, one file's bytes at a time (None: the task reads the file)."""
    for batch in batches:
        paths, contents = batch.column("path"), batch.column("content")
        for i in range(batch.num_rows):
            yield paths[i].as_py(), contents[i].as_py()


def make_writer(ctx: TaskContext):
    """The function ``mapInArrow`` runs on each partition of CSV or Parquet records (see
    ``record_frame``): one transaction per task attempt."""

    def write_partition(batches: Iterator[Any]) -> Iterator[Any]:
        # import cost: pyarrow (0.3-0.5 s) only where a batch is built, not with the module
        import pyarrow.compute as pc

        prepare_worker_heap()

        batches = iter(batches)
        first = next(batches, None)
        if first is None or first.num_rows == 0 and _all_empty(batches):
            return  # an empty partition writes nothing and opens no transaction
        client = _worker_client(ctx.config)
        store = open_state_store(client, ctx.state_scope, ctx.state_stream, create=False)
        events = size = 0
        held: set[str] = set()  # the files this transaction holds (whole: see write_groups)
        with _task_transaction(ctx, client, store) as txn:
            for batch in _chain(first, batches):
                held.update(pc.unique(batch.column("f")).to_pylist())
                bad_file = _first_bad_file(batch)
                if bad_file is not None:  # aborted: nothing of this transaction will be committed
                    yield task_result(txn.hex_id, events, size, "bad record", bad_file)
                    return
                payloads = batch.column("payload").to_pylist()
                _write(txn.writer, payloads, batch.column("k").to_pylist() if ctx.spec.routing_key_field else None)
                events += len(payloads)
                size += sum(map(len, payloads))
                if events:
                    fault_points.reached("task_mid_write")
            txn.finish((key_of(f) for f in held), events, size)  # what a later try needs to commit it
        yield task_result(txn.hex_id, events, size, files=held)

    return write_partition
def _first_bad_file(batch: Any) -> str | None:
    """The file of the batch's first bad record (see record_frame), or None: the one check both
    modes make before writing a batch."""
    # import cost: pyarrow (0.3-0.5 s) only where a batch is built, not with the module
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
