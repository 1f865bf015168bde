"""Airflow hook for Pravega: maps a ``pravega`` Connection to a controller configuration.

Like the Kafka provider's hooks it only translates configuration; the Pravega semantics live in
:mod:`airflow_provider_pravega.client`, which works without Airflow.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from typing import Any

from airflow.sdk import BaseHook

from airflow_provider_pravega import get_provider_info
from airflow_provider_pravega.assets import stream_uri
from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.config import (
    PravegaConfigError,
    PravegaConnectionConfig,
    host_port,
    import_official_client,
)
from airflow_provider_pravega.client.controller_probe import (
    ControllerProbeError,
    ControllerProbePermissionError,
    ControllerProbeTLSError,
    list_scopes,
)
from airflow_provider_pravega.client.errors import KeycloakTokenError, PravegaPermissionError
from airflow_provider_pravega.client.security import basic_auth_metadata

__all__ = ["PravegaConfigError", "PravegaConnectionConfig", "PravegaHook"]


class PravegaHook(BaseHook):
    """Reads a ``pravega`` connection and checks that its controller answers.

    :param pravega_conn_id: The Airflow connection to use (connection type ``pravega``).
    """

    conn_name_attr = "pravega_conn_id"
    default_conn_name = "pravega_default"
    conn_type = "pravega"
    hook_name = "Pravega"

    #: Seconds allowed for the plain TCP connect to the controller in :meth:`test_connection`.
    tcp_connect_timeout: float = 3.0
    #: Seconds allowed for the controller call (list scopes) in :meth:`test_connection`.
    controller_call_timeout: float = 8.0
    #: Upper bound, in seconds, for the whole of :meth:`test_connection`.
    test_connection_budget: float = 9.5

    def __init__(self, pravega_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pravega_conn_id = pravega_conn_id
        self._config: PravegaConnectionConfig | None = None

    # ------------------------------------------------------------------------------ config

    def get_config(self) -> PravegaConnectionConfig:
        """The controller configuration of this hook's connection (read once, then cached).

        :raises PravegaConfigError: a field of the connection has a value that cannot work.
        """
        if self._config is None:
            config = self.config_from_connection(self.get_connection(self.pravega_conn_id))
            mask_credentials(config)
            self._config = config
        return self._config

    @classmethod
    def config_from_connection(cls, conn: Any) -> PravegaConnectionConfig:
        """The controller configuration described by an Airflow ``Connection`` object.

        :raises PravegaConfigError: a field of the connection has a value that cannot work.
        """
        if conn.conn_type and conn.conn_type != cls.conn_type:
            raise PravegaConfigError(
                "conn_type", conn.conn_type, f"connection {conn.conn_id!r} is not a 'pravega' one"
            )
        return PravegaConnectionConfig.from_connection_fields(
            host=conn.host,
            port=conn.port,
            login=conn.login,
            password=conn.password,
            schema=conn.schema,
            extra=conn.extra,
        )

    #: Seconds allowed for checking credentials before an official StreamManager is built.
    credential_check_timeout: float = 8.0

    def get_conn(self) -> Any:
        """An official ``pravega_client.StreamManager`` for this connection's controller, when the
        official client is installed (the ``official-client`` extra; CPython 3.10/3.11 only).
        Without it, OfficialClientMissingError (an ImportError) says how to get it. The provider's
        own client, :meth:`get_client`, is the main API and needs no official client.

        With credentials or TLS, the controller is asked first through this provider's fail-fast
        client, so a wrong password, a TLS mismatch or an untrusted certificate is raised in
        seconds (PravegaAuthenticationError / PravegaTLSError ...) instead of after the official
        client's minute of retries. The credentials reach the official client through its
        ``pravega_client_auth_*`` environment variables, set only while the StreamManager is being
        built (under a process-wide lock) and restored right after: the official client copies them
        into its configuration then and never reads them again, so no other connection of this
        process sees them.
        """
        import_official_client("PravegaHook.get_conn() (an official pravega_client.StreamManager)")
        config = self.get_config()
        if config.auth_enabled or config.tls_enabled:
            check_credentials(config, self.credential_check_timeout)
        return config.create_stream_manager()

    def get_client(self) -> Any:
        """This provider's own :class:`~airflow_provider_pravega.client.PravegaClient`, the hook's
        main API on every supported Python: admin, event writers (plain and transactional),
        cross-process transactions, stream cuts, batch reads. Close it (or use ``with``) when done."""
        return PravegaClient(self.get_config())

    @classmethod
    def asset_uri(cls, scope: str, stream: str, pravega_conn_id: str = default_conn_name) -> str:
        """``pravega://host:port/scope/stream`` of a stream behind this connection, for an ``Asset``
        (the same host and port as its OpenLineage namespace).

        Meant for DAG files: when the connection is not defined where the DAG is parsed, the
        connection defaults (``localhost:9090``) are used, so the file still parses.
        """
        try:
            conn = cls.get_connection(pravega_conn_id)
        except Exception:  # noqa: BLE001 - AirflowNotFoundException, or no Airflow context at all
            config = PravegaConnectionConfig.from_connection_fields(host=None, port=None)
        else:
            config = cls.config_from_connection(conn)
        return stream_uri(config.host, config.port, scope, stream)

    # -------------------------------------------------------------------------- UI metadata

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Hidden, relabelled and placeholder fields of the connection form (from provider.yaml).

        Airflow 3.3 reads ``ui-field-behaviour`` from provider.yaml directly; this returns the same
        data in the hook-method form for callers that ask the hook.
        """
        behaviour = _connection_type_info().get("ui-field-behaviour", {})
        return {
            "hidden_fields": list(behaviour.get("hidden-fields", [])),
            "relabeling": dict(behaviour.get("relabeling", {})),
            "placeholders": dict(behaviour.get("placeholders", {})),
        }

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """WTForms fields for the connection's extra settings (from provider.yaml ``conn-fields``).

        Airflow 3.3 builds the form from ``conn-fields`` and never calls this while they exist;
        it is kept, derived from the same data, for tools that still ask the hook. Needs wtforms.
        """
        # optional: WTForms (Airflow 3.3 builds the form from conn-fields without it)
        from wtforms import BooleanField, IntegerField, PasswordField, SelectField, StringField

        widgets: dict[str, Any] = {}
        for name, spec in _connection_type_info().get("conn-fields", {}).items():
            schema = spec.get("schema", {})
            types = schema.get("type")
            types = set(types) if isinstance(types, list) else {types}
            kwargs: dict[str, Any] = {"description": spec.get("description", "")}
            if "default" in schema:
                kwargs["default"] = schema["default"]
            if "boolean" in types:
                field_class = BooleanField
            elif "integer" in types:
                field_class = IntegerField
            elif schema.get("format") == "password":
                field_class = PasswordField
            elif "enum" in schema:  # empty first: the hook's own choice when nothing is picked
                field_class = SelectField
                kwargs["choices"] = [("", ""), *((v, v) for v in schema["enum"])]
            else:
                field_class = StringField
            widgets[name] = field_class(spec["label"], **kwargs)
        return widgets

    # ---------------------------------------------------------------------- test connection

    def test_connection(self) -> tuple[bool, str]:
        """Check that the controller answers, within ``test_connection_budget`` seconds.

        First a plain TCP connect (an unreachable controller is reported in seconds, where the
        official client would retry for about a minute), then a real controller call: Pravega's
        ``listScopes`` over gRPC with a deadline. (The official client's ``list_scope()`` is not
        used: it returns an empty list when the server answers with an error, and cannot be
        interrupted.)
        """
        started = time.monotonic()
        try:
            config = self.get_config()
            config.client_environment()  # checks that TLS has a trust store that exists
        except PravegaConfigError as err:
            return False, f"Invalid Pravega connection {self.pravega_conn_id!r}: {err}"

        # A list of controllers: the first that accepts TCP is asked, as the clients would.
        failures: list[str] = []
        for host, port in config.controllers:
            try:
                with socket.create_connection((host, port), timeout=self.tcp_connect_timeout):
                    pass
            except OSError as err:
                reason = "timed out" if isinstance(err, TimeoutError) else (err.strerror or str(err))
                failures.append(f"TCP connect to {host_port(host, port)} failed ({reason})")
                continue
            config = config.with_controller(host, port)
            break
        else:
            return False, f"Cannot reach the Pravega controller at {config.controller_uri}: " + "; ".join(failures)
        uri = config.controller_uri
        if failures:
            uri += f" ({'; '.join(failures)})"

        remaining = self.test_connection_budget - (time.monotonic() - started)
        timeout = min(self.controller_call_timeout, remaining)
        if timeout <= 0.5:
            return False, f"The Pravega controller at {uri} accepted TCP but no time was left to call it"
        try:
            scopes = list_scopes(config, timeout)
        except KeycloakTokenError as err:
            return False, f"No bearer token for the Pravega controller at {uri}: {err}"
        except ControllerProbePermissionError as err:
            return True, f"Connected to Pravega controller at {uri}; the credentials were accepted, but {err}"
        except ControllerProbeTLSError as err:
            if config.tls_enabled and not config.validate_hostname and "CERTIFICATE_VERIFY_FAILED" in str(err):
                # The official client skips certificate checks here; this client cannot (gRPC verifies
                # the chain), so only the TLS handshake can be checked.
                return self._check_tls_without_verification(config, timeout)
            return False, f"{uri} accepted a TCP connection, but the controller call failed: {err}"
        except ControllerProbeError as err:
            return False, f"{uri} accepted a TCP connection, but the controller call failed: {err}"
        noun = "scope" if len(scopes) == 1 else "scopes"
        return True, f"Connected to Pravega controller at {uri}; {len(scopes)} {noun}"

    @staticmethod
    def _check_tls_without_verification(config: PravegaConnectionConfig, timeout: float) -> tuple[bool, str]:
        """With certificate checks off, only a TLS handshake can be checked.

        gRPC (like the controller call above) cannot skip certificate verification, so the
        controller itself is not asked; the message says so.
        """
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        try:
            with socket.create_connection((config.host, config.port), timeout=timeout) as raw:
                with context.wrap_socket(raw, server_hostname=config.host) as tls:
                    version = tls.version()
        except (OSError, ssl.SSLError) as err:
            return False, f"TLS handshake with {config.controller_uri} failed: {err}"
        return True, (
            f"TLS handshake ({version}) with {config.controller_uri} succeeded; the controller was not "
            "asked because certificate checks are off (validate_hostname=false)"
        )


def mask_credentials(config: PravegaConnectionConfig) -> None:
    """Teach this process's secrets masker the Basic header built from the password (with Bearer
    credentials: the keycloak.json as the client keeps it, one line, and its client secret), so
    it never appears in task logs even if some library logs it.

    The password itself is not sent again: Airflow masks it whenever it hands out the connection
    (``mask_secret(conn.password)`` in every ``get_connection``). The derived header goes to the
    local masker only, never through ``mask_secret``: that forwards it to the supervisor, and
    ``airflow dags test`` logs every forwarded value in the clear at DEBUG level.
    """
    if not config.password:
        return
    if config.bearer:
        secrets = [config.password, *_keycloak_secret(config.password)]
    else:
        # The header our client and the official client send: its base64 part decodes to the password.
        secrets = [basic_auth_metadata(config)[0][1].removeprefix("Basic ")]
    try:
        # The masker the task SDK's log pipeline uses (Airflow 3.2 and 3.3; not re-exported by 3.2's
        # airflow.sdk.log).
        from airflow.sdk._shared.secrets_masker import _secrets_masker  # type: ignore[attr-defined]

        for secret in secrets:
            _secrets_masker().add_mask(secret, None)
    except Exception:  # noqa: BLE001 - masking is best effort outside a configured Airflow
        pass


def _keycloak_secret(keycloak_json: str) -> list[str]:
    """The client secret of a keycloak.json (none when it has none: the client then refuses it)."""
    try:
        secret = json.loads(keycloak_json).get("credentials", {}).get("secret")
    except (ValueError, AttributeError):
        return []
    return [secret] if isinstance(secret, str) and secret else []


def check_credentials(config: PravegaConnectionConfig, timeout: float) -> None:
    """Ask the controller once with this provider's fail-fast client (one listScopes, or
    checkScopeExists of the default scope): raises PravegaAuthenticationError, PravegaTLSError or
    ControllerUnreachableError within ``timeout`` seconds. A PERMISSION_DENIED answer means the
    credentials were accepted, which is all this checks."""
    # import cost: the full controller client (10 more modules) only when credentials are checked; DAG files import the hook
    from airflow_provider_pravega.client.controller import ControllerClient
    with ControllerClient(config, timeout_s=timeout, connect_timeout_s=min(3.0, timeout)) as controller:
        try:
            if config.scope:
                controller.scope_exists(config.scope)
            else:
                controller.list_scopes()
        except PravegaPermissionError:
            pass


def _connection_type_info() -> dict[str, Any]:
    """The ``pravega`` entry of provider.yaml's ``connection-types``."""
    for entry in get_provider_info().get("connection-types", []):
        if entry.get("connection-type") == PravegaHook.conn_type:
            return entry
    raise RuntimeError("provider.yaml has no 'pravega' connection type")
