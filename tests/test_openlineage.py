"""OpenLineage datasets reported by the stream operators (through the OpenLineage provider's own
DefaultExtractor), the naming helpers, and the quiet None when OpenLineage is not installed."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.openlineage import (
    file_dataset,
    operator_lineage,
    stream_dataset,
    stream_namespace,
)

pytest.importorskip(
    "airflow.providers.openlineage.extractors",
    reason="apache-airflow-providers-openlineage is not installed (the operators then report no lineage)",
)


@pytest.fixture
def controller(monkeypatch: pytest.MonkeyPatch, pravega_embedded: Any) -> tuple[str, int]:
    host, port = pravega_embedded.controller_uri.rsplit("//", 1)[1].rsplit(":", 1)
    monkeypatch.setenv(
        "AIRFLOW_CONN_PRAVEGA_DEFAULT", json.dumps({"conn_type": "pravega", "host": host, "port": int(port)})
    )
    return host, int(port)


def extracted(operator: Any) -> Any:
    """What Airflow's OpenLineage integration gets from the operator after a successful run."""
    from airflow.providers.openlineage.extractors.base import DefaultExtractor

    return DefaultExtractor(operator).extract_on_complete(task_instance=None)


def lifecycle(dataset: Any) -> str | None:
    facet = dataset.facets.get("lifecycleStateChange")
    return None if facet is None else facet.lifecycleStateChange.value


def test_naming() -> None:
    assert stream_namespace(PravegaConnectionConfig(host="ctrl.example", port=9090)) == "pravega://ctrl.example:9090"
    assert stream_namespace(PravegaConnectionConfig(host="::1", port=9090)) == "pravega://[::1]:9090"
    ds = stream_dataset(PravegaConnectionConfig(host="h", port=1), "sc", "st", lifecycle="CREATE")
    assert (ds.namespace, ds.name, lifecycle(ds)) == ("pravega://h:1", "sc/st", "CREATE")
    assert (file_dataset("/data/in/a.json").namespace, file_dataset("/data/in/a.json").name) == ("file", "/data/in/a.json")
    assert (file_dataset("file:///tmp/x.csv").namespace, file_dataset("file:///tmp/x.csv").name) == ("file", "/tmp/x.csv")
    s3 = file_dataset("s3://bucket/exports/2024/part-0.parquet")
    assert (s3.namespace, s3.name) == ("s3://bucket", "exports/2024/part-0.parquet")
    with pytest.raises(ValueError, match="lifecycle"):
        stream_dataset(PravegaConnectionConfig(), "sc", "st", lifecycle="EXPLODE")
    lineage = operator_lineage(inputs=[file_dataset("/a"), None], outputs=[ds])
    assert [d.name for d in lineage.inputs] == ["/a"] and [d.name for d in lineage.outputs] == ["sc/st"]


def test_stream_operators_report_their_stream(
    controller: tuple[str, int], client: PravegaClient, unique_name: Callable[[str], str]
) -> None:
    from airflow_provider_pravega.operators import (
        PravegaCreateStreamOperator,
        PravegaDeleteStreamOperator,
        PravegaScaleStreamOperator,
        PravegaSealStreamOperator,
        PravegaTruncateStreamOperator,
    )

    host, port = controller
    scope, stream = unique_name("ol"), unique_name("s")
    client.admin.create_scope(scope)
    expected = (f"pravega://{host}:{port}", f"{scope}/{stream}")

    def run(operator: Any) -> Any:
        operator.execute({})
        lineage = extracted(operator)
        if lineage is None:
            return None
        assert lineage.inputs == []
        [dataset] = lineage.outputs
        assert (dataset.namespace, dataset.name) == expected
        return lifecycle(dataset)

    create = PravegaCreateStreamOperator(task_id="create", scope=scope, stream=stream, segments=2)
    assert extracted(create) is None  # not run yet: nothing to report
    assert run(create) == "CREATE"
    assert run(PravegaCreateStreamOperator(task_id="again", scope=scope, stream=stream)) is None  # existed
    assert run(PravegaScaleStreamOperator(task_id="scale", scope=scope, stream=stream, split_segment=0)) == "ALTER"
    assert run(PravegaTruncateStreamOperator(task_id="truncate", scope=scope, stream=stream, stream_cut="tail")) == "TRUNCATE"
    assert run(PravegaSealStreamOperator(task_id="seal", scope=scope, stream=stream)) == "ALTER"
    assert run(PravegaDeleteStreamOperator(task_id="delete", scope=scope, stream=stream)) == "DROP"
    gone = PravegaDeleteStreamOperator(task_id="gone", scope=scope, stream=stream)
    gone.execute({})
    assert extracted(gone) is None  # nothing was deleted, no dataset changed


def test_delete_scope_reports_the_streams_it_dropped(
    controller: tuple[str, int], client: PravegaClient, unique_name: Callable[[str], str]
) -> None:
    from airflow_provider_pravega.operators import PravegaDeleteScopeOperator

    scope = unique_name("olscope")
    client.admin.create_scope(scope)
    for name in ("a", "b"):
        client.admin.create_stream(scope, name, 1)
    operator = PravegaDeleteScopeOperator(task_id="drop", scope=scope, delete_streams=True)
    assert operator.execute({}) == {"scope": scope, "deleted": True, "deleted_streams": ["a", "b"]}
    lineage = extracted(operator)
    assert sorted((d.name, lifecycle(d)) for d in lineage.outputs) == [(f"{scope}/a", "DROP"), (f"{scope}/b", "DROP")]
    assert client.admin.scope_exists(scope) is False


def test_without_the_openlineage_provider_lineage_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes the import fail exactly as for an uninstalled package.
    monkeypatch.setitem(sys.modules, "airflow.providers.openlineage.extractors", None)
    assert stream_dataset(PravegaConnectionConfig(), "sc", "st") is None
    assert file_dataset("/tmp/a") is None
    assert operator_lineage(outputs=[]) is None
