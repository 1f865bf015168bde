"""The embedded controller's metadata as a pure model: scopes, streams, epochs, segments, transactions.

Nothing here does I/O or reads a clock. Every change is a JSON-able *record* (a dict with an
``op`` key) passed to :meth:`ControllerState.apply`; the controller writes the record to its log
before applying it, and recovery replays the same records, so a record must carry every value
its effect depends on (ids, timestamps, deadlines) — ``apply`` never invents one.

Vocabulary (as in Pravega):

* a stream's **epochs** are numbered from 0; each lists the segments that tile the routing-key
  space [0, 1) in that epoch. A scale or a rolled transaction appends epochs.
* a **segment id** is ``(creation epoch << 32) + number``; numbers grow across the stream's life,
  except that a rolled transaction's *duplicate* segments reuse the numbers of the segments they
  copy (as Pravega does), in a new epoch.
* a segment is **sealed at epoch e** when epoch e is the first epoch after its creation that does
  not list it; its successors are the segments of epoch e that overlap its key range.
* the **head** is the truncation stream cut (segment id -> offset); empty means untruncated.
* a stream with a retention policy keeps **retention cuts** (Pravega's retention set): stream cuts
  recorded periodically, each with its recording time and the stream's size up to it, oldest first.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_pravega.protocol.naming import segment_epoch, segment_id, segment_number

SCHEMA_VERSION = 1

# Transaction states, named as in the gRPC TxnState enum.
OPEN = "OPEN"
COMMITTING = "COMMITTING"
COMMITTED = "COMMITTED"
ABORTING = "ABORTING"
ABORTED = "ABORTED"
FINISHED_STATES = frozenset({COMMITTED, ABORTED})

# Stream states.
ACTIVE = "ACTIVE"
SEALED = "SEALED"
DELETING = "DELETING"


class StateError(ValueError):
    """A record that does not fit the current state (a bug or a corrupt log, never user input)."""


# Segment ids are built and taken apart in one place: protocol.naming.
segment_id_of = segment_id
epoch_of = segment_epoch
number_of = segment_number


def overlaps(a_min: float, a_max: float, b_min: float, b_max: float) -> bool:
    """Whether the key ranges [a_min, a_max) and [b_min, b_max) share any key."""
    return a_min < b_max and b_min < a_max


@dataclass(slots=True)
class SegmentRecord:
    segment_id: int
    min_key: float
    max_key: float
    sealed_epoch: int | None = None  # first epoch (after creation) that no longer lists it
    deleted: bool = False  # removed by truncation (or stream deletion)

    @property
    def creation_epoch(self) -> int:
        return epoch_of(self.segment_id)

    def to_json(self) -> list[Any]:
        return [self.segment_id, self.min_key, self.max_key, self.sealed_epoch, self.deleted]

    @classmethod
    def from_json(cls, data: list[Any]) -> SegmentRecord:
        return cls(int(data[0]), float(data[1]), float(data[2]), data[3], bool(data[4]))


@dataclass(slots=True)
class EpochRecord:
    epoch: int
    segment_ids: tuple[int, ...]  # sorted by min key
    created_ms: int

    def to_json(self) -> list[Any]:
        return [self.epoch, list(self.segment_ids), self.created_ms]

    @classmethod
    def from_json(cls, data: list[Any]) -> EpochRecord:
        return cls(int(data[0]), tuple(int(s) for s in data[1]), int(data[2]))


@dataclass(slots=True)
class StreamConfigRecord:
    """The stream configuration as the client gave it (returned verbatim by getStreamConfiguration)."""

    scale_type: int = 0
    target_rate: int = 0
    scale_factor: int = 0
    min_num_segments: int = 1
    retention: tuple[int, int, int] | None = None  # (type, param, max) or absent
    tags: tuple[str, ...] | None = None  # None: the client sent no tags

    def to_json(self) -> dict[str, Any]:
        return {
            "scale_type": self.scale_type,
            "target_rate": self.target_rate,
            "scale_factor": self.scale_factor,
            "min_num_segments": self.min_num_segments,
            "retention": list(self.retention) if self.retention is not None else None,
            "tags": list(self.tags) if self.tags is not None else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StreamConfigRecord:
        retention = data.get("retention")
        tags = data.get("tags")
        return cls(
            scale_type=int(data["scale_type"]),
            target_rate=int(data["target_rate"]),
            scale_factor=int(data["scale_factor"]),
            min_num_segments=int(data["min_num_segments"]),
            retention=tuple(int(x) for x in retention) if retention is not None else None,  # type: ignore[arg-type]
            tags=tuple(str(t) for t in tags) if tags is not None else None,
        )


@dataclass(slots=True)
class RollPlan:
    """How a transaction of an older epoch is committed (Pravega's "rolling transaction").

    ``txn_duplicates`` copy the transaction epoch's segments into epoch ``base_epoch + 1``; the
    transaction's segments are merged into them and they are sealed at once. ``active_duplicates``
    copy the active epoch ``base_epoch`` into epoch ``base_epoch + 2``, which becomes active.
    Each entry is (new segment id, the segment it duplicates).
    """

    base_epoch: int
    txn_duplicates: tuple[tuple[int, int], ...]
    active_duplicates: tuple[tuple[int, int], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "base_epoch": self.base_epoch,
            "txn_duplicates": [list(p) for p in self.txn_duplicates],
            "active_duplicates": [list(p) for p in self.active_duplicates],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RollPlan:
        return cls(
            int(data["base_epoch"]),
            tuple((int(a), int(b)) for a, b in data["txn_duplicates"]),
            tuple((int(a), int(b)) for a, b in data["active_duplicates"]),
        )


@dataclass(slots=True)
class TxnRecord:
    txn_id: int  # the 128-bit id
    epoch: int
    state: str
    created_ms: int
    lease_ms: int
    deadline_ms: int  # wall clock; the lease reaper aborts an OPEN txn past it
    max_deadline_ms: int  # creation + max execution time; pings cannot extend past it
    finished_ms: int | None = None
    writer_id: str = ""
    commit_timestamp: int | None = None
    abort_reason: str | None = None
    roll: RollPlan | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": format(self.txn_id, "032x"),
            "epoch": self.epoch,
            "state": self.state,
            "created_ms": self.created_ms,
            "lease_ms": self.lease_ms,
            "deadline_ms": self.deadline_ms,
            "max_deadline_ms": self.max_deadline_ms,
            "finished_ms": self.finished_ms,
            "writer_id": self.writer_id,
            "commit_timestamp": self.commit_timestamp,
            "abort_reason": self.abort_reason,
            "roll": self.roll.to_json() if self.roll is not None else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TxnRecord:
        roll = data.get("roll")
        return cls(
            txn_id=int(data["id"], 16),
            epoch=int(data["epoch"]),
            state=str(data["state"]),
            created_ms=int(data["created_ms"]),
            lease_ms=int(data["lease_ms"]),
            deadline_ms=int(data["deadline_ms"]),
            max_deadline_ms=int(data["max_deadline_ms"]),
            finished_ms=data.get("finished_ms"),
            writer_id=str(data.get("writer_id", "")),
            commit_timestamp=data.get("commit_timestamp"),
            abort_reason=data.get("abort_reason"),
            roll=RollPlan.from_json(roll) if roll is not None else None,
        )


@dataclass(frozen=True, slots=True)
class RetentionCut:
    """A stream cut the retention service recorded: when, the stream's size up to it, the cut."""

    ts: int  # wall-clock ms
    size: int  # bytes the stream received before this cut (counted from the first recorded cut's base)
    cut: tuple[tuple[int, int], ...]  # (segment id, offset), sorted

    def to_json(self) -> list[Any]:
        return [self.ts, self.size, [list(p) for p in self.cut]]

    @classmethod
    def from_json(cls, data: list[Any]) -> RetentionCut:
        return cls(int(data[0]), int(data[1]), tuple((int(a), int(b)) for a, b in data[2]))


RETENTION_TIME = 1  # gRPC RetentionPolicy.TIME: retentionParam in milliseconds
RETENTION_SIZE = 2  # RetentionPolicy.SIZE: retentionParam in bytes


def retention_truncation_cut(
    retention_type: int, retention_param: int, cuts: list[RetentionCut], now_ms: int
) -> RetentionCut | None:
    """Where Pravega 0.13's retention service truncates a stream without subscribers
    (StreamMetadataTasks.getTruncationStreamCutBy{Time,Size}Limit with no lower bound): at the
    *most recent* recorded cut that keeps at least ``retention_param`` milliseconds (time: its
    recording time is that old) or bytes (size: the stream received that much after it, measured
    to the newest recorded cut). None when no recorded cut qualifies. (retentionMax bounds only
    consumption-based retention, which needs subscribers.)"""
    if not cuts:
        return None
    current_size = cuts[-1].size
    best: RetentionCut | None = None
    best_delta = None
    for c in cuts:
        delta = now_ms - c.ts if retention_type == RETENTION_TIME else current_size - c.size
        if delta >= retention_param and (best_delta is None or delta < best_delta):
            best, best_delta = c, delta
    return best


@dataclass(slots=True)
class StreamRecord:
    scope: str
    name: str
    config: StreamConfigRecord
    created_ms: int
    state: str = ACTIVE
    epochs: list[EpochRecord] = field(default_factory=list)
    segments: dict[int, SegmentRecord] = field(default_factory=dict)
    next_number: int = 0  # next fresh segment number
    head: dict[int, int] = field(default_factory=dict)
    txns: dict[int, TxnRecord] = field(default_factory=dict)
    txn_counter: int = 0  # the low 64 bits of the last transaction id handed out
    finished: dict[int, None] = field(default_factory=dict)  # finished txn ids, oldest first
    retention_cuts: list[RetentionCut] = field(default_factory=list)  # oldest first

    # ---- queries -------------------------------------------------------------------------

    @property
    def active_epoch(self) -> EpochRecord:
        return self.epochs[-1]

    def segments_of_epoch(self, epoch: int) -> list[SegmentRecord]:
        return [self.segments[s] for s in self.epochs[epoch].segment_ids]

    def active_segments(self) -> list[SegmentRecord]:
        return self.segments_of_epoch(len(self.epochs) - 1)

    def is_active_segment(self, segment_id: int) -> bool:
        return segment_id in self.active_epoch.segment_ids

    def successors(self, segment_id: int) -> list[tuple[SegmentRecord, list[int]]]:
        """Segments that replaced ``segment_id``, each with all of its predecessors' ids."""
        seg = self.segments.get(segment_id)
        if seg is None or seg.sealed_epoch is None:
            return []
        epoch = seg.sealed_epoch
        previous = self.epochs[epoch - 1].segment_ids
        current = set(self.epochs[epoch].segment_ids)
        out = []
        for succ in self.segments_of_epoch(epoch):
            if succ.segment_id in previous or not overlaps(seg.min_key, seg.max_key, succ.min_key, succ.max_key):
                continue
            preds = [
                p
                for p in previous
                if p not in current
                and overlaps(self.segments[p].min_key, self.segments[p].max_key, succ.min_key, succ.max_key)
            ]
            out.append((succ, preds))
        return out

    def head_positions(self) -> dict[int, int]:
        """The head of the stream: the truncation cut, or epoch 0's segments at offset 0."""
        if self.head:
            return dict(self.head)
        return {s: 0 for s in self.epochs[0].segment_ids}

    def is_before(self, a: int, b: int) -> bool:
        """Whether segment ``a`` ended before segment ``b`` began (and their key ranges overlap)."""
        sa, sb = self.segments[a], self.segments[b]
        return (
            overlaps(sa.min_key, sa.max_key, sb.min_key, sb.max_key)
            and sa.sealed_epoch is not None
            and sa.sealed_epoch <= sb.creation_epoch
        )

    def cut_problem(self, cut: Mapping[int, int]) -> str | None:
        """Why ``cut`` is not a valid stream cut of this stream, or None when it is.

        Valid (as Pravega checks it): every segment belongs to the stream and still exists, offsets
        are not negative, and the key ranges tile [0, 1) without gaps or overlaps.
        """
        if not cut:
            return "the stream cut is empty"
        records = []
        for sid, offset in cut.items():
            seg = self.segments.get(sid)
            if seg is None:
                return f"segment {sid} does not belong to stream {self.scope}/{self.name}"
            if seg.deleted:
                return f"segment {sid} of {self.scope}/{self.name} was truncated away"
            if offset < 0:
                return f"negative offset {offset} for segment {sid}"
            records.append(seg)
        records.sort(key=lambda s: (s.min_key, s.max_key))
        if records[0].min_key != 0.0:
            return f"the stream cut does not cover keys from 0.0 (first range starts at {records[0].min_key})"
        for prev, nxt in zip(records, records[1:], strict=False):
            if prev.max_key != nxt.min_key:
                return (
                    f"the key ranges of segments {prev.segment_id} and {nxt.segment_id} do not meet "
                    f"({prev.max_key} vs {nxt.min_key})"
                )
        if records[-1].max_key != 1.0:
            return f"the stream cut does not cover keys up to 1.0 (last range ends at {records[-1].max_key})"
        return None

    def segments_before_cut(self, cut: Mapping[int, int]) -> list[int]:
        """Existing segments that lie entirely before ``cut`` (what truncation deletes)."""
        out = []
        for sid, seg in self.segments.items():
            if seg.deleted or sid in cut:
                continue
            relevant = [
                c for c in cut if overlaps(seg.min_key, seg.max_key, self.segments[c].min_key, self.segments[c].max_key)
            ]
            if relevant and all(self.is_before(sid, c) for c in relevant):
                out.append(sid)
        return sorted(out)

    def txn_segment_parents(self, txn: TxnRecord) -> list[SegmentRecord]:
        """The segments of the transaction's epoch: one transaction segment per parent."""
        return self.segments_of_epoch(txn.epoch)

    def to_json(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "name": self.name,
            "config": self.config.to_json(),
            "created_ms": self.created_ms,
            "state": self.state,
            "epochs": [e.to_json() for e in self.epochs],
            "segments": [s.to_json() for s in self.segments.values()],
            "next_number": self.next_number,
            "head": [[k, v] for k, v in self.head.items()],
            "txns": [t.to_json() for t in self.txns.values()],
            "txn_counter": self.txn_counter,
            "finished": [format(t, "032x") for t in self.finished],
            "retention_cuts": [c.to_json() for c in self.retention_cuts],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StreamRecord:
        stream = cls(
            scope=data["scope"],
            name=data["name"],
            config=StreamConfigRecord.from_json(data["config"]),
            created_ms=int(data["created_ms"]),
            state=data["state"],
            epochs=[EpochRecord.from_json(e) for e in data["epochs"]],
            next_number=int(data["next_number"]),
            head={int(k): int(v) for k, v in data["head"]},
            txn_counter=int(data["txn_counter"]),
        )
        for s in data["segments"]:
            rec = SegmentRecord.from_json(s)
            stream.segments[rec.segment_id] = rec
        for t in data["txns"]:
            txn = TxnRecord.from_json(t)
            stream.txns[txn.txn_id] = txn
        stream.finished = {int(t, 16): None for t in data["finished"]}
        stream.retention_cuts = [RetentionCut.from_json(c) for c in data.get("retention_cuts", ())]
        return stream


@dataclass(slots=True)
class ScopeRecord:
    name: str
    created_ms: int


class ControllerState:
    """All controller metadata; mutated only through :meth:`apply`.

    ``finished_txn_limit`` and ``finished_txn_retention_ms`` bound how many COMMITTED/ABORTED
    transactions each stream remembers (so their status stays answerable for a while without the
    metadata growing for ever); pruning happens inside ``apply`` from the record's own timestamp,
    so replay prunes exactly as the live run did.
    """

    def __init__(self, *, finished_txn_limit: int = 10_000, finished_txn_retention_ms: int = 24 * 3600 * 1000) -> None:
        self.scopes: dict[str, ScopeRecord] = {}
        self.streams: dict[tuple[str, str], StreamRecord] = {}
        #: Where a re-created stream of a deleted one's name starts numbering its segments (as
        #: Pravega's getSafeStartingSegmentNumberFor): its segments never share an id with the old
        #: stream's, so a position recorded in the old stream cannot pass for one in the new.
        self.safe_start_numbers: dict[tuple[str, str], int] = {}
        self.finished_txn_limit = finished_txn_limit
        self.finished_txn_retention_ms = finished_txn_retention_ms

    # ---- queries -------------------------------------------------------------------------

    def stream(self, scope: str, name: str) -> StreamRecord | None:
        """The stream, unless it does not exist or is being deleted."""
        stream = self.streams.get((scope, name))
        if stream is None or stream.state == DELETING:
            return None
        return stream

    def streams_in_scope(self, scope: str) -> list[StreamRecord]:
        return sorted(
            (s for (sc, _), s in self.streams.items() if sc == scope and s.state != DELETING),
            key=lambda s: s.name,
        )

    def iter_streams(self) -> Iterator[StreamRecord]:
        return iter(list(self.streams.values()))

    # ---- the one way to change the state --------------------------------------------------

    def apply(self, record: Mapping[str, Any]) -> None:
        """Apply one log record. Raises :class:`StateError` when it does not fit the state."""
        op = record.get("op")
        handler = getattr(self, f"_apply_{op}", None)
        if handler is None:
            raise StateError(f"unknown controller log record op {op!r}")
        handler(record)

    def _stream_for(self, record: Mapping[str, Any]) -> StreamRecord:
        stream = self.streams.get((record["scope"], record["stream"]))
        if stream is None:
            raise StateError(f"record {record.get('op')} names unknown stream {record['scope']}/{record['stream']}")
        return stream

    def _txn_for(self, record: Mapping[str, Any]) -> tuple[StreamRecord, TxnRecord]:
        stream = self._stream_for(record)
        txn = stream.txns.get(int(record["txn"], 16))
        if txn is None:
            raise StateError(f"record {record.get('op')} names unknown transaction {record['txn']}")
        return stream, txn

    def _apply_scope_created(self, r: Mapping[str, Any]) -> None:
        if r["scope"] in self.scopes:
            raise StateError(f"scope {r['scope']} exists")
        self.scopes[r["scope"]] = ScopeRecord(r["scope"], int(r["ts"]))

    def _apply_scope_deleted(self, r: Mapping[str, Any]) -> None:
        if self.scopes.pop(r["scope"], None) is None:
            raise StateError(f"scope {r['scope']} does not exist")

    def _apply_stream_created(self, r: Mapping[str, Any]) -> None:
        key = (r["scope"], r["stream"])
        if r["scope"] not in self.scopes or key in self.streams:
            raise StateError(f"cannot create stream {key}")
        ts = int(r["ts"])
        stream = StreamRecord(
            r["scope"], r["stream"], StreamConfigRecord.from_json(r["config"]), ts, txn_counter=int(r["txn_counter"])
        )
        ids = []
        for sid, lo, hi in r["segments"]:
            stream.segments[int(sid)] = SegmentRecord(int(sid), float(lo), float(hi))
            ids.append(int(sid))
        stream.epochs.append(EpochRecord(0, tuple(ids), ts))
        stream.next_number = max(number_of(s) for s in ids) + 1
        self.streams[key] = stream

    def _apply_stream_updated(self, r: Mapping[str, Any]) -> None:
        self._stream_for(r).config = StreamConfigRecord.from_json(r["config"])

    def _apply_stream_sealed(self, r: Mapping[str, Any]) -> None:
        self._stream_for(r).state = SEALED

    def _apply_stream_deleting(self, r: Mapping[str, Any]) -> None:
        self._stream_for(r).state = DELETING

    def _apply_stream_deleted(self, r: Mapping[str, Any]) -> None:
        stream = self._stream_for(r)
        self.safe_start_numbers[(r["scope"], r["stream"])] = stream.next_number
        del self.streams[(r["scope"], r["stream"])]

    def _apply_stream_truncated(self, r: Mapping[str, Any]) -> None:
        stream = self._stream_for(r)
        stream.head = {int(k): int(v) for k, v in r["head"]}
        for sid in r["deleted"]:
            stream.segments[int(sid)].deleted = True

    def _apply_retention_cut_recorded(self, r: Mapping[str, Any]) -> None:
        stream = self._stream_for(r)
        cut = RetentionCut(int(r["ts"]), int(r["size"]), tuple((int(a), int(b)) for a, b in r["cut"]))
        # As Pravega's RetentionSet.addReferenceToStreamCutIfLatest: only a newer cut is added.
        if not stream.retention_cuts or stream.retention_cuts[-1].ts < cut.ts:
            stream.retention_cuts.append(cut)

    def _apply_retention_cuts_dropped(self, r: Mapping[str, Any]) -> None:
        """Forget the recorded cuts older than ``before_ts`` (they lie behind the truncation point)."""
        stream = self._stream_for(r)
        before = int(r["before_ts"])
        stream.retention_cuts = [c for c in stream.retention_cuts if c.ts >= before]

    def _apply_stream_scaled(self, r: Mapping[str, Any]) -> None:
        """A manual scale whose new segments already exist: append the new epoch."""
        stream = self._stream_for(r)
        sealed = {int(s) for s in r["sealed"]}
        if not sealed <= set(stream.active_epoch.segment_ids):
            raise StateError(f"scale of {stream.scope}/{stream.name} seals segments outside the active epoch")
        new_epoch = len(stream.epochs)
        new_ids = []
        for sid, lo, hi in r["new"]:
            sid = int(sid)
            if epoch_of(sid) != new_epoch or sid in stream.segments:
                raise StateError(f"scale of {stream.scope}/{stream.name}: bad new segment id {sid}")
            stream.segments[sid] = SegmentRecord(sid, float(lo), float(hi))
            stream.next_number = max(stream.next_number, number_of(sid) + 1)
            new_ids.append(sid)
        kept = [s for s in stream.active_epoch.segment_ids if s not in sealed]
        self._append_epoch(stream, kept + new_ids, int(r["ts"]))
        for sid in sealed:
            stream.segments[sid].sealed_epoch = new_epoch

    @staticmethod
    def _append_epoch(stream: StreamRecord, segment_ids: Iterable[int], ts: int) -> None:
        ordered = sorted(segment_ids, key=lambda s: stream.segments[s].min_key)
        stream.epochs.append(EpochRecord(len(stream.epochs), tuple(ordered), ts))

    def _apply_txn_created(self, r: Mapping[str, Any]) -> None:
        stream = self._stream_for(r)
        txn_id = int(r["txn"], 16)
        if txn_id in stream.txns:
            raise StateError(f"transaction {r['txn']} exists")
        stream.txns[txn_id] = TxnRecord(
            txn_id=txn_id,
            epoch=int(r["epoch"]),
            state=OPEN,
            created_ms=int(r["ts"]),
            lease_ms=int(r["lease_ms"]),
            deadline_ms=int(r["deadline_ms"]),
            max_deadline_ms=int(r["max_deadline_ms"]),
        )
        stream.txn_counter = max(stream.txn_counter, txn_id & ((1 << 63) - 1))

    def _apply_txn_pinged(self, r: Mapping[str, Any]) -> None:
        _, txn = self._txn_for(r)
        txn.deadline_ms = int(r["deadline_ms"])
        txn.lease_ms = int(r["lease_ms"])

    def _apply_txn_committing(self, r: Mapping[str, Any]) -> None:
        _, txn = self._txn_for(r)
        if txn.state not in (OPEN, COMMITTING):
            raise StateError(f"transaction {r['txn']} is {txn.state}, cannot commit")
        txn.state = COMMITTING
        txn.writer_id = str(r.get("writer_id", ""))
        txn.commit_timestamp = r.get("commit_timestamp")
        txn.roll = RollPlan.from_json(r["roll"]) if r.get("roll") else None

    def _apply_txn_committed(self, r: Mapping[str, Any]) -> None:
        stream, txn = self._txn_for(r)
        if txn.state != COMMITTING:
            raise StateError(f"transaction {r['txn']} is {txn.state}, not COMMITTING")
        ts = int(r["ts"])
        roll = txn.roll
        if roll is not None:
            if len(stream.epochs) - 1 != roll.base_epoch:
                raise StateError(f"rolling commit of {r['txn']} planned on epoch {roll.base_epoch}")
            for new_id, copied in (*roll.txn_duplicates, *roll.active_duplicates):
                src = stream.segments[copied]
                stream.segments[new_id] = SegmentRecord(new_id, src.min_key, src.max_key)
            old_active = stream.active_epoch.segment_ids
            dup_epoch = len(stream.epochs)
            self._append_epoch(stream, [n for n, _ in roll.txn_duplicates], ts)
            self._append_epoch(stream, [n for n, _ in roll.active_duplicates], ts)
            for sid in old_active:
                stream.segments[sid].sealed_epoch = dup_epoch
            for new_id, _ in roll.txn_duplicates:
                stream.segments[new_id].sealed_epoch = dup_epoch + 1
        self._finish_txn(stream, txn, COMMITTED, ts)

    def _apply_txn_aborting(self, r: Mapping[str, Any]) -> None:
        _, txn = self._txn_for(r)
        if txn.state not in (OPEN, ABORTING):
            raise StateError(f"transaction {r['txn']} is {txn.state}, cannot abort")
        txn.state = ABORTING
        txn.abort_reason = r.get("reason")

    def _apply_txn_aborted(self, r: Mapping[str, Any]) -> None:
        stream, txn = self._txn_for(r)
        if txn.state != ABORTING:
            raise StateError(f"transaction {r['txn']} is {txn.state}, not ABORTING")
        self._finish_txn(stream, txn, ABORTED, int(r["ts"]))

    def _finish_txn(self, stream: StreamRecord, txn: TxnRecord, state: str, ts: int) -> None:
        txn.state = state
        txn.finished_ms = ts
        txn.roll = None
        stream.finished[txn.txn_id] = None
        horizon = ts - self.finished_txn_retention_ms
        while stream.finished:
            oldest = next(iter(stream.finished))
            if len(stream.finished) <= self.finished_txn_limit and (stream.txns[oldest].finished_ms or 0) >= horizon:
                break
            del stream.finished[oldest]
            del stream.txns[oldest]

    # ---- snapshots ------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "scopes": [[s.name, s.created_ms] for s in self.scopes.values()],
            "streams": [s.to_json() for s in self.streams.values()],
            "safe_start_numbers": [[scope, name, n] for (scope, name), n in self.safe_start_numbers.items()],
        }

    def load_json(self, data: Mapping[str, Any]) -> None:
        """Replace the state with a snapshot made by :meth:`to_json`."""
        if data.get("schema") != SCHEMA_VERSION:
            raise StateError(f"controller snapshot has schema {data.get('schema')!r}, expected {SCHEMA_VERSION}")
        self.scopes = {name: ScopeRecord(name, int(ts)) for name, ts in data["scopes"]}
        self.streams = {}
        self.safe_start_numbers = {(scope, name): int(n) for scope, name, n in data.get("safe_start_numbers", ())}
        for s in data["streams"]:
            stream = StreamRecord.from_json(s)
            self.streams[(stream.scope, stream.name)] = stream
