"""Writes of the ``pravega`` data source, exactly once through the provider's transactional stage
(the ingest's run protocol, :class:`~airflow_provider_pravega.client.ingest.IngestCoordinator`):
batch writes (one run per ``save()``, or per ``write_id`` across reruns) and streaming writes (one
run per micro-batch), each task attempt writing into its own transaction; or plain appends with
``mode=at_least_once``. See :mod:`~airflow_provider_pravega.spark.datasource`.
"""

from __future__ import annotations

import logging
import re
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType

from airflow_provider_pravega.spark.worker_imports import missing_dependency

try:
    from airflow_provider_pravega import fault_points
    from airflow_provider_pravega.client.errors import PravegaError
    from airflow_provider_pravega.client.ingest import WRITING, IngestCoordinator, WriteResult, check_timing
    from airflow_provider_pravega.client.ingest_errors import IngestError
    from airflow_provider_pravega.client.ingest_location import open_ingest_state, open_state_store, state_location
    from airflow_provider_pravega.client.ingest_plan import known_files
    from airflow_provider_pravega.client.task_stage import TaskTransaction, begin_transaction
    from airflow_provider_pravega.client.transactions import abort_quietly
    from airflow_provider_pravega.spark import row_digest
    from airflow_provider_pravega.spark import write_renewal
    from airflow_provider_pravega.spark.datasource_options import (
        MAX_LEASE_MS,
        MIN_LEASE_MS,
        PravegaDataSourceError,
        _check_stream,
        _client,
        _option,
        _required,
        _stream_policies,
        _value,
        connection_config,
    )
    from airflow_provider_pravega.spark.row_digest import RowDigest
    from airflow_provider_pravega.spark.worker_heap import prepare_worker_heap
except ImportError as _missing:
    raise missing_dependency(_missing) from _missing

# Imports that one step needs only are made in that step: Spark imports the data source's modules
# in a new Python worker for each step of a use (its lookup, creation, planning, each task).

__all__ = ["PravegaBatchWriter", "PravegaCommitMessage", "PravegaStreamWriter", "micro_batch_run"]

log = logging.getLogger(__name__)

def _create_stream(client: Any, scope: str, stream: str, options: Mapping[str, str]) -> None:
    """The scope and stream, created when missing with the policies in the options (an existing
    stream is left as it is, whatever its policies)."""
    scaling, retention = _stream_policies(options)
    if client.admin.create_scope(scope):
        log.info("created scope %s", scope)
    if client.admin.create_stream(scope, stream, scaling=scaling, retention=retention):
        log.info("created stream %s/%s (%s)", scope, stream, scaling)


@dataclass
class PravegaCommitMessage(WriterCommitMessage):
    """What a write task reports: its transaction (None in at_least_once mode) and its count."""

    scope: str
    stream: str
    txn_id: int | None
    events: int
    unit: str | None = None  # the input partition it holds (a write with write_id)
    rows: dict[str, Any] | None = None  # what that partition held: its row count and digest (row_digest.py)
    skipped: bool = False  # the partition held the rows an earlier job committed under the write_id


class _TaskWrites:
    """What batch and streaming writes share: the options checked on the driver, and each task
    attempt writing its rows into one transaction (or plainly, at least once)."""

    def __init__(self, options: Mapping[str, str], schema: Any, overwrite: bool) -> None:
        if overwrite:
            raise PravegaDataSourceError("a Pravega stream is append-only: use mode('append'), not overwrite")
        self.config = connection_config(options)
        self.scope = _required(options, "scope", "the stream's scope")
        self.stream = _required(options, "stream", "the stream to write")
        self.mode = _value(options, "mode")
        self.event_text, self.has_key = _check_columns(schema)
        self.stale_after_s = _value(options, "stale_after_s")
        self.write_id = _option(options, "write_id")
        self.state_scope = _value(options, "state_scope")
        self.run_id: str | None = None  # the run of a batch write (see PravegaBatchWriter)
        self.owner: str | None = None
        create = _value(options, "create_stream")
        with _client(self.config) as client:
            if create:
                _create_stream(client, self.scope, self.stream, options)
            _check_stream(client, self.scope, self.stream)
            if self.mode == "exactly_once":
                # The lease the tasks will ask for, asked now: a controller's limits are its configuration
                # (MIN_LEASE_MS..MAX_LEASE_MS by default, up to 120000 ms on the embedded server), which
                # no call but a begin tells, and a lease it refuses would fail every task instead of save().
                txn = _begin(client.transactions, self.scope, self.stream, self.config.transaction_lease_ms)
                abort_quietly(client.transactions, self.scope, self.stream, [txn.txn_id])

    def write(self, iterator: Iterator[Any]) -> PravegaCommitMessage:
        prepare_worker_heap()
        if self.mode == "at_least_once":
            return self._write_at_least_once(iterator)
        if self.run_id is None:
            return self._write_micro_batch(iterator)
        task = TaskContext.get()
        unit = f"partition-{task.partitionId():05d}" if self.write_id is not None and task is not None else None
        with _client(self.config) as client:
            store = _write_state(client, self.scope, self.stream, self.write_id, self.state_scope, create=False)
            try:
                committed = known_files(store, store.fetch(), [unit]).get(unit) if unit is not None else None
                if committed is not None:
                    self._check_retry(unit, committed, iterator)
                    return PravegaCommitMessage(self.scope, self.stream, None, 0, unit, skipped=True)
                digest = RowDigest(self._digest_columns()) if unit is not None else None
                txn_id, count = self._write_in_run(client, store, self._coordinator(client, store), self.run_id,
                                                   iterator, digest)
            finally:
                store.close()
        return PravegaCommitMessage(self.scope, self.stream, txn_id, count, unit,
                                    rows=digest.identity() if digest is not None else None)

    def _digest_columns(self) -> tuple[str, ...]:
        return ("event", "routing_key") if self.has_key else ("event",)

    def _check_retry(self, unit: str, committed: Mapping[str, Any], batches: Iterator[Any]) -> None:
        """An input partition an earlier job committed under this write_id: passes if it holds the
        same rows (a retry: nothing to write), refused if not (new rows under a used id would
        otherwise be dropped without a word)."""
        digest = RowDigest(self._digest_columns())
        for batch in batches:
            digest.add(batch)
        now = digest.identity()
        if committed.get("digest") == now["digest"] and committed.get("events") == now["events"]:
            return
        raise PravegaDataSourceError(
            f"write_id {self.write_id!r}: input partition {unit} holds other rows than the job that committed it "
            f"under this id ({row_digest.describe(now)} now; {row_digest.describe(committed)} committed by run "
            f"{committed.get('run')}): nothing of this write is committed. A write_id names one write: a retry of "
            f"the same rows skips what was committed, new rows need a new write_id (e.g. the job's name and its "
            f"batch, such as its date)")

    def _write_in_run(self, client: Any, store: Any, coord: Any, run_id: str, iterator: Iterator[Any],
                      digest: RowDigest | None = None) -> tuple[int, int]:
        """The task side of the transactional stage (client/task_stage.py), for batch and streaming
        writes alike: begin a transaction, register it in ``run_id`` (fenced: refused once the run
        reached its commit point or was taken over), write the rows, flush. While it writes the task
        renews every transaction registered in the run, so a finished task's transaction stays alive
        while any task of the job still runs, on no host of its own. ``digest`` is fed the rows
        written. Returns (transaction id, events)."""
        lease_ms = self.config.transaction_lease_ms
        with TaskTransaction(client, store, scope=self.scope, stream=self.stream, run_id=run_id, owner=self.owner,
                             lease_ms=lease_ms, renew_run=coord,
                             begin=lambda manager: _begin(manager, self.scope, self.stream, lease_ms)) as txn:
            count = self._write_rows(iterator, txn.writer.write_event, digest)
            txn.finish()
        return txn.info.txn_id, count

    def _write_micro_batch(self, iterator: Iterator[Any]) -> PravegaCommitMessage:
        """A streaming write's task, through the transactional stage like a batch write's: the
        micro-batch's run (one per batch id, the same in every attempt, started by its first
        task) registers this task's transaction under its input partition; a partition a replay
        finds committed is not written again."""
        task = TaskContext.get()
        batch = task.getLocalProperty("streaming.sql.batchId") if task is not None else None
        if batch is None:  # Spark sets it for every micro-batch's tasks; without it no replay can be told
            raise PravegaDataSourceError("a streaming write task without Spark's micro-batch id "
                                         "(local property streaming.sql.batchId): use mode=at_least_once here")
        batch_id = int(batch)
        unit = f"partition-{task.partitionId():05d}"
        run_id = micro_batch_run(batch_id)
        with _client(self.config) as client:
            store = self._stream_state(client)
            try:
                coord = self._coordinator(client, store)
                if _committed_before(store, batch_id) or not coord.join_unit_run(run_id, unit):
                    log.info("writer %s: partition %s of micro-batch %d was committed before (a replay): skipped",
                             self.writer_id, unit, batch_id)
                    return PravegaCommitMessage(self.scope, self.stream, None, 0, unit)
                txn_id, count = self._write_in_run(client, store, coord, run_id, iterator)
            finally:
                store.close()
        return PravegaCommitMessage(self.scope, self.stream, txn_id, count, unit)

    def _stream_state(self, client: Any) -> Any:
        return open_ingest_state(client, self.scope, self.stream, f"spark-stream:{self.writer_id}",
                                 stale_after_s=self.stale_after_s, state_scope=self.state_scope)

    def _coordinator(self, client: Any, store: Any) -> Any:
        """The transactional stage's coordinator for this write's run (driver and tasks alike)."""
        return IngestCoordinator(store, client.transactions, self.scope, self.stream, owner=self.owner,
                                 stale_after_s=self.stale_after_s, lease_ms=self.config.transaction_lease_ms,
                                 lease_keeper=client.lease_keeper, crash_hook=fault_points.reached)

    def _write_at_least_once(self, iterator: Iterator[Any]) -> PravegaCommitMessage:
        """Plain appends (the provider's EventWriter, routed like the official writer): visible at
        once, no transaction; a retried task writes its rows again (at least once)."""
        with _client(self.config) as client, client.event_writer(self.scope, self.stream) as writer:
            count = self._write_rows(iterator, writer.write_event)
            writer.flush()
        return PravegaCommitMessage(self.scope, self.stream, None, count)

    def _write_rows(self, batches: Iterator[Any], write: Any, digest: RowDigest | None = None) -> int:
        count = 0
        for batch in batches:
            if digest is not None:
                digest.add(batch)
            events = batch.column("event").to_pylist()
            if self.event_text:
                events = [e.encode("utf-8") if e is not None else None for e in events]
            keys = batch.column("routing_key").to_pylist() if self.has_key else [None] * len(events)
            for event, key in zip(events, keys, strict=True):
                if event is None:  # a task cannot know its rows' position in the whole DataFrame
                    task = TaskContext.get()
                    where = f" of task {task.partitionId()} (counted from 0 within its partition)" if task else ""
                    raise PravegaDataSourceError(f"row {count}{where} has a null event; events cannot be null: "
                                                 "filter them out, e.g. .where('event IS NOT NULL')")
                write(event, key)
                count += 1
        return count


def _note(message: str) -> None:
    """Log at INFO from the driver's side of a write. Spark runs a Python data source's commit in a
    Python worker of its own, whose logging nobody configured: there the line goes to stderr, which
    Spark's driver log (and a session the provider started, its JVM logger) shows."""
    if log.hasHandlers():
        log.info("%s", message)
    else:
        print(f"INFO {log.name}: {message}", file=sys.stderr, flush=True)


class PravegaBatchWriter(_TaskWrites, DataSourceArrowWriter):
    """Exactly once by default: a run of the transactional stage (see the module doc), started
    at ``save()``, one transaction per task attempt, committed by the driver; ``mode=at_least_once``:
    plain appends, nothing to commit."""

    def __init__(self, options: Mapping[str, str], schema: Any, overwrite: bool, renewal: Any = None) -> None:
        super().__init__(options, schema, overwrite)
        self.renewal_key: str | None = None
        if self.mode != "exactly_once":
            return
        try:
            check_timing(self.stale_after_s, self.config.transaction_lease_ms)
        except IngestError as exc:
            raise PravegaDataSourceError(f"option stale_after_s: {exc}") from None
        self.owner = f"spark-write:{self.write_id or '-'}:{uuid.uuid4().hex[:12]}"
        self.renewal = renewal
        with _client(self.config) as client:
            self._announce(client, run_id=None)  # a rerun's renewer lets go of the earlier run first
            store = _write_state(client, self.scope, self.stream, self.write_id, self.state_scope)
            try:
                coord = self._coordinator(client, store)
                if self.write_id is None:  # independent jobs: none recovers another's run, dead ones are dropped
                    coord.drop_dead_runs(DEAD_WRITE_AFTER_S)
                    self.run_id = coord.start_open_run(wait_for_others_s=None)
                else:  # a rerun first finishes or rolls back the crashed job's run
                    self.run_id = coord.start_open_run(wait_for_others_s=2 * self.stale_after_s + 60)
            finally:
                store.close()
            self._announce(client, run_id=self.run_id)

    def _announce(self, client: Any, run_id: str | None, *, retire: bool = False) -> None:
        """Tell the registering process's renewer (``register(spark, renew_writes=...)``) about this
        write's run, or that it is over. Best effort: without it the lease alone bridges the gap."""
        renewal = self.renewal
        if renewal is None:
            return
        if renewal.controller != self.config.controller_uri:
            if not retire and run_id is None:
                log.warning("write into %s/%s: its controller %s is not the renewer's (%s): only its lease "
                            "keeps it alive between its last task and its commit", self.scope, self.stream,
                            self.config.controller_uri, renewal.controller)
            return
        if self.renewal_key is None:
            self.renewal_key = write_renewal.write_key(renewal, self.scope, self.stream, self.write_id, self.owner)
        write = None if retire else {
            "scope": self.scope, "stream": self.stream, "run_id": run_id, "owner": self.owner,
            "ingest_id": f"spark-write:{self.write_id}" if self.write_id is not None else "spark-write",
            "state_scope": self.state_scope, "stale_after_s": self.stale_after_s,
            "lease_ms": self.config.transaction_lease_ms}
        try:
            write_renewal.announce(client, renewal, self.renewal_key, write)
        except PravegaError as exc:
            log.warning("write into %s/%s: could not reach the write renewer's registry in scope %s (%s): only "
                        "its lease keeps it alive between its last task and its commit", self.scope, self.stream,
                        renewal.scope, exc)

    def commit(self, messages: Sequence[PravegaCommitMessage | None]) -> None:
        if self.mode != "exactly_once":
            return
        fault_points.reached("job_commit")
        done = [m for m in messages if m is not None and m.txn_id is not None]
        hex_ids = [f"{m.txn_id:032x}" for m in done]
        holds = {f"{m.txn_id:032x}": [m.unit] if m.unit else [] for m in done}
        units = {m.unit: m.rows for m in done if m.unit is not None and m.rows is not None}
        skipped = sorted(m.unit for m in messages if m is not None and m.skipped and m.unit is not None)
        if skipped:
            _note(f"write {self.write_id} into {self.scope}/{self.stream}: {len(skipped)} input partition(s) hold the "
                  f"rows an earlier job committed under this write_id, so they are not written again ("
                  + ", ".join(skipped[:5]) + (", …" if len(skipped) > 5 else "") + ")")
        with _client(self.config) as client:
            store = _write_state(client, self.scope, self.stream, self.write_id, self.state_scope, create=False)
            try:
                coord = self._coordinator(client, store)
                _, status, returned = coord.commit_written(
                    self.run_id, WriteResult(hex_ids, sum(m.events for m in done), holds=holds, units=units or None))
            finally:
                store.close()
                self._announce(client, self.run_id, retire=True)
        if returned or status == "LOST":
            raise PravegaDataSourceError(
                f"the transactions of {len(returned) or len(done)} write task(s) on {self.scope}/{self.stream} were "
                f"aborted before the job committed (their leases of {self.config.transaction_lease_ms} ms lapsed: "
                f"no task of the job ran to renew them, and the job's commit came later than that); the others "
                f"were committed. "
                + (f"Run the job again with the same write_id={self.write_id!r}: it writes only the input partitions "
                   f"not committed ({', '.join(returned[:5])})." if self.write_id else
                   "Without option write_id a rerun would write the committed rows again; give each job a write_id "
                   "so a rerun writes only what is missing, or raise transaction_lease_ms."))

    def abort(self, messages: Sequence[PravegaCommitMessage | None]) -> None:
        if self.mode != "exactly_once":
            return
        with _client(self.config) as client:
            store = _write_state(client, self.scope, self.stream, self.write_id, self.state_scope, create=False)
            try:
                self._coordinator(client, store).abandon(self.run_id)  # aborts every registered transaction
            finally:
                store.close()
                self._announce(client, self.run_id, retire=True)


class PravegaStreamWriter(_TaskWrites, DataSourceStreamArrowWriter):
    """Exactly once per micro-batch, through the transactional stage: micro-batch N is the run
    ``batch-N`` in a state keyed by the target stream and ``writer_id`` (the same in every attempt
    and replay of N). Tasks start it, register their transaction under their input partition and
    renew the run while they write; the driver's commit of N is the stage's commit point. A batch
    Spark replays after a crash between this commit and Spark's own commit log finds its partitions
    committed (nothing is written twice); a commit interrupted after its commit point is finished by
    the replay; a partition whose transaction lapsed after the commit point fails the query, and
    the replay writes only it."""

    def __init__(self, options: Mapping[str, str], schema: Any, overwrite: bool) -> None:
        super().__init__(options, schema, overwrite)
        self.writer_id = _option(options, "writer_id")
        if self.mode == "exactly_once" and self.writer_id is None:
            raise PravegaDataSourceError(
                "an exactly-once streaming write needs option writer_id (a name for this query's record of "
                "committed micro-batches, kept with its checkpoint location), or mode=at_least_once")
        self.stale_after_s = _value(options, "stale_after_s")
        self.owner = f"spark-stream:{self.writer_id}"  # every attempt of the query: a batch's run has one owner
        if self.mode == "exactly_once":
            try:
                check_timing(self.stale_after_s, self.config.transaction_lease_ms)
            except IngestError as exc:
                raise PravegaDataSourceError(f"option stale_after_s: {exc}") from None

    def commit(self, messages: Sequence[PravegaCommitMessage | None], batchId: int) -> None:
        """The micro-batch's commit point and commits (the stage's driver side). A partition whose
        transaction was lost after the commit point fails the query: restarted from its checkpoint,
        it replays the batch and writes only the partitions not committed."""
        if self.mode != "exactly_once":
            return
        done = [m for m in messages if m is not None and m.txn_id is not None]
        hex_ids = [f"{m.txn_id:032x}" for m in done]
        run_id = micro_batch_run(batchId)
        with _client(self.config) as client:
            store = self._stream_state(client)
            try:
                coord = self._coordinator(client, store)
                run = store.fetch()["runs"].get(run_id)
                if run is None or run["phase"] != WRITING:
                    # Every partition was committed before (a replay), or an earlier attempt's
                    # commit is to be finished: nothing of this attempt is in it.
                    if run is not None:
                        coord.finish_past_commit_point(run_id, run)
                    abort_quietly(client.transactions, self.scope, self.stream, [m.txn_id for m in done])
                    log.info("micro-batch %d of writer %s: committed before (a replay)", batchId, self.writer_id)
                    return
                _, status, returned = coord.commit_written(
                    run_id, WriteResult(hex_ids, sum(m.events for m in done),
                                        holds={f"{m.txn_id:032x}": [m.unit] for m in done}))
                coord.recover_stale_runs()  # runs a zombie task started after its batch committed
            finally:
                store.close()
        if returned or status == "LOST":
            raise PravegaDataSourceError(
                f"micro-batch {batchId} of writer {self.writer_id}: the transactions of input partition(s) "
                f"{', '.join(returned[:5]) or 'all'} were aborted after its commit point (leases of "
                f"{self.config.transaction_lease_ms} ms lapsed before the commit); the other partitions were "
                "committed. Restart the query from its checkpoint location: it replays this micro-batch and "
                "writes only the partitions not committed.")

    def abort(self, messages: Sequence[PravegaCommitMessage | None], batchId: int) -> None:
        if self.mode != "exactly_once":
            return
        with _client(self.config) as client:
            store = self._stream_state(client)
            try:
                run = store.fetch()["runs"].get(micro_batch_run(batchId))
                if run is not None and run["phase"] == "WRITING":
                    self._coordinator(client, store).abandon(micro_batch_run(batchId))
            finally:
                store.close()
        _abort_all(self.config, self.scope, self.stream, messages)


def micro_batch_run(batch_id: int) -> str:
    """The run of a streaming micro-batch: the same id in every attempt and replay of the batch."""
    return f"batch-{batch_id:020d}"


def _committed_before(store: Any, batch_id: int) -> bool:
    """Versions before 0.4 recorded a streaming write's micro-batch as one "file": a replay of a
    batch they committed is skipped whole."""
    old = known_files(store, store.fetch(), ["micro-batch"]).get("micro-batch")
    return old is not None and int(old.get("fp") or -1) >= batch_id


#: A run of a write without write_id whose driver stopped heartbeating this long ago is dropped.
DEAD_WRITE_AFTER_S = 24 * 3600


def _write_state(client: Any, scope: str, stream: str, write_id: str | None, state_scope: str | None = None, *,
                 create: bool = True) -> Any:
    """The state of batch writes into ``scope/stream`` (kept in ``state_scope``; default: the
    stream's scope): one per ``write_id``, one shared by writes without one (independent runs:
    their units are never recorded)."""
    ingest_id = f"spark-write:{write_id}" if write_id is not None else "spark-write"
    if create:
        return open_ingest_state(client, scope, stream, ingest_id, state_scope=state_scope)
    return open_state_store(client, *state_location(scope, stream, ingest_id, state_scope), create=False)


def _begin(manager: Any, scope: str, stream: str, lease_ms: int) -> Any:
    """A transaction with the options' lease; a lease the controller refuses is named as the option."""
    try:
        return begin_transaction(manager, scope, stream, lease_ms)
    except PravegaError as exc:
        text = str(exc)
        maximum = re.search(r"max(?:imum)?(?: value)?(?: is| of) (\d+)", text)
        if "minimum lease" in text:
            problem = (f"is below the controller's minimum lease: give at least {MIN_LEASE_MS} ms (Pravega's default "
                       f"controller.transaction.lease.count.min) and at most the controller's maximum "
                       f"(controller.transaction.lease.count.max, {MAX_LEASE_MS} ms by default)")
        elif maximum and "lease" in text:
            problem = (f"is above the controller's maximum lease of {maximum.group(1)} ms (its "
                       f"controller.transaction.lease.count.max): give at most {maximum.group(1)} ms and at least "
                       f"{MIN_LEASE_MS} ms (Pravega's default minimum)")
        else:
            raise
        raise PravegaDataSourceError(f"option transaction_lease_ms={lease_ms} {problem}") from None


def _abort_all(config: Any, scope: str, stream: str, messages: Sequence[PravegaCommitMessage | None]) -> None:
    txns = [m.txn_id for m in messages if m is not None and m.txn_id is not None]
    if not txns:
        return
    with _client(config) as client:
        abort_quietly(client.transactions, scope, stream, txns)


def _check_columns(schema: Any) -> tuple[bool, bool]:
    """``event`` (binary or string) and an optional ``routing_key`` (string); nothing else."""
    fields = {f.name: f.dataType for f in schema.fields}
    if "event" not in fields:
        raise PravegaDataSourceError(
            f"the DataFrame to write needs a column 'event' (binary or string); it has {', '.join(fields) or 'none'}")
    if not isinstance(fields["event"], (BinaryType, StringType)):
        raise PravegaDataSourceError(
            f"column 'event' must be binary or string, got {fields['event'].simpleString()}")
    key = fields.get("routing_key")
    if key is not None and not isinstance(key, StringType):
        raise PravegaDataSourceError(f"column 'routing_key' must be a string, got {key.simpleString()}")
    extra = sorted(set(fields) - {"event", "routing_key"})
    if extra:
        raise PravegaDataSourceError(
            f"the DataFrame to write has columns the pravega data source does not write: {', '.join(extra)} "
            f"(only 'event' and 'routing_key'); select them away or serialise them into 'event'")
    return isinstance(fields["event"], StringType), key is not None
