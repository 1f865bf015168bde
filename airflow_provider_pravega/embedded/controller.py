"""The embedded Pravega controller: Pravega's controller gRPC API over a durable metadata model.

The official ``pravega`` client (and our own client layer) talk to this servicer exactly as to a
real controller. It decides which segments exist — streams, epochs, scaling, transactions,
truncation — and drives the segment store through :class:`~.backend.SegmentBackend`.

How the client reads answers shapes every reply (notes §5.2): an exception or a FAILURE status
makes the official client retry for ~61 s, so expected situations get their definite enum value
and bad input fails fast with ``INVALID_ARGUMENT`` / ``NOT_FOUND``. Only unexpected failures
(a backend error) answer ``INTERNAL``, which the client retries — right for a transient problem,
and every operation here is safe to repeat.

Durability and order of work (why recovery is correct):

* every metadata change is a record in :class:`~.controller_log.MetadataLog`, durable before the
  RPC answers;
* work on the segment store happens **after** the record that announces it (transaction created,
  commit/abort started, stream sealed/being deleted, truncated) — so :meth:`recover` sees the intent
  and repeats the (idempotent) backend calls — **except** where the record makes segments visible to
  clients: new stream segments and a scale's new segments are created **before** their record, so
  nobody is ever told about a segment that does not exist; a crash in between leaves only empty,
  unreferenced segments that a later create re-uses;
* old segments are sealed only after the epoch that replaces them is recorded, so a writer that
  finds its segment sealed always finds its successors.

Concurrency: grpcio calls the servicer from a thread pool. ``_lock`` guards the in-memory state
and log appends and is never held across a backend call or a disk flush. Per stream, a
shared/exclusive gate orders multi-step operations: transaction create/commit/abort share it;
seal, delete, truncate, scale and rolling commits (which change epochs) take it exclusively. A
striped per-transaction lock serialises commit/abort/expiry of one transaction. Lock order:
gate → transaction lock → ``_lock``.

The controller's API comes in parts of one job each, mixins of
:class:`~.controller_base.ControllerBase` (the shared state, locks and durability helpers):
scopes and streams (:mod:`~.controller_streams`), segment queries (:mod:`~.controller_segments`),
scaling and auto-scaling (:mod:`~.controller_scaling`), transactions
(:mod:`~.controller_transactions`), their leases and the lease reaper (:mod:`~.controller_leases`)
and the retention service (:mod:`~.controller_retention`). Every RPC passes through
:func:`~.controller_access.rpc` (access rules, authentication, failures as gRPC statuses). This
module combines them: construction, recovery, the background threads' lifecycle, and the RPCs
about the server itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from airflow_provider_pravega.embedded import auth
from airflow_provider_pravega.embedded.auth import (
    Authenticator,
    Permission,
    TokenAuthority,
)
from airflow_provider_pravega.embedded.backend import SegmentBackend
from airflow_provider_pravega.embedded.controller_access import ControllerAccess, RpcFailure, rpc
from airflow_provider_pravega.embedded.controller_config import ControllerConfig
from airflow_provider_pravega.embedded.controller_leases import Leases
from airflow_provider_pravega.embedded.controller_retention import Retention
from airflow_provider_pravega.embedded.controller_scaling import Scaling
from airflow_provider_pravega.embedded.controller_segments import SegmentQueries
from airflow_provider_pravega.embedded.controller_state import (
    ABORTING,
    COMMITTING,
    DELETING,
    OPEN,
    SEALED,
)
from airflow_provider_pravega.embedded.controller_streams import ScopesAndStreams
from airflow_provider_pravega.embedded.controller_transactions import Transactions
from airflow_provider_pravega.protocol import controller_pb2 as pb
from airflow_provider_pravega.protocol import controller_pb2_grpc as pb_grpc
from airflow_provider_pravega.protocol.naming import qualified_segment_name

log = logging.getLogger(__name__)


class EmbeddedController(
    ScopesAndStreams,
    SegmentQueries,
    Scaling,
    Transactions,
    Leases,
    Retention,
    pb_grpc.ControllerServiceServicer,
):
    """Pravega's ControllerService over :class:`ControllerState`, a metadata log and a segment backend."""

    def __init__(
        self,
        backend: SegmentBackend,
        segment_store_host: str,
        segment_store_port: int,
        data_dir: Path,
        config: ControllerConfig | None = None,
        *,
        authenticator: Authenticator | None = None,
        tokens: TokenAuthority | None = None,
        locate: Callable[[str], tuple[str, int]] | None = None,
    ) -> None:
        if (authenticator is None) != (tokens is None):
            raise ValueError("authentication needs both an authenticator and a token authority")
        config = config or ControllerConfig()
        access = None
        if authenticator is not None and tokens is not None:
            access = ControllerAccess(authenticator, tokens, pravega_token_rules=config.pravega_token_rules)
        super().__init__(backend, data_dir, config, access)
        self._ss_host = segment_store_host
        self._ss_port = segment_store_port
        #: ``locate(qualified segment name) -> (host, port)`` of the store owning the segment's
        #: container (a cluster); None: every segment is on the one segment store.
        self._locate = locate
        self._recovered = False
        self._reaper: threading.Thread | None = None
        self._retention: threading.Thread | None = None
        self._controller_endpoint: tuple[str, int] | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def config(self) -> ControllerConfig:
        return self._config

    def advertise_controller(self, host: str, port: int) -> None:
        """Tell the controller its own gRPC endpoint (answered by getControllerServerList)."""
        self._controller_endpoint = (host, port)

    def recover(self) -> None:
        """Rebuild the state from disk and finish work a crash interrupted. Call once, before serving.

        Repeats, idempotently: segment creation of every live segment and of open transactions,
        merges of COMMITTING transactions (rolling ones included), discards of ABORTING ones, seals
        of replaced segments and of sealed streams, truncation and deletion at the head, deletion
        of streams that were being deleted. Lease deadlines are wall-clock times, so an open
        transaction still expires when its lease runs out, restart or not.
        """
        if self._recovered:
            raise RuntimeError("EmbeddedController.recover() was already called")
        snapshot, records = self._log.open()
        with self._lock:
            if snapshot is not None:
                self._state.load_json(snapshot)
            for record in records:
                self._state.apply(record)
            streams = list(self._state.iter_streams())
        for stream in streams:
            try:
                self._recover_stream(stream.scope, stream.name)
            except Exception as exc:
                raise RuntimeError(f"controller recovery of stream {stream.scope}/{stream.name} failed: {exc}") from exc
        with self._lock:
            if self._log.wants_snapshot():
                self._log.write_snapshot(self._state.to_json())
        self._recovered = True
        log.info(
            "controller recovered %d scopes, %d streams from %s (%d log records replayed)",
            len(self._state.scopes),
            len(streams),
            self._dir,
            len(records),
        )

    def _recover_stream(self, scope: str, name: str) -> None:
        with self._lock:
            stream = self._state.streams[(scope, name)]
            if stream.state == DELETING:
                deleting = True
            else:
                deleting = False
                live = [s.segment_id for s in stream.segments.values() if not s.deleted]
                txns = [(t.txn_id, t.state) for t in stream.txns.values()]
        if deleting:
            self._delete_stream_data(scope, name)
            return
        for sid in live:
            self._backend.create_segment(qualified_segment_name(scope, name, sid))
        for txn_id, state in txns:
            if state == OPEN:
                for seg_name in self._txn_segment_names(scope, name, txn_id):
                    self._backend.create_segment(seg_name)
            elif state == COMMITTING:
                self._complete_commit(scope, name, txn_id)
            elif state == ABORTING:
                self._complete_abort(scope, name, txn_id)
        with self._lock:
            stream = self._state.streams[(scope, name)]
            to_seal = [s.segment_id for s in stream.segments.values() if not s.deleted and s.sealed_epoch is not None]
            if stream.state == SEALED:
                to_seal += list(stream.active_epoch.segment_ids)
            head = dict(stream.head)
            deleted = [s.segment_id for s in stream.segments.values() if s.deleted]
        for sid in to_seal:
            self._backend.seal_segment(qualified_segment_name(scope, name, sid))
        for sid, offset in head.items():
            self._backend.truncate_segment(qualified_segment_name(scope, name, sid), offset)
        for sid in deleted:
            self._backend.delete_segment(qualified_segment_name(scope, name, sid))

    def start(self) -> None:
        """Start the lease reaper (recovering first if that was not done)."""
        if not self._recovered:
            self.recover()
        if self._reaper is not None:
            return
        self._reaper = threading.Thread(target=self._reap_loop, name="pravega-controller-leases", daemon=True)
        self._reaper.start()
        self._retention = threading.Thread(target=self._retention_loop, name="pravega-controller-retention",
                                           daemon=True)
        self._retention.start()

    def stop(self) -> None:
        """Stop the reaper, refuse further RPCs, and close the metadata log."""
        self._stopped = True
        self._stop_event.set()
        for thread in (self._reaper, self._retention):
            if thread is not None:
                thread.join(timeout=10)
        self._reaper = self._retention = None
        with self._lock:
            self._log.close()

    # ------------------------------------------------------------------ cluster

    @rpc
    def getControllerServerList(self, request: pb.ServerRequest, context: grpc.ServicerContext) -> pb.ServerResponse:
        endpoint = self._controller_endpoint
        if endpoint is None:
            return pb.ServerResponse()
        return pb.ServerResponse(nodeURI=[pb.NodeUri(endpoint=endpoint[0], port=endpoint[1])])

    @rpc
    def getDelegationToken(self, request: pb.StreamInfo, context: grpc.ServicerContext) -> pb.DelegationToken:
        if self._access is None:
            return pb.DelegationToken(delegationToken="")  # no authentication: tokens are empty
        scope, name = self._names(request)
        account = self._access.caller
        permission = self._access.token_permission(account, scope, name, request.accessOperation)
        if permission == Permission.NONE:
            wanted = pb.StreamInfo.AccessOperation.Name(request.accessOperation)
            raise RpcFailure(grpc.StatusCode.PERMISSION_DENIED,
                             f"user {account.username!r} may not have a delegation token for {scope}/{name} "
                             f"(access {wanted}, resource {auth.stream_auth_resource(scope, name)})")
        token = self._access.issue(account, scope, name, permission)
        return pb.DelegationToken(delegationToken=token)

    @rpc
    def getURI(self, request: pb.SegmentId, context: grpc.ServicerContext) -> pb.NodeUri:
        # One store: every segment of every stream (reader-group table streams included) lives there.
        # A cluster: the store that owns the segment's container now.
        if self._locate is not None:
            name = qualified_segment_name(request.streamInfo.scope, request.streamInfo.stream, request.segmentId)
            host, port = self._locate(name)
            return pb.NodeUri(endpoint=host, port=port)
        return pb.NodeUri(endpoint=self._ss_host, port=self._ss_port)

    # ------------------------------------------------------------------ introspection (tests, tools)

    def snapshot_state(self) -> dict[str, Any]:
        """A JSON copy of the whole metadata state."""
        with self._lock:
            return self._state.to_json()


__all__ = ["ControllerConfig", "EmbeddedController"]
