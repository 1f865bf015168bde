"""``python -m airflow_provider_pravega.embedded``: ready line, clean stop, clear errors."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time

import pytest

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
    assert time.monotonic() - started < 10


def test_port_in_use_and_locked_data_dir_fail_fast(tmp_path):
    with EmbeddedPravegaProcess(tmp_path / "a") as first:
        busy = first.segment_store_endpoint.rsplit(":", 1)[1]
        r = subprocess.run(CMD + ["--data-dir", str(tmp_path / "b"), "--port", "0", "--segment-store-port", busy],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and f"127.0.0.1:{busy}" in r.stderr
        with pytest.raises(EmbeddedProcessError, match="in use by another embedded server"):
            EmbeddedPravegaProcess(tmp_path / "a", startup_timeout_s=20).start()
