"""Venvs the tests install the provider's wheel into, as users would.

- :func:`default_install_venv`: the default install only (no extras): pyspark-client, no pyspark
  jars, no py4j. It is what an Airflow component or a Spark Connect worker gets from
  ``pip install airflow-provider-pravega``; the tests run the operators from it with no Java.
- :func:`spark_server_venv`: a given pyspark release (e.g. 4.3.0, outside the ``spark`` extra's
  range) with the provider beside it, to run a Spark Connect server of that release whose Python
  workers run the ``pravega`` data source: a cluster on a newer Spark than the worker's client.

Dependencies are installed once per ``pyproject.toml`` + constraints (a stamp in the venv); the
provider itself is the wheel of this checkout, built and reinstalled on every call, so the venv
always runs the code under test.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def constraints_file() -> Path:
    """The tested stack to install: ``$PRAVEGA_CONSTRAINTS`` (scripts/test sets it for each
    interpreter tier), else constraints/default.txt."""
    given = Path(os.environ.get("PRAVEGA_CONSTRAINTS") or "constraints/default.txt")
    return given if given.is_absolute() else REPO / given


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


def default_venv_path() -> Path:
    """One venv per interpreter version and constraints file, beside the project's own venvs."""
    return REPO / f".venv-default-install-{sys.version_info[0]}.{sys.version_info[1]}-{constraints_file().stem}"


def default_install_venv(where: Path | None = None) -> ClientVenv:
    """``where`` (default :func:`default_venv_path`) with the default install of this checkout, on
    this interpreter's version, pinned by :func:`constraints_file`. Safe to call from several
    processes at once (a lock file beside the venv)."""
    constraints = constraints_file()
    deps = hashlib.sha256((REPO / "pyproject.toml").read_bytes() + constraints.read_bytes()).hexdigest()
    return _venv_with_wheel(where or default_venv_path(), deps, ("-c", str(constraints)))


#: What the provider's code needs in a Spark Connect server's Python workers (the data source).
SERVER_WORKER_REQUIREMENTS = (
    "pyarrow>=15", "pandas>=2.2,<3", "grpcio>=1.85.1", "protobuf>=7.35.1,<8", "PyYAML>=6", "msgspec>=0.18")


def spark_server_venv(pyspark_version: str, where: Path | None = None) -> ClientVenv:
    """A venv with ``pyspark==pyspark_version`` and this checkout's wheel (installed without its
    dependencies: its pyspark range may not include that release)."""
    venv = where or REPO / f".venv-spark-server-{pyspark_version}-{sys.version_info[0]}.{sys.version_info[1]}"
    deps = hashlib.sha256(f"{pyspark_version} {SERVER_WORKER_REQUIREMENTS}".encode()).hexdigest()
    return _venv_with_wheel(venv, deps, (f"pyspark=={pyspark_version}", *SERVER_WORKER_REQUIREMENTS), no_deps=True)


def _venv_with_wheel(venv: Path, deps: str, install_args: tuple[str, ...], no_deps: bool = False) -> ClientVenv:
    """``venv`` with its dependencies (installed again when ``deps`` changes) and this checkout's
    wheel (installed again when the package's sources change), under a lock per venv."""
    import fcntl

    venv.parent.mkdir(parents=True, exist_ok=True)
    python = venv / "bin" / "python"
    deps_stamp, wheel_stamp, listing = venv / ".deps.sha256", venv / ".wheel.sha256", venv / ".wheel-files.json"
    with open(f"{venv}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fresh = not (deps_stamp.is_file() and deps_stamp.read_text() == deps and python.is_file())
        if fresh:
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        sources = _sources_digest()
        if fresh or not (wheel_stamp.is_file() and wheel_stamp.read_text() == sources and listing.is_file()):
            with tempfile.TemporaryDirectory(prefix="pravega-wheel-") as out:
                wheel = _build_wheel(Path(out))
                if fresh and not no_deps:
                    _pip(python, "install", *install_args, str(wheel))
                else:
                    if fresh:
                        _pip(python, "install", *install_args)
                    _pip(python, "install", "--no-deps", "--force-reinstall", str(wheel), timeout=300)
                listing.write_text(json.dumps(_wheel_files(wheel)))
            deps_stamp.write_text(deps)
            wheel_stamp.write_text(sources)
        return ClientVenv(python, tuple(json.loads(listing.read_text())))


#: What goes into the wheel: pyproject.toml's packages (the package only) and the readme.
_WHEEL_SOURCES = ("pyproject.toml", "README.md")


def _package_files() -> list[Path]:
    files = [REPO / name for name in _WHEEL_SOURCES]
    files += sorted(p for p in (REPO / "airflow_provider_pravega").rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    return files


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for path in _package_files():
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _build_wheel(out: Path) -> Path:
    """The wheel of a copy of the package's sources: setuptools builds in its source tree
    (``build/``, ``*.egg-info``), so building in the checkout itself could ship files left there
    by an older build, and builds run side by side would share those directories."""
    tree = out / "src"
    for path in _package_files():
        target = tree / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                            str(out), str(tree)], capture_output=True, text=True, timeout=600)
    if built.returncode != 0:
        raise ClientVenvError(f"building the wheel failed:\n{built.stderr[-3000:]}")
    (wheel,) = out.glob("airflow_provider_pravega-*.whl")
    return wheel


def _wheel_files(wheel: Path) -> list[str]:
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


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


def main(argv: list[str] | None = None) -> int:
    """``python -m pravega_testing.venvs``: build (or bring up to date) the venv now, so the
    tests that need it find it ready (scripts/test runs this in the background at its start)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--spark-server", metavar="PYSPARK_VERSION",
                        help="also the Spark Connect server venv of this pyspark release")
    args = parser.parse_args(argv)
    venv = default_install_venv()
    print(f"venvs: {venv.python} has the default install ({constraints_file().name})")
    if args.spark_server:
        server = spark_server_venv(args.spark_server)
        print(f"venvs: {server.python} has pyspark {args.spark_server} and the provider")
    return 0


if __name__ == "__main__":
    sys.exit(main())
