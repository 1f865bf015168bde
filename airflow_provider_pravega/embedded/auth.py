"""Authentication and authorization for the embedded server, in Pravega's own terms.

* Accounts come from Pravega's password file (``username:password-hash:acl`` per line), so the same
  file works with a real Pravega cluster. The hash is Pravega's ``StrongPasswordProcessor`` format:
  PBKDF2-HMAC-SHA256, 5000 iterations, 32-byte salt, 64-byte key, written as
  ``hex(ascii("<iterations>:<hex salt>:<hex hash>"))``. Plain-text passwords are never stored.
* An ACL is a ``;``-separated list of ``resource,PERMISSION`` entries; the first entry whose pattern
  (``*`` means "anything") matches the whole resource string decides, as in Pravega's
  ``AclAuthorizerImpl``. Resources: ``prn::/`` (the scopes), ``prn::/scope:S``,
  ``prn::/scope:S/stream:T``, ``prn::/scope:S/reader-group:R``.
* Delegation tokens for the segment store are HS512 JWTs (as Pravega's ``JsonWebToken``) whose
  custom claims map a stream resource to the permission granted.
* Bearer tokens are Keycloak requesting-party tokens (RPTs): signed by a key the realm publishes
  (its JWKS, fetched and cached), issued by the configured realm for the Pravega controller's
  client, unexpired. Their ``authorization.permissions`` become the caller's ACL: each permission's
  resource name (``rsname``) is a resource pattern as in an ACL entry (``prn::/scope:S``,
  ``prn::/scope:S/*``), its Keycloak scopes ``READ`` / ``READ_UPDATE`` the permission (the
  highest one given); the highest grant matching a resource decides.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt

log = logging.getLogger(__name__)

PBKDF2_ITERATIONS = 5000  # what Pravega's StrongPasswordProcessor uses
PBKDF2_SALT_BYTES = 32
PBKDF2_KEY_BYTES = 64
TOKEN_ALGORITHM = "HS512"  # Pravega's JsonWebToken signs with HS512
TOKEN_AUDIENCE = "segmentstore"
DEFAULT_TOKEN_TTL_S = 600  # Pravega's controller.security.auth.delegationToken.ttl.seconds default
#: The audience a Keycloak RPT must have: the Pravega controller's client (pravega-keycloak's default).
KEYCLOAK_AUDIENCE = "pravega-controller"

ROOT_RESOURCE = "prn::/"
_RG_PREFIX = "_RG"
_MARK_PREFIX = "_MARK"
_KVTABLE_SUFFIX = "_kvtable"  # the official Rust client's reader-group state table


class Permission(enum.IntEnum):
    """Pravega's AuthHandler.Permissions, ordered: a higher value includes the lower ones."""

    NONE = 0
    READ = 1
    READ_UPDATE = 2


class AuthFileError(ValueError):
    """The auth file cannot be used (names the line and what is wrong)."""


class AuthenticationFailed(Exception):
    """Missing, malformed or wrong credentials (gRPC UNAUTHENTICATED)."""


class TokenCheckFailed(Exception):
    """A delegation token the segment store must refuse; ``error_code`` is the wire code (0 or 1)."""

    CHECK_FAILED = 0
    EXPIRED = 1

    def __init__(self, message: str, error_code: int = CHECK_FAILED) -> None:
        super().__init__(message)
        self.error_code = error_code


# ---------------------------------------------------------------------------------------- passwords


def hash_password(password: str, *, iterations: int = PBKDF2_ITERATIONS, salt: bytes | None = None) -> str:
    """The password hash Pravega's PasswordCreatorTool writes for ``password``."""
    if not password:
        raise ValueError("an empty password cannot be hashed")
    salt = secrets.token_bytes(PBKDF2_SALT_BYTES) if salt is None else salt
    key = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations, PBKDF2_KEY_BYTES)
    return f"{iterations}:{salt.hex()}:{key.hex()}".encode("ascii").hex()


def _parse_hash(stored: str) -> tuple[int, bytes, bytes]:
    try:
        text = bytes.fromhex(stored).decode("ascii")
        iterations_text, salt_hex, key_hex = text.split(":")
        iterations, salt, key = int(iterations_text), bytes.fromhex(salt_hex), bytes.fromhex(key_hex)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(
            "not a Pravega password hash (expected hex of '<iterations>:<hex salt>:<hex hash>'; "
            "make one with 'pravega-embedded hash-password')"
        ) from exc
    if iterations < 1 or not salt or not key:
        raise ValueError("not a Pravega password hash (iterations, salt or hash missing)")
    return iterations, salt, key


def check_password(password: str, stored: str) -> bool:
    """Whether ``password`` matches a hash made by :func:`hash_password` (or by Pravega)."""
    iterations, salt, key = _parse_hash(stored)
    candidate = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations, len(key))
    return hmac.compare_digest(candidate, key)


# ---------------------------------------------------------------------------------------- resources


def scope_resource(scope: str) -> str:
    return f"prn::/scope:{scope}"


def stream_resource(scope: str, stream: str) -> str:
    return f"{scope_resource(scope)}/stream:{stream}"


def reader_group_resource(scope: str, reader_group: str) -> str:
    return f"{scope_resource(scope)}/reader-group:{reader_group}"


def stream_auth_resource(scope: str, stream: str, *, kvtable_is_reader_group: bool = True) -> str:
    """The resource that guards ``stream``: a reader group's ``_RG<name>`` stream is guarded by the
    reader group, a ``_MARK<name>`` watermark stream by its stream (Pravega's ofInternalStream).

    The official Rust/Python client keeps a reader group's state in a table named
    ``<group>_kvtable`` (and asks for a delegation token for that name as if it were a stream);
    it is guarded by the reader group here too, so a user with READ can use reader groups.
    """
    if stream.startswith(_RG_PREFIX):
        return reader_group_resource(scope, stream[len(_RG_PREFIX):])
    if kvtable_is_reader_group and stream.endswith(_KVTABLE_SUFFIX) and len(stream) > len(_KVTABLE_SUFFIX):
        return reader_group_resource(scope, stream[: -len(_KVTABLE_SUFFIX)])
    if stream.startswith(_MARK_PREFIX):
        return stream_resource(scope, stream[len(_MARK_PREFIX):])
    return stream_resource(scope, stream)


def is_reader_group_or_mark_stream(stream: str) -> bool:
    """Streams a reader may write to with READ permission (Pravega's default
    ``rgWritesWithReadPermissions``): reader-group state and watermark streams."""
    return (stream.startswith((_RG_PREFIX, _MARK_PREFIX))
            or (stream.endswith(_KVTABLE_SUFFIX) and len(stream) > len(_KVTABLE_SUFFIX)))


# ---------------------------------------------------------------------------------------- ACLs


@dataclass(frozen=True)
class AclEntry:
    resource: str
    permission: Permission
    pattern: re.Pattern[str] = field(compare=False, repr=False)

    @classmethod
    def parse(cls, text: str) -> AclEntry:
        parts = text.split(",")
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise ValueError(f"ACL entry {text!r} is not 'resource,PERMISSION'")
        resource, perm_text = parts[0].strip(), parts[1].strip()
        try:
            permission = Permission[perm_text]
        except KeyError:
            raise ValueError(
                f"ACL entry {text!r}: unknown permission {perm_text!r} (use NONE, READ or READ_UPDATE)"
            ) from None
        # Pravega turns each '*' into '.*' and matches the whole resource as a regular expression.
        try:
            pattern = re.compile(re.sub(r"(?<!\.)\*", ".*", resource))
        except re.error as exc:
            raise ValueError(f"ACL entry {text!r}: resource is not a valid pattern ({exc})") from None
        return cls(resource, permission, pattern)

    def matches(self, resource: str) -> bool:
        return self.resource.startswith(resource.split("::")[0]) and self.pattern.fullmatch(resource) is not None


def parse_acl(text: str) -> list[AclEntry]:
    return [AclEntry.parse(part) for part in text.strip().split(";") if part.strip()]


def permission_in(acl: Iterable[AclEntry], resource: str) -> Permission:
    """The first matching entry decides; no match means NONE (Pravega's AclAuthorizerImpl)."""
    for entry in acl:
        if entry.matches(resource):
            return entry.permission
    return Permission.NONE


@dataclass(frozen=True)
class Account:
    username: str
    password_hash: str = field(repr=False)
    acl: tuple[AclEntry, ...]

    def permission(self, resource: str) -> Permission:
        return permission_in(self.acl, resource)


def parse_auth_file(text: str, source: str = "auth file") -> dict[str, Account]:
    """Accounts of a Pravega password file. Unlike Pravega (which stops at the first empty line and
    skips malformed ACL entries silently) every problem is an error naming its line."""
    accounts: dict[str, Account] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split(":", 2)
        if len(fields) < 2 or not fields[0]:
            raise AuthFileError(f"{source} line {number}: expected 'username:password-hash:acl'")
        username, password_hash = fields[0], fields[1]
        try:
            _parse_hash(password_hash)
        except ValueError as exc:
            raise AuthFileError(f"{source} line {number} (user {username!r}): {exc}") from None
        try:
            acl = parse_acl(fields[2] if len(fields) == 3 else "")
        except ValueError as exc:
            raise AuthFileError(f"{source} line {number} (user {username!r}): {exc}") from None
        if username in accounts:
            raise AuthFileError(f"{source} line {number}: user {username!r} appears twice")
        accounts[username] = Account(username, password_hash, tuple(acl))
    if not accounts:
        raise AuthFileError(f"{source} has no accounts")
    return accounts


def load_auth_file(path: str | os.PathLike[str]) -> dict[str, Account]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise AuthFileError(f"cannot read auth file {p}: {exc.strerror or exc}") from None
    return parse_auth_file(text, str(p))


def auth_file_line(username: str, password: str, acl: str) -> str:
    """One line of a password file (tests and tooling; the password is hashed here)."""
    if ":" in username or not username:
        raise ValueError(f"a username must be non-empty and contain no ':' ({username!r})")
    parse_acl(acl)  # refuse a bad ACL now rather than at server start
    return f"{username}:{hash_password(password)}:{acl}"


class KeycloakVerifier:
    """Turns a Keycloak RPT into an :class:`Account`, its ACL taken from the token's permissions.

    The realm's signing keys come from its JWKS endpoint (cached, fetched again for an unknown key
    id, so a realm's key rotation is followed); a verified token is remembered until it expires.
    """

    _CACHE_SIZE = 1024
    SCOPES = {"READ": Permission.READ, "READ_UPDATE": Permission.READ_UPDATE}

    def __init__(self, realm_url: str, audience: str = KEYCLOAK_AUDIENCE, *, ssl_context: Any = None) -> None:
        self.realm_url = realm_url.rstrip("/")
        self.audience = audience
        self._keys = jwt.PyJWKClient(f"{self.realm_url}/protocol/openid-connect/certs", cache_keys=True,
                                     timeout=10, ssl_context=ssl_context)
        self._verified: OrderedDict[str, tuple[float, Account]] = OrderedDict()
        self._lock = threading.Lock()

    def account(self, token: str) -> Account:
        with self._lock:
            hit = self._verified.get(token)
        if hit is not None:
            if time.time() >= hit[0]:
                raise AuthenticationFailed(f"bearer token expired (realm {self.realm_url})")
            return hit[1]
        try:
            key = self._keys.get_signing_key_from_jwt(token)
            claims = jwt.decode(token, key.key, algorithms=["RS256", "RS384", "RS512", "PS256", "ES256", "ES384"],
                                audience=self.audience, issuer=self.realm_url,
                                options={"require": ["exp", "iss", "aud"]})
        except jwt.ExpiredSignatureError:
            raise AuthenticationFailed(f"bearer token expired (realm {self.realm_url})") from None
        except jwt.PyJWKClientConnectionError as exc:
            raise AuthenticationFailed(f"the keys of realm {self.realm_url} cannot be fetched: {exc}") from None
        except (jwt.InvalidTokenError, jwt.PyJWKClientError) as exc:
            raise AuthenticationFailed(f"bearer token rejected: {exc}") from None
        account = Account(_token_principal(claims), "", tuple(self.acl(claims)))
        with self._lock:
            self._verified[token] = (float(claims["exp"]), account)
            while len(self._verified) > self._CACHE_SIZE:
                self._verified.popitem(last=False)
        return account

    @classmethod
    def acl(cls, claims: Mapping[str, Any]) -> list[AclEntry]:
        """ACL entries of an RPT's ``authorization.permissions``, highest permission first (so the
        first match is the highest grant). A permission without a READ or READ_UPDATE scope grants
        nothing; a resource name that is no valid pattern is skipped."""
        authorization = claims.get("authorization")
        permissions = authorization.get("permissions") if isinstance(authorization, Mapping) else None
        entries: list[AclEntry] = []
        for permission in permissions if isinstance(permissions, list) else ():
            if not isinstance(permission, Mapping) or not isinstance(permission.get("rsname"), str):
                continue
            scopes = permission.get("scopes")
            granted = [cls.SCOPES[s] for s in scopes if s in cls.SCOPES] if isinstance(scopes, list) else []
            if not granted:
                continue
            try:
                entries.append(AclEntry.parse(f"{permission['rsname']},{max(granted).name}"))
            except ValueError:
                log.warning("bearer token permission on %r skipped: not a resource pattern", permission["rsname"])
        entries.sort(key=lambda entry: entry.permission, reverse=True)
        return entries


def _token_principal(claims: Mapping[str, Any]) -> str:
    """Who an RPT speaks for: the service account's user name, else the subject."""
    for key in ("preferred_username", "sub", "azp"):
        if isinstance(claims.get(key), str) and claims[key]:
            return str(claims[key])
    return "keycloak-caller"


class Authenticator:
    """Checks ``authorization: Basic base64(user:password)`` against the accounts, and
    ``authorization: Bearer <RPT>`` with the Keycloak verifier when there is one.

    PBKDF2 costs milliseconds by design; a small cache of successful checks (keyed by a digest of the
    header, never the password itself) keeps per-RPC cost low for clients that call often.
    """

    _CACHE_SIZE = 256

    def __init__(self, accounts: Mapping[str, Account], bearer: KeycloakVerifier | None = None) -> None:
        self.accounts = dict(accounts)
        self.bearer = bearer
        self._ok: OrderedDict[bytes, str] = OrderedDict()
        self._lock = threading.Lock()

    def authenticate(self, header: str | None) -> Account:
        if not header:
            raise AuthenticationFailed("no credentials: the 'authorization' metadata is missing")
        parts = header.strip().split(None, 1)
        if len(parts) == 2 and parts[0] == "Bearer" and self.bearer is not None:
            return self.bearer.account(parts[1].strip())
        if len(parts) != 2 or parts[0] != "Basic" or not self.accounts:
            methods = " or ".join(m for m, on in (("'Basic'", self.accounts), ("'Bearer'", self.bearer)) if on)
            raise AuthenticationFailed(f"unsupported authorization method (only {methods} is accepted)")
        digest = hashlib.sha256(header.encode("utf-8", "surrogateescape")).digest()
        with self._lock:
            username = self._ok.get(digest)
            if username is not None:
                self._ok.move_to_end(digest)
                return self.accounts[username]
        try:
            decoded = base64.b64decode(parts[1], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise AuthenticationFailed("malformed Basic credentials") from None
        username, sep, password = decoded.partition(":")
        account = self.accounts.get(username)
        if not sep or account is None or not check_password(password, account.password_hash):
            raise AuthenticationFailed("wrong username or password")
        with self._lock:
            self._ok[digest] = username
            while len(self._ok) > self._CACHE_SIZE:
                self._ok.popitem(last=False)
        return account


# ---------------------------------------------------------------------------------------- tokens


class _ClientSafeJSON(json.JSONEncoder):
    """The official Rust client reads a token's ``exp`` by decoding the body with *standard* base64
    and panics on '-' or '_'. For ASCII JSON those appear only for the bytes '>', '?', '~' and DEL,
    which can appear only inside strings, so escape them there."""

    def encode(self, o: Any) -> str:
        text = super().encode(o)
        for ch in "<>?~\x7f":
            text = text.replace(ch, f"\\u{ord(ch):04x}")
        return text


class TokenAuthority:
    """Issues and checks the delegation tokens the segment store accepts."""

    _CACHE_SIZE = 1024

    def __init__(self, signing_key: bytes, ttl_s: int = DEFAULT_TOKEN_TTL_S) -> None:
        if len(signing_key) < 16:
            raise ValueError("the token signing key must be at least 16 bytes")
        if ttl_s < 1:
            raise ValueError(f"token TTL must be at least 1 s, got {ttl_s}")
        self._key = signing_key
        self.ttl_s = ttl_s
        # Verified tokens -> (exp, claims): a client sends the same token with every request until
        # it refreshes it, and verifying a signature costs far more than a dictionary lookup.
        self._verified: OrderedDict[str, tuple[int, dict[str, Any]]] = OrderedDict()
        self._verified_lock = threading.Lock()

    @classmethod
    def random(cls, ttl_s: int = DEFAULT_TOKEN_TTL_S) -> TokenAuthority:
        return cls(secrets.token_bytes(64), ttl_s)

    @classmethod
    def from_key_file(cls, path: str | os.PathLike[str], ttl_s: int = DEFAULT_TOKEN_TTL_S) -> TokenAuthority:
        try:
            key = Path(path).read_bytes().strip()
        except OSError as exc:
            raise AuthFileError(f"cannot read token signing key file {path}: {exc.strerror or exc}") from None
        if len(key) < 16:
            raise AuthFileError(f"token signing key file {path} holds fewer than 16 bytes")
        return cls(key, ttl_s)

    def issue(self, username: str, resource: str, permission: Permission) -> str:
        now = int(time.time())
        claims: dict[str, Any] = {"sub": username, "aud": TOKEN_AUDIENCE, "iat": now, "exp": now + self.ttl_s,
                                  resource: permission.name}
        return jwt.encode(claims, self._key, algorithm=TOKEN_ALGORITHM, json_encoder=_ClientSafeJSON)

    def check(self, token: str, segment: str, needed: Permission) -> None:
        """Raise :class:`TokenCheckFailed` unless ``token`` grants ``needed`` on ``segment``."""
        if not token:
            raise TokenCheckFailed("no delegation token (the segment store requires one)")
        claims = self._verify(token)
        for key, value in claims.items():
            if not isinstance(value, str) or value not in Permission.__members__:
                continue
            if Permission[value] >= needed and _claim_covers(key, segment):
                return
        raise TokenCheckFailed(f"delegation token does not grant {needed.name} on {segment}")


    def _verify(self, token: str) -> dict[str, Any]:
        with self._verified_lock:
            hit = self._verified.get(token)
        if hit is not None:
            if time.time() >= hit[0]:
                raise TokenCheckFailed("delegation token expired", TokenCheckFailed.EXPIRED)
            return hit[1]
        try:
            claims = jwt.decode(token, self._key, algorithms=[TOKEN_ALGORITHM], audience=TOKEN_AUDIENCE,
                                options={"require": ["exp"]})
        except jwt.ExpiredSignatureError:
            raise TokenCheckFailed("delegation token expired", TokenCheckFailed.EXPIRED) from None
        except jwt.InvalidTokenError as exc:
            raise TokenCheckFailed(f"delegation token rejected: {exc}") from None
        exp = claims.get("exp")
        if isinstance(exp, int):
            with self._verified_lock:
                self._verified[token] = (exp, claims)
                while len(self._verified) > self._CACHE_SIZE:
                    self._verified.popitem(last=False)
        return claims


_CLAIM_PARTS = re.compile(r"prn::|/scope:|stream:")


def _claim_covers(claim_key: str, segment: str) -> bool:
    """Pravega's TokenVerifierImpl.resourceMatchesClaimKey: ``prn::/scope:s/stream:t`` becomes
    ``s/t`` and covers the segments ``s/t/...`` (and ``*`` covers everything)."""
    key = _CLAIM_PARTS.sub("", claim_key)
    if key == "*":
        return True
    if not key or key == "/":
        return False  # never let the root resource stand for every segment
    return segment == key or (key.endswith("/") and segment.startswith(key)) or segment.startswith(key + "/")
