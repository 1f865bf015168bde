"""The ``pravega`` asset URI scheme, through Airflow's own registry (provider.yaml ``asset-uris``):
normalization of ``Asset("pravega://…")``, bad URIs refused with the reason, the asset factory, and
the OpenLineage dataset being the one the operators report for the same stream."""

from __future__ import annotations

import json

import pytest
from airflow.sdk import Asset

from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.hooks.pravega import PravegaHook


@pytest.mark.parametrize(("given", "normalized"), [
    ("pravega://Controller/iot/readings", "pravega://controller:9090/iot/readings"),
    ("pravega://ctrl:9091/iot/readings/", "pravega://ctrl:9091/iot/readings"),
    ("PRAVEGA://ctrl:9090/iot/readings#frag", "pravega://ctrl:9090/iot/readings"),
    ("pravega://[::1]/iot/readings", "pravega://[::1]:9090/iot/readings"),
])
def test_asset_uris_are_normalized(given: str, normalized: str) -> None:
    assert Asset(given).uri == normalized


@pytest.mark.parametrize(("given", "reason"), [
    ("pravega://ctrl/iot", "the path must be /scope/stream"),
    ("pravega://ctrl/iot/readings/more", "the path must be /scope/stream"),
    ("pravega://ctrl/iot/bad name", "invalid stream name 'bad name'"),
    ("pravega://ctrl/_system/readings", "scope"),
    ("pravega://ctrl:port/iot/readings", "port is not a number"),
    ("pravega:///iot/readings", "names its controller"),
])
def test_bad_asset_uris_are_refused_naming_the_problem(given: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason.replace("(", r"\(")):
        Asset(given)


def test_factory_and_openlineage_mapping_are_registered() -> None:
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    from airflow_provider_pravega.openlineage import stream_dataset

    manager = ProvidersManagerTaskRuntime()
    asset = manager.asset_factories["pravega"](scope="iot", stream="readings", host="ctrl", port=9091)
    assert asset.uri == "pravega://ctrl:9091/iot/readings"
    dataset = manager.asset_to_openlineage_converters["pravega"](asset, None)
    reported = stream_dataset(PravegaConnectionConfig.from_connection_fields(host="ctrl", port=9091), "iot", "readings")
    assert (dataset.namespace, dataset.name) == (reported.namespace, reported.name) == ("pravega://ctrl:9091",
                                                                                        "iot/readings")


def test_hook_asset_uri_names_the_connections_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PRAVEGA_ASSETS", json.dumps({"conn_type": "pravega", "host": "tls://ctrl.example",
                                                                  "port": 9443}))
    assert PravegaHook.asset_uri("iot", "readings", "pravega_assets") == "pravega://ctrl.example:9443/iot/readings"
    # Not defined where the DAG is parsed: the connection defaults, so the DAG file still parses.
    assert PravegaHook.asset_uri("iot", "readings", "pravega_undefined") == "pravega://localhost:9090/iot/readings"
