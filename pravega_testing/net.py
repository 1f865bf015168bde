"""Loopback ports for servers that tests start."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (also: a port that refuses)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def first_controller(uri: str) -> str:
    """``host:port`` of the first controller of a controller URI (``tcp://h1:p1,h2:p2`` names a
    cluster's controllers): for tests that need one address (a raw gRPC channel, a proxy)."""
    from airflow_provider_pravega.client.controller_types import parse_controller_uris

    controllers, _tls = parse_controller_uris(uri)
    return str(controllers[0])
