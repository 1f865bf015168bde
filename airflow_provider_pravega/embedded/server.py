"""The embedded Pravega-compatible server: controller (gRPC) + segment store (wire protocol) over
one durable data directory, in one process.

``EmbeddedPravega`` is what tests, the demo and ``python -m airflow_provider_pravega.embedded``
use; the official ``pravega`` client connects to ``controller_uri`` as it would to a cluster.

Security is optional and off by default (loopback only, with a warning when bound elsewhere
without it): ``auth_file`` (Pravega's password file) makes the controller demand Basic credentials
and the segment store demand the delegation tokens the controller issues (see ``auth``);
``tls_cert``/``tls_key`` make both endpoints TLS-only (see ``tls``).

``segment_stores=N`` (N > 1) makes it a small cluster for failover tests: N segment-store ports in
this one process over the one storage, the segments spread over ``containers`` containers and the
containers over the stores (see ``containers``). ``getURI`` answers the owning store, a store
answers ``WrongHost`` for a segment it does not own, and the test controls ``move_container``,
``stop_store`` and ``restart_store`` change that while clients run.
"""

from __future__ import annotations

import fcntl
import errno
import ipaddress
import logging
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc

from airflow_provider_pravega.embedded import auth, tls
from airflow_provider_pravega.embedded.autoscale import AutoScaler, AutoScalerConfig, RecordingBackend
from airflow_provider_pravega.embedded.containers import ContainerMap
from airflow_provider_pravega.embedded.controller import EmbeddedController
from airflow_provider_pravega.embedded.controller_config import ControllerConfig
from airflow_provider_pravega.embedded.segment_store import SegmentStoreServer
from airflow_provider_pravega.embedded.storage import SegmentStorage
from airflow_provider_pravega.protocol import controller_pb2_grpc

log = logging.getLogger(__name__)


class EmbeddedServerError(RuntimeError):
    """The embedded server could not start (port in use, data directory locked, ...)."""


@dataclass(frozen=True)
class ServerSettings:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 9090
    segment_store_port: int = 12345
    advertise_host: str | None = None  # what getURI hands clients; defaults to host (or loopback)
    lease_cap_ms: int | None = None  # shorten transaction leases (tests)
    max_lease_ms: int = 120_000
    tail_wait_s: float = 5.0
    fsync: bool = True
    checkpoint_bytes: int = 256 * 1024 * 1024
    auth_file: Path | None = None  # Pravega password file; None = no authentication (as before)
    keycloak_realm_url: str | None = None  # accept Keycloak RPTs of this realm (http(s)://host/realms/NAME)
    keycloak_audience: str = auth.KEYCLOAK_AUDIENCE  # the controller's client id the RPTs are for
    token_ttl_s: int = auth.DEFAULT_TOKEN_TTL_S
    token_signing_key_file: Path | None = None  # None = a random key per start
    tls_cert: Path | None = None  # PEM certificate (chain); with tls_key, both endpoints serve TLS only
    tls_key: Path | None = None
    pravega_token_rules: bool = False  # delegation tokens exactly as Pravega 0.13 grants them
    finished_txn_retention_ms: int = 24 * 3600 * 1000  # how long COMMITTED/ABORTED transactions are remembered
    finished_txn_limit: int = 10_000  # ... and how many per stream
    retention_interval_s: float = 1800.0  # how often retention policies are applied (Pravega: 30 min)
    autoscale: AutoScalerConfig = AutoScalerConfig()  # rate window, cooldown, mute (Pravega's defaults)
    segment_stores: int = 1  # > 1: a small cluster; store i listens on segment_store_port + i (0: any port)
    containers: int = 8  # segment containers spread over the stores (only with segment_stores > 1)

    @property
    def auth_enabled(self) -> bool:
        return self.auth_file is not None or self.keycloak_realm_url is not None

    @property
    def tls_enabled(self) -> bool:
        return self.tls_cert is not None


class EmbeddedPravega:
    """Start/stop the whole server; usable as a context manager."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.storage: SegmentStorage | None = None
        self.segment_store: SegmentStoreServer | None = None  # store 0 (the only one without a cluster)
        #: Every segment store by index (None while stopped by ``stop_store``).
        self.segment_stores: list[SegmentStoreServer | None] = []
        #: Containers and their owners; None for a plain one-store server.
        self.containers: ContainerMap | None = None
        self._store_ports: list[int] = []
        self._tokens: auth.TokenAuthority | None = None
        self._ssl = None
        self._on_request = None
        self._on_appended = None
        self._cluster_lock = threading.RLock()
        self.controller: EmbeddedController | None = None
        self.autoscaler: AutoScaler | None = None
        self._grpc: grpc.Server | None = None
        self._lock_fd: int | None = None
        self.controller_port: int | None = None

    @property
    def controller_uri(self) -> str:
        scheme = "tls" if self.settings.tls_enabled else "tcp"
        return f"{scheme}://{self._client_host()}:{self.controller_port}"

    @property
    def segment_store_endpoint(self) -> str:
        assert self._store_ports, "not started"
        return self.segment_store_endpoints[0]  # store 0: the only one without a cluster

    @property
    def segment_store_endpoints(self) -> list[str]:
        """``host:port`` of every segment store, by index (stopped ones included)."""
        return [f"{self._client_host()}:{port}" for port in self._store_ports]

    # ------------------------------------------------------------------ cluster test controls

    def _cluster(self) -> ContainerMap:
        if self.containers is None:
            raise EmbeddedServerError("not a cluster: start the server with segment_stores > 1")
        return self.containers

    def container_of(self, segment: str) -> int:
        """The container of a qualified segment name (a transaction segment: its parent's)."""
        return self._cluster().container_of(segment)

    def store_of(self, segment: str) -> int:
        """The index of the store that owns ``segment``'s container now."""
        return self._cluster().owner(segment)

    def move_container(self, container: int, store: int) -> int:
        """Give ``container`` to ``store`` (returns the previous owner). Requests on its segments to
        the previous owner are answered ``WrongHost`` from now on, appends in flight included;
        ``getURI`` answers the new owner. Data and writer event numbers are shared, so nothing is
        copied or lost. Callable from a hook (on a store's loop thread)."""
        old = self._cluster().move(container, store)
        log.info("container %d moved from segment store %d to %d", container, old, store)
        return old

    def move_segment(self, segment: str, store: int) -> int:
        """``move_container`` of ``segment``'s container; returns the container."""
        container = self.container_of(segment)
        self.move_container(container, store)
        return container

    def store_running(self, store: int) -> bool:
        return self.segment_stores[store] is not None

    def stop_store(self, store: int, *, failover: bool = False) -> list[int]:
        """Stop segment store ``store``: its port closes and its connections drop. Its containers
        stay its own (``getURI`` keeps naming the stopped store, whose port refuses connections:
        the segments are unavailable) until ``move_container`` or ``restart_store``; with
        ``failover`` they are given round-robin to the running stores at once. Returns the
        containers it owned. Not callable from a hook of that store (it waits for its thread)."""
        cluster = self._cluster()
        with self._cluster_lock:
            server = self.segment_stores[store]
            if server is None:
                raise EmbeddedServerError(f"segment store {store} is not running")
            if server._thread is threading.current_thread():
                raise EmbeddedServerError("a store cannot be stopped from its own loop thread (a hook)")
            owned = cluster.containers_of(store)
            if failover:
                alive = [i for i, s in enumerate(self.segment_stores) if s is not None and i != store]
                if not alive:
                    raise EmbeddedServerError(f"no running segment store to take the containers of store {store}")
                for n, container in enumerate(owned):
                    cluster.move(container, alive[n % len(alive)])
            self.segment_stores[store] = None
            if store == 0:
                self.segment_store = None
        server.stop()
        log.info("segment store %d stopped (containers %s%s)", store, owned, ", moved" if failover else "")
        return owned

    def restart_store(self, store: int) -> None:
        """Start a stopped segment store again on its old port; the containers it owns are served again."""
        self._cluster()
        with self._cluster_lock:
            if self.segment_stores[store] is not None:
                raise EmbeddedServerError(f"segment store {store} is running")
            server = self._new_store(store, self._store_ports[store])
            server.start()
            self.segment_stores[store] = server
            if store == 0:
                self.segment_store = server

    def set_hooks(self, on_request=None, on_appended=None) -> None:  # noqa: ANN001 - see SegmentStoreServer
        """Install test hooks on every store, restarted ones included (see ``SegmentStoreServer``:
        ``on_request(store, command)`` and ``on_appended(store, segment, writer_id, event_number)``,
        each may return "drop"); None removes them."""
        self._on_request, self._on_appended = on_request, on_appended
        for server in self.segment_stores:
            if server is not None:
                server.on_request, server.on_appended = on_request, on_appended

    def _new_store(self, index: int, port: int) -> SegmentStoreServer:
        s = self.settings
        assert self.storage is not None
        cluster = self.containers
        owns = None if cluster is None else (lambda name, i=index: cluster.owner(name) == i)
        server = SegmentStoreServer(
            self.storage, s.host, port, tail_wait_s=s.tail_wait_s, tokens=self._tokens, ssl_context=self._ssl,
            stats=self.autoscaler, store_id=index, owns=owns,
        )
        server.on_request, server.on_appended = self._on_request, self._on_appended
        return server

    def _locate(self, segment: str) -> tuple[str, int]:
        assert self.containers is not None
        return self._client_host(), self._store_ports[self.containers.owner(segment)]

    def _client_host(self) -> str:
        s = self.settings
        if s.advertise_host:
            return s.advertise_host
        host = "127.0.0.1" if s.host in ("0.0.0.0", "", "::") else s.host
        if s.tls_enabled and is_loopback(host):
            # The official client (rustls/webpki) can verify a certificate only for a DNS name, never
            # for an IP address: with TLS, hand out 'localhost' (the certificate must name it).
            return "localhost"
        return host

    def _security(self) -> tuple[auth.Authenticator | None, auth.TokenAuthority | None, tls.ServerTLS | None]:
        """Load the auth file, token key and certificates before anything listens (fail early)."""
        s = self.settings
        authenticator = tokens = None
        if s.auth_enabled:
            try:
                bearer = (auth.KeycloakVerifier(s.keycloak_realm_url, s.keycloak_audience)
                          if s.keycloak_realm_url else None)
                accounts = auth.load_auth_file(s.auth_file) if s.auth_file is not None else {}
                authenticator = auth.Authenticator(accounts, bearer)
                tokens = (auth.TokenAuthority.from_key_file(s.token_signing_key_file, s.token_ttl_s)
                          if s.token_signing_key_file else auth.TokenAuthority.random(s.token_ttl_s))
            except (auth.AuthFileError, ValueError) as exc:
                raise EmbeddedServerError(str(exc)) from None
        elif s.token_signing_key_file is not None:
            raise EmbeddedServerError("a token signing key file was given without an auth file or a Keycloak realm")
        server_tls = None
        if (s.tls_cert is None) != (s.tls_key is None):
            raise EmbeddedServerError("TLS needs both a certificate and a key (--tls-cert and --tls-key)")
        if s.tls_cert is not None and s.tls_key is not None:
            try:
                server_tls = tls.ServerTLS.load(s.tls_cert, s.tls_key)
            except tls.TLSConfigError as exc:
                raise EmbeddedServerError(str(exc)) from None
        return authenticator, tokens, server_tls

    def start(self) -> EmbeddedPravega:
        s = self.settings
        authenticator, tokens, server_tls = self._security()
        data_dir = Path(s.data_dir)
        _make_data_dir(data_dir)
        self._lock_data_dir(data_dir)
        try:
            self.storage = SegmentStorage(data_dir / "segments", fsync=s.fsync, checkpoint_bytes=s.checkpoint_bytes)
            self.storage.open()
            # The auto-scaler sits between the segment store (which reports traffic) and the controller
            # (which decides): Pravega's stats recorder, AutoScaleProcessor and request stream, in-process.
            self.autoscaler = AutoScaler(s.autoscale, self._autoscale_policy)
            self._tokens = tokens
            self._ssl = server_tls.ssl_context() if server_tls else None
            if s.segment_stores < 1:
                raise EmbeddedServerError(f"segment_stores must be at least 1, got {s.segment_stores}")
            if s.segment_stores > 1:
                if s.containers < 1:
                    raise EmbeddedServerError(f"containers must be at least 1, got {s.containers}")
                self.containers = ContainerMap(s.containers, s.segment_stores)
            for index in range(s.segment_stores):
                port = s.segment_store_port + index if s.segment_store_port else 0
                server = self._new_store(index, port)
                try:
                    server.start()
                except OSError as exc:
                    raise EmbeddedServerError(
                        f"cannot listen for segment store {index} on {s.host}:{port}: {exc.strerror or exc}"
                    ) from exc
                self.segment_stores.append(server)
                self._store_ports.append(server.port)
            self.segment_store = self.segment_stores[0]
            config = ControllerConfig(max_lease_ms=s.max_lease_ms, lease_cap_ms=s.lease_cap_ms,
                                      pravega_token_rules=s.pravega_token_rules,
                                      finished_txn_retention_ms=s.finished_txn_retention_ms,
                                      finished_txn_limit=s.finished_txn_limit,
                                      retention_interval_s=s.retention_interval_s,
                                      cold_marker_ms=int(s.autoscale.mute_s * 1000))
            self.controller = EmbeddedController(
                RecordingBackend(self.storage, self.autoscaler), self._client_host(), self._store_ports[0], data_dir, config,
                authenticator=authenticator, tokens=tokens, locate=self._locate if self.containers is not None else None,
            )
            self.controller.recover()
            # gRPC sets SO_REUSEPORT by default: a second server on the same port would then start and
            # the kernel would split the clients between the two. Refuse a taken port instead, with one
            # line of our own before gRPC tries (it would log its own error lines to stderr).
            _check_port_free(s.host, s.port, "the controller")
            self._grpc = grpc.server(ThreadPoolExecutor(max_workers=16, thread_name_prefix="pravega-ctl"),
                                     options=[("grpc.so_reuseport", 0)])
            controller_pb2_grpc.add_ControllerServiceServicer_to_server(self.controller, self._grpc)
            try:
                address = f"{s.host}:{s.port}"
                if server_tls is not None:
                    self.controller_port = self._grpc.add_secure_port(address, server_tls.grpc_credentials())
                else:
                    self.controller_port = self._grpc.add_insecure_port(address)
            except RuntimeError as exc:
                raise EmbeddedServerError(f"cannot listen for the controller on {s.host}:{s.port}: "
                                          f"{str(exc).split(';')[0]}") from None
            if not self.controller_port:
                raise EmbeddedServerError(f"cannot listen for the controller on {s.host}:{s.port} (port in use?)")
            self.controller.advertise_controller(self._client_host(), self.controller_port)
            self._grpc.start()
            self.controller.start()
            self.autoscaler.set_handler(self.controller.handle_autoscale)
            self.autoscaler.start()
        except OSError as exc:  # the data directory's contents: a file where a directory belongs, no space, ...
            self.stop()
            where = f" {exc.filename}" if exc.filename else ""
            problem = "a file is in the way of a directory" if exc.errno == errno.EEXIST else exc.strerror or exc
            raise EmbeddedServerError(f"cannot use data directory {data_dir}:{where}: {problem}") from None
        except BaseException:
            self.stop()
            raise
        if not is_loopback(s.host) and not s.auth_enabled:
            log.warning(insecure_bind_warning(s.host))
        if s.tls_enabled and _is_ip(self._client_host()):
            log.warning("TLS is on but clients are told to reach %s, an IP address: the official Pravega client "
                        "cannot verify a certificate for an IP address; give --advertise-host with a DNS name",
                        self._client_host())
        return self

    def _autoscale_policy(self, scope: str, stream: str) -> tuple[int, int] | None:
        controller = self.controller
        return controller.autoscale_policy(scope, stream) if controller is not None else None

    def stop(self) -> None:
        if self.autoscaler is not None:
            self.autoscaler.stop()
            self.autoscaler = None
        if self._grpc is not None:
            self._grpc.stop(grace=1).wait()
            self._grpc = None
        if self.controller is not None:
            self.controller.stop()
            self.controller = None
        for server in self.segment_stores:
            if server is not None:
                server.stop()
        self.segment_stores = []
        self.segment_store = None
        if self.storage is not None:
            self.storage.close()
            self.storage = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _lock_data_dir(self, data_dir: Path) -> None:
        lock = data_dir / "LOCK"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            problem = ("is not writable" if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
                       else "cannot be used")
            raise EmbeddedServerError(f"data directory {data_dir} {problem}: cannot create {lock}: "
                                      f"{exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise EmbeddedServerError(f"data directory {data_dir} is in use by another embedded server") from None
        self._lock_fd = fd

    def __enter__(self) -> EmbeddedPravega:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _make_data_dir(data_dir: Path) -> None:
    """Create the data directory (and its parents); raise ``EmbeddedServerError`` naming the problem."""
    if data_dir.exists() and not data_dir.is_dir():
        raise EmbeddedServerError(f"data directory {data_dir} is not a directory (a file is in the way)")
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(data_dir) else ""
        raise EmbeddedServerError(f"cannot create data directory {data_dir}: {exc.strerror or exc}{where}") from None


def _check_port_free(host: str, port: int, what: str) -> None:
    """Raise ``EmbeddedServerError`` when something already listens on ``host:port`` (0 = any port).

    Binds a plain socket to each address ``host`` resolves to, with SO_REUSEADDR (so connections of a
    previous run in TIME_WAIT do not count) but without SO_REUSEPORT (so any listener does)."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise EmbeddedServerError(f"cannot listen for {what} on {host}:{port}: {exc.strerror}") from None
    for family, kind, proto, _name, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise EmbeddedServerError(
                        f"cannot listen for {what} on {host}:{port}: the port is already in use "
                        "(another embedded server or another program)") from None
                if exc.errno == errno.EADDRNOTAVAIL and family == socket.AF_INET6:
                    continue  # no IPv6 on this machine; gRPC skips such an address as well
                raise EmbeddedServerError(f"cannot listen for {what} on {host}:{port}: {exc.strerror or exc}") from None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def insecure_bind_warning(host: str) -> str:
    return (f"the embedded Pravega server listens on {host or 'all interfaces'} WITHOUT authentication: anyone who "
            "can reach it can read, write and delete every stream (give --auth-file, and --tls-cert/--tls-key)")
