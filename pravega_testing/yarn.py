"""A real YARN for tests: Hadoop's own ``MiniYARNCluster`` (a ResourceManager and one NodeManager
that launches real container processes) over a ``MiniDFSCluster`` (a NameNode and a DataNode), all
in one JVM on loopback ports, from the ``hadoop-client-minicluster`` jar that the HDFS tests use
(pravega_testing.hdfs fetches it) with pyspark's jars beside it.

Hadoop ships no command-line entry for a bare MiniYARNCluster (``MiniHadoopClusterManager`` also
starts MapReduce's history server, whose classes the shaded minicluster jar lacks), so the JVM runs
py4j's ``GatewayServer`` (py4j's jar is among pyspark's) and this module builds and starts both
clusters through it: no Java source. The gateway listens on 127.0.0.1 with a random auth token
and dies with this process (``--die-on-broken-pipe`` on its stdin).

A PySpark application runs on it with pyspark's own ``bin/spark-submit --master yarn
--deploy-mode cluster``, the environment of :func:`submit_env` and the settings of
:func:`spark_submit_conf` (pyspark's jars and Python archives used in place, not uploaded; the
driver and executors on this interpreter, bound to 127.0.0.1).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_pravega._cache import cache_dir
from pravega_testing.hdfs import HdfsUnavailable, maven_jars, minicluster_jars
from pravega_testing.spark_connect import spark_home, stop_group

#: The MiniYARNCluster's name: Hadoop 3.5 puts its NodeManager's local and log directories under
#: ``$test.build.data/<name>/`` (``<work>/data/yarn/``, ``Yarn.nm_dir``).
_NAME = "yarn"
#: The JVM (both clusters and the gateway): small heap, IPv4 so "localhost" is 127.0.0.1.
_JAVA_OPTS = ("-Xmx768m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.net.preferIPv4Stack=true")
#: YARN and HDFS settings beyond Hadoop's defaults (MiniYARNCluster sets the NodeManager's memory
#: from its own ``yarn.minicluster.yarn.nodemanager.resource.memory-mb``, default 4096).
SETTINGS: dict[str, str] = {
    # Room for a driver (the ApplicationMaster) and two small executors on a 2-core machine.
    "yarn.minicluster.yarn.nodemanager.resource.memory-mb": "8192",
    "yarn.nodemanager.resource.memory-mb": "8192",
    "yarn.nodemanager.resource.cpu-vcores": "8",
    "yarn.scheduler.minimum-allocation-mb": "128",
    "yarn.scheduler.maximum-allocation-mb": "8192",
    "yarn.scheduler.minimum-allocation-vcores": "1",
    "yarn.scheduler.maximum-allocation-vcores": "8",
    # The CapacityScheduler finds no capacity-scheduler.xml: one queue, "default", as Spark's.
    "yarn.scheduler.capacity.root.queues": "default",
    "yarn.scheduler.capacity.root.default.capacity": "100",
    "yarn.scheduler.capacity.root.default.maximum-capacity": "100",
    "yarn.scheduler.capacity.maximum-am-resource-percent": "0.5",
    # JVMs reserve far more virtual memory than they use; a busy CI disk is not a broken disk.
    "yarn.nodemanager.vmem-check-enabled": "false",
    "yarn.nodemanager.pmem-check-enabled": "false",
    "yarn.nodemanager.disk-health-checker.max-disk-utilization-per-disk-percentage": "99.9",
    "yarn.nodemanager.disk-health-checker.min-free-space-per-disk-mb": "0",
    # Loopback only: the RM's and NM's servers (MiniYARNCluster advertises "localhost").
    "yarn.resourcemanager.hostname": "127.0.0.1",
    "yarn.resourcemanager.bind-host": "127.0.0.1",
    "yarn.nodemanager.bind-host": "127.0.0.1",
    "yarn.timeline-service.enabled": "false",
    # Finished containers' directories go at once; a container is SIGKILLed 250 ms after SIGTERM;
    # a stopping NodeManager waits 0.5 s + 1.25 s (not 6.25 s) for its applications to end.
    "yarn.nodemanager.delete.debug-delay-sec": "0",
    "yarn.nodemanager.sleep-delay-before-sigkill.ms": "250",
    "yarn.nodemanager.process-kill-wait.ms": "500",
    "yarn.nodemanager.log-aggregation.enabled": "false",
    "yarn.log-aggregation-enable": "false",
    "dfs.namenode.http-address": "127.0.0.1:0",
    "dfs.datanode.address": "127.0.0.1:0",
    "dfs.datanode.http.address": "127.0.0.1:0",
    "dfs.datanode.ipc.address": "127.0.0.1:0",
    "dfs.permissions.enabled": "false",
}
#: What a client needs to reach the cluster (written into ``conf_dir``'s site files).
_CLIENT_KEYS = ("yarn.resourcemanager.address", "yarn.resourcemanager.scheduler.address",
                "yarn.resourcemanager.resource-tracker.address", "yarn.resourcemanager.admin.address",
                "yarn.resourcemanager.webapp.address", "yarn.resourcemanager.hostname",
                "yarn.scheduler.minimum-allocation-mb", "yarn.scheduler.maximum-allocation-mb",
                "yarn.timeline-service.enabled")
#: What the ResourceManager needs beside the minicluster jar, which leaves Bouncy Castle unshaded
#: (its web proxy's CA): the version of Hadoop 3.5's build.
_BOUNCY_CASTLE = tuple(f"org.bouncycastle:{name}-jdk18on:1.82" for name in ("bcprov", "bcpkix", "bcutil"))
AM_CLASS = "org.apache.spark.deploy.yarn.ApplicationMaster"
EXECUTOR_CLASS = "org.apache.spark.executor.YarnCoarseGrainedExecutorBackend"


@dataclass
class Yarn:
    """A running cluster. ``conf_dir``: core-site.xml, hdfs-site.xml and yarn-site.xml for a
    client (HADOOP_CONF_DIR/YARN_CONF_DIR); ``rm_web``: the ResourceManager's web UI and REST API;
    ``work``: every directory of both clusters (the NodeManager's under ``nm_dir``)."""

    hdfs_uri: str
    conf_dir: Path
    rm_web: str
    rm_address: str
    process: subprocess.Popen
    log: Path
    work: Path
    nm_dir: Path
    gateway: Any = field(repr=False, default=None)


def java_home() -> str:
    """$JAVA_HOME, else the JDK of ``java`` on PATH: the NodeManager starts each container with
    ``$JAVA_HOME/bin/java``."""
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    java = shutil.which("java")
    if not java:
        raise HdfsUnavailable("the YARN minicluster needs java on PATH")
    return str(Path(os.path.realpath(java)).parent.parent)


def _site(path: Path, props: dict[str, str]) -> None:
    from xml.sax.saxutils import escape

    body = "".join(f"  <property><name>{escape(k)}</name><value>{escape(v)}</value></property>\n"
                   for k, v in props.items())
    path.write_text(f'<?xml version="1.0"?>\n<configuration>\n{body}</configuration>\n')


def _read_gateway_line(log: Path, process: subprocess.Popen, deadline: float) -> tuple[int, str]:
    """py4j prints its port and auth token on its first two lines of output."""
    while True:
        lines = log.read_text(errors="replace").splitlines()
        if len(lines) >= 2 and lines[0].strip().isdigit():
            return int(lines[0]), lines[1].strip()
        if process.poll() is not None:
            raise RuntimeError(f"the YARN minicluster JVM exited ({process.returncode}): {''.join(lines)[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the YARN minicluster JVM printed no gateway port; see {log}")
        time.sleep(0.1)


def _start_clusters(gateway: Any, work: Path, conf_dir: Path, log_retain_s: int) -> tuple[str, str, str, Any, Any]:
    jvm = gateway.jvm
    conf = jvm.org.apache.hadoop.yarn.conf.YarnConfiguration()
    for key, value in SETTINGS.items():
        conf.set(key, value)
    # Containers' logs (under nm_dir) are deleted this long after their application ends; a
    # stopping NodeManager waits up to 10 s for deletions still pending.
    conf.set("yarn.nodemanager.log.retain-seconds", str(log_retain_s))
    conf.set("hdfs.minidfs.basedir", str(work / "dfs"))
    dfs = jvm.org.apache.hadoop.hdfs.MiniDFSCluster.Builder(conf).numDataNodes(1).format(True).build()
    dfs.waitActive()
    hdfs_uri = f"hdfs://127.0.0.1:{dfs.getNameNodePort()}"
    conf.set("fs.defaultFS", hdfs_uri)
    yarn = jvm.org.apache.hadoop.yarn.server.MiniYARNCluster(_NAME, 1, 1, 1)
    yarn.init(conf)
    yarn.start()
    yarn.waitForNodeManagersToConnect(60_000)
    started = yarn.getConfig()
    # MiniYARNCluster names its servers "localhost:<port>"; they listen on 127.0.0.1 (bind-host).
    client = {key: started.get(key).replace("localhost:", "127.0.0.1:") for key in _CLIENT_KEYS}
    rm_address = client["yarn.resourcemanager.address"]
    rm_web = "http://" + client["yarn.resourcemanager.webapp.address"]
    _site(conf_dir / "core-site.xml", {"fs.defaultFS": hdfs_uri})
    _site(conf_dir / "hdfs-site.xml", {"dfs.client.use.datanode.hostname": "false"})
    _site(conf_dir / "yarn-site.xml", client)
    return hdfs_uri, rm_address, rm_web, dfs, yarn


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def processes_under(work: Path, exclude: set[int] | None = None) -> list[tuple[int, list[str]]]:
    """Live processes whose working directory or command line is under ``work``, except
    ``exclude`` and this process and its ancestors."""
    roots = (str(work), os.path.realpath(work))
    skip = set(exclude or ())
    pid = os.getpid()
    while pid > 1:  # this process and its ancestors
        skip.add(pid)
        try:
            pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                cwd = ""
        except (OSError, IndexError):
            continue
        if _under(cwd, roots) or any(root in arg for arg in cmdline for root in roots):
            found.append((int(entry.name), cmdline))
    return found


def container_processes(yarn: Yarn, *, jvm_only: bool = True) -> list[tuple[int, list[str]]]:
    """Processes the NodeManager launched (their working directory or command line is under its
    directories): the containers' JVMs, or with ``jvm_only=False`` also their ``bash`` launchers
    and Python workers. See :func:`role`."""
    found = [(pid, cmd) for pid, cmd in processes_under(yarn.nm_dir, exclude={yarn.process.pid})]
    if jvm_only:
        found = [(pid, cmd) for pid, cmd in found if cmd and os.path.basename(cmd[0]) == "java"]
    return found


def role(cmdline: list[str]) -> str | None:
    """"driver" (Spark's ApplicationMaster, which runs the driver in cluster mode), "executor", or
    None for another process."""
    if AM_CLASS in cmdline:
        return "driver"
    if EXECUTOR_CLASS in cmdline:
        return "executor"
    return None


def applications(yarn: Yarn, tag: str | None = None) -> list[dict[str, Any]]:
    """The ResourceManager's applications (``/ws/v1/cluster/apps``), those tagged ``tag`` if given
    (YARN keeps tags lower-case)."""
    query = "" if tag is None else "?" + urllib.parse.urlencode({"applicationTags": tag})
    with urllib.request.urlopen(f"{yarn.rm_web}/ws/v1/cluster/apps{query}", timeout=30) as response:
        apps = (json.load(response).get("apps") or {}).get("app") or []
    return list(apps)


def _rest(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.load(response)


def application_documents(yarn: Yarn, application: str) -> dict[str, str]:
    """What the REST APIs say of ``application`` (URL -> body): the ResourceManager's application,
    its attempts and their containers, and each NodeManager's view of the application and of the
    containers it runs (their launch details as YARN shows them)."""
    rm = f"{yarn.rm_web}/ws/v1/cluster/apps/{application}"
    urls = [rm, f"{rm}/appattempts"]
    attempts = ((_rest(f"{rm}/appattempts").get("appAttempts") or {}).get("appAttempt")) or []
    urls += [f"{rm}/appattempts/{attempt['appAttemptId']}/containers" for attempt in attempts]
    nodes = ((_rest(f"{yarn.rm_web}/ws/v1/cluster/nodes").get("nodes") or {}).get("node")) or []
    for node in nodes:
        web = "http://" + node["nodeHTTPAddress"].replace("localhost:", "127.0.0.1:")
        urls += [f"{web}/ws/v1/node/apps/{application}", f"{web}/ws/v1/node/containers"]
    documents = {}
    for url in urls:
        with urllib.request.urlopen(url, timeout=30) as response:
            documents[url] = response.read().decode(errors="replace")
    return documents


def submit_env(yarn: Yarn, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of ``spark-submit`` for this cluster."""
    home = spark_home()
    lib = home / "python" / "lib"
    archives = ",".join(f"local:{zip_}" for zip_ in sorted(lib.glob("*.zip")))
    return dict(base if base is not None else os.environ, HADOOP_CONF_DIR=str(yarn.conf_dir),
                YARN_CONF_DIR=str(yarn.conf_dir), SPARK_HOME=str(home), JAVA_HOME=java_home(),
                SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
                # pyspark.zip and py4j's zip used where they are, not uploaded per submission.
                PYSPARK_ARCHIVES_PATH=archives)


def spark_submit_conf(yarn: Yarn, python: str | None = None, pythonpath: str | None = None) -> dict[str, str]:
    """``--conf`` settings of a cluster-mode submission here: pyspark's jars in place (not zipped
    and uploaded), the driver and executors on ``python`` (default: this interpreter) with
    ``pythonpath`` (default: this repository) importable, bound to 127.0.0.1, small memory, two
    executors. ``spark.yarn.maxAppAttempts`` is the caller's."""
    python = python or sys.executable
    pythonpath = pythonpath or str(Path(__file__).resolve().parents[1])
    conf = {"spark.yarn.jars": f"local:{spark_home() / 'jars'}/*",
            "spark.driver.memory": "512m", "spark.executor.memory": "512m",
            "spark.driver.memoryOverhead": "384m", "spark.executor.memoryOverhead": "384m",
            "spark.executor.instances": "2", "spark.executor.cores": "1", "spark.driver.cores": "1",
            "spark.ui.enabled": "false", "spark.yarn.submit.waitAppCompletion": "true",
            "spark.yarn.report.interval": "500"}
    for prefix in ("spark.yarn.appMasterEnv.", "spark.executorEnv."):
        conf.update({prefix + "PYSPARK_PYTHON": python, prefix + "PYTHONPATH": pythonpath,
                     prefix + "SPARK_LOCAL_IP": "127.0.0.1", prefix + "JAVA_HOME": java_home()})
    return conf


def spark_submit_command(yarn: Yarn, app: str | os.PathLike[str], *args: str, conf: dict[str, str] | None = None,
                         deploy_mode: str = "cluster") -> list[str]:
    """pyspark's ``bin/spark-submit --master yarn`` of the Python file ``app`` with
    :func:`spark_submit_conf` (updated by ``conf``)."""
    settings = {**spark_submit_conf(yarn), **(conf or {})}
    return [str(spark_home() / "bin" / "spark-submit"), "--master", "yarn", "--deploy-mode", deploy_mode,
            *(arg for key, value in settings.items() for arg in ("--conf", f"{key}={value}")), str(app), *args]


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _kill_leftovers(work: Path, known: set[int]) -> None:
    """SIGTERM, then SIGKILL, every process under ``work`` and every pid of ``known`` still alive
    (a process that is exiting may no longer show its working directory), until none is left."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        left = {pid for pid in known if alive(pid)} | {pid for pid, _cmd in processes_under(work)}
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and (any(alive(pid) for pid in left) or processes_under(work)):
            time.sleep(0.1)


@contextmanager
def yarn_minicluster(work: Path, *, timeout_s: float = 240.0, log_retain_s: int = 0) -> Iterator[Yarn]:
    """MiniDFSCluster and MiniYARNCluster (one NodeManager) in one JVM with everything under
    ``work``. ``log_retain_s``: how long the containers' logs (stdout, stderr of drivers and
    executors, under ``nm_dir``) stay after their application ends; the default 0 lets the cluster
    stop in about 2 s instead of 12 s, more keeps them to read while the cluster runs. On exit both are stopped (the NodeManager kills its containers), then the JVM's
    process group, then any process still running under ``work`` (containers run in sessions of
    their own)."""
    import pyspark
    from py4j.java_gateway import GatewayParameters, JavaGateway
    from py4j.protocol import Py4JJavaError

    jars = [*minicluster_jars(), *maven_jars(_BOUNCY_CASTLE, cache_dir("yarn-minicluster"))]
    home = java_home()
    classpath = os.pathsep.join([*map(str, jars), str(Path(pyspark.__file__).parent / "jars" / "*")])
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    conf_dir, log = work / "conf", work / "minicluster.log"
    conf_dir.mkdir(exist_ok=True)
    cmd = [str(Path(home) / "bin" / "java"), *_JAVA_OPTS, f"-Dtest.build.data={work / 'data'}",
           f"-Dhadoop.log.dir={work / 'logs'}", "-cp", classpath, "py4j.GatewayServer", "--die-on-broken-pipe",
           "--enable-auth", "0"]
    env = dict(os.environ, JAVA_HOME=home)
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.PIPE, cwd=work,
                                   env=env, start_new_session=True)
    gateway, containers = None, set()
    try:
        deadline = time.monotonic() + timeout_s
        port, token = _read_gateway_line(log, process, deadline)
        gateway = JavaGateway(gateway_parameters=GatewayParameters(port=port, auth_token=token, auto_convert=True,
                                                                   read_timeout=timeout_s))
        try:
            hdfs_uri, rm_address, rm_web, dfs, yarn_cluster = _start_clusters(gateway, work, conf_dir, log_retain_s)
        except Py4JJavaError as exc:  # its str() needs the gateway, closed below
            trace = gateway.jvm.org.apache.hadoop.util.StringUtils.stringifyException(exc.java_exception)
            raise RuntimeError(f"the YARN minicluster did not start: {trace[:4000]}; see {log}") from None
        yarn = Yarn(hdfs_uri, conf_dir, rm_web, rm_address, process, log, work, work / "data" / _NAME, gateway)
        try:
            yield yarn
        finally:
            containers.update(pid for pid, _cmd in container_processes(yarn, jvm_only=False))
            try:  # the NodeManager stops its containers; then the RM, then HDFS
                yarn_cluster.stop()
                dfs.shutdown()
            except Exception:  # noqa: BLE001 - the process group and the sweep below still run
                pass
    finally:
        if gateway is not None:
            gateway.close()
        stop_group(process.pid, timeout_s=15, reap=process.poll)
        if process.stdin:
            process.stdin.close()
        process.wait()
        _kill_leftovers(work, containers)


def _filesystem(yarn: Yarn, path: str) -> tuple[Any, Any]:
    jvm = yarn.gateway.jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    conf = jvm.org.apache.hadoop.conf.Configuration()
    conf.set("fs.defaultFS", yarn.hdfs_uri)
    return hadoop_path.getFileSystem(conf), hadoop_path


def write_file(yarn: Yarn, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` (absolute, or an ``hdfs://`` URI) on the cluster's HDFS."""
    fs, hadoop_path = _filesystem(yarn, path)
    out = fs.create(hadoop_path, True)
    out.write(bytearray(data))
    out.close()


def read_file(yarn: Yarn, path: str) -> bytes:
    """The bytes of the file ``path`` on the cluster's HDFS."""
    fs, hadoop_path = _filesystem(yarn, path)
    jvm = yarn.gateway.jvm
    out = jvm.java.io.ByteArrayOutputStream()
    jvm.org.apache.hadoop.io.IOUtils.copyBytes(fs.open(hadoop_path), out, 65536, True)
    return bytes(out.toByteArray())


def list_files(yarn: Yarn, path: str) -> list[str]:
    """Names of the entries of the directory ``path`` on the cluster's HDFS."""
    fs, hadoop_path = _filesystem(yarn, path)
    return sorted(status.getPath().getName() for status in fs.listStatus(hadoop_path))
