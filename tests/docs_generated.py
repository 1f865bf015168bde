"""Generated sections of hand-written pages: the text between ``<!-- NAME -->`` and
``<!-- end NAME -->`` is produced from the code (a table of options, the classes an API page
documents). A test writes it with ``PRAVEGA_UPDATE_DOCS=1`` and otherwise fails when the page no
longer matches the code, naming the command that regenerates it."""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _section(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- {re.escape(name)} -->\n)(.*?)(<!-- end {re.escape(name)} -->)", re.S)


def check_generated(path: Path, name: str, text: str, regenerate: str) -> None:
    """Write (``PRAVEGA_UPDATE_DOCS=1``) or check the ``name`` section of ``path`` against ``text``.

    ``regenerate`` is the test that produces it (shown in the failure). The markers must already be
    in the page: where the section goes is the page author's choice.
    """
    text = text.rstrip("\n") + "\n"
    current = path.read_text(encoding="utf-8")
    found = _section(name).search(current)
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    assert found is not None, f"{where} has no '<!-- {name} -->' ... '<!-- end {name} -->' section"
    if os.environ.get("PRAVEGA_UPDATE_DOCS"):
        path.write_text(current[:found.start(2)] + text + current[found.end(2):], encoding="utf-8")
        return
    assert found.group(2) == text, (
        f"{where}: the generated section {name!r} is stale (the code changed): run "
        f"PRAVEGA_UPDATE_DOCS=1 python -m pytest {regenerate} and commit the page.\n"
        f"--- in the page\n{found.group(2)}--- generated now\n{text}")
