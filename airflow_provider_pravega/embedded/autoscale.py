"""Auto-scaling as Pravega 0.13 does it, inside one process.

In Pravega the segment store measures every segment's traffic (``SegmentAggregates``: decaying
event or byte rates over 2, 5, 10 and 20 minutes, in 5 s ticks), and its ``AutoScaleProcessor``
posts scale-up / scale-down requests to the controller's ``_requeststream``; the controller's
``AutoScaleTask`` then splits the segment, or marks it cold and merges it with cold neighbours.
Here the segment store calls :meth:`AutoScaler.record_append` (and the backend wrapper
:class:`RecordingBackend` reports merges, creations and seals), the decisions are the same, and
requests go through an in-process queue to a handler the controller supplies.

Timing: ``window_s`` is Pravega's shortest window (two minutes); the other windows are 2.5, 5 and
10 times it, ticks 1/24 of it, reports every window, idle segments expire after 10 windows (all as
in Pravega for the default of 120 s). ``cooldown_s`` (no request for a segment younger than this)
and ``mute_s`` (no repeated request for a segment; also how long a cold marker and a request stay
valid) default to Pravega's 600 s.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from airflow_provider_pravega._clock import now_ms
from airflow_provider_pravega.embedded.backend import SegmentBackend, SegmentInfo
from airflow_provider_pravega.protocol import naming

log = logging.getLogger(__name__)

BY_DATA_RATE = 1  # gRPC ScalingPolicy.BY_RATE_IN_KBYTES_PER_SEC
BY_EVENT_RATE = 2  # ScalingPolicy.BY_RATE_IN_EVENTS_PER_SEC
UP, DOWN = "up", "down"


@dataclass(frozen=True, slots=True)
class AutoScalerConfig:
    window_s: float = 120.0
    cooldown_s: float = 600.0
    mute_s: float = 600.0

    def __post_init__(self) -> None:
        for name in ("window_s", "cooldown_s", "mute_s"):
            if not getattr(self, name) >= 0.01:
                raise ValueError(f"auto-scaler {name} must be at least 0.01 s, got {getattr(self, name)}")

    @property
    def tick_s(self) -> float:
        return self.window_s / 24


@dataclass(frozen=True, slots=True)
class AutoScaleEvent:
    """A request to the controller (Pravega's AutoScaleEvent)."""

    scope: str
    stream: str
    segment_id: int
    direction: str  # UP or DOWN
    timestamp_ms: int
    num_splits: int = 0
    silent: bool = False  # a scale-down for an idle segment: its cold marker never expires


def parse_qualified_segment_name(name: str) -> tuple[str, str, int, bool] | None:
    """(scope, stream, segment id, is a transaction segment) of a stream's segment, None for any
    other segment (transient, table, malformed)."""
    if naming.is_transient_segment(name):
        return None
    try:
        scope, stream, sid = naming.parse_qualified_segment_name(name)
    except ValueError:
        return None
    return scope, stream, sid, naming.is_transaction_segment(name)


class SegmentAggregates:
    """Pravega's SegmentAggregates: decaying rates over 1, 2.5, 5 and 10 windows, updated per tick."""

    def __init__(self, scale_type: int, target_rate: int, config: AutoScalerConfig, now: float) -> None:
        self.scale_type = scale_type
        self.target_rate = target_rate
        self.start = now
        self.last_tick = now
        self.last_report = now
        self.count = 0.0
        self.rates = [0.0, 0.0, 0.0, 0.0]
        tick = config.tick_s
        self._tick = tick
        self._alphas = [1 - math.exp(-tick / (config.window_s * k)) for k in (1, 2.5, 5, 10)]

    def update(self, data_length: int, events: int, now: float) -> None:
        self.count += data_length if self.scale_type == BY_DATA_RATE else events
        age = now - self.last_tick
        if age > self._tick:
            self.last_tick = now
            count, self.count = self.count, 0.0
            iterations = int(age / self._tick)
            for _ in range(iterations - 1):  # silent ticks in between
                self._decay(0.0, self._tick)
            self._decay(count, age - (iterations - 1) * self._tick)

    def _decay(self, count: float, duration: float) -> None:
        instant = count / duration
        self.rates = [instant if r == 0 else r + a * (instant - r) for r, a in zip(self.rates, self._alphas)]

    def scaled_rates(self) -> list[float]:
        """Events/s, or KiB/s for a data-rate policy (as the policy's target is given)."""
        return [r / 1024 for r in self.rates] if self.scale_type == BY_DATA_RATE else list(self.rates)


class AutoScaler:
    """The segment store's auto-scale monitor and processor, posting requests to ``handler``.

    ``policy_of(scope, stream)`` answers the stream's (scale type, target rate) or None; it is asked
    when a segment's traffic is first seen and at every report, so a policy change takes effect
    within a window. ``handler(event)`` runs on this object's own thread (the request stream's
    reader in Pravega).
    """

    def __init__(self, config: AutoScalerConfig, policy_of: Callable[[str, str], tuple[int, int] | None],
                 handler: Callable[[AutoScaleEvent], None] | None = None) -> None:
        self.config = config
        self._policy_of = policy_of
        self._handler = handler
        self._lock = threading.Lock()
        self._aggregates: dict[str, SegmentAggregates | None] = {}  # None: not auto-scaled
        self._mute: dict[str, list[float]] = {}  # name -> [last up request, last down request, last access]
        self._txn_traffic: dict[str, list[float]] = {}  # transaction segment -> [bytes, events, first seen]
        self._requests: queue.Queue[AutoScaleEvent | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def set_handler(self, handler: Callable[[AutoScaleEvent], None]) -> None:
        self._handler = handler

    # ---------------------------------------------------------------- what the segment store reports

    def record_append(self, segment: str, data_length: int, events: int) -> None:
        parsed = parse_qualified_segment_name(segment)
        if parsed is None:
            return
        scope, stream, _sid, txn = parsed
        now = time.time()
        if txn:  # counted against the parent when the transaction is merged (Pravega's updateTx)
            with self._lock:
                t = self._txn_traffic.setdefault(segment, [0, 0, now])
                t[0] += data_length
                t[1] += events
            return
        self._update(segment, scope, stream, data_length, events, now)

    def record_merge(self, source: str, target: str) -> None:
        with self._lock:
            traffic = self._txn_traffic.pop(source, None)
        parsed = parse_qualified_segment_name(target)
        if traffic is None or parsed is None:
            return
        size, events, created = traffic
        now = time.time()
        lifetime = now - created
        tick = self.config.tick_s
        if lifetime >= tick:  # amortize a long transaction over its lifetime, as Pravega does
            size, events = size * tick / lifetime, int(events * tick / lifetime)
        self._update(target, parsed[0], parsed[1], int(size), int(events), now)

    def notify_created(self, segment: str) -> None:
        now = time.time()
        with self._lock:
            self._mute[segment] = [now, now, now]

    def notify_gone(self, segment: str) -> None:
        """Sealed or deleted: no more requests for it."""
        with self._lock:
            self._mute.pop(segment, None)
            self._aggregates.pop(segment, None)
            self._txn_traffic.pop(segment, None)

    def _update(self, segment: str, scope: str, stream: str, data_length: int, events: int, now: float) -> None:
        with self._lock:
            agg = self._aggregates.get(segment, False)
        if agg is False:  # first traffic seen: ask for the policy outside the lock
            policy = self._policy_of(scope, stream)
            agg = SegmentAggregates(policy[0], policy[1], self.config, now) if policy else None
            with self._lock:
                agg = self._aggregates.setdefault(segment, agg)
        if agg is None:
            return
        report = False
        with self._lock:
            agg.update(data_length, events, now)
            if now - agg.last_report > self.config.window_s:
                agg.last_report = now
                report = True
        if report:
            policy = self._policy_of(scope, stream)
            if policy is None:
                with self._lock:
                    self._aggregates[segment] = None
                return
            agg.scale_type, agg.target_rate = policy
            self._report(segment, scope, stream, agg, now)

    def _report(self, segment: str, scope: str, stream: str, agg: SegmentAggregates, now: float) -> None:
        """Pravega's AutoScaleProcessor.report: thresholds 5x over one window, 2x over 2.5 windows,
        1x over 5 windows for a split; every rate below target and the longest below half of it for a
        merge; nothing before the cooldown."""
        cfg = self.config
        target = agg.target_rate
        two, five, ten, twenty = agg.scaled_rates()
        age = now - agg.start
        with self._lock:
            entry = self._mute.setdefault(segment, [0.0, 0.0, now])
            entry[2] = now
        if age <= cfg.cooldown_s:
            return
        w = cfg.window_s
        if (two > 5 * target and age > w) or (five > 2 * target and age > 2.5 * w) or (ten > target and age > 5 * w):
            splits = max(2, int(max(two, five, ten) / target))
            self._request(segment, scope, stream, UP, now, splits)
        if two < target and five < target and ten < target and twenty < target / 2 and age > 10 * w:
            self._request(segment, scope, stream, DOWN, now)

    def _request(self, segment: str, scope: str, stream: str, direction: str, now: float, splits: int = 0,
                 silent: bool = False) -> None:
        with self._lock:
            entry = self._mute.setdefault(segment, [0.0, 0.0, now])
            last = entry[0] if direction == UP else entry[1]
            if now - last <= self.config.mute_s:
                return
            if direction == UP:
                entry[0] = entry[1] = now  # a split mutes both directions
            elif not silent:
                entry[1] = now
        sid = parse_qualified_segment_name(segment)[2]  # type: ignore[index]
        self._requests.put(AutoScaleEvent(scope, stream, sid, direction, int(now * 1000), splits, silent))

    def expire_idle(self, now: float | None = None) -> None:
        """Pravega's cache expiry: a segment without traffic reports for 10 windows is reported cold
        (silently: its cold marker never expires)."""
        now = time.time() if now is None else now
        horizon = 10 * self.config.window_s
        with self._lock:
            idle = [name for name, entry in self._mute.items() if now - entry[2] > horizon]
            for name in idle:
                self._mute[name][2] = now
        for name in idle:
            parsed = parse_qualified_segment_name(name)
            if parsed is None or parsed[3] or self._policy_of(parsed[0], parsed[1]) is None:
                continue
            self._request(name, parsed[0], parsed[1], DOWN, now, silent=True)

    # ---------------------------------------------------------------- the request stream's reader

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pravega-autoscale", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._requests.put(None)
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        next_expiry = time.monotonic() + self.config.window_s
        while not self._stop.is_set():
            try:
                event = self._requests.get(timeout=min(1.0, self.config.window_s))
            except queue.Empty:
                event = None
            if event is not None and self._handler is not None:
                if now_ms() - event.timestamp_ms <= self.config.mute_s * 1000:  # still valid
                    try:
                        self._handler(event)
                    except Exception:
                        log.exception("auto-scale request %s failed", event)
            if time.monotonic() >= next_expiry:
                next_expiry = time.monotonic() + self.config.window_s
                self.expire_idle()


class RecordingBackend:
    """The segment backend the controller drives, telling the auto-scaler about creations, seals,
    deletions and transaction merges (what Pravega's segment store reports to its stats recorder)."""

    def __init__(self, backend: SegmentBackend, scaler: AutoScaler) -> None:
        self._backend = backend
        self._scaler = scaler

    def create_segment(self, name: str) -> None:
        self._backend.create_segment(name)
        self._scaler.notify_created(name)

    def seal_segment(self, name: str) -> int:
        length = self._backend.seal_segment(name)
        self._scaler.notify_gone(name)
        return length

    def merge_segment(self, source: str, target: str) -> int:
        length = self._backend.merge_segment(source, target)
        self._scaler.record_merge(source, target)
        return length

    def discard_segment(self, name: str) -> None:
        self._backend.discard_segment(name)
        self._scaler.notify_gone(name)

    def delete_segment(self, name: str) -> None:
        self._backend.delete_segment(name)
        self._scaler.notify_gone(name)

    def truncate_segment(self, name: str, offset: int) -> None:
        self._backend.truncate_segment(name, offset)

    def segment_info(self, name: str) -> SegmentInfo | None:
        return self._backend.segment_info(name)
