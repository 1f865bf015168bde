#!/usr/bin/env python3
"""Real Pravega standalone (from Maven Central) as a local test backend.

Why this exists: the embedded Pravega-compatible server is only as good as its fidelity, so the test
suite also runs against the real thing. This script resolves ``io.pravega:pravega-standalone`` and
its runtime dependencies with Maven into a cache directory outside the repository, starts Pravega's
single-node emulator (controller, segment store and ZooKeeper in one JVM; durable log in memory,
segment data on files in the work dir) on free loopback ports with bounded memory, waits until it
really answers, prints the controller URI, and stops it cleanly.

Commands::

    pravega_standalone.py fetch   [--version V]                 resolve jars into the cache
    pravega_standalone.py start   [--work-dir D] [--controller-port P] ...   start in the background
    pravega_standalone.py status  [--work-dir D]                 is it running, ports, RSS
    pravega_standalone.py stop    [--work-dir D]                 SIGTERM, wait, SIGKILL if needed
    pravega_standalone.py run     [--work-dir D] ...             foreground; Ctrl-C stops it

Environment: ``PRAVEGA_STANDALONE_CACHE`` (cache root, default
``~/.cache/airflow-provider-pravega/pravega-standalone``; jars go to ``<root>/<version>/lib``),
``PRAVEGA_STANDALONE_JAVA`` (java executable), ``PRAVEGA_STANDALONE_MVN`` (mvn executable).

Standard library only, so it runs before any virtualenv exists. When ``grpc`` is importable the
readiness check also makes a real controller RPC (listScopes); otherwise it relies on TCP and the
segment store's Hello.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

# 0.13.0 is the newest pravega-standalone on Maven Central (maven-metadata.xml lists 0.3.0 .. 0.13.0)
# and it runs on Java 17.
DEFAULT_VERSION = "0.13.0"
GROUP_ID = "io.pravega"
ARTIFACT_ID = "pravega-standalone"
MAIN_CLASS = "io.pravega.local.LocalPravegaEmulator"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"
# Two SLF4J bindings arrive transitively (logback-classic and, via Hadoop, slf4j-reload4j); keep
# logback so our generated logback.xml decides what is logged.
EXCLUDED_ARTIFACTS = (
    ("org.slf4j", "slf4j-reload4j"),
    ("org.slf4j", "slf4j-log4j12"),
    ("org.slf4j", "slf4j-simple"),
    # Pravega's build.gradle drops these from every configuration, and the standalone's runtime.
    ("io.netty", "netty-all"),
    ("io.netty", "netty"),
    ("com.sun.jersey", "jersey-core"),
    ("com.sun.jersey", "jersey-server"),
)

# Versions that Pravega's own Gradle build forces (resolutionStrategy.force in build.gradle, values
# from gradle.properties of that release). The published poms do not carry them, so without these
# Maven assembles a classpath Pravega was never tested with: e.g. Hadoop's protobuf-java 2.5.0 (the
# controller dies with NoClassDefFoundError GeneratedMessageV3) or bcprov 1.60 beside bcprov-ext
# 1.70 (the segment store's token check dies with NoSuchFieldError in BouncyCastle).
_NETTY = ("netty-common", "netty-transport", "netty-handler", "netty-codec", "netty-codec-dns",
          "netty-codec-http", "netty-codec-http2", "netty-codec-socks", "netty-handler-proxy",
          "netty-resolver-dns", "netty-transport-native-epoll")
PRAVEGA_FORCED_VERSIONS: dict[str, dict[tuple[str, str], str]] = {
    "0.13.0": {
        ("com.google.guava", "guava"): "30.1-jre",
        ("com.google.protobuf", "protobuf-java"): "3.21.7",
        ("com.google.protobuf", "protobuf-java-util"): "3.21.7",
        ("io.grpc", "grpc-context"): "1.47.0",
        ("commons-beanutils", "commons-beanutils"): "1.9.4",
        ("org.apache.commons", "commons-compress"): "1.21",
        ("org.apache.commons", "commons-lang3"): "3.7",
        ("org.apache.curator", "curator-framework"): "5.2.0",
        ("org.glassfish.jersey.core", "jersey-common"): "2.35",
        ("org.glassfish.jersey.core", "jersey-server"): "2.35",
        ("com.fasterxml.jackson.core", "jackson-databind"): "2.14.1",
        ("org.slf4j", "slf4j-api"): "1.7.25",
        ("org.apache.zookeeper", "zookeeper"): "3.6.3",
        **{("io.netty", a): "4.1.86.Final" for a in _NETTY},
        ("io.netty", "netty-tcnative-boringssl-static"): "2.0.54.Final",
        ("org.bouncycastle", "bcprov-jdk15on"): "1.70",
        ("org.bouncycastle", "bcpkix-jdk15on"): "1.70",
        ("org.apache.avro", "avro"): "1.11.1",
        ("org.jetbrains.kotlin", "kotlin-stdlib-common"): "1.7.20",
        ("org.jetbrains.kotlin", "kotlin-stdlib"): "1.7.20",
        ("org.yaml", "snakeyaml"): "2.0",
        ("com.fasterxml.woodstox", "woodstox-core"): "6.4.0",
        ("org.jdom", "jdom2"): "2.0.6.1",
        ("commons-net", "commons-net"): "3.9.0",
    },
}

DEFAULT_HEAP_MB = 768
DEFAULT_DIRECT_MB = 256
# The segment store's read cache lives in direct memory; the emulator sets 128 MiB, we halve it so
# that it fits under MaxDirectMemorySize next to Netty's buffers.
DEFAULT_CACHE_MB = 64
DEFAULT_READY_TIMEOUT = 180.0
STATE_FILE = "standalone.json"
READY_LOG_LINE = "Pravega Sandbox is running locally now"
LOG_FILE = "standalone.log"
CONSOLE_FILE = "console.log"

WIRE_HELLO = -127
CLIENT_WIRE_VERSION = (15, 5)  # what pravega-client-rust 0.3.7 sends
CONTROLLER_SERVICE = "/io.pravega.controller.stream.api.grpc.v1.ControllerService/"


class StandaloneError(RuntimeError):
    """Anything that stops Pravega standalone from being fetched, started or stopped."""


# --------------------------------------------------------------------------------------------
# Locations and tools
# --------------------------------------------------------------------------------------------


def cache_root() -> Path:
    """Root of the jar cache: PRAVEGA_STANDALONE_CACHE or ~/.cache/... (never inside the repo).

    The rule of airflow_provider_pravega/_cache.py, written out here: this script is standard
    library only."""
    env = os.environ.get("PRAVEGA_STANDALONE_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "airflow-provider-pravega" / "pravega-standalone"


def version_dir(version: str = DEFAULT_VERSION, root: Path | None = None) -> Path:
    return (root or cache_root()) / version


def default_work_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"airflow-provider-pravega-standalone-{os.getuid()}"


def find_mvn() -> str:
    mvn = os.environ.get("PRAVEGA_STANDALONE_MVN") or shutil.which("mvn")
    if not mvn:
        raise StandaloneError("Maven ('mvn') not found on PATH; install Maven 3 or set PRAVEGA_STANDALONE_MVN")
    return mvn


def java_candidates() -> list[str]:
    """Java executables to try, the explicit ones first, then a Java 17 install if one is present."""
    out: list[str] = []
    if os.environ.get("PRAVEGA_STANDALONE_JAVA"):
        out.append(os.environ["PRAVEGA_STANDALONE_JAVA"])
    if os.environ.get("JAVA_HOME"):
        out.append(str(Path(os.environ["JAVA_HOME"]) / "bin" / "java"))
    on_path = shutil.which("java")
    if on_path:
        out.append(on_path)
    out.extend(str(p) for p in sorted(Path("/usr/lib/jvm").glob("*17*/bin/java")))
    seen: set[str] = set()
    return [c for c in out if not (c in seen or seen.add(c))]


def java_major(java: str) -> int:
    """Major version of a java executable, from its java.specification.version property."""
    try:
        proc = subprocess.run([java, "-XshowSettings:properties", "-version"], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StandaloneError(f"cannot run {java}: {exc}") from exc
    m = re.search(r"java\.specification\.version = (\d+)(?:\.(\d+))?", proc.stderr + proc.stdout)
    if not m:
        raise StandaloneError(f"cannot tell the version of {java}: {proc.stderr.strip()[:300]}")
    major = int(m.group(1))
    return int(m.group(2)) if major == 1 and m.group(2) else major


def find_java(min_major: int = 17) -> tuple[str, int]:
    """The first java found whose major version is at least min_major (Pravega 0.13 runs on 17)."""
    tried = []
    for cand in java_candidates():
        if not Path(cand).exists():
            continue
        try:
            major = java_major(cand)
        except StandaloneError as exc:
            tried.append(str(exc))
            continue
        if major >= min_major:
            return cand, major
        tried.append(f"{cand} is Java {major}")
    raise StandaloneError(f"no Java >= {min_major} found (set PRAVEGA_STANDALONE_JAVA); tried: {tried or 'none'}")


# --------------------------------------------------------------------------------------------
# Resolving jars with Maven
# --------------------------------------------------------------------------------------------


def _version_key(version: str) -> tuple:
    """Order versions well enough to pick the highest of the candidates one dependency tree offers.

    Numbers compare as numbers; a release ("", "final", "ga", "jre", "release") sorts after
    pre-releases (alpha, beta, rc, snapshot) of the same numbers.
    """
    parts = re.split(r"[.\-_]", version.lower())
    key: list[tuple[int, int, str]] = []
    pre = {"alpha": -4, "a": -4, "beta": -3, "b": -3, "milestone": -2, "m": -2, "rc": -1, "cr": -1,
           "snapshot": -5}
    for part in parts:
        for tok in re.findall(r"\d+|[a-z]+", part):
            if tok.isdigit():
                key.append((1, int(tok), ""))
            elif tok in pre:
                key.append((0, pre[tok], tok))
            elif tok in ("final", "ga", "release", "jre"):
                key.append((0, 0, ""))
            else:
                key.append((0, 0, tok))
    # Pad with "release" so that 1.0 sorts after 1.0-rc1 and before 1.0.1.
    return tuple(key + [(0, 0, "")] * (24 - len(key)))


_COORD = re.compile(r"^[\w.\-]+(?::[\w.\-]+){4,5}$")


def parse_tree_versions(tree_text: str) -> dict[tuple[str, str], set[str]]:
    """Every version of every (groupId, artifactId) that a verbose dependency tree mentions.

    Both the versions Maven chose and those it omitted for a conflict count, in compile/runtime
    scope; the highest is what Gradle (which built and published Pravega's poms) would have used.
    """
    found: dict[tuple[str, str], set[str]] = {}
    for raw in tree_text.splitlines():
        for tok in raw.replace("(", " ").replace(")", " ").split():
            if not _COORD.match(tok):
                continue
            parts = tok.split(":")
            group, artifact = parts[0], parts[1]
            version, scope = (parts[3], parts[4]) if len(parts) == 5 else (parts[4], parts[5])
            if scope not in ("compile", "runtime"):
                continue
            found.setdefault((group, artifact), set()).add(version)
    return found


def highest_versions(found: dict[tuple[str, str], set[str]]) -> dict[tuple[str, str], str]:
    return {ga: max(vs, key=_version_key) for ga, vs in found.items()}


def _pom(version: str, managed: dict[tuple[str, str], str] | None = None) -> str:
    exclusions = "".join(
        f"<exclusion><groupId>{g}</groupId><artifactId>{a}</artifactId></exclusion>" for g, a in EXCLUDED_ARTIFACTS
    )
    mgmt = ""
    if managed:
        rows = "\n".join(
            f"      <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>"
            for (g, a), v in sorted(managed.items())
            if (g, a) != (GROUP_ID, ARTIFACT_ID)
        )
        mgmt = f"  <dependencyManagement>\n    <dependencies>\n{rows}\n    </dependencies>\n  </dependencyManagement>\n"
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by scripts/pravega_standalone.py to resolve Pravega standalone's runtime classpath. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.airflow-provider-pravega</groupId>
  <artifactId>pravega-standalone-classpath</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
{mgmt}  <dependencies>
    <dependency>
      <groupId>{GROUP_ID}</groupId>
      <artifactId>{ARTIFACT_ID}</artifactId>
      <version>{version}</version>
      <exclusions>{exclusions}</exclusions>
    </dependency>
  </dependencies>
</project>
"""


def _mvn(args: Sequence[str], cwd: Path, offline: bool, log: Path, timeout: float) -> None:
    cmd = [find_mvn(), "-B", "-q"] + (["-o"] if offline else []) + list(args)
    with open(log, "ab") as out:
        out.write(("\n$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        try:
            proc = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise StandaloneError(f"Maven took longer than {timeout:.0f}s: {' '.join(cmd)}; see {log}") from exc
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-25:]
        raise StandaloneError(f"Maven failed (exit {proc.returncode}): {' '.join(cmd)}\n" + "\n".join(tail))


def is_fetched(version: str = DEFAULT_VERSION, root: Path | None = None) -> bool:
    """True when the cache holds a complete classpath for this version (all listed jars present)."""
    vdir = version_dir(version, root)
    manifest = vdir / "resolved.json"
    if not manifest.exists():
        return False
    try:
        jars = json.loads(manifest.read_text())["jars"]
    except (ValueError, KeyError):
        return False
    return bool(jars) and all((vdir / "lib" / j).is_file() for j in jars)


def fetch(version: str = DEFAULT_VERSION, root: Path | None = None, offline: bool = False,
          force: bool = False, timeout: float = 1800.0) -> Path:
    """Resolve pravega-standalone and its runtime dependencies into <cache>/<version>/lib.

    Two Maven passes: a verbose dependency tree, from which every dependency is pinned to the
    highest version anywhere in it (Gradle's conflict rule; Maven's nearest-wins would otherwise
    pick protobuf-java 2.5.0 from Hadoop and the controller dies with NoClassDefFoundError
    GeneratedMessageV3), then copy-dependencies with those pins. Returns the version directory.
    """
    vdir = version_dir(version, root)
    if is_fetched(version, root) and not force:
        return vdir
    vdir.mkdir(parents=True, exist_ok=True)
    log = vdir / "maven.log"
    log.write_text("")
    started = time.monotonic()

    tree_dir = vdir / "tree"
    tree_dir.mkdir(exist_ok=True)
    (tree_dir / "pom.xml").write_text(_pom(version))
    tree_file = tree_dir / "tree.txt"
    _mvn([f"{DEPENDENCY_PLUGIN}:tree", "-Dverbose", f"-DoutputFile={tree_file}"], tree_dir, offline, log, timeout)
    managed = highest_versions(parse_tree_versions(tree_file.read_text()))
    if (GROUP_ID, ARTIFACT_ID) not in managed:
        raise StandaloneError(f"the dependency tree in {tree_file} does not mention {GROUP_ID}:{ARTIFACT_ID}:{version}")
    managed.update(PRAVEGA_FORCED_VERSIONS.get(version, {}))

    (vdir / "pom.xml").write_text(_pom(version, managed))
    staging = vdir / "lib.partial"
    shutil.rmtree(staging, ignore_errors=True)
    _mvn([f"{DEPENDENCY_PLUGIN}:copy-dependencies", f"-DoutputDirectory={staging}", "-DincludeScope=runtime",
          "-DexcludeTypes=pom"], vdir, offline, log, timeout)
    # Classpath ORDER matters (several jars carry the same classes, e.g. bc-fips and bcprov-ext), so
    # keep Maven's resolution order, which follows declaration order as Gradle's does, not file names.
    order_file = vdir / "classpath-order.txt"
    _mvn([f"{DEPENDENCY_PLUGIN}:build-classpath", f"-Dmdep.outputFile={order_file}", "-DincludeScope=runtime",
          "-DexcludeTypes=pom"], vdir, offline, log, timeout)
    copied = {p.name for p in staging.glob("*.jar")}
    jars = [Path(p).name for p in order_file.read_text().strip().split(os.pathsep) if p]
    if set(jars) != copied:
        raise StandaloneError(f"build-classpath and copy-dependencies disagree: only in classpath "
                              f"{sorted(set(jars) - copied)[:5]}, only copied {sorted(copied - set(jars))[:5]}")
    if not any(j.startswith(f"{ARTIFACT_ID}-{version}") for j in jars):
        raise StandaloneError(f"Maven did not produce {ARTIFACT_ID}-{version}.jar in {staging}; see {log}")
    shutil.rmtree(vdir / "lib", ignore_errors=True)
    staging.rename(vdir / "lib")
    elapsed = time.monotonic() - started
    manifest = {
        "version": version,
        "jars": jars,
        "jar_bytes": sum((vdir / "lib" / j).stat().st_size for j in jars),
        "resolve_seconds": round(elapsed, 1),
        "resolved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "offline": offline,
    }
    (vdir / "resolved.json").write_text(json.dumps(manifest, indent=2) + "\n")
    build_loopback_shim(vdir)
    return vdir


def classpath(version: str = DEFAULT_VERSION, root: Path | None = None) -> str:
    vdir = version_dir(version, root)
    if not is_fetched(version, root):
        raise StandaloneError(f"Pravega standalone {version} is not in the cache {vdir}; run 'fetch' first")
    jars = json.loads((vdir / "resolved.json").read_text())["jars"]
    return os.pathsep.join(str(vdir / "lib" / j) for j in jars)


def maven_reachable(version: str = DEFAULT_VERSION, timeout: float = 60.0) -> tuple[bool, str]:
    """Can Maven get the pravega-standalone pom (from the local repository or the registry)?"""
    try:
        mvn = find_mvn()
    except StandaloneError as exc:
        return False, str(exc)
    with tempfile.TemporaryDirectory(prefix="pravega-mvn-check-") as tmp:
        cmd = [mvn, "-B", "-q", "org.apache.maven.plugins:maven-dependency-plugin:3.6.1:get",
               f"-Dartifact={GROUP_ID}:{ARTIFACT_ID}:{version}:pom", "-Dtransitive=false"]
        try:
            proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return False, f"Maven could not reach {GROUP_ID}:{ARTIFACT_ID}:{version} within {timeout:.0f}s"
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "ERROR" in ln][:3]
        return False, f"Maven cannot resolve {GROUP_ID}:{ARTIFACT_ID}:{version}: {' | '.join(lines)[:500]}"
    return True, "Maven resolves pravega-standalone"


# --------------------------------------------------------------------------------------------
# Loopback-only listening
# --------------------------------------------------------------------------------------------

# Pravega 0.13's controller builds its gRPC server with NettyServerBuilder.forPort(port), i.e. on the
# wildcard address, and no setting changes that. This project's servers listen on loopback only, so
# the JVM runs with a tiny LD_PRELOAD library (our own, compiled here with the system C compiler)
# that turns every bind() to 0.0.0.0 / :: into 127.0.0.1 / ::ffff:127.0.0.1. Ports are untouched.
LOOPBACK_SHIM_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

/* bind() that never listens on every interface: wildcard addresses become loopback. */
int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn next_bind;
    if (!next_bind) next_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    if (addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in v4 = *(const struct sockaddr_in *)addr;
        if (v4.sin_addr.s_addr == htonl(INADDR_ANY)) {
            v4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            return next_bind(fd, (const struct sockaddr *)&v4, sizeof v4);
        }
    } else if (addr && addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 v6 = *(const struct sockaddr_in6 *)addr;
        if (memcmp(&v6.sin6_addr, &in6addr_any, sizeof in6addr_any) == 0) {
            inet_pton(AF_INET6, "::ffff:127.0.0.1", &v6.sin6_addr);
            return next_bind(fd, (const struct sockaddr *)&v6, sizeof v6);
        }
    }
    return next_bind(fd, addr, len);
}
"""
SHIM_NAME = "loopback-bind.so"


def build_loopback_shim(target_dir: Path) -> Path | None:
    """Compile the bind() shim into target_dir; None (and the controller listens on all interfaces)
    when no C compiler is available."""
    target = target_dir / SHIM_NAME
    source = target_dir / "loopback-bind.c"
    if target.exists() and source.exists() and source.read_text() == LOOPBACK_SHIM_C:
        return target
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    target_dir.mkdir(parents=True, exist_ok=True)
    source.write_text(LOOPBACK_SHIM_C)
    partial = target.with_suffix(".partial")
    proc = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(partial), str(source), "-ldl"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise StandaloneError(f"compiling {source} with {cc} failed: {proc.stderr.strip()[:500]}")
    partial.rename(target)
    return target


def listening_addresses(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that process pid holds (from /proc)."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        return []
    out = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] != "0A" or cols[9] not in inodes:  # 0A = LISTEN
                continue
            hex_addr, hex_port = cols[1].split(":")
            raw = bytes.fromhex(hex_addr)
            # /proc prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            family = socket.AF_INET if width == 8 else socket.AF_INET6
            out.append((socket.inet_ntop(family, raw), int(hex_port, 16)))
    return sorted(set(out))


# --------------------------------------------------------------------------------------------
# Starting and stopping
# --------------------------------------------------------------------------------------------


@dataclass
class Ports:
    controller: int
    segment_store: int
    zookeeper: int
    rest: int
    admin_gateway: int


@dataclass
class State:
    """What a running instance left in <work_dir>/standalone.json, so 'stop' and 'status' find it."""

    pid: int
    version: str
    ports: Ports
    controller_uri: str
    segment_store: str
    work_dir: str
    command: list[str]
    started_at: float
    ready_seconds: float | None = None
    notes: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def load(cls, work_dir: Path) -> State | None:
        path = Path(work_dir) / STATE_FILE
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        data["ports"] = Ports(**data["ports"])
        return cls(**data)


def free_ports(count: int, exclude: Iterable[int] = ()) -> list[int]:
    """Distinct free TCP ports on 127.0.0.1 (all sockets held open together so they differ)."""
    socks, ports = [], []
    try:
        while len(ports) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            port = s.getsockname()[1]
            if port not in exclude:
                ports.append(port)
    finally:
        for s in socks:
            s.close()
    return ports


def choose_ports(controller_port: int = 0, segment_store_port: int = 0) -> Ports:
    fixed = [p for p in (controller_port, segment_store_port) if p]
    auto = iter(free_ports(5, exclude=fixed))
    return Ports(
        controller=controller_port or next(auto),
        segment_store=segment_store_port or next(auto),
        zookeeper=next(auto),
        rest=next(auto),
        admin_gateway=next(auto),
    )


def write_config(work_dir: Path, ports: Ports, cache_mb: int, storage: str = "filesystem") -> Path:
    """The emulator's properties file: singlenode.* for LocalPravegaEmulator, pravegaservice.* for
    the segment store (InProcPravegaCluster includes this file after its own defaults)."""
    props = {
        "singlenode.zk.port": ports.zookeeper,
        "singlenode.controller.rpc.port": ports.controller,
        "singlenode.segmentStore.port": ports.segment_store,
        "singlenode.controller.rest.enable": "false",
        "singlenode.controller.rest.port": ports.rest,
        "singlenode.admin.gateway.enable": "false",
        "singlenode.admin.gateway.port": ports.admin_gateway,
        "singlenode.security.auth.enable": "false",
        "singlenode.security.tls.enable": "false",
        "singlenode.metrics.enable": "false",
        # The segment store would listen on 0.0.0.0 and advertise the host's address; keep it on
        # loopback and make getURI hand out a literal 127.0.0.1.
        "pravegaservice.service.listener.host.nameOrIp": "127.0.0.1",
        "pravegaservice.service.published.host.nameOrIp": "127.0.0.1",
        "pravegaservice.rest.listener.enable": "false",
        "pravegaservice.cache.size.max": cache_mb * 1024 * 1024,
    }
    if storage == "filesystem":
        # The emulator keeps segment data in the JVM heap (INMEMORY storage), so a few hundred MiB
        # of events fill -Xmx768m. Long-term storage on local files (the durable log stays in
        # memory and is truncated as data reaches storage) keeps the heap flat whatever the tests
        # write. Neither survives a restart: the emulator wipes its in-process ZooKeeper on start.
        props["pravegaservice.storage.impl.name"] = "FILESYSTEM"
        props["filesystem.root"] = str(work_dir / "storage")
    elif storage != "memory":
        raise StandaloneError(f"storage must be 'filesystem' or 'memory', not {storage!r}")
    path = work_dir / "standalone-config.properties"
    path.write_text("# Generated by scripts/pravega_standalone.py\n"
                    + "".join(f"{k}={v}\n" for k, v in props.items()))
    return path


def write_logback(work_dir: Path) -> Path:
    """Pravega's INFO goes to standalone.log; only warnings and the emulator's own lines to the console."""
    log_file = work_dir / LOG_FILE
    xml = f"""<configuration>
  <!-- Generated by scripts/pravega_standalone.py -->
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>{log_file}</file>
    <encoder><pattern>%d{{HH:mm:ss.SSS}} %-5level [%thread] %logger{{36}} - %msg%n</pattern></encoder>
  </appender>
  <appender name="CONSOLE" class="ch.qos.logback.core.ConsoleAppender">
    <filter class="ch.qos.logback.classic.filter.ThresholdFilter"><level>ERROR</level></filter>
    <encoder><pattern>%d{{HH:mm:ss.SSS}} %-5level %logger{{36}} - %msg%n</pattern></encoder>
  </appender>
  <logger name="io.netty" level="WARN"/>
  <logger name="io.grpc" level="WARN"/>
  <logger name="org.apache.zookeeper" level="WARN"/>
  <logger name="org.apache.curator" level="WARN"/>
  <logger name="io.pravega.local" level="INFO"><appender-ref ref="CONSOLE"/></logger>
  <root level="INFO"><appender-ref ref="FILE"/><appender-ref ref="CONSOLE"/></root>
</configuration>
"""
    path = work_dir / "logback.xml"
    path.write_text(xml)
    return path


def java_command(java: str, cp: str, work_dir: Path, config: Path, logback: Path,
                 heap_mb: int = DEFAULT_HEAP_MB, direct_mb: int = DEFAULT_DIRECT_MB) -> list[str]:
    tmp = work_dir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return [
        java,
        f"-Xmx{heap_mb}m",
        "-Xms64m",
        f"-XX:MaxDirectMemorySize={direct_mb}m",
        "-XX:MaxMetaspaceSize=256m",
        "-XX:ReservedCodeCacheSize=96m",
        "-XX:+UseSerialGC",  # small footprint, no GC threads competing with Spark on 2 cores
        "-XX:TieredStopAtLevel=1",  # C1 only: faster start, less compiler memory; fine for tests
        "-XX:+ExitOnOutOfMemoryError",
        "-Xss512k",
        "-Djava.net.preferIPv4Stack=true",
        f"-Djava.io.tmpdir={tmp}",  # in-process ZooKeeper's data goes here
        f"-Dlogback.configurationFile={logback}",
        f"-Dsinglenode.configurationFile={config}",
        "-cp", cp,
        MAIN_CLASS,
    ]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _is_our_jvm(pid: int, work_dir: Path) -> bool:
    """Guard against pid reuse: the process must be the emulator started with this work dir's config."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return _pid_alive(pid)
    want = f"-Dsinglenode.configurationFile={work_dir / 'standalone-config.properties'}".encode()
    return MAIN_CLASS.encode() in cmdline and want in cmdline


def rss_kib(pid: int) -> int | None:
    """Resident set size of a process in KiB (same figure as `ps -o rss=`)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def tcp_accepts(port: int, host: str = "127.0.0.1", timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def segment_store_hello(port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> tuple[int, int]:
    """Send the wire protocol's Hello as the Rust client does and return the server's (high, low)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(struct.pack(">iiii", WIRE_HELLO, 8, *CLIENT_WIRE_VERSION))
        header = _recv_exact(s, 8)
        code, length = struct.unpack(">ii", header)
        payload = _recv_exact(s, length)
    if code != WIRE_HELLO or length < 8:
        raise StandaloneError(f"segment store on port {port} answered type {code} (len {length}) to Hello")
    return struct.unpack(">ii", payload[:8])


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise StandaloneError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def _decode_strings(data: bytes, field_no: int) -> list[str]:
    """Pull repeated string `field_no` out of a protobuf message (enough for readiness checks)."""
    out, i = [], 0
    while i < len(data):
        key, i = _varint(data, i)
        fno, wtype = key >> 3, key & 7
        if wtype == 0:
            _, i = _varint(data, i)
        elif wtype == 2:
            n, i = _varint(data, i)
            if fno == field_no:
                out.append(data[i:i + n].decode("utf-8", "replace"))
            i += n
        elif wtype == 1:
            i += 8
        elif wtype == 5:
            i += 4
        else:
            raise ValueError(f"unexpected protobuf wire type {wtype}")
    return out


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def controller_list_scopes(port: int, timeout: float = 5.0) -> list[str] | None:
    """listScopes over gRPC with raw protobuf bytes; None when grpc is not importable here.

    A real RPC rather than a TCP connect: the controller accepts connections well before its
    table-backed metadata store (on the segment store) can answer.
    """
    try:
        import grpc  # type: ignore[import-not-found]
    except ImportError:
        return None
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(CONTROLLER_SERVICE + "listScopes",
                                   request_serializer=None, response_deserializer=None)
        # ScopesRequest{continuationToken: ContinuationToken{token: ""}} = field 1, empty message
        reply = call(b"\x0a\x00", timeout=timeout)
    return _decode_strings(reply, 1)


def _log_errors(work_dir: Path, limit: int = 12) -> str:
    lines: list[str] = []
    for name in (CONSOLE_FILE, LOG_FILE):
        path = work_dir / name
        if path.exists():
            text = path.read_text(errors="replace").splitlines()
            lines += [f"{name}: {ln}" for ln in text if " ERROR " in ln or "Exception" in ln or "Error:" in ln]
    return "\n".join(lines[:limit]) or "(no errors logged)"


def wait_ready(state: State, proc: subprocess.Popen | None, timeout: float) -> dict:
    """Poll until the JVM is alive, the controller answers a real RPC, and the segment store says Hello."""
    deadline = time.monotonic() + timeout
    ports = state.ports
    work_dir = Path(state.work_dir)
    notes: dict = {}
    last_error = "not tried yet"
    while time.monotonic() < deadline:
        alive = proc.poll() is None if proc is not None else _pid_alive(state.pid)
        if not alive:
            raise StandaloneError(f"Pravega standalone exited during startup; errors:\n{_log_errors(work_dir)}")
        try:
            if not tcp_accepts(ports.controller):
                raise StandaloneError(f"controller port {ports.controller} not accepting yet")
            if not tcp_accepts(ports.segment_store):
                raise StandaloneError(f"segment store port {ports.segment_store} not accepting yet")
            notes["segment_store_hello"] = list(segment_store_hello(ports.segment_store))
            scopes = controller_list_scopes(ports.controller)
            if scopes is None:
                # Without grpc here, fall back on the emulator's own word: it logs this line once
                # its controller and segment store have started.
                log = work_dir / LOG_FILE
                if not (log.exists() and READY_LOG_LINE in log.read_text(errors="replace")):
                    raise StandaloneError("emulator has not logged that it is running yet")
            notes["controller_probe"] = "listScopes" if scopes is not None else "log line (grpc not importable)"
            if scopes is not None:
                # The controller creates its '_system' scope (commit/abort/scale streams and their
                # event processors) once its services are up; transactions need those processors.
                if "_system" not in scopes:
                    raise StandaloneError(f"controller up, but its _system scope not yet (scopes: {scopes})")
                notes["scopes_at_start"] = scopes
            return notes
        except Exception as exc:  # noqa: BLE001 - any failure just means "not ready yet"
            last_error = f"{type(exc).__name__}: {exc}"
        time.sleep(0.5)
    raise StandaloneError(
        f"Pravega standalone not ready after {timeout:.0f}s (last check: {last_error}); errors:\n{_log_errors(work_dir)}"
    )


def _die_with_parent_prefix() -> list[str]:
    """Command prefix that makes Linux SIGTERM the JVM when the process that started it dies (even
    by SIGKILL), so a crashed test run leaves no orphan Pravega behind. util-linux's setpriv sets the
    parent-death signal and execs, so the JVM keeps the pid Popen reports. No setpriv: no prefix."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []


def start(work_dir: Path | None = None, version: str = DEFAULT_VERSION, root: Path | None = None,
          controller_port: int = 0, segment_store_port: int = 0, heap_mb: int = DEFAULT_HEAP_MB,
          direct_mb: int = DEFAULT_DIRECT_MB, cache_mb: int = DEFAULT_CACHE_MB,
          ready_timeout: float = DEFAULT_READY_TIMEOUT, fetch_if_missing: bool = True,
          loopback_only: bool = True, die_with_parent: bool = False, storage: str = "filesystem") -> State:
    """Start Pravega standalone and return once it answers.

    The JVM runs in its own session (a Ctrl-C aimed at the caller does not hit it). By default it
    outlives this call (the CLI's 'start'); die_with_parent=True ties it to the calling process
    (tests). Use stop(work_dir) to end it.
    """
    work_dir = Path(work_dir or default_work_dir()).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    existing = State.load(work_dir)
    if existing and _pid_alive(existing.pid) and _is_our_jvm(existing.pid, work_dir):
        raise StandaloneError(f"Pravega standalone already runs from {work_dir} (pid {existing.pid}, "
                              f"{existing.controller_uri}); stop it first")
    if fetch_if_missing and not is_fetched(version, root):
        fetch(version, root)
    cp = classpath(version, root)
    java, _major = find_java()
    env = dict(os.environ)
    shim = build_loopback_shim(version_dir(version, root)) if loopback_only else None
    if shim:
        env["LD_PRELOAD"] = " ".join(x for x in (str(shim), env.get("LD_PRELOAD", "")) if x)

    attempts = 1 if (controller_port and segment_store_port) else 2  # a picked port may be taken meanwhile
    for attempt in range(attempts):
        ports = choose_ports(controller_port, segment_store_port)
        config = write_config(work_dir, ports, cache_mb, storage)
        logback = write_logback(work_dir)
        for name in (LOG_FILE, CONSOLE_FILE):
            (work_dir / name).unlink(missing_ok=True)
        shutil.rmtree(work_dir / "tmp", ignore_errors=True)
        shutil.rmtree(work_dir / "storage", ignore_errors=True)
        (work_dir / "storage").mkdir()
        cmd = java_command(java, cp, work_dir, config, logback, heap_mb, direct_mb)
        prefix = _die_with_parent_prefix() if die_with_parent else []
        started = time.monotonic()
        with open(work_dir / CONSOLE_FILE, "ab") as console:
            proc = subprocess.Popen(prefix + cmd, cwd=work_dir, env=env, stdin=subprocess.DEVNULL, stdout=console,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        state = State(pid=proc.pid, version=version, ports=ports,
                      controller_uri=f"tcp://127.0.0.1:{ports.controller}",
                      segment_store=f"127.0.0.1:{ports.segment_store}", work_dir=str(work_dir),
                      command=cmd, started_at=time.time())
        state.notes["ld_preload"] = str(shim) if shim else None
        (work_dir / STATE_FILE).write_text(state.to_json())
        try:
            state.notes.update(wait_ready(state, proc, ready_timeout))
        except StandaloneError:
            _terminate(proc.pid, work_dir, grace=15.0)
            proc.wait(timeout=30)
            bind_clash = "Address already in use" in _log_errors(work_dir, 50)
            if attempt + 1 < attempts and bind_clash:
                continue
            raise
        state.ready_seconds = round(time.monotonic() - started, 2)
        state.notes["rss_kib_ready"] = rss_kib(proc.pid)
        state.notes["listening"] = [f"{a}:{p}" for a, p in listening_addresses(proc.pid)]
        (work_dir / STATE_FILE).write_text(state.to_json())
        return state
    raise StandaloneError("unreachable")  # pragma: no cover


def _terminate(pid: int, work_dir: Path, grace: float) -> str:
    """SIGTERM (the emulator's shutdown hook closes segment store, controller, ZooKeeper), then SIGKILL."""
    if not _pid_alive(pid):
        return "not running"
    if not _is_our_jvm(pid, work_dir):
        return f"pid {pid} is not the Pravega standalone of {work_dir}; left alone"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(pid)
        if not _pid_alive(pid):
            return "stopped"
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    for _ in range(50):
        _reap(pid)
        if not _pid_alive(pid):
            break
        time.sleep(0.1)
    return f"killed after {grace:.0f}s"


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop(work_dir: Path | None = None, grace: float = 30.0) -> str:
    work_dir = Path(work_dir or default_work_dir()).resolve()
    state = State.load(work_dir)
    if state is None:
        return f"no Pravega standalone state in {work_dir}"
    result = _terminate(state.pid, work_dir, grace)
    if not _pid_alive(state.pid):
        (work_dir / STATE_FILE).unlink(missing_ok=True)
    return f"pid {state.pid}: {result}"


def status(work_dir: Path | None = None) -> dict:
    work_dir = Path(work_dir or default_work_dir()).resolve()
    state = State.load(work_dir)
    if state is None:
        return {"running": False, "work_dir": str(work_dir)}
    alive = _pid_alive(state.pid) and _is_our_jvm(state.pid, work_dir)
    out = {"running": alive, "pid": state.pid, "version": state.version, "controller_uri": state.controller_uri,
           "segment_store": state.segment_store, "ports": asdict(state.ports), "work_dir": state.work_dir,
           "ready_seconds": state.ready_seconds}
    if alive:
        out["rss_kib"] = rss_kib(state.pid)
        out["listening"] = [f"{a}:{p}" for a, p in listening_addresses(state.pid)]
        out["controller_answers"] = tcp_accepts(state.ports.controller)
        out["segment_store_answers"] = tcp_accepts(state.ports.segment_store)
    return out


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--version", default=DEFAULT_VERSION, help=f"Pravega release (default {DEFAULT_VERSION})")
    p.add_argument("--cache", type=Path, default=None,
                   help="cache root (default $PRAVEGA_STANDALONE_CACHE or ~/.cache/airflow-provider-pravega/pravega-standalone)")


def _add_start(p: argparse.ArgumentParser) -> None:
    _add_common(p)
    p.add_argument("--work-dir", type=Path, default=None, help=f"logs, config, state (default {default_work_dir()})")
    p.add_argument("--controller-port", type=int, default=0, help="0 = a free port")
    p.add_argument("--segment-store-port", type=int, default=0, help="0 = a free port")
    p.add_argument("--heap-mb", type=int, default=DEFAULT_HEAP_MB)
    p.add_argument("--direct-mb", type=int, default=DEFAULT_DIRECT_MB)
    p.add_argument("--cache-mb", type=int, default=DEFAULT_CACHE_MB, help="segment store read cache")
    p.add_argument("--timeout", type=float, default=DEFAULT_READY_TIMEOUT, help="seconds to wait for readiness")
    p.add_argument("--storage", choices=("filesystem", "memory"), default="filesystem",
                   help="segment data on files in the work dir (flat heap) or in the JVM heap")
    p.add_argument("--no-loopback-shim", action="store_true",
                   help="do not LD_PRELOAD the bind() shim (the controller then listens on all interfaces)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_fetch = sub.add_parser("fetch", help="resolve pravega-standalone and its dependencies into the cache")
    _add_common(p_fetch)
    p_fetch.add_argument("--offline", action="store_true", help="use only the local Maven repository")
    p_fetch.add_argument("--force", action="store_true", help="resolve again even if the cache is complete")
    _add_start(sub.add_parser("start", help="start in the background; prints the controller URI when ready"))
    _add_start(sub.add_parser("run", help="start in the foreground; Ctrl-C or SIGTERM stops it"))
    for name, helptext in (("stop", "stop the instance of a work dir"), ("status", "show the instance of a work dir")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--work-dir", type=Path, default=None)
        if name == "stop":
            p.add_argument("--grace", type=float, default=30.0, help="seconds between SIGTERM and SIGKILL")
    args = parser.parse_args(argv)

    try:
        if args.command == "fetch":
            t0 = time.monotonic()
            vdir = fetch(args.version, args.cache, offline=args.offline, force=args.force)
            info = json.loads((vdir / "resolved.json").read_text())
            print(f"pravega-standalone {args.version}: {len(info['jars'])} jars, "
                  f"{info['jar_bytes'] / 2**20:.0f} MiB in {vdir / 'lib'} "
                  f"(resolved in {info['resolve_seconds']}s; this call {time.monotonic() - t0:.1f}s)")
            return 0
        if args.command == "stop":
            print(stop(args.work_dir, args.grace))
            return 0
        if args.command == "status":
            st = status(args.work_dir)
            print(json.dumps(st, indent=2))
            return 0 if st["running"] else 3
        state = start(args.work_dir, args.version, args.cache, args.controller_port, args.segment_store_port,
                      args.heap_mb, args.direct_mb, args.cache_mb, args.timeout,
                      loopback_only=not args.no_loopback_shim, die_with_parent=args.command == "run",
                      storage=args.storage)
        print(f"Pravega standalone {state.version} ready in {state.ready_seconds}s: "
              f"controller {state.controller_uri} segment store {state.segment_store} (pid {state.pid}, "
              f"RSS {state.notes.get('rss_kib_ready')} KiB, logs {state.work_dir})", file=sys.stderr)
        print(state.controller_uri, flush=True)
        if args.command == "start":
            return 0
        return _foreground(state)
    except StandaloneError as exc:
        print(f"pravega_standalone: {exc}", file=sys.stderr)
        return 1


def _foreground(state: State) -> int:
    stopping = {"signal": None}

    def on_signal(signum, _frame):
        stopping["signal"] = signum

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    work_dir = Path(state.work_dir)
    while stopping["signal"] is None:
        _reap(state.pid)
        if not _pid_alive(state.pid):
            print(f"Pravega standalone (pid {state.pid}) exited; errors:\n{_log_errors(work_dir)}", file=sys.stderr)
            (work_dir / STATE_FILE).unlink(missing_ok=True)
            return 1
        time.sleep(0.5)
    print(stop(work_dir), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
