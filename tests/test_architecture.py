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
              "_cache": set(), "_clock": set(), "fault_points": set(), "state_admin": {"protocol", "client", "spark", "hooks", "operators"}, "__main__": set()}
    violations = []
    for layer, may in (allowed | shared).items():
        files = sorted((PACKAGE / layer).rglob("*.py")) if (PACKAGE / layer).is_dir() else [PACKAGE / f"{layer}.py"]
        assert files, layer
        for path in files:
            wrong = _imported_parts(path) - may - {layer}
            if wrong:
                violations.append(f"{path.relative_to(REPO)} imports {sorted(wrong)}")
    assert not violations, "\n".join(violations)


#: Where a Pravega transaction may be begun, committed, aborted or renewed: the stage (the driver
#: side in client/ingest.py, the task side in client/task_stage.py) and the transaction manager
#: that implements those calls (client/transactions.py, with its lease keeper).
STAGE_MODULES = ("airflow_provider_pravega/client/ingest.py", "airflow_provider_pravega/client/task_stage.py",
                 "airflow_provider_pravega/client/transactions.py")
TXN_CALLS = ("begin", "commit", "abort", "ping")


def transaction_calls_outside_the_stage(package: Path) -> list[str]:
    """Calls that begin, commit, abort or renew a transaction (the method names of
    TransactionManager, called with a scope and a stream) in a module outside STAGE_MODULES; the
    embedded server implements them and is not a user of the stage."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).as_posix()
        if rel in STAGE_MODULES or rel.startswith("airflow_provider_pravega/embedded/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in TXN_CALLS
                    and len(node.args) + len(node.keywords) >= 2):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_every_exactly_once_write_goes_through_the_one_transactional_stage() -> None:
    """The ingest's write tasks and the data source's batch and streaming writes begin, register,
    keep alive, abort and commit their transactions only through the stage: no other module makes
    one of those calls (so a fix to the stage reaches every path), and each write path uses the
    stage's task side."""
    assert transaction_calls_outside_the_stage(REPO / "airflow_provider_pravega") == []
    for rel, names in (("airflow_provider_pravega/spark/ingest_task.py", {"TaskTransaction"}),
                       ("airflow_provider_pravega/spark/datasource_write.py", {"TaskTransaction"}),
                       ("airflow_provider_pravega/spark/ingest_job.py", {"IngestCoordinator"}),
                       ("airflow_provider_pravega/spark/datasource_write.py", {"IngestCoordinator"})):
        imported = {alias.name for node in ast.walk(ast.parse((REPO / rel).read_text()))
                    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                        "airflow_provider_pravega.client.") for alias in node.names}
        assert names <= imported, f"{rel} imports {sorted(imported)}"


def test_the_stage_check_finds_a_transaction_call_outside_it(tmp_path: Path) -> None:
    package = tmp_path / "airflow_provider_pravega"
    (package / "spark").mkdir(parents=True)
    (package / "spark" / "job.py").write_text(
        "def f(client, txn):\n"
        "    client.transactions.commit('s', 'st', txn)\n"
        "    manager = client.transactions\n"
        "    manager.abort(scope='s', stream='st', txn_id=txn)\n"
        "    conn.abort()\n")  # a connection's abort: no scope, no stream
    (package / "client").mkdir()
    (package / "client" / "task_stage.py").write_text("def g(m):\n    m.begin('s', 'st', 1000)\n")
    assert transaction_calls_outside_the_stage(package) == [
        "airflow_provider_pravega/spark/job.py:2: client.transactions.commit('s', 'st', txn)",
        "airflow_provider_pravega/spark/job.py:4: manager.abort(scope='s', stream='st', txn_id=txn)",
    ]


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


#: Files of the package allowed over MAX_LINES, and why: declarative or generated code.
LONG_FILES_ALLOWED = {
    "airflow_provider_pravega/protocol/wire.py": "the wire codec: one declarative class per command",
    "airflow_provider_pravega/protocol/controller_pb2_grpc.py": "generated by grpcio-tools",
    "airflow_provider_pravega/protocol/controller_pb2.py": "generated by grpcio-tools",
}
MAX_LINES = 1_000


def test_no_module_is_over_the_size_of_one_job() -> None:
    """A file does one job: none is over MAX_LINES lines, but declarative and generated code."""
    long = {p.relative_to(REPO).as_posix(): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert {p: n for p, n in long.items() if p not in LONG_FILES_ALLOWED} == {}


def _runtime_nodes(tree: ast.AST):
    """Every node, but those under ``if TYPE_CHECKING:`` (annotations only, never imported)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at module level or inside functions (not the
    imports for annotations only, under ``if TYPE_CHECKING:``)."""
    root = package.name
    graph: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found = graph.setdefault(module, set())
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith(root + "."))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(root):
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of the import graph (each once, from its smallest module), ignoring a package's
    imports of its own modules (``__init__`` re-exports)."""
    cycles = []
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for dep in sorted(graph[node]):
                if dep == start and len(path) > 1:
                    cycles.append(path)
                elif dep > start and dep not in path and not any(m.startswith(dep + ".") for m in path):
                    stack.append((dep, path + [dep]))
    return [c for c in cycles if not any(c[i + 1].startswith(c[i] + ".") or c[i].startswith(c[i + 1] + ".")
                                         for i in range(len(c) - 1))]


def test_no_import_cycle() -> None:
    assert import_cycles(import_graph(PACKAGE)) == []


def test_the_cycle_check_finds_a_cycle_through_a_function_local_import(tmp_path: Path) -> None:
    package = tmp_path / "airflow_provider_pravega"
    package.mkdir()
    (package / "a.py").write_text("from airflow_provider_pravega.b import x\n")
    (package / "b.py").write_text("def x():\n    from airflow_provider_pravega import a\n")
    (package / "c.py").write_text("import airflow_provider_pravega.a\n")
    # d and e refer to each other, but d to e only in annotations: no cycle.
    (package / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from airflow_provider_pravega.e import y\n")
    (package / "e.py").write_text("from airflow_provider_pravega.d import z\n")
    assert import_cycles(import_graph(package)) == [["airflow_provider_pravega.a", "airflow_provider_pravega.b"]]


def _says_why(line: str) -> bool:
    """Whether a line has a comment that says something: not only a tool's (``type: ignore``,
    ``noqa``, ``pragma``)."""
    if "#" not in line:
        return False
    notes = [note.strip() for note in line.split("#")[1:]]
    return any(note and not note.startswith(("type:", "noqa", "pragma")) for note in notes)


def unexplained_local_imports(package: Path) -> list[str]:
    """The imports inside functions (``path:line``) with no comment saying why they are not at module
    level: on the import's own lines, on the line above it, or above the block of imports it belongs
    to (one comment for imports separated by nothing but blank lines). Generated ``*_pb2*`` modules are left out."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if "_pb2" in path.name:
            continue
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text, str(path))
        block_head: dict[ast.AST, ast.AST] = {}  # an import -> the first import of its block
        for parent in ast.walk(tree):
            for field in ("body", "orelse", "finalbody"):
                statements = getattr(parent, field, None)
                if not isinstance(statements, list):
                    continue
                for before, after in zip(statements, statements[1:]):
                    if isinstance(before, (ast.Import, ast.ImportFrom)) and isinstance(after, (ast.Import, ast.ImportFrom)) \
                            and not any(line.strip() for line in lines[before.end_lineno:after.lineno - 1]):
                        block_head[after] = block_head.get(before, before)

        def explained(node: ast.AST) -> bool:
            own = lines[node.lineno - 1:node.end_lineno]
            above = lines[node.lineno - 2].strip() if node.lineno >= 2 else ""
            return any(_says_why(line) for line in own) or (above.startswith("#") and _says_why(above))

        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and not explained(node) \
                        and not explained(block_head.get(node, node)):
                    found.append(f"{path.relative_to(package.parent).as_posix()}:{node.lineno}")
    return sorted(set(found), key=lambda where: (where.split(":")[0], int(where.split(":")[1])))


def test_every_function_local_import_says_why_it_is_not_at_module_level() -> None:
    """Imports sit at module level, where readers and the checks above see the import graph, unless
    a comment says why one cannot (an optional dependency, pyspark kept out of what the scheduler
    imports, a measured import cost, a cycle)."""
    assert unexplained_local_imports(PACKAGE) == []


def test_the_local_import_check_finds_an_unexplained_import_in_a_function(tmp_path: Path) -> None:
    package = tmp_path / "airflow_provider_pravega"
    package.mkdir()
    (package / "a.py").write_text(
        "import json\n"
        "\n"
        "def bare():\n"
        "    import csv\n"
        "    return csv\n"
        "\n"
        "def explained_above():\n"
        "    # optional: the delta extra\n"
        "    import delta\n"
        "    return delta\n"
        "\n"
        "def explained_on_its_line():\n"
        "    import pyspark  # pyspark: not installed in the Airflow scheduler\n"
        "    return pyspark\n"
        "\n"
        "def a_block_with_one_comment():\n"
        "    # import cost: the DAG file parser imports operators\n"
        "    from x import (\n"
        "        y,\n"
        "    )\n"
        "    import z\n"
        "\n"
        "    from airflow_provider_pravega import b\n"
        "    return y, z, b\n"
        "\n"
        "async def bare_async():\n"
        "    if True:\n"
        "        from decimal import Decimal\n"
        "    return Decimal\n"
        "\n"
        "def only_a_tool_comment():\n"
        "    import ssl  # noqa: F401\n"
        "\n"
        "def a_comment_two_lines_up_is_not_enough():\n"
        "    # optional: something\n"
        "    x = 1\n"
        "    import shlex\n"
        "    return x, shlex\n"
    )
    (package / "controller_pb2.py").write_text("def generated():\n    import grpc\n")
    assert unexplained_local_imports(package) == [
        "airflow_provider_pravega/a.py:4", "airflow_provider_pravega/a.py:28", "airflow_provider_pravega/a.py:32",
        "airflow_provider_pravega/a.py:37",
    ]
