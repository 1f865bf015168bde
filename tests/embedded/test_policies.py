"""The embedded server acts on stream policies as Pravega 0.13 does: retention by time truncates at a
recorded stream cut (and never data newer than the policy), auto-scaling splits a hot segment.
Servers with short retention intervals / auto-scaler windows; events written with the official
client."""

from __future__ import annotations

import re
import time
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pravega_clients import stream_writer

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.controller_types import RetentionPolicy
from airflow_provider_pravega.client.errors import TruncatedStreamCutError
from airflow_provider_pravega.client.streamcut import StreamCut
from airflow_provider_pravega.spark.export_job import ExportSpec, run_export

KEYS = [f"key-{i:02d}" for i in range(8)]


def exported_events(path: Path) -> list[str]:
    parts = sorted(p for p in path.iterdir() if p.name.startswith("part-") and not p.name.endswith(".crc"))
    return [row["event"] for part in parts for row in pq.read_table(part).to_pylist()]


def wait_for(condition, what: str, timeout_s: float = 60.0, step_s: float = 0.1, during=None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if during is not None:
            during()
        if condition():
            return
        time.sleep(step_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def test_time_retention_truncates_old_data_only(tmp_path, pravega_embedded_factory, unique_name, spark):
    retention_ms = 2500
    server = pravega_embedded_factory(extra_args=["--retention-interval-s", "0.3"])
    uri = server.controller_uri
    scope = unique_name("ret")
    with PravegaClient(uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "s", 2, retention=RetentionPolicy.by_time(retention_ms))
        old_head = StreamCut.head(client, scope, "s")
        writer = stream_writer(uri, scope, "s")
        sent: list[tuple[float, str, str]] = []  # (wall-clock time before the write, key, event)

        def write_batch(phase: str, n: int) -> None:
            started = time.time()
            for i in range(n):
                key = KEYS[i % len(KEYS)]
                event = f"{phase}|{key}|{len(sent):06d}"
                writer.write_event(event, routing_key=key)
                sent.append((started, key, event))
            writer.flush()

        write_batch("old", 200)
        after_old = client.admin.tail(scope, "s")
        assert after_old != dict(old_head.positions)
        batch = iter(range(10**6))
        # Keep writing while the retention service runs; wait until everything of the first batch is gone.
        wait_for(lambda: all(client.admin.head(scope, "s").get(sid, -1) >= off for sid, off in after_old.items()),
                 "retention to truncate the first batch", during=lambda: write_batch(f"new{next(batch)}", 16))
        client.admin.update_stream(scope, "s", retention=None)  # the retention service truncates no more
        off_at = time.time()
        head = client.admin.head(scope, "s")
        assert head != dict(old_head.positions)

        # What is left is exactly what an export from the head sees; from the old head it is truncated.
        out = tmp_path / "out"
        with pytest.raises(TruncatedStreamCutError, match="truncated data"):
            run_export(client, spark, ExportSpec(scope, "s", str(out), start_cut=old_head.to_text()))
        result = run_export(client, spark, ExportSpec(scope, "s", str(out), start_cut=old_head.to_text(),
                                                      end_cut="tail", on_truncated="head"))
        kept = exported_events(out)
        assert result.events == len(kept) and result.start_cut == old_head.to_text()  # as after a manual truncation
    assert len(kept) == len(set(kept)) and set(kept) <= {e for _, _, e in sent}
    assert not any(e.startswith("old|") for e in kept)
    # Per routing key (so per segment) the retained events are a suffix of those written, and every
    # event truncated away was written more than retention_ms before retention was switched off.
    by_key: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for ts, key, event in sent:
        by_key[key].append((ts, event))
    kept_set = set(kept)
    for key, events in by_key.items():
        flags = [e in kept_set for _, e in events]
        assert flags == sorted(flags), f"key {key}: a gap in the retained events"
        lost = [ts for ts, e in events if e not in kept_set]
        assert all(ts < off_at - retention_ms / 1000 for ts in lost), f"key {key}: data newer than the policy lost"


def test_retention_choice_is_pravegas():
    """The newest recorded cut that keeps at least the policy's time or size; none when no cut
    qualifies (Pravega's getBoundStreamCuts 'min' bound, used when a stream has no subscribers)."""
    from airflow_provider_pravega.embedded.controller_state import (
        RETENTION_SIZE,
        RETENTION_TIME,
        RetentionCut,
        retention_truncation_cut,
    )

    cuts = [RetentionCut(ts, size, ((0, size),)) for ts, size in [(1000, 0), (2000, 100), (3000, 250), (4000, 400)]]
    assert retention_truncation_cut(RETENTION_TIME, 1500, cuts, now_ms=4000) == cuts[1]  # 2000 ms old, the newest >= 1500
    assert retention_truncation_cut(RETENTION_TIME, 1000, cuts, now_ms=4000) == cuts[2]
    assert retention_truncation_cut(RETENTION_TIME, 5000, cuts, now_ms=4000) is None
    assert retention_truncation_cut(RETENTION_SIZE, 150, cuts, now_ms=0) == cuts[2]  # keeps 400 - 250 = 150 bytes
    assert retention_truncation_cut(RETENTION_SIZE, 151, cuts, now_ms=0) == cuts[1]
    assert retention_truncation_cut(RETENTION_SIZE, 401, cuts, now_ms=0) is None
    assert retention_truncation_cut(RETENTION_TIME, 1, [], now_ms=0) is None


def test_event_rate_policy_splits_a_hot_segment(pravega_embedded_factory, unique_name, read_stream):
    """by_event_rate target 100 ev/s, written at about 2,000 ev/s: the segment splits (short windows
    on this server); a reader group sees every event once, in per-key order."""
    from airflow_provider_pravega.client.controller_types import ScalingPolicy

    server = pravega_embedded_factory(extra_args=["--autoscale-window-s", "1", "--autoscale-cooldown-s", "1",
                                                  "--autoscale-mute-s", "1"])
    uri = server.controller_uri
    scope = unique_name("scale")
    with PravegaClient(uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "s", scaling=ScalingPolicy.by_event_rate(100, 2, 1))
        writer = stream_writer(uri, scope, "s")
        sent: list[str] = []
        started = time.monotonic()

        def write_paced(n: int = 100) -> None:  # about 2,000 events/s
            for _ in range(n):
                key = KEYS[len(sent) % len(KEYS)]
                event = f"{key}|{len(sent):06d}"
                writer.write_event(event, routing_key=key)
                sent.append(event)
            writer.flush()
            ahead = started + len(sent) / 2000 - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)

        wait_for(lambda: len(client.admin.tail(scope, "s")) > 1, "the hot segment to split", step_s=0,
                 during=write_paced)
        for _ in range(5):
            write_paced()
        segments = len(client.admin.tail(scope, "s"))
    assert segments >= 2
    got = [e.decode() for e in read_stream(uri, scope, "s", expected=len(sent), timeout=120)]
    assert Counter(got) == Counter(sent)
    per_key: dict[str, list[int]] = defaultdict(list)
    for event in got:
        key, seq = event.split("|")
        per_key[key].append(int(seq))
    assert all(seqs == sorted(seqs) for seqs in per_key.values())


def test_idle_neighbours_merge_down_to_the_minimum(pravega_embedded_factory, unique_name):
    """Two segments without traffic are reported cold (Pravega's expiry of idle segments) and merged,
    once the policy's minimum allows it."""
    from airflow_provider_pravega.client.controller_types import ScalingPolicy

    server = pravega_embedded_factory(extra_args=["--autoscale-window-s", "0.2", "--autoscale-cooldown-s", "0.2",
                                                  "--autoscale-mute-s", "0.2"])
    scope = unique_name("merge")
    with PravegaClient(server.controller_uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "s", scaling=ScalingPolicy.by_event_rate(100, 2, 2))
        client.admin.create_stream(scope, "fixed", 2)
        client.admin.update_stream(scope, "s", scaling=ScalingPolicy.by_event_rate(100, 2, 1))
        wait_for(lambda: len(client.admin.tail(scope, "s")) == 1, "the idle segments to merge")
        (merged,) = client.admin.tail(scope, "s")
        assert merged >> 32 == 1  # one scale: epoch 1
        assert len(client.admin.tail(scope, "fixed")) == 2  # a fixed policy is never scaled
