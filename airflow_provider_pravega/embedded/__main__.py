"""``python -m airflow_provider_pravega.embedded`` / ``pravega-embedded``: run the embedded server.

``pravega-embedded hash-password`` prints a password hash for the auth file (Pravega's format); the
password is read from stdin or a prompt, never from the command line (where ``ps`` would show it).
"""

from __future__ import annotations

import argparse
import getpass
import logging
import signal
import sys
import threading
from pathlib import Path

from airflow_provider_pravega.embedded import auth
from airflow_provider_pravega.embedded.autoscale import AutoScalerConfig
from airflow_provider_pravega.embedded.server import (
    EmbeddedPravega,
    EmbeddedServerError,
    ServerSettings,
    insecure_bind_warning,
    is_loopback,
)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range 0-65535: {value}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds: {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pravega-embedded",
        description="Run a Pravega-compatible server (controller + segment store) on a durable data directory.",
    )
    p.add_argument("--data-dir", required=True, type=Path, help="where segments and metadata are kept")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=9090, help="controller gRPC port (default 9090; 0 = any free port)")
    p.add_argument("--segment-store-port", type=_port, default=12345,
                   help="segment store port (default 12345; 0 = any free port)")
    p.add_argument("--segment-stores", type=_positive_int, default=1,
                   help="run N segment stores in this process, a small cluster for failover tests (default 1); "
                        "store i listens on --segment-store-port + i (all on any free port with 0)")
    p.add_argument("--containers", type=_positive_int, default=8,
                   help="segment containers spread over the segment stores (default 8; with --segment-stores > 1)")
    p.add_argument("--advertise-host", default=None,
                   help="address clients are told to reach the segment store at (default: the bind address)")
    p.add_argument("--txn-lease-cap-ms", type=int, default=None,
                   help="shorten every transaction lease to at most this many ms (for tests)")
    p.add_argument("--finished-txn-retention-ms", type=int, default=None,
                   help="how long the controller remembers a committed/aborted transaction (default one day)")
    p.add_argument("--finished-txn-limit", type=int, default=None,
                   help="how many committed/aborted transactions per stream it remembers (default 10000)")
    p.add_argument("--retention-interval-s", type=_positive_seconds, default=1800.0,
                   help="how often the retention policies of streams are applied, and how far apart the stream "
                        "cuts recorded for them are (default 1800 s, Pravega's retention.frequency.minutes)")
    p.add_argument("--autoscale-window-s", type=_positive_seconds, default=120.0,
                   help="auto-scaling: the shortest rate window (Pravega's two minutes; the others are 2.5, 5 and "
                        "10 times it), also how often a segment's rates are judged (default 120 s)")
    p.add_argument("--autoscale-cooldown-s", type=_positive_seconds, default=600.0,
                   help="auto-scaling: no scaling of a segment younger than this (default 600 s, as Pravega)")
    p.add_argument("--autoscale-mute-s", type=_positive_seconds, default=600.0,
                   help="auto-scaling: no repeated request for one segment within this (default 600 s, as Pravega)")
    p.add_argument("--tail-wait", type=float, default=5.0, help="seconds a read at the tail waits for data")
    p.add_argument("--no-fsync", action="store_true", help="acknowledge before data reaches the disk (unsafe)")
    p.add_argument("--auth-file", type=Path, default=None,
                   help="Pravega password file (username:password-hash:acl per line); every controller call "
                        "then needs Basic credentials and every segment-store request a delegation token")
    p.add_argument("--keycloak-realm-url", default=None, metavar="URL",
                   help="also accept Keycloak bearer tokens (RPTs) of this realm (http(s)://host:port/realms/NAME), "
                        "verified with its published keys; their permissions are the caller's ACL")
    p.add_argument("--keycloak-audience", default=auth.KEYCLOAK_AUDIENCE,
                   help=f"the client id the RPTs are issued for (default {auth.KEYCLOAK_AUDIENCE})")
    p.add_argument("--token-ttl-s", type=int, default=auth.DEFAULT_TOKEN_TTL_S,
                   help=f"lifetime of delegation tokens in seconds (default {auth.DEFAULT_TOKEN_TTL_S})")
    p.add_argument("--token-signing-key-file", type=Path, default=None,
                   help="file holding the token signing key (default: a random key per start)")
    p.add_argument("--pravega-token-rules", action="store_true",
                   help="grant delegation tokens exactly as Pravega 0.13 (the official client then needs "
                        "READ_UPDATE for any token: read-only users cannot read); default: the caller's permission")
    p.add_argument("--tls-cert", type=Path, default=None, help="PEM certificate: serve TLS only on both ports")
    p.add_argument("--tls-key", type=Path, default=None, help="PEM private key of --tls-cert")
    p.add_argument("--log-level", default="WARNING")
    return p


def hash_password_main(argv: list[str]) -> int:
    """Print the hash of a password read from stdin (piped) or a prompt (terminal, asked twice)."""
    p = argparse.ArgumentParser(
        prog="pravega-embedded hash-password",
        description="Print a Pravega password-file hash of a password read from stdin or a prompt.",
    )
    p.parse_args(argv)
    if sys.stdin.isatty():
        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            print("pravega-embedded: the passwords differ", file=sys.stderr)
            return 2
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        print("pravega-embedded: empty password", file=sys.stderr)
        return 2
    print(auth.hash_password(password))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["hash-password"]:
        return hash_password_main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = ServerSettings(
        data_dir=args.data_dir, host=args.host, port=args.port, segment_store_port=args.segment_store_port,
        segment_stores=args.segment_stores, containers=args.containers,
        advertise_host=args.advertise_host, lease_cap_ms=args.txn_lease_cap_ms, tail_wait_s=args.tail_wait,
        fsync=not args.no_fsync, auth_file=args.auth_file, token_ttl_s=args.token_ttl_s,
        keycloak_realm_url=args.keycloak_realm_url, keycloak_audience=args.keycloak_audience,
        token_signing_key_file=args.token_signing_key_file, tls_cert=args.tls_cert, tls_key=args.tls_key,
        pravega_token_rules=args.pravega_token_rules, retention_interval_s=args.retention_interval_s,
        autoscale=AutoScalerConfig(window_s=args.autoscale_window_s, cooldown_s=args.autoscale_cooldown_s,
                                   mute_s=args.autoscale_mute_s),
        **({"finished_txn_retention_ms": args.finished_txn_retention_ms}
           if args.finished_txn_retention_ms is not None else {}),
        **({"finished_txn_limit": args.finished_txn_limit} if args.finished_txn_limit is not None else {}),
    )
    if not is_loopback(args.host) and not settings.auth_enabled:
        print(f"pravega-embedded: WARNING: {insecure_bind_warning(args.host)}", file=sys.stderr, flush=True)
    server = EmbeddedPravega(settings)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        server.start()
    except EmbeddedServerError as exc:
        print(f"pravega-embedded: {exc}", file=sys.stderr)
        return 2
    print(
        f"Pravega embedded server ready: controller {server.controller_uri} "
        f"segment-store {','.join(server.segment_store_endpoints)} data-dir {args.data_dir} "
        f"auth {'on' if settings.auth_enabled else 'off'} tls {'on' if settings.tls_enabled else 'off'}",
        flush=True,
    )
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
    try:
        print("Pravega embedded server stopped", flush=True)
    except BrokenPipeError:  # whoever started us stopped reading; stopping cleanly is what counts
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
