"""Airflow hook for Pravega: maps a ``pravega`` Connection to a controller configuration.

Like the Kafka provider's hooks it only translates configuration; the Pravega semantics live in
:mod:`airflow_provider_pravega.client`, which works without Airflow.
"""

from __future__ import annotations

import socket
import ssl
import time
from typing import Any

from airflow.sdk import BaseHook

from airflow_provider_pravega.client.config import PravegaConfigError, PravegaConnectionConfig
from airflow_provider_pravega.client.controller_probe import ControllerProbeError, list_scopes

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
            self._config = self.config_from_connection(self.get_connection(self.pravega_conn_id))
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

    def get_conn(self) -> Any:
        """An official ``pravega_client.StreamManager`` for this connection's controller."""
        return self.get_config().create_stream_manager()

    def get_client(self) -> Any:
        """This provider's :class:`~airflow_provider_pravega.client.PravegaClient` (admin,
        cross-process transactions, stream cuts, batch reads); close it when done."""
        from airflow_provider_pravega.client import PravegaClient

        return PravegaClient(self.get_config())

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
        from wtforms import BooleanField, IntegerField, PasswordField, StringField

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

        uri = config.controller_uri
        try:
            with socket.create_connection((config.host, config.port), timeout=self.tcp_connect_timeout):
                pass
        except OSError as err:
            reason = "timed out" if isinstance(err, TimeoutError) else (err.strerror or str(err))
            return False, (
                f"Cannot reach the Pravega controller at {uri}: TCP connect to "
                f"{config.host}:{config.port} failed ({reason})"
            )

        remaining = self.test_connection_budget - (time.monotonic() - started)
        timeout = min(self.controller_call_timeout, remaining)
        if timeout <= 0.5:
            return False, f"The Pravega controller at {uri} accepted TCP but no time was left to call it"
        if config.tls_enabled and not config.validate_hostname:
            return self._check_tls_without_verification(config, timeout)
        try:
            scopes = list_scopes(config, timeout)
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


def _connection_type_info() -> dict[str, Any]:
    """The ``pravega`` entry of provider.yaml's ``connection-types``."""
    from airflow_provider_pravega import get_provider_info

    for entry in get_provider_info().get("connection-types", []):
        if entry.get("connection-type") == PravegaHook.conn_type:
            return entry
    raise RuntimeError("provider.yaml has no 'pravega' connection type")
