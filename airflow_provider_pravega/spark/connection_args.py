"""Controller and credential options shared by the ingest and export command lines.

Both jobs can run outside Airflow (``spark-submit``, a shell); they take the same connection
settings as the ``pravega`` connection. The password never comes from argv (every user of the
machine can read it there): from an environment variable or from a file. With Bearer credentials
the "password" is the keycloak.json (one line of JSON), found the same way, and every process of
the job obtains and renews its own Keycloak tokens from it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.config import AUTH_METHODS, PravegaConnectionConfig
from airflow_provider_pravega.client.job_results import JobOutcome, JobResults

#: Where the command lines take the password from by default.
PASSWORD_ENV = "PRAVEGA_PASSWORD"


def add_connection_arguments(parser: argparse.ArgumentParser, *, lease: bool = False) -> None:
    """``--controller-uri`` plus the auth/TLS options (and ``--lease-ms`` for jobs that open transactions)."""
    group = parser.add_argument_group("Pravega connection")
    group.add_argument("--controller-uri", required=True, help="tcp://host:port or tls://host:port")
    if lease:
        group.add_argument("--lease-ms", type=int, default=90_000, help="transaction lease (default 90000)")
    group.add_argument("--username", help="Pravega user (Basic authentication); the password comes from --password-env")
    group.add_argument("--auth-method", choices=AUTH_METHODS, default=None,
                       help="Bearer: Keycloak credentials, the keycloak.json as the password (or --keycloak-file)")
    group.add_argument("--keycloak-file", metavar="PATH",
                       help="keycloak.json of a confidential client with a service account (implies Bearer)")
    group.add_argument("--password-env", default=PASSWORD_ENV, metavar="NAME",
                       help=f"environment variable holding the password (default {PASSWORD_ENV}); never pass it in argv")
    group.add_argument("--password-file", metavar="PATH",
                       help="file holding the password (first line); alternative to the environment variable")
    group.add_argument("--trust-store", help="CA certificate (PEM file or directory) for a tls:// controller URI")
    group.add_argument("--no-validate-hostname", action="store_true",
                       help="with TLS, do not match the certificate to the host name (the chain is still verified)")


def add_submission_argument(parser: argparse.ArgumentParser) -> None:
    """``--submission ID``: what an operator passes when it submits the job as a Spark application
    (cluster deploy mode): the outcome is then also recorded in Pravega under that id
    (client/job_results.py), where the task reads it instead of the driver's stdout."""
    parser.add_argument("--submission", help=argparse.SUPPRESS)


def add_spark_arguments(parser: argparse.ArgumentParser) -> None:
    """``--master`` and repeatable ``--conf KEY=VALUE``, as ``spark-submit`` takes them (e.g. the
    ``spark.hadoop.fs.s3a.*`` settings and ``spark.jars.packages`` for an ``s3a://`` source)."""
    group = parser.add_argument_group("Spark")
    group.add_argument("--master", default=None, help="Spark master (default: local mode on every core)")
    group.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                       help="a Spark setting for the job's session (repeatable)")


def spark_settings(args: argparse.Namespace) -> dict[str, str]:
    """The session settings ``--master``/``--conf`` ask for; a ``--conf`` without '=' is an error."""
    settings: dict[str, str] = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--conf {item!r}: expected KEY=VALUE")
        settings[key.strip()] = value
    if args.master:
        settings["spark.master"] = args.master
    return settings


def connection_arguments(config: PravegaConnectionConfig, *, lease: bool = False,
                         password_file: str | None = None) -> list[str]:
    """The options of :func:`add_connection_arguments` that describe ``config`` (the inverse of
    :func:`config_from_arguments`), never its password: with a user, ``--password-file
    password_file`` when the job finds the password in that file, else the job reads it from
    :data:`PASSWORD_ENV`."""
    argv = ["--controller-uri", config.controller_uri]
    if lease:
        argv += ["--lease-ms", str(config.transaction_lease_ms)]
    if config.username:
        argv += ["--username", config.username]
    if config.bearer:
        argv += ["--auth-method", config.auth_method]
        if config.keycloak_file:
            argv += ["--keycloak-file", config.keycloak_file]
    if config.password and password_file and config.auth_enabled:
        argv += ["--password-file", password_file]
    if config.trust_store:
        argv += ["--trust-store", config.trust_store]
    if not config.validate_hostname:
        argv.append("--no-validate-hostname")
    return argv


def config_from_arguments(args: argparse.Namespace) -> PravegaConnectionConfig:
    """The connection config the options describe; bad values raise PravegaConfigError naming the option."""
    extra: dict[str, Any] = {}
    if getattr(args, "lease_ms", None) is not None:
        extra["transaction_lease_ms"] = args.lease_ms
    if args.trust_store:
        extra["trust_store"] = args.trust_store
    if args.no_validate_hostname:
        extra["validate_hostname"] = False
    if getattr(args, "auth_method", None):
        extra["auth_method"] = args.auth_method
    if getattr(args, "keycloak_file", None):
        extra["keycloak_file"] = args.keycloak_file
    return PravegaConnectionConfig.from_connection_fields(
        host=args.controller_uri, login=args.username, password=_password(args), extra=extra,
    )


def _password(args: argparse.Namespace) -> str | None:
    """The password from a file or an environment variable, only when a user is named (or, with
    Bearer credentials and no --keycloak-file, the keycloak.json)."""
    if args.password_file:
        try:
            with open(args.password_file, encoding="utf-8") as f:
                return f.readline().rstrip("\r\n") or None
        except OSError as exc:
            raise ValueError(f"--password-file {args.password_file!r}: cannot read the password: "
                             f"{exc.strerror or exc}") from None
    if args.username or (getattr(args, "auth_method", None) == "Bearer" and not getattr(args, "keycloak_file", None)):
        return os.environ.get(args.password_env) or None
    return None


def run_job_command(name: str, args: argparse.Namespace, job: Callable[[Any], Any],
                    failures: tuple[type[BaseException], ...],
                    state_location: Callable[[], tuple[str, str]] | None = None) -> int:
    """The common end of a job's ``main``: build the client from the options (exit 2 naming a bad
    one), run ``job(client)`` (exit 1 with the message of an expected failure), print the result's
    JSON (exit 0). With ``--submission``, the outcome (a failure of any kind included) is also
    recorded beside the job's state (``state_location()``: its scope and state stream)."""
    try:
        config = config_from_arguments(args)
    except ValueError as exc:
        print(f"{name} failed: {exc}", file=sys.stderr)
        return 2
    submission = getattr(args, "submission", None)
    with PravegaClient(config) as client:
        try:
            result = job(client)
        except Exception as exc:
            if submission and state_location is not None:
                _record_outcome(client, state_location(), submission,
                                ok=False, error=str(exc) or repr(exc), error_type=type(exc).__name__)
            if not isinstance(exc, failures):
                raise
            print(f"{name} failed: {exc}", file=sys.stderr)
            return 1
        if submission and state_location is not None:
            _record_outcome(client, state_location(), submission, ok=True, result=result.to_dict())
    print(json.dumps(result.to_dict()))
    return 0


def _record_outcome(client: Any, location: tuple[str, str], submission: str, **outcome: Any) -> None:
    JobResults(client, *location).record(submission, JobOutcome(**outcome))
