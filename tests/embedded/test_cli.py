"""``python -m airflow_provider_pravega.embedded``: ready line, clean stop, clear errors."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time

import pytest
from hang_guard import HANG_GUARD_S
from unwritable import unwritable

from airflow_provider_pravega.embedded.process import EmbeddedPravegaProcess, EmbeddedProcessError

CMD = [sys.executable, "-m", "airflow_provider_pravega.embedded"]


def test_ready_line_names_both_endpoints_and_sigterm_stops_cleanly(tmp_path):
    proc = subprocess.Popen(CMD + ["--data-dir", str(tmp_path), "--port", "0", "--segment-store-port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"controller tcp://127\.0\.0\.1:(\d+) segment-store 127\.0\.0\.1:(\d+)", line)
        assert m, line
        for port in m.groups():
            socket.create_connection(("127.0.0.1", int(port)), timeout=2).close()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert "stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("args, message", [
    (["--port", "70000"], "port out of range"),
    (["--port", "abc"], "not a port number"),
])
def test_bad_arguments_are_named(tmp_path, args, message):
    started = time.monotonic()
    r = subprocess.run(CMD + ["--data-dir", str(tmp_path)] + args, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and message in r.stderr
    assert time.monotonic() - started < HANG_GUARD_S


def test_port_in_use_and_locked_data_dir_fail_fast(tmp_path):
    with EmbeddedPravegaProcess(tmp_path / "a") as first:
        busy = first.segment_store_endpoint.rsplit(":", 1)[1]
        r = subprocess.run(CMD + ["--data-dir", str(tmp_path / "b"), "--port", "0", "--segment-store-port", busy],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and f"127.0.0.1:{busy}" in r.stderr
        with pytest.raises(EmbeddedProcessError, match="in use by another embedded server"):
            EmbeddedPravegaProcess(tmp_path / "a", startup_timeout_s=20).start()


def _second_server(args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a second server that must refuse to start; if it starts anyway, stop it and fail."""
    proc = subprocess.Popen(CMD + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the second server started on a taken port: {out.strip()!r}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _scope_exists(uri: str, scope: str) -> bool:
    """One fresh TCP connection to the controller (its own subchannel pool, no shared connection)."""
    import grpc

    from airflow_provider_pravega.protocol import controller_pb2 as pb
    from airflow_provider_pravega.protocol import controller_pb2_grpc as pb_grpc

    with grpc.insecure_channel(uri.split("://", 1)[1], options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        return pb_grpc.ControllerServiceStub(ch).checkScopeExists(pb.ScopeInfo(scope=scope), timeout=10).exists


def test_second_server_on_a_taken_controller_port_is_refused_and_the_first_keeps_its_clients(tmp_path):
    """Issue #22 item 3: gRPC's default SO_REUSEPORT let a second server bind the same controller
    port and the kernel split new clients between the two."""
    with EmbeddedPravegaProcess(tmp_path / "a") as first:
        from airflow_provider_pravega.client.controller import ControllerClient

        with ControllerClient(first.controller_uri) as c:
            assert c.create_scope("only-on-the-first")
        port = first.controller_uri.rsplit(":", 1)[1]
        r = _second_server(["--data-dir", str(tmp_path / "b"), "--port", port, "--segment-store-port", "0"])
        assert r.returncode == 2, r
        assert "ready" not in r.stdout
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("pravega-embedded: "), r.stderr
        assert f"127.0.0.1:{port}" in lines[0] and "already in use" in lines[0]
        # Every fresh client still reaches the first server.
        assert all(_scope_exists(first.controller_uri, "only-on-the-first") for _ in range(20))
        # The same for its segment-store port (asyncio never sets SO_REUSEPORT): one line, non-zero.
        busy = first.segment_store_endpoint.rsplit(":", 1)[1]
        r = _second_server(["--data-dir", str(tmp_path / "c"), "--port", "0", "--segment-store-port", busy])
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("pravega-embedded: "), r.stderr
        assert f"127.0.0.1:{busy}" in lines[0]
        assert _scope_exists(first.controller_uri, "only-on-the-first")


def _refused(data_dir) -> str:
    """Start the server on ``data_dir``; it must exit 2 with one ``pravega-embedded:`` line."""
    r = _second_server(["--data-dir", str(data_dir), "--port", "0", "--segment-store-port", "0"])
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("pravega-embedded: "), r.stderr
    assert str(data_dir) in lines[0]
    return lines[0]


def test_data_dir_that_is_a_file_or_cannot_be_created_is_one_line(tmp_path):
    """Issue #22 item 7: these were raw FileExistsError / NotADirectoryError tracebacks."""
    (tmp_path / "f").write_text("x")
    assert "is not a directory" in _refused(tmp_path / "f")
    assert "cannot create data directory" in _refused(tmp_path / "f" / "sub" / "data")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "controller").write_text("x")  # where the controller keeps its metadata directory
    line = _refused(tmp_path / "d")
    assert str(tmp_path / "d" / "controller") in line and "a file is in the way" in line


def test_data_dir_that_is_not_writable_is_one_line(tmp_path):
    """Issue #22 item 7: PermissionError ... LOCK was a raw traceback."""
    (tmp_path / "ro").mkdir()
    with unwritable(tmp_path / "ro"):
        line = _refused(tmp_path / "ro")
        assert "is not writable" in line and str(tmp_path / "ro" / "LOCK") in line
        line = _refused(tmp_path / "ro" / "new" / "data")
        assert "cannot create data directory" in line and str(tmp_path / "ro" / "new") in line
