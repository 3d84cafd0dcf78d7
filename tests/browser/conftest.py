"""Real headless Chromium (Debian's /usr/bin/chromium) driven by playwright.

Never downloads playwright's own browsers. Without Chromium (or playwright) the
browser tests skip with the reason, except under ``CI=true``, where they fail: CI
installs Chromium (scripts/install-system-deps.sh). Screenshots go to
``artifacts/screenshots/<page>.png`` (gitignored), for whoever changes a page.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("SHOAL_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


def _missing() -> str | None:
    if not (os.path.isfile(CHROMIUM) or shutil.which(CHROMIUM)):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright)"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium per test module. Not per session: while playwright's sync
    API is open, the main thread counts as running an event loop, and later tests'
    ``asyncio.run`` would refuse to start."""
    missing = _missing()
    if missing:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"browser tests cannot run in CI: {missing}")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # --no-sandbox: the tests may run as root (containers, CI)
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


class WatchedPage:
    """A page whose console errors and uncaught exceptions are collected."""

    def __init__(self, page: Any):
        self.page = page
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))

    def _console(self, msg: Any) -> None:
        if msg.type == "error":
            self.errors.append(f"console: {msg.text}")

    def screenshot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def open_page(browser: Any) -> Iterator[Any]:
    """``open_page()`` -> a WatchedPage in a fresh context (its own cookies)."""
    contexts = []

    def make() -> WatchedPage:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        contexts.append(context)
        return WatchedPage(context.new_page())

    yield make
    for context in contexts:
        context.close()
