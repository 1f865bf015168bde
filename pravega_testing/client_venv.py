"""A venv with the provider's default install only (no extras): pyspark-client, no pyspark jars,
no py4j. It is what an Airflow component or a Spark Connect worker gets from
``pip install airflow-provider-pravega``, and the tests run the operators from it with no Java.

The dependencies are installed once per ``pyproject.toml`` + ``constraints/default.txt`` (a stamp
in the venv); the provider itself is the wheel of this checkout, built and reinstalled on every
call, so the venv always runs the code under test.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "constraints" / "default.txt"


class ClientVenvError(RuntimeError):
    """The default-install venv could not be built (pip's own message included)."""


@dataclass(frozen=True)
class ClientVenv:
    python: Path
    wheel_files: tuple[str, ...]  # the paths inside the installed wheel


def _pip(python: Path, *args: str, timeout: float = 1800) -> None:
    done = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args],
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise ClientVenvError(f"pip {' '.join(args[:3])} ... failed ({done.returncode}):\n"
                              f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")


def default_install_venv(where: Path | None = None) -> ClientVenv:
    """``where`` (default ``<repo>/.venv-default-install``) with the default install of this checkout."""
    import zipfile

    venv = where or REPO / ".venv-default-install"
    python = venv / "bin" / "python"
    stamp = venv / ".deps.sha256"
    want = hashlib.sha256((REPO / "pyproject.toml").read_bytes() + CONSTRAINTS.read_bytes()).hexdigest()
    with tempfile.TemporaryDirectory(prefix="pravega-wheel-") as out:
        built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, str(REPO)],
                               capture_output=True, text=True, timeout=600)
        if built.returncode != 0:
            raise ClientVenvError(f"building the wheel failed:\n{built.stderr[-3000:]}")
        (wheel,) = Path(out).glob("airflow_provider_pravega-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            names = tuple(archive.namelist())
        if not (stamp.is_file() and stamp.read_text() == want and python.is_file()):
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
            _pip(python, "install", "-c", str(CONSTRAINTS), str(wheel))
            stamp.write_text(want)
        else:
            _pip(python, "install", "--no-deps", "--force-reinstall", str(wheel), timeout=300)
    return ClientVenv(python, names)


def without_java(tmp: Path) -> tuple[dict[str, str], Path]:
    """An environment with no ``JAVA_HOME`` whose first ``java`` on ``PATH`` only records that it was
    started (in the returned file) and fails: any JVM start is seen, whatever else is installed."""
    bin_dir = tmp / "no-java-bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    started = tmp / "java-started"
    java = bin_dir / "java"
    java.write_text(f"#!/bin/sh\necho \"$@\" >> '{started}'\nexit 1\n")
    java.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAVA_HOME", "SPARK_HOME", "PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env, started


def helpers_path(tmp: Path) -> str:
    """A ``PYTHONPATH`` entry with only ``pravega_testing`` on it (the repository root would put the
    checkout's ``airflow_provider_pravega`` before the installed wheel)."""
    link_dir = tmp / "helpers-path"
    link_dir.mkdir(parents=True, exist_ok=True)
    link = link_dir / "pravega_testing"
    if not link.exists():
        link.symlink_to(Path(__file__).resolve().parent, target_is_directory=True)
    return str(link_dir)
