"""A local session's Python workers import pyspark's compiled modules, not Spark's zip of them
(spark/worker_python.py): the ``pravega-spark-python`` launcher drops the installed pyspark's own
zip from ``PYTHONPATH`` and becomes this interpreter. Real PySpark in local mode, the installed
console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from airflow_provider_pravega.spark import worker_python as launcher
from airflow_provider_pravega.spark.worker_python import SCRIPT, without_installed_pyspark_zip, worker_python

PYSPARK_HOME = Path(pyspark.__file__).resolve().parent
OWN_ZIP = str(PYSPARK_HOME / "python" / "lib" / "pyspark.zip")
PY4J_ZIP = next(str(p) for p in (PYSPARK_HOME / "python" / "lib").glob("py4j-*.zip"))
INSTALLED = [p for p in sys.path if p and not p.endswith(".zip")]


def test_the_session_s_python_workers_import_the_installed_pyspark(spark) -> None:
    """Without the launcher, the worker's pyspark comes from the zip that Spark puts first on its path."""
    def where(_):
        import sys as worker_sys

        import pyspark as worker_pyspark

        yield (worker_pyspark.__file__, worker_sys.executable, [p for p in worker_sys.path if p.endswith(".zip")])

    assert os.environ["PYSPARK_PYTHON"] == worker_python()
    [(module, executable, zips)] = spark.sparkContext.parallelize([0], 1).mapPartitions(where).collect()
    assert ".zip" not in module and Path(module).resolve().parent == PYSPARK_HOME
    assert OWN_ZIP not in zips and PY4J_ZIP in zips  # only pyspark's own zip goes
    assert executable == sys.executable


def test_the_console_script_is_this_interpreter_s() -> None:
    script = Path(worker_python())
    assert script.name == SCRIPT, "pip install -e . (scripts/bootstrap.sh) installs the launcher beside python"
    code = "import os, sys, pyspark; print(sys.executable); print(os.environ['PYTHONPATH']); print(pyspark.__file__)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([OWN_ZIP, PY4J_ZIP, "/elsewhere"])}
    out = subprocess.run([str(script), "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    executable, pythonpath, module = out.splitlines()
    assert executable == sys.executable
    assert pythonpath == os.pathsep.join([PY4J_ZIP, "/elsewhere"])
    assert Path(module).resolve().parent == PYSPARK_HOME


def test_only_the_installed_pyspark_s_own_zip_is_dropped(tmp_path: Path) -> None:
    other = str(tmp_path / "spark-4.2.0-bin" / "python" / "lib" / "pyspark.zip")  # a Spark distribution's
    joined = os.pathsep.join
    assert without_installed_pyspark_zip(joined([OWN_ZIP, PY4J_ZIP]), INSTALLED) == PY4J_ZIP
    assert without_installed_pyspark_zip(joined([other, PY4J_ZIP]), INSTALLED) == joined([other, PY4J_ZIP])
    assert without_installed_pyspark_zip(joined(["/a", "/b"]), INSTALLED) == joined(["/a", "/b"])
    assert without_installed_pyspark_zip("", INSTALLED) == ""
    # No pyspark installed where the interpreter looks (pyspark-client, or a worker host with only
    # Spark's zip): the zip is the only pyspark, so it stays.
    assert without_installed_pyspark_zip(OWN_ZIP, [str(tmp_path)]) == OWN_ZIP


@pytest.mark.parametrize("shebang, expected", [
    (f"#!{sys.executable}\n", "script"),
    ("#!{linked}/{name}\n", "script"),  # through a link to its directory (a checkout reached by a symlink)
    ("#!/usr/bin/python3\n", "interpreter"),  # installed for another interpreter
    ("#!/bin/sh\n'''exec' /x/python \"$0\" \"$@\"\n", "interpreter"),  # pip's form for long paths
    (None, "interpreter"),  # not installed (a source checkout on PYTHONPATH)
])
def test_the_launcher_is_used_only_when_it_runs_this_interpreter(tmp_path: Path, monkeypatch, shebang,
                                                                  expected) -> None:
    monkeypatch.setattr(launcher.sysconfig, "get_path", lambda name: str(tmp_path))
    (tmp_path / "linked").symlink_to(Path(sys.executable).parent)
    if shebang is not None:
        shebang = shebang.format(linked=tmp_path / "linked", name=Path(sys.executable).name)
        script = tmp_path / SCRIPT
        script.write_text(shebang + "import sys\n")
        script.chmod(0o755)
    assert worker_python() == (str(tmp_path / SCRIPT) if expected == "script" else sys.executable)
