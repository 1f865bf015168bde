"""Airflow sees the provider: the real ``airflow`` CLI in a fresh AIRFLOW_HOME with SQLite.

Needs the package installed in the running interpreter's environment (``pip install -e .``), as
``scripts/test`` does: Airflow discovers providers only through installed entry points.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

import airflow_provider_pravega
from airflow_provider_pravega import get_provider_info
from airflow_provider_pravega.client.config import EXTRA_FIELDS

PACKAGE = "airflow-provider-pravega"


AIRFLOW_3_3 = tuple(int(p) for p in metadata.version("apache-airflow").split(".")[:2]) >= (3, 3)


def airflow(env: dict[str, str], *args: str, timeout: float = 180, expect_rc: int = 0) -> str:
    """Run the real Airflow CLI and return its stdout; fail with its output on another exit code."""
    proc = subprocess.run(
        [sys.executable, "-m", "airflow", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == expect_rc, f"airflow {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def json_output(text: str) -> Any:
    """The JSON document in CLI output: the last line that parses (log lines, some starting with
    ``[info ...]`` as Airflow 3.2's do, may precede it)."""
    for line in reversed(text.strip().splitlines()):
        if line.lstrip().startswith(("[", "{")):
            try:
                return json.loads(line)
            except ValueError:
                continue
    start = min(i for i in (text.find("["), text.find("{")) if i >= 0)
    return json.loads(text[start:])


def airflow_schema(name: str) -> dict[str, Any]:
    import airflow

    return json.loads((Path(airflow.__file__).parent / name).read_text())


# ---------------------------------------------------------------------------- metadata, in-process


def test_entry_point_is_installed() -> None:
    points = metadata.entry_points(group="apache_airflow_provider")
    ours = [p for p in points if p.dist is not None and p.dist.name == PACKAGE]
    assert [p.value for p in ours] == ["airflow_provider_pravega:get_provider_info"], (
        "the package is not installed in this environment: run scripts/bootstrap.sh or pip install -e ."
    )
    assert metadata.version(PACKAGE) == airflow_provider_pravega.__version__


def test_provider_info_matches_airflows_schema() -> None:
    info = get_provider_info()
    jsonschema.validate(info, airflow_schema("provider_info.schema.json"))
    assert info["package-name"] == PACKAGE
    assert info["name"] == "Pravega"
    assert info["description"].strip()
    assert info["versions"] == [airflow_provider_pravega.__version__]
    assert info["hook-class-names"] == ["airflow_provider_pravega.hooks.pravega.PravegaHook"]
    [conn_type] = info["connection-types"]
    assert conn_type["connection-type"] == "pravega"
    assert conn_type["hook-class-name"] == "airflow_provider_pravega.hooks.pravega.PravegaHook"
    assert conn_type["hook-name"] == "Pravega"
    assert set(conn_type["conn-fields"]) == set(EXTRA_FIELDS)


def test_provider_yaml_matches_airflows_schema() -> None:
    text = (Path(airflow_provider_pravega.__file__).parent / "provider.yaml").read_text()
    jsonschema.validate(yaml.safe_load(text), airflow_schema("provider.yaml.schema.json"))


def test_operator_sensor_trigger_modules_are_listed_when_present() -> None:
    info = get_provider_info()
    for section in ("operators", "sensors", "triggers"):
        package = Path(airflow_provider_pravega.__file__).parent / section
        modules = sorted(
            f"airflow_provider_pravega.{section}.{p.stem}" for p in package.glob("*.py") if not p.stem.startswith("_")
        )
        listed = [m for entry in info.get(section, []) for m in entry["python-modules"]]
        assert listed == modules


# --------------------------------------------------------------------------------- the real CLI


def test_airflow_providers_commands_show_the_provider(fresh_airflow_env: dict[str, str]) -> None:
    providers = json_output(airflow(fresh_airflow_env, "providers", "list", "-o", "json"))
    ours = [p for p in providers if p["package_name"] == PACKAGE]
    assert ours and ours[0]["version"] == airflow_provider_pravega.__version__

    hooks = json_output(airflow(fresh_airflow_env, "providers", "hooks", "-o", "json"))
    [pravega] = [h for h in hooks if h["connection_type"] == "pravega"]
    assert pravega["class"] == "airflow_provider_pravega.hooks.pravega.PravegaHook"
    assert pravega["conn_id_attribute_name"] == "pravega_conn_id"
    assert pravega["hook_name"] == "Pravega"

    widgets = json_output(airflow(fresh_airflow_env, "providers", "widgets", "-o", "json"))
    ours_widgets = {w["connection_parameter_name"] for w in widgets if w["package_name"] == PACKAGE}
    assert ours_widgets == {f"extra__pravega__{name}" for name in EXTRA_FIELDS}

    behaviours = json_output(airflow(fresh_airflow_env, "providers", "behaviours", "-o", "json"))
    assert {"field_behaviours": "pravega"} in behaviours


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_airflow_connections_add_get_and_test(fresh_airflow_env: dict[str, str], closed_port: int) -> None:
    env = dict(fresh_airflow_env, AIRFLOW__CORE__TEST_CONNECTION="Enabled")
    airflow(env, "db", "migrate")
    airflow(
        env, "connections", "add", "pravega_default",
        "--conn-type", "pravega",
        "--conn-host", "127.0.0.1",
        "--conn-port", str(closed_port),
        "--conn-login", "admin",
        "--conn-password", "pw",
        "--conn-extra", json.dumps({"scope": "examples", "transaction_lease_ms": 30000}),
    )  # fmt: skip
    [conn] = json_output(airflow(env, "connections", "get", "pravega_default", "-o", "json"))
    assert conn["conn_type"] == "pravega"
    assert conn["host"] == "127.0.0.1" and int(conn["port"]) == closed_port
    assert conn["extra_dejson"]["scope"] == "examples"

    # `airflow connections test` goes through Connection.get_hook() -> PravegaHook.test_connection().
    # A failed test exits 1 from Airflow 3.3 on; 3.2's CLI exits 0 and only prints the failure.
    out = airflow(env, "connections", "test", "pravega_default", timeout=60, expect_rc=1 if AIRFLOW_3_3 else 0)
    assert "Connection failed!" in out
    assert f"Cannot reach the Pravega controller at tcp://127.0.0.1:{closed_port}" in out
