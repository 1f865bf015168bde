"""TLS on both endpoints of the embedded server (issue #10, server half).

The official client works over TLS (with and without authentication, see also test_auth.py).
Against a plaintext client or an untrusted CA the official client keeps retrying for about a minute
(it treats a failed connection as transient), so those refusals are checked with a raw gRPC
channel and a raw socket, which see the first failure at once.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import socket
import ssl
import subprocess
import sys
import time

import grpc
import pytest
from hang_guard import HANG_GUARD_S
from cryptography import x509

from airflow_provider_pravega.embedded.process import (
    EmbeddedPravegaProcess,
    EmbeddedProcessError,
)
from airflow_provider_pravega.protocol import controller_pb2 as pb
from airflow_provider_pravega.protocol import controller_pb2_grpc as pb_grpc
from airflow_provider_pravega.protocol import wire
from airflow_provider_pravega.embedded.local_pki import make_test_pki


@pytest.fixture(scope="module")
def tls_only(tmp_path_factory):
    """TLS on, authentication off."""
    from airflow_provider_pravega.embedded.pytest_plugin import _start_secure

    server = _start_secure(tmp_path_factory.mktemp("tls-only"), token_ttl_s=None, tls=True, extra_users=None,
                           auth=False)
    yield server
    server.process.stop()


def _hostport(uri: str) -> tuple[str, int]:
    host, port = uri.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


def test_test_pki_certificates(tmp_path):
    pki = make_test_pki(tmp_path)
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    cert = x509.load_pem_x509_certificate(pki.server_cert.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.issuer == ca.subject
    assert cert.not_valid_after_utc - dt.datetime.now(dt.UTC) <= dt.timedelta(days=1)
    assert oct(pki.server_key.stat().st_mode & 0o777) == "0o600"
    ctx = ssl.create_default_context(cafile=str(pki.ca_cert))  # the chain verifies with the stdlib too
    ctx.load_cert_chain(pki.server_cert, pki.server_key)


def test_official_client_over_tls_without_auth(tls_only, unique_name):
    assert tls_only.controller_uri.startswith("tls://localhost:")  # the official client needs a DNS name
    assert tls_only.segment_store_endpoint.startswith("localhost:")
    scope = unique_name("tls")
    run = tls_only.run_client(f'''
manager.create_scope({scope!r}); manager.create_stream({scope!r}, "s", 2)
w = manager.create_writer({scope!r}, "s")
for i in range(10):
    w.write_event(f"e{{i}}", routing_key=str(i))
w.flush()
tw = manager.create_transaction_writer({scope!r}, "s", 1)
t = tw.begin_txn()
t.write_event("txn"); t.commit()
async def read():
    rg = manager.create_reader_group("rg", {scope!r}, "s")
    r = rg.create_reader("r")
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 11 and time.monotonic() < deadline:
        sl = await asyncio.wait_for(r.get_segment_slice_async(), 10)
        got += [e.data().decode() for e in sl]
        r.release_segment(sl)
    r.reader_offline()
    return got
print(json.dumps(sorted(asyncio.run(read()))))
''', None, timeout_s=90)
    assert run.ok, run.describe()
    assert json.loads(run.stdout.strip().splitlines()[-1]) == sorted([f"e{i}" for i in range(10)] + ["txn"])


def test_plaintext_clients_fail_fast_against_tls(tls_only):
    host, port = _hostport(tls_only.controller_uri)
    started = time.monotonic()
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        with pytest.raises(grpc.RpcError) as failed:
            pb_grpc.ControllerServiceStub(channel).listScopes(
                pb.ScopesRequest(continuationToken=pb.ContinuationToken(token="")), timeout=10)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - started < HANG_GUARD_S  # a hang guard, not a speed target
    # The segment store never answers a plaintext Hello: the TLS layer drops the connection.
    ss_host, ss_port = tls_only.segment_store_endpoint.rsplit(":", 1)
    with socket.create_connection((ss_host, int(ss_port)), timeout=5) as sock:
        sock.sendall(wire.encode(wire.Hello(wire.WIRE_VERSION, wire.OLDEST_COMPATIBLE_VERSION)))
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    try:
        replies = wire.FrameDecoder("reply").feed(received)
    except wire.ProtocolError:
        replies = []  # a TLS alert is not a wire frame
    assert not any(isinstance(r, wire.Hello) for r in replies), received[:64]


def test_untrusted_ca_and_wrong_host_name_fail(tls_only, tmp_path):
    stranger = make_test_pki(tmp_path / "stranger")
    host, port = _hostport(tls_only.controller_uri)
    with grpc.secure_channel(f"{host}:{port}", grpc.ssl_channel_credentials(stranger.ca_cert.read_bytes())) as channel:
        with pytest.raises(grpc.RpcError) as failed:
            pb_grpc.ControllerServiceStub(channel).listScopes(
                pb.ScopesRequest(continuationToken=pb.ContinuationToken(token="")), timeout=10)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    ss_host, ss_port = tls_only.segment_store_endpoint.rsplit(":", 1)
    with socket.create_connection((ss_host, int(ss_port)), timeout=5) as raw:
        with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
            ssl.create_default_context(cafile=str(stranger.ca_cert)).wrap_socket(raw, server_hostname=ss_host)
    with socket.create_connection((ss_host, int(ss_port)), timeout=5) as raw:
        with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch|doesn't match"):
            ssl.create_default_context(cafile=str(tls_only.ca_cert)).wrap_socket(raw, server_hostname="example.com")
    # The right CA and name work on the raw segment-store socket.
    with socket.create_connection((ss_host, int(ss_port)), timeout=5) as raw:
        ctx = ssl.create_default_context(cafile=str(tls_only.ca_cert))
        with ctx.wrap_socket(raw, server_hostname=ss_host) as tls:
            tls.sendall(wire.encode(wire.Hello(wire.WIRE_VERSION, wire.OLDEST_COMPATIBLE_VERSION)))
            decoder, replies = wire.FrameDecoder("reply"), []
            while not replies:
                replies = decoder.feed(tls.recv(65536))
            assert isinstance(replies[0], wire.Hello)


def test_ready_line_says_auth_and_tls(tmp_path):
    pki = make_test_pki(tmp_path / "pki")
    proc = subprocess.Popen(
        [sys.executable, "-m", "airflow_provider_pravega.embedded", "--data-dir", str(tmp_path / "d"), "--port", "0",
         "--segment-store-port", "0", "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert "ready: controller tls://localhost:" in line and "auth off tls on" in line, line


@pytest.mark.parametrize("which", ["missing key", "mismatched key", "not a certificate"])
def test_bad_tls_configuration_fails_at_start(tmp_path, which):
    pki = make_test_pki(tmp_path / "a")
    other = make_test_pki(tmp_path / "b")
    args = {"missing key": ["--tls-cert", str(pki.server_cert)],
            "mismatched key": ["--tls-cert", str(pki.server_cert), "--tls-key", str(other.server_key)],
            "not a certificate": ["--tls-cert", str(pki.server_key), "--tls-key", str(pki.server_key)]}[which]
    done = subprocess.run([sys.executable, "-m", "airflow_provider_pravega.embedded", "--data-dir", str(tmp_path / "d"),
                           "--port", "0", "--segment-store-port", "0", *args],
                          check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    expected = {"missing key": "needs both a certificate and a key", "mismatched key": "cannot be used together",
                "not a certificate": "is not a PEM certificate"}[which]
    assert expected in done.stderr, done.stderr


def test_warns_when_bound_beyond_loopback_without_auth(tmp_path):
    # 192.0.2.1 (TEST-NET-1) is not an address of this machine: the warning comes before the bind
    # fails, so nothing ever listens beyond loopback in this test.
    done = subprocess.run([sys.executable, "-m", "airflow_provider_pravega.embedded", "--data-dir", str(tmp_path / "d"),
                           "--host", "192.0.2.1", "--port", "0", "--segment-store-port", "0"],
                          check=False, capture_output=True, text=True, timeout=60)
    assert "WARNING" in done.stderr and "WITHOUT authentication" in done.stderr and "--auth-file" in done.stderr
    assert done.returncode == 2


def test_process_wrapper_passes_security_options(tmp_path):
    pki = make_test_pki(tmp_path / "pki")
    proc = EmbeddedPravegaProcess(tmp_path / "d", tls_cert=pki.server_cert, tls_key=pki.server_key, token_ttl_s=5)
    cmd = proc.command()
    assert cmd[cmd.index("--tls-cert") + 1] == str(pki.server_cert) and "--token-ttl-s" in cmd
    with pytest.raises(EmbeddedProcessError, match="token signing key file was given without an auth file"):
        EmbeddedPravegaProcess(tmp_path / "e", token_signing_key_file=pki.server_key).start()
