"""The retention service (Pravega's periodic retention): the thread that truncates streams with a
time or size retention policy at stream cuts it recorded earlier.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from airflow_provider_pravega.embedded.controller_base import ControllerBase
from airflow_provider_pravega.embedded.controller_state import (
    ACTIVE,
    RETENTION_SIZE,
    RETENTION_TIME,
    RetentionCut,
    StreamRecord,
    retention_truncation_cut,
)
from airflow_provider_pravega.protocol import controller_pb2 as pb
from airflow_provider_pravega.protocol.naming import qualified_segment_name

log = logging.getLogger(__name__)


class Retention(ControllerBase):
    """Recording retention cuts and truncating at the ones the policy lets go of."""

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
        if latest is None or self._now_ms() - latest.ts >= interval_ms:
            self._record_retention_cut(scope, name, latest)
        with self._lock:
            stream = self._state.stream(scope, name)
            if stream is None or stream.config.retention is None:
                return False
            policy = stream.config.retention
            kind, param, _max = policy
            chosen = retention_truncation_cut(kind, param, stream.retention_cuts, self._now_ms())
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
                                     "before_ts": chosen.ts, "ts": self._now_ms()})
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
            ts = self._now_ms()
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
