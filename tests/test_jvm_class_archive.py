"""The suite's class archive for Spark JVMs (pravega_testing/jvm_class_archive.py): the JVMs the
tests start really map it, and archives of Spark installs changed or removed since are deleted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pravega_testing import jvm_class_archive


def test_a_spark_session_started_as_the_tests_start_them_maps_the_archive(tmp_path):
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


def _spark_home(root: Path, jars: dict[str, bytes]) -> Path:
    (root / "jars").mkdir(parents=True)
    for name, data in jars.items():
        (root / "jars" / name).write_bytes(data)
    return root


def test_archives_of_spark_installs_changed_or_removed_are_deleted(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    java = jvm_class_archive._java()
    if java is None:
        pytest.skip("no java here")
    directory = jvm_class_archive.cache_dir()
    directory.mkdir(parents=True)
    kept = _spark_home(tmp_path / "kept", {"a.jar": b"a"})
    changed = _spark_home(tmp_path / "changed", {"a.jar": b"a"})
    removed = _spark_home(tmp_path / "removed", {"a.jar": b"a"})
    archives = {}
    for home in (kept, changed, removed):
        archive = directory / f"spark-{jvm_class_archive.archive_key(java, home)}.jsa"
        archive.write_bytes(b"archive")
        archive.with_suffix(".home").write_text(str(home))
        archives[home.name] = archive
    (changed / "jars" / "b.jar").write_bytes(b"b")  # a reinstall with another jar
    (removed / "jars" / "a.jar").unlink()
    (removed / "jars").rmdir()
    removed.rmdir()
    orphan = directory / "spark-0123456789abcdef0123.jsa"  # no .home beside it
    orphan.write_bytes(b"archive")

    jvm_class_archive._remove_stale(directory, java)

    assert archives["kept"].exists() and archives["kept"].with_suffix(".home").exists()
    for name in ("changed", "removed"):
        assert not archives[name].exists() and not archives[name].with_suffix(".home").exists()
    assert not orphan.exists()
    assert archives["kept"].name != f"spark-{jvm_class_archive.archive_key(java, changed)}.jsa"
