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
              "_cache": set(), "state_admin": {"client", "spark", "hooks", "operators"}, "__main__": set()}
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
    for rel in ("airflow_provider_pravega/spark/ingest_job.py", "airflow_provider_pravega/spark/datasource.py"):
        tree = ast.parse((REPO / rel).read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and node.module == "airflow_provider_pravega.client.ingest" for alias in node.names}
        assert stage <= imported, f"{rel} imports {sorted(imported)} from the stage"
