"""The wiring of docker-compose.yaml, checked by parsing it.

Docker is not run: these machines (developers' and CI's) have no Docker engine and no access to
Docker Hub. What can be checked without one is checked here: services, pinned images, ports,
healthchecks, the dependency graph, mounts, and that the connection variables are connections
our hook and Airflow's Spark hook accept, pointing at the services that exist.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_provider_pravega.hooks.pravega import PravegaHook

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yaml"
AIRFLOW_SERVICES = {
    "airflow-init",
    "airflow-api-server",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
}
LONG_RUNNING = {"pravega", "postgres", "spark-master", "spark-worker"} | AIRFLOW_SERVICES - {"airflow-init"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def depends(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on", {})
    if isinstance(deps, list):
        return {name: "service_started" for name in deps}
    return {name: spec.get("condition", "service_started") for name, spec in deps.items()}


def container_ports(service: dict[str, Any]) -> set[int]:
    return {int(str(p).split(":")[-1].split("/")[0]) for p in service.get("ports", [])}


def test_expected_services(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == LONG_RUNNING | {"airflow-init"}


def test_images_are_pinned(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        image = service.get("image")
        assert image, f"{name} has no image"
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and re.search(r"\d", tag), f"{name}: unpinned image {image!r}"
    assert services["pravega"]["image"] == "pravega/pravega:0.13.0"
    assert services["postgres"]["image"].startswith("postgres:16.")


def test_dockerfiles_pin_their_base_images() -> None:
    for dockerfile in ("docker/airflow/Dockerfile", "docker/spark/Dockerfile"):
        bases = re.findall(r"^FROM\s+(\S+)", (ROOT / dockerfile).read_text(), flags=re.MULTILINE)
        assert bases, dockerfile
        for base in bases:
            tag = base.rpartition(":")[2]
            assert ":" in base and tag != "latest" and re.search(r"\d+\.\d+", tag), f"{dockerfile}: {base}"
    assert "FROM apache/airflow:3.3.2-python3.11" in (ROOT / "docker/airflow/Dockerfile").read_text()


def test_both_images_install_one_tested_stack() -> None:
    """Spark drivers run in the Airflow image and executors in the Spark image: both install the
    provider with constraints/default.txt, so they run one pyspark release (the ranges alone could
    pick two)."""
    for dockerfile in ("docker/airflow/Dockerfile", "docker/spark/Dockerfile"):
        text = (ROOT / dockerfile).read_text()
        assert re.search(r"^COPY .*constraints /opt/pravega-provider/constraints$", text, flags=re.MULTILINE), dockerfile
        installs = re.findall(r"^RUN pip install (.*(?:\\\n.*)*)", text, flags=re.MULTILINE)
        assert installs and all("-c /opt/pravega-provider/constraints/default.txt" in i for i in installs), dockerfile


def test_built_images_have_their_dockerfiles(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        if "build" in service:
            build = service["build"]
            assert (ROOT / build["context"] / build["dockerfile"]).is_file(), name


def test_pravega_runs_standalone_with_both_endpoints(services: dict[str, dict[str, Any]]) -> None:
    pravega = services["pravega"]
    assert pravega["command"] == "standalone"
    assert {9090, 12345} <= container_ports(pravega)
    # The segment store must advertise a name the other containers can resolve.
    assert env_of(pravega)["HOST_IP"] == "${PRAVEGA_PUBLISHED_HOST:-pravega}"


def test_every_long_running_service_has_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    for name in LONG_RUNNING:
        check = services[name].get("healthcheck")
        assert check and check.get("test"), f"{name} has no healthcheck"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name


def test_dependency_graph_is_complete_and_acyclic(services: dict[str, dict[str, Any]]) -> None:
    graph = {name: depends(service) for name, service in services.items()}
    for name, deps in graph.items():
        for dep, condition in deps.items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            if condition == "service_healthy":
                assert services[dep].get("healthcheck"), f"{name} waits for {dep} to be healthy; it has no check"
            elif condition == "service_completed_successfully":
                assert services[dep].get("restart") == "no", f"{dep} is awaited to complete but restarts"
            else:
                pytest.fail(f"{name} -> {dep}: condition {condition!r} does not wait for readiness")

    visiting: set[str] = set()
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        assert node not in visiting, f"dependency cycle: {' -> '.join([*path, node])}"
        if node in done:
            return
        visiting.add(node)
        for dep in graph[node]:
            visit(dep, [*path, node])
        visiting.remove(node)
        done.add(node)

    for node in graph:
        visit(node, [])

    # What each part needs before it starts.
    assert graph["airflow-init"] == {"postgres": "service_healthy"}
    for name in AIRFLOW_SERVICES - {"airflow-init"}:
        assert graph[name]["postgres"] == "service_healthy", name
        assert graph[name]["airflow-init"] == "service_completed_successfully", name
    for name in ("airflow-scheduler", "airflow-triggerer", "spark-worker"):
        assert graph[name]["pravega"] == "service_healthy", name
    assert graph["airflow-scheduler"]["spark-master"] == "service_healthy"
    assert graph["spark-worker"]["spark-master"] == "service_healthy"


def test_airflow_services_share_config_and_mount_dags(services: dict[str, dict[str, Any]]) -> None:
    commands = {name: services[name]["command"] for name in AIRFLOW_SERVICES}
    assert commands == {
        "airflow-init": "version",
        "airflow-api-server": "api-server",
        "airflow-scheduler": "scheduler",
        "airflow-dag-processor": "dag-processor",
        "airflow-triggerer": "triggerer",
    }
    for name in AIRFLOW_SERVICES:
        service = services[name]
        assert service["build"]["dockerfile"] == "docker/airflow/Dockerfile", name
        assert "./dags:/opt/airflow/dags:ro" in service["volumes"], name
        env = env_of(service)
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://airflow:")
        assert "@postgres:5432/airflow" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-api-server:8080/execution/"
    init_env = env_of(services["airflow-init"])
    assert init_env["_AIRFLOW_DB_MIGRATE"] == "true" and init_env["_AIRFLOW_WWW_USER_CREATE"] == "true"
    assert 8080 in container_ports(services["airflow-api-server"])


def test_pravega_connection_variable_is_a_valid_connection_to_the_pravega_service(
    services: dict[str, dict[str, Any]],
) -> None:
    from airflow.sdk import Connection

    for name in AIRFLOW_SERVICES:
        raw = env_of(services[name])["AIRFLOW_CONN_PRAVEGA_DEFAULT"]
        conn = Connection.from_json(raw, conn_id="pravega_default")
        config = PravegaHook.config_from_connection(conn)
        assert config.host == "pravega" and config.host in services
        assert config.port in container_ports(services["pravega"])
        assert config.controller_uri == "tcp://pravega:9090"
        assert config.scope == "examples"


def test_spark_connection_variable_points_at_the_master(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    raw = env_of(services["airflow-scheduler"])["AIRFLOW_CONN_SPARK_DEFAULT"]
    conn_json = json.loads(raw)
    assert conn_json["conn_type"] == "spark"
    master = services["spark-master"]["command"]
    master_port = int(master[master.index("--port") + 1])
    assert f"{conn_json['host']}:{conn_json['port']}" == f"spark://spark-master:{master_port}"
    worker = services["spark-worker"]["command"]
    assert f"spark://spark-master:{master_port}" in worker

    # Airflow's own Spark hook reads the variable into the same master URL.
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", raw)
    hook = SparkSubmitHook(conn_id="spark_default")
    assert hook._connection["master"] == f"spark://spark-master:{master_port}"
    assert hook._connection["deploy_mode"] == "client"


def test_spark_nodes_share_data_with_the_drivers(services: dict[str, dict[str, Any]]) -> None:
    # Drivers run in Airflow's scheduler (LocalExecutor); executors run in the Spark worker.
    assert "./data:/data" in services["airflow-scheduler"]["volumes"]
    assert "./data:/data" in services["spark-worker"]["volumes"]
    assert services["airflow-scheduler"]["hostname"] == "airflow-scheduler"
    assert services["spark-master"]["build"]["dockerfile"] == "docker/spark/Dockerfile"
    assert services["spark-worker"]["build"]["dockerfile"] == "docker/spark/Dockerfile"
