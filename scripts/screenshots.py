"""The README's screenshots, taken fresh at 1920×1080 from a preset's recording (no model run).

    python app.py --port 7911 &                      # in another shell: the app on the embedded model
    .venv/bin/python scripts/screenshots.py http://127.0.0.1:7911/

Chromium is Debian's ``/usr/bin/chromium`` driven by Playwright (never ``playwright install``).  Live
plays ``math_h2o_vs_window`` (shot in presentation mode), Compare plays ``compare_lru_all``; Explore
opens the Live run, scrolled to its keep heatmap.
Writes docs/live.png, docs/compare.png and docs/explore.png.
"""

from __future__ import annotations

import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, not an installed copy
from thinkviz.bench.browser import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from thinkviz.demos.presets import load_preset  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs"
SIZE = {"width": 1920, "height": 1080}


def play(page, tab: str, preset: str) -> None:
    """Pick ``preset`` in ``tab`` ("live" or "compare") and play its recording to the end, as fast as it draws."""
    title = load_preset(preset).title
    page.click(f"#tv-{tab}-preset input")
    page.keyboard.press("Control+a")
    page.keyboard.type(title)
    page.locator(f'[role=option][aria-label="{title}"]').first.click()
    page.wait_for_function(f"() => !document.querySelector('#tv-{tab}-play').disabled", timeout=60_000)
    page.click(f"#tv-{tab}-speed input")
    page.locator('[role=option][aria-label="as fast as it draws"]').first.click()
    page.click(f"#tv-{tab}-play")
    page.wait_for_function(
        f"() => /Done/.test(document.querySelector('#tv-{tab}-status')?.textContent)", timeout=300_000
    )
    page.wait_for_timeout(6_000)  # the memory chart is redrawn in place every 5 s


def main(url: str) -> None:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=SIZE, device_scale_factor=1)
        page.goto(url)
        page.wait_for_function(
            "() => /Model: Ready/.test(document.querySelector('#tv-model-status')?.textContent)", timeout=900_000
        )
        play(page, "live", "math_h2o_vs_window")
        page.click("#tv-present input")  # presentation mode: the token view and the memory chart side by side
        page.wait_for_timeout(6_000)
        page.screenshot(path=DOCS / "live.png")
        page.click("#tv-present input")
        page.get_by_role("tab", name="Explore").click()
        page.wait_for_function(
            "() => /Step/.test(document.querySelector('#tv-explore-caption')?.textContent)", timeout=120_000
        )
        page.wait_for_timeout(3_000)
        page.evaluate("document.querySelector('#tv-explore-heatmap').scrollIntoView({block: 'end'})")
        page.wait_for_timeout(1_000)
        page.screenshot(path=DOCS / "explore.png")
        page.get_by_role("tab", name="Compare").click()
        play(page, "compare", "compare_lru_all")
        page.screenshot(path=DOCS / "compare.png")
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1])
