"""Scaling a stream: a new epoch of segments replaces sealed ones.

Three ways in, one way through (``_scale_locked``): the ``scale`` RPC, an update of the scaling
policy (``_scale_to_policy``, as Pravega's UpdateStreamTask) and the segment store's auto-scaler
(``handle_autoscale``, as Pravega's AutoScaleTask).
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from airflow_provider_pravega.embedded.controller_access import rpc
from airflow_provider_pravega.embedded.controller_base import MAX_SEGMENTS_PER_EPOCH, ControllerBase
from airflow_provider_pravega.embedded.controller_state import ACTIVE, StreamRecord, segment_id_of
from airflow_provider_pravega.protocol import controller_pb2 as pb
from airflow_provider_pravega.protocol.naming import qualified_segment_name

log = logging.getLogger(__name__)


class Scaling(ControllerBase):
    """The scale and checkScale RPCs, scaling to an updated policy, and auto-scaling."""

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
                    "ts": self._now_ms(),
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
                    now = self._now_ms()
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
