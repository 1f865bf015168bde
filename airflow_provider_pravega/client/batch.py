"""Parallel batch reads of a stream between two stream cuts.

Why: a reader group reads one stream through one coordinated group and has no end cut, so it can
neither stop exactly at a cut nor be split across Spark tasks. Here a driver *plans* the byte ranges
of every segment between two cuts (:func:`plan_segment_ranges`, following successors across
scaling), and each task reads its ranges straight from the segment store
(:func:`read_segment_range`): ReadSegment requests of several MiB, events split without per-byte
Python work, stopping exactly at the range's end (cut offsets are event boundaries).

Plans are deterministic: for two concrete cuts the same ranges come back every time, because every
end offset is fixed at planning time - the end cut's offset for segments in the end cut, and the
final length of sealed segments (which never changes). ``SegmentRange.end_offset`` may be None only
in ranges built by hand: it means "to the end of the segment if it is sealed, else to its tail as
observed when the read starts" (not deterministic; :func:`plan_segment_ranges` never returns it).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import queue
import struct
import threading
from array import array
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Literal, NamedTuple

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.client.connection import ConnectionPool, next_request_id
from airflow_provider_pravega.client.controller import ControllerClient
from airflow_provider_pravega.client.controller_types import Endpoint
from airflow_provider_pravega.client.controller_types import SegmentRange as KeyRange
from airflow_provider_pravega.client.errors import (
    ControllerError,
    InvalidStreamCutError,
    NoSuchSegmentError,
    SegmentStoreError,
    SegmentStoreUnreachableError,
    StreamNotFoundError,
    TruncatedStreamCutError,
)
from airflow_provider_pravega.client.segment_client import SegmentStoreClient
from airflow_provider_pravega.client.segment_replies import raise_for_reply
from airflow_provider_pravega.client.streamcut import (
    StreamCut,
    StreamCutMismatchError,
    controller_of,
    segments_of,
)
from airflow_provider_pravega.protocol import event_frames, naming, wire

__all__ = [
    "DEFAULT_READ_CHUNK",
    "ArrowBatch",
    "Event",
    "EventBatch",
    "SegmentRange",
    "SegmentRangeTruncatedError",
    "advance_cut",
    "StreamCutOrderError",
    "plan_segment_ranges",
    "read_segment_range",
    "read_segment_range_arrow",
    "read_segment_range_batches",
    "read_segment_ranges",
]

#: Bytes asked for per ReadSegment (the official reader asks 8 MiB; servers may answer less).
DEFAULT_READ_CHUNK = 8 * 1024 * 1024
#: A SegmentRead frame must stay under the 16 MiB frame limit.
MAX_READ_CHUNK = wire.MAX_FRAME - 64 * 1024
_KEY_EPSILON = 1e-9


class StreamCutOrderError(InvalidStreamCutError):
    """The start cut lies after the end cut (on some segment or key range)."""


class SegmentRangeTruncatedError(TruncatedStreamCutError):
    """Reading a range hit data that was truncated away; ``start_offset`` is the segment's new head."""

    def __init__(self, scope: str, stream: str, detail: str, *, segment_id: int, start_offset: int) -> None:
        self.segment_id = segment_id
        self.start_offset = start_offset
        super().__init__(scope, stream, detail)


# ------------------------------------------------------------------------------------ values


@dataclass(frozen=True, slots=True)
class SegmentRange:
    """Bytes [start_offset, end_offset) of one segment; picklable and JSON-able (to_json).

    ``end_offset`` None: to the end of a sealed segment, or to the tail seen when the read starts.
    """

    scope: str
    stream: str
    segment_id: int
    start_offset: int
    end_offset: int | None

    def __post_init__(self) -> None:
        for name in ("segment_id", "start_offset"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"SegmentRange.{name} must be a non-negative integer, got {value!r}")
        end = self.end_offset
        if end is not None:
            if isinstance(end, bool) or not isinstance(end, int):
                raise ValueError(f"SegmentRange.end_offset must be an integer or None, got {end!r}")
            if end < self.start_offset:
                raise ValueError(
                    f"SegmentRange of segment {self.segment_id} ends ({end}) before it starts ({self.start_offset})"
                )

    @property
    def segment_name(self) -> str:
        return naming.qualified_segment_name(self.scope, self.stream, self.segment_id)

    @property
    def epoch(self) -> int:
        return naming.segment_epoch(self.segment_id)

    @property
    def length(self) -> int | None:
        """Bytes in the range (None when the end is open)."""
        return None if self.end_offset is None else self.end_offset - self.start_offset

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SegmentRange:
        try:
            end = data["end_offset"]
            return cls(
                str(data["scope"]),
                str(data["stream"]),
                int(data["segment_id"]),
                int(data["start_offset"]),
                None if end is None else int(end),
            )
        except KeyError as exc:
            raise ValueError(f"SegmentRange JSON lacks field {exc.args[0]!r}") from None


class Event(NamedTuple):
    """One event read from a segment: its payload, segment and the offset of its 8-byte header."""

    payload: bytes
    segment_id: int
    offset: int


class EventBatch(NamedTuple):
    """Consecutive events of one segment: ``offsets[i]`` is where ``payloads[i]``'s header starts."""

    segment_id: int
    payloads: list[bytes]
    offsets: list[int]


class ArrowBatch(NamedTuple):
    """Consecutive events of one segment in Arrow form: ``payloads`` (pyarrow BinaryArray),
    ``offsets`` (int64 numpy array; where each event's header starts) and the payloads' total size."""

    segment_id: int
    payloads: Any
    offsets: Any
    payload_bytes: int


# ---------------------------------------------------------------------------------- planning


class _History:
    """What the controller knows about the stream's segments, fetched lazily and cached:
    key ranges (from the epoch a segment was created in) and successors (which give the epoch a
    segment was sealed in). Segment relations are decided from these, the way Pravega orders
    segments: ``a`` is before ``b`` when their key ranges overlap and ``a`` was sealed no later
    than ``b`` was created."""

    def __init__(self, controller: ControllerClient, scope: str, stream: str) -> None:
        self.controller = controller
        self.scope = scope
        self.stream = stream
        self._ranges: dict[int, tuple[float, float]] = {}
        self._epochs_loaded: set[int] = set()
        self._successors: dict[int, list[KeyRange]] = {}

    def key_range(self, segment_id: int) -> tuple[float, float]:
        hit = self._ranges.get(segment_id)
        if hit is not None:
            return hit
        epoch = segment_id >> 32
        if epoch not in self._epochs_loaded:
            self._epochs_loaded.add(epoch)
            try:
                segments = self.controller.get_epoch_segments(self.scope, self.stream, epoch)
            except (ControllerError, StreamNotFoundError):
                # An epoch the stream never had (the controller answers NOT_FOUND).
                segments = []
            for seg in segments:
                self._ranges.setdefault(seg.segment_id, (seg.min_key, seg.max_key))
        hit = self._ranges.get(segment_id)
        if hit is None:
            raise InvalidStreamCutError(
                f"segment {_seg(segment_id)} does not belong to stream {self.scope}/{self.stream} "
                f"(the controller does not know it); the cut is probably of another stream"
            )
        return hit

    def successors(self, segment_id: int) -> list[KeyRange]:
        hit = self._successors.get(segment_id)
        if hit is None:
            hit = [s.segment for s in self.controller.get_successors(self.scope, self.stream, segment_id)]
            for seg in hit:
                self._ranges.setdefault(seg.segment_id, (seg.min_key, seg.max_key))
            self._successors[segment_id] = hit
        return hit

    def sealed_epoch(self, segment_id: int) -> int | None:
        """The epoch whose scale replaced the segment; None while it has no successors."""
        succ = self.successors(segment_id)
        return min(s.segment_id >> 32 for s in succ) if succ else None

    def overlap(self, a: int, b: int) -> bool:
        alo, ahi = self.key_range(a)
        blo, bhi = self.key_range(b)
        return alo < bhi and blo < ahi

    def before(self, a: int, b: int) -> bool:
        """Every event of ``a`` precedes every event of ``b`` on their shared keys."""
        if a == b or not self.overlap(a, b):
            return False
        sealed = self.sealed_epoch(a)
        return sealed is not None and sealed <= (b >> 32)

    def check_cut(self, cut: Mapping[int, int], label: str) -> None:
        """The cut's key ranges must tile [0, 1) without gaps or overlaps (as Pravega requires)."""
        ranges = sorted((*self.key_range(s), s) for s in cut)
        problem = None
        if abs(ranges[0][0]) > _KEY_EPSILON:
            problem = f"its key ranges start at {ranges[0][0]}, not 0.0"
        for (_, ahi, a), (blo, _, b) in itertools.pairwise(ranges):
            if problem is None and abs(ahi - blo) > _KEY_EPSILON:
                kind = "overlap" if blo < ahi else "leave a gap"
                problem = f"the key ranges of segments {_seg(a)} and {_seg(b)} {kind} ({ahi} vs {blo})"
        if problem is None and abs(ranges[-1][1] - 1.0) > _KEY_EPSILON:
            problem = f"its key ranges end at {ranges[-1][1]}, not 1.0"
        if problem is not None:
            raise InvalidStreamCutError(
                f"the {label} cut {dict(cut)} of {self.scope}/{self.stream} is not a complete stream cut: {problem}"
            )


def _seg(segment_id: int) -> str:
    return f"{segment_id & 0xFFFF_FFFF}.#epoch.{segment_id >> 32}"


def _behind(
    history: _History, earlier: Mapping[int, int], later: Mapping[int, int], earlier_label: str, later_label: str
) -> list[str]:
    """Where cut ``later`` lies before cut ``earlier`` (reasons; empty when it does not)."""
    reasons = []
    for s, s_off in later.items():
        for e, e_off in earlier.items():
            if s == e:
                if s_off < e_off:
                    reasons.append(f"segment {_seg(s)}: {later_label} offset {s_off} < {earlier_label} offset {e_off}")
            elif history.before(s, e):
                reasons.append(f"segment {_seg(s)} of the {later_label} precedes segment {_seg(e)} of the {earlier_label}")
    return reasons


def _later_of(history: _History, a: Mapping[int, int], b: Mapping[int, int]) -> dict[int, int]:
    """The cut that is, on every key, the later of cuts ``a`` and ``b``."""
    points = sorted({p for s in (*a, *b) for p in history.key_range(s)})
    out: dict[int, int] = {}
    for lo, hi in itertools.pairwise(points):
        mid = (lo + hi) / 2
        sa = next(s for s in a if history.key_range(s)[0] <= mid < history.key_range(s)[1])
        sb = next(s for s in b if history.key_range(s)[0] <= mid < history.key_range(s)[1])
        if sa == sb:
            pick, offset = sa, max(a[sa], b[sb])
        elif history.before(sa, sb):
            pick, offset = sb, b[sb]
        else:
            pick, offset = sa, a[sa]
        out[pick] = max(offset, out.get(pick, offset))
    return out


def plan_segment_ranges(
    client: Any,
    start: StreamCut,
    end: StreamCut,
    *,
    on_truncated: Literal["error", "head"] = "error",
    include_empty: bool = False,
) -> list[SegmentRange]:
    """The byte ranges holding exactly the events between ``start`` and ``end``.

    Each segment from the start cut onwards (following successors across scaling, up to the end
    cut) appears once: from its offset in ``start`` (0 for successors) to its offset in ``end``
    (its final length when it was sealed before the end cut). Ranges are ordered predecessors
    before successors (by creation epoch, then key range), so reading them in order keeps each
    routing key's events in order. Symbolic cuts are resolved now.

    Raises StreamCutMismatchError (cuts of different streams), StreamCutOrderError (start after
    end), InvalidStreamCutError (incomplete cut, unknown segment) and TruncatedStreamCutError when
    ``start`` is before the stream's head - unless ``on_truncated="head"``, which starts from the
    head wherever ``start`` is behind it.
    """
    if on_truncated not in ("error", "head"):
        raise ValueError(f"on_truncated must be 'error' or 'head', got {on_truncated!r}")
    if not isinstance(start, StreamCut) or not isinstance(end, StreamCut):
        raise TypeError("plan_segment_ranges needs StreamCut start and end cuts (see StreamCut.coerce)")
    if (start.scope, start.stream) != (end.scope, end.stream):
        raise StreamCutMismatchError(start.scoped_stream, end.scoped_stream, "end cut")
    controller = controller_of(client)
    segments = segments_of(client)
    scope, stream = start.scope, start.stream
    start = start.resolve(client)
    end = end.resolve(client)
    history = _History(controller, scope, stream)
    s_cut, e_cut = dict(start.positions), dict(end.positions)
    history.check_cut(s_cut, "start")
    history.check_cut(e_cut, "end")

    head = controller.get_segments_at_head(scope, stream)
    truncated = _behind(history, head, s_cut, "head", "start cut")
    if truncated:
        if on_truncated == "error":
            raise TruncatedStreamCutError(scope, stream, "; ".join(truncated[:5]))
        s_cut = _later_of(history, s_cut, head)

    backwards = _behind(history, s_cut, e_cut, "start cut", "end cut")
    if backwards:
        raise StreamCutOrderError(
            f"the start cut of {scope}/{stream} is after the end cut: {'; '.join(backwards[:5])}. Swap the "
            f"cuts or take the end cut later."
        )

    planned: dict[int, list[int | None]] = {}
    queue = sorted(s_cut)
    while queue:
        segment_id = queue.pop(0)
        if segment_id in planned:
            continue
        if segment_id in e_cut:
            planned[segment_id] = [s_cut.get(segment_id, 0), e_cut[segment_id]]
            continue
        successors = history.successors(segment_id)
        if not successors:
            raise InvalidStreamCutError(
                f"the end cut {e_cut} of {scope}/{stream} does not reach segment {_seg(segment_id)}, which "
                f"has no successors; end cuts must cover every key range"
            )
        planned[segment_id] = [s_cut.get(segment_id, 0), None]
        for succ in successors:
            sid = succ.segment_id
            if sid in planned or sid in queue:
                continue
            if any(history.before(e, sid) for e in e_cut):
                continue  # beyond the end cut
            if any(history.before(sid, s) for s in s_cut):
                continue  # already behind the start cut on its keys
            queue.append(sid)

    ranges: list[SegmentRange] = []
    for segment_id, (begin, finish) in planned.items():
        if finish is None:
            name = naming.qualified_segment_name(scope, stream, segment_id)
            try:
                info = segments.get_segment_info(name)
            except NoSuchSegmentError:
                raise TruncatedStreamCutError(
                    scope, stream, f"segment {_seg(segment_id)} between the cuts no longer exists"
                ) from None
            if not info.sealed:
                raise SegmentStoreError(
                    f"segment {name} has successors but is not sealed yet (a scale is in progress); plan again",
                    segment=name,
                )
            finish = info.length
        assert begin is not None
        if finish < begin:
            raise StreamCutOrderError(
                f"segment {_seg(segment_id)} of {scope}/{stream} ends at {finish}, before the start offset {begin}"
            )
        if finish > begin or include_empty:
            ranges.append(SegmentRange(scope, stream, segment_id, begin, finish))
    ranges.sort(key=lambda r: (r.segment_id >> 32, history.key_range(r.segment_id), r.segment_id))
    return ranges


def advance_cut(
    client: Any,
    start: StreamCut,
    end: StreamCut,
    *,
    max_bytes: int | None = None,
    max_events: int | None = None,
) -> StreamCut:
    """The cut up to which a reader from ``start`` goes next, at most ``max_bytes`` segment bytes
    (event headers included) and ``max_events`` events past ``start``, never past ``end``.

    Why: a micro-batch must not hold a whole backlog. Without limits, or when everything up to
    ``end`` fits, this is ``end`` (resolved). Otherwise the budget goes to the segments of the
    current cut in planning order (predecessors first), each advanced to an event boundary (found by
    reading the bytes it hands out, so a limited step costs a read of at most that budget); a
    sealed segment read to its end is replaced by its successors only together with every segment
    its scale replaced, so each returned cut tiles the key space as Pravega's cuts do. At least one
    event is taken when there is any, so a single event larger than the budget cannot stall a reader.
    """
    for name, value in (("max_bytes", max_bytes), ("max_events", max_events)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    start = start.resolve(client)
    end = end.resolve(client)
    ranges = plan_segment_ranges(client, start, end, include_empty=True)
    total = sum(r.length or 0 for r in ranges)
    if (max_bytes is None or total <= max_bytes) and max_events is None or total == 0:
        return end
    history = _History(controller_of(client), start.scope, start.stream)
    ends = {r.segment_id: r.end_offset for r in ranges}
    order = {r.segment_id: i for i, r in enumerate(ranges)}
    sealed = {r.segment_id for r in ranges if r.segment_id not in end.positions}
    cut = dict(start.positions)
    for segment_id in cut:
        ends.setdefault(segment_id, cut[segment_id])  # in the start cut, nothing planned (already at end)
    bytes_left = max_bytes if max_bytes is not None else total
    events_left = max_events if max_events is not None else total
    taken_any = False
    while bytes_left > 0 and events_left > 0:
        progressed = False
        for segment_id in sorted(cut, key=lambda s: order.get(s, -1)):
            finish = ends[segment_id]
            if cut[segment_id] >= finish or bytes_left <= 0 or events_left <= 0:
                continue
            rng = SegmentRange(start.scope, start.stream, segment_id, cut[segment_id], finish)
            offset, used, count = _boundary_within(client, rng, bytes_left, events_left, force=not taken_any)
            if count:
                cut[segment_id] = offset
                bytes_left -= used
                events_left -= count
                taken_any = progressed = True
        replaced = _replace_finished(history, cut, ends, sealed)
        if not progressed and not replaced:
            break
    return StreamCut(start.scope, start.stream, cut)


def _boundary_within(client: Any, rng: SegmentRange, max_bytes: int, max_events: int,
                     force: bool) -> tuple[int, int, int]:
    """``(offset, bytes, events)``: the furthest event boundary of ``rng`` within the budget
    (with ``force``, at least one event even when it alone is over budget). Reads in chunks of
    about the budget and stops there: no read-ahead past what it hands out."""
    offset, used, count = rng.start_offset, 0, 0
    chunk = min(DEFAULT_READ_CHUNK, max(64 * 1024, max_bytes))
    reads = read_segment_range_batches(client, rng, chunk=chunk)
    try:
        for batch in reads:
            for payload, at in zip(batch.payloads, batch.offsets, strict=True):
                size = len(payload) + 8
                if (count or not force) and (used + size > max_bytes or count >= max_events):
                    return offset, used, count
                used += size
                count += 1
                offset = at + size
    finally:
        reads.close()
    return offset, used, count


def _replace_finished(history: _History, cut: dict[int, int], ends: Mapping[int, int | None],
                      sealed: set[int]) -> bool:
    """Replace each group of sealed, fully read segments of ``cut`` by their successors, one scale
    at a time (the segments that scale sealed, whose successors' key ranges are exactly theirs);
    True when any was. A group whose scale also sealed a segment not yet reached waits for it."""
    changed = False
    for segment_id in sorted(cut):
        if segment_id not in cut or segment_id not in sealed or cut[segment_id] < (ends.get(segment_id) or 0):
            continue
        scale = history.sealed_epoch(segment_id)
        group, successors = {segment_id}, {s.segment_id for s in history.successors(segment_id)}
        while True:
            more = {p for p in cut if p not in group and p in sealed and history.sealed_epoch(p) == scale
                    and any(history.overlap(p, t) for t in successors)}
            if not more:
                break
            group |= more
            for p in more:
                successors |= {s.segment_id for s in history.successors(p)}
        if not all(cut[p] >= (ends.get(p) or 0) for p in group) or not all(t in ends for t in successors):
            continue
        candidate = {p: o for p, o in cut.items() if p not in group} | dict.fromkeys(successors, 0)
        try:
            history.check_cut(candidate, "next")
        except InvalidStreamCutError:
            continue  # the scale also sealed a segment the cut has not reached yet
        cut.clear()
        cut.update(candidate)
        changed = True
    return changed


# ----------------------------------------------------------------------------------- reading

_EVENT_HEADER = struct.Struct(">ii")
_new_tuple = tuple.__new__


class _ProcessLocal:
    """Connection pools and clients created lazily per process (Spark forks and spawns workers).

    A forked child starts with a fresh lock and nothing cached, so it never shares a socket (or a
    lock some other parent thread held at the fork) with its parent.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.lock = threading.Lock()
        self.pool: ConnectionPool | None = None
        self.clients: dict[Any, Any] = {}

    def get_pool(self) -> ConnectionPool:
        with self.lock:
            if self.pool is None:
                self.pool = ConnectionPool()
            return self.pool

    def get_client(self, key: Any, target: Any) -> Any:
        with self.lock:
            client = self.clients.get(key)
            if client is None:
                client = PravegaClient(target)
                self.clients[key] = client
            return client


_LOCAL = _ProcessLocal()
os.register_at_fork(after_in_child=_LOCAL.reset)


def _parse_endpoint(text: str) -> Endpoint:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"segment store endpoint must be 'host:port', got {text!r}")
    return Endpoint(host.strip("[]"), int(port))


class _Source:
    """Where a range's bytes come from: (endpoint, delegation token, pool), with a way to look
    the endpoint up again after a failure when a controller is available."""

    def __init__(self, target: Any, rng: SegmentRange) -> None:
        self.segments: SegmentStoreClient | None = None
        self.fixed: Endpoint | None = None
        if isinstance(target, Endpoint):
            self.fixed = target
        elif isinstance(target, str) and "://" not in target:
            self.fixed = _parse_endpoint(target)
        elif isinstance(target, (str, PravegaConnectionConfig)):
            # The config itself is the key (its repr hides the password, so two configs that differ
            # only in their password would share a client under it).
            self.segments = _LOCAL.get_client(target, target).segments
        else:
            self.segments = segments_of(target)
        self.name = rng.segment_name
        if self.segments is not None:
            self.pool = self.segments.pool
            self.token = self.segments.token_for(self.name)
        else:
            self.pool = _LOCAL.get_pool()
            self.token = ""

    def endpoint(self) -> Endpoint:
        if self.fixed is not None:
            return self.fixed
        assert self.segments is not None
        return self.segments.endpoint_for(self.name)

    def forget(self) -> None:
        if self.segments is not None:
            self.segments.forget_endpoint(self.name)

    def tail(self) -> int:
        """End of the data now: GetStreamSegmentInfo's write offset."""
        if self.segments is not None:
            return self.segments.get_segment_info(self.name).length
        reply = self.pool.call(self.endpoint(), wire.GetStreamSegmentInfo(next_request_id(), self.name, self.token))
        raise_for_reply(reply, endpoint=self.fixed, segment=self.name)
        if not isinstance(reply, wire.StreamSegmentInfo):
            raise SegmentStoreError(f"unexpected reply {type(reply).__name__} to GetStreamSegmentInfo", segment=self.name)
        return reply.write_offset


def _check_read_args(rng: SegmentRange, chunk: int) -> None:
    if not isinstance(rng, SegmentRange):
        raise TypeError(f"a SegmentRange is needed, got {type(rng).__name__}")
    if not 0 < chunk <= MAX_READ_CHUNK:
        raise ValueError(f"chunk must be within 1..{MAX_READ_CHUNK} bytes, got {chunk}")


def read_segment_range(
    client_or_endpoint: Any,
    rng: SegmentRange,
    *,
    chunk: int = DEFAULT_READ_CHUNK,
    max_event_size: int = wire.MAX_EVENT_SIZE,
    retries: int = 3,
) -> Iterator[Event]:
    """Yield the events of ``rng`` in order, reading straight from the segment store.

    ``client_or_endpoint``: a PravegaClient / SegmentStoreClient (the segment's store is looked up
    with getURI), a controller URI ``tcp://host:9090`` or PravegaConnectionConfig (a client is
    built once per process), or a segment-store ``Endpoint`` / ``"host:port"`` (no controller).
    Connections are made lazily in the calling process, so this works inside forked Spark
    workers. A broken connection is retried ``retries`` times from the current offset.

    Raises SegmentRangeTruncatedError when the range's data was truncated away, NoSuchSegmentError
    when the segment is gone, and SegmentStoreError when the segment ends before the range does or
    the range does not end on an event boundary.
    """
    _check_read_args(rng, chunk)
    return _events(client_or_endpoint, rng, chunk, max_event_size, retries)


def read_segment_range_batches(
    client_or_endpoint: Any,
    rng: SegmentRange,
    *,
    chunk: int = DEFAULT_READ_CHUNK,
    max_event_size: int = wire.MAX_EVENT_SIZE,
    retries: int = 3,
) -> Iterator[EventBatch]:
    """Like :func:`read_segment_range`, but one :class:`EventBatch` per segment-store reply: the
    fast path for bulk consumers (Spark partitions), with no Python object per event beyond its
    payload."""
    _check_read_args(rng, chunk)
    return _batches(client_or_endpoint, rng, chunk, max_event_size, retries)


def read_segment_range_arrow(
    client_or_endpoint: Any,
    rng: SegmentRange,
    *,
    chunk: int = DEFAULT_READ_CHUNK,
    max_event_size: int = wire.MAX_EVENT_SIZE,
    retries: int = 3,
) -> Iterator[ArrowBatch]:
    """Like :func:`read_segment_range_batches`, but the payloads of each reply as one pyarrow
    ``BinaryArray`` and their offsets as an int64 numpy array (:class:`ArrowBatch`): no Python
    object per event at all. Arrow cuts the payloads out of the reply in C++ (Spark's
    ``mapInArrow`` export reads this way). Needs pyarrow and numpy."""
    _check_read_args(rng, chunk)
    return _arrow_batches(client_or_endpoint, rng, chunk, max_event_size, retries)


def _events(target: Any, rng: SegmentRange, chunk: int, max_event_size: int, retries: int) -> Iterator[Event]:
    segment_id = rng.segment_id
    for batch in _batches(target, rng, chunk, max_event_size, retries):
        yield from map(_new_tuple, repeat(Event), zip(batch.payloads, repeat(segment_id), batch.offsets))


def _batches(target: Any, rng: SegmentRange, chunk: int, max_event_size: int, retries: int) -> Iterator[EventBatch]:
    segment_id = rng.segment_id
    for buf, base, starts, stop in _framed(target, rng, chunk, max_event_size, retries, ahead=0):
        ends = starts[1:]
        ends.append(stop)
        payloads = [buf[head + 8 : end] for head, end in zip(starts, ends)]
        yield EventBatch(segment_id, payloads, [base + head for head in starts])


def _arrow_batches(target: Any, rng: SegmentRange, chunk: int, max_event_size: int,
                   retries: int) -> Iterator[ArrowBatch]:
    # import cost: numpy and pyarrow only for Arrow batches; the triggers read events without them
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    segment_id = rng.segment_id
    binary = pa.binary()
    for buf, base, starts, stop in _framed(target, rng, chunk, max_event_size, retries, ahead=2):
        n = len(starts)
        # A view of the reply whose values are header + payload, then the payloads cut out of it.
        bounds = np.empty(n + 1, dtype=np.int32)
        bounds[:-1] = starts
        bounds[-1] = stop
        framed = pa.Array.from_buffers(binary, n, [None, pa.py_buffer(bounds), pa.py_buffer(buf)])
        offsets = bounds[:-1].astype(np.int64)
        offsets += base
        yield ArrowBatch(segment_id, pc.binary_slice(framed, 8, _MAX_SLICE), offsets,
                         stop - int(bounds[0]) - 8 * n)


def _framed(target: Any, rng: SegmentRange, chunk: int, max_event_size: int, retries: int,
            ahead: int) -> Iterator[tuple[bytes, int, array, int]]:
    """The whole events of each reply: ``(buffer, segment offset of buffer[0], positions of the
    event headers in the buffer, end of the last whole event)``. An event cut off by the end of a
    reply is carried over and completed with the next reply (without rescans or quadratic
    concatenation when one event spans many replies).

    ``ahead``: replies a helper thread fetches ahead (0: none). The Arrow reader, which hands
    each batch to Spark and holds the GIL little, uses it; the Event and EventBatch readers, which
    hold the GIL for a slice per event, measured no faster with it, so they read in the calling
    thread."""
    source = _Source(target, rng)
    name = source.name
    end = rng.end_offset
    if end is None:
        end = source.tail()
    base = rng.start_offset  # segment offset of the first byte not yet split into events
    carry: bytearray | None = None  # bytes of an incomplete event
    unpack = _EVENT_HEADER.unpack_from
    replies = _read_ahead(source, rng, end, chunk, retries, ahead) if ahead else _fetch(source, rng, end, chunk, retries)
    for data in replies:
        if carry is not None:
            carry += data
            if len(carry) < 8:
                continue
            kind, n = unpack(carry, 0)
            if kind == 0 and 0 <= n <= max_event_size and len(carry) < 8 + n:
                continue
            buf = bytes(carry)
        else:
            buf = data
        starts, stop = _event_starts(buf, max_event_size, name, base)
        carry = bytearray(memoryview(buf)[stop:]) if stop < len(buf) else None
        if len(starts):
            yield buf, base, starts, stop
        base += stop
    if carry:
        raise SegmentStoreError(
            f"the range [{rng.start_offset}, {end}) of segment {name} ends inside an event that starts at "
            f"{base}; ranges must end on event boundaries (at stream-cut offsets)",
            segment=name,
        )


_DONE = object()


def _read_ahead(source: _Source, rng: SegmentRange, end: int, chunk: int, retries: int,
                depth: int = 2) -> Iterator[bytes]:
    """The bytes of ``[rng.start_offset, end)`` reply by reply, fetched by a helper thread up to
    ``depth`` replies ahead: the segment store prepares and sends the next reply while the caller
    splits the current one (socket reads release the GIL). Errors of the helper are raised here."""
    replies: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                replies.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def fetch() -> None:
        try:
            for data in _fetch(source, rng, end, chunk, retries):
                if not put(data):
                    return
            put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the reading thread, which raises it
            put(exc)

    worker = threading.Thread(target=fetch, name=f"pravega-read-{rng.segment_id}", daemon=True)
    worker.start()
    try:
        while True:
            item = replies.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        worker.join(timeout=5)


def _fetch(source: _Source, rng: SegmentRange, end: int, chunk: int, retries: int) -> Iterator[bytes]:
    """ReadSegment replies over one pooled connection. A broken connection or WrongHost resumes at
    the current offset: with a controller, on the segment's current owner within the client's
    failover bounds (:class:`~airflow_provider_pravega.client.segment_client.Failover`); with a fixed
    segment-store endpoint, ``retries`` times."""
    name = source.name
    offset = rng.start_offset
    failures = 0
    empty_replies = 0
    failover = source.segments.failover(name, "reading") if source.segments is not None else None
    while offset < end:
        endpoint = source.endpoint()
        try:
            with source.pool.connection(endpoint) as conn:
                while offset < end:
                    want = min(chunk, end - offset)
                    reply = conn.call(wire.ReadSegment(name, offset, want, source.token, next_request_id()))
                    if type(reply) is not wire.SegmentRead:
                        _raise_read_error(reply, rng, offset, endpoint, source)
                    if reply.offset != offset:
                        raise SegmentStoreError(
                            f"segment store {endpoint} answered a read of {name} at {offset} with offset {reply.offset}",
                            segment=name,
                            endpoint=str(endpoint),
                        )
                    data = reply.data
                    if not data:
                        empty_replies += 1
                        if reply.end_of_segment or reply.at_tail or empty_replies > 3:
                            where = "ends" if reply.end_of_segment else "has its tail"
                            raise SegmentStoreError(
                                f"segment {name} {where} at {offset}, before the end of the range "
                                f"[{rng.start_offset}, {end}); the range does not match this segment",
                                segment=name,
                                endpoint=str(endpoint),
                            )
                        continue  # a server that answered empty before its wait ran out: ask again
                    if len(data) > end - offset:
                        data = data[: end - offset]
                    offset += len(data)
                    failures = empty_replies = 0
                    if failover is not None:
                        failover.progress()
                    yield data
        except SegmentStoreUnreachableError as exc:
            if failover is not None:
                failover.retry(exc, endpoint)
                continue
            failures += 1
            if failures > retries:
                raise
            source.forget()


_MAX_SLICE = (1 << 31) - 1


def _event_starts(buf: bytes, max_event_size: int, name: str, base: int) -> tuple[array, int]:
    """Where the whole events of ``buf`` start (an ``array`` of header positions) and where the
    last whole one ends (:func:`~airflow_provider_pravega.protocol.event_frames.event_starts`: in C
    when the extension was built); a header that is not an event's is a SegmentStoreError."""
    starts, stop, bad = event_frames.event_starts(buf, max_event_size)
    if bad >= 0:
        kind, length = _EVENT_HEADER.unpack_from(buf, bad)
        raise SegmentStoreError(
            f"segment {name} has no valid event header at offset {base + bad} (type {kind}, length {length}); "
            f"the range must start on an event boundary",
            segment=name,
        )
    return starts, stop


def _raise_read_error(reply: Any, rng: SegmentRange, offset: int, endpoint: Endpoint, source: _Source) -> None:
    name = rng.segment_name
    if isinstance(reply, wire.SegmentIsTruncated):
        raise SegmentRangeTruncatedError(
            rng.scope,
            rng.stream,
            f"segment {_seg(rng.segment_id)} now starts at offset {reply.start_offset}; reading at {offset} is "
            f"no longer possible",
            segment_id=rng.segment_id,
            start_offset=reply.start_offset,
        )
    if isinstance(reply, wire.NoSuchSegment):
        raise NoSuchSegmentError(
            f"segment {name} does not exist at segment store {endpoint}: it was truncated away or its stream "
            f"was deleted; plan the ranges again from the stream's head",
            segment=name,
            endpoint=str(endpoint),
        )
    if isinstance(reply, wire.WrongHost):
        source.forget()
        raise SegmentStoreUnreachableError(
            f"segment store {endpoint} does not own {name}", segment=name, endpoint=str(endpoint)
        )
    raise_for_reply(reply, endpoint=endpoint, segment=name)
    raise SegmentStoreError(
        f"unexpected reply {type(reply).__name__} to ReadSegment of {name}", segment=name, endpoint=str(endpoint)
    )


def read_segment_ranges(
    client_or_endpoint: Any, ranges: Iterable[SegmentRange], **options: Any
) -> Iterator[Event]:
    """The events of several ranges, one range after the other (in plan order: per-key order holds)."""
    for rng in ranges:
        yield from read_segment_range(client_or_endpoint, rng, **options)
