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
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

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
from airflow_provider_pravega.embedded.controller_log import MetadataLog
from airflow_provider_pravega.embedded.controller_state import (
    ABORTED,
    ABORTING,
    ACTIVE,
    COMMITTED,
    COMMITTING,
    DELETING,
    OPEN,
    SEALED,
    RETENTION_SIZE,
    RETENTION_TIME,
    ControllerState,
    RetentionCut,
    RollPlan,
    StreamConfigRecord,
    StreamRecord,
    TxnRecord,
    number_of,
    retention_truncation_cut,
    segment_id_of,
)
from airflow_provider_pravega.protocol import controller_pb2 as pb
from airflow_provider_pravega.protocol import controller_pb2_grpc as pb_grpc
from airflow_provider_pravega.protocol.naming import (
    bits_to_txn_id,
    qualified_segment_name,
    transaction_segment_name,
    txn_id_to_bits,
    validate_scope_name,
    validate_stream_name,
)

log = logging.getLogger(__name__)

# More segments than this in one epoch is almost certainly a mistake (each is a file and a writer
# connection); refuse instead of creating them.
MAX_SEGMENTS_PER_EPOCH = 4096
_TOKEN_PREFIX = "after:"

T = TypeVar("T")


def valid_name(name: str, kind: str = "stream") -> bool:
    """Whether the controller accepts ``name``: what Pravega's controller accepts (NameUtils
    validateScopeName / validateStreamName) — ASCII letters, digits, '.', '-', after an optional
    leading '_' (internal names), at most 255 characters."""
    validate = validate_scope_name if kind == "scope" else validate_stream_name
    try:
        validate(name, allow_internal=True)
    except ValueError:
        return False
    return True


def _now_ms() -> int:
    return int(time.time() * 1000)


def _txn_failure(action: str, scope: str, name: str, txn_id: int, why: str) -> pb.TxnStatus:
    """Pravega 0.13's controller answers every refused commit or abort with FAILURE (its reason
    goes to its log only); so does this one."""
    log.info("%s of transaction %032x on %s/%s refused: %s", action, txn_id, scope, name, why)
    return pb.TxnStatus(status=pb.TxnStatus.FAILURE)


class _Gate:
    """A shared/exclusive lock that lets a waiting exclusive holder in before new shared ones."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive or self._waiting:
                self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                if not self._shared:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            try:
                while self._exclusive or self._shared:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class EmbeddedController(pb_grpc.ControllerServiceServicer):
    """Pravega's ControllerService over :class:`ControllerState`, a metadata log and a segment backend."""

    _TXN_LOCK_STRIPES = 64

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
        self._access: ControllerAccess | None = None  # None: no authentication (every call allowed, tokens "")
        if authenticator is not None and tokens is not None:
            self._access = ControllerAccess(authenticator, tokens, pravega_token_rules=config.pravega_token_rules)
        #: RPC name -> calls served (tests and benchmarks count what a client costs the controller).
        self.rpc_calls: collections.Counter[str] = collections.Counter()
        self._rpc_lock = threading.Lock()
        self._backend = backend
        self._ss_host = segment_store_host
        self._ss_port = segment_store_port
        #: ``locate(qualified segment name) -> (host, port)`` of the store owning the segment's
        #: container (a cluster); None: every segment is on the one segment store.
        self._locate = locate
        self._config = config
        self._dir = Path(data_dir) / "controller"
        self._log = MetadataLog(self._dir, snapshot_every=self._config.snapshot_every)
        self._state = ControllerState(
            finished_txn_limit=self._config.finished_txn_limit,
            finished_txn_retention_ms=self._config.finished_txn_retention_ms,
        )
        self._lock = threading.RLock()
        self._gates: dict[tuple[str, str], _Gate] = {}
        self._txn_locks = [threading.Lock() for _ in range(self._TXN_LOCK_STRIPES)]
        self._recovered = False
        self._stopped = False
        self._log_failure: BaseException | None = None  # fail-stop after a metadata write error
        self._stop_event = threading.Event()
        self._reaper: threading.Thread | None = None
        self._retention: threading.Thread | None = None
        self._cold: dict[tuple[str, str, int], int] = {}  # auto-scaling's cold markers -> valid until (ms)
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

    # ------------------------------------------------------------------ helpers

    def _gate(self, scope: str, name: str) -> _Gate:
        with self._lock:
            gate = self._gates.get((scope, name))
            if gate is None:
                gate = self._gates[(scope, name)] = _Gate()
            return gate

    def _txn_lock(self, scope: str, name: str, txn_id: int) -> threading.Lock:
        return self._txn_locks[hash((scope, name, txn_id)) % self._TXN_LOCK_STRIPES]

    def _persist(self, record: dict[str, Any]) -> int:
        """Apply a record and append it to the log (caller holds ``_lock``); returns its seq.

        A failed write leaves memory ahead of disk, so the controller stops serving (fail-stop):
        a restart rebuilds the state from what is durable.
        """
        self._state.apply(record)
        try:
            seq = self._log.append(record)
            if self._log.wants_snapshot():
                self._log.write_snapshot(self._state.to_json())
        except OSError as exc:
            self._log_failure = exc
            log.critical("controller metadata log write failed; refusing further requests: %s", exc)
            raise
        return seq

    def _durable(self, seq: int) -> None:
        try:
            self._log.sync(seq)
        except OSError as exc:  # after a failed fsync the page cache cannot be trusted either
            self._log_failure = exc
            log.critical("controller metadata log sync failed; refusing further requests: %s", exc)
            raise

    def _read(self, fn: Callable[[], T]) -> T:
        """Run a read under the lock; answer only once whatever it saw is durable."""
        with self._lock:
            result = fn()
            seq = self._log.last_seq
        self._durable(seq)
        return result

    @staticmethod
    def _names(info: pb.StreamInfo) -> tuple[str, str]:
        if not info.scope or not info.stream:
            raise RpcFailure(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"streamInfo must name a scope and a stream, got scope={info.scope!r} stream={info.stream!r}",
            )
        return info.scope, info.stream

    def _stream_or_fail(self, scope: str, name: str) -> StreamRecord:
        stream = self._state.stream(scope, name)
        if stream is None:
            where = "" if scope in self._state.scopes else f" (scope {scope} does not exist)"
            raise RpcFailure(grpc.StatusCode.NOT_FOUND, f"stream {scope}/{name} does not exist{where}")
        return stream

    @staticmethod
    def _info(scope: str, name: str) -> pb.StreamInfo:
        return pb.StreamInfo(scope=scope, stream=name)

    def _may(self, resource: str, needed: Permission) -> bool:
        """Whether the caller of the current RPC has ``needed`` on ``resource`` (always, without auth)."""
        return self._access is None or self._access.may(resource, needed)

    def _range(self, stream: StreamRecord, segment_id: int) -> pb.SegmentRange:
        seg = stream.segments[segment_id]
        return pb.SegmentRange(
            segmentId=pb.SegmentId(streamInfo=self._info(stream.scope, stream.name), segmentId=segment_id),
            minKey=seg.min_key,
            maxKey=seg.max_key,
        )

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

    @staticmethod
    def _page(names: list[str], token: str, size: int) -> tuple[list[str], str]:
        """One page of sorted ``names`` after ``token``, and the token for the next page."""
        if token and not token.startswith(_TOKEN_PREFIX):
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"unknown continuation token {token!r}")
        after = token[len(_TOKEN_PREFIX) :] if token else None
        rest = [n for n in names if after is None or n > after]
        page = rest[:size]
        # The official client stops at the first empty page, and needs a token with every page.
        next_token = _TOKEN_PREFIX + page[-1] if page else token
        return page, next_token

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

    # ------------------------------------------------------------------ scopes

    @rpc
    def createScope(self, request: pb.ScopeInfo, context: grpc.ServicerContext) -> pb.CreateScopeStatus:
        scope = request.scope
        if not valid_name(scope, "scope"):
            return pb.CreateScopeStatus(status=pb.CreateScopeStatus.INVALID_SCOPE_NAME)
        with self._lock:
            if scope in self._state.scopes:
                return pb.CreateScopeStatus(status=pb.CreateScopeStatus.SCOPE_EXISTS)
            seq = self._persist({"op": "scope_created", "scope": scope, "ts": _now_ms()})
        self._durable(seq)
        return pb.CreateScopeStatus(status=pb.CreateScopeStatus.SUCCESS)

    @rpc
    def deleteScope(self, request: pb.ScopeInfo, context: grpc.ServicerContext) -> pb.DeleteScopeStatus:
        scope = request.scope
        with self._lock:
            if scope not in self._state.scopes:
                return pb.DeleteScopeStatus(status=pb.DeleteScopeStatus.SCOPE_NOT_FOUND)
            if any(sc == scope for sc, _ in self._state.streams):
                return pb.DeleteScopeStatus(status=pb.DeleteScopeStatus.SCOPE_NOT_EMPTY)
            seq = self._persist({"op": "scope_deleted", "scope": scope, "ts": _now_ms()})
        self._durable(seq)
        return pb.DeleteScopeStatus(status=pb.DeleteScopeStatus.SUCCESS)

    @rpc
    def listScopes(self, request: pb.ScopesRequest, context: grpc.ServicerContext) -> pb.ScopesResponse:
        names = self._read(lambda: sorted(self._state.scopes))
        if not self._may(auth.ROOT_RESOURCE, Permission.READ):
            names = [n for n in names if self._may(auth.scope_resource(n), Permission.READ)]
        page, token = self._page(names, request.continuationToken.token, self._config.list_page_size)
        return pb.ScopesResponse(scopes=page, continuationToken=pb.ContinuationToken(token=token))

    @rpc
    def checkScopeExists(self, request: pb.ScopeInfo, context: grpc.ServicerContext) -> pb.ExistsResponse:
        return pb.ExistsResponse(exists=self._read(lambda: request.scope in self._state.scopes))

    # ------------------------------------------------------------------ streams

    def _config_record(self, request: pb.StreamConfig) -> StreamConfigRecord:
        if not request.HasField("scalingPolicy"):
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, "scalingPolicy is required")
        sp = request.scalingPolicy
        if sp.scaleType not in pb.ScalingPolicy.ScalingPolicyType.values():
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"unknown scaleType {sp.scaleType}")
        if not 1 <= sp.minNumSegments <= MAX_SEGMENTS_PER_EPOCH:
            raise RpcFailure(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"minNumSegments must be within 1..{MAX_SEGMENTS_PER_EPOCH}, got {sp.minNumSegments}",
            )
        retention = None
        if request.HasField("retentionPolicy"):
            rp = request.retentionPolicy
            if rp.retentionType not in pb.RetentionPolicy.RetentionPolicyType.values():
                raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"unknown retentionType {rp.retentionType}")
            if rp.retentionParam < 0:
                raise RpcFailure(
                    grpc.StatusCode.INVALID_ARGUMENT, f"retentionParam must not be negative, got {rp.retentionParam}"
                )
            # Like Pravega: a policy of type UNKNOWN (the official client's StreamRetentionPolicy.none())
            # is no retention policy, and getStreamConfiguration then has none.
            if rp.retentionType != pb.RetentionPolicy.UNKNOWN:
                retention = (rp.retentionType, rp.retentionParam, rp.retentionMax)
        tags = tuple(request.tags.tag) if request.HasField("tags") else None
        return StreamConfigRecord(sp.scaleType, sp.targetRate, sp.scaleFactor, sp.minNumSegments, retention, tags)

    def _config_message(self, stream: StreamRecord) -> pb.StreamConfig:
        c = stream.config
        msg = pb.StreamConfig(
            streamInfo=self._info(stream.scope, stream.name),
            scalingPolicy=pb.ScalingPolicy(
                scaleType=c.scale_type,
                targetRate=c.target_rate,
                scaleFactor=c.scale_factor,
                minNumSegments=c.min_num_segments,
            ),
        )
        if c.retention is not None:
            msg.retentionPolicy.CopyFrom(
                pb.RetentionPolicy(
                    retentionType=c.retention[0], retentionParam=c.retention[1], retentionMax=c.retention[2]
                )
            )
        # Pravega always answers with a tag list (empty when the stream has none): the official
        # client's get_stream_tags then returns [] rather than None.
        msg.tags.CopyFrom(pb.Tags(tag=list(c.tags or ())))
        return msg

    @rpc
    def createStream(self, request: pb.StreamConfig, context: grpc.ServicerContext) -> pb.CreateStreamStatus:
        info = request.streamInfo
        if not valid_name(info.stream):
            return pb.CreateStreamStatus(status=pb.CreateStreamStatus.INVALID_STREAM_NAME)
        if request.HasField("scalingPolicy") and request.scalingPolicy.minNumSegments < 1:
            return pb.CreateStreamStatus(status=pb.CreateStreamStatus.FAILURE)  # as Pravega 0.13
        config = self._config_record(request)
        scope, name = info.scope, info.stream
        n = config.min_num_segments
        with self._gate(scope, name).exclusive():
            with self._lock:
                if scope not in self._state.scopes:
                    return pb.CreateStreamStatus(status=pb.CreateStreamStatus.SCOPE_NOT_FOUND)
                if (scope, name) in self._state.streams:
                    return pb.CreateStreamStatus(status=pb.CreateStreamStatus.STREAM_EXISTS)
                first = self._state.safe_start_numbers.get((scope, name), 0)  # after a deleted namesake's
            # Equal key ranges; i/n (not i*(1/n)) makes the last maxKey exactly 1.0, which the client asserts.
            segments = [[segment_id_of(0, first + i), i / n, (i + 1) / n] for i in range(n)]
            # Segments first, then the record that makes the stream visible (see module docstring).
            for sid, _, _ in segments:
                self._backend.create_segment(qualified_segment_name(scope, name, sid))
            with self._lock:
                if scope not in self._state.scopes:  # deleted meanwhile
                    return pb.CreateStreamStatus(status=pb.CreateStreamStatus.SCOPE_NOT_FOUND)
                ts = _now_ms()
                seq = self._persist(
                    {
                        "op": "stream_created",
                        "scope": scope,
                        "stream": name,
                        "config": config.to_json(),
                        "segments": segments,
                        "ts": ts,
                        # transaction ids start from the creation time, so a re-created stream of the
                        # same name never hands out an id an old client may still hold
                        "txn_counter": ts << 20,
                    }
                )
            self._durable(seq)
        return pb.CreateStreamStatus(status=pb.CreateStreamStatus.SUCCESS)

    def _update_status_for_missing(self, scope: str) -> pb.UpdateStreamStatus:
        # Pravega 0.13 looks the stream up only: a missing scope is STREAM_NOT_FOUND too.
        return pb.UpdateStreamStatus(status=pb.UpdateStreamStatus.STREAM_NOT_FOUND)

    @rpc
    def updateStream(self, request: pb.StreamConfig, context: grpc.ServicerContext) -> pb.UpdateStreamStatus:
        scope, name = self._names(request.streamInfo)
        config = self._config_record(request)
        with self._lock:
            stream = self._state.stream(scope, name)
            if stream is None:
                return self._update_status_for_missing(scope)
            if stream.state == SEALED:
                return pb.UpdateStreamStatus(status=4)  # Pravega's STREAM_SEALED (not in our .proto)
            seq = self._persist(
                {"op": "stream_updated", "scope": scope, "stream": name, "config": config.to_json(), "ts": _now_ms()}
            )
        self._durable(seq)
        self._scale_to_policy(scope, name)
        return pb.UpdateStreamStatus(status=pb.UpdateStreamStatus.SUCCESS)

    def _scale_to_policy(self, scope: str, name: str) -> None:
        """Like Pravega 0.13's UpdateStreamTask: when the active segments are fewer than the policy's
        minimum, or (fixed policy) not exactly that many, seal them all and continue in a new epoch
        of ``minNumSegments`` equal key ranges."""
        with self._gate(scope, name).exclusive():
            with self._lock:
                stream = self._state.stream(scope, name)
                if stream is None or stream.state != ACTIVE:
                    return
                n = stream.config.min_num_segments
                active = sorted(stream.active_epoch.segment_ids)
                fixed = stream.config.scale_type == pb.ScalingPolicy.FIXED_NUM_SEGMENTS
                if len(active) > n and not fixed or len(active) == n:
                    return
            self._scale_locked(scope, name, active, [(i / n, (i + 1) / n) for i in range(n)])

    @rpc
    def getStreamConfiguration(self, request: pb.StreamInfo, context: grpc.ServicerContext) -> pb.StreamConfig:
        scope, name = self._names(request)
        return self._read(lambda: self._config_message(self._stream_or_fail(scope, name)))

    @rpc
    def sealStream(self, request: pb.StreamInfo, context: grpc.ServicerContext) -> pb.UpdateStreamStatus:
        scope, name = self._names(request)
        with self._gate(scope, name).exclusive():
            with self._lock:
                stream = self._state.stream(scope, name)
                if stream is None:
                    return self._update_status_for_missing(scope)
                pending = [(t.txn_id, t.state) for t in stream.txns.values() if t.state in (OPEN, COMMITTING, ABORTING)]
            # Like Pravega: open transactions are aborted; commits already started are finished first.
            for txn_id, state in pending:
                with self._txn_lock(scope, name, txn_id):
                    if state == OPEN:
                        with self._lock:
                            seq = self._persist(
                                self._txn_record("txn_aborting", scope, name, txn_id, reason="stream sealed")
                            )
                        self._durable(seq)
                        self._complete_abort(scope, name, txn_id)
                    elif state == COMMITTING:
                        self._complete_commit(scope, name, txn_id)
                    else:
                        self._complete_abort(scope, name, txn_id)
            with self._lock:
                stream = self._state.streams[(scope, name)]
                seq = None
                if stream.state != SEALED:
                    seq = self._persist({"op": "stream_sealed", "scope": scope, "stream": name, "ts": _now_ms()})
                active = list(stream.active_epoch.segment_ids)
            if seq is not None:
                self._durable(seq)
            for sid in active:  # also when already sealed: repeating is harmless and heals a crash
                self._backend.seal_segment(qualified_segment_name(scope, name, sid))
        return pb.UpdateStreamStatus(status=pb.UpdateStreamStatus.SUCCESS)

    @rpc
    def deleteStream(self, request: pb.StreamInfo, context: grpc.ServicerContext) -> pb.DeleteStreamStatus:
        scope, name = self._names(request)
        with self._gate(scope, name).exclusive():
            with self._lock:
                stream = self._state.stream(scope, name)
                if stream is None:
                    return pb.DeleteStreamStatus(status=pb.DeleteStreamStatus.STREAM_NOT_FOUND)
                if stream.state != SEALED:
                    return pb.DeleteStreamStatus(status=pb.DeleteStreamStatus.STREAM_NOT_SEALED)
                seq = self._persist({"op": "stream_deleting", "scope": scope, "stream": name, "ts": _now_ms()})
            self._durable(seq)
            self._delete_stream_data(scope, name)
        return pb.DeleteStreamStatus(status=pb.DeleteStreamStatus.SUCCESS)

    def _delete_stream_data(self, scope: str, name: str) -> None:
        """Delete every segment of a DELETING stream (transaction segments too), then forget it."""
        with self._lock:
            stream = self._state.streams[(scope, name)]
            sids = [s.segment_id for s in stream.segments.values() if not s.deleted]
            txn_ids = [t.txn_id for t in stream.txns.values() if t.state != COMMITTED]
        names = [qualified_segment_name(scope, name, sid) for sid in sids]
        for txn_id in txn_ids:
            names += self._txn_segment_names(scope, name, txn_id)
        for seg_name in names:
            self._backend.delete_segment(seg_name)
        with self._lock:
            seq = self._persist({"op": "stream_deleted", "scope": scope, "stream": name, "ts": _now_ms()})
        self._durable(seq)

    @rpc
    def truncateStream(self, request: pb.StreamCut, context: grpc.ServicerContext) -> pb.UpdateStreamStatus:
        """Like Pravega 0.13: a sealed stream answers STREAM_SEALED; a cut that is not valid, or lies
        (on any segment) before the current truncation point, answers FAILURE. Deliberate
        difference: a cut past the end of a segment's data is refused (FAILURE) too — Pravega
        accepts it, records a head beyond the data and leaves the segment untruncated."""
        scope, name = self._names(request.streamInfo)
        return pb.UpdateStreamStatus(status=self._truncate(scope, name, dict(request.cut)))

    def _truncate(self, scope: str, name: str, cut: dict[int, int],
                  retention: tuple[int, int, int] | None = None) -> int:
        """Truncate at ``cut``: the one home of truncation (truncateStream and the retention service);
        returns the UpdateStreamStatus value. With ``retention`` (the retention service), only while
        the stream still has that retention policy: none is applied after updateStream removed it."""
        failure = pb.UpdateStreamStatus.FAILURE
        with self._gate(scope, name).exclusive():
            with self._lock:
                stream = self._state.stream(scope, name)
                if stream is None:
                    return pb.UpdateStreamStatus.STREAM_NOT_FOUND  # as Pravega 0.13, a missing scope too
                if stream.state == SEALED:
                    return 4  # Pravega's STREAM_SEALED (not in our .proto)
                if retention is not None and stream.config.retention != retention:
                    return failure
                problem = stream.cut_problem(cut)
                if problem is not None:
                    log.info("truncation of %s/%s refused: %s", scope, name, problem)
                    return failure
                old_head = stream.head_positions()
                for sid, offset in cut.items():
                    behind = [hid for hid in old_head if stream.is_before(sid, hid)]
                    if behind or offset < old_head.get(sid, 0):
                        log.info("truncation of %s/%s refused: segment %d at %d is behind the current head %s",
                                 scope, name, sid, offset, old_head)
                        return failure
            for sid, offset in cut.items():
                info = self._backend.segment_info(qualified_segment_name(scope, name, sid))
                if info is None:
                    raise RuntimeError(f"segment {sid} of {scope}/{name} is missing from the segment store")
                if offset > info.length:
                    log.info("truncation of %s/%s refused: segment %d holds %d bytes, the cut says %d",
                             scope, name, sid, info.length, offset)
                    return failure
            head = {sid: max(offset, old_head.get(sid, 0)) for sid, offset in cut.items()}
            with self._lock:
                stream = self._state.streams[(scope, name)]
                deleted = stream.segments_before_cut(head)
                seq = self._persist(
                    {
                        "op": "stream_truncated",
                        "scope": scope,
                        "stream": name,
                        "head": [[k, v] for k, v in sorted(head.items())],
                        "deleted": deleted,
                        "ts": _now_ms(),
                    }
                )
            self._durable(seq)
            for sid, offset in head.items():
                self._backend.truncate_segment(qualified_segment_name(scope, name, sid), offset)
            for sid in deleted:
                self._backend.delete_segment(qualified_segment_name(scope, name, sid))
        return pb.UpdateStreamStatus.SUCCESS

    def _list_streams(self, scope: str, token: str, tag: str | None) -> pb.StreamsInScopeResponse:
        def names() -> list[str] | None:
            if scope not in self._state.scopes:
                return None
            # Like Pravega 0.13: every user stream has a watermark stream "_MARK<name>" beside it,
            # listed too (Pravega creates it; here it is only named, since nothing writes to it).
            names: list[str] = []
            for s in self._state.streams_in_scope(scope):
                if s.name.startswith("_") or (tag is not None and tag not in (s.config.tags or ())):
                    continue
                names.append(s.name)
                if tag is None:
                    names.append(f"_MARK{s.name}")
            return sorted(names)

        found = self._read(names)
        if found is not None and not self._may(auth.scope_resource(scope), Permission.READ):
            found = [n for n in found if self._may(auth.stream_auth_resource(scope, n), Permission.READ)]
        if found is None:
            return pb.StreamsInScopeResponse(
                status=pb.StreamsInScopeResponse.SCOPE_NOT_FOUND, continuationToken=pb.ContinuationToken(token=token)
            )
        page, next_token = self._page(found, token, self._config.list_page_size)
        return pb.StreamsInScopeResponse(
            streams=[self._info(scope, n) for n in page],
            continuationToken=pb.ContinuationToken(token=next_token),
            status=pb.StreamsInScopeResponse.SUCCESS,
        )

    @rpc
    def listStreamsInScope(
        self, request: pb.StreamsInScopeRequest, context: grpc.ServicerContext
    ) -> pb.StreamsInScopeResponse:
        return self._list_streams(request.scope.scope, request.continuationToken.token, None)

    @rpc
    def listStreamsInScopeForTag(
        self, request: pb.StreamsInScopeWithTagRequest, context: grpc.ServicerContext
    ) -> pb.StreamsInScopeResponse:
        return self._list_streams(request.scope.scope, request.continuationToken.token, request.tag)

    @rpc
    def checkStreamExists(self, request: pb.StreamInfo, context: grpc.ServicerContext) -> pb.ExistsResponse:
        return pb.ExistsResponse(
            exists=self._read(lambda: self._state.stream(request.scope, request.stream) is not None)
        )

    # ------------------------------------------------------------------ segments

    @rpc
    def getCurrentSegments(self, request: pb.StreamInfo, context: grpc.ServicerContext) -> pb.SegmentRanges:
        scope, name = self._names(request)

        def ranges() -> pb.SegmentRanges:
            stream = self._stream_or_fail(scope, name)
            if stream.state == SEALED:
                # Pravega 0.13 answers no current segments for a sealed stream (its last epoch
                # stays readable through getEpochSegments / getSegmentsBetween).
                return pb.SegmentRanges()
            return pb.SegmentRanges(segmentRanges=[self._range(stream, s) for s in stream.active_epoch.segment_ids])

        return self._read(ranges)

    @rpc
    def getEpochSegments(self, request: pb.GetEpochSegmentsRequest, context: grpc.ServicerContext) -> pb.SegmentRanges:
        scope, name = self._names(request.streamInfo)
        epoch = request.epoch

        def ranges() -> pb.SegmentRanges:
            stream = self._stream_or_fail(scope, name)
            if not 0 <= epoch < len(stream.epochs):
                raise RpcFailure(
                    grpc.StatusCode.NOT_FOUND,
                    f"stream {scope}/{name} has epochs 0..{len(stream.epochs) - 1}, not {epoch}",
                )
            return pb.SegmentRanges(segmentRanges=[self._range(stream, s) for s in stream.epochs[epoch].segment_ids])

        return self._read(ranges)

    @rpc
    def getSegments(self, request: pb.GetSegmentsRequest, context: grpc.ServicerContext) -> pb.SegmentsAtTime:
        scope, name = self._names(request.streamInfo)
        timestamp = request.timestamp

        def at_time() -> pb.SegmentsAtTime:
            stream = self._stream_or_fail(scope, name)
            positions = stream.head_positions()
            if timestamp > 0:
                # The epoch active at that time, unless truncation already removed (part of) it.
                epoch = stream.epochs[0]
                for e in stream.epochs:
                    if e.created_ms <= timestamp:
                        epoch = e
                behind_head = any(
                    stream.segments[s].deleted or any(stream.is_before(s, h) for h in positions)
                    for s in epoch.segment_ids
                )
                if not behind_head:
                    positions = {s: positions.get(s, 0) for s in epoch.segment_ids}
            info = self._info(scope, name)
            return pb.SegmentsAtTime(
                segments=[
                    pb.SegmentsAtTime.SegmentLocation(
                        segmentId=pb.SegmentId(streamInfo=info, segmentId=sid), offset=off
                    )
                    for sid, off in sorted(positions.items())
                ]
            )

        return self._read(at_time)

    @rpc
    def getSegmentsImmediatelyFollowing(
        self, request: pb.SegmentId, context: grpc.ServicerContext
    ) -> pb.SuccessorResponse:
        scope, name = self._names(request.streamInfo)
        segment_id = request.segmentId

        def successors() -> pb.SuccessorResponse:
            stream = self._stream_or_fail(scope, name)
            if segment_id not in stream.segments:
                return pb.SuccessorResponse()  # Pravega 0.13: no successors, not an error
            return pb.SuccessorResponse(
                segments=[
                    pb.SuccessorResponse.SegmentEntry(segment=self._range(stream, succ.segment_id), value=preds)
                    for succ, preds in stream.successors(segment_id)
                ]
            )

        return self._read(successors)

    @rpc
    def getSegmentsBetween(
        self, request: pb.StreamCutRange, context: grpc.ServicerContext
    ) -> pb.StreamCutRangeResponse:
        scope, name = self._names(request.streamInfo)
        from_cut, to_cut = dict(getattr(request, "from")), dict(request.to)

        def between() -> pb.StreamCutRangeResponse:
            stream = self._stream_or_fail(scope, name)
            start = from_cut or stream.head_positions()
            for label, cut in (("from", from_cut), ("to", to_cut)):
                if cut:
                    problem = stream.cut_problem(cut)
                    if problem is not None:
                        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"invalid '{label}' stream cut: {problem}")
            for f, f_off in start.items():
                for t, t_off in to_cut.items():
                    if stream.is_before(t, f) or (f == t and t_off < f_off):
                        raise RpcFailure(
                            grpc.StatusCode.INVALID_ARGUMENT,
                            f"the 'from' stream cut is after the 'to' stream cut (segment {f} vs {t})",
                        )
            # Like Pravega 0.13, the 'to' cut's own segments are always part of the answer.
            segments = self._segments_between(stream, start, to_cut) | set(to_cut)
            info = self._info(scope, name)
            return pb.StreamCutRangeResponse(
                segments=[pb.SegmentId(streamInfo=info, segmentId=s) for s in sorted(segments)]
            )

        return self._read(between)

    @staticmethod
    def _segments_between(stream: StreamRecord, start: Mapping[int, int], end: Mapping[int, int]) -> set[int]:
        """Segments from the ``start`` cut to the ``end`` cut (empty: the tail), following successors."""
        found: set[int] = set()
        queue = list(start)
        while queue:
            sid = queue.pop()
            if sid in found:
                continue
            if any(stream.is_before(e, sid) for e in end):
                continue  # beyond the end cut
            found.add(sid)
            if sid in end:
                continue
            queue.extend(succ.segment_id for succ, _ in stream.successors(sid))
        return found

    @rpc
    def isSegmentValid(self, request: pb.SegmentId, context: grpc.ServicerContext) -> pb.SegmentValidityResponse:
        def valid() -> bool:
            stream = self._state.stream(request.streamInfo.scope, request.streamInfo.stream)
            return bool(stream is not None and stream.state == ACTIVE and stream.is_active_segment(request.segmentId))

        return pb.SegmentValidityResponse(response=self._read(valid))

    @rpc
    def isStreamCutValid(self, request: pb.StreamCut, context: grpc.ServicerContext) -> pb.StreamCutValidityResponse:
        def valid() -> bool:
            stream = self._state.stream(request.streamInfo.scope, request.streamInfo.stream)
            return stream is not None and stream.cut_problem(dict(request.cut)) is None

        return pb.StreamCutValidityResponse(response=self._read(valid))

    # ------------------------------------------------------------------ scaling

    @rpc
    def scale(self, request: pb.ScaleRequest, context: grpc.ServicerContext) -> pb.ScaleResponse:
        scope, name = self._names(request.streamInfo)
        with self._gate(scope, name).exclusive():
            with self._lock:
                stream = self._stream_or_fail(scope, name)
                if stream.state != ACTIVE:
                    # Pravega 0.13: the store's "illegal state" for a sealed stream becomes FAILURE.
                    log.info("scale of %s/%s refused: the stream is sealed", scope, name)
                    return pb.ScaleResponse(status=pb.ScaleResponse.FAILURE)
                refusal = self._scale_problem(
                    stream, list(request.sealedSegments), [(r.start, r.end) for r in request.newKeyRanges]
                )
                if refusal is not None:
                    status, problem = refusal
                    log.info("scale of %s/%s refused: %s", scope, name, problem)
                    return pb.ScaleResponse(status=status)
            return self._scale_locked(
                scope, name, list(request.sealedSegments), [(r.start, r.end) for r in request.newKeyRanges]
            )

    def _scale_locked(
        self, scope: str, name: str, sealed_ids: list[int], key_ranges: list[tuple[float, float]]
    ) -> pb.ScaleResponse:
        """Perform a checked scale (caller holds the stream's gate exclusively)."""
        with self._lock:
            stream = self._state.streams[(scope, name)]
            base_epoch = len(stream.epochs) - 1
            new_epoch = base_epoch + 1
            ranges = sorted(key_ranges)
            new = [[segment_id_of(new_epoch, stream.next_number + i), lo, hi] for i, (lo, hi) in enumerate(ranges)]
            sealed = sorted(set(sealed_ids))
        # New segments first, then the epoch that makes them visible, then seal the old ones.
        for sid, _, _ in new:
            self._backend.create_segment(qualified_segment_name(scope, name, sid))
        with self._lock:
            seq = self._persist(
                {
                    "op": "stream_scaled",
                    "scope": scope,
                    "stream": name,
                    "sealed": sealed,
                    "new": new,
                    "ts": _now_ms(),
                }
            )
            stream = self._state.streams[(scope, name)]
            response = pb.ScaleResponse(
                status=pb.ScaleResponse.STARTED,
                segments=[self._range(stream, sid) for sid, _, _ in new],
                epoch=base_epoch,  # as Pravega: the epoch the scale started from; checkScale polls it
            )
        self._durable(seq)
        for sid in sealed:
            self._backend.seal_segment(qualified_segment_name(scope, name, sid))
        return response

    @staticmethod
    def _scale_problem(
        stream: StreamRecord, sealed: list[int], ranges: list[tuple[float, float]]
    ) -> tuple[int, str] | None:
        """Why a manual scale is refused — (ScaleResponse status, reason) — or None when acceptable.

        The status follows Pravega 0.13's submitScale: a segment to seal that is not in the active
        epoch, or fewer segments than the scaling policy's minimum afterwards, is
        PRECONDITION_FAILED; new ranges that do not exactly replace the sealed ones are invalid
        input, which its controller answers with FAILURE.
        """
        precondition, invalid = pb.ScaleResponse.PRECONDITION_FAILED, pb.ScaleResponse.FAILURE
        for sid in sealed:
            if not stream.is_active_segment(sid):
                return precondition, f"segment {sid} is not an active segment"
        if not sealed:
            return invalid, "no segments to seal"
        if not ranges:
            return invalid, "no new key ranges"
        if len(set(sealed)) != len(sealed):
            return invalid, "a segment is listed twice"
        after = len(stream.active_epoch.segment_ids) - len(sealed) + len(ranges)
        if after > MAX_SEGMENTS_PER_EPOCH:
            return invalid, f"more than {MAX_SEGMENTS_PER_EPOCH} segments"
        for lo, hi in ranges:
            if not 0.0 <= lo < hi <= 1.0:
                return invalid, f"bad key range [{lo}, {hi})"

        def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]] | None:
            out: list[tuple[float, float]] = []
            for lo, hi in sorted(intervals):
                if out and lo < out[-1][1]:
                    return None  # overlap
                if out and lo == out[-1][1]:
                    out[-1] = (out[-1][0], hi)
                else:
                    out.append((lo, hi))
            return out

        new_union = union(ranges)
        if new_union is None:
            return invalid, "the new key ranges overlap"
        old_union = union([(stream.segments[s].min_key, stream.segments[s].max_key) for s in sealed])
        if new_union != old_union:
            return invalid, f"the new key ranges {new_union} do not exactly cover the sealed ranges {old_union}"
        minimum = stream.config.min_num_segments
        if after < minimum:
            return precondition, f"{after} segments would be fewer than the scaling policy's minimum {minimum}"
        return None

    @rpc
    def checkScale(self, request: pb.ScaleStatusRequest, context: grpc.ServicerContext) -> pb.ScaleStatusResponse:
        scope, name = self._names(request.streamInfo)
        epoch = request.epoch

        def status() -> int:
            stream = self._state.stream(scope, name)
            if stream is None or epoch < 0:
                return pb.ScaleStatusResponse.INVALID_INPUT
            active = len(stream.epochs) - 1
            if epoch > active:
                return pb.ScaleStatusResponse.INVALID_INPUT
            # Scales complete before `scale` answers, so only "nothing happened since" is in progress.
            return pb.ScaleStatusResponse.IN_PROGRESS if epoch == active else pb.ScaleStatusResponse.SUCCESS

        return pb.ScaleStatusResponse(status=self._read(status))

    # ------------------------------------------------------------------ transactions

    @staticmethod
    def _txn_record(op: str, scope: str, name: str, txn_id: int, **fields: Any) -> dict[str, Any]:
        return {"op": op, "scope": scope, "stream": name, "txn": format(txn_id, "032x"), "ts": _now_ms(), **fields}

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
                now = _now_ms()
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
                    stream = self._state.stream(scope, name)
                    if stream is None:
                        return _txn_failure("commit", scope, name, txn_id, "no such stream")
                    txn = stream.txns.get(txn_id)
                    if txn is None:
                        return _txn_failure("commit", scope, name, txn_id, "no such transaction")
                    if txn.state == COMMITTED:
                        return pb.TxnStatus(status=pb.TxnStatus.SUCCESS)
                    if txn.state in (ABORTING, ABORTED):
                        return _txn_failure("commit", scope, name, txn_id,
                                            f"it was aborted ({txn.abort_reason or 'aborted'})")
                    expired = txn.state == OPEN and _now_ms() > txn.deadline_ms
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

    def _abort_expired_locked(self, scope: str, name: str, txn_id: int) -> bool:
        """Abort an OPEN transaction whose lease ran out (caller holds gate and txn lock)."""
        with self._lock:
            stream = self._state.stream(scope, name)
            txn = stream.txns.get(txn_id) if stream is not None else None
            if txn is None or txn.state != OPEN or _now_ms() <= txn.deadline_ms:
                return False
            seq = self._persist(self._txn_record("txn_aborting", scope, name, txn_id, reason="lease expired"))
        self._durable(seq)
        log.info("transaction %032x on %s/%s: lease expired, aborting", txn_id, scope, name)
        self._complete_abort(scope, name, txn_id)
        return True

    def _expire(self, scope: str, name: str, txn_id: int) -> bool:
        with self._gate(scope, name).shared(), self._txn_lock(scope, name, txn_id):
            return self._abort_expired_locked(scope, name, txn_id)

    @rpc
    def abortTransaction(self, request: pb.TxnRequest, context: grpc.ServicerContext) -> pb.TxnStatus:
        scope, name = self._names(request.streamInfo)
        txn_id = self._txn_id(request)
        with self._gate(scope, name).shared(), self._txn_lock(scope, name, txn_id):
            with self._lock:
                stream = self._state.stream(scope, name)
                if stream is None:
                    return _txn_failure("abort", scope, name, txn_id, "no such stream")
                txn = stream.txns.get(txn_id)
                if txn is None:
                    return _txn_failure("abort", scope, name, txn_id, "no such transaction")
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
            now = _now_ms()
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
            if txn.state == OPEN and _now_ms() > txn.deadline_ms:
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

    # ------------------------------------------------------------------ lease reaper

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
        now = _now_ms()
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

    # ------------------------------------------------------------------ auto-scaling (Pravega's AutoScaleTask)

    def autoscale_policy(self, scope: str, name: str) -> tuple[int, int] | None:
        """(scale type, target rate) of an active auto-scaled stream, else None."""
        with self._lock:
            stream = self._state.stream(scope, name)
            if stream is None or stream.state != ACTIVE:
                return None
            c = stream.config
            if c.scale_type == pb.ScalingPolicy.FIXED_NUM_SEGMENTS or c.target_rate <= 0:
                return None
            return c.scale_type, c.target_rate

    def handle_autoscale(self, event: Any) -> None:
        """A scale request from the segment store's auto-scaler (an ``autoscale.AutoScaleEvent``).

        Up: split the segment into ``min(max(2, num_splits), max(2, scaleFactor))`` equal key
        ranges. Down: mark it cold (until the request's time + ``mute``, or for ever when silent),
        then merge the cold ones among it and its two neighbours, never below ``minNumSegments``
        (with room for one fewer segment only, the first two). As Pravega 0.13."""
        if self._stopped or self._log_failure is not None:
            return
        scope, name, sid = event.scope, event.stream, event.segment_id
        with self._gate(scope, name).exclusive():
            with self._lock:
                stream = self._state.stream(scope, name)
                if stream is None or stream.state != ACTIVE or \
                        stream.config.scale_type == pb.ScalingPolicy.FIXED_NUM_SEGMENTS:
                    return
                config = stream.config
                active = stream.active_segments()
                if event.direction == "up":
                    seg = stream.segments.get(sid)
                    if seg is None or not stream.is_active_segment(sid):
                        return
                    n = min(max(2, event.num_splits), max(2, config.scale_factor))
                    if len(active) - 1 + n > MAX_SEGMENTS_PER_EPOCH:
                        return
                    delta = (seg.max_key - seg.min_key) / n
                    ranges = [(seg.min_key + delta * i, seg.min_key + delta * (i + 1)) for i in range(n - 1)]
                    ranges.append((seg.min_key + delta * (n - 1), seg.max_key))
                    sealed = [sid]
                else:
                    self._cold[(scope, name, sid)] = (2**63 if event.silent
                                                      else event.timestamp_ms + self._config.cold_marker_ms)
                    current = stream.segments.get(sid)
                    if current is None or not stream.is_active_segment(sid) or \
                            len(active) == config.min_num_segments:
                        return
                    candidates = [s for s in active if s.max_key == current.min_key or s.min_key == current.max_key
                                  or s.segment_id == sid]
                    now = _now_ms()
                    cold = [s for s in candidates if self._cold.get((scope, name, s.segment_id), 0) > now]
                    if len(active) - config.min_num_segments == 1 and len(cold) == 3:
                        cold = cold[:2]
                    if len(cold) < 2:
                        return
                    sealed = [s.segment_id for s in cold]
                    ranges = [(min(s.min_key for s in cold), max(s.max_key for s in cold))]
            log.info("auto-scaling %s/%s: sealing %s, new ranges %s", scope, name, sealed, ranges)
            self._scale_locked(scope, name, sealed, ranges)
        with self._lock:
            for s in sealed:
                self._cold.pop((scope, name, s), None)

    # ------------------------------------------------------------------ retention service

    def _retention_loop(self) -> None:
        while not self._stop_event.wait(self._config.retention_interval_s):
            if self._log_failure is not None:
                continue
            try:
                self.apply_retention()
            except Exception:  # as Pravega's PeriodicRetention: log, try again next round
                log.exception("retention round failed")

    def apply_retention(self) -> int:
        """One round of Pravega's periodic retention over every active stream with a time or size
        retention policy: record a stream cut when the newest recorded one is at least one
        interval old, then truncate at the newest recorded cut the policy lets go of
        (:func:`retention_truncation_cut`) and forget the cuts older than it. Returns how many
        streams were truncated."""
        with self._lock:
            due = [(s.scope, s.name) for s in self._state.iter_streams()
                   if s.state == ACTIVE and s.config.retention is not None
                   and s.config.retention[0] in (RETENTION_TIME, RETENTION_SIZE)]
        truncated = 0
        for scope, name in due:
            if self._stopped:
                break
            try:
                truncated += self._retain(scope, name)
            except Exception:
                log.exception("retention of %s/%s failed; it is tried again next round", scope, name)
        return truncated

    def _retain(self, scope: str, name: str) -> bool:
        interval_ms = int(self._config.retention_interval_s * 1000)
        with self._lock:
            stream = self._state.stream(scope, name)
            if stream is None or stream.state != ACTIVE or stream.config.retention is None:
                return False
            latest = stream.retention_cuts[-1] if stream.retention_cuts else None
        if latest is None or _now_ms() - latest.ts >= interval_ms:
            self._record_retention_cut(scope, name, latest)
        with self._lock:
            stream = self._state.stream(scope, name)
            if stream is None or stream.config.retention is None:
                return False
            policy = stream.config.retention
            kind, param, _max = policy
            chosen = retention_truncation_cut(kind, param, stream.retention_cuts, _now_ms())
            if chosen is None:
                return False
            cut = dict(chosen.cut)
            head = stream.head_positions()
            # Already truncated there (or past it: a manual truncation): nothing to do.
            done = cut == head or stream.cut_problem(cut) is not None or any(
                offset < head.get(sid, 0) or any(stream.is_before(sid, h) for h in head) for sid, offset in cut.items())
        status = pb.UpdateStreamStatus.SUCCESS if done else self._truncate(scope, name, cut, policy)
        if status != pb.UpdateStreamStatus.SUCCESS:
            return False  # as Pravega: a cut behind the current truncation point is ignored
        with self._lock:
            stream = self._state.stream(scope, name)
            seq = None
            if stream is not None and stream.retention_cuts and stream.retention_cuts[0].ts < chosen.ts:
                seq = self._persist({"op": "retention_cuts_dropped", "scope": scope, "stream": name,
                                     "before_ts": chosen.ts, "ts": _now_ms()})
        if seq is not None:
            self._durable(seq)
        if not done:
            log.info("retention truncated %s/%s at the stream cut recorded at %d", scope, name, chosen.ts)
        return not done

    def _record_retention_cut(self, scope: str, name: str, previous: RetentionCut | None) -> None:
        """Record the stream's tail as a retention cut (Pravega's generateStreamCut): the active
        segments at their current lengths, the time, and the stream's size up to the cut (the
        previous cut's size plus what arrived between the two)."""
        with self._gate(scope, name).shared():  # no scale or truncation while the cut is taken
            with self._lock:
                stream = self._state.stream(scope, name)
                if stream is None or stream.state != ACTIVE:
                    return
                active = list(stream.active_epoch.segment_ids)
                live = [s.segment_id for s in stream.segments.values() if not s.deleted]
            lengths = {}
            for sid in live:
                info = self._backend.segment_info(qualified_segment_name(scope, name, sid))
                lengths[sid] = info.length if info is not None else 0
            cut = {sid: lengths[sid] for sid in active}
            ts = _now_ms()
            with self._lock:
                stream = self._state.streams[(scope, name)]
                base = previous.cut if previous is not None and stream.cut_problem(dict(previous.cut)) is None \
                    else tuple(stream.head_positions().items())
                grown = self._bytes_to(stream, cut, lengths) - self._bytes_to(stream, dict(base), lengths)
                size = (previous.size if previous is not None else 0) + max(0, grown)
                seq = self._persist({"op": "retention_cut_recorded", "scope": scope, "stream": name, "ts": ts,
                                     "size": size, "cut": [[k, v] for k, v in sorted(cut.items())]})
        self._durable(seq)

    @staticmethod
    def _bytes_to(stream: StreamRecord, cut: Mapping[int, int], lengths: Mapping[int, int]) -> int:
        """Bytes of the stream's existing segments that lie before ``cut``."""
        before = set(stream.segments_before_cut(cut))
        return sum(cut[sid] if sid in cut else lengths.get(sid, 0) if sid in before else 0
                   for sid in lengths)

    # ------------------------------------------------------------------ introspection (tests, tools)

    def snapshot_state(self) -> dict[str, Any]:
        """A JSON copy of the whole metadata state."""
        with self._lock:
            return self._state.to_json()


__all__ = ["ControllerConfig", "EmbeddedController", "valid_name"]
