"""The class archive local Spark sessions start from (airflow_provider_pravega/spark/class_archive.py):
the sessions the provider starts and the JVMs the tests start really map it, a session without
one starts as before, and archives of Spark installations changed or removed are deleted."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from bad_input_doc import check_section

from airflow_provider_pravega.spark import class_archive
from airflow_provider_pravega.spark.session import _JAVA_OPTION_VARIABLES


def test_a_spark_session_started_as_the_tests_start_them_maps_the_archive():
    options = os.environ.get("SPARK_SUBMIT_OPTS", "")
    if "-XX:SharedArchiveFile=" not in options:
        pytest.skip(f"the class archive is off for this run (SPARK_SUBMIT_OPTS={options!r})")
    # -Xshare:on makes a JVM that cannot map the archive (another class path, another JDK) refuse
    # to start, where the suite's -Xshare:auto would go on silently without it.
    script = ("from pyspark.sql import SparkSession\n"
              "s = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false').getOrCreate()\n"
              "print('info', s._jvm.java.lang.System.getProperty('java.vm.info'))\n"
              "print('rows', s.range(5).count())\n"
              "s.stop()\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "SPARK_SUBMIT_OPTS": options + " -Xshare:on"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rows 5" in result.stdout
    assert "sharing" in result.stdout


def test_a_session_the_provider_starts_maps_the_installations_archive(tmp_path):
    """The provider's own local session (no Java options chosen by the task or the environment)
    gets the archive's options with its collector, and its JVM maps the archive: -Xshare:on makes
    a JVM that cannot map it refuse to start."""
    if not class_archive.java_options():
        pytest.skip("this installation has no class archive (PRAVEGA_TEST_CLASS_ARCHIVE=0?)")
    code = (
        "from airflow_provider_pravega.spark.session import get_spark_session\n"
        "spark = get_spark_session(None, 'archive-check', **{'spark.master': 'local[1]'})\n"
        "jvm = spark.sparkContext._jvm\n"
        "print('args', list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()))\n"
        "print('rows', spark.range(3).count())\n"
        "spark.stop()\n")
    env = {k: v for k, v in os.environ.items()
           if k not in _JAVA_OPTION_VARIABLES}
    env["JAVA_TOOL_OPTIONS"] = "-Xshare:on"  # chooses no collector: the provider's defaults still apply
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rows 3" in done.stdout
    args = next(line for line in done.stdout.splitlines() if line.startswith("args "))
    assert f"-XX:SharedArchiveFile={class_archive.archive_path()}" in args and "-XX:+UseParallelGC" in args
    assert "-Xms64m" in args  # the initial heap of LOCAL_JVM_OPTIONS reaches the JVM


def test_without_an_archive_a_session_gets_only_its_collector_and_show_says_how_to_make_one(
        tmp_path, monkeypatch, capsys):
    from airflow_provider_pravega.spark.session import LOCAL_JVM_OPTIONS, local_jvm_options

    monkeypatch.setenv(class_archive.DIR_VARIABLE, str(tmp_path))
    assert class_archive.java_options() == "" and local_jvm_options() == LOCAL_JVM_OPTIONS
    assert class_archive.main(["show"]) == 1
    assert "not made yet" in capsys.readouterr().out
    archive = class_archive.archive_path()
    assert archive is not None and archive.parent == tmp_path
    archive.write_bytes(b"stands in for an archive")
    assert local_jvm_options() == LOCAL_JVM_OPTIONS  # no record of its making: not mapped
    class_archive._write_record(archive, archive.with_suffix(".home"), class_archive._spark_home())
    assert local_jvm_options() == f"{LOCAL_JVM_OPTIONS} -XX:SharedArchiveFile={archive} {class_archive.QUIET}"
    assert class_archive.main(["show"]) == 0
    # Spark's configuration directory leads the driver's class path: another one, another archive.
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "conf"))
    assert class_archive.archive_path() != archive and local_jvm_options() == LOCAL_JVM_OPTIONS


def _spark_home(root: Path, jars: dict[str, bytes]) -> Path:
    (root / "jars").mkdir(parents=True)
    for name, data in jars.items():
        (root / "jars" / name).write_bytes(data)
    return root


def test_archives_of_spark_installs_changed_or_removed_are_deleted(tmp_path, monkeypatch):
    """Only archives whose installation is gone or whose jars changed: the same installation's
    archive for another environment (another SPARK_CONF_DIR) may be in use by another process."""
    monkeypatch.setenv(class_archive.DIR_VARIABLE, str(tmp_path / "cache"))
    java = class_archive._java()
    if java is None:
        pytest.skip("no java here")
    directory = class_archive.cache_dir()
    directory.mkdir(parents=True)
    kept = _spark_home(tmp_path / "kept", {"a.jar": b"a"})
    changed = _spark_home(tmp_path / "changed", {"a.jar": b"a"})
    removed = _spark_home(tmp_path / "removed", {"a.jar": b"a"})

    def archive_of(home: Path) -> Path:
        archive = directory / f"spark-{class_archive.archive_key(java, home)}.jsa"
        archive.write_bytes(b"archive")
        archive.with_suffix(".home").write_text(f"{home}\n{class_archive._jars_digest(home)}\n")
        return archive

    archives = {home.name: archive_of(home) for home in (kept, changed, removed)}
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "conf"))
    other_environment = archive_of(kept)
    assert other_environment != archives["kept"]
    (changed / "jars" / "b.jar").write_bytes(b"b")  # a reinstall with another jar
    (removed / "jars" / "a.jar").unlink()
    (removed / "jars").rmdir()
    removed.rmdir()
    orphan = directory / "spark-0123456789abcdef0123.jsa"  # no .home beside it
    orphan.write_bytes(b"archive")

    class_archive._remove_stale(directory)

    for archive in (archives["kept"], other_environment):
        assert archive.exists() and archive.with_suffix(".home").exists()
    for name in ("changed", "removed"):
        assert not archives[name].exists() and not archives[name].with_suffix(".home").exists()
    assert not orphan.exists()


def test_an_archive_directory_that_cannot_be_written_is_named_at_once(tmp_path, monkeypatch, capsys):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(class_archive.DIR_VARIABLE, str(tmp_path / "a-file" / "archives"))
    if class_archive.archive_path() is None:
        pytest.skip("no java or no Spark installation here")
    with pytest.raises(class_archive.ClassArchiveError, match="cannot write the archive's directory .*a-file"):
        class_archive.build()
    assert class_archive.main(["build"]) == 1
    assert class_archive.DIR_VARIABLE in capsys.readouterr().err


def test_an_archive_cut_short_is_not_mapped_and_build_makes_it_again(tmp_path, monkeypatch, caplog, capsys):
    """An archive copied in part (this installation's first MiB, with the record beside it: an
    interrupted copy into an image) crashes every JVM that maps it (SIGBUS: a JVM does not check an
    archive's size). A session starts without it, with a warning naming it; build replaces it
    instead of reporting it made."""
    from airflow_provider_pravega.spark.session import LOCAL_JVM_OPTIONS, local_jvm_options

    made = class_archive.archive_path()
    if made is None or not made.is_file():
        pytest.skip("this installation has no class archive (PRAVEGA_TEST_CLASS_ARCHIVE=0?)")
    monkeypatch.setenv(class_archive.DIR_VARIABLE, str(tmp_path / "archives"))
    archive = class_archive.archive_path()
    archive.parent.mkdir()
    with made.open("rb") as whole:
        archive.write_bytes(whole.read(1 << 20))
    shutil.copy(made.with_suffix(".home"), archive.with_suffix(".home"))

    with caplog.at_level(logging.WARNING, logger=class_archive.__name__):
        assert local_jvm_options() == LOCAL_JVM_OPTIONS
    warning = caplog.records[-1].getMessage()
    assert warning.startswith(f"not using the class archive {archive}: it is 1048576 bytes where"), warning
    code = ("from airflow_provider_pravega.spark.session import get_spark_session\n"
            "spark = get_spark_session(None, 'cut-archive', **{'spark.master': 'local[1]'})\n"
            "print('rows', spark.range(3).count())\n"
            "spark.stop()\n")
    env = {k: v for k, v in os.environ.items() if k not in _JAVA_OPTION_VARIABLES}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                          cwd=str(tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "rows 3" in done.stdout and f"not using the class archive {archive}" in done.stdout + done.stderr
    assert not list(tmp_path.glob("hs_err_pid*.log"))

    # -Xss1 (a thread stack too small): a training JVM that cannot start, so no archive is made here.
    with pytest.raises(class_archive.ClassArchiveError, match="the training job failed"):
        class_archive.build("-Xss1")
    assert not archive.exists()
    replacing = next(line for line in capsys.readouterr().err.splitlines() if "replacing" in line)
    assert replacing.startswith(f"{class_archive.SCRIPT}: replacing {archive}: it is 1048576 bytes where"), replacing

    def shown(text: str) -> str:
        text = text.replace(str(archive.parent), "/data/archives").replace(archive.stem, "spark-<key>")
        return re.sub(r"where \d+ were written", "where <size> were written", text)

    check_section("class-archive", "The class archive of local Spark sessions",
                  "tests/spark_datasource/test_class_archive.py",
                  [("class archive cut short (an interrupted copy, a full disk), at a local session's start",
                    f"the session starts without it; warning: {shown(warning)}"),
                   ("`pravega-spark-class-archive build` with that archive in place",
                    f"makes it again; stderr: {shown(replacing)}")],
                  "A JVM does not check that a dynamic class archive is whole: one cut short crashes it (SIGBUS) "
                  "as it maps it. `build` records each archive's size and digest beside it; a session maps it only "
                  "at that size (a stat and a small read), `build` checks the digest too.")
