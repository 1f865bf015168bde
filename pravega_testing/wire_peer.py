"""A raw segment-store client for tests: encode commands with our codec, read the replies.

Tests use it to send exactly the frames they want (bad tokens, merges into themselves, no Hello)
where the real clients would refuse or hide them.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

from airflow_provider_pravega.protocol import wire

__all__ = ["WirePeer"]


class WirePeer:
    """One blocking connection to a segment store (plain, or TLS with ``cafile``).

    :param hello: Exchange Hello first (the protocol's opening), as every real client does.
    """

    def __init__(self, host: str, port: int, *, hello: bool = True, cafile: str | None = None,
                 timeout_s: float = 10.0) -> None:
        sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        if cafile is not None:
            sock = ssl.create_default_context(cafile=cafile).wrap_socket(sock, server_hostname=host)
        self.sock = sock
        self.decoder = wire.FrameDecoder("reply")
        self.pending: list[Any] = []
        if hello:
            reply = self.call(wire.Hello(wire.WIRE_VERSION, wire.OLDEST_COMPATIBLE_VERSION))
            if not isinstance(reply, wire.Hello):
                raise ConnectionError(f"the segment store answered Hello with {reply!r}")

    @classmethod
    def to(cls, endpoint: str, **kwargs: Any) -> WirePeer:
        """Connect to ``host:port``."""
        host, port = endpoint.rsplit(":", 1)
        return cls(host, int(port), **kwargs)

    def send(self, cmd: Any) -> None:
        self.sock.sendall(wire.encode(cmd))

    def recv(self) -> Any:
        """The next reply (blocking)."""
        while not self.pending:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("the segment store closed the connection")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def call(self, cmd: Any) -> Any:
        """Send one command and return the next reply."""
        self.send(cmd)
        return self.recv()

    def closed_by_server(self, timeout_s: float = 5.0) -> bool:
        """Whether the server closes the connection within ``timeout_s`` (anything it sends is skipped)."""
        self.sock.settimeout(timeout_s)
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WirePeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
