"""Bearer tokens for Pravega clusters protected by Keycloak Authorization Services.

It does what Pravega's Java ``pravega-keycloak-client`` (``KeycloakAuthzClient``) does from a
``keycloak.json`` of a confidential client with a service account:

1. the client-credentials grant at the realm's token endpoint, the client authenticating with
   HTTP Basic (client id and secret, form-encoded as RFC 6749 says);
2. the UMA grant (``urn:ietf:params:oauth:grant-type:uma-ticket``) with that access token, for the
   audience of the Pravega controller's own Keycloak client (``pravega-controller`` unless the
   connection says otherwise): the answer is a requesting-party token (RPT) whose
   ``authorization.permissions`` the controller maps to Pravega permissions;
3. the RPT is sent as ``authorization: Bearer <RPT>`` and kept until shortly before it expires
   (the realm's ``expires_in``), then both grants are made again.

A refusal (wrong secret, unknown client, no permission granted) is never retried: it is raised at
once as :class:`~airflow_provider_pravega.client.errors.KeycloakTokenError` naming the realm and the
client. A Keycloak that cannot be reached or answers 5xx is asked again a few times, as the Java
client does.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote_plus

from airflow_provider_pravega.client.errors import KeycloakTokenError

if TYPE_CHECKING:
    import httpx

__all__ = [
    "DEFAULT_AUDIENCE",
    "KeycloakClientSettings",
    "KeycloakTokenSource",
    "token_source",
]

#: The Pravega controller's client id in Keycloak, the RPT's audience (pravega-keycloak's default).
DEFAULT_AUDIENCE = "pravega-controller"
UMA_TICKET_GRANT = "urn:ietf:params:oauth:grant-type:uma-ticket"
#: Renew when less than this share of a token's lifetime is left, and at most this many seconds before
#: (a keycloak.json ``token-minimum-time-to-live`` below it lowers it, as in the Java client).
RENEW_SHARE = 0.2
RENEW_MAX_S = 60.0
#: Transient failures (no answer, 5xx) are tried this many times in all, the wait doubling from the first.
ATTEMPTS = 4
FIRST_RETRY_WAIT_S = 0.2
HTTP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class KeycloakClientSettings:
    """What a Keycloak OIDC adapter file (``keycloak.json``) says about a confidential client."""

    server_url: str
    realm: str
    client_id: str
    secret: str = field(repr=False)
    #: A keycloak.json ``token-minimum-time-to-live``: renew at least this long before expiry.
    min_time_to_live_s: float | None = None
    #: ``disable-trust-manager``: no certificate check of Keycloak's TLS (adapter setting).
    verify_tls: bool = True
    #: ``truststore`` is a Java key store; a PEM CA file may be given as ``truststore-pem``.
    ca_file: str | None = None

    @classmethod
    def parse(cls, text: str, *, source: str = "keycloak.json") -> KeycloakClientSettings:
        """Read a keycloak.json; ValueError naming the missing or wrong key (never the secret)."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{source} must be a JSON object")
        missing = [key for key in ("realm", "auth-server-url", "resource") if not _text(data.get(key))]
        if missing:
            raise ValueError(f"{source} has no {', '.join(missing)} (a Keycloak OIDC adapter file names "
                             "the realm, the server URL and the client id as 'resource')")
        if data.get("public-client") is True or data.get("bearer-only") is True:
            raise ValueError(f"{source}: client {data['resource']!r} is public or bearer-only; Pravega needs a "
                             "confidential client with a service account")
        credentials = data.get("credentials")
        secret = credentials.get("secret") if isinstance(credentials, dict) else None
        if not _text(secret):
            raise ValueError(f"{source}: client {data['resource']!r} has no credentials.secret")
        ttl = data.get("token-minimum-time-to-live")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl < 0):
            raise ValueError(f"{source}: token-minimum-time-to-live must be a number of seconds")
        return cls(
            server_url=str(data["auth-server-url"]).rstrip("/"),
            realm=str(data["realm"]),
            client_id=str(data["resource"]),
            secret=str(secret),
            min_time_to_live_s=float(ttl) if ttl else None,
            verify_tls=data.get("disable-trust-manager") is not True,
            ca_file=_text(data.get("truststore-pem")),
        )

    @property
    def realm_url(self) -> str:
        """The realm's issuer URL (``iss`` of its tokens; its keys are at ``<realm_url>/protocol/openid-connect/certs``)."""
        return f"{self.server_url}/realms/{self.realm}"

    @property
    def token_endpoint(self) -> str:
        return f"{self.realm_url}/protocol/openid-connect/token"


@dataclass
class _Token:
    value: str
    renew_at: float  # clock() reading after which it is fetched again


class KeycloakTokenSource:
    """RPTs of one Keycloak client for one audience, fetched on demand and renewed before expiry.

    Thread-safe; ``clock`` (monotonic seconds) decides when a token is renewed: a test may replace
    it to move time forward instead of waiting. ``fetches`` counts the RPTs obtained.
    """

    def __init__(
        self,
        settings: KeycloakClientSettings,
        audience: str = DEFAULT_AUDIENCE,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.audience = audience
        self.clock = clock
        self._lock = threading.Lock()
        self._token: _Token | None = None
        self.fetches = 0

    def __repr__(self) -> str:
        s = self.settings
        return f"KeycloakTokenSource(realm={s.realm!r}, client={s.client_id!r}, audience={self.audience!r})"

    @property
    def who(self) -> str:
        """How errors name the caller: the client and its realm."""
        return f"Keycloak client {self.settings.client_id!r} of realm {self.settings.realm!r}"

    def token(self) -> str:
        """A valid RPT (the cached one until it is due for renewal)."""
        with self._lock:
            if self._token is not None and self.clock() < self._token.renew_at:
                return self._token.value
            fetched_at = self.clock()
            value, lifetime = self._fetch()
            self._token = _Token(value, fetched_at + lifetime - self._margin(lifetime))
            self.fetches += 1
            return value

    def invalidate(self, stale: str | None = None) -> None:
        """Forget the cached token (only if it still is ``stale``, when given): the next call fetches one."""
        with self._lock:
            if self._token is not None and (stale is None or self._token.value == stale):
                self._token = None

    def authorization(self) -> str:
        """The ``authorization`` header value: ``Bearer <RPT>``."""
        return "Bearer " + self.token()

    # ------------------------------------------------------------------------------ grants

    def _margin(self, lifetime: float) -> float:
        cap = RENEW_MAX_S
        if self.settings.min_time_to_live_s is not None:
            cap = min(cap, self.settings.min_time_to_live_s)
        return min(cap, lifetime * RENEW_SHARE)

    def _fetch(self) -> tuple[str, float]:
        # Imported here: only bearer credentials need it, and the Spark workers of a connection
        # with a password (a Spark Connect server's, a cluster's) need not have it installed.
        import httpx

        s = self.settings
        with httpx.Client(timeout=HTTP_TIMEOUT_S, verify=_verify(s), trust_env=False) as http:
            access = self._grant(http, "the client-credentials grant", {"grant_type": "client_credentials"},
                                 auth=httpx.BasicAuth(_form(s.client_id), _form(s.secret)))
            rpt = self._grant(http, f"the UMA grant for audience {self.audience!r}",
                              {"grant_type": UMA_TICKET_GRANT, "audience": self.audience},
                              headers={"authorization": "Bearer " + access["access_token"]})
        lifetime = rpt.get("expires_in")
        if isinstance(lifetime, bool) or not isinstance(lifetime, (int, float)) or lifetime <= 0:
            raise KeycloakTokenError(s.realm, s.client_id, "the RPT answer has no positive expires_in")
        return str(rpt["access_token"]), float(lifetime)

    def _grant(self, http: httpx.Client, what: str, form: dict[str, str], **kwargs: Any) -> dict[str, Any]:
        import httpx  # see _fetch

        s = self.settings
        wait = FIRST_RETRY_WAIT_S
        for attempt in range(1, ATTEMPTS + 1):
            try:
                answer = http.post(s.token_endpoint, data=form, **kwargs)
            except httpx.HTTPError as exc:
                reason = f"{what} at {s.token_endpoint} failed: {exc.__class__.__name__}: {exc}"
            else:
                if answer.status_code == 200:
                    body = _json(answer)
                    if isinstance(body, dict) and isinstance(body.get("access_token"), str):
                        return body
                    raise KeycloakTokenError(s.realm, s.client_id, f"{what} answered without an access_token")
                reason = f"{what} was refused: HTTP {answer.status_code}{_oauth_error(answer)}"
                if answer.status_code < 500:  # 400/401/403: credentials or permissions; a retry cannot help
                    raise KeycloakTokenError(s.realm, s.client_id, reason, status=answer.status_code)
            if attempt == ATTEMPTS:
                raise KeycloakTokenError(s.realm, s.client_id, reason)
            time.sleep(wait)  # a back-off between tries of an unreachable Keycloak, not a race
            wait *= 2
        raise AssertionError("unreachable")


# -------------------------------------------------------------------------- one per process

_SOURCES: dict[tuple[str, str], KeycloakTokenSource] = {}
_SOURCES_LOCK = threading.Lock()


def _forget_after_fork() -> None:
    """A forked child (a Spark Python worker) starts without token sources: a lock another thread
    of the parent held at the fork would never be released in the child."""
    global _SOURCES_LOCK
    _SOURCES_LOCK = threading.Lock()
    _SOURCES.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def token_source(keycloak_json: str, audience: str = DEFAULT_AUDIENCE) -> KeycloakTokenSource:
    """The process's token source for this keycloak.json and audience: every controller client of
    the process (and every connection with the same credentials) shares its RPT."""
    key = (hashlib.sha256(keycloak_json.encode("utf-8")).hexdigest(), audience)
    with _SOURCES_LOCK:
        source = _SOURCES.get(key)
        if source is None:
            source = _SOURCES[key] = KeycloakTokenSource(KeycloakClientSettings.parse(keycloak_json), audience)
        return source


# --------------------------------------------------------------------------------- helpers


def _text(value: Any) -> str | None:
    return value.strip() or None if isinstance(value, str) else None


def _form(value: str) -> str:
    """RFC 6749 2.3.1: client id and secret are form-encoded before they go into HTTP Basic."""
    return quote_plus(value)


def _verify(settings: KeycloakClientSettings) -> Any:
    if not settings.verify_tls:
        return False
    return settings.ca_file or True


def _json(answer: httpx.Response) -> Any:
    try:
        return answer.json()
    except ValueError:
        return None


def _oauth_error(answer: httpx.Response) -> str:
    """`` (error: description)`` from an OAuth error answer, or a short piece of its text."""
    body = _json(answer)
    if isinstance(body, dict) and body.get("error"):
        description = body.get("error_description")
        return f" ({body['error']}{': ' + str(description) if description else ''})"
    text = answer.text.strip()
    return f" ({text[:200]})" if text else ""
