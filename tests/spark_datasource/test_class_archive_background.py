"""The class archive made in the background by the task that found none
(airflow_provider_pravega/spark/class_archive.py, ``start_build``): one making for tasks noticing
at once, none started while one runs, a cut archive replaced, a failed making not started again
by every task, and the switch that turns it off. Real processes throughout: the tasks, the
detached making and its JVM; the races are held open by file locks the test holds, and the
making's training job is a JVM's ``-version`` (``build --training``) except in the test that
replaces a cut archive through a real session."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from airflow_provider_pravega.spark import class_archive
from airflow_provider_pravega.spark.session import _JAVA_OPTION_VARIABLES

# A training job of a JVM's own start: a small archive in a second, not Spark's in a minute. It
# first waits for a shared lock on the gate file, which the test holds while a making must run.
_TINY_TRAINING = """
import fcntl, os, shlex, subprocess, sys
with open({gate!r}) as gate:
    fcntl.flock(gate, fcntl.LOCK_SH)
done = subprocess.run([{java!r}, *shlex.split(os.environ["SPARK_SUBMIT_OPTS"]), "-version"], capture_output=True)
sys.exit(done.returncode)
"""

# A task that notices the archive is missing, once the test lets it (it holds the gate).
_NOTICING_TASK = """
import fcntl, sys
from pathlib import Path
from airflow_provider_pravega.spark import class_archive
gate = open(sys.argv[1])
print("ready", flush=True)
fcntl.flock(gate, fcntl.LOCK_SH)
print("started", class_archive.start_build(Path(sys.argv[2])), flush=True)
"""


@pytest.fixture
def archives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty archive directory of this installation's own, with the making on (``auto``); the
    path its archive would have."""
    if class_archive._java() is None or class_archive._spark_home() is None:
        pytest.skip("no java or no Spark installation with jars here")
    monkeypatch.setenv(class_archive.DIR_VARIABLE, str(tmp_path / "archives"))
    monkeypatch.setenv(class_archive.MODE_VARIABLE, "auto")
    archive = class_archive.archive_path()
    assert archive is not None
    return archive


def _training(tmp_path: Path, gate: Path) -> Path:
    gate.touch()
    script = tmp_path / "train.py"
    script.write_text(_TINY_TRAINING.format(gate=str(gate), java=str(class_archive._java())))
    return script


def _builder_pid(archive: Path) -> int | None:
    """The making's pid, from the first line of its log."""
    try:
        first = class_archive.log_path(archive).read_text().split("\n", 1)[0]
    except OSError:
        return None
    words = first.split()
    return int(words[2].rstrip(",")) if len(words) > 2 and words[1] == "pid" else None


def _stop_making(archive: Path, pid: int | None = None) -> None:
    """End a making left running by a failed test, with its training job and JVM (its own session)."""
    pid = pid or _builder_pid(archive)
    if pid is not None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_for_making(archive: Path, timeout_s: float) -> None:
    """Until no process holds the archive's lock: the making that held it has ended."""
    taken = threading.Event()

    def take() -> None:
        with open(class_archive._lock_path(archive), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            taken.set()

    threading.Thread(target=take, name="wait-for-making", daemon=True).start()
    assert taken.wait(timeout_s), f"the making of {archive} still runs after {timeout_s:.0f} s:\n" + (
        class_archive.log_path(archive).read_text()[-3000:])


def test_two_tasks_noticing_at_once_start_one_making_and_a_third_starts_none_while_it_runs(
        archives: Path, tmp_path: Path) -> None:
    archive = archives
    start_gate, training_gate = tmp_path / "start.gate", tmp_path / "training.gate"
    start_gate.touch()
    training = _training(tmp_path, training_gate)
    builder = None
    with open(start_gate) as start, open(training_gate) as training_held:
        fcntl.flock(start, fcntl.LOCK_EX)
        fcntl.flock(training_held, fcntl.LOCK_EX)
        tasks = [subprocess.Popen([sys.executable, "-c", _NOTICING_TASK, str(start_gate), str(training)],
                                  stdout=subprocess.PIPE, text=True) for _ in range(2)]
        try:
            for task in tasks:
                assert task.stdout.readline() == "ready\n"
            fcntl.flock(start, fcntl.LOCK_UN)  # both go at once
            answers = [task.communicate(timeout=120)[0].split() for task in tasks]
            assert all(task.returncode == 0 for task in tasks) and all(a[:1] == ["started"] for a in answers), answers
            pids = [int(a[1]) for a in answers if a[1] != "None"]
            assert len(pids) == 1, answers
            builder = pids[0]
            # A third task while the making runs (held in its training job by the test's lock).
            assert class_archive.start_build(training) is None
            assert class_archive.java_options() == ""
            os.kill(builder, 0)  # the making still runs: it was not the third task's answer that ended it
            fcntl.flock(training_held, fcntl.LOCK_UN)
            _wait_for_making(archive, 120)
        except BaseException:
            for task in tasks:
                task.kill()
                task.wait()
            _stop_making(archive, builder)
            raise
    assert class_archive.damage(archive, full=True) is None
    made = class_archive.log_path(archive).read_text()
    assert _builder_pid(archive) == builder and f"{archive} (" in made and " made in " in made, made
    assert class_archive.start_build(training) is None  # whole: nothing to make
    assert class_archive.java_options() == f"-XX:SharedArchiveFile={archive} {class_archive.QUIET}"


def test_a_making_that_failed_is_not_started_again_by_every_task_until_build(archives: Path, tmp_path: Path) -> None:
    archive = archives
    failing = tmp_path / "fail.py"
    failing.write_text("import sys\nsys.exit('no JVM here today')\n")
    pid = class_archive.start_build(failing)
    assert pid is not None
    try:
        _wait_for_making(archive, 120)
    except BaseException:
        _stop_making(archive, pid)
        raise
    assert not archive.exists()
    assert "no JVM here today" in class_archive._failed_path(archive).read_text()
    assert "the training job failed (exit 1)" in class_archive.log_path(archive).read_text()
    assert class_archive.start_build(failing) is None
    # `build` itself does not wait for the retry time; one that succeeds clears the failure.
    class_archive.build(training=_training(tmp_path, tmp_path / "open.gate"))
    assert class_archive.damage(archive, full=True) is None and not class_archive._failed_path(archive).exists()


def test_the_switch_manual_maps_but_never_makes_and_off_does_neither(
        archives: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    archive = archives
    monkeypatch.setenv(class_archive.MODE_VARIABLE, "manual")
    assert class_archive.java_options() == ""
    assert not archive.parent.exists()  # no lock, no log: nothing was started
    archive.parent.mkdir()
    archive.write_bytes(b"stands in for an archive")
    class_archive._write_record(archive, archive.with_suffix(".home"), class_archive._spark_home())
    mapped = f"-XX:SharedArchiveFile={archive} {class_archive.QUIET}"
    assert class_archive.java_options() == mapped
    monkeypatch.setenv(class_archive.MODE_VARIABLE, "off")
    assert class_archive.java_options() == ""
    monkeypatch.setenv(class_archive.MODE_VARIABLE, "of")
    archive.unlink()
    with caplog.at_level(logging.WARNING, logger=class_archive.__name__):
        assert class_archive.java_options() == ""
    assert f"{class_archive.MODE_VARIABLE}='of' is none of auto, manual, off: taken as 'manual'" in caplog.text
    assert not class_archive._lock_path(archive).exists()


def test_a_cut_archive_is_refused_and_made_again_in_the_background_by_the_session_that_found_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one real making here: a provider's local session finds this installation's archive cut
    short, starts without it, and starts the making, whose Spark training job replaces it."""
    made = class_archive.archive_path()
    if made is None or not made.is_file():
        pytest.skip("this installation has no class archive (PRAVEGA_TEST_CLASS_ARCHIVE=0?)")
    monkeypatch.setenv(class_archive.DIR_VARIABLE, str(tmp_path / "archives"))
    archive = class_archive.archive_path()
    archive.parent.mkdir()
    with made.open("rb") as whole:
        archive.write_bytes(whole.read(1 << 20))
    shutil.copy(made.with_suffix(".home"), archive.with_suffix(".home"))
    code = ("from airflow_provider_pravega.spark.session import get_spark_session\n"
            "spark = get_spark_session(None, 'cut-archive', **{'spark.master': 'local[1]'})\n"
            "jvm = spark.sparkContext._jvm\n"
            "print('args', list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()))\n"
            "print('rows', spark.range(3).count())\n"
            "spark.stop()\n")
    env = {k: v for k, v in os.environ.items() if k not in _JAVA_OPTION_VARIABLES}
    env[class_archive.MODE_VARIABLE] = "auto"
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                              cwd=str(tmp_path))
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        args = next(line for line in done.stdout.splitlines() if line.startswith("args "))
        assert "rows 3" in done.stdout and "-XX:SharedArchiveFile" not in args, args
        assert (f"not using the class archive {archive}: it is 1048576 bytes where" in done.stdout + done.stderr
                and f"until the making started in the background replaces it (log: {class_archive.log_path(archive)})"
                in done.stdout + done.stderr), done.stderr[-3000:]
        _wait_for_making(archive, class_archive.BACKGROUND_TIMEOUT_S + 120)
    except BaseException:
        _stop_making(archive)
        raise
    assert class_archive.damage(archive, full=True) is None and archive.stat().st_size > 1 << 20
    output = class_archive.log_path(archive).read_text()
    assert f"replacing {archive}: it is 1048576 bytes where" in output and " made in " in output, output
    assert not list(tmp_path.glob("hs_err_pid*.log"))
