"""Pravega controller connection settings, independent of Airflow.

The hook turns an Airflow Connection into a :class:`PravegaConnectionConfig`; the client layer and
Spark tasks receive the same (picklable, immutable) object without importing Airflow.

The official ``pravega`` client reads credentials and the TLS trust store from process-wide
environment variables when a ``StreamManager`` is built, so this module also knows how to build
one from a config without leaking one connection's settings into another.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import ssl
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from airflow_provider_pravega.client.errors import OfficialClientMissingError

DEFAULT_HOST = "localhost"
DEFAULT_CONTROLLER_PORT = 9090
DEFAULT_TRANSACTION_LEASE_MS = 90_000

PLAINTEXT_SCHEME = "tcp"
TLS_SCHEME = "tls"
SCHEMES = (PLAINTEXT_SCHEME, TLS_SCHEME)

#: Keys of ``Connection.extra`` that mean something to us. Airflow's UI stores conn-fields under
#: their plain name; older forms stored them as ``extra__pravega__<name>``; both are read.
EXTRA_FIELDS = ("scope", "tls", "trust_store", "validate_hostname", "transaction_lease_ms", "auth_method",
                "keycloak_file")
_LEGACY_EXTRA_PREFIX = "extra__pravega__"

# Environment variables read by the official client (pravega-client-rust config) at StreamManager build.
ENV_AUTH_PREFIX = "pravega_client_auth_"
ENV_AUTH_METHOD = "pravega_client_auth_method"
ENV_AUTH_USERNAME = "pravega_client_auth_username"
ENV_AUTH_PASSWORD = "pravega_client_auth_password"
ENV_AUTH_KEYCLOAK = "pravega_client_auth_keycloak"
ENV_TLS_CERT_PATH = "pravega_client_tls_cert_path"

#: How the controller is told who calls (Pravega's ``pravega_client_auth_method``): a user and
#: password, or a Keycloak bearer token obtained from a keycloak.json.
BASIC = "Basic"
BEARER = "Bearer"
AUTH_METHODS = (BASIC, BEARER)

_TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
_FALSE_WORDS = frozenset({"false", "0", "no", "off"})
# Pravega accepts user scope and stream names made of letters, digits, '.' and '-'.
_SCOPE_NAME = re.compile(r"[A-Za-z0-9.\-]+")
_HOST_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_HIDDEN = "<hidden>"

# Serializes the environment swap around StreamManager construction (see official_client_env).
_ENV_LOCK = threading.Lock()


class PravegaConfigError(ValueError):
    """A Pravega connection setting cannot work; ``field`` names the setting at fault."""

    def __init__(self, field: str, value: Any, reason: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"Pravega connection field {field!r} has bad value {value!r}: {reason}")


@dataclass(frozen=True)
class PravegaConnectionConfig:
    """Everything needed to reach one Pravega controller.

    Built with :meth:`from_connection_fields` from Airflow-style fields, or directly; either way
    the values are checked in ``__post_init__`` so an instance is always usable.
    """

    host: str = DEFAULT_HOST
    port: int = DEFAULT_CONTROLLER_PORT
    scope: str | None = None
    username: str | None = None
    password: str | None = None
    tls_enabled: bool = False
    trust_store: str | None = None
    validate_hostname: bool = True
    transaction_lease_ms: int = DEFAULT_TRANSACTION_LEASE_MS
    #: Further controllers of the same cluster, tried in order when the one in use cannot be
    #: reached (the host field's ``h1:9090,h2:9090`` list; ``host``/``port`` are its first entry).
    more_controllers: tuple[tuple[str, int], ...] = ()
    #: ``Bearer``: Keycloak credentials. The password then holds the keycloak.json itself (one line of
    #: JSON), so it travels and is hidden wherever a password is; or ``keycloak_file`` names the file.
    auth_method: str = BASIC
    keycloak_file: str | None = None

    def __post_init__(self) -> None:
        _check_host(self.host)
        _check_port(self.port)
        if not isinstance(self.more_controllers, tuple):
            raise PravegaConfigError("host", self.more_controllers, "further controllers must be a tuple")
        for entry in self.more_controllers:
            if not isinstance(entry, tuple) or len(entry) != 2:
                raise PravegaConfigError("host", entry, "each further controller is a (host, port) pair")
            _check_host(entry[0])
            _check_port(entry[1], field="host")
        if self.scope is not None and (
            not isinstance(self.scope, str) or not _SCOPE_NAME.fullmatch(self.scope)
        ):
            raise PravegaConfigError(
                "scope", self.scope, "a scope name is letters, digits, '.' and '-' only"
            )
        if self.username is not None and (not isinstance(self.username, str) or not self.username):
            raise PravegaConfigError("login", self.username, "the username must be a non-empty string")
        if self.password is not None and not isinstance(self.password, str):
            raise PravegaConfigError("password", _HIDDEN, "the password must be a string")
        if self.auth_method not in AUTH_METHODS:
            raise PravegaConfigError("auth_method", self.auth_method, f"use {' or '.join(AUTH_METHODS)}")
        if self.auth_method == BEARER:
            self._check_bearer()
        elif self.keycloak_file is not None:
            raise PravegaConfigError("keycloak_file", self.keycloak_file, "a keycloak.json needs auth_method Bearer")
        elif self.password and not self.username:
            raise PravegaConfigError(
                "login", self.username, "a password is set but no username; set both or neither"
            )
        for name in ("tls_enabled", "validate_hostname"):
            if not isinstance(getattr(self, name), bool):
                raise PravegaConfigError(name, getattr(self, name), "must be true or false")
        if self.trust_store is not None:
            if not isinstance(self.trust_store, str) or not self.trust_store.strip():
                raise PravegaConfigError("trust_store", self.trust_store, "must be a file or directory path")
            if not self.tls_enabled:
                raise PravegaConfigError(
                    "trust_store", self.trust_store, "a trust store is set but TLS is off; turn 'tls' on"
                )
        lease = self.transaction_lease_ms
        if isinstance(lease, bool) or not isinstance(lease, int) or lease <= 0:
            raise PravegaConfigError(
                "transaction_lease_ms", lease, "must be a positive whole number of milliseconds"
            )

    def _check_bearer(self) -> None:
        if self.username is not None:
            raise PravegaConfigError("login", self.username, "Bearer credentials come from a keycloak.json; "
                                     "leave the login empty")
        if self.keycloak_file is not None:
            if not isinstance(self.keycloak_file, str) or not self.keycloak_file.strip():
                raise PravegaConfigError("keycloak_file", self.keycloak_file, "must be a file path")
            if self.password:
                raise PravegaConfigError("password", _HIDDEN, "both a keycloak.json in the password and "
                                         "keycloak_file are set; use one")
            return
        if not self.password:
            raise PravegaConfigError("password", None, "auth_method Bearer needs the keycloak.json: its JSON in "
                                     "the password, or its path in keycloak_file")
        try:
            parsed = json.loads(self.password)
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            raise PravegaConfigError("password", _HIDDEN, "with auth_method Bearer the password holds the "
                                     "keycloak.json, a JSON object")

    # ----------------------------------------------------------------------------------- derived

    @property
    def scheme(self) -> str:
        """``tls`` when TLS is on, else ``tcp`` (the two schemes the official client understands)."""
        return TLS_SCHEME if self.tls_enabled else PLAINTEXT_SCHEME

    @property
    def controllers(self) -> tuple[tuple[str, int], ...]:
        """Every controller address, in the order they are tried."""
        return ((self.host, self.port), *self.more_controllers)

    @property
    def controller_uri(self) -> str:
        """The URI as the official clients take it: ``tcp://localhost:9090``, or for several
        controllers ``tcp://h1:9090,h2:9090`` (one scheme, comma-separated addresses)."""
        return f"{self.scheme}://" + ",".join(host_port(h, p) for h, p in self.controllers)

    def with_controller(self, host: str, port: int) -> PravegaConnectionConfig:
        """The same settings aimed at one controller only (a probe of that one address)."""
        return replace(self, host=host, port=port, more_controllers=())

    @property
    def auth_enabled(self) -> bool:
        """Credentials are sent: Basic when a username is configured, or Bearer."""
        return self.username is not None or self.auth_method == BEARER

    @property
    def bearer(self) -> bool:
        return self.auth_method == BEARER

    def keycloak_json(self) -> str:
        """The keycloak.json text of Bearer credentials (read from ``keycloak_file`` when it is set)."""
        if not self.bearer:
            raise PravegaConfigError("auth_method", self.auth_method, "no keycloak.json without Bearer")
        if self.keycloak_file is None:
            return self.password or ""
        try:
            with open(self.keycloak_file, encoding="utf-8") as f:
                return f.read()
        except OSError as exc:
            raise PravegaConfigError("keycloak_file", self.keycloak_file,
                                     f"cannot read it: {exc.strerror or exc}") from None

    def __repr__(self) -> str:
        password = "'***'" if self.password else repr(self.password)
        return (
            f"PravegaConnectionConfig(controller_uri={self.controller_uri!r}, scope={self.scope!r}, "
            f"username={self.username!r}, password={password}, auth_method={self.auth_method!r}, "
            f"keycloak_file={self.keycloak_file!r}, tls_enabled={self.tls_enabled}, "
            f"trust_store={self.trust_store!r}, validate_hostname={self.validate_hostname}, "
            f"transaction_lease_ms={self.transaction_lease_ms})"
        )

    __str__ = __repr__

    # ------------------------------------------------------------------------- official client

    def effective_trust_store(self) -> str | None:
        """The CA file or directory the official client should trust, or None when TLS is off.

        Without an explicit trust store the system CA bundle is used: the official client panics
        when TLS is on and its certificate path does not exist, so it must always get one.
        """
        if not self.tls_enabled:
            return None
        if self.trust_store:
            return self.trust_store
        paths = ssl.get_default_verify_paths()
        for candidate in (paths.cafile, paths.openssl_cafile, "/etc/ssl/certs/ca-certificates.crt"):
            if candidate and os.path.isfile(candidate):
                return candidate
        return None

    def client_environment(self) -> dict[str, str]:
        """The environment variables through which the official client takes auth and TLS settings."""
        env: dict[str, str] = {}
        if self.bearer:
            # The official client reads a keycloak.json from a file only (create_stream_manager refuses
            # a keycloak.json held in the password).
            env[ENV_AUTH_METHOD] = BEARER
            if self.keycloak_file:
                env[ENV_AUTH_KEYCLOAK] = self.keycloak_file
        elif self.auth_enabled:
            env[ENV_AUTH_METHOD] = BASIC
            env[ENV_AUTH_USERNAME] = self.username or ""
            env[ENV_AUTH_PASSWORD] = self.password or ""
        if self.tls_enabled:
            trust_store = self.effective_trust_store()
            if trust_store is None:
                raise PravegaConfigError(
                    "trust_store",
                    None,
                    "TLS is on but no trust store is set and no system CA bundle was found",
                )
            if not os.path.exists(trust_store):
                raise PravegaConfigError("trust_store", trust_store, "no such file or directory")
            env[ENV_TLS_CERT_PATH] = trust_store
        return env

    def stream_manager_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``pravega_client.StreamManager``.

        The official client has no switch for hostname checks alone: ``validate_hostname=False``
        turns off server certificate verification as a whole.
        """
        return {
            "controller_uri": self.controller_uri,
            "auth_enabled": self.auth_enabled,
            "tls_enabled": self.tls_enabled,
            "disable_cert_verification": self.tls_enabled and not self.validate_hostname,
        }

    def create_stream_manager(self) -> Any:
        """Build an official ``pravega_client.StreamManager`` for this controller.

        Building does not connect; the first call does (and the official client retries an
        unreachable controller for about a minute before it raises).
        """
        pravega_client = import_official_client("PravegaConnectionConfig.create_stream_manager()")
        if self.bearer and not self.keycloak_file:
            raise PravegaConfigError("keycloak_file", None, "the official client reads a keycloak.json from a "
                                     "file only: set keycloak_file (this provider's own client, get_client(), "
                                     "takes it from the password)")
        with official_client_env(self):
            return pravega_client.StreamManager(**self.stream_manager_kwargs())

    # ---------------------------------------------------------------------------- construction

    @classmethod
    def from_connection_fields(
        cls,
        *,
        host: str | None = None,
        port: int | str | None = None,
        login: str | None = None,
        password: str | None = None,
        schema: str | None = None,
        extra: Mapping[str, Any] | str | None = None,
    ) -> PravegaConnectionConfig:
        """Read the fields of an Airflow ``pravega`` connection.

        ``host`` may carry a scheme and port (``tls://ctrl:9090``), or list several controllers of
        one cluster (``tcp://c1:9090,c2:9090``; ``port`` is the default for entries without one); ``schema`` may be ``tcp`` or
        ``tls`` (so the URI ``pravega://ctrl:9090/tls`` turns TLS on); ``extra`` holds ``scope``,
        ``tls``, ``trust_store``, ``validate_hostname``, ``transaction_lease_ms``, ``auth_method``
        and ``keycloak_file``. With ``auth_method`` Bearer (implied by ``keycloak_file``) the
        password is the keycloak.json, kept as one line of JSON.
        """
        extras = _read_extra(extra)
        host_scheme, host_name, host_port, more = _split_hosts(host, port)
        schema_scheme = _read_scheme("schema", schema)
        if host_scheme and schema_scheme and host_scheme != schema_scheme:
            raise PravegaConfigError(
                "schema", schema, f"conflicts with the scheme {host_scheme!r} given in the host"
            )
        scheme = host_scheme or schema_scheme

        port_value = _read_port(port)
        if not more and port_value is not None and host_port is not None and port_value != host_port:
            raise PravegaConfigError(
                "port", port, f"conflicts with the port {host_port} given in the host {host!r}"
            )
        final_port = host_port if more or port_value is None else port_value

        tls_flag = _read_bool("tls", extras.get("tls"))
        if scheme is not None and tls_flag is not None and tls_flag != (scheme == TLS_SCHEME):
            raise PravegaConfigError(
                "tls", extras.get("tls"), f"conflicts with the {scheme!r} scheme of the connection"
            )
        tls_enabled = scheme == TLS_SCHEME if scheme is not None else bool(tls_flag)

        validate_hostname = _read_bool("validate_hostname", extras.get("validate_hostname"))
        keycloak_file = _read_text(extras.get("keycloak_file"))
        auth_method = _read_auth_method(extras.get("auth_method"), keycloak_file)
        if auth_method == BEARER and password not in (None, "") and keycloak_file is None:
            password = _one_line_json(password)
        return cls(
            host=host_name or DEFAULT_HOST,
            port=final_port if final_port is not None else DEFAULT_CONTROLLER_PORT,
            scope=_read_text(extras.get("scope")),
            username=_read_text(login),
            password=password if password not in (None, "") else None,
            tls_enabled=tls_enabled,
            trust_store=_read_text(extras.get("trust_store")),
            validate_hostname=True if validate_hostname is None else validate_hostname,
            transaction_lease_ms=_read_lease(extras.get("transaction_lease_ms")),
            more_controllers=more,
            auth_method=auth_method,
            keycloak_file=keycloak_file,
        )


def import_official_client(what: str) -> Any:
    """The official ``pravega_client`` module, or OfficialClientMissingError saying how to get it."""
    try:
        # optional: the official client (the official-client extra)
        import pravega_client
    except ImportError:
        raise OfficialClientMissingError(what) from None
    return pravega_client


@contextmanager
def official_client_env(config: PravegaConnectionConfig) -> Iterator[None]:
    """Expose ``config``'s auth and TLS settings to the official client, then restore the environment.

    The official client reads them from ``os.environ`` while a ``StreamManager`` is built. Every
    ``pravega_client_auth_*`` / TLS variable is replaced for the duration (so one connection's
    credentials never reach another's client) under a lock, since the environment is process-wide.
    """
    wanted = config.client_environment()
    with _ENV_LOCK:
        saved = {
            key: value
            for key, value in os.environ.items()
            if key.startswith(ENV_AUTH_PREFIX) or key == ENV_TLS_CERT_PATH
        }
        for key in saved:
            del os.environ[key]
        os.environ.update(wanted)
        try:
            yield
        finally:
            for key in wanted:
                os.environ.pop(key, None)
            os.environ.update(saved)


# ------------------------------------------------------------------------------------ parsing


def _read_extra(extra: Mapping[str, Any] | str | None) -> dict[str, Any]:
    if extra is None or extra == "":
        return {}
    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except json.JSONDecodeError as err:
            raise PravegaConfigError("extra", extra, f"is not valid JSON ({err.msg})") from None
    if not isinstance(extra, Mapping):
        raise PravegaConfigError("extra", extra, "must be a JSON object")
    values: dict[str, Any] = {}
    for key, value in extra.items():
        name = key[len(_LEGACY_EXTRA_PREFIX) :] if key.startswith(_LEGACY_EXTRA_PREFIX) else key
        if name not in EXTRA_FIELDS:
            raise PravegaConfigError(
                "extra", key, f"unknown setting; known settings are {', '.join(EXTRA_FIELDS)}"
            )
        if value is None or value == "":
            continue  # an empty form field means "use the default"
        values[name] = value
    return values


def _read_scheme(field: str, value: str | None) -> str | None:
    if value is None or value.strip() == "":
        return None
    scheme = value.strip().lower()
    if scheme not in SCHEMES:
        raise PravegaConfigError(field, value, f"unknown scheme; use {' or '.join(SCHEMES)}")
    return scheme


def host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _split_hosts(
    host: str | None, port: Any
) -> tuple[str | None, str | None, int | None, tuple[tuple[str, int], ...]]:
    """The host field, which may list several controllers (``[scheme://]c1[:p],c2[:p]``): the
    first entry's scheme, name and port, and the further entries as (name, port) pairs."""
    if not isinstance(host, str) or "," not in host:
        return (*_split_host(host), ())
    entries = [entry.strip() for entry in host.split(",")]
    if any(not entry for entry in entries):
        raise PravegaConfigError("host", host, "an empty entry in the controller list")
    default_port = _read_port(port)
    if default_port is None:
        default_port = DEFAULT_CONTROLLER_PORT
    split = [_split_host(entry) for entry in entries]
    schemes = {scheme for scheme, _, _ in split if scheme is not None}
    if len(schemes) > 1:
        raise PravegaConfigError("host", host, "the controllers of one list must share one scheme")
    addresses = [(name, entry_port if entry_port is not None else default_port) for _, name, entry_port in split]
    (first_name, first_port), more = addresses[0], tuple(addresses[1:])
    return (schemes.pop() if schemes else None), first_name, first_port, more


def _split_host(host: str | None) -> tuple[str | None, str | None, int | None]:
    """Split ``[scheme://]name[:port]`` into its parts (each None when absent)."""
    if host is None:
        return None, None, None
    if not isinstance(host, str):
        raise PravegaConfigError("host", host, "must be a host name or address")
    text = host.strip()
    if not text:
        return None, None, None
    if "://" in text:
        scheme = text.split("://", 1)[0].lower()
        if scheme not in SCHEMES:
            raise PravegaConfigError("host", host, f"unknown scheme; use {' or '.join(SCHEMES)}")
        parts = urlsplit(text)
        if parts.username is not None or parts.password is not None:
            raise PravegaConfigError("host", host, "put credentials in login/password, not in the host")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise PravegaConfigError("host", host, "a controller address has no path or query")
        try:
            port = parts.port
        except ValueError:
            raise PravegaConfigError("host", host, "the port in the host is not a number in 1-65535") from None
        name = parts.hostname
        if not name:
            raise PravegaConfigError("host", host, "no host name after the scheme")
        _check_host(name)
        return scheme, name, port
    if text.startswith("["):  # [ipv6] or [ipv6]:port
        close = text.find("]")
        if close < 0:
            raise PravegaConfigError("host", host, "unbalanced '[' in an IPv6 address")
        name, rest = text[1:close], text[close + 1 :]
        port = None
        if rest:
            if not rest.startswith(":"):
                raise PravegaConfigError("host", host, "expected ':port' after the IPv6 address")
            port = _read_port(rest[1:], field="host", shown=host)
        _check_host(name)
        return None, name, port
    if text.count(":") == 1:
        name, port_text = text.split(":")
        port = _read_port(port_text, field="host", shown=host)
        _check_host(name)
        return None, name, port
    _check_host(text)
    return None, text, None


def _check_host(host: Any) -> None:
    if not isinstance(host, str) or not host:
        raise PravegaConfigError("host", host, "must be a non-empty host name or address")
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    if not _HOST_NAME.fullmatch(host):
        raise PravegaConfigError("host", host, "is neither a host name nor an IP address")


def _read_port(value: Any, *, field: str = "port", shown: Any = None) -> int | None:
    shown = value if shown is None else shown
    if value is None or (isinstance(value, str) and value.strip() == ""):
        return None
    if isinstance(value, bool):
        raise PravegaConfigError(field, shown, "the port must be a number in 1-65535")
    if isinstance(value, str):
        if not value.strip().isdigit():
            raise PravegaConfigError(field, shown, "the port must be a number in 1-65535")
        value = int(value.strip())
    if not isinstance(value, int):
        raise PravegaConfigError(field, shown, "the port must be a number in 1-65535")
    _check_port(value, field=field, shown=shown)
    return value


def _check_port(port: Any, *, field: str = "port", shown: Any = None) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise PravegaConfigError(
            field, port if shown is None else shown, "the port must be a number in 1-65535"
        )


def _read_bool(field: str, value: Any) -> bool | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE_WORDS:
        return True
    if isinstance(value, str) and value.strip().lower() in _FALSE_WORDS:
        return False
    raise PravegaConfigError(field, value, "must be true or false")


def _read_text(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        return value  # type is checked (with the field's name) in __post_init__
    value = value.strip()
    return value or None


def _read_auth_method(value: Any, keycloak_file: str | None) -> str:
    if value is None:
        return BEARER if keycloak_file else BASIC
    for method in AUTH_METHODS:
        if isinstance(value, str) and value.strip().lower() == method.lower():
            return method
    raise PravegaConfigError("auth_method", value, f"use {' or '.join(AUTH_METHODS)}")


def _one_line_json(password: Any) -> Any:
    """A keycloak.json as one line (a password file's first line is the password); anything else is
    left for __post_init__ to refuse."""
    if not isinstance(password, str):
        return password
    try:
        return json.dumps(json.loads(password), separators=(",", ":"))
    except json.JSONDecodeError:
        return password


def _read_lease(value: Any) -> int:
    if value is None:
        return DEFAULT_TRANSACTION_LEASE_MS
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value  # anything else is rejected, naming the field, in __post_init__
