"""The controller's transactions: create, commit (rolling ones included), abort, ping and state.

A transaction's segments are created with it and merged into (commit) or discarded from (abort)
the stream later; leases and their expiry are in :mod:`~.controller_leases`.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from airflow_provider_pravega.embedded.controller_access import RpcFailure, rpc
from airflow_provider_pravega.embedded.controller_base import ControllerBase
from airflow_provider_pravega.embedded.controller_state import (
    ABORTED,
    ABORTING,
    ACTIVE,
    COMMITTED,
    COMMITTING,
    OPEN,
    RollPlan,
    StreamRecord,
    TxnRecord,
    number_of,
    segment_id_of,
)
from airflow_provider_pravega.protocol import controller_pb2 as pb
from airflow_provider_pravega.protocol.naming import (
    bits_to_txn_id,
    qualified_segment_name,
    transaction_segment_name,
    txn_id_to_bits,
)

log = logging.getLogger(__name__)


def _txn_failure(action: str, scope: str, name: str, txn_id: int, why: str) -> pb.TxnStatus:
    """Pravega 0.13's controller answers every refused commit or abort with FAILURE (its reason
    goes to its log only); so does this one."""
    log.info("%s of transaction %032x on %s/%s refused: %s", action, txn_id, scope, name, why)
    return pb.TxnStatus(status=pb.TxnStatus.FAILURE)


class Transactions(ControllerBase):
    """The transaction RPCs of Pravega's ControllerService."""

    def _txn_segment_names(self, scope: str, name: str, txn_id: int) -> list[str]:
        with self._lock:
            stream = self._state.streams[(scope, name)]
            txn = stream.txns[txn_id]
            parents = [p.segment_id for p in stream.txn_segment_parents(txn)]
        return [transaction_segment_name(qualified_segment_name(scope, name, p), txn_id) for p in parents]

    @staticmethod
    def _txn_id(request: pb.TxnRequest | pb.PingTxnRequest) -> int:
        if not request.HasField("txnId"):
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, "txnId is required")
        return bits_to_txn_id(request.txnId.highBits, request.txnId.lowBits)

    def _txn_record(self, op: str, scope: str, name: str, txn_id: int, **fields: Any) -> dict[str, Any]:
        return {"op": op, "scope": scope, "stream": name, "txn": format(txn_id, "032x"), "ts": self._now_ms(),
                **fields}

    @rpc
    def createTransaction(self, request: pb.CreateTxnRequest, context: grpc.ServicerContext) -> pb.CreateTxnResponse:
        scope, name = self._names(request.streamInfo)
        lease = self._effective_lease(request.lease)
        if lease is None:
            raise RpcFailure(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"lease {request.lease} ms exceeds the maximum of {self._config.max_lease_ms} ms",
            )
        if lease > self._config.max_execution_time_ms:
            raise RpcFailure(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"lease {lease} ms exceeds the maximum execution time of {self._config.max_execution_time_ms} ms",
            )
        with self._gate(scope, name).shared():
            with self._lock:
                stream = self._stream_or_fail(scope, name)
                if stream.state != ACTIVE:
                    raise RpcFailure(
                        grpc.StatusCode.INVALID_ARGUMENT, f"stream {scope}/{name} is sealed; no new transactions"
                    )
                epoch = len(stream.epochs) - 1
                txn_id = (epoch << 96) | (stream.txn_counter + 1)  # low 64 bits stay below 2**63
                now = self._now_ms()
                seq = self._persist(
                    self._txn_record(
                        "txn_created",
                        scope,
                        name,
                        txn_id,
                        epoch=epoch,
                        lease_ms=lease,
                        deadline_ms=now + lease,
                        max_deadline_ms=now + self._config.max_execution_time_ms,
                    )
                )
                ranges = [self._range(stream, s) for s in stream.active_epoch.segment_ids]
            self._durable(seq)
            # The client opens appends on these at once and never creates them itself.
            for seg_name in self._txn_segment_names(scope, name, txn_id):
                self._backend.create_segment(seg_name)
        high, low = txn_id_to_bits(txn_id)
        return pb.CreateTxnResponse(txnId=pb.TxnId(highBits=high, lowBits=low), activeSegments=ranges)

    def _stream_and_txn(self, action: str, scope: str, name: str,
                        txn_id: int) -> tuple[StreamRecord, TxnRecord] | pb.TxnStatus:
        """The stream and transaction a commit or abort names (under the state lock), or the
        refusal when either does not exist."""
        stream = self._state.stream(scope, name)
        if stream is None:
            return _txn_failure(action, scope, name, txn_id, "no such stream")
        txn = stream.txns.get(txn_id)
        if txn is None:
            return _txn_failure(action, scope, name, txn_id, "no such transaction")
        return stream, txn

    def _roll_plan(self, stream: StreamRecord, txn: TxnRecord) -> RollPlan:
        base = len(stream.epochs) - 1
        return RollPlan(
            base_epoch=base,
            txn_duplicates=tuple(
                (segment_id_of(base + 1, number_of(p.segment_id)), p.segment_id)
                for p in stream.txn_segment_parents(txn)
            ),
            active_duplicates=tuple(
                (segment_id_of(base + 2, number_of(a)), a) for a in stream.active_epoch.segment_ids
            ),
        )

    @rpc
    def commitTransaction(self, request: pb.TxnRequest, context: grpc.ServicerContext) -> pb.TxnStatus:
        scope, name = self._names(request.streamInfo)
        txn_id = self._txn_id(request)
        exclusive = False
        while True:
            gate = self._gate(scope, name)
            with gate.exclusive() if exclusive else gate.shared(), self._txn_lock(scope, name, txn_id):
                with self._lock:
                    found = self._stream_and_txn("commit", scope, name, txn_id)
                    if isinstance(found, pb.TxnStatus):
                        return found
                    stream, txn = found
                    if txn.state == COMMITTED:
                        return pb.TxnStatus(status=pb.TxnStatus.SUCCESS)
                    if txn.state in (ABORTING, ABORTED):
                        return _txn_failure("commit", scope, name, txn_id,
                                            f"it was aborted ({txn.abort_reason or 'aborted'})")
                    expired = txn.state == OPEN and self._now_ms() > txn.deadline_ms
                    rolling = txn.roll is not None if txn.state == COMMITTING else txn.epoch != len(stream.epochs) - 1
                    seq = None
                    if not expired and not (rolling and not exclusive) and txn.state == OPEN:
                        roll = self._roll_plan(stream, txn) if rolling else None
                        seq = self._persist(
                            self._txn_record(
                                "txn_committing",
                                scope,
                                name,
                                txn_id,
                                writer_id=request.writerId,
                                commit_timestamp=request.timestamp,
                                roll=roll.to_json() if roll else None,
                            )
                        )
                if expired:
                    self._abort_expired_locked(scope, name, txn_id)
                    return _txn_failure("commit", scope, name, txn_id, "it outlived its lease and was aborted")
                if rolling and not exclusive:
                    exclusive = True  # epochs will change: retry holding the stream exclusively
                    continue
                if seq is not None:
                    self._durable(seq)
                self._complete_commit(scope, name, txn_id)
                return pb.TxnStatus(status=pb.TxnStatus.SUCCESS)

    def _complete_commit(self, scope: str, name: str, txn_id: int) -> None:
        """Merge a COMMITTING transaction into the stream (idempotently) and mark it COMMITTED.

        Caller holds the transaction's lock and the stream gate (exclusively for a rolling commit).
        """
        with self._lock:
            stream = self._state.streams[(scope, name)]
            txn = stream.txns[txn_id]
            roll = txn.roll
            parents = [p.segment_id for p in stream.txn_segment_parents(txn)]
            old_active = list(stream.active_epoch.segment_ids)

        def seg(sid: int) -> str:
            return qualified_segment_name(scope, name, sid)

        def txn_seg(parent: int) -> str:
            return transaction_segment_name(seg(parent), txn_id)

        if roll is None:
            for parent in parents:
                self._backend.merge_segment(txn_seg(parent), seg(parent))
        else:
            # Rolling transaction: its epoch's segments are sealed, so copy them into a new epoch,
            # merge into the copies, seal those, and continue the active epoch in a further one.
            dup_of = {copied: new for new, copied in roll.txn_duplicates}
            for new, _ in roll.txn_duplicates:
                self._backend.create_segment(seg(new))
            for parent in parents:
                self._backend.merge_segment(txn_seg(parent), seg(dup_of[parent]))
            for new, _ in roll.txn_duplicates:
                self._backend.seal_segment(seg(new))
            for new, _ in roll.active_duplicates:
                self._backend.create_segment(seg(new))
        with self._lock:
            seq = self._persist(self._txn_record("txn_committed", scope, name, txn_id))
        self._durable(seq)
        if roll is not None:
            for sid in old_active:
                self._backend.seal_segment(seg(sid))

    def _complete_abort(self, scope: str, name: str, txn_id: int) -> None:
        """Discard an ABORTING transaction's segments and mark it ABORTED (caller holds its lock)."""
        for seg_name in self._txn_segment_names(scope, name, txn_id):
            self._backend.discard_segment(seg_name)
        with self._lock:
            seq = self._persist(self._txn_record("txn_aborted", scope, name, txn_id))
        self._durable(seq)

    @rpc
    def abortTransaction(self, request: pb.TxnRequest, context: grpc.ServicerContext) -> pb.TxnStatus:
        scope, name = self._names(request.streamInfo)
        txn_id = self._txn_id(request)
        with self._gate(scope, name).shared(), self._txn_lock(scope, name, txn_id):
            with self._lock:
                found = self._stream_and_txn("abort", scope, name, txn_id)
                if isinstance(found, pb.TxnStatus):
                    return found
                _stream, txn = found
                if txn.state == ABORTED:
                    return pb.TxnStatus(status=pb.TxnStatus.SUCCESS)
                if txn.state in (COMMITTING, COMMITTED):
                    return _txn_failure("abort", scope, name, txn_id, f"it is {txn.state}")
                seq = None
                if txn.state == OPEN:
                    seq = self._persist(
                        self._txn_record("txn_aborting", scope, name, txn_id, reason="aborted by client")
                    )
            if seq is not None:
                self._durable(seq)
            self._complete_abort(scope, name, txn_id)
        return pb.TxnStatus(status=pb.TxnStatus.SUCCESS)

    @rpc
    def pingTransaction(self, request: pb.PingTxnRequest, context: grpc.ServicerContext) -> pb.PingTxnStatus:
        scope, name = self._names(request.streamInfo)
        txn_id = self._txn_id(request)
        lease = self._effective_lease(request.lease)
        if lease is None:
            return pb.PingTxnStatus(status=pb.PingTxnStatus.LEASE_TOO_LARGE)
        with self._lock:
            stream = self._stream_or_fail(scope, name)
            txn = stream.txns.get(txn_id)
            if txn is None:
                return pb.PingTxnStatus(status=pb.PingTxnStatus.UNKNOWN)
            if txn.state in (COMMITTING, COMMITTED):
                return pb.PingTxnStatus(status=pb.PingTxnStatus.COMMITTED)
            if txn.state in (ABORTING, ABORTED):
                return pb.PingTxnStatus(status=pb.PingTxnStatus.ABORTED)
            now = self._now_ms()
            expired = now > txn.deadline_ms
            if not expired:
                if now + lease > txn.max_deadline_ms:
                    return pb.PingTxnStatus(status=pb.PingTxnStatus.MAX_EXECUTION_TIME_EXCEEDED)
                seq = self._persist(
                    self._txn_record("txn_pinged", scope, name, txn_id, lease_ms=lease, deadline_ms=now + lease)
                )
        if expired:
            # Too late: the lease already ran out, so the transaction is (now) aborted.
            self._expire(scope, name, txn_id)
            return self._txn_state_message(scope, name, txn_id, ping=True)
        self._durable(seq)
        return pb.PingTxnStatus(status=pb.PingTxnStatus.OK)

    def _txn_state_message(self, scope: str, name: str, txn_id: int, *, ping: bool = False) -> Any:
        """The state of a transaction as a TxnState (or, with ``ping``, a PingTxnStatus) message.

        A transaction of a stream that does not exist is UNKNOWN to checkTransactionState, as in
        Pravega 0.13."""

        def state() -> str | None:
            if not ping and self._state.stream(scope, name) is None:
                return None
            stream = self._stream_or_fail(scope, name)
            txn = stream.txns.get(txn_id)
            if txn is None:
                return None
            if txn.state == OPEN and self._now_ms() > txn.deadline_ms:
                return ABORTING  # the lease ran out; the reaper is about to abort it
            return txn.state

        value = self._read(state)
        if ping:
            mapping = {
                None: pb.PingTxnStatus.UNKNOWN,
                OPEN: pb.PingTxnStatus.OK,
                COMMITTING: pb.PingTxnStatus.COMMITTED,
                COMMITTED: pb.PingTxnStatus.COMMITTED,
                ABORTING: pb.PingTxnStatus.ABORTED,
                ABORTED: pb.PingTxnStatus.ABORTED,
            }
            return pb.PingTxnStatus(status=mapping[value])
        return pb.TxnState(state=pb.TxnState.UNKNOWN if value is None else pb.TxnState.State.Value(value))

    @rpc
    def checkTransactionState(self, request: pb.TxnRequest, context: grpc.ServicerContext) -> pb.TxnState:
        scope, name = self._names(request.streamInfo)
        return self._txn_state_message(scope, name, self._txn_id(request))
