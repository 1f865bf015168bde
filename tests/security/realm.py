"""The test realm (keycloak_realm.json) and the names the Keycloak tests use."""

from __future__ import annotations

import json
from pathlib import Path

REALM = json.loads(Path(__file__).with_name("keycloak_realm.json").read_text())
APP = "pravega-app"
APP_SECRET = next(c["secret"] for c in REALM["clients"] if c["clientId"] == APP)
#: The embedded server's Basic-auth account that may do anything (it makes the read-only scope's streams).
ADMIN = ("admin", "admin-password")
#: Scopes the realm lets pravega-app write, and only read.
WRITABLE, READ_ONLY = "alpha", "beta"
