"""Smoke test of the real Pravega standalone backend with the official `pravega` client.

Why: before the suite trusts standalone as its reference backend, prove that it starts on loopback
within its memory bounds and that the official client does everything the project relies on
against it: scopes, streams with several segments, routed events, transactions, reader groups and
byte streams. Skipped (with the reason) when Java 17 or Maven cannot provide Pravega here. The
pure helpers of the script (Maven version mediation, loopback shim, listener discovery) are tested
without Pravega, so they run everywhere.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections import defaultdict

import pytest
from pravega_clients import require_official_client

from .standalone import PravegaStandalone, script, standalone_available

# Generous: the JVM gets -Xmx768m and 256 MiB of direct memory; RSS beyond this means the bounds
# are not working and the backend would crowd Spark and the tests on a 2-core, 24 GiB machine.
RSS_LIMIT_KIB = 1_400_000


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    require_official_client()
    ok, reason = standalone_available()
    if not ok:
        pytest.skip(reason)
    backend = PravegaStandalone(work_dir=tmp_path_factory.mktemp("pravega-standalone"))
    backend.start()
    print(f"\nPravega standalone ready in {backend.ready_seconds}s at {backend.controller_uri}, "
          f"RSS {backend.rss_kib()} KiB (logs: {backend.log_path()})")
    try:
        yield backend
    finally:
        print(f"\nPravega standalone RSS before stop: {backend.rss_kib()} KiB")
        print(backend.stop())


@pytest.fixture
def manager(standalone):
    import pravega_client

    return pravega_client.StreamManager(standalone.controller_uri)


def _unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


async def _read_events(reader, expected: int, timeout: float) -> list[bytes]:
    """Read slices until `expected` events arrived; a real tail read blocks, hence the deadline."""
    events: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(events) < expected:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            slice_ = await asyncio.wait_for(reader.get_segment_slice_async(), remaining)
        except TimeoutError:
            break
        events.extend(ev.data() for ev in slice_)
        reader.release_segment(slice_)
    return events


def _read_all(manager, scope: str, stream: str, expected: int, timeout: float = 60.0) -> list[bytes]:
    group = manager.create_reader_group(_unique("rg"), scope, stream)
    reader = group.create_reader("reader-1")
    try:
        return asyncio.run(_read_events(reader, expected, timeout))
    finally:
        reader.reader_offline()


@pytest.mark.standalone
def test_listens_on_loopback_only(standalone):
    listening = standalone.listening()
    ports = {port for _addr, port in listening}
    assert standalone.state.ports.controller in ports
    assert standalone.state.ports.segment_store in ports
    wildcard = [(a, p) for a, p in listening if a not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")]
    assert not wildcard, f"Pravega standalone listens beyond loopback: {wildcard}"
    assert standalone.controller_uri.startswith("tcp://127.0.0.1:")


@pytest.mark.standalone
def test_segment_store_hello_overlaps_client_version(standalone):
    host, port = standalone.segment_store_address
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.sendall(struct.pack(">iiii", -127, 8, 15, 5))  # Hello(high 15, low 5) as the Rust client
        code, length = struct.unpack(">ii", conn.recv(8, socket.MSG_WAITALL))
        high, low = struct.unpack(">ii", conn.recv(length, socket.MSG_WAITALL)[:8])
    assert code == -127
    assert low <= 15 <= high, f"server wire versions {low}..{high} exclude the client's 15"


@pytest.mark.standalone
def test_routed_events_round_trip_in_key_order(manager):
    scope, stream = _unique("smoke"), "events"
    assert manager.create_scope(scope)
    assert manager.create_stream(scope, stream, 2)
    writer = manager.create_writer(scope, stream, max_inflight_events=200)
    for i in range(100):
        writer.write_event(f"k{i % 7}:{i}", routing_key=f"k{i % 7}")
    writer.flush()

    events = [e.decode() for e in _read_all(manager, scope, stream, 100)]

    assert sorted(events) == sorted(f"k{i % 7}:{i}" for i in range(100))
    per_key = defaultdict(list)
    for ev in events:
        key, seq = ev.split(":")
        per_key[key].append(int(seq))
    for key, seqs in per_key.items():
        assert seqs == sorted(seqs), f"events of routing key {key} out of order: {seqs}"


@pytest.mark.standalone
def test_committed_transaction_is_read_and_aborted_one_is_not(manager):
    scope, stream = _unique("smoke"), "txns"
    manager.create_scope(scope)
    manager.create_stream(scope, stream, 2)
    txn_writer = manager.create_transaction_writer(scope, stream, 1)

    committed = txn_writer.begin_txn()
    for i in range(20):
        committed.write_event(f"c{i}", routing_key=f"r{i % 3}")
    assert committed.is_open()
    committed.commit()
    assert not committed.is_open()

    aborted = txn_writer.begin_txn()
    assert aborted.get_txn_id() != committed.get_txn_id()
    aborted.write_event("never", routing_key="r0")
    aborted.abort()
    assert not aborted.is_open()

    events = sorted(e.decode() for e in _read_all(manager, scope, stream, 20, timeout=60))
    assert events == sorted(f"c{i}" for i in range(20))


@pytest.mark.standalone
def test_byte_stream_write_seek_read(manager):
    scope, stream = _unique("smoke"), "bytes"
    manager.create_scope(scope)
    manager.create_stream(scope, stream, 1)
    byte_stream = manager.create_byte_stream(scope, stream)
    payload = bytes(range(256)) * 40  # 10 KiB, every byte value
    assert byte_stream.write(payload) == len(payload)
    byte_stream.flush()
    assert byte_stream.current_tail_offset() == len(payload)
    assert byte_stream.current_head_offset() == 0

    byte_stream.seek(0, 0)
    received = bytearray()
    deadline = time.monotonic() + 30
    while len(received) < len(payload) and time.monotonic() < deadline:
        chunk = bytearray(len(payload) - len(received))  # readinto accepts only a bytearray
        received += chunk[: byte_stream.readinto(chunk)]
    assert bytes(received) == payload


@pytest.mark.standalone
def test_resident_memory_stays_bounded(standalone, manager):
    # Runs last in this module (pytest keeps file order): the other tests have loaded the JVM.
    rss = standalone.rss_kib()
    print(f"\nPravega standalone RSS after the smoke tests: {rss} KiB")
    assert rss is not None and rss < RSS_LIMIT_KIB, f"RSS {rss} KiB exceeds {RSS_LIMIT_KIB} KiB"


# ------------------------------------------------------------------------------------------------
# The script's own logic, without Pravega
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "low, high",
    [
        ("2.5.0", "3.21.7"),
        ("31.0.1-android", "31.1-jre"),
        ("30.1-jre", "31.1-jre"),
        ("4.1.68.Final", "4.1.86.Final"),
        ("1.0-rc1", "1.0"),
        ("1.0-SNAPSHOT", "1.0-alpha"),
        ("1.9", "1.10"),
        ("v1-rev20220604-1.32.1", "v1-rev20220608-1.32.1"),
    ],
)
def test_version_order_picks_the_higher(low, high):
    assert script._version_key(low) < script._version_key(high)
    assert max([high, low], key=script._version_key) == high


VERBOSE_TREE = """\
local.x:pravega-standalone-classpath:pom:0.13.0
\\- io.pravega:pravega-standalone:jar:0.13.0:compile
   +- io.pravega:pravega-shared-controller-api:jar:0.13.0:compile
   |  \\- (com.google.protobuf:protobuf-java:jar:3.21.7:compile - omitted for conflict with 2.5.0)
   +- org.apache.hadoop:hadoop-common:jar:3.3.4:compile
   |  \\- com.google.protobuf:protobuf-java:jar:2.5.0:compile
   +- io.netty:netty-transport-native-epoll:jar:linux-x86_64:4.1.63.Final:compile
   +- (io.netty:netty-transport-native-epoll:jar:linux-x86_64:4.1.68.Final:runtime - omitted for conflict with 4.1.63.Final)
   \\- junit:junit:jar:4.13.2:test
"""


def test_tree_parsing_sees_chosen_and_omitted_versions_but_not_test_scope():
    found = script.parse_tree_versions(VERBOSE_TREE)
    assert found[("com.google.protobuf", "protobuf-java")] == {"2.5.0", "3.21.7"}
    assert found[("io.netty", "netty-transport-native-epoll")] == {"4.1.63.Final", "4.1.68.Final"}
    assert ("junit", "junit") not in found
    highest = script.highest_versions(found)
    assert highest[("com.google.protobuf", "protobuf-java")] == "3.21.7"
    assert highest[("io.pravega", "pravega-standalone")] == "0.13.0"


def test_generated_pom_pins_versions_and_excludes_extra_logging_bindings():
    pom = script._pom("0.13.0", {("com.google.protobuf", "protobuf-java"): "3.21.7",
                                 ("io.pravega", "pravega-standalone"): "0.13.0"})
    assert "<dependencyManagement>" in pom
    assert ("<groupId>com.google.protobuf</groupId><artifactId>protobuf-java</artifactId>"
            "<version>3.21.7</version>") in pom
    # the artifact itself is declared once, as the dependency, not managed
    assert pom.count("<artifactId>pravega-standalone</artifactId>") == 1
    assert "<artifactId>slf4j-reload4j</artifactId>" in pom
    # Pravega's own build forces these; 0.13.0 must carry the fix for the protobuf clash
    forced = script.PRAVEGA_FORCED_VERSIONS["0.13.0"]
    assert forced[("com.google.protobuf", "protobuf-java")] == "3.21.7"
    assert forced[("org.bouncycastle", "bcprov-jdk15on")] == "1.70"


def test_config_puts_every_port_and_the_segment_store_on_loopback(tmp_path):
    ports = script.choose_ports()
    assert len({ports.controller, ports.segment_store, ports.zookeeper, ports.rest, ports.admin_gateway}) == 5
    text = script.write_config(tmp_path, ports, cache_mb=64).read_text()
    props = dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert props["singlenode.controller.rpc.port"] == str(ports.controller)
    assert props["singlenode.segmentStore.port"] == str(ports.segment_store)
    assert props["singlenode.zk.port"] == str(ports.zookeeper)
    assert props["singlenode.controller.rest.enable"] == "false"
    assert props["singlenode.admin.gateway.enable"] == "false"
    assert props["pravegaservice.service.listener.host.nameOrIp"] == "127.0.0.1"
    assert props["pravegaservice.service.published.host.nameOrIp"] == "127.0.0.1"
    assert props["pravegaservice.cache.size.max"] == str(64 * 1024 * 1024)


def test_java_command_bounds_memory(tmp_path):
    cmd = script.java_command("java", "a.jar", tmp_path, tmp_path / "c.properties", tmp_path / "l.xml",
                              heap_mb=512, direct_mb=128)
    assert "-Xmx512m" in cmd and "-XX:MaxDirectMemorySize=128m" in cmd
    assert cmd[-1] == script.MAIN_CLASS
    assert f"-Djava.io.tmpdir={tmp_path / 'tmp'}" in cmd


def test_listening_addresses_reports_this_process_listener():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert ("127.0.0.1", port) in script.listening_addresses(os.getpid())


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler for the bind() shim")
def test_loopback_shim_turns_wildcard_binds_into_loopback(tmp_path):
    shim = script.build_loopback_shim(tmp_path)
    assert shim is not None and shim.exists()
    probe = (
        "import socket\n"
        "a = socket.socket(); a.bind(('0.0.0.0', 0)); a.listen()\n"
        "b = socket.socket(socket.AF_INET6); b.bind(('::', 0)); b.listen()\n"
        "c = socket.create_connection(('127.0.0.1', b.getsockname()[1]), timeout=5)\n"
        "print(a.getsockname()[0], b.getsockname()[0])\n"
    )
    env = dict(os.environ, LD_PRELOAD=str(shim))
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["127.0.0.1", "::ffff:127.0.0.1"]
