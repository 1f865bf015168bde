"""Real Pravega 0.13 as a cluster of separate processes, for the tests of issue 32.

Each part is its own JVM, started from the jars the standalone backend already fetches
(``pravega-standalone`` pulls in the controller, the segment store, ZooKeeper and BookKeeper):

- one ZooKeeper (``QuorumPeerMain`` with a config file: client port on 127.0.0.1, no admin server);
- BookKeeper bookies (``org.apache.bookkeeper.server.Main``) after ``BookieShell initnewcluster``:
  the segment stores' durable log, so a segment store can be killed without losing what it
  acknowledged;
- segment stores (``ServiceStarter``) on the BookKeeper log with filesystem long-term storage in
  one shared directory: a container that moves to another store recovers from the log and storage;
- controllers (``io.pravega.controller.server.Main``), started after every segment store has
  registered, so the first container assignment spreads the containers over all stores at once.

Why this order and this storage: a first try with Pravega's ``InProcPravegaCluster`` and in-memory
storage hung, because the in-memory durable log belongs to one store. Containers moved as stores
joined and came up empty on their new owner, with the controller's own tables in them.

Every JVM runs with the loopback bind shim of ``scripts/pravega_standalone.py``, so nothing listens
beyond 127.0.0.1. Each part is in its own process group, and ``stop`` ends them all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from backends.standalone import DEFAULT_VERSION, script

_LOGBACK = """<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>{log}</file>
    <encoder><pattern>%d{{HH:mm:ss.SSS}} %-5level [%thread] %logger{{36}} - %msg%n</pattern></encoder>
  </appender>
  <logger name="io.netty" level="WARN"/>
  <logger name="io.grpc" level="WARN"/>
  <logger name="org.apache.zookeeper" level="WARN"/>
  <logger name="org.apache.curator" level="WARN"/>
  <logger name="org.apache.bookkeeper" level="WARN"/>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
"""


class ClusterError(RuntimeError):
    """A part of the cluster did not start; the message names it and ends with its log."""


@dataclass
class Member:
    """One process of the cluster: ``kind`` is zookeeper, bookie, segmentstore or controller."""

    kind: str
    index: int
    port: int
    log: Path
    process: subprocess.Popen | None = None
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.index}"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group, as a lost host would vanish, and reap it."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)

    def restart(self, timeout_s: float = 240.0) -> None:
        """Start the killed process again, as the same member on the same port (a host back)."""
        if self.alive():
            raise ClusterError(f"{self.name} is still running")
        _start(self, self.command, self.env)
        _wait(self, lambda: script.tcp_accepts(self.port), "listening port", timeout_s)

    def log_tail(self, lines: int = 25, *, path: Path | None = None) -> str:
        """The end of its log (or of ``path``, its captured stdout and stderr)."""
        try:
            return "\n".join((path or self.log).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@dataclass
class RealCluster:
    work: Path
    zookeeper: Member
    bookies: list[Member] = field(default_factory=list)
    segment_stores: list[Member] = field(default_factory=list)
    controllers: list[Member] = field(default_factory=list)

    @property
    def controller_uri(self) -> str:
        """Every controller, as a Pravega client is given them: ``tcp://h1:p1,h2:p2``."""
        return "tcp://" + ",".join(c.endpoint for c in self.controllers)

    def members(self) -> list[Member]:
        return [*self.controllers, *self.segment_stores, *self.bookies, self.zookeeper]

    def store_at(self, port: int) -> Member:
        return next(s for s in self.segment_stores if s.port == port)

    def stop(self) -> None:
        for member in self.members():  # controllers first, ZooKeeper last
            if member.process is None or member.process.poll() is not None:
                continue
            try:
                os.killpg(member.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + 5  # nothing of theirs is kept: a short grace, then SIGKILL
        for member in self.members():
            if member.process is None:
                continue
            try:
                member.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                member.kill()


def _java_command(java: str, classpath: str, member: Member, heap_mb: int) -> list[str]:
    logback = member.log.with_suffix(".logback.xml")
    logback.write_text(_LOGBACK.format(log=member.log))
    tmp = member.log.parent / f"{member.name}-tmp"
    tmp.mkdir(exist_ok=True)
    return [java, f"-Xmx{heap_mb}m", "-Xms32m", "-XX:MaxDirectMemorySize=192m", "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1", "-XX:+ExitOnOutOfMemoryError", "-Xss512k",
            "-Djava.net.preferIPv4Stack=true", f"-Djava.io.tmpdir={tmp}",
            f"-Dlogback.configurationFile={logback}", "-cp", classpath]


def _start(member: Member, command: list[str], env: dict[str, str]) -> None:
    member.command, member.env = command, env
    out = member.log.with_suffix(".out")
    with open(out, "ab") as sink:
        member.process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env,
                                          cwd=member.log.parent, start_new_session=True)


def _wait(member: Member, ready, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not member.alive():
            raise ClusterError(f"{member.name} exited ({member.process.returncode}) before {what}:\n"
                               f"{member.log_tail()}\n{member.log_tail(15, path=member.log.with_suffix('.out'))}")
        if ready():
            return
        time.sleep(0.3)
    raise ClusterError(f"{member.name}: no {what} within {timeout_s:g} s:\n{member.log_tail()}")


def _lists_scopes(port: int) -> bool:
    try:
        return script.controller_list_scopes(port, timeout=3.0) is not None
    except Exception:  # not serving yet (UNAVAILABLE), or its metadata tables are not reachable yet
        return False


@contextmanager
def real_cluster(work: Path, *, controllers: int = 2, segment_stores: int = 3, bookies: int = 3,
                 containers: int = 8, timeout_s: float = 240.0) -> Iterator[RealCluster]:
    """Start the cluster under ``work`` (logs in ``work/logs``) and stop every process on exit."""
    java, _ = script.find_java(17)
    script.fetch(DEFAULT_VERSION)
    classpath = script.classpath(DEFAULT_VERSION)
    env = dict(os.environ)
    shim = script.build_loopback_shim(script.version_dir(DEFAULT_VERSION) / "shim")
    if shim is not None:
        env["LD_PRELOAD"] = str(shim)
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    ports = iter(script.free_ports(1 + bookies + segment_stores + 2 * controllers))

    def member(kind: str, index: int) -> Member:
        return Member(kind, index, next(ports), logs / f"{kind}-{index}.log")

    cluster = RealCluster(work, member("zookeeper", 0))
    zk = cluster.zookeeper.endpoint
    try:
        (work / "zookeeper").mkdir(exist_ok=True)
        zoo_cfg = work / "zoo.cfg"
        zoo_cfg.write_text(f"tickTime=2000\ndataDir={work / 'zookeeper'}\nclientPort={cluster.zookeeper.port}\n"
                           "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n")
        _start(cluster.zookeeper, [*_java_command(java, classpath, cluster.zookeeper, 128),
                                   "-Dzookeeper.admin.enableServer=false",
                                   "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(zoo_cfg)], env)
        _wait(cluster.zookeeper, lambda: script.tcp_accepts(cluster.zookeeper.port), "client port", timeout_s)

        confs = []
        for i in range(bookies):
            bookie = member("bookie", i)
            cluster.bookies.append(bookie)
            data = work / bookie.name
            conf = work / f"{bookie.name}.conf"
            conf.write_text("\n".join([
                f"bookiePort={bookie.port}", "advertisedAddress=127.0.0.1", "allowLoopback=true",
                f"journalDirectories={data / 'journal'}", f"ledgerDirectories={data / 'ledgers'}",
                f"metadataServiceUri=zk://{zk}/ledgers", "httpServerEnabled=false",
                "journalSyncData=false",  # the tests' durability is the process, not the disk
                "diskUsageThreshold=0.999", "diskUsageWarnThreshold=0.998", ""]))
            confs.append(conf)
        shell = Member("bookkeeper-init", 0, 0, logs / "bookkeeper-init.log")
        init = subprocess.run([*_java_command(java, classpath, shell, 128),
                               "org.apache.bookkeeper.bookie.BookieShell", "-conf", str(confs[0]),
                               "initnewcluster"], capture_output=True, text=True, env=env, timeout=timeout_s)
        if init.returncode != 0:
            raise ClusterError(f"BookieShell initnewcluster failed ({init.returncode}):\n"
                               f"{shell.log_tail()}\n{init.stdout[-2000:]}{init.stderr[-2000:]}")
        for bookie, conf in zip(cluster.bookies, confs, strict=True):
            _start(bookie, [*_java_command(java, classpath, bookie, 160),
                            "org.apache.bookkeeper.server.Main", "--conf", str(conf)], env)
        for bookie in cluster.bookies:
            _wait(bookie, lambda b=bookie: script.tcp_accepts(b.port), "bookie port", timeout_s)

        controller_ports = [next(ports) for _ in range(controllers)]
        controller_list = ",".join(f"127.0.0.1:{p}" for p in controller_ports)
        (work / "storage").mkdir(exist_ok=True)
        (work / "segmentstore.properties").write_text("# every setting is a -D of the command line\n")
        for i in range(segment_stores):
            store = member("segmentstore", i)
            cluster.segment_stores.append(store)
            settings = {
                "pravega.configurationFile": work / "segmentstore.properties",
                "pravegaservice.container.count": containers,
                "pravegaservice.zk.connect.uri": zk,
                "pravegaservice.service.listener.port": store.port,
                "pravegaservice.service.listener.host.nameOrIp": "127.0.0.1",
                "pravegaservice.service.published.host.nameOrIp": "127.0.0.1",
                "pravegaservice.dataLog.impl.name": "BOOKKEEPER",
                "bookkeeper.zk.connect.uri": zk,
                "bookkeeper.ledger.path": "/ledgers",
                "bookkeeper.ensemble.size": min(3, bookies),
                "bookkeeper.write.quorum.size": min(3, bookies),
                "bookkeeper.ack.quorum.size": min(2, bookies),
                "pravegaservice.storage.impl.name": "FILESYSTEM",
                "filesystem.root": work / "storage",
                "pravegaservice.rest.listener.enable": "false",
                "pravegaservice.cache.size.max": 64 * 1024 * 1024,
                "pravegaservice.threadPool.core.size": 8,
                "pravegaservice.threadPool.storage.size": 8,
                "autoScale.controller.connect.uri": f"tcp://{controller_list}",
            }
            _start(store, [*_java_command(java, classpath, store, 256),
                           *(f"-D{k}={v}" for k, v in settings.items()),
                           "io.pravega.segmentstore.server.host.ServiceStarter"], env)
        for store in cluster.segment_stores:
            _wait(store, lambda s=store: script.tcp_accepts(s.port), "listening port", timeout_s)

        for i, port in enumerate(controller_ports):
            controller = Member("controller", i, port, logs / f"controller-{i}.log")
            cluster.controllers.append(controller)
            rest_port = next(ports)
            settings = {
                "controller.zk.connect.uri": zk,
                "controller.container.count": containers,
                "controller.service.rpc.listener.port": port,
                "controller.service.rpc.published.host.nameOrIp": "127.0.0.1",
                "controller.service.rpc.published.port": port,
                "controller.service.rest.listener.host.ip": "127.0.0.1",
                "controller.service.rest.listener.port": rest_port,
                "controller.rebalance.interval.seconds.min": 1,
                "controller.service.asyncTaskPool.size": 8,
            }
            _start(controller, [*_java_command(java, classpath, controller, 256),
                                *(f"-D{k}={v}" for k, v in settings.items()),
                                "io.pravega.controller.server.Main"], env)
        for controller in cluster.controllers:
            _wait(controller, lambda c=controller: _lists_scopes(c.port), "answer to listScopes", timeout_s)
        yield cluster
    finally:
        cluster.stop()
