"""Exceptions of the client layer: one type per situation a user can act on.

Every message says what went wrong *and* what to do about it, and the attributes carry the names
involved so callers (operators, sensors) can react without parsing text.
"""

from __future__ import annotations

import platform


class PravegaError(Exception):
    """Base of every error raised by ``airflow_provider_pravega.client``."""


class ControllerUnreachableError(PravegaError, ConnectionError):
    """The controller could not be reached (or did not answer) at ``uri``."""

    def __init__(self, uri: str, reason: str) -> None:
        self.uri = uri
        self.reason = reason
        super().__init__(
            f"Pravega controller at {uri} is unreachable: {reason}. Check that the controller is "
            f"running and that the connection's host and port point at it (and that TLS matches)."
        )


class ControllerError(PravegaError):
    """The controller answered with a failure the client cannot attribute to the caller."""


class AuthenticationError(PravegaError, PermissionError):
    """Credentials were refused by the controller or the segment store."""

    def __init__(self, where: str, detail: str = "") -> None:
        self.where = where
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"Pravega {where} refused the credentials{extra}. Check the connection's login and "
            f"password, and that the user may access this scope/stream."
        )


class PravegaAuthenticationError(AuthenticationError):
    """The controller did not accept who we are: wrong password, unknown user, or no credentials.

    Never retried (a retry cannot fix a password). ``user`` is the login sent (None: none was
    sent), ``rpc`` the call that was refused; the password itself is never part of the message.
    """

    def __init__(self, uri: str, user: str | None, rpc: str, detail: str = "") -> None:
        self.uri = uri
        self.user = user
        self.rpc = rpc
        self.detail = detail
        who = f"user {user!r}" if user else "a client without credentials"
        extra = f": {detail}" if detail else ""
        hint = (
            "Check the connection's login and password."
            if user
            else "The controller requires authentication: set login and password on the connection."
        )
        PravegaError.__init__(
            self,
            f"Pravega controller at {uri} refused to authenticate {who} for {rpc}{extra}. {hint}",
        )
        self.where = "controller"


class KeycloakTokenError(AuthenticationError):
    """No bearer token could be had from Keycloak: the realm refused the client (wrong secret,
    unknown or disabled client, no permission granted for the audience), or could not be reached.
    Never retried when refused. ``realm`` and ``client`` name the keycloak.json's realm and client
    id; ``status`` is the HTTP status of a refusal (None when Keycloak did not answer)."""

    def __init__(self, realm: str, client: str, reason: str, *, status: int | None = None) -> None:
        self.where = "Keycloak"
        self.realm = realm
        self.client = client
        self.reason = reason
        self.status = status
        PravegaError.__init__(
            self,
            f"Keycloak realm {realm!r} gave no token to client {client!r}: {reason}. Check the client id "
            f"and secret of the connection's keycloak.json, that the client has a service account, and that "
            f"the realm's authorization policies grant it permissions on the Pravega controller's client.",
        )


class PravegaPermissionError(AuthenticationError):
    """Authenticated, but not allowed to do this on this resource (controller PERMISSION_DENIED, or a
    segment store that refused the delegation token). Never retried."""

    def __init__(
        self, where: str, user: str | None, action: str, resource: str, detail: str = ""
    ) -> None:
        self.where = where
        self.user = user
        self.action = action
        self.resource = resource
        self.detail = detail
        who = f"user {user!r}" if user else "this client"
        extra = f" ({detail})" if detail else ""
        PravegaError.__init__(
            self,
            f"Pravega {where} denied {who} permission to {action} on {resource}{extra}. Grant the user "
            f"the needed permission (READ to read, READ_UPDATE to write or change) on that scope/stream, "
            f"or use a connection whose user has it.",
        )


class DelegationTokenError(PravegaPermissionError):
    """The segment store refused the delegation token the controller issued (signature check failed,
    token for another stream, or still expired after one refresh)."""


class PravegaTLSError(ControllerUnreachableError):
    """The TLS settings of the connection do not match the server: TLS against a plaintext server,
    plaintext against a TLS server, or a certificate that the trust store does not vouch for."""

    def __init__(self, uri: str, reason: str) -> None:
        self.uri = uri
        self.reason = reason
        PravegaError.__init__(self, f"TLS problem with Pravega at {uri}: {reason}")


class ScopeNotFoundError(PravegaError, LookupError):
    def __init__(self, scope: str) -> None:
        self.scope = scope
        super().__init__(
            f"Pravega scope {scope!r} does not exist. Create it first (StreamAdmin.create_scope)."
        )


class ScopeExistsError(PravegaError):
    def __init__(self, scope: str) -> None:
        self.scope = scope
        super().__init__(
            f"Pravega scope {scope!r} already exists. Pass fail_if_exists=False to accept an existing scope."
        )


class ScopeNotEmptyError(PravegaError):
    def __init__(self, scope: str) -> None:
        self.scope = scope
        super().__init__(
            f"Pravega scope {scope!r} still has streams. Seal and delete them before deleting the scope."
        )


class StreamNotFoundError(PravegaError, LookupError):
    def __init__(self, scope: str, stream: str) -> None:
        self.scope = scope
        self.stream = stream
        super().__init__(
            f"Pravega stream {scope}/{stream} does not exist. Create it first (StreamAdmin.create_stream) "
            f"or check the scope and stream names."
        )


class StreamExistsError(PravegaError):
    def __init__(self, scope: str, stream: str) -> None:
        self.scope = scope
        self.stream = stream
        super().__init__(
            f"Pravega stream {scope}/{stream} already exists. Pass fail_if_exists=False to accept an "
            f"existing stream."
        )


class StreamNotSealedError(PravegaError):
    def __init__(self, scope: str, stream: str) -> None:
        self.scope = scope
        self.stream = stream
        super().__init__(
            f"Pravega stream {scope}/{stream} must be sealed before it can be deleted. Seal it first "
            f"(StreamAdmin.seal_stream) or call delete_stream(..., seal=True)."
        )


class StreamSealedError(PravegaError):
    def __init__(self, scope: str, stream: str, action: str) -> None:
        self.scope = scope
        self.stream = stream
        super().__init__(
            f"Cannot {action}: Pravega stream {scope}/{stream} is sealed (read-only)."
        )


class InvalidNameError(PravegaError, ValueError):
    """A scope or stream name that Pravega refuses."""


class InvalidStreamCutError(PravegaError, ValueError):
    """A stream cut that does not describe a valid position of the stream it is used with."""


class TruncatedStreamCutError(PravegaError):
    """A start position lies before the stream's head: that data was truncated away."""

    def __init__(self, scope: str, stream: str, detail: str) -> None:
        self.scope = scope
        self.stream = stream
        super().__init__(
            f"Stream cut of {scope}/{stream} points at truncated data ({detail}). Start from the head "
            f"of the stream or from a later cut."
        )


class ScaleError(PravegaError, ValueError):
    """The controller refused a manual scale (the new ranges must exactly cover the sealed ones)."""


class TransactionError(PravegaError):
    """Base of transaction errors; ``txn_id`` is the 128-bit id as an int."""

    def __init__(self, scope: str, stream: str, txn_id: int, message: str) -> None:
        self.scope = scope
        self.stream = stream
        self.txn_id = txn_id
        super().__init__(message)


class TransactionNotFoundError(TransactionError, LookupError):
    def __init__(self, scope: str, stream: str, txn_id: int) -> None:
        super().__init__(
            scope,
            stream,
            txn_id,
            f"Transaction {txn_id:032x} is unknown to the controller of stream {scope}/{stream}. Check "
            f"the id and the stream; ids of long-finished transactions are eventually forgotten.",
        )


class TransactionAbortedError(TransactionError):
    def __init__(self, scope: str, stream: str, txn_id: int, detail: str = "") -> None:
        extra = f" ({detail})" if detail else ""
        super().__init__(
            scope,
            stream,
            txn_id,
            f"Transaction {txn_id:032x} on {scope}/{stream} is aborted{extra}; its events are discarded. "
            f"Write the data again in a new transaction.",
        )


class TransactionCommittedError(TransactionError):
    def __init__(self, scope: str, stream: str, txn_id: int, action: str) -> None:
        super().__init__(
            scope,
            stream,
            txn_id,
            f"Cannot {action} transaction {txn_id:032x} on {scope}/{stream}: it is already committed.",
        )


class TransactionStateError(TransactionError):
    """The transaction is in a state that does not allow the requested action."""


class TransactionLeaseError(TransactionError, ValueError):
    """The controller refused a lease (too large, or past the maximum execution time)."""


class TransactionTimeoutError(TransactionError, TimeoutError):
    """A transaction did not reach the awaited state in time."""


class SegmentStoreError(PravegaError):
    """A segment-store request failed; ``segment`` and ``endpoint`` say where."""

    def __init__(
        self, message: str, *, segment: str | None = None, endpoint: str | None = None
    ) -> None:
        self.segment = segment
        self.endpoint = endpoint
        super().__init__(message)


class SegmentStoreUnreachableError(SegmentStoreError, ConnectionError):
    """No connection to the segment store could be made (or it kept failing)."""


class SegmentUnavailableError(SegmentStoreUnreachableError):
    """A segment could not be reached within the client's failover bounds: its owner kept refusing
    connections or answering ``WrongHost`` however often the controller was asked again.
    ``endpoints`` lists the segment stores tried, in order; ``attempts`` how many tries failed."""

    def __init__(self, message: str, *, segment: str, endpoints: list[str], attempts: int) -> None:
        self.endpoints = list(endpoints)
        self.attempts = attempts
        super().__init__(message, segment=segment, endpoint=endpoints[-1] if endpoints else None)


class SegmentSealedError(SegmentStoreError):
    """An append hit a sealed segment (a sealed stream, a scaled segment or a finished transaction)."""


class NoSuchSegmentError(SegmentStoreError, LookupError):
    """The segment does not exist (deleted, never created, or a transaction that ended)."""


class SegmentTruncatedError(SegmentStoreError):
    """A read below the segment's start offset; ``start_offset`` is the current head."""

    def __init__(
        self, message: str, *, segment: str, endpoint: str | None, start_offset: int
    ) -> None:
        self.start_offset = start_offset
        super().__init__(message, segment=segment, endpoint=endpoint)


class ConditionalAppendFailedError(SegmentStoreError):
    """A conditional append found the segment at another offset than expected (someone wrote first)."""


class OfficialClientMissingError(PravegaError, ImportError):
    """The official ``pravega`` client (module ``pravega_client``) is not installed."""

    def __init__(self, what: str) -> None:
        self.what = what
        here = f"{platform.python_implementation()} {platform.python_version()}"
        super().__init__(
            f"{what} needs the official Pravega client (PyPI 'pravega' 0.3.8, module pravega_client), which is "
            f"not installed: pip install \"airflow-provider-pravega[official-client]\" (its wheels exist for "
            f"CPython 3.10 and 3.11 only; this is {here}). Or use the provider's own client, "
            f"PravegaHook.get_client() (airflow_provider_pravega.client.PravegaClient), which needs no official client."
        )


__all__ = [
    name
    for name, value in dict(globals()).items()
    if isinstance(value, type) and issubclass(value, Exception)
]
