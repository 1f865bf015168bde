"""Pravega transactions that work across processes: begin, write + flush, ping, commit, abort.

The official binding can only commit a transaction through the object that began it and has no
flush (see shared/official-client-facts.md). Here every step stands alone and is addressed by
(scope, stream, transaction id), so one process begins, many write and pre-commit (flush), a
driver keeps the leases alive, and another process commits:

* :class:`TransactionManager` - begin/status/ping/commit/abort/wait_for through the controller.
* :class:`TransactionalWriter` - writes a transaction's events straight to its transaction
  segments on the segment store, routed by routing key exactly like the official client, and
  ``flush`` returns only when the segment store has acknowledged every event. It never commits.
* :class:`LeaseKeeper` - a background thread pinging a set of transactions until each ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Self

from airflow_provider_pravega.client.controller import ControllerClient
from airflow_provider_pravega.client.controller_types import TransactionInfo, TxnStatus, parse_txn_id
from airflow_provider_pravega.client.errors import (
    PravegaError,
    TransactionAbortedError,
    TransactionCommittedError,
    TransactionError,
    TransactionNotFoundError,
    TransactionStateError,
    TransactionTimeoutError,
)
from airflow_provider_pravega.client.segment_client import SegmentStoreClient
from airflow_provider_pravega.client.writer import RoutedSegmentWriter
from airflow_provider_pravega.protocol import naming

__all__ = [
    "LeaseKeeper",
    "TransactionInfo",
    "TransactionManager",
    "TransactionalWriter",
    "TxnStatus",
]

log = logging.getLogger(__name__)

DEFAULT_LEASE_MS = 90_000
#: A commit still COMMITTING after this long is requested again. Pravega 0.13 answers a commit
#: request for a COMMITTING transaction by posting the commit event of its epoch once more (the
#: commit itself happens once: merging a transaction is idempotent). On a cluster whose segment
#: store was lost just before the request, a transaction was seen to stay COMMITTING for over 300 s
#: until then; one more request lets the controller's commit processing pick it up again.
RECOMMIT_AFTER_S = 30.0

#: ``write_keyed`` queues this many events at a time, a segment after another: each segment's
#: session keeps sending (and the server appending) while the next chunk is sorted.
_KEYED_CHUNK = 4096

TxnKey = tuple[str, str, int]


class TransactionManager:
    """Transaction lifecycle through the controller's gRPC API (no writer object needed)."""

    def __init__(
        self,
        controller: ControllerClient,
        segments: SegmentStoreClient | None = None,
        *,
        default_lease_ms: int | None = None,
    ) -> None:
        self.controller = controller
        self.segments = segments or SegmentStoreClient(controller)
        if default_lease_ms is None:
            config = controller.config
            default_lease_ms = (
                config.transaction_lease_ms if config is not None else DEFAULT_LEASE_MS
            )
        self.default_lease_ms = int(default_lease_ms)
        self.recommit_after_s = RECOMMIT_AFTER_S

    def begin(
        self, scope: str, stream: str, lease_ms: int | None = None
    ) -> TransactionInfo:
        """Open a transaction; it is aborted unless pinged within ``lease_ms``."""
        return self.controller.create_transaction(
            scope, stream, self.default_lease_ms if lease_ms is None else lease_ms
        )

    def status(self, scope: str, stream: str, txn_id: int) -> TxnStatus:
        return self.controller.check_transaction_state(scope, stream, _txn_id(txn_id))

    def ping(
        self, scope: str, stream: str, txn_id: int, lease_ms: int | None = None
    ) -> TxnStatus:
        """Renew the lease. OPEN when renewed, COMMITTED/ABORTED when the transaction already ended."""
        return self.controller.ping_transaction(
            scope,
            stream,
            _txn_id(txn_id),
            self.default_lease_ms if lease_ms is None else lease_ms,
        )

    def commit(
        self,
        scope: str,
        stream: str,
        txn_id: int,
        *,
        wait: bool = True,
        timeout_s: float = 120.0,
    ) -> TxnStatus:
        """Commit (idempotent): a committed transaction is fine, an aborted one raises.

        With ``wait`` returns once the controller reports COMMITTED (its events are visible).
        """
        txn_id = _txn_id(txn_id)
        state = self.status(scope, stream, txn_id)
        if state == TxnStatus.UNKNOWN:
            raise TransactionNotFoundError(scope, stream, txn_id)
        if state in (TxnStatus.ABORTING, TxnStatus.ABORTED):
            raise TransactionAbortedError(
                scope, stream, txn_id, "it cannot be committed"
            )
        if state == TxnStatus.OPEN:
            try:
                self.controller.commit_transaction(scope, stream, txn_id)
            except TransactionError:
                # Lost a race (lease expiry, another committer): decide by the state it ended in.
                state = self.status(scope, stream, txn_id)
                if state in (TxnStatus.ABORTING, TxnStatus.ABORTED):
                    raise TransactionAbortedError(
                        scope, stream, txn_id, "it was aborted before the commit"
                    ) from None
                if state not in (TxnStatus.COMMITTING, TxnStatus.COMMITTED):
                    raise
        if not wait:
            return self.status(scope, stream, txn_id)
        final = self.wait_for(
            scope,
            stream,
            txn_id,
            (TxnStatus.COMMITTED, TxnStatus.ABORTED),
            timeout_s=timeout_s,
        )
        if final == TxnStatus.ABORTED:
            raise TransactionAbortedError(
                scope, stream, txn_id, "the controller aborted it while committing"
            )
        return final

    def abort(
        self,
        scope: str,
        stream: str,
        txn_id: int,
        *,
        wait: bool = False,
        timeout_s: float = 60.0,
    ) -> TxnStatus:
        """Abort (idempotent): an aborted or unknown-but-gone transaction is fine, a committed one raises."""
        txn_id = _txn_id(txn_id)
        state = self.status(scope, stream, txn_id)
        if state == TxnStatus.UNKNOWN:
            raise TransactionNotFoundError(scope, stream, txn_id)
        if state in (TxnStatus.COMMITTING, TxnStatus.COMMITTED):
            raise TransactionCommittedError(scope, stream, txn_id, "abort")
        if state == TxnStatus.OPEN:
            try:
                self.controller.abort_transaction(scope, stream, txn_id)
            except TransactionError:
                state = self.status(scope, stream, txn_id)
                if state in (TxnStatus.COMMITTING, TxnStatus.COMMITTED):
                    raise TransactionCommittedError(
                        scope, stream, txn_id, "abort"
                    ) from None
                if state not in (TxnStatus.ABORTING, TxnStatus.ABORTED):
                    raise
        if wait:
            return self.wait_for(
                scope, stream, txn_id, (TxnStatus.ABORTED,), timeout_s=timeout_s
            )
        return self.status(scope, stream, txn_id)

    def wait_for(
        self,
        scope: str,
        stream: str,
        txn_id: int,
        states: Collection[TxnStatus | str],
        *,
        timeout_s: float = 60.0,
        poll_interval_s: float = 0.02,
        recommit: bool = True,
    ) -> TxnStatus:
        """Poll until the transaction is in one of ``states``; returns that state.

        A final state (COMMITTED/ABORTED) that is not awaited ends the wait with an error, since it
        can never change again; so does UNKNOWN unless awaited. While COMMITTED is awaited, a
        transaction COMMITTING for ``self.recommit_after_s`` is requested again, unless ``recommit``
        is False (see RECOMMIT_AFTER_S).
        """
        txn_id = _txn_id(txn_id)
        wanted = {TxnStatus(s) for s in states}
        deadline = time.monotonic() + timeout_s
        delay = poll_interval_s
        nudge = recommit and TxnStatus.COMMITTED in wanted
        committing_since: float | None = None
        while True:
            state = self.status(scope, stream, txn_id)
            if state in wanted:
                return state
            if nudge and state == TxnStatus.COMMITTING:
                now = time.monotonic()
                if committing_since is None:
                    committing_since = now
                elif now - committing_since >= self.recommit_after_s:
                    self._request_commit_again(scope, stream, txn_id, now - committing_since)
                    committing_since = now
            if state == TxnStatus.UNKNOWN:
                raise TransactionNotFoundError(scope, stream, txn_id)
            if state.is_final:
                if state == TxnStatus.ABORTED:
                    raise TransactionAbortedError(
                        scope, stream, txn_id, f"while waiting for {_names(wanted)}"
                    )
                raise TransactionStateError(
                    scope,
                    stream,
                    txn_id,
                    f"transaction {txn_id:032x} on {scope}/{stream} is {state.value}; it will never be {_names(wanted)}",
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TransactionTimeoutError(
                    scope,
                    stream,
                    txn_id,
                    f"transaction {txn_id:032x} on {scope}/{stream} is still {state.value} after {timeout_s:g} s "
                    f"(waiting for {_names(wanted)})",
                )
            time.sleep(min(delay, remaining))
            delay = min(delay * 1.5, 0.5)

    def _request_commit_again(self, scope: str, stream: str, txn_id: int, waited_s: float) -> None:
        log.warning("transaction %032x on %s/%s is still COMMITTING after %.0f s: requesting its commit again "
                    "(the controller posts its commit event once more; it commits once)", txn_id, scope, stream,
                    waited_s)
        try:
            self.controller.commit_transaction(scope, stream, txn_id)
        except PravegaError as exc:  # the wait goes on; its own timeout decides
            log.warning("requesting the commit of %032x again failed (%s); still waiting", txn_id, exc)

    def writer(
        self, scope: str, stream: str, txn: int | TransactionInfo, **options: Any
    ) -> TransactionalWriter:
        return TransactionalWriter(self, scope, stream, txn, **options)


def abort_quietly(manager: TransactionManager, scope: str, stream: str, txn_ids: Iterable[int], *,
                  level: int = logging.WARNING) -> None:
    """Abort each transaction, logging (at ``level``, not raising) one that cannot be: one already
    committed or aborted, or one its lease will end; nothing of an aborted one is ever committed."""
    for txn_id in txn_ids:
        try:
            manager.abort(scope, stream, txn_id)
        except PravegaError as exc:
            log.log(level, "could not abort transaction %032x on %s/%s: %s", txn_id, scope, stream, exc)


def _txn_id(txn_id: int | str | TransactionInfo) -> int:
    return parse_txn_id(txn_id)


def _names(states: Iterable[TxnStatus]) -> str:
    return " or ".join(sorted(s.value for s in states))


class TransactionalWriter(RoutedSegmentWriter):
    """Writes events into an open transaction, from any process; never commits.

    ``txn`` is a :class:`TransactionInfo` (from ``begin``) or just the id: then the transaction's
    segments are rebuilt from the controller (its epoch is ``id >> 96``). Events with the same
    routing key land in the same segment, in order, exactly as with the official client; events
    without one go to a random segment. ``flush`` returns once every event is acknowledged. The
    routing and the appends are :class:`~airflow_provider_pravega.client.writer.RoutedSegmentWriter`'s,
    shared with the plain :class:`~airflow_provider_pravega.client.writer.EventWriter`.
    """

    def __init__(
        self,
        manager: TransactionManager,
        scope: str,
        stream: str,
        txn: int | TransactionInfo,
        *,
        check_open: bool = True,
        **session_options: Any,
    ) -> None:
        self.manager = manager
        self.scope = scope
        self.stream = stream
        if isinstance(txn, TransactionInfo):
            if (txn.scope, txn.stream) != (scope, stream):
                raise ValueError(
                    f"transaction {txn.hex_id} belongs to {txn.scope}/{txn.stream}, not {scope}/{stream}"
                )
            self.txn_id = txn.txn_id
            segments = list(txn.segments)
        else:
            self.txn_id = _txn_id(txn)
            segments = []
        if check_open:
            state = manager.status(scope, stream, self.txn_id)
            self._require_open(state)
        if not segments:
            segments = manager.controller.get_epoch_segments(
                scope, stream, naming.txn_epoch(self.txn_id)
            )
            if not segments:
                raise TransactionNotFoundError(scope, stream, self.txn_id)
        super().__init__(manager.segments, scope, stream, segments, **session_options)

    def __repr__(self) -> str:
        return (
            f"TransactionalWriter({self.scope}/{self.stream}, txn={self.txn_id:032x})"
        )

    def _require_open(self, state: TxnStatus) -> None:
        scope, stream, txn_id = self.scope, self.stream, self.txn_id
        if state == TxnStatus.OPEN:
            return
        if state == TxnStatus.UNKNOWN:
            raise TransactionNotFoundError(scope, stream, txn_id)
        if state in (TxnStatus.ABORTING, TxnStatus.ABORTED):
            raise TransactionAbortedError(
                scope, stream, txn_id, "no more events can be written to it"
            )
        raise TransactionCommittedError(scope, stream, txn_id, "write to")

    def segment_name(self, index: int) -> str:
        """The transaction segment for the index-th segment of the transaction's epoch."""
        parent = naming.qualified_segment_name(
            self.scope, self.stream, self.segments[index].segment_id
        )
        return naming.transaction_segment_name(parent, self.txn_id)

    def _closed_error(self) -> PravegaError:
        return TransactionStateError(
            self.scope,
            self.stream,
            self.txn_id,
            f"{self!r} is closed; create a new writer",
        )

    def _segment_ended(self, index: int, cause: PravegaError) -> PravegaError:
        """Turn a sealed/missing transaction segment into the transaction's real state."""
        try:
            state = self.manager.status(self.scope, self.stream, self.txn_id)
        except PravegaError:
            return cause
        try:
            self._require_open(state)
        except TransactionError as exc:
            return exc
        return cause

    def write_keyed(self, payloads: Sequence[bytes], keys: Sequence[str]) -> int:
        """Queue events, the i-th with routing key ``keys[i]``; returns how many. Each distinct
        key is routed once, and each chunk of events is queued a segment at a time: the events of
        a segment (so those of a key) keep their order, as with ``write_event`` one by one. A
        transaction's segments are those of its epoch (never sealed under it), so nothing here
        moves to a successor segment."""
        if len(self.segments) == 1:
            return self.write_events(payloads)
        route = {key: self.index_for(key) for key in set(keys)}
        indexes = list(map(route.__getitem__, keys))
        for start in range(0, len(payloads), _KEYED_CHUNK):
            groups: list[list[bytes]] = [[] for _ in self.segments]
            appends = [group.append for group in groups]
            for payload, index in zip(payloads[start:start + _KEYED_CHUNK], indexes[start:start + _KEYED_CHUNK]):
                appends[index](payload)
            for index, group in enumerate(groups):
                if group:
                    (self._sessions[index] or self._session(index)).write_events(group)
        self.events_written += len(payloads)
        return len(payloads)

    def flush(self, timeout_s: float | None = None, *, check_open: bool = True) -> None:
        """Return only when the segment store has acknowledged every event written so far.

        With ``check_open`` the transaction's state is checked afterwards: a transaction that was
        aborted meanwhile (e.g. its lease expired) raises TransactionAbortedError, because the
        segment store accepts and discards appends to aborted transactions.
        """
        self._flush_sessions(timeout_s)
        if check_open:
            self._require_open(
                self.manager.status(self.scope, self.stream, self.txn_id)
            )


class LeaseKeeper:
    """Keeps transactions alive from any process: pings each until it is committed or aborted.

    ``on_failure(key, error)`` is called (from the keeper thread) when a kept transaction is
    aborted, unknown or cannot be renewed; the same errors are collected in ``failures`` and
    raised by ``check()``. Transactions that end COMMITTED are dropped silently.
    """

    def __init__(
        self,
        manager: TransactionManager,
        interval_s: float | None = None,
        *,
        lease_ms: int | None = None,
        on_failure: Callable[[TxnKey, PravegaError], None] | None = None,
        start: bool = True,
    ) -> None:
        self.manager = manager
        self.lease_ms = manager.default_lease_ms if lease_ms is None else int(lease_ms)
        # Ping three times per lease by default, so one lost ping never loses a transaction.
        self.interval_s = (
            float(interval_s)
            if interval_s is not None
            else max(self.lease_ms / 3000.0, 0.05)
        )
        self.on_failure = on_failure
        self.failures: dict[TxnKey, PravegaError] = {}
        self.pings = 0
        self._kept: dict[
            TxnKey, float
        ] = {}  # -> monotonic time of the last successful ping
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="pravega-lease-keeper", daemon=True
            )
            self._thread.start()

    def add(self, scope: str, stream: str, txn_id: int | TransactionInfo) -> None:
        key = (scope, stream, _txn_id(txn_id))
        with self._lock:
            self._kept.setdefault(key, time.monotonic())
            self.failures.pop(key, None)
        self._wake.set()

    def remove(self, scope: str, stream: str, txn_id: int | TransactionInfo) -> None:
        with self._lock:
            self._kept.pop((scope, stream, _txn_id(txn_id)), None)

    def kept(self) -> set[TxnKey]:
        with self._lock:
            return set(self._kept)

    def check(self) -> None:
        """Raise the first failure seen (e.g. TransactionAbortedError), if any."""
        with self._lock:
            failures = list(self.failures.values())
        if failures:
            raise failures[0]

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(5.0, self.interval_s * 2))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fail(self, key: TxnKey, error: PravegaError) -> None:
        with self._lock:
            self._kept.pop(key, None)
            self.failures[key] = error
        log.warning(
            "lease keeper gave up on transaction %032x of %s/%s: %s",
            key[2],
            key[0],
            key[1],
            error,
        )
        if self.on_failure is not None:
            try:
                self.on_failure(key, error)
            except Exception:
                log.exception("lease keeper failure callback raised")

    def ping_all(self) -> None:
        """One round of pings (also what the thread does every ``interval_s``)."""
        for key in sorted(self.kept()):
            if self._stop.is_set():
                return
            scope, stream, txn_id = key
            try:
                state = self.manager.ping(scope, stream, txn_id, self.lease_ms)
            except TransactionError as exc:  # unknown id, lease refused
                self._fail(key, exc)
                continue
            except (
                PravegaError
            ) as exc:  # controller unreachable: retry, unless the lease surely ran out
                with self._lock:
                    last_ok = self._kept.get(key)
                if (
                    last_ok is not None
                    and time.monotonic() - last_ok > self.lease_ms / 1000.0
                ):
                    self._fail(key, exc)
                else:
                    log.info(
                        "lease keeper could not ping %032x (%s); retrying", txn_id, exc
                    )
                continue
            self.pings += 1
            if state == TxnStatus.OPEN:
                with self._lock:
                    if key in self._kept:
                        self._kept[key] = time.monotonic()
            elif state == TxnStatus.COMMITTED:
                with self._lock:
                    self._kept.pop(key, None)
            else:
                self._fail(
                    key,
                    TransactionAbortedError(
                        scope, stream, txn_id, "found by the lease keeper"
                    ),
                )

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.ping_all()
            except Exception:  # never let the thread die silently
                log.exception("lease keeper round failed")
            self._wake.clear()
            self._wake.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
