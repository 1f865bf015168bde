"""Server-side TLS for the embedded server: one certificate/key pair for both endpoints.

The controller (grpcio) and the segment store (asyncio) each get their own view of the same PEM
files; both serve TLS only, with TLS 1.2 as the floor. The official client negotiates HTTP/2 by
ALPN on the controller connection, which grpcio handles itself.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc


class TLSConfigError(ValueError):
    """The certificate or key cannot be used (names the file and the problem)."""


@dataclass(frozen=True)
class ServerTLS:
    cert_path: Path
    key_path: Path
    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def load(cls, cert: str | os.PathLike[str], key: str | os.PathLike[str]) -> ServerTLS:
        cert_path, key_path = Path(cert), Path(key)
        try:
            cert_pem = cert_path.read_bytes()
        except OSError as exc:
            raise TLSConfigError(f"cannot read TLS certificate {cert_path}: {exc.strerror or exc}") from None
        try:
            key_pem = key_path.read_bytes()
        except OSError as exc:
            raise TLSConfigError(f"cannot read TLS key {key_path}: {exc.strerror or exc}") from None
        if b"-----BEGIN CERTIFICATE-----" not in cert_pem:
            raise TLSConfigError(f"TLS certificate {cert_path} is not a PEM certificate")
        if b"PRIVATE KEY-----" not in key_pem:
            raise TLSConfigError(f"TLS key {key_path} is not a PEM private key")
        loaded = cls(cert_path, key_path, cert_pem, key_pem)
        loaded.ssl_context()  # a mismatched pair or an encrypted key fails here, before anything listens
        return loaded

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.cert_path, self.key_path, password=lambda: b"")
        except (ssl.SSLError, OSError) as exc:
            raise TLSConfigError(
                f"TLS certificate {self.cert_path} and key {self.key_path} cannot be used together "
                f"(mismatched pair or encrypted key?): {exc}"
            ) from None
        return ctx

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key_pem, self.cert_pem)], require_client_auth=False)
