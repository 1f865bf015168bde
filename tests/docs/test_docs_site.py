"""The docs site and the examples in it stay true.

- the site (mkdocs.yml, docs/) builds in strict mode: every relative link and #anchor of docs/,
  README.md and CONTRIBUTING.md resolves, every docstring of the API pages renders;
- the API pages list the provider's public classes and the troubleshooting page names every
  public exception class;
- every ```python and ```yaml block of docs/, README.md and CONTRIBUTING.md is checked: a DAG is
  imported through Airflow's DagBag, other Python is compiled and its imports run, YAML is
  parsed; a block marked ``<!-- run -->`` runs, and one marked ``<!-- run: embedded -->`` runs
  against the test's Pravega server (``tcp://127.0.0.1:9090`` in it becomes the server's URI, and
  the run's SparkSession is ``spark``).
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import pkgutil
import re
import textwrap
from dataclasses import dataclass
from html import unescape
from pathlib import Path

import pytest
import yaml
from docs_generated import check_generated
from docs_site import REPO, build_site

THIS = "tests/docs/test_docs_site.py"
DOCS = REPO / "docs"
PACKAGE = "airflow_provider_pravega"
#: The controller URI the examples are written with; an embedded-marked block gets the test's.
EXAMPLE_URIS = ("tcp://127.0.0.1:9090", "tcp://localhost:9090")


# ------------------------------------------------------------------------------------ the site


@pytest.fixture(scope="module")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    result = build_site(site)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
    return site


def test_site_builds_strictly_with_every_page_of_the_nav(built_site: Path) -> None:
    """Strict mode failed the build on any broken link or anchor, or a page missing from the nav;
    here: every page of the nav was rendered, each with its title."""
    class Loader(yaml.SafeLoader):
        """mkdocs.yml's ``!!python/...`` values (its slug function) are not needed here: None."""

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=Loader)  # noqa: S506 - a SafeLoader

    def pages(nav: list) -> list[str]:
        out: list[str] = []
        for entry in nav:
            for value in entry.values():
                out += pages(value) if isinstance(value, list) else [value]
        return out

    built = {page: built_site / page.replace(".md", ".html") for page in pages(config["nav"])}
    missing = [page for page, html in built.items() if not html.is_file()]
    assert not missing, f"nav pages not built: {missing}"
    untitled = [page for page, html in built.items() if "<h1" not in html.read_text()]
    assert not untitled, f"pages without a '# Title' heading: {untitled}"


def test_api_pages_render_the_docstrings(built_site: Path) -> None:
    """Each class an API page lists is on the built page with its docstring's opening words."""
    missing = []
    for page, directives in api_pages().items():
        html = unescape((built_site / "api" / f"{page}.html").read_text())
        for path in re.findall(r"^::: (\S+)", directives, re.M):
            module, name = path.rsplit(".", 1)
            opening = inspect.getdoc(getattr(importlib.import_module(module), name)).split("`")[0].split("\n")[0]
            if f'id="{path}"' not in html or opening.strip() not in html:
                missing.append(f"{page}: {name} ({opening!r})")
    assert not missing, f"classes or docstrings missing from the built API pages: {missing}"


# ----------------------------------------------------------------- what the pages must list


@functools.lru_cache(maxsize=1)
def public_exceptions() -> dict[str, list[str]]:
    """Module -> public exception classes defined there, for every module of the provider; all
    import without Java."""
    package = importlib.import_module(PACKAGE)
    found: dict[str, list[str]] = {}
    for info in pkgutil.walk_packages(package.__path__, f"{PACKAGE}."):
        if info.name.endswith(".__main__"):
            continue
        module = importlib.import_module(info.name)
        classes = [obj for name, obj in vars(module).items()
                   if inspect.isclass(obj) and issubclass(obj, Exception) and obj.__module__ == module.__name__
                   and not name.startswith("_")]
        if classes:
            found[info.name] = [cls.__name__ for cls in sorted(classes, key=lambda c: inspect.getsourcelines(c)[1])]
    return found


def _lazy_exports(package: str) -> dict[str, str]:
    return importlib.import_module(package)._EXPORTS


def _provider_yaml() -> dict:
    return yaml.safe_load((REPO / PACKAGE / "provider.yaml").read_text())


def _directives(paths: list[str], heading_level: int = 2, kwargs_params: bool = False) -> str:
    """``kwargs_params``: the docstrings document parameters the base class takes through
    ``**kwargs`` (the sensors), which griffe would report as missing from the signature."""
    options = [f"heading_level: {heading_level}"] if heading_level != 2 else []
    options += ["docstring_options: {warnings: false}"] if kwargs_params else []
    block = "".join(f"\n      {option}" for option in options)
    return "\n".join(f"::: {path}\n" + (f"    options:{block}\n" if options else "") for path in paths)


def _not_errors(exports: dict[str, str]) -> list[str]:
    return [f"{module}.{name}" for name, module in sorted(exports.items())
            if not issubclass(getattr(importlib.import_module(module), name), Exception)]


@functools.lru_cache(maxsize=1)
def api_pages() -> dict[str, str]:
    """docs/api/<page>.md -> its generated list of ``::: class`` directives, from where the
    provider names its public classes: the packages' lazy exports and provider.yaml."""
    info = _provider_yaml()
    errors = "\n".join(f"## `{module.removeprefix(PACKAGE + '.')}`\n\n" + _directives(
        [f"{module}.{name}" for name in names], heading_level=3)
        for module, names in sorted(public_exceptions().items()))
    return {
        "operators": _directives(_not_errors(_lazy_exports(f"{PACKAGE}.operators"))),
        "sensors": _directives(_not_errors(_lazy_exports(f"{PACKAGE}.sensors")), kwargs_params=True),
        "triggers": _directives(_not_errors(_lazy_exports(f"{PACKAGE}.triggers")) + list(info["queues"])),
        "hook": _directives([c["hook-class-name"] for c in info["connection-types"]]),
        "errors": errors,
    }


@pytest.mark.parametrize("page", sorted(api_pages()))
def test_api_page_lists_the_public_classes(page: str) -> None:
    check_generated(DOCS / "api" / f"{page}.md", "api-classes", api_pages()[page], THIS)


def datasource_options_table() -> str:
    """docs/datasource.md's options table, from the data source's own option definitions
    (OPTION_SPECS: the same table that checks options at load() and save())."""
    from airflow_provider_pravega.spark.datasource_options import ANY_USE, OPTION_SPECS

    order = ("batch read", "streaming read", "batch write", "streaming write")
    rows = ["| option | applies to | meaning | default |", "|---|---|---|---|"]
    for spec in OPTION_SPECS:
        applies = "any read or write" if spec.applies == ANY_USE else ", ".join(u for u in order if u in spec.applies)
        if spec.needs is not None:
            applies += f" (with `{spec.needs[0]}={spec.needs[1]}`)"
        default = f"`{spec.default}`" if spec.default is not None else "none"
        rows.append(f"| `{spec.name}` | {applies} | {spec.doc.replace('|', chr(92) + '|')} | {default} |")
    return "\n".join(rows)


def test_datasource_options_table_is_the_codes() -> None:
    check_generated(DOCS / "datasource.md", "options-table", datasource_options_table(), THIS)


def test_troubleshooting_names_every_public_exception() -> None:
    page = DOCS / "troubleshooting.md"
    assert page.is_file(), "docs/troubleshooting.md is missing"
    text = page.read_text(encoding="utf-8")
    classes = {name: module for module, names in public_exceptions().items() for name in names}
    assert len(classes) >= 50  # the collection found the provider's errors
    missing = sorted(f"{name} ({module})" for name, module in classes.items()
                     if not re.search(rf"\b{re.escape(name)}\b", text))
    assert not missing, f"docs/troubleshooting.md does not name {len(missing)} public exception classes: {missing}"


# -------------------------------------------------------------------------- the code blocks


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    run: str | None  # "" for <!-- run -->, "embedded" for <!-- run: embedded -->, None otherwise

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def is_dag(self) -> bool:
        return "DAG(" in self.code or "@dag" in self.code


_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
_RUN = re.compile(r"^\s*<!--\s*run(?::\s*(\w+))?\s*-->\s*$")
LANGS = {"python": "python", "py": "python", "yaml": "yaml", "yml": "yaml"}


def code_blocks(path: Path) -> list[Block]:
    """The fenced ```python / ```yaml blocks of a markdown file (indented ones in lists too), each
    with the ``<!-- run ... -->`` marker on the last non-blank line before it, if any."""
    blocks, lines, i = [], path.read_text(encoding="utf-8").splitlines(), 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, lang = opening.groups()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(fence)), len(lines))
        if lang.lower() in LANGS:
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marker = _RUN.match(before)
            body = "\n".join(line[len(indent):] if line.startswith(indent) else line for line in lines[i + 1:end])
            blocks.append(Block(path, i + 1, LANGS[lang.lower()], textwrap.dedent(body) + "\n",
                                None if marker is None else (marker.group(1) or "")))
        i = end + 1
    return blocks


def _markdown_files() -> list[Path]:
    return sorted(DOCS.rglob("*.md")) + [p for p in (REPO / "README.md", REPO / "CONTRIBUTING.md") if p.is_file()]


BLOCKS = [block for path in _markdown_files() for block in code_blocks(path)]


def _blocks(kind: str) -> list:
    chosen = [b for b in BLOCKS if {
        "dag": b.lang == "python" and b.is_dag,
        "python": b.lang == "python" and not b.is_dag and b.run != "embedded",
        "embedded": b.lang == "python" and not b.is_dag and b.run == "embedded",
        "yaml": b.lang == "yaml"}[kind]]
    return [pytest.param(b, id=b.where) for b in chosen]


def test_the_docs_have_checked_examples() -> None:
    """The collection of code blocks works (a fence the parser misses would silently check nothing)."""
    assert any(b.path.name == "README.md" and b.lang == "python" for b in BLOCKS)
    assert all(b.code.strip() for b in BLOCKS), [b.where for b in BLOCKS if not b.code.strip()]


@pytest.mark.parametrize("block", _blocks("yaml"))
def test_yaml_block_parses(block: Block) -> None:
    try:
        list(yaml.safe_load_all(block.code))
    except yaml.YAMLError as e:
        pytest.fail(f"{block.where}: the YAML example does not parse: {e}")


@pytest.mark.parametrize("block", _blocks("python"))
def test_python_block_compiles_and_its_imports_resolve(block: Block) -> None:
    """Every Python example compiles and imports only what exists; a marked one runs as a whole."""
    code = compile(block.code, block.where, "exec")
    if block.run == "":
        exec(code, {"__name__": "__docs_example__"})
        return
    imports = [node for node in ast.parse(block.code).body if isinstance(node, (ast.Import, ast.ImportFrom))]
    exec(compile(ast.Module(body=imports, type_ignores=[]), block.where, "exec"), {"__name__": "__docs_example__"})


@pytest.mark.parametrize("block", _blocks("dag"))
def test_dag_block_imports_as_a_dag_file(block: Block, tmp_path: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    dag_file = tmp_path / f"docs_example_{block.line}.py"
    dag_file.write_text(block.code)
    bag = DagBag(dag_folder=str(dag_file))
    assert not bag.import_errors, f"{block.where}: the example DAG does not import: {bag.import_errors}"
    assert bag.dag_ids, f"{block.where}: the example defines no DAG"


@pytest.mark.parametrize("block", _blocks("embedded"))
def test_embedded_block_runs_against_pravega(block: Block, pravega_embedded, spark) -> None:
    """On the embedded server only, as the marker says: what the snippets show is the provider's
    API, which the backend-neutral tests already run against real Pravega too."""
    pravega_controller_uri = pravega_embedded.controller_uri
    code = block.code
    assert any(uri in code for uri in EXAMPLE_URIS), (
        f"{block.where} is marked '<!-- run: embedded -->' but names no controller {EXAMPLE_URIS[0]}")
    for uri in EXAMPLE_URIS:
        code = code.replace(uri, pravega_controller_uri)
    exec(compile(code, block.where, "exec"), {"__name__": "__docs_example__", "spark": spark})
