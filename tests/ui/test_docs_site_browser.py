"""The docs site as a new user meets it, in headless Chromium.

The site is built (strictly, as tests/docs does) and served on 127.0.0.1; from the landing page the
test follows the links to the ingest, deployment and troubleshooting pages as a reader would (a
link in the page's text naming the topic), and on each finds the page's first heading: the one its
markdown starts with. A screenshot of each page is kept in artifacts/.
"""

from __future__ import annotations

import functools
import http.server
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from docs_site import REPO, build_site

ARTIFACTS = REPO / "artifacts"
TOPICS = ("ingest", "deployment", "troubleshooting")


@pytest.fixture(scope="module")
def served_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The built site over HTTP on 127.0.0.1 (a free port), stopped after the module."""
    site = tmp_path_factory.mktemp("docs-site")
    result = build_site(site)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-8000:]}"
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="docs-site-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


def _first_heading(page_md: Path) -> str:
    """The text of the markdown's first ``# `` heading, as a reader sees it (no markup)."""
    line = next(line for line in page_md.read_text(encoding="utf-8").splitlines() if line.startswith("# "))
    return re.sub(r"[`*_]", "", line[2:]).strip()


@pytest.mark.parametrize("topic", TOPICS)
def test_landing_page_leads_to_the_topic(topic: str, served_site: str, chromium_executable: str,
                                         browser_page: Any) -> None:
    from playwright.sync_api import expect

    page = browser_page
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(served_site)
    main = page.locator("[role=main]")
    expect(main.locator("h1").first).to_be_visible()
    # A link in the landing page's own text (not the side navigation) whose words name the topic.
    link = main.get_by_role("link", name=re.compile(rf"\b{topic}\b", re.I)).and_(
        main.locator(f"a[href$='{topic}.html'], a[href*='{topic}.html#']")).first
    expect(link).to_be_visible()
    link.click()
    page.wait_for_url(re.compile(rf"/{topic}\.html(#.*)?$"))
    heading = page.locator("[role=main] h1").first
    expect(heading).to_be_visible()
    expect(heading).to_have_text(re.compile(re.escape(_first_heading(REPO / "docs" / f"{topic}.md"))))
    page.screenshot(path=str(ARTIFACTS / f"docs-site-{topic}.png"))
