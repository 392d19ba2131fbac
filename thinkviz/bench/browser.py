"""Smoothness of the app as a browser sees it: click → first painted token, frames per second; the
tuning cycle: a knob changed → the new ΔNLL on screen (:func:`measure_tune`); a lesson's steps, from
a link and by Next and Back (:func:`measure_lesson`).

Starts ``app.py`` on a free 127.0.0.1 port (or uses a running one), opens it in headless
Chromium (Debian's ``/usr/bin/chromium`` through Playwright) and instruments the Live
tab's token view in the page: a ``MutationObserver`` timestamps each batch of changes to
the view (one per frame received; the paint follows in the next animation frame — headless
Chromium does not run ``requestAnimationFrame`` reliably enough to time paints directly);
a ``PerformanceObserver`` collects main-thread long tasks (> 50 ms, the browser's own
threshold for janky input).  Then it generates ``tokens`` tokens without stopping at
end-of-text and reads the timings back.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator, Sequence

from ..demos.presets import load_preset
from .trace_profile import TRACE_CATEGORIES

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
APP = Path(__file__).resolve().parents[2] / "app.py"
QUESTION = "Tell a long story about a lighthouse keeper who counts ships, with many details."

# Installed before the click: paints of the token view, long tasks, the click time (on the button `button`).
INSTRUMENT_JS = """(button) => {
  const root = document.getElementById('tv-live-tokens');
  const bench = window.tvBench = {clicked: null, paints: [], longTasks: []};
  new MutationObserver(() => {
    bench.paints.push([performance.now(), root.querySelectorAll('.tv-tok').length]);
  }).observe(root, {childList: true, subtree: true, attributes: true});
  new PerformanceObserver(list => {
    for (const e of list.getEntries()) bench.longTasks.push([e.startTime, e.duration]);
  }).observe({entryTypes: ['longtask']});
  document.getElementById(button || 'tv-live-run')
    .addEventListener('click', () => { bench.clicked = performance.now(); }, {capture: true});
}"""


# A lesson step: click ``button``, resolve with the milliseconds until the step indicator reads ``want``
# (its narration and view arrive in the same update).
LESSON_STEP_JS = """async ([button, want]) => {
  const box = document.getElementById('tv-lesson-step');
  const start = performance.now();
  const shown = new Promise((resolve, reject) => {
    const observer = new MutationObserver(() => {
      if (box.textContent.trim() !== want) return;
      observer.disconnect();
      resolve(performance.now() - start);
    });
    observer.observe(box, {subtree: true, childList: true, characterData: true});
    setTimeout(() => reject(new Error(`the step indicator never read ${want}`)), 30000);
  });
  document.getElementById(button).click();
  return await shown;
}"""


class BenchError(RuntimeError):
    """The benchmark could not run (no Chromium, the app did not start, the run failed)."""


@dataclass
class BrowserBenchResult:
    """Timings measured in the page (seconds unless named otherwise)."""

    new_tokens: int
    prompt_painted: float  # click → the prompt's tokens on screen
    first_token_painted: float  # click → the first generated token on screen
    run_seconds: float  # first generated token → last frame of the run
    frames: int  # updates of the token view in that time
    long_tasks: int
    longest_task_ms: float
    app_tokens_per_second: str  # the stats strip's own figure, for context
    task_ms: tuple[float, ...] = ()  # every long task's duration, from the click to the run's end

    @property
    def frames_per_second(self) -> float:
        return (self.frames - 1) / self.run_seconds if self.run_seconds > 0 and self.frames > 1 else 0.0

    @property
    def task_p95_ms(self) -> float:
        """95th percentile of the main thread's task length per frame: each frame counts its long task
        (the browser reports only tasks over 50 ms), or 0 when it had none."""
        if not self.task_ms:
            return 0.0
        per_frame = sorted(self.task_ms) + [0.0] * max(0, self.frames - len(self.task_ms))
        return float(sorted(per_frame)[min(len(per_frame) - 1, int(0.95 * len(per_frame)))])

    @property
    def tasks_over_200ms(self) -> int:
        return sum(1 for ms in self.task_ms if ms > 200)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def launched_app(app_args: Sequence[str] = (), timeout: float = 240, log: Path | None = None) -> Iterator[str]:
    """Run ``python app.py`` on a free 127.0.0.1 port; yield its URL once the page answers."""
    with app_process(app_args, timeout, log) as (url, _):
        yield url


@contextmanager
def app_process(
    app_args: Sequence[str] = (), timeout: float = 240, log: Path | None = None, env: dict[str, str] | None = None
) -> Iterator[tuple[str, int]]:
    """:func:`launched_app` that also yields the server's process id, with ``env`` added to its
    environment."""
    if not APP.is_file():
        raise BenchError(f"{APP} not found: run from a ThinkViz checkout")
    port = free_port()
    log = log or Path(tempfile.mkdtemp(prefix="thinkviz-app-")) / "app.log"
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(APP), "--host", "127.0.0.1", "--port", str(port), *app_args],
            cwd=APP.parent,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise BenchError(f"app.py exited with {proc.returncode}; log: {log}\n{log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(url, timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise BenchError(f"app.py did not answer on {url} within {timeout:.0f} s; log: {log}") from None
                time.sleep(1)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait_text(page, selector: str, prefix: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = page.inner_text(selector)
        if text.startswith(prefix) or prefix in text:
            return text
        if page.locator(".toast-body.error").count():
            raise BenchError(f"the app reported: {page.locator('.toast-body.error').first.inner_text()}")
        time.sleep(0.25)
    raise BenchError(f"{selector} did not show {prefix!r} within {timeout:.0f} s")


@contextmanager
def _open_app(url: str, size: tuple[int, int], ready: str, model_timeout: float) -> Iterator[tuple[object, object]]:
    """``(browser, page)``: Chromium on a page of ``size`` (width, height) at ``url``, once the model status
    shows ``ready``; closed on the way out."""
    if not Path(CHROMIUM).exists():
        raise BenchError(f"{CHROMIUM} is missing: apt-get install -y chromium")
    # Imported here: Playwright is a dev requirement, and the rest of the CLI must run without it.
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": size[0], "height": size[1]})
            try:
                page.goto(url)
            except PlaywrightError as exc:
                raise BenchError(f"cannot open {url}: {str(exc).splitlines()[0]}") from None
            _wait_text(page, "#tv-model-status", ready, model_timeout)
            yield browser, page
        finally:
            browser.close()


def measure(
    url: str, tokens: int = 500, model_timeout: float = 600, run_timeout: float = 3600, trace: Path | None = None
) -> BrowserBenchResult:
    """Generate ``tokens`` tokens in the Live tab of the app at ``url`` and time the page; with ``trace``,
    record the run (click to last frame) as a Chromium performance trace in that file
    (:mod:`thinkviz.bench.trace_profile` reads it)."""
    with _open_app(url, (1440, 1000), "Model: Ready", model_timeout) as (browser, page):
        page.fill("#tv-live-question textarea", QUESTION)
        box = page.locator("#tv-live-max-new input[type=number]").first
        box.fill(str(tokens))
        box.press("Enter")
        if page.is_checked("#tv-live-stop-at-eos input"):
            page.click("#tv-live-stop-at-eos input")
        page.evaluate(INSTRUMENT_JS)
        if trace is not None:
            browser.start_tracing(page=page, path=str(trace), categories=TRACE_CATEGORIES)
        page.click("#tv-live-run")
        _wait_text(page, "#tv-live-status", f"Done: {tokens} tokens", run_timeout)
        page.wait_for_timeout(500)  # the final frame's paint
        if trace is not None:
            browser.stop_tracing()
        bench = page.evaluate("window.tvBench")
        speed = page.evaluate("""() => [...document.querySelectorAll('#tv-live-stats .tv-stat')]
            .filter(s => s.querySelector('span').innerText.trim() === 'tok/s')
            .map(s => s.querySelector('b').innerText.trim())[0] || '?'""")
    return _result(bench, tokens, speed)


def _result(bench: dict, tokens: int, speed: str) -> BrowserBenchResult:
    clicked, paints = bench["clicked"], [(t, n) for t, n in bench["paints"] if t >= bench["clicked"]]
    shown = [(t, n) for t, n in paints if n > 0]
    if clicked is None or not shown:
        raise BenchError("the page never painted a token after the click")
    prompt_time, prompt_count = shown[0]
    generated = [(t, n) for t, n in shown if n > prompt_count]
    if not generated:
        raise BenchError("no generated token was painted")
    first, last = generated[0][0], generated[-1][0]
    frames = sum(1 for t, _ in shown if first <= t <= last)
    long_tasks = [float(d) for start, d in bench["longTasks"] if start >= clicked and start <= last]
    return BrowserBenchResult(
        tokens,
        (prompt_time - clicked) / 1000,
        (first - clicked) / 1000,
        (last - first) / 1000,
        frames,
        len(long_tasks),
        max(long_tasks, default=0.0),
        speed,
        tuple(long_tasks),
    )


STAT_JS = """(label) => [...document.querySelectorAll('#tv-live-stats .tv-stat')]
    .filter(s => s.querySelector('span').innerText.trim() === label)
    .map(s => s.querySelector('b').innerText.trim())[0] || null"""


# The stats strip on screen is marked before a change; a frame replaces it (status and stats come together),
# so an unmarked strip with ΔNLL under a "Done:" status is the new run's result.
MARK_JS = """() => { const s = document.querySelector('#tv-live-stats .tv-stats'); if (s) s.dataset.tvOld = '1'; }"""
NEW_RESULT_JS = f"""() => {{ const s = document.querySelector('#tv-live-stats .tv-stats');
  return !!s && !s.dataset.tvOld && document.querySelector('#tv-live-status').innerText.trim().startsWith('Done:')
    && ({STAT_JS})('ΔNLL') !== null; }}"""


@dataclass(frozen=True)
class TuneCycle:
    """One turn of the tuning loop: the knob set to ``value``, the seconds from that change (and the click
    on Generate right after it) to the run's final ΔNLL and KL in the stats strip."""

    value: str
    seconds: float
    nll_delta: str
    kl: str


@dataclass(frozen=True)
class PlayResult:
    """A preset's recording played in the Live tab: seconds from the click on "Play recording" to its
    first painted token and to the end, and the status line at the end."""

    first_token_painted: float
    done: float
    status: str


def _pick_preset(page, preset: str) -> None:
    title = load_preset(preset).title
    page.click("#tv-live-preset input")
    page.keyboard.press("Control+a")
    page.keyboard.type(title)
    page.locator(f'[role=option][aria-label="{title}"]').first.click()


def measure_play(url: str, preset: str, model_timeout: float = 600, run_timeout: float = 600) -> PlayResult:
    """In the Live tab at ``url``: pick ``preset``, press "Play recording" (as fast as it draws) and time
    its first painted token and its end (#11: a recording opens in <= 2 s)."""
    with _open_app(url, (1440, 1000), "Model:", model_timeout) as (_, page):
        _pick_preset(page, preset)
        page.wait_for_function("() => !document.querySelector('#tv-live-play').disabled", timeout=30_000)
        page.click("#tv-live-speed input")
        page.locator('[role=option][aria-label="as fast as it draws"]').first.click()
        page.evaluate(INSTRUMENT_JS, "tv-live-play")
        page.click("#tv-live-play")
        status = _wait_text(page, "#tv-live-status", "Done", run_timeout)
        bench = page.evaluate("window.tvBench")
        ended = page.evaluate("performance.now()")
    painted = [t for t, n in bench["paints"] if n > 0 and t >= bench["clicked"]]
    if bench["clicked"] is None or not painted:
        raise BenchError("the page never painted a token of the recording")
    return PlayResult((painted[0] - bench["clicked"]) / 1000, (ended - bench["clicked"]) / 1000, status)


def measure_tune(
    url: str,
    preset: str,
    tokens: int,
    knob: str,
    values: Sequence[str],
    model_timeout: float = 600,
    run_timeout: float = 3600,
) -> list[TuneCycle]:
    """In the Live tab at ``url``: pick ``preset``, replay only its first ``tokens`` trace tokens
    measured against the full cache, run it once as it comes, then for each of ``values`` set
    ``knob`` (a slider of the preset's policy), press Generate and time until the new ΔNLL shows."""
    cycles = []
    with _open_app(url, (1920, 1080), "Model: Ready", model_timeout) as (_, page):
        _pick_preset(page, preset)
        slider = page.locator(f'input[aria-label="number input for {knob.replace("_", " ")}"]').first
        slider.wait_for(state="visible", timeout=30_000)
        limit = page.locator("#tv-live-limit input[type=number]").first
        limit.fill(str(tokens))
        limit.press("Enter")
        if not page.is_checked("#tv-live-measure input"):
            page.click("#tv-live-measure input")
        page.wait_for_timeout(500)
        for value in [None, *values]:  # the first run as the preset comes: the tokenizer and caches warm up
            page.evaluate(MARK_JS)
            start = time.monotonic()
            if value is not None:
                slider.fill(str(value))
                slider.press("Enter")
            page.click("#tv-live-run")
            page.wait_for_function(
                f"() => ({NEW_RESULT_JS})() || !!document.querySelector('.toast-body.error')",
                timeout=run_timeout * 1000,
                polling=50,
            )
            if page.locator(".toast-body.error").count():
                raise BenchError(f"the app reported: {page.locator('.toast-body.error').first.inner_text()}")
            if value is not None:
                cycles.append(
                    TuneCycle(
                        str(value),
                        time.monotonic() - start,
                        page.evaluate(STAT_JS, "ΔNLL"),
                        page.evaluate(STAT_JS, "KL"),
                    )
                )
    return cycles


@dataclass
class LessonTimes:
    """Seconds for each way a lesson's step is reached."""

    link: tuple[float, ...]  # navigation to ``?lesson=NAME&step=N`` → that step shown (the page load included)
    page: tuple[float, ...]  # the baseline: navigation to the app's page without a lesson → its loading's end
    next: tuple[float, ...]  # Next clicked → the next step shown, for every step after the first
    back: tuple[float, ...]  # Back clicked → the step before shown, from the last to the first


# Collects in ``window.tvLongTasks`` each long task's ``[start, end]`` (ms from the navigation's start).
BUSY_JS = """window.tvLongTasks = [];
new PerformanceObserver((list) => {
  for (const task of list.getEntries()) window.tvLongTasks.push([task.startTime, task.startTime + task.duration]);
}).observe({type: 'longtask', buffered: true});"""
QUIET_MS = 1500  # a page whose main thread has had no long task this long has finished loading
SETTLE_S = 30  # ... or the page is taken as it is this long after the navigation (a busy machine)
# The page's long tasks so far, its clock (ms), and whether it has sent its first event to the app.
LOADING_JS = """() => [window.tvLongTasks, performance.now(),
  performance.getEntriesByType('resource').some((entry) => entry.name.includes('/queue/join'))]"""


def busy_until(tasks: Sequence[Sequence[float]]) -> float:
    """The end (ms) of the last of ``tasks`` (``[start, end]`` ms) before the first quiet gap of ``QUIET_MS``:
    when a page finished loading, though a timer or a busy machine adds long tasks later."""
    end = 0.0
    for start, stop in sorted(tasks):
        if end and start - end >= QUIET_MS:
            break
        end = max(end, stop)
    return end


def _page_settled(browser, url: str) -> float:
    """Seconds from navigating to ``url`` to the end of its loading's last long task (see :func:`busy_until`),
    once the page has sent its events and then had a quiet gap (a timer's later tasks do not hold it)."""
    page = browser.new_page(viewport={"width": 1920, "height": 1080})
    page.add_init_script(BUSY_JS)
    page.goto(url)
    deadline = time.monotonic() + SETTLE_S
    while True:
        tasks, now, sent = page.evaluate(LOADING_JS)
        loaded = busy_until(tasks)
        if (sent and now - loaded >= QUIET_MS) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    page.close()
    return loaded / 1000


def _showing(page, want: str) -> None:
    """Wait until the page's lesson step indicator reads ``want`` (``"3 / 6"``)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    indicator = "document.getElementById('tv-lesson-step')?.textContent.trim()"
    try:
        page.wait_for_function(f"{indicator} === {want!r}", timeout=60_000)
    except PlaywrightTimeout:
        raise BenchError(f"the step indicator read {page.evaluate(indicator)!r}, not {want!r}, for 60 s") from None


def measure_lesson(url: str, name: str, steps: int, links: int = 3) -> LessonTimes:
    """Time lesson ``name`` (``steps`` steps) at ``url``: opened ``links`` times by its link at its middle
    step (the first right after the app answers, as a class's slide link may be), then stepped to the
    end with Next and back to the start with Back."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise BenchError(f"{CHROMIUM} is missing: apt-get install -y chromium")
    middle, link, plain, forward, backward = (steps + 1) // 2, [], [], [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for _ in range(links):
                page = browser.new_page(viewport={"width": 1920, "height": 1080})
                page.goto(f"{url}?lesson={name}&step={middle}")
                _showing(page, f"{middle} / {steps}")
                link.append(page.evaluate("performance.now()") / 1000)  # from the navigation's start
                page.close()
                plain.append(_page_settled(browser, url))
            page = browser.new_page(viewport={"width": 1920, "height": 1080})
            page.goto(f"{url}?lesson={name}&step=1")
            _showing(page, f"1 / {steps}")
            for step in range(2, steps + 1):
                forward.append(page.evaluate(LESSON_STEP_JS, ["tv-lesson-next", f"{step} / {steps}"]) / 1000)
            for step in range(steps - 1, 0, -1):
                backward.append(page.evaluate(LESSON_STEP_JS, ["tv-lesson-back", f"{step} / {steps}"]) / 1000)
        except PlaywrightError as exc:
            raise BenchError(f"lesson {name!r}: {str(exc).splitlines()[0]}") from None
        finally:
            browser.close()
    return LessonTimes(tuple(link), tuple(plain), tuple(forward), tuple(backward))
