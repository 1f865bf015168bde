"""The admin operators against the embedded server, run by Airflow itself (``dag.test()``).

Tasks take templated arguments and XCom from each other; helper tasks write events with the
official client and record what the client layer sees between steps, so each operator's effect
is checked on the server, not only by its return value.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pendulum
import pytest
from pravega_clients import stream_writer

from airflow_provider_pravega._streams import ScopeNotSetError
from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.controller_types import RetentionPolicy, ScalingPolicy
from airflow_provider_pravega.client.errors import ScaleError
from airflow_provider_pravega.protocol.naming import qualified_segment_name
from airflow_provider_pravega.protocol.streamcut import streamcut_from_text
from pravega_testing.dag_test import run_dag

START = pendulum.datetime(2024, 1, 1, tz="UTC")


# ------------------------------------------------------------------------- running DAGs for real


def states(dag_run: Any) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}


@pytest.fixture
def pravega_conn(monkeypatch: pytest.MonkeyPatch, pravega_embedded: Any) -> Callable[..., None]:
    """Point ``pravega_default`` (or another conn id) at the embedded server through AIRFLOW_CONN_*."""
    host, port = pravega_embedded.controller_uri.rsplit("//", 1)[1].rsplit(":", 1)

    def set_conn(conn_id: str = "pravega_default", **extra: Any) -> None:
        conn = {"conn_type": "pravega", "host": host, "port": int(port)}
        if extra:
            conn["extra"] = extra
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))

    set_conn()
    return set_conn


def write_events(controller_uri: str, scope: str, stream: str, count: int, prefix: str) -> int:
    """Write ``count`` events with the official client; returns the bytes they take in segments."""
    writer = stream_writer(controller_uri, scope, stream)
    size = 0
    for i in range(count):
        payload = f"{prefix}-{i:04d}"
        writer.write_event(payload, routing_key=f"key-{i % 7}")
        size += 8 + len(payload.encode())  # 8-byte event header (type + length) before each event
    writer.flush()
    return size


# --------------------------------------------------------------------------------- the lifecycle


def test_stream_lifecycle_through_dag_test(
    pravega_conn: Callable[..., None], pravega_controller_uri: str, client: PravegaClient, unique_name: Callable[[str], str]
) -> None:
    from airflow.sdk import DAG, task

    from airflow_provider_pravega.operators import (
        PravegaCreateScopeOperator,
        PravegaCreateStreamOperator,
        PravegaDeleteScopeOperator,
        PravegaDeleteStreamOperator,
        PravegaScaleStreamOperator,
        PravegaSealStreamOperator,
        PravegaTruncateStreamOperator,
        PravegaUpdateStreamOperator,
    )

    scope, stream = unique_name("ops"), unique_name("lifecycle")
    seen: dict[str, Any] = {}

    with DAG(
        unique_name("admin-lifecycle"),
        schedule=None,
        start_date=START,
        params={"scope": scope, "stream": stream, "segments": 2},
    ) as dag:
        create_scope = PravegaCreateScopeOperator(task_id="create_scope", scope="{{ params.scope }}")
        create_stream = PravegaCreateStreamOperator(
            task_id="create_stream",
            scope="{{ params.scope }}",
            stream="{{ params.stream }}",
            segments="{{ params.segments }}",
            retention_size_bytes="{{ 10 * 1024 * 1024 }}",
            tags=["{{ params.stream }}-tag", "demo"],
        )
        update_stream = PravegaUpdateStreamOperator(
            task_id="update_stream",
            scope="{{ ti.xcom_pull(task_ids='create_stream')['scope'] }}",
            stream="{{ ti.xcom_pull(task_ids='create_stream')['stream'] }}",
            retention_time_ms=3_600_000,
            tags=["updated"],
        )

        @task
        def write_then_cut(info: dict[str, Any]) -> str:
            """10 events, remember the tail (the cut to truncate at later), 10 more events."""
            seen["created_info"] = info
            first = write_events(pravega_controller_uri, info["scope"], info["stream"], 10, "before")
            with PravegaClient(pravega_controller_uri) as c:
                tail = c.admin.tail(info["scope"], info["stream"])
                seen["cut_positions"] = tail
                seen["bytes_before_cut"] = first
                seen["bytes_after_cut"] = write_events(pravega_controller_uri, info["scope"], info["stream"], 10, "after")
                from airflow_provider_pravega._streams import cut_text

                return cut_text(info["scope"], info["stream"], tail)

        cut = write_then_cut(create_stream.output)
        scale = PravegaScaleStreamOperator(
            task_id="scale", scope="{{ params.scope }}", stream="{{ params.stream }}", split_segment="{{ 0 }}", parts=2
        )

        @task
        def write_after_scale(scaled: dict[str, Any]) -> None:
            seen["scaled"] = scaled
            seen["bytes_after_scale"] = write_events(pravega_controller_uri, scope, stream, 5, "scaled")

        truncate = PravegaTruncateStreamOperator(
            task_id="truncate",
            scope="{{ params.scope }}",
            stream="{{ params.stream }}",
            stream_cut="{{ ti.xcom_pull(task_ids='write_then_cut') }}",
        )

        @task
        def after_truncate(truncated: dict[str, Any]) -> None:
            seen["truncated"] = truncated
            with PravegaClient(pravega_controller_uri) as c:
                seen["head_after_truncate"] = c.admin.head(scope, stream)

        seal = PravegaSealStreamOperator(task_id="seal", scope="{{ params.scope }}", stream="{{ params.stream }}")

        @task
        def after_seal(sealed: dict[str, Any]) -> None:
            seen["sealed"] = sealed
            with PravegaClient(pravega_controller_uri) as c:
                seen["sealed_on_server"] = c.admin.stream_info(scope, stream).sealed
                every_segment = [0, 1] + [s["segment_id"] for s in seen["scaled"]["new_segments"]]
                seen["lengths"] = {
                    seg: c.segments.get_segment_info(qualified_segment_name(scope, stream, seg)).length
                    for seg in every_segment
                }

        delete_stream = PravegaDeleteStreamOperator(
            task_id="delete_stream", scope="{{ params.scope }}", stream="{{ params.stream }}"
        )

        @task
        def after_delete_stream(deleted: dict[str, Any]) -> None:
            seen["deleted_stream"] = deleted
            with PravegaClient(pravega_controller_uri) as c:
                seen["stream_exists_after_delete"] = c.admin.stream_exists(scope, stream)

        delete_scope = PravegaDeleteScopeOperator(task_id="delete_scope", scope="{{ params.scope }}")

        create_scope >> create_stream >> update_stream >> cut >> scale
        scaled = write_after_scale(scale.output)
        scaled >> truncate
        truncated = after_truncate(truncate.output)
        truncated >> seal
        sealed = after_seal(seal.output)
        sealed >> delete_stream
        deleted = after_delete_stream(delete_stream.output)
        deleted >> delete_scope

    dag_run = run_dag(dag)
    assert states(dag_run) == {t: "success" for t in dag.task_ids}, states(dag_run)

    created = seen["created_info"]
    assert created["created"] is True
    assert (created["scope"], created["stream"]) == (scope, stream)
    assert created["segment_count"] == 2 and created["scaling"]["policy"] == "fixed"
    assert created["retention"] == {"type": "size", "value": 10 * 1024 * 1024}
    assert sorted(created["tags"]) == sorted([f"{stream}-tag", "demo"])
    assert streamcut_from_text(created["tail"]).positions == {0: 0, 1: 0}

    # The update kept the scaling policy, replaced retention and tags.
    assert seen["scaled"]["retention"] == {"type": "time", "value": 3_600_000}
    assert seen["scaled"]["tags"] == ["updated"]
    assert seen["scaled"]["scaling"]["min_segments"] == 2

    # The split sealed segment 0 and replaced it by two halves of its key range.
    assert seen["scaled"]["sealed_segments"] == [0]
    halves = [(s["min_key"], s["max_key"]) for s in seen["scaled"]["new_segments"]]
    assert halves == [(0.0, 0.25), (0.25, 0.5)]
    assert seen["scaled"]["segment_count"] == 3

    # Truncation moved the head exactly to the cut taken from XCom.
    assert seen["head_after_truncate"] == seen["cut_positions"]
    assert streamcut_from_text(seen["truncated"]["truncated_at"]).positions == seen["cut_positions"]
    assert streamcut_from_text(seen["truncated"]["head"]).positions == seen["cut_positions"]

    # Sealed: the final cut is the end of every active segment, and all bytes written are there.
    assert seen["sealed_on_server"] is True and seen["sealed"]["sealed"] is True
    final = streamcut_from_text(seen["sealed"]["tail"]).positions
    assert final == {seg: n for seg, n in seen["lengths"].items() if seg != 0}
    written = seen["bytes_before_cut"] + seen["bytes_after_cut"] + seen["bytes_after_scale"]
    assert sum(seen["lengths"].values()) == written
    assert sum(seen["cut_positions"].values()) == seen["bytes_before_cut"]

    assert seen["deleted_stream"] == {"scope": scope, "stream": stream, "deleted": True}
    assert seen["stream_exists_after_delete"] is False
    assert client.admin.scope_exists(scope) is False


# ----------------------------------------------------------------------- idempotence and errors


def test_idempotent_create_and_delete_and_refusals(
    pravega_conn: Callable[..., None], client: PravegaClient, unique_name: Callable[[str], str],
    task_errors: dict[str, BaseException],
) -> None:
    from airflow.sdk import DAG

    from airflow_provider_pravega.operators import (
        PravegaCreateScopeOperator,
        PravegaCreateStreamOperator,
        PravegaDeleteScopeOperator,
        PravegaDeleteStreamOperator,
    )

    scope, stream = unique_name("idem"), unique_name("s")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 1)
    with DAG(unique_name("admin-idempotent"), schedule=None, start_date=START) as dag:
        PravegaCreateScopeOperator(task_id="again_scope", scope=scope)
        PravegaCreateStreamOperator(task_id="again_stream", scope=scope, stream=stream, segments=3)
        PravegaCreateScopeOperator(task_id="refuse_scope", scope=scope, fail_if_exists=True)
        PravegaCreateStreamOperator(task_id="refuse_stream", scope=scope, stream=stream, fail_if_exists=True)
        PravegaDeleteStreamOperator(task_id="gone_stream", scope=scope, stream="never-created")
        PravegaDeleteScopeOperator(task_id="gone_scope", scope=unique_name("never"))
        PravegaDeleteStreamOperator(
            task_id="must_exist", scope=scope, stream="never-created", fail_if_missing=True
        )
        PravegaDeleteScopeOperator(task_id="not_empty", scope=scope)
        PravegaCreateStreamOperator(
            task_id="bad_policy", scope=scope, stream=unique_name("p"), scaling_policy="by_event_rate", segments=2
        )

    dag_run = run_dag(dag)
    errors = {task_id: f"{type(exc).__name__}: {exc}" for task_id, exc in task_errors.items()}
    got = states(dag_run)
    assert {t: got[t] for t in ("again_scope", "again_stream", "gone_stream", "gone_scope")} == dict.fromkeys(
        ("again_scope", "again_stream", "gone_stream", "gone_scope"), "success"
    )
    assert {t: got[t] for t in ("refuse_scope", "refuse_stream", "must_exist", "not_empty", "bad_policy")} == dict.fromkeys(
        ("refuse_scope", "refuse_stream", "must_exist", "not_empty", "bad_policy"), "failed"
    )
    assert errors["refuse_scope"].startswith("ScopeExistsError") and scope in errors["refuse_scope"]
    assert errors["refuse_stream"].startswith("StreamExistsError") and f"{scope}/{stream}" in errors["refuse_stream"]
    assert errors["must_exist"].startswith("StreamNotFoundError") and "never-created" in errors["must_exist"]
    assert errors["not_empty"].startswith("ScopeNotEmptyError") and scope in errors["not_empty"]
    assert "segments is for scaling_policy 'fixed'" in errors["bad_policy"]
    # The existing stream was left as it was (1 segment), not recreated with 3.
    assert client.admin.stream_info(scope, stream).segment_count == 1
    assert client.admin.stream_exists(scope, stream)


def test_default_scope_from_connection_and_missing_scope(
    pravega_conn: Callable[..., None], client: PravegaClient, unique_name: Callable[[str], str],
    task_errors: dict[str, BaseException],
) -> None:
    from airflow.sdk import DAG

    from airflow_provider_pravega.operators import (
        PravegaCreateScopeOperator,
        PravegaCreateStreamOperator,
        PravegaDeleteScopeOperator,
        PravegaStreamCutExportOperator,
        PravegaTransactionalIngestOperator,
    )

    scope, stream = unique_name("dflt"), unique_name("s")
    pravega_conn("pravega_scoped", scope=scope)
    pravega_conn("pravega_unscoped")
    with DAG(unique_name("admin-scope"), schedule=None, start_date=START) as dag:
        PravegaCreateScopeOperator(task_id="create_scope", pravega_conn_id="pravega_scoped") >> PravegaCreateStreamOperator(
            task_id="create_stream",
            pravega_conn_id="pravega_scoped",
            stream=stream,
            scaling_policy="by_data_rate",
            target_rate=1024,
            scale_factor=2,
            min_segments=3,
        )
        PravegaDeleteScopeOperator(task_id="no_scope", pravega_conn_id="pravega_unscoped")
        # The ingest and the export take their scope by the same rule, with the same error.
        PravegaTransactionalIngestOperator(task_id="ingest_no_scope", pravega_conn_id="pravega_unscoped",
                                           stream=stream, source="/nonexistent/*.jsonl")
        PravegaStreamCutExportOperator(task_id="export_no_scope", pravega_conn_id="pravega_unscoped",
                                       stream=stream, output_path="/nonexistent/out")

    dag_run = run_dag(dag)
    errors = {task_id: str(exc) for task_id, exc in task_errors.items()}
    assert states(dag_run) == {"create_scope": "success", "create_stream": "success", "no_scope": "failed",
                               "ingest_no_scope": "failed", "export_no_scope": "failed"}
    for task_id in ("no_scope", "ingest_no_scope", "export_no_scope"):
        assert isinstance(task_errors[task_id], ScopeNotSetError), (task_id, task_errors[task_id])
        assert "'pravega_unscoped'" in errors[task_id] and "scope=..." in errors[task_id], errors[task_id]
    config = client.admin.get_stream_config(scope, stream)
    assert config.scaling == ScalingPolicy.by_data_rate(1024, 2, 3)
    assert client.admin.stream_info(scope, stream).segment_count == 3
    assert "pravega_unscoped" in errors["no_scope"] and "scope" in errors["no_scope"]


def test_scale_merge_explicit_and_retry_is_idempotent(
    pravega_conn: Callable[..., None], client: PravegaClient, unique_name: Callable[[str], str]
) -> None:
    """Scale operators' execute run directly (each is also part of the DAG test above): a retry of
    a finished scale succeeds without scaling again; a scale that cannot apply names the segments."""
    from airflow_provider_pravega.operators import PravegaScaleStreamOperator, PravegaUpdateStreamOperator

    scope, stream = unique_name("scale"), unique_name("s")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 2)
    # Pravega refuses a scale leaving fewer segments than the policy's minimum (PRECONDITION_FAILED).
    with pytest.raises(ScaleError, match="minimum number of segments"):
        PravegaScaleStreamOperator(task_id="m", scope=scope, stream=stream, merge_segments=[0, 1]).execute({})
    client.admin.update_stream(scope, stream, scaling=ScalingPolicy.fixed(1))

    merge = PravegaScaleStreamOperator(task_id="merge", scope=scope, stream=stream, merge_segments=[0, 1])
    first = merge.execute({})
    assert [(s["min_key"], s["max_key"]) for s in first["new_segments"]] == [(0.0, 1.0)]
    merged_id = first["new_segments"][0]["segment_id"]
    again = merge.execute({})
    assert again["new_segments"] == first["new_segments"]
    assert [s.segment_id for s in client.controller.get_current_segments(scope, stream)] == [merged_id]

    explicit = PravegaScaleStreamOperator(
        task_id="explicit", scope=scope, stream=stream, seal_segments=[merged_id],
        new_key_ranges="[[0.0, 0.1], [0.1, 0.7], [0.7, 1.0]]",
    )
    out = explicit.execute({})
    assert [(s["min_key"], s["max_key"]) for s in out["new_segments"]] == [(0.0, 0.1), (0.1, 0.7), (0.7, 1.0)]
    assert explicit.execute({})["new_segments"] == out["new_segments"]

    gap = PravegaScaleStreamOperator(
        task_id="gap", scope=scope, stream=stream, seal_segments=[out["new_segments"][0]["segment_id"]],
        new_key_ranges=[[0.0, 0.05]],
    )
    with pytest.raises(ScaleError, match="cover"):
        gap.execute({})
    with pytest.raises(ValueError, match="exactly one of"):
        PravegaScaleStreamOperator(task_id="two", scope=scope, stream=stream, split_segment=1, merge_segments=[1, 2]).execute({})

    update = PravegaUpdateStreamOperator(task_id="update", scope=scope, stream=stream, remove_retention=True, tags=[])
    client.admin.update_stream(scope, stream, retention=RetentionPolicy.by_size(1 << 20), tags=["x"])
    info = update.execute({})
    assert info["retention"] is None and info["tags"] == []


def test_truncate_refuses_a_cut_of_another_stream(
    pravega_conn: Callable[..., None], client: PravegaClient, unique_name: Callable[[str], str]
) -> None:
    from airflow_provider_pravega._streams import cut_text
    from airflow_provider_pravega.client.errors import InvalidStreamCutError
    from airflow_provider_pravega.operators import PravegaTruncateStreamOperator

    scope, stream = unique_name("trunc"), unique_name("s")
    client.admin.create_scope(scope)
    client.admin.create_stream(scope, stream, 1)
    other = cut_text(scope, "other-stream", {0: 0})
    with pytest.raises(InvalidStreamCutError, match=rf"the stream_cut belongs to stream {scope}/other-stream, but stream {scope}/{stream}"):
        PravegaTruncateStreamOperator(task_id="t", scope=scope, stream=stream, stream_cut=other).execute({})
    with pytest.raises(InvalidStreamCutError, match="stream_cut: invalid stream cut text"):
        PravegaTruncateStreamOperator(task_id="t", scope=scope, stream=stream, stream_cut="nonsense").execute({})
    # "head" on a fresh stream: nothing to do, and it says where the stream starts.
    out = PravegaTruncateStreamOperator(task_id="t", scope=scope, stream=stream, stream_cut="head").execute({})
    assert streamcut_from_text(out["truncated_at"]).positions == {0: 0}
