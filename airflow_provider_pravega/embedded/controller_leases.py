"""Transaction leases: the lease a create or ping is granted, and the lease reaper, the thread that
aborts every OPEN transaction whose lease ran out.

Deadlines are wall-clock times kept in the metadata, so a transaction expires on time across a
restart too.
"""

from __future__ import annotations

import logging

import grpc

from airflow_provider_pravega.embedded.controller_access import RpcFailure
from airflow_provider_pravega.embedded.controller_base import ControllerBase
from airflow_provider_pravega.embedded.controller_state import DELETING, OPEN

log = logging.getLogger(__name__)


class Leases(ControllerBase):
    """Granting leases and aborting the transactions whose lease ran out."""

    def _effective_lease(self, lease: int) -> int | None:
        """The lease to grant, or None when it exceeds max_lease_ms (and no cap is configured)."""
        if lease <= 0:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"lease must be a positive number of ms, got {lease}")
        if self._config.lease_cap_ms is not None:
            return min(lease, self._config.lease_cap_ms)
        if lease < self._config.min_lease_ms:  # Pravega's words and status (an IllegalArgumentException)
            raise RpcFailure(grpc.StatusCode.UNKNOWN, "lease should be greater than minimum lease")
        if lease > self._config.max_lease_ms:
            return None
        return lease

    def _abort_expired_locked(self, scope: str, name: str, txn_id: int) -> bool:
        """Abort an OPEN transaction whose lease ran out (caller holds gate and txn lock)."""
        with self._lock:
            stream = self._state.stream(scope, name)
            txn = stream.txns.get(txn_id) if stream is not None else None
            if txn is None or txn.state != OPEN or self._now_ms() <= txn.deadline_ms:
                return False
            seq = self._persist(self._txn_record("txn_aborting", scope, name, txn_id, reason="lease expired"))
        self._durable(seq)
        log.info("transaction %032x on %s/%s: lease expired, aborting", txn_id, scope, name)
        self._complete_abort(scope, name, txn_id)
        return True

    def _expire(self, scope: str, name: str, txn_id: int) -> bool:
        with self._gate(scope, name).shared(), self._txn_lock(scope, name, txn_id):
            return self._abort_expired_locked(scope, name, txn_id)

    def _reap_loop(self) -> None:
        while not self._stop_event.wait(self._config.lease_check_interval_s):
            if self._log_failure is not None:
                continue
            try:
                self.reap_expired()
            except Exception:  # keep reaping; the next round retries
                log.exception("lease reaper round failed")

    def reap_expired(self) -> int:
        """Abort every OPEN transaction whose lease has run out; returns how many were aborted."""
        now = self._now_ms()
        with self._lock:
            due = [
                (s.scope, s.name, t.txn_id)
                for s in self._state.iter_streams()
                if s.state != DELETING
                for t in list(s.txns.values())
                if t.state == OPEN and now > t.deadline_ms
            ]
        aborted = 0
        for scope, name, txn_id in due:
            if self._stopped:
                break
            if self._expire(scope, name, txn_id):
                aborted += 1
        return aborted
