"""A real ThinkViz app (``python app.py``) on a free 127.0.0.1 port, and a headless Chromium.

The app is started once per test session in a subprocess and loads the embedded model
like a user's would; Chromium is Debian's (``/usr/bin/chromium``), driven by Playwright.
Both come from :mod:`thinkviz.bench.browser`, which the browser benchmark uses too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from thinkviz.bench.browser import CHROMIUM, CHROMIUM_ARGS, launched_app

START_TIMEOUT = 240  # seconds for imports + the page to answer on a busy 2-core machine


@pytest.fixture(scope="session")
def app_url(tmp_path_factory) -> str:
    """URL of a running ``app.py`` (embedded model, 4-bit); stopped after the session."""
    with launched_app(timeout=START_TIMEOUT, log=tmp_path_factory.mktemp("app") / "app.log") as url:
        yield url


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium, headless, through Playwright (never ``playwright install``)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
