"""Segment requests addressed by segment name, and following a segment to the store that owns it.

* :class:`SegmentStoreClient` - finds a segment's segment store through the controller (getURI,
  cached), adds the delegation token, raises error replies (:func:`.segment_replies.raise_for_reply`),
  retries after WrongHost; opens append sessions (:mod:`.appends`).
* :class:`Failover` - the one policy every path (request/response calls, append sessions,
  conditional appends, batch reads) follows when a segment's store answers ``WrongHost`` or its
  connection fails: forget the cached owner, ask the controller again, back off, and give up after
  bounded tries with :class:`SegmentUnavailableError` naming the segment and the stores tried.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_provider_pravega.client.appends import AppendSession
from airflow_provider_pravega.client.connection import ConnectionPool, access_of, next_request_id
from airflow_provider_pravega.client.controller import ControllerClient
from airflow_provider_pravega.client.controller_types import Endpoint
from airflow_provider_pravega.client.errors import (
    NoSuchSegmentError,
    SegmentSealedError,
    SegmentStoreError,
    SegmentStoreUnreachableError,
    SegmentUnavailableError,
)
from airflow_provider_pravega.client.segment_replies import raise_for_reply
from airflow_provider_pravega.protocol import naming, wire

__all__ = ["Failover", "SegmentInfo", "SegmentStoreClient"]

log = logging.getLogger(__name__)

#: How long, and how many times, a segment is followed to a new owner before giving up: long enough
#: for Pravega to reassign a dead store's containers, short enough to surface a real outage.
DEFAULT_FAILOVER_TIMEOUT_S = 30.0
DEFAULT_FAILOVER_ATTEMPTS = 30


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """GetStreamSegmentInfo: ``length`` is the write offset (tail), ``start_offset`` the head."""

    name: str
    length: int
    start_offset: int
    sealed: bool
    last_modified_ms: int


class SegmentStoreClient:
    """Segment requests addressed by qualified segment name (transaction segments included)."""

    def __init__(
        self, controller: ControllerClient, pool: ConnectionPool | None = None
    ) -> None:
        #: Bounds of :class:`Failover` (time and tries) for every segment this client follows.
        self.failover_timeout_s = DEFAULT_FAILOVER_TIMEOUT_S
        self.failover_attempts = DEFAULT_FAILOVER_ATTEMPTS
        self.controller = controller
        self.pool = pool or ConnectionPool(config=controller.config)
        self._own_pool = pool is None
        if self.pool.tokens is None:
            self.pool.tokens = self

    def close(self) -> None:
        if self._own_pool:
            self.pool.close()

    @staticmethod
    def locate(segment: str) -> naming.SegmentName:
        """(scope, stream, segment id) of a qualified (or transaction) segment name."""
        return naming.parse_qualified_segment_name(segment)

    def endpoint_for(self, segment: str) -> Endpoint:
        scope, stream, segment_id = self.locate(segment)
        return self.controller.get_uri(scope, stream, segment_id)

    def token_for(self, segment: str, access: str = "read") -> str:
        """The delegation token of the segment's stream for reading (default) or writing."""
        scope, stream, _ = self.locate(segment)
        return self.controller.get_delegation_token(scope, stream, access)

    # TokenSource: what the pool's connections ask before sending a request that carries a token.
    def current_token(self, segment: str, access: str = "read") -> str | None:
        """:meth:`token_for`, or None for a name that is not a stream segment's."""
        try:
            self.locate(segment)
        except ValueError:
            return None
        return self.token_for(segment, access)

    def renewed_token(self, segment: str, stale: str, access: str = "read") -> str | None:
        try:
            scope, stream, _ = self.locate(segment)
        except ValueError:
            return None
        return self.controller.renew_delegation_token(scope, stream, stale, access)

    def forget_endpoint(self, segment: str) -> None:
        scope, stream, segment_id = self.locate(segment)
        self.controller.invalidate_uri(scope, stream, segment_id)

    def failover(self, segment: str, what: str, *, timeout_s: float | None = None) -> Failover:
        """A :class:`Failover` for ``segment`` (``what``: the operation, for the error message)."""
        return Failover(self, segment, what, timeout_s=timeout_s)

    def call(
        self,
        segment: str,
        build: Callable[[int, str], wire.Request],
        *,
        check: bool = True,
    ) -> wire.Reply:
        """``build(request_id, delegation_token)`` makes the request; errors raise (unless ``check``
        is false), WrongHost and broken connections are retried on the segment's current owner
        (:class:`Failover`)."""
        token = self.token_for(segment, access_of(build(0, "")))
        failover: Failover | None = None
        while True:
            endpoint = self.endpoint_for(segment)
            request = build(next_request_id(), token)
            try:
                reply = self.pool.call(endpoint, request, attempts=2)
            except SegmentStoreUnreachableError as exc:
                failover = failover or self.failover(segment, type(request).__name__)
                failover.retry(exc, endpoint)
                continue
            if isinstance(reply, wire.WrongHost):
                failover = failover or self.failover(segment, type(request).__name__)
                failover.retry(f"WrongHost from {endpoint}", endpoint)
                continue
            if check:
                raise_for_reply(
                    reply, endpoint=endpoint, segment=segment, request=request, user=self.controller.username
                )
            return reply

    def get_segment_info(self, segment: str) -> SegmentInfo:
        reply = self.call(
            segment, lambda rid, tok: wire.GetStreamSegmentInfo(rid, segment, tok)
        )
        if not isinstance(reply, wire.StreamSegmentInfo):
            raise SegmentStoreError(
                f"unexpected reply {type(reply).__name__} to GetStreamSegmentInfo",
                segment=segment,
            )
        if not reply.exists or reply.is_deleted:
            raise NoSuchSegmentError(
                f"segment {segment} does not exist", segment=segment
            )
        return SegmentInfo(
            segment,
            reply.write_offset,
            reply.start_offset,
            reply.is_sealed,
            reply.last_modified,
        )

    def read_segment(self, segment: str, offset: int, length: int) -> wire.SegmentRead:
        """One ReadSegment; the reply may hold fewer bytes (and parks at the tail on the server)."""
        reply = self.call(
            segment,
            lambda rid, tok: wire.ReadSegment(segment, offset, length, tok, rid),
        )
        if not isinstance(reply, wire.SegmentRead):
            raise SegmentStoreError(
                f"unexpected reply {type(reply).__name__} to ReadSegment",
                segment=segment,
            )
        if reply.offset != offset:
            raise SegmentStoreError(
                f"segment store answered a read of {segment} at {offset} with offset {reply.offset}",
                segment=segment,
            )
        return reply

    def truncate_segment(self, segment: str, offset: int) -> None:
        self.call(
            segment, lambda rid, tok: wire.TruncateSegment(rid, segment, offset, tok)
        )

    def seal_segment(self, segment: str) -> None:
        try:
            self.call(segment, lambda rid, tok: wire.SealSegment(rid, segment, tok))
        except SegmentSealedError:
            pass  # sealing twice is success

    def open_append_session(self, segment: str, **options: Any) -> AppendSession:
        session = AppendSession(self, segment, **options)
        session.open()
        return session


class Failover:
    """Following one segment to the store that owns it now, within bounds.

    Every path that talks to a segment store about a segment (request/response calls, append
    sessions, the synchronizer's conditional appends, batch reads) reports each failure to reach the
    segment (a lost or refused connection, ``WrongHost``) with :meth:`retry`: the cached owner is
    forgotten, so the next :meth:`SegmentStoreClient.endpoint_for` asks the controller's getURI
    again, and the caller resumes there (appends by SetupAppend and the writer's last event number,
    reads at their offset). The first retry is immediate (a moved container is served at once),
    later ones back off up to 1 s. After ``segments.failover_attempts`` failures or
    ``timeout_s`` (default ``segments.failover_timeout_s``) without progress, :meth:`retry` raises
    :class:`SegmentUnavailableError` naming the segment and the stores tried. :meth:`progress`
    resets the bounds (a long read or write may fail over many times)."""

    def __init__(self, segments: SegmentStoreClient, segment: str, what: str, *,
                 timeout_s: float | None = None) -> None:
        self.segments = segments
        self.segment = segment
        self.what = what
        self.timeout_s = segments.failover_timeout_s if timeout_s is None else timeout_s
        self.max_attempts = segments.failover_attempts
        self.tried: list[str] = []
        self.failures = 0
        self._since: float | None = None
        self._delay = 0.0

    def retry(self, cause: object, endpoint: Endpoint | str | None = None) -> None:
        """Record a failure; forget the cached owner; wait before the next try, or raise
        SegmentUnavailableError when the bounds are used up."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
        self.failures += 1
        where = str(endpoint) if endpoint is not None else getattr(cause, "endpoint", None)
        if where and (not self.tried or self.tried[-1] != where):
            self.tried.append(where)
        try:
            self.segments.forget_endpoint(self.segment)
        except ValueError:  # not a stream segment's name: no controller lookup to redo
            pass
        elapsed = now - self._since
        if self.failures >= self.max_attempts or elapsed + self._delay > self.timeout_s:
            stores = ", ".join(self.tried) if self.tried else "none (the controller named no store)"
            raise SegmentUnavailableError(
                f"segment {self.segment} is unavailable: {self.what} failed {self.failures} times in "
                f"{elapsed:.1f} s (bounds: {self.max_attempts} tries, {self.timeout_s:g} s); segment stores "
                f"tried: {stores}; last error: {cause}",
                segment=self.segment,
                endpoints=self.tried,
                attempts=self.failures,
            ) from (cause if isinstance(cause, BaseException) else None)
        log.info("%s on %s failed (%s); asking the controller for its owner again", self.what, self.segment, cause)
        if self._delay:
            time.sleep(self._delay)
        self._delay = min(max(self._delay * 2, 0.05), 1.0)

    def progress(self) -> None:
        """The segment answered: the bounds start afresh at the next failure."""
        if self.failures:
            self.failures = 0
            self._since = None
            self._delay = 0.0
            self.tried = []
