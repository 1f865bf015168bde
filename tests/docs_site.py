"""Building the docs site (mkdocs.yml) for the tests that check it: tests/docs and tests/ui."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 300


def build_site(site_dir: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` into ``site_dir``: any warning (a broken link or #anchor, a page
    missing from the nav's list, a docstring mkdocstrings cannot render) makes it exit non-zero."""
    try:
        import mkdocs  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError as e:  # the `test` extra installs both: never skip the strict build silently
        raise AssertionError(f"the docs site needs mkdocs and mkdocstrings[python]: pip install -e '.[test]' ({e})")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"),
         "--site-dir", str(site_dir)],
        cwd=REPO, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
