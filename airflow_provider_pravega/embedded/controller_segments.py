"""The controller's answers about a stream's segments: current ones, an epoch's, those at a time,
successors, those between two stream cuts, and whether a segment or a stream cut is valid.

Reads only: they change nothing, and answer once what they saw is durable.
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc

from airflow_provider_pravega.embedded.controller_access import RpcFailure, rpc
from airflow_provider_pravega.embedded.controller_base import ControllerBase
from airflow_provider_pravega.embedded.controller_state import ACTIVE, SEALED, StreamRecord
from airflow_provider_pravega.protocol import controller_pb2 as pb


class SegmentQueries(ControllerBase):
    """The segment RPCs of Pravega's ControllerService."""

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
