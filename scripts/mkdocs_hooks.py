"""MkDocs hooks (mkdocs.yml): links from the docs to the repository's own files keep working on the site.

The pages link the code they describe (``../airflow_provider_pravega/client/ingest.py``) and the
root's README.md and CONTRIBUTING.md, all outside ``docs/``. Each linked file is copied into the
site under ``source/`` and the link rewritten to that copy, so MkDocs validates it like any other
(a link to a file that does not exist stays as written and fails the strict build). README.md and
CONTRIBUTING.md always become pages of the site (under ``source/``, not in the nav), so their
links and anchors are checked by the same build; their links are resolved from where they live.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "source/"
#: Root files that are always part of the site, so every relative link they hold is checked too.
ROOT_PAGES = ("README.md", "CONTRIBUTING.md")
_LINK = re.compile(r"(\]\()(<?)([^)\s>]+)(>?)((?:\s+\"[^\"]*\")?\))")
_FENCE = re.compile(r"^\s*(```|~~~)")


def _outside_link(link: str) -> bool:
    return not (re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", link) or link.startswith(("#", "/")))


def _origin(file: File, docs_dir: Path) -> Path:
    """Where a page's markdown lives in the repository (a copied root file: the root)."""
    if file.src_uri.startswith(PREFIX):
        return ROOT / file.src_uri[len(PREFIX):]
    return docs_dir / file.src_uri


def _site_path(target: Path, docs_dir: Path) -> str | None:
    """The site's path of a repository file: itself inside docs/, a copy under source/ otherwise."""
    if target.is_relative_to(docs_dir):
        return target.relative_to(docs_dir).as_posix()
    if target.is_relative_to(ROOT) and target.is_file():
        return PREFIX + target.relative_to(ROOT).as_posix()
    return None


def _outside_targets(text: str, origin: Path, docs_dir: Path) -> list[Path]:
    targets = []
    for line in _prose_lines(text):
        for match in _LINK.finditer(line):
            link = match.group(3).split("#", 1)[0]
            if link and _outside_link(link):
                target = (origin.parent / link).resolve()
                if not target.is_relative_to(docs_dir) and target.is_relative_to(ROOT) and target.is_file():
                    targets.append(target)
    return targets


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a link-like text in code is code, not a link)."""
    out, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def on_files(files: Files, config) -> Files:
    docs_dir = Path(config["docs_dir"]).resolve()
    pending = [ROOT / name for name in ROOT_PAGES if (ROOT / name).is_file()]
    pending += [Path(f.abs_src_path) for f in files if f.is_documentation_page() and f.abs_src_path]
    added: set[Path] = set()
    while pending:
        path = pending.pop()
        if not path.is_relative_to(docs_dir) and path not in added:
            added.add(path)
            files.append(File.generated(config, PREFIX + path.relative_to(ROOT).as_posix(), abs_src_path=str(path)))
        if path.suffix == ".md":
            pending += [t for t in _outside_targets(path.read_text(encoding="utf-8"), path, docs_dir) if t not in added]
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Rewrite each link that leaves docs/ (or starts in a copied root page) to the site's path."""
    docs_dir = Path(config["docs_dir"]).resolve()
    origin = _origin(page.file, docs_dir)
    if origin.is_relative_to(docs_dir) and "../" not in markdown:
        return markdown
    here = posixpath.dirname(page.file.src_uri)

    def rewrite(match: re.Match[str]) -> str:
        link, _, fragment = match.group(3).partition("#")
        if not link or not _outside_link(link):
            return match.group(0)
        site = _site_path((origin.parent / link).resolve(), docs_dir)
        if site is None:
            return match.group(0)  # not found: MkDocs reports the link as written
        new = posixpath.relpath(site, here or ".") + (f"#{fragment}" if fragment else "")
        return match.group(1) + match.group(2) + new + match.group(4) + match.group(5)

    lines, fenced = [], False
    for line in markdown.splitlines(keepends=True):
        if _FENCE.match(line):
            fenced = not fenced
        lines.append(line if fenced or _FENCE.match(line) else _LINK.sub(rewrite, line))
    return "".join(lines)


_SPHINX_ROLE = re.compile(r":(?:class|meth|func|attr|mod|exc|obj|data):(?=<code>)")


def on_page_content(html: str, page, config, files) -> str:
    """Docstrings cite with Sphinx roles (``:class:`X```); mkdocstrings shows the code, not the role."""
    return _SPHINX_ROLE.sub("", html) if page.file.src_uri.startswith("api/") else html
