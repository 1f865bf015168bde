"""What the controller's answers mean, RPC by RPC: each refusal (NOT_FOUND, a refused argument or
precondition) and each reply status, as a return value or one of the exceptions in :mod:`.errors`.

Why one table: the same answer means different things to different RPCs (NOT_FOUND is "no such
transaction" to a commit and "not deleted, it was not there" to a delete), and written out in each
RPC method the meanings drift apart. :meth:`ControllerClient._ask` looks an RPC up here and applies
its entry; the RPC methods only build requests and read replies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from airflow_provider_pravega.client.controller_types import TxnStatus
from airflow_provider_pravega.client.errors import (
    ControllerError,
    InvalidNameError,
    InvalidStreamCutError,
    ScaleError,
    ScopeNotEmptyError,
    ScopeNotFoundError,
    StreamNotFoundError,
    StreamNotSealedError,
    StreamSealedError,
    TransactionLeaseError,
    TransactionNotFoundError,
    TransactionStateError,
)
from airflow_provider_pravega.protocol import controller_pb2 as pb

__all__ = ["ANSWERS", "MISSING", "NOT_FOUND", "PRECONDITION", "REFUSED_ARGUMENT", "REPLY", "RAISE",
           "About", "Answers", "Refusal"]

#: The kinds of refusal a controller RPC can end with (the gRPC codes behind them: see
#: ``ControllerClient._call_error``).
NOT_FOUND = "not found"
REFUSED_ARGUMENT = "invalid argument"  # INVALID_ARGUMENT or OUT_OF_RANGE
PRECONDITION = "failed precondition"


class Refusal(Exception):
    """The controller refused an RPC (``kind``: one of the kinds above); the RPC's entry in
    :data:`ANSWERS` says what that means. Raised as is when its entry does not say."""

    def __init__(self, kind: str, details: str) -> None:
        super().__init__(details)
        self.kind = kind
        self.details = details


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: The answer names no resource: the scope or the stream is missing, and the client asks which
#: (the controller's NOT_FOUND does not say).
MISSING = _Marker("MISSING")
#: The reply itself is the answer (the RPC method reads it).
REPLY = _Marker("REPLY")
#: Not a meaning: the refusal is raised as it came.
RAISE = _Marker("RAISE")


class About(NamedTuple):
    """What one call is about, for the messages of its errors."""

    uri: str
    method: str
    scope: str = ""
    stream: str = ""
    txn_id: int = 0
    #: The request in the caller's words, where a message quotes it (a cut, an epoch, a lease).
    what: str = ""
    #: A scale's segments to seal and new key ranges.
    sealed: Sequence[int] = ()
    ranges: Sequence[tuple[float, float]] = ()


#: An answer's meaning: a value to return (True, None, a TxnStatus, :data:`REPLY`), :data:`MISSING`,
#: :data:`RAISE`, or a function of (About, the refusal's details or the reply's status) that returns
#: an exception to raise, MISSING or a value.
Outcome = Any


@dataclass(frozen=True)
class Answers:
    """One RPC's meanings. ``read`` turns a reply into what ``statuses`` is keyed by (or, without
    ``statuses``, into the answer); without ``read`` the reply is the answer."""

    not_found: Outcome = RAISE
    refused_argument: Outcome = RAISE
    precondition: Outcome = RAISE
    read: Callable[[Any], Any] | None = None
    statuses: Mapping[Any, Outcome] | None = None
    #: A status missing from ``statuses``.
    otherwise: Outcome = REPLY
    #: Another process is still creating the stream (INTERNAL "State: CREATING"): wait for it.
    wait_while_creating: bool = False

    def of_refusal(self, refusal: Refusal, about: About) -> Outcome:
        meaning = {NOT_FOUND: self.not_found, REFUSED_ARGUMENT: self.refused_argument,
                   PRECONDITION: self.precondition}.get(refusal.kind, RAISE)
        return settle(meaning, about, refusal.details)

    def of_reply(self, reply: Any, about: About) -> Outcome:
        if self.read is None:
            return reply
        value = self.read(reply)
        if self.statuses is None:
            return value
        outcome = settle(self.statuses.get(value, self.otherwise), about, value)
        return reply if outcome is REPLY else outcome


def settle(outcome: Outcome, about: About, detail: Any) -> Outcome:
    """An outcome applied to one call: a function is called, anything else is what it is."""
    return outcome(about, detail) if callable(outcome) else outcome


def _status(reply: Any) -> Any:
    return reply.status


def _names_transaction(details: str) -> bool:
    lowered = details.lower()
    return "transaction" in lowered or "txn" in lowered


def _transaction_gone(a: About, details: str) -> Outcome:
    """NOT_FOUND of a transaction RPC: the transaction, or (the details do not name it) its stream."""
    return TransactionNotFoundError(a.scope, a.stream, a.txn_id) if _names_transaction(details) else MISSING


def _no_transaction(a: About, _: object) -> Exception:
    return TransactionNotFoundError(a.scope, a.stream, a.txn_id)


def _scope_not_found(a: About, _: object) -> Exception:
    return ScopeNotFoundError(a.scope)


def _on_stream(**answers: Any) -> Answers:
    """An RPC about an existing stream: NOT_FOUND is a missing scope or stream, a refused request
    is a ControllerError, and a stream still being created is waited for."""
    refused = lambda a, d: ControllerError(f"{a.method} on {a.scope}/{a.stream} was refused: {d}")  # noqa: E731
    return Answers(**{"not_found": MISSING, "refused_argument": refused, "precondition": refused,
                      "wait_while_creating": True, **answers})


def _update_statuses(action: str, extra: Mapping[int, Outcome] | None = None) -> dict[str, Any]:
    """UpdateStreamStatus, the reply of update, seal and truncate (``extra`` overrides)."""
    return {
        "read": _status,
        "statuses": {
            pb.UpdateStreamStatus.SUCCESS: None,
            pb.UpdateStreamStatus.STREAM_NOT_FOUND: lambda a, _: StreamNotFoundError(a.scope, a.stream),
            pb.UpdateStreamStatus.SCOPE_NOT_FOUND: _scope_not_found,
            4: lambda a, _: StreamSealedError(a.scope, a.stream, action),  # Java's STREAM_SEALED
            **(extra or {}),
        },
        "otherwise": lambda a, s: ControllerError(
            f"controller {a.uri} failed to {action} stream {a.scope}/{a.stream} (status {s})"
        ),
    }


def _refused_both(outcome: Outcome) -> dict[str, Outcome]:
    return {"refused_argument": outcome, "precondition": outcome}


def _end_transaction(action: str) -> Answers:
    """commitTransaction and abortTransaction."""
    return Answers(
        not_found=_transaction_gone,
        **_refused_both(lambda a, d: TransactionStateError(
            a.scope, a.stream, a.txn_id,
            f"cannot {action} transaction {a.txn_id:032x} on {a.scope}/{a.stream}: {d}",
        )),
        read=_status,
        statuses={
            pb.TxnStatus.SUCCESS: None,
            pb.TxnStatus.TRANSACTION_NOT_FOUND: _no_transaction,
            pb.TxnStatus.STREAM_NOT_FOUND: MISSING,
        },
        otherwise=lambda a, s: TransactionStateError(
            a.scope, a.stream, a.txn_id,
            f"controller {a.uri} failed to {action} transaction {a.txn_id:032x} on {a.scope}/{a.stream} "
            f"(status {s})",
        ),
    )


_TXN_STATES = {
    pb.TxnState.OPEN: TxnStatus.OPEN,
    pb.TxnState.COMMITTING: TxnStatus.COMMITTING,
    pb.TxnState.COMMITTED: TxnStatus.COMMITTED,
    pb.TxnState.ABORTING: TxnStatus.ABORTING,
    pb.TxnState.ABORTED: TxnStatus.ABORTED,
    pb.TxnState.UNKNOWN: TxnStatus.UNKNOWN,
}

ANSWERS: dict[str, Answers] = {
    # ---------------------------------------------------------------------------------- scopes
    "createScope": Answers(
        refused_argument=lambda a, d: InvalidNameError(f"invalid scope name {a.scope!r}: {d}"),
        read=_status,
        statuses={
            pb.CreateScopeStatus.SUCCESS: True,
            pb.CreateScopeStatus.SCOPE_EXISTS: False,
            pb.CreateScopeStatus.INVALID_SCOPE_NAME: lambda a, _: InvalidNameError(
                f"invalid scope name {a.scope!r}: use letters, digits, '.' and '-' (not starting with '_')"
            ),
        },
        otherwise=lambda a, s: ControllerError(f"controller {a.uri} failed to create scope {a.scope!r} (status {s})"),
    ),
    "deleteScope": Answers(
        not_found=False,
        read=_status,
        statuses={
            pb.DeleteScopeStatus.SUCCESS: True,
            pb.DeleteScopeStatus.SCOPE_NOT_FOUND: False,
            pb.DeleteScopeStatus.SCOPE_NOT_EMPTY: lambda a, _: ScopeNotEmptyError(a.scope),
        },
        otherwise=lambda a, s: ControllerError(f"controller {a.uri} failed to delete scope {a.scope!r} (status {s})"),
    ),
    "checkScopeExists": Answers(not_found=False, refused_argument=False, read=lambda reply: bool(reply.exists)),
    "listScopes": Answers(),
    # --------------------------------------------------------------------------------- streams
    "createStream": Answers(
        refused_argument=lambda a, d: InvalidNameError(f"cannot create stream {a.scope}/{a.stream}: {d}"),
        not_found=_scope_not_found,
        read=_status,
        statuses={
            pb.CreateStreamStatus.SUCCESS: True,
            pb.CreateStreamStatus.STREAM_EXISTS: False,
            pb.CreateStreamStatus.SCOPE_NOT_FOUND: _scope_not_found,
            pb.CreateStreamStatus.INVALID_STREAM_NAME: lambda a, _: InvalidNameError(
                f"invalid stream name {a.stream!r}: use letters, digits, '.' and '-' (not starting with '_')"
            ),
        },
        otherwise=lambda a, s: ControllerError(
            f"controller {a.uri} failed to create stream {a.scope}/{a.stream} (status {s})"
        ),
    ),
    "updateStream": _on_stream(**_update_statuses("update")),
    "getStreamConfiguration": _on_stream(),
    "checkStreamExists": Answers(not_found=False, refused_argument=False, read=lambda reply: bool(reply.exists)),
    "listStreamsInScope": Answers(
        not_found=_scope_not_found,
        read=_status,
        statuses={pb.StreamsInScopeResponse.SCOPE_NOT_FOUND: _scope_not_found},
    ),
    # Sealing is idempotent for us: Java's STREAM_SEALED (4) is success.
    "sealStream": _on_stream(**_update_statuses("seal", {4: None})),
    "deleteStream": Answers(
        not_found=False,
        precondition=lambda a, _: StreamNotSealedError(a.scope, a.stream),
        read=_status,
        statuses={
            pb.DeleteStreamStatus.SUCCESS: True,
            pb.DeleteStreamStatus.STREAM_NOT_FOUND: False,
            pb.DeleteStreamStatus.STREAM_NOT_SEALED: lambda a, _: StreamNotSealedError(a.scope, a.stream),
        },
        otherwise=lambda a, s: ControllerError(
            f"controller {a.uri} failed to delete stream {a.scope}/{a.stream} (status {s})"
        ),
    ),
    # ``what``: "scope/stream at {cut}".
    "truncateStream": Answers(
        not_found=MISSING,
        **_refused_both(lambda a, d: InvalidStreamCutError(
            f"cannot truncate {a.what}: {d}. A truncation cut needs one offset per segment covering the whole key "
            f"space, at or after the current head."
        )),
        # Pravega 0.13 answers FAILURE for a cut that is not valid or is behind the head.
        **_update_statuses("truncate", {pb.UpdateStreamStatus.FAILURE: lambda a, _: InvalidStreamCutError(
            f"controller {a.uri} refused to truncate {a.what}: a truncation cut needs one offset per segment "
            f"covering the whole key space, at or after the current head, and within each segment's data"
        )}),
    ),
    # -------------------------------------------------------------------------------- segments
    "getCurrentSegments": _on_stream(),
    # ``what``: "epoch N".
    "getEpochSegments": Answers(
        not_found=MISSING,
        **_refused_both(lambda a, d: ControllerError(f"stream {a.scope}/{a.stream} has no {a.what}: {d}")),
    ),
    "getSegments": _on_stream(),
    "getSegmentsImmediatelyFollowing": _on_stream(),
    # ``what``: "(from {cut}, to {cut})".
    "getSegmentsBetween": Answers(
        not_found=MISSING,
        **_refused_both(lambda a, d: InvalidStreamCutError(f"invalid stream cuts for {a.scope}/{a.stream} {a.what}: {d}")),
    ),
    "getURI": _on_stream(),
    "getDelegationToken": _on_stream(),
    # ----------------------------------------------------------------------------------- scale
    # ``what``: "scale of scope/stream (seal [...], new ranges [...])".
    "scale": Answers(
        not_found=MISSING,
        **_refused_both(lambda a, d: ScaleError(f"{a.what} was refused: {d}")),
        read=_status,
        # Pravega 0.13 (submitScale): PRECONDITION_FAILED when a segment to seal is not active or
        # the result has fewer segments than the scaling policy's minimum; FAILURE when the new
        # ranges do not exactly replace the sealed ones (invalid input) or the stream is sealed.
        statuses={
            pb.ScaleResponse.STARTED: REPLY,
            pb.ScaleResponse.PRECONDITION_FAILED: lambda a, _: ScaleError(
                f"{a.what} was refused: every segment to seal must be active, and the stream must keep at "
                f"least its scaling policy's minimum number of segments"
            ),
            pb.ScaleResponse.FAILURE: lambda a, _: ScaleError(
                f"{a.what} was refused: the new key ranges {a.ranges} must exactly cover the key ranges of "
                f"segments {a.sealed} (no gap, no overlap), and the stream must not be sealed"
            ),
        },
        otherwise=lambda a, s: ControllerError(f"{a.what} failed on controller {a.uri} (status {s})"),
    ),
    # True: done; False: still in progress. ``what`` as for scale.
    "checkScale": _on_stream(
        read=_status,
        statuses={
            pb.ScaleStatusResponse.SUCCESS: True,
            pb.ScaleStatusResponse.IN_PROGRESS: False,
            pb.ScaleStatusResponse.INVALID_INPUT: lambda a, _: ScaleError(
                f"{a.what}: the controller reports invalid input"
            ),
        },
        otherwise=lambda a, s: ControllerError(f"{a.what} failed on controller {a.uri} (scale status {s})"),
    ),
    # ---------------------------------------------------------------------------- transactions
    "createTransaction": Answers(
        not_found=MISSING,
        **_refused_both(lambda a, d: TransactionLeaseError(
            a.scope, a.stream, 0, f"cannot begin a transaction on {a.scope}/{a.stream}: {d}"
        )),
    ),
    "commitTransaction": _end_transaction("commit"),
    "abortTransaction": _end_transaction("abort"),
    "checkTransactionState": Answers(
        not_found=lambda a, d: TxnStatus.UNKNOWN if _names_transaction(d) else MISSING,
        **_refused_both(lambda a, d: ControllerError(
            f"cannot check transaction {a.txn_id:032x} on {a.scope}/{a.stream}: {d}"
        )),
        read=lambda reply: _TXN_STATES.get(reply.state, TxnStatus.UNKNOWN),
    ),
    # OPEN when renewed; COMMITTED/ABORTED when there is nothing to renew. ``what``: "lease of N ms".
    "pingTransaction": Answers(
        not_found=_transaction_gone,
        **_refused_both(lambda a, d: TransactionLeaseError(
            a.scope, a.stream, a.txn_id, f"cannot renew the lease of transaction {a.txn_id:032x}: {d}"
        )),
        read=_status,
        statuses={
            pb.PingTxnStatus.OK: TxnStatus.OPEN,
            pb.PingTxnStatus.COMMITTED: TxnStatus.COMMITTED,
            pb.PingTxnStatus.ABORTED: TxnStatus.ABORTED,
            pb.PingTxnStatus.UNKNOWN: _no_transaction,
            pb.PingTxnStatus.LEASE_TOO_LARGE: lambda a, _: TransactionLeaseError(
                a.scope, a.stream, a.txn_id,
                f"{a.what} for transaction {a.txn_id:032x} is larger than the controller allows; "
                f"use a shorter lease and ping more often",
            ),
            pb.PingTxnStatus.MAX_EXECUTION_TIME_EXCEEDED: lambda a, _: TransactionLeaseError(
                a.scope, a.stream, a.txn_id,
                f"transaction {a.txn_id:032x} has been open longer than the controller's maximum execution "
                f"time; it cannot be renewed (commit or abort it)",
            ),
        },
        otherwise=lambda a, s: ControllerError(
            f"controller {a.uri} could not renew transaction {a.txn_id:032x} on {a.scope}/{a.stream} "
            f"(ping status {s})"
        ),
    ),
}
