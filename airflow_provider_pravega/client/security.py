"""Credentials, delegation tokens and TLS for this provider's own Pravega client.

One place decides:

* what the controller is sent to authenticate (``authorization: Basic base64(user:password)``,
  the header pravega-client-rust's controller client sends with Basic credentials, or
  ``authorization: Bearer <RPT>`` with Keycloak credentials, the token renewed before it expires by
  :mod:`~airflow_provider_pravega.client.keycloak`);
* how long a delegation token is used (its JWT ``exp``, read without verifying the signature:
  the token is opaque to us, only the segment store checks it) and when it is fetched again;
* how TLS is set up for gRPC (the controller) and for plain sockets (the segment store) from a
  :class:`~airflow_provider_pravega.client.config.PravegaConnectionConfig`, and how a TLS mismatch
  is told apart from a dead server, so that it is reported in seconds with a useful message.

What ``validate_hostname=False`` means here: the server certificate must still be signed by a CA of
the trust store (gRPC has no switch to skip that), only the host-name match is dropped (gRPC is
told the name the certificate carries: ``grpc.ssl_target_name_override``). The official client,
given ``disable_cert_verification``, skips certificate checks altogether; this client is stricter.
"""

from __future__ import annotations

import base64
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from airflow_provider_pravega.client import keycloak
from airflow_provider_pravega.client.config import PravegaConfigError, PravegaConnectionConfig
from airflow_provider_pravega.client.errors import PravegaTLSError

__all__ = [
    "CallCredentials",
    "TokenCache",
    "basic_auth_metadata",
    "certificate_name",
    "client_ssl_context",
    "grpc_channel_credentials",
    "read_trust_store",
    "speaks_tls",
    "tls_handshake",
    "token_lifetime",
    "wrap_client_socket",
]

#: Refresh a token when less than this share of its lifetime is left (and at most this many seconds before).
REFRESH_SHARE = 0.2
REFRESH_MAX_S = 30.0


# ---------------------------------------------------------------------------------- credentials


def basic_auth_metadata(config: PravegaConnectionConfig | None) -> tuple[tuple[str, str], ...]:
    """gRPC metadata carrying the connection's Basic credentials (empty without a username)."""
    if config is None or not config.auth_enabled:
        return ()
    raw = f"{config.username}:{config.password or ''}".encode()
    return (("authorization", "Basic " + base64.b64encode(raw).decode("ascii")),)


class CallCredentials:
    """The credentials sent with every controller call: none, Basic (a fixed header) or Bearer
    (a Keycloak RPT, shared by the process's clients and renewed before it expires).

    True when credentials are sent; :meth:`headers` is the gRPC metadata for the next call, and
    raises KeycloakTokenError (naming the realm and client) when Keycloak gives no token.
    """

    def __init__(self, config: PravegaConnectionConfig | None) -> None:
        self._basic = () if config is None or config.bearer else basic_auth_metadata(config)
        self.source: keycloak.KeycloakTokenSource | None = None
        if config is not None and config.bearer:
            text = config.keycloak_json()
            try:
                self.source = keycloak.token_source(text)
            except ValueError as exc:  # a keycloak.json that cannot work: the connection is at fault
                raise PravegaConfigError("password" if config.keycloak_file is None else "keycloak_file",
                                         "<hidden>", str(exc)) from None
        #: Who the controller is told calls, for error messages (a user, or the Keycloak client and realm).
        self.principal: str | None = (self.source.who if self.source is not None
                                      else config.username if config is not None else None)

    def __bool__(self) -> bool:
        return bool(self._basic) or self.source is not None

    def __repr__(self) -> str:
        kind = "Bearer" if self.source is not None else "Basic" if self._basic else "none"
        return f"CallCredentials({kind}, {self.principal!r})"

    def headers(self) -> tuple[tuple[str, str], ...]:
        if self.source is not None:
            return (("authorization", self.source.authorization()),)
        return self._basic


# --------------------------------------------------------------------------------------- tokens


def token_lifetime(token: str) -> tuple[float | None, float | None]:
    """``(exp, iat)`` of a JWT delegation token, unverified (None when absent or not a JWT).

    The signature is not checked on purpose: only the segment store can and does check it; the
    client just needs to know when to fetch a new one.
    """
    if not token or token.count(".") != 2:
        return None, None
    try:
        # optional: PyJWT (the embedded extra); without it a token is opaque
        import jwt

        claims = jwt.decode(token, options={"verify_signature": False, "verify_exp": False})
    except Exception:  # noqa: BLE001 - any undecodable token is simply treated as opaque
        return None, None
    exp = claims.get("exp")
    iat = claims.get("iat")
    exp_f = float(exp) if isinstance(exp, (int, float)) and not isinstance(exp, bool) else None
    iat_f = float(iat) if isinstance(iat, (int, float)) and not isinstance(iat, bool) else None
    return exp_f, iat_f


@dataclass
class _Entry:
    token: str
    refresh_at: float  # time.monotonic() after which the token is fetched again (inf: never)


#: What a delegation token is asked for: "read" (ReadSegment, GetStreamSegmentInfo...) or "write"
#: (SetupAppend, seal, truncate...). Pravega grants a READ token to a read-only user and refuses it a
#: write one, so reads ask for "read" only.
ACCESSES = ("read", "write")


class TokenCache:
    """Delegation tokens per (scope, stream, access), fetched through ``fetch`` and refreshed before
    expiry.

    The expiry is taken from the token's ``exp``; when it also has ``iat``, the lifetime
    ``exp - iat`` is counted from the local moment of fetching, so a clock difference between
    this machine and the controller does not matter. A token without ``exp`` (or not a JWT) is
    kept until the segment store reports it expired (:meth:`renew`).
    """

    def __init__(
        self, fetch: Callable[[str, str, str], str], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._fetch = fetch
        self._clock = clock
        self._entries: dict[tuple[str, str, str], _Entry] = {}
        self._lock = threading.Lock()
        self.fetches = 0

    def get(self, scope: str, stream: str, access: str = "read") -> str:
        key = (scope, stream, _access(access))
        entry = self._entries.get(key)
        if entry is not None and self._clock() < entry.refresh_at:
            return entry.token
        return self._load(key, None)

    def renew(self, scope: str, stream: str, stale: str | None = None, access: str = "read") -> str:
        """A new token after the segment store called ``stale`` expired (one fetch per stale token,
        however many threads saw it fail)."""
        return self._load((scope, stream, _access(access)), stale if stale is not None else "")

    def remember(
        self, scope: str, stream: str, token: str, refresh_at: float = float("inf"),
        access: tuple[str, ...] = ACCESSES,
    ) -> None:
        """Use ``token`` for (scope, stream) and the given accesses until ``refresh_at`` (monotonic
        seconds); for tests and for callers that obtained a token elsewhere."""
        with self._lock:
            for kind in access:
                self._entries[(scope, stream, _access(kind))] = _Entry(token, refresh_at)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def _load(self, key: tuple[str, str, str], stale: str | None) -> str:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                if stale is None and self._clock() < entry.refresh_at:
                    return entry.token  # another thread fetched it meanwhile
                if stale is not None and entry.token != stale and self._clock() < entry.refresh_at:
                    return entry.token  # already renewed by another thread
            fetched_at = self._clock()
            wall = time.time()
            token = self._fetch(*key)
            self.fetches += 1
            self._entries[key] = _Entry(token, _refresh_at(token, fetched_at, wall))
            return token


def _access(access: str) -> str:
    if access not in ACCESSES:
        raise ValueError(f"token access must be one of {ACCESSES}, got {access!r}")
    return access


def _refresh_at(token: str, fetched_at: float, wall: float) -> float:
    exp, iat = token_lifetime(token)
    if exp is None:
        return float("inf")
    lifetime = exp - iat if iat is not None and exp > iat else exp - wall
    if lifetime <= 0:
        return fetched_at  # already expired by our clock: use it once, the server decides
    margin = min(REFRESH_MAX_S, lifetime * REFRESH_SHARE)
    return fetched_at + lifetime - margin


# ------------------------------------------------------------------------------------------ TLS


def read_trust_store(path: str) -> bytes:
    """PEM bytes of a CA file, or of every file of a CA directory (as the official client reads it)."""
    target = Path(path)
    try:
        if target.is_dir():
            return b"".join(p.read_bytes() for p in sorted(target.iterdir()) if p.is_file())
        return target.read_bytes()
    except OSError as exc:
        raise PravegaTLSError(path, f"cannot read the trust store {path}: {exc.strerror or exc}") from None


def grpc_channel_credentials(config: PravegaConnectionConfig | None) -> Any:
    """gRPC TLS credentials trusting the connection's trust store (the system CAs without one)."""
    trust = config.effective_trust_store() if config is not None else None
    return grpc.ssl_channel_credentials(root_certificates=read_trust_store(trust) if trust else None)


def client_ssl_context(config: PravegaConnectionConfig) -> ssl.SSLContext:
    """The TLS context for segment-store sockets (and handshake checks): the connection's trust
    store (or the system CAs), chain always verified, host name checked unless ``validate_hostname``
    is off."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    trust = config.effective_trust_store()
    if config.trust_store:
        try:
            context.load_verify_locations(cadata=read_trust_store(config.trust_store).decode("ascii", "replace"))
        except ssl.SSLError as exc:
            raise PravegaTLSError(
                config.controller_uri, f"the trust store {config.trust_store} holds no usable PEM certificate ({exc})"
            ) from None
    elif trust:
        context.load_verify_locations(cafile=trust)
    else:
        context.load_default_certs()
    context.check_hostname = bool(config.validate_hostname)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def tls_handshake(
    config: PravegaConnectionConfig, host: str, port: int, timeout: float, *, where: str | None = None
) -> dict[str, Any]:
    """Connect and complete a TLS handshake as the connection's settings say; return the peer
    certificate (``getpeercert()``). Raises PravegaTLSError naming the reason when the handshake
    fails (not TLS, untrusted certificate, wrong host name) and OSError when TCP fails."""
    context = client_ssl_context(config)
    with socket.create_connection((host, port), timeout=timeout) as raw:
        with wrap_client_socket(raw, config, context, host, where or f"{host}:{port}", timeout) as tls:
            return tls.getpeercert() or {}


def wrap_client_socket(
    raw: socket.socket,
    config: PravegaConnectionConfig,
    context: ssl.SSLContext,
    host: str,
    label: str,
    timeout: float,
) -> ssl.SSLSocket:
    """TLS over a connected socket (handshake done), or PravegaTLSError saying why not."""
    raw.settimeout(timeout)
    try:
        return context.wrap_socket(raw, server_hostname=host)
    except ssl.SSLCertVerificationError as exc:
        raise PravegaTLSError(label, _verify_reason(config, exc)) from None
    except ssl.SSLError as exc:
        raise PravegaTLSError(
            label,
            f"the TLS handshake failed ({exc.reason or exc}); the server may not speak TLS - check "
            f"whether the connection should be plaintext (tcp://, 'tls' off)",
        ) from None
    except (ConnectionResetError, BrokenPipeError) as exc:
        raise PravegaTLSError(
            label,
            f"the server closed the connection during the TLS handshake ({exc}); it may not speak TLS - "
            f"check whether the connection should be plaintext (tcp://, 'tls' off)",
        ) from None
    except TimeoutError:
        raise PravegaTLSError(
            label,
            f"no TLS handshake within {timeout:g} s; the server may not speak TLS - check whether the "
            f"connection should be plaintext (tcp://, 'tls' off)",
        ) from None


def _verify_reason(config: PravegaConnectionConfig, exc: ssl.SSLCertVerificationError) -> str:
    message = exc.verify_message or exc.reason or str(exc)
    store = config.trust_store or "the system CA bundle"
    if "hostname" in message.lower() or "ip address mismatch" in message.lower():
        return (
            f"CERTIFICATE_VERIFY_FAILED: {message}. The certificate does not name host {config.host!r}; connect "
            f"with a name the certificate carries, or turn validate_hostname off"
        )
    return (
        f"CERTIFICATE_VERIFY_FAILED: {message}. The server's certificate is not signed by a CA in the trust "
        f"store ({store}); set 'trust_store' to the CA certificate that signed it (validate_hostname=false "
        f"does not skip this check in this provider's client)"
    )


def speaks_tls(host: str, port: int, timeout: float = 2.0) -> bool:
    """Whether the server at host:port completes a TLS handshake (certificate not checked): used to
    explain a plaintext connection that a TLS server hangs up on."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            with context.wrap_socket(raw, server_hostname=host):
                return True
    except (OSError, ssl.SSLError):
        return False


def certificate_name(cert: dict[str, Any]) -> str | None:
    """A name the certificate is valid for (first DNS SAN, else first IP SAN, else the CN)."""
    sans = cert.get("subjectAltName") or ()
    for kind, value in sans:
        if kind == "DNS" and "*" not in value:
            return str(value)
    for kind, value in sans:
        if kind == "IP Address":
            return str(value).strip()
    for rdn in cert.get("subject") or ():
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
