"""The ``pravega`` connection form in Airflow's own UI, in headless Chromium.

The api-server builds the form from our provider.yaml (``ui-field-behaviour`` and ``conn-fields``);
this test checks what a user actually sees and what the UI stores when they press Save, and that
PravegaHook reads the stored connection. A screenshot of the filled form is kept under artifacts/.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pravega.hooks.pravega import PravegaHook

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "artifacts"
# The form's sections are an accordion that opens one at a time: one picture of each, filled in.
SCREENSHOTS = (ARTIFACTS / "connection-form-pravega-standard-fields.png",
               ARTIFACTS / "connection-form-pravega-extra-fields.png")
FAILURE_SCREENSHOT = ARTIFACTS / "connection-form-pravega-failure.png"

CONN_ID = "pravega_ui_form"
HOST = "controller.pravega.internal"
PORT = 9191
SCOPE = "sensors-eu.1"
LEASE_MS = 120000

# Labels and placeholders come from provider.yaml; "Schema" is hidden there.
STANDARD_FIELDS = {  # input name -> (label, placeholder)
    "host": ("Controller host", "localhost"),
    "port": ("Controller port", "9090"),
    "login": ("Username", "leave empty when the controller has no authentication"),
    "password": ("Password", "leave empty when the controller has no authentication"),
}
EXTRA_FIELDS = {  # conn-fields key -> (label, a selector of its widget; the UI names them element_<key>)
    "scope": ("Default scope", "input[name=element_scope]"),
    "tls": ("TLS", "input[name=element_tls]"),
    "trust_store": ("Trust store", "input[name=element_trust_store]"),
    "validate_hostname": ("Validate server certificate", "input[name=element_validate_hostname]"),
    # An integer schema becomes a number input whose buttons carry the field name.
    "transaction_lease_ms": ("Transaction lease (ms)", "[id='number-input:element_transaction_lease_ms:inc']"),
    "keycloak_file": ("keycloak.json path", "input[name=element_keycloak_file]"),
}


def _stored_connection(server: Any, conn_id: str, timeout_s: float = 20.0) -> dict[str, Any]:
    """The connection as the REST API returns it, waiting (bounded) for the UI's save to land."""
    token = server.token()
    deadline = time.monotonic() + timeout_s
    while True:
        listed = server.request("GET", f"/api/v2/connections?connection_id_pattern={conn_id}", token=token)
        if any(c["connection_id"] == conn_id for c in listed["connections"]):
            return server.request("GET", f"/api/v2/connections/{conn_id}", token=token)
        if time.monotonic() > deadline:
            raise AssertionError(f"connection {conn_id!r} not stored {timeout_s}s after Save; the server has "
                                 f"{[c['connection_id'] for c in listed['connections']]}")
        time.sleep(0.5)


def _field_group(dialog: Any, selector: str) -> Any:
    """The Chakra field group (label, input, description) holding the element ``selector`` matches.

    Labels are found through their group because the UI does not always point ``label[for]`` at
    the input's id.
    """
    return dialog.locator("[data-scope=field][data-part=root]").filter(has=dialog.page.locator(selector))


def _label_of(dialog: Any, selector: str) -> Any:
    return _field_group(dialog, selector).locator("label[data-scope=field][data-part=label]")


@pytest.mark.timeout(300)
def test_pravega_connection_form(chromium_executable: str, airflow_api_server: Any, browser_page: Any,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from playwright.sync_api import expect

    page = browser_page
    server = airflow_api_server
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        # ---- log in through the UI (simple auth manager), landing on the connections page
        page.goto(f"{server.base_url}/connections")
        page.locator("input[name=username]").fill(server.username)
        page.locator("input[name=password]").fill(server.password)
        page.locator("button[type=submit]").click()
        page.wait_for_url(re.compile(r"/connections$"))

        # ---- open "Add Connection" and choose the connection type offered by our provider
        page.get_by_role("button", name="Add Connection").click()
        dialog = page.get_by_role("dialog")
        expect(dialog.get_by_text("Add Connection")).to_be_visible()
        dialog.get_by_role("combobox").fill("Pravega")
        page.get_by_role("option", name="Pravega", exact=True).click()

        # ---- the standard fields, relabelled, with our placeholders; Schema is hidden
        for name, (label, placeholder) in STANDARD_FIELDS.items():
            field = dialog.locator(f"input[name={name}]")
            expect(field).to_be_visible()
            expect(field).to_have_attribute("placeholder", placeholder)
            expect(_label_of(dialog, f"input[name={name}]")).to_have_text(label)
        expect(dialog.locator("input[name=schema]")).to_have_count(0)
        expect(dialog.locator("label", has_text=re.compile(r"^\s*Schema\s*$"))).to_have_count(0)
        dialog.locator("input[name=connection_id]").fill(CONN_ID)
        dialog.locator("input[name=host]").fill(HOST)
        dialog.locator("input[name=port]").fill(str(PORT))
        dialog.screenshot(path=str(SCREENSHOTS[0]))

        # ---- the extra fields from conn-fields, with labels, descriptions and defaults (opening
        # this section closes the standard one; its values must survive that)
        dialog.get_by_role("button", name="Extra Fields", exact=True).click()
        for key, (label, selector) in EXTRA_FIELDS.items():
            expect(dialog.locator(selector)).to_have_count(1)
            expect(_label_of(dialog, selector)).to_have_text(label)
        expect(dialog.get_by_text("Scope used when a task names a stream without its scope.")).to_be_visible()
        expect(dialog.locator("input[name=element_tls]")).not_to_be_checked()
        expect(dialog.locator("input[name=element_validate_hostname]")).to_be_checked()
        lease = _field_group(dialog, EXTRA_FIELDS["transaction_lease_ms"][1]).locator("input")
        expect(lease).to_have_value("90000")
        dialog.locator("input[name=element_scope]").fill(SCOPE)
        lease.fill(str(LEASE_MS))
        lease.blur()
        expect(lease).to_have_value(str(LEASE_MS))
        save = dialog.get_by_role("button", name="Save")
        expect(save).to_be_enabled()
        dialog.screenshot(path=str(SCREENSHOTS[1]))
        print("\nscreenshots of the filled pravega connection form:", *map(str, SCREENSHOTS), sep="\n  ")

        # ---- save: the dialog closes and the connections list shows the new one
        save.click()
        expect(dialog).to_have_count(0)
        expect(page.get_by_role("row").filter(has_text=CONN_ID)).to_contain_text("pravega")
    except Exception:
        page.screenshot(path=str(FAILURE_SCREENSHOT), full_page=True)
        print(f"\nscreenshot at the failure: {FAILURE_SCREENSHOT}\napi-server log: {server.log}")
        raise

    # ---- what the UI stored, as the REST API returns it
    stored = _stored_connection(server, CONN_ID)
    print(f"stored by the UI: {json.dumps(stored, sort_keys=True)}")
    assert stored["conn_type"] == "pravega", stored
    assert stored["host"] == HOST, stored
    assert stored["port"] == PORT, stored
    assert stored["schema"] in (None, ""), stored
    # Airflow 3.3's form stores every conn-field, the untouched ones with the defaults it showed.
    assert json.loads(stored["extra"] or "{}") == {
        "scope": SCOPE, "tls": False, "trust_store": None, "validate_hostname": True,
        "transaction_lease_ms": LEASE_MS, "auth_method": None, "keycloak_file": None,
    }, stored["extra"]

    # ---- PravegaHook reads exactly this connection (handed over as a deployment would, AIRFLOW_CONN_*)
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({
        "conn_type": stored["conn_type"], "host": stored["host"], "port": stored["port"],
        "login": stored["login"], "schema": stored["schema"], "extra": stored["extra"],
    }))
    config = PravegaHook(pravega_conn_id=CONN_ID).get_config()
    assert config.controller_uri == f"tcp://{HOST}:{PORT}"
    assert config.scope == SCOPE
    assert config.tls_enabled is False
    assert config.validate_hostname is True
    assert config.transaction_lease_ms == LEASE_MS
    assert config.username is None and config.password is None
    assert config.auth_method == "Basic" and config.keycloak_file is None
