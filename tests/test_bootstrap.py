"""scripts/bootstrap.sh changes the system only when asked: Chromium is apt-installed with
``--with-browser`` (or PRAVEGA_BOOTSTRAP_BROWSER=1) only, and scripts/test asks for it, saying so;
a missing JDK compiler or Maven with ``--with-build-tools`` only.

Runs the real script against a venv that is already up to date (its install stamp matches
pyproject.toml), with a recording ``apt-get`` first on PATH, and a Chromium path that does not exist.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_system(tmp_path: Path) -> dict[str, str]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    # The stamp: pyproject.toml, setup.py, the default constraints (constraints/default.txt) and the
    # C source of protocol/ (in the shell's glob order), as installed.
    digest = hashlib.sha256(
        (REPO / "pyproject.toml").read_bytes() + (REPO / "setup.py").read_bytes()
        + (REPO / "constraints" / "default.txt").read_bytes()
        + b"".join(p.read_bytes() for p in sorted((REPO / "airflow_provider_pravega" / "protocol").glob("*.c")))
    ).hexdigest()
    (venv / ".airflow-provider-pravega-install.sha256").write_text(digest + "\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "apt-calls"
    (bin_dir / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "apt-get").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRAVEGA_BOOTSTRAP_")}
    env.update(VENV=str(venv), PATH=f"{bin_dir}:{env['PATH']}", PRAVEGA_UI_CHROMIUM=str(tmp_path / "no-chromium"))
    return env


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def _apt_calls(env: dict[str, str]) -> list[str]:
    calls = Path(env["VENV"]).parent / "apt-calls"
    return calls.read_text().splitlines() if calls.exists() else []


def test_bootstrap_installs_no_browser_unless_asked(fake_system: dict[str, str]) -> None:
    done = _run([str(REPO / "scripts" / "bootstrap.sh")], fake_system)
    assert done.returncode == 0, done.stderr
    assert "up to date" in done.stdout
    assert _apt_calls(fake_system) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="bootstrap installs Chromium only as root")
@pytest.mark.parametrize("how", ["flag", "env"])
def test_bootstrap_installs_the_browser_when_asked(fake_system: dict[str, str], how: str) -> None:
    cmd = [str(REPO / "scripts" / "bootstrap.sh")]
    if how == "flag":
        cmd.append("--with-browser")
    else:
        fake_system["PRAVEGA_BOOTSTRAP_BROWSER"] = "1"
    done = _run(cmd, fake_system)
    assert done.returncode == 0, done.stderr
    assert "installing Debian's 'chromium' package system-wide" in done.stdout
    assert any(call.split()[:1] == ["install"] and "chromium" in call.split() for call in _apt_calls(fake_system))


@pytest.mark.skipif(os.geteuid() != 0, reason="bootstrap apt-installs only as root")
def test_bootstrap_installs_maven_when_asked_and_missing(fake_system: dict[str, str], tmp_path: Path) -> None:
    # A PATH like this machine's without mvn (a fresh machine with only a Java runtime).
    tools = tmp_path / "tools"
    tools.mkdir()
    for directory in fake_system["PATH"].split(":")[1:]:
        for tool in Path(directory).glob("*") if Path(directory).is_dir() else []:
            if tool.name not in ("javac", "mvn", "apt-get") and not (tools / tool.name).exists():
                (tools / tool.name).symlink_to(tool)
    fake_system["PATH"] = f"{fake_system['PATH'].split(':')[0]}:{tools}"
    fake_system.pop("JAVA_HOME", None)
    assert _apt_calls(fake_system) == []
    done = _run([str(REPO / "scripts" / "bootstrap.sh")], fake_system)
    assert done.returncode == 0 and _apt_calls(fake_system) == [], done.stderr  # not asked: nothing
    done = _run([str(REPO / "scripts" / "bootstrap.sh"), "--with-build-tools"], fake_system)
    assert done.returncode == 0, done.stderr
    assert "installing Debian's maven system-wide" in done.stdout
    assert any(c.split()[:1] == ["install"] and "maven" in c.split() and "openjdk-17-jdk-headless" not in c.split()
               for c in _apt_calls(fake_system))


def test_bootstrap_refuses_unknown_arguments(fake_system: dict[str, str]) -> None:
    done = _run([str(REPO / "scripts" / "bootstrap.sh"), "--with-browsr"], fake_system)
    assert done.returncode == 2 and "--with-browsr" in done.stderr
    assert _apt_calls(fake_system) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="bootstrap installs Chromium only as root")
def test_scripts_test_asks_for_the_browser_and_says_so(fake_system: dict[str, str]) -> None:
    # --co of a test file that does not exist: pytest collects nothing; bootstrap ran first.
    done = _run([str(REPO / "scripts" / "test"), "--co", "-q", "tests/test_bootstrap.py::nothing"], fake_system)
    assert "asking bootstrap to install Debian's 'chromium' package" in done.stdout
    assert any("chromium" in call.split() for call in _apt_calls(fake_system))
    fake_system["PRAVEGA_BOOTSTRAP_BROWSER"] = "0"
    Path(fake_system["VENV"]).parent.joinpath("apt-calls").unlink()
    done = _run([str(REPO / "scripts" / "test"), "--co", "-q", "tests/test_bootstrap.py::nothing"], fake_system)
    assert "chromium" not in done.stdout and _apt_calls(fake_system) == []


def test_a_relative_venv_is_taken_from_the_repository_root(fake_system: dict[str, str], tmp_path: Path) -> None:
    # VENV=.venv-3.13 style: relative to the repository, whatever the current directory is.
    fake_system["VENV"] = os.path.relpath(fake_system["VENV"], REPO)
    done = subprocess.run([str(REPO / "scripts" / "bootstrap.sh")], env=fake_system, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"bootstrap: {REPO}/{fake_system['VENV']} is up to date" in done.stdout


def test_bootstrap_accepts_3_11_to_3_13_and_names_them_otherwise(fake_system: dict[str, str]) -> None:
    # A venv of this interpreter (3.11-3.13) is used as it is when PYTHON names the same version.
    fake_system["PYTHON"] = sys.executable
    done = _run([str(REPO / "scripts" / "bootstrap.sh")], fake_system)
    assert done.returncode == 0 and "up to date" in done.stdout, done.stderr
    old = next(iter(sorted(Path("/root/.pyenv/versions").glob("3.10.*/bin/python3.10"))),
               Path("/root/.pyenv/versions/3.9.18/bin/python3.9"))
    if not old.exists():
        pytest.skip("no Python 3.10 or 3.9 here to check the refusal with")
    fake_system["PYTHON"] = str(old)
    done = _run([str(REPO / "scripts" / "bootstrap.sh")], fake_system)
    assert done.returncode == 1
    assert re.search(r"is Python 3\.(10|9)\.\d+, not 3\.11-3\.13", done.stderr), done.stderr
    assert (Path(fake_system["VENV"]) / "bin" / "python").exists()  # refused before touching the venv


def test_an_unknown_constraints_file_is_refused_naming_it(fake_system: dict[str, str]) -> None:
    done = _run([str(REPO / "scripts" / "bootstrap.sh")], {**fake_system, "PRAVEGA_CONSTRAINTS": "constraints/nope.txt"})
    assert done.returncode == 1
    assert f"PRAVEGA_CONSTRAINTS names {REPO}/constraints/nope.txt, which does not exist" in done.stderr


@pytest.mark.parametrize("name", ["default.txt", "lowest.txt", "newest.txt"])
def test_each_constraints_file_pins_a_point_inside_the_supported_ranges(name: str) -> None:
    """The tested stacks stay inside pyproject.toml's ranges (a pin outside would test nothing users get)."""
    import tomllib

    from packaging.requirements import Requirement

    ranges = {}
    for text in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]:
        requirement = Requirement(text)
        ranges[requirement.name] = requirement.specifier
    pins = {}
    for line in (REPO / "constraints" / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            package, version = line.split("==")
            pins[package] = version
    assert {"apache-airflow", "pyspark"} <= pins.keys()
    for package, version in pins.items():
        if package in ranges:
            assert version in ranges[package], f"{name}: {package}=={version} is outside {ranges[package]}"
