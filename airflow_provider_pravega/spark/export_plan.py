"""An export's plan: the two cuts of a run, decided from its recorded state (a recorded interval
or unfinished claim is reused; a fresh decision is recorded only if the state it came from
still holds) or from an ingest's interval index (``from_ingest``), the segment ranges between
them, and how the ranges are grouped into Spark partitions."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from airflow_provider_pravega.client.batch import SegmentRange, plan_segment_ranges
from airflow_provider_pravega.client.errors import InvalidStreamCutError, SegmentStoreError, TruncatedStreamCutError
from airflow_provider_pravega.client.ingest_location import check_stream_origin, open_state_store
from airflow_provider_pravega.client.ingest_state import interval_pieces
from airflow_provider_pravega.client.ingest_location import state_location as ingest_state_location
from airflow_provider_pravega.client.streamcut import StreamCut
from airflow_provider_pravega.spark.export_spec import ExportError, ExportSpec, IntervalNotIngestedError
from airflow_provider_pravega.spark.export_state import ExportState

log = logging.getLogger(__name__)


def interval_order(key: str) -> tuple[Any, ...]:
    """Sort key of an interval: by its start (and end) instant when it reads as
    ``"<ISO start>/<ISO end>"``, else by its text (after every dated interval)."""
    start, _, end = key.partition("/")
    try:
        begin = datetime.fromisoformat(start.strip())
        finish = datetime.fromisoformat(end.strip()) if end.strip() else begin
        if begin.tzinfo is None:
            begin = begin.replace(tzinfo=UTC)
        if finish.tzinfo is None:
            finish = finish.replace(tzinfo=UTC)
        return (0, begin.timestamp(), finish.timestamp(), key)
    except ValueError:
        return (1, 0.0, 0.0, key)


class _Replan(Exception):
    """The state changed under a plan (another run recorded something): decide again."""


@dataclass(frozen=True)
class _Decision:
    start: StreamCut
    end: StreamCut
    ranges: list[SegmentRange]
    reused: bool
    record: dict[str, Any] | None  # the update that claims the cuts (None: nothing to record)
    basis: Any  # what the cuts were derived from; the record is written only if it still holds


def cut_text(cut: StreamCut) -> str:
    return cut.to_text()


def _from_record(spec: ExportSpec, text: str, what: str) -> StreamCut:
    try:
        return StreamCut.from_text(text, scope=spec.scope, stream=spec.stream)
    except InvalidStreamCutError as exc:
        raise ExportError(f"the recorded {what} of export {spec.effective_export_id!r} is unusable: {exc}") from None


def _plan(client: Any, spec: ExportSpec, start: StreamCut, end: StreamCut) -> list[SegmentRange]:
    """plan_segment_ranges, asked again while a scale is half done (a segment with successors
    that is not sealed yet)."""
    on_truncated = "head" if spec.on_truncated == "head" else "error"
    for attempt in range(5):
        try:
            return plan_segment_ranges(client, start, end, on_truncated=on_truncated)
        except SegmentStoreError as exc:
            if "plan again" not in str(exc) or attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _decide(client: Any, spec: ExportSpec, state: ExportState, start_given: StreamCut | None,
            end_given: StreamCut) -> _Decision:
    """The cuts of this run from the current state (a recorded interval or pending claim is reused)."""
    now = datetime.now(UTC).isoformat()
    key = spec.interval_key
    if key is not None:
        record = state.intervals.get(key)
        if record is not None:
            start = _from_record(spec, record["start"], f"start cut of interval {key}")
            end = _from_record(spec, record["end"], f"end cut of interval {key}")
            _warn_given_cuts_unused(spec, key, ((start_given, start), (end_given, end)))
            try:
                ranges = _plan(client, spec, start, end)
            except TruncatedStreamCutError as exc:
                raise TruncatedStreamCutError(
                    spec.scope, spec.stream,
                    f"interval {key} was recorded as starting at {record['start']}, and the stream was truncated "
                    f"past it since; pass on_truncated='head' to export what is left of the interval",
                ) from exc
            return _Decision(start, end, ranges, True, None, None)
        order = interval_order(key)
        earlier = [k for k in state.intervals if interval_order(k) < order]
        later = [k for k in state.intervals if interval_order(k) > order]
        before = max(earlier, key=interval_order) if earlier else None
        after = min(later, key=interval_order) if later else None
        if start_given is not None:
            start = start_given.resolve(client)
        elif before is not None:
            start = _from_record(spec, state.intervals[before]["end"], f"end cut of interval {before}")
        else:
            start = StreamCut.head(client, spec.scope, spec.stream)
        if start_given is None and after is not None:
            # A backfill of a gap: end where the next recorded interval starts, so no event is
            # exported by two intervals.
            end = _from_record(spec, state.intervals[after]["start"], f"start cut of interval {after}")
            log.info("interval %s lies before the recorded interval %s: it ends where that one starts", key, after)
        else:
            end = end_given.resolve(client)
        ranges = _plan(client, spec, start, end)
        op = {"op": "interval", "key": key, "start": cut_text(start), "end": cut_text(end), "at": now}
        return _Decision(start, end, ranges, False, op, (before, after))

    if start_given is None:
        if state.pending is not None:
            start = _from_record(spec, state.pending["start"], "start cut of the unfinished previous export")
            end = _from_record(spec, state.pending["end"], "end cut of the unfinished previous export")
            log.info("the previous export of %s did not finish: exporting its cuts again", spec.effective_export_id)
            return _Decision(start, end, _plan(client, spec, start, end), True, None, None)
        if state.last is not None:
            start = _from_record(spec, state.last["end"], "end cut of the previous export")
        else:
            start = StreamCut.head(client, spec.scope, spec.stream)
        end = end_given.resolve(client)
        ranges = _plan(client, spec, start, end)
        op = {"op": "claim", "start": cut_text(start), "end": cut_text(end), "at": now}
        return _Decision(start, end, ranges, False, op, (state.last, state.pending))
    start, end = start_given.resolve(client), end_given.resolve(client)
    return _Decision(start, end, _plan(client, spec, start, end), False, None, None)


def _warn_given_cuts_unused(spec: ExportSpec, key: str,
                            given_and_recorded: tuple[tuple[StreamCut | None, StreamCut], ...]) -> None:
    """A rerun of a recorded interval exports its recorded cuts again, whatever cuts it is given
    (an interval's output is fixed once recorded: a retry or a cleared run writes the same events,
    while a refusal would fail every rerun given a cut that moves, such as a template of the
    latest ingest's tail): a concrete cut given that differs from the recorded one is named in a
    warning. 'head' and 'tail' move by nature and are not."""
    for name, (given, recorded) in zip(("start_cut", "end_cut"), given_and_recorded):
        if given is not None and given.bound is None and given != recorded:
            log.warning("export %s: interval %s was recorded with %s %s, which this rerun exports again; the %s "
                        "given, %s, is not used (to export another range, reset the interval with "
                        "reset_export_state or use another interval key)", spec.effective_export_id, key, name,
                        cut_text(recorded), name, cut_text(given))


def _basis(spec: ExportSpec, state: ExportState) -> Any:
    """What :func:`_decide` derived fresh cuts from, read from ``state`` (to detect a race)."""
    if spec.interval_key is not None:
        order = interval_order(spec.interval_key)
        earlier = [k for k in state.intervals if interval_order(k) < order]
        later = [k for k in state.intervals if interval_order(k) > order]
        return (max(earlier, key=interval_order) if earlier else None,
                min(later, key=interval_order) if later else None)
    return (state.last, state.pending)


def ingest_interval_cuts(client: Any, spec: ExportSpec) -> tuple[_Decision, list[str | None], list[tuple[str, str]]]:
    """``from_ingest``: the ranges the ingest's runs of ``spec.interval_key`` committed, from its
    interval index. Returns the decision (start of the first range, end of the last, the segment
    ranges of every piece in commit order), the runs and each piece's cut texts."""
    key, ingest = spec.interval_key, spec.from_ingest
    where = f"ingest {ingest!r} into {spec.scope}/{spec.stream}"
    state_scope, state_stream = ingest_state_location(spec.scope, spec.stream, ingest,
                                                      spec.ingest_state_scope or spec.state_scope)
    if not client.admin.stream_exists(state_scope, state_stream):
        raise IntervalNotIngestedError(
            f"interval {key} was not ingested: {where} has no state in scope {state_scope} (no run of it ever "
            f"started; check the ingest id — the operator's default is '<dag_id>.<task_id>' — and the ingest's "
            f"state_scope, which the export's ingest_state_scope must name)")
    with open_state_store(client, state_scope, state_stream, create=False) as store:
        check_stream_origin(client, store, spec.scope, spec.stream, ingest, record=False)
        state = store.fetch()
    pieces = interval_pieces(state, key)
    if pieces is None:
        running = sorted(f"{rid} ({run['phase']})" for rid, run in state["runs"].items() if run.get("interval") == key)
        known = sorted(state.get("intervals") or {}, key=interval_order)
        if running:
            detail = (f"its run(s) {', '.join(running)} did not finish committing yet; wait for the ingest (e.g. its "
                      f"commit sensor) before exporting")
        elif state.get("intervals_forgotten_at") and known and interval_order(key) < interval_order(known[0]):
            detail = (f"it may have been forgotten: the index keeps the last intervals only (the oldest kept is "
                      f"{known[0]})")
        else:
            detail = (f"no run of this interval was recorded (yet); the ingest's recorded intervals: "
                      f"{len(known)}{', latest ' + known[-1] if known else ''}")
        raise IntervalNotIngestedError(f"interval {key} was not ingested by {where}: {detail}")
    if (state.get("intervals") or {})[key].get("overflow"):
        raise ExportError(f"interval {key} of {where} was ingested by more runs than its index keeps; export it with "
                          f"explicit cuts")
    ranges: list[SegmentRange] = []
    texts: list[tuple[str, str]] = []
    first = last = None
    for piece in pieces:
        if piece.get("end") is None:
            raise ExportError(f"the end of run {piece.get('run')}'s range of interval {key} ({where}) was not recorded")
        start = StreamCut(spec.scope, spec.stream, {int(k): v for k, v in piece["start"].items()})
        end = StreamCut(spec.scope, spec.stream, {int(k): v for k, v in piece["end"].items()})
        try:
            ranges += _plan(client, spec, start, end)
        except TruncatedStreamCutError as exc:
            raise TruncatedStreamCutError(
                spec.scope, spec.stream, f"the stream was truncated past the start of interval {key} ({where}); "
                f"pass on_truncated='head' to export what is left of it") from exc
        texts.append((cut_text(start), cut_text(end)))
        first = first or start
        last = end
    if first is None:  # recorded without any range (cannot happen: an empty run records an empty one)
        first = last = StreamCut.tail(client, spec.scope, spec.stream)
    return _Decision(first, last, ranges, True, None, None), [p.get("run") for p in pieces], texts


def fix_cuts(client: Any, sync: Any, spec: ExportSpec, start_given: StreamCut | None,
             end_given: StreamCut) -> _Decision:
    """Decide this run's cuts and record them (conditionally: a run that raced another one
    decides again from what the other recorded)."""
    for _ in range(50):
        state = sync.fetch()
        decision = _decide(client, spec, state, start_given, end_given)
        if decision.record is None:
            return decision
        op = decision.record

        def claim(current: ExportState, op: dict[str, Any] = op, basis: Any = decision.basis) -> Any:
            if spec.interval_key is not None and spec.interval_key in current.intervals:
                raise _Replan()
            if _basis(spec, current) != basis:
                raise _Replan()
            return op

        try:
            sync.update(claim)
        except _Replan:
            continue
        return decision
    raise ExportError(f"the state of export {spec.effective_export_id!r} kept changing while deciding the cuts")


#: Payload bytes per Spark partition (read task, output file) when ``num_partitions`` is not given:
#: Spark's own split size for files (``spark.sql.files.maxPartitionBytes``). Fewer, larger tasks cost
#: less CPU than one per segment range (measured: 4-9% less for 200 MB in 4 ranges on 2 cores, see
#: docs/benchmarks.md), and a small interval is one task, so one Python worker to start.
BYTES_PER_PARTITION = 128 * 1024 * 1024


def partitions_of(spec: ExportSpec, ranges: Sequence[SegmentRange]) -> int:
    """Spark partitions of an export: ``num_partitions``, else one per :data:`BYTES_PER_PARTITION`
    of the planned ranges (at most one per range: :func:`group_ranges`). Derived from the plan
    only, so a re-run of a recorded interval gets the same partitions, hence the same files."""
    if spec.num_partitions:
        return spec.num_partitions
    planned = sum(r.length or 0 for r in ranges)
    return max(1, -(-planned // BYTES_PER_PARTITION))


def group_ranges(ranges: Sequence[SegmentRange], partitions: int | None) -> list[list[int]]:
    """Indexes of ``ranges`` per Spark partition: one range each, or ``partitions`` runs of
    neighbouring ranges of about equal bytes (plan order is kept, so is the row order)."""
    if not ranges:
        return []
    if partitions is None or partitions >= len(ranges):
        return [[i] for i in range(len(ranges))]
    total = sum(r.length or 0 for r in ranges)
    groups: list[list[int]] = []
    current: list[int] = []
    done = 0
    for i, rng in enumerate(ranges):
        size = rng.length or 0
        left = len(ranges) - i  # ranges not placed yet, this one included
        to_open = partitions - len(groups) - 1  # groups still to start after the current one
        if current and to_open > 0:
            target = total * (len(groups) + 1) / partitions  # where the current group should end
            overshoot = done + size > target and abs(done + size - target) > abs(done - target)
            if left <= to_open or overshoot:
                groups.append(current)
                current = []
        current.append(i)
        done += size
    groups.append(current)
    return groups


def launch_order(ranges: Sequence[SegmentRange], groups: Sequence[Sequence[int]]) -> list[int]:
    """Group indexes, largest first: Spark starts tasks in partition order, so the longest reads
    start first and the last wave is short (Delta's writes, whose file names carry no order)."""
    size = [sum(ranges[i].length or 0 for i in group) for group in groups]
    return sorted(range(len(groups)), key=lambda g: (-size[g], g))
