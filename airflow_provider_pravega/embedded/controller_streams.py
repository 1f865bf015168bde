"""The controller's scopes and streams: create, list, configure, seal, truncate and delete them.

Sealing finishes a stream's pending transactions (:mod:`~.controller_transactions`); an update
whose scaling policy the active segments no longer meet rescales (:mod:`~.controller_scaling`);
the retention service truncates through the same ``_truncate`` as ``truncateStream``.
"""

from __future__ import annotations

import logging

import grpc

from airflow_provider_pravega.embedded import auth
from airflow_provider_pravega.embedded.auth import Permission
from airflow_provider_pravega.embedded.controller_access import RpcFailure, rpc
from airflow_provider_pravega.embedded.controller_base import MAX_SEGMENTS_PER_EPOCH, ControllerBase
from airflow_provider_pravega.embedded.controller_state import (
    ABORTING,
    COMMITTED,
    COMMITTING,
    OPEN,
    SEALED,
    StreamConfigRecord,
    StreamRecord,
    segment_id_of,
)
from airflow_provider_pravega.protocol import controller_pb2 as pb
from airflow_provider_pravega.protocol.naming import (
    qualified_segment_name,
    validate_scope_name,
    validate_stream_name,
)

log = logging.getLogger(__name__)

_TOKEN_PREFIX = "after:"  # a list RPC's continuation token: this, then the last name listed


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


class ScopesAndStreams(ControllerBase):
    """The scope and stream RPCs of Pravega's ControllerService."""

    def _may(self, resource: str, needed: Permission) -> bool:
        """Whether the caller of the current RPC has ``needed`` on ``resource`` (always, without auth)."""
        return self._access is None or self._access.may(resource, needed)

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

    # ------------------------------------------------------------------ scopes

    @rpc
    def createScope(self, request: pb.ScopeInfo, context: grpc.ServicerContext) -> pb.CreateScopeStatus:
        scope = request.scope
        if not valid_name(scope, "scope"):
            return pb.CreateScopeStatus(status=pb.CreateScopeStatus.INVALID_SCOPE_NAME)
        with self._lock:
            if scope in self._state.scopes:
                return pb.CreateScopeStatus(status=pb.CreateScopeStatus.SCOPE_EXISTS)
            seq = self._persist({"op": "scope_created", "scope": scope, "ts": self._now_ms()})
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
            seq = self._persist({"op": "scope_deleted", "scope": scope, "ts": self._now_ms()})
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
                ts = self._now_ms()
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
            seq = self._persist({"op": "stream_updated", "scope": scope, "stream": name, "config": config.to_json(),
                                 "ts": self._now_ms()})
        self._durable(seq)
        self._scale_to_policy(scope, name)
        return pb.UpdateStreamStatus(status=pb.UpdateStreamStatus.SUCCESS)

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
                    seq = self._persist({"op": "stream_sealed", "scope": scope, "stream": name, "ts": self._now_ms()})
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
                seq = self._persist({"op": "stream_deleting", "scope": scope, "stream": name, "ts": self._now_ms()})
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
            seq = self._persist({"op": "stream_deleted", "scope": scope, "stream": name, "ts": self._now_ms()})
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
                        "ts": self._now_ms(),
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
