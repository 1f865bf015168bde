"""What every part of the embedded controller shares: its metadata state, its locks, and how a change
becomes durable before an RPC answers.

Each part of the controller's API is a mixin of :class:`ControllerBase` in a module of its own;
:class:`~.controller.EmbeddedController` combines them into the servicer grpcio serves. The rules
of durability and lock order are in :mod:`~.controller`'s docstring.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import grpc

from airflow_provider_pravega._clock import now_ms
from airflow_provider_pravega.embedded.backend import SegmentBackend
from airflow_provider_pravega.embedded.controller_access import ControllerAccess, RpcFailure
from airflow_provider_pravega.embedded.controller_config import ControllerConfig
from airflow_provider_pravega.embedded.controller_log import MetadataLog
from airflow_provider_pravega.embedded.controller_state import ControllerState, StreamRecord
from airflow_provider_pravega.protocol import controller_pb2 as pb

log = logging.getLogger(__name__)

# More segments than this in one epoch is almost certainly a mistake (each is a file and a writer
# connection); refuse instead of creating them.
MAX_SEGMENTS_PER_EPOCH = 4096

T = TypeVar("T")


class StreamGate:
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


class ControllerBase:
    """The controller's shared core: the metadata state and its log, the segment backend, the locks
    (``_lock``, the stream gates, the striped transaction locks) and the helpers every part uses."""

    _TXN_LOCK_STRIPES = 64

    def __init__(self, backend: SegmentBackend, data_dir: Path, config: ControllerConfig,
                 access: ControllerAccess | None) -> None:
        self._access = access  # None: no authentication (every call allowed, tokens "")
        #: RPC name -> calls served (tests and benchmarks count what a client costs the controller).
        self.rpc_calls: collections.Counter[str] = collections.Counter()
        self._rpc_lock = threading.Lock()
        self._backend = backend
        self._config = config
        self._dir = Path(data_dir) / "controller"
        self._log = MetadataLog(self._dir, snapshot_every=self._config.snapshot_every)
        self._state = ControllerState(
            finished_txn_limit=self._config.finished_txn_limit,
            finished_txn_retention_ms=self._config.finished_txn_retention_ms,
        )
        self._lock = threading.RLock()
        self._gates: dict[tuple[str, str], StreamGate] = {}
        self._txn_locks = [threading.Lock() for _ in range(self._TXN_LOCK_STRIPES)]
        self._stopped = False
        self._log_failure: BaseException | None = None  # fail-stop after a metadata write error
        self._stop_event = threading.Event()  # set by stop(): ends the background threads
        self._cold: dict[tuple[str, str, int], int] = {}  # auto-scaling's cold markers -> valid until (ms)

    def _now_ms(self) -> int:
        """The controller's wall clock in ms (every part reads it here, so a test can step it)."""
        return now_ms()

    # ------------------------------------------------------------------ helpers

    def _gate(self, scope: str, name: str) -> StreamGate:
        with self._lock:
            gate = self._gates.get((scope, name))
            if gate is None:
                gate = self._gates[(scope, name)] = StreamGate()
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

    def _range(self, stream: StreamRecord, segment_id: int) -> pb.SegmentRange:
        seg = stream.segments[segment_id]
        return pb.SegmentRange(
            segmentId=pb.SegmentId(streamInfo=self._info(stream.scope, stream.name), segmentId=segment_id),
            minKey=seg.min_key,
            maxKey=seg.max_key,
        )
