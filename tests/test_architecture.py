"""docs/architecture.md stays true: every file it links exists, and no module imports a layer
its table does not allow."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
PACKAGE = REPO / "airflow_provider_pravega"


def test_every_linked_path_exists() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", DOC.read_text())
    local = [link.split("#", 1)[0] for link in links if not re.match(r"[a-z]+:|#", link)]
    assert len(local) >= 30  # the document links the code it describes
    missing = [link for link in local if not (DOC.parent / link).resolve().exists()]
    assert not missing, f"docs/architecture.md links files that do not exist: {missing}"


def _allowed_imports() -> dict[str, set[str]]:
    """The layer table: first column a layer (`client/`), second the layers it may import."""
    allowed: dict[str, set[str]] = {}
    for line in DOC.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"`[a-z_]+/`", cells[0]):
            layer = cells[0].strip("`/")
            allowed[layer] = {name.strip("/") for name in re.findall(r"`([a-z_]+/?)`", cells[1])} | {layer}
    return allowed


def _imported_parts(path: Path) -> set[str]:
    """Top-level parts of the provider (``client``, ``_streams`` ...) that a module imports."""
    parts = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            pieces = name.split(".")
            if pieces[0] == "airflow_provider_pravega" and len(pieces) > 1:
                parts.add(pieces[1])
    return parts


def test_layers_import_only_what_the_table_allows() -> None:
    allowed = _allowed_imports()
    assert {"protocol", "embedded", "client", "spark", "hooks", "triggers", "sensors", "operators"} <= set(allowed)
    shared = {"_streams": {"client", "protocol"}, "openlineage": {"client", "protocol"},
              "assets": {"protocol", "openlineage"}, "messaging": {"triggers", "assets"},
              "_cache": set(), "fault_points": set(), "state_admin": {"client", "spark", "hooks", "operators"}, "__main__": set()}
    violations = []
    for layer, may in (allowed | shared).items():
        files = sorted((PACKAGE / layer).rglob("*.py")) if (PACKAGE / layer).is_dir() else [PACKAGE / f"{layer}.py"]
        assert files, layer
        for path in files:
            wrong = _imported_parts(path) - may - {layer}
            if wrong:
                violations.append(f"{path.relative_to(REPO)} imports {sorted(wrong)}")
    assert not violations, "\n".join(violations)


def test_every_exactly_once_write_goes_through_the_one_transactional_stage() -> None:
    """The ingest's Spark job and the data source's batch and streaming writes register and commit
    their transactions only through client/ingest.py's stage: no other module commits a Pravega
    transaction or registers one itself (so a fix to the stage reaches every path)."""
    import ast

    package = REPO / "airflow_provider_pravega"
    committers = []
    for path in package.rglob("*.py"):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith("airflow_provider_pravega/embedded/") or rel in (
                "airflow_provider_pravega/client/ingest.py", "airflow_provider_pravega/client/transactions.py",
                "airflow_provider_pravega/client/controller.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "commit"
                    and "session" not in ast.unparse(node.func.value) and "conn" not in ast.unparse(node.func.value)):
                committers.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert committers == []
    stage = {"register_txn", "IngestCoordinator"}
    # The ingest job (its driver in ingest_job.py, its write task in ingest_task.py) and the data source.
    for rels in (("airflow_provider_pravega/spark/ingest_job.py", "airflow_provider_pravega/spark/ingest_task.py"),
                 ("airflow_provider_pravega/spark/datasource_write.py",)):
        imported = {alias.name for rel in rels for node in ast.walk(ast.parse((REPO / rel).read_text()))
                    if isinstance(node, ast.ImportFrom) and node.module == "airflow_provider_pravega.client.ingest"
                    for alias in node.names}
        assert stage <= imported, f"{rels} import {sorted(imported)} from the stage"


#: Words of an environment variable that asks for a fault (split at "_", so DEFAULT is not FAULT).
FAULT_WORDS = {"CRASH", "DELAY", "HOLD", "FAULT", "KILL"}
#: Code that ends its own process, allowed where it is no fault injection (path: why).
SELF_ENDING_ALLOWED = {
    # The epilogue of the official client's script run in a child interpreter: its runtime threads
    # can abort that interpreter while it finalizes, after the work is done.
    "airflow_provider_pravega/embedded/pytest_plugin.py": "os._exit(0) in the official client's child script",
}


def _is_os_call(node: ast.AST, *names: str) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names
            and isinstance(node.func.value, ast.Name) and node.func.value.id in ("os", "signal"))


def fault_injection_in(package: Path) -> list[str]:
    """Where the package's modules name a fault variable or end their own process."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).as_posix()
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            where = f"{rel}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if re.fullmatch(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)+", node.value) and FAULT_WORDS & set(node.value.split("_")):
                    found.append(f"{where}: a fault variable {node.value!r}")
                if "os._exit" in node.value and rel not in SELF_ENDING_ALLOWED:
                    found.append(f"{where}: os._exit in code it runs")
            if _is_os_call(node, "_exit", "abort", "raise_signal"):
                if rel not in SELF_ENDING_ALLOWED:
                    found.append(f"{where}: {ast.unparse(node)}")
            elif _is_os_call(node, "kill", "killpg") and node.args and any(
                    _is_os_call(arg, "getpid", "getpgid", "getpgrp") for arg in ast.walk(node.args[0])):
                found.append(f"{where}: {ast.unparse(node)}")
    return found


def test_no_module_of_the_package_injects_faults() -> None:
    """A deployment's environment cannot end or pause the provider: its fault points
    (fault_points.py) call only a hook the test harness installs (pravega_testing/faults.py)."""
    assert fault_injection_in(PACKAGE) == []


def test_the_fault_check_finds_an_environment_read_and_a_self_kill(tmp_path: Path) -> None:
    module = tmp_path / "airflow_provider_pravega" / "spark" / "job.py"
    module.parent.mkdir(parents=True)
    module.write_text('import os\nSTEP = "PRAVEGA_INGEST_CRASH_AT"\nDEFAULT_PORT = 1\n'
                      'if os.environ.get(STEP) == "x":\n    os.kill(os.getpid(), 9)\nos._exit(137)\n')
    found = fault_injection_in(module.parents[1])
    assert sorted(f.split(": ", 1)[1] for f in found) == [
        "a fault variable 'PRAVEGA_INGEST_CRASH_AT'", "os._exit(137)", "os.kill(os.getpid(), 9)"], found
