"""Token views streamed to the browser as patches, never re-sent whole while a run appends.

Each token view is a plain ``<div id=…>`` container the UI owns.  A :class:`TokenChannel`
diffs every frame against the previous one with :func:`~thinkviz.viz.tokens.token_delta` and
wraps the patch in a message ``{"target", "run", "seq", "patch"}``.  All messages travel as
a JSON string (:func:`bus_payload`) through one hidden ``gr.Textbox``; its ``.change`` runs
:data:`PATCH_BUS_JS` in the browser, which applies each message to its container.  (A
``gr.JSON`` would also draw every message as a tree in the page, hidden or not: a long
main-thread task per frame.)

Messages are numbered, and the browser applies one only if it is the next of the run it
shows, or a reset.  Gradio fires ``.change`` again with the final value when a generator
ends (ignored: seen already), and a page busy with other work (a plotly redraw on a slow
machine) merges updates of the bus that arrive meanwhile, so only the last is seen.  Each
payload therefore repeats the channel's few previous patches (:meth:`TokenChannel.recent`);
the browser skips those it has.  If it still finds a gap, it clicks the hidden resync
button (:data:`RESYNC_BUTTON_ID`), the session's channels make their next message a reset
(:meth:`TokenChannel.resync`).  A run's last frame is always a reset.

Following: a view with a "follow the newest token" checkbox (``data-follow``) keeps its newest token
in view while the box is ticked; every new run (a new run id, :meth:`TokenChannel.new_run`) ticks
it, scrolling up (wheel, ArrowUp, PageUp, Home) unticks it, and the view scrolls to its end again
when it is shown after a tab switch or resized.  A view without one follows while scrolled to its end.

Charts ride the bus too while a run streams (:func:`chart_frame`): a ``gr.Plot`` given a new
figure draws it into a new chart from scratch (Gradio re-creates its plotly.js chart on every
change, and draws it twice), a main-thread task of 100 ms and more each time on a small machine
(#11); a chart message (``{"chart": elem_id, "figure": plotly JSON}``) has :data:`PATCH_BUS_JS`
redraw the chart the ``gr.Plot`` shows in place instead (``Plotly.react``: plotly.js changes what
changed).  The run's last frame gives the ``gr.Plot`` its final figure, so what it holds after
a run is complete whatever messages the page merged.  A run's first frame draws no chart (it
would show no step yet): ``{"chart": elem_id, "dim": true}`` dims the previous run's chart until
the new run's first figure (or its last frame, ``"dim": false``) shows.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Mapping

import plotly.graph_objects as go

from ..viz.legend import pin_host
from ..viz.tokens import TOKEN_PATCH_JS, TokenData, TokenViewState, token_delta

TITLE_REFRESH_SECONDS = 2.0
BACKLOG = 8  # messages each payload repeats: a browser may miss up to 7 in a row (≈1 s of frames)


@dataclass
class TokenChannel:
    """One token view in the browser: turns successive :class:`TokenData` into patch messages.

    Tooltips carry each token's current score, which changes every step for every scored
    token; sending them every frame would re-send most of the view.  Class changes (heat,
    eviction) go out every frame; tooltip changes at most every ``title_refresh`` seconds
    (resets always carry fresh ones, and a run's final frame is a reset).

    Only the thread streaming the run calls :meth:`message`; other events (a mode switch, a
    browser asking to resync) only raise a flag that the next message honours, so they never
    touch the diff state under it.
    """

    target: str
    mode: str = "combined"
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    seq: int = 0
    state: TokenViewState | None = None
    title_refresh: float = TITLE_REFRESH_SECONDS
    clock: Callable[[], float] = time.monotonic
    _titles: list[str] = field(default_factory=list)  # the tooltips the browser shows, by index
    _titles_at: float = float("-inf")
    _reset_pending: bool = False
    _backlog: deque = field(default_factory=lambda: deque(maxlen=BACKLOG))  # patches since the last reset
    _last: dict[str, Any] | None = None

    def message(self, data: TokenData, *, reset: bool = False) -> dict[str, Any]:
        """The patch from what the browser shows now to ``data`` (a whole view if ``reset``)."""
        previous = self.state
        if reset or self._reset_pending:
            self._reset_pending = False
            previous = None
        state, patch = token_delta(previous, data, self.mode)
        self.state = state
        looks, now = state.looks, self.clock()
        update: dict[str, dict[str, str]] = {}
        if patch["reset"] is not None:
            self._titles, self._titles_at = [look.title for look in looks], now
        else:
            self._titles.extend(look.title for look in looks[len(self._titles) :])  # appended with their titles
            for pos, change in patch["update"].items():
                kept = {k: v for k, v in change.items() if k != "title"}
                if kept:
                    update[str(pos)] = kept  # JSON object keys must be strings
            if now - self._titles_at >= self.title_refresh:
                for i, look in enumerate(looks):
                    if look.title != self._titles[i]:
                        update.setdefault(str(state.start + i), {})["title"] = look.title
                        self._titles[i] = look.title
                self._titles_at = now
        self.seq += 1
        message = {"target": self.target, "run": self.run, "seq": self.seq, "patch": {**patch, "update": update}}
        if patch["reset"] is not None:
            self._backlog.clear()  # nothing before a reset matters any more
        else:
            plain = {pos: {k: v for k, v in change.items() if k != "title"} for pos, change in update.items()}
            self._backlog.append({**message, "patch": {**patch, "update": {k: v for k, v in plain.items() if v}}})
        self._last = message
        return message

    def recent(self) -> list[dict[str, Any]]:
        """What to send after :meth:`message`: the newest message, preceded (unless it is a reset)
        by up to ``BACKLOG - 1`` earlier patches without their tooltip changes, so a browser
        that missed a few catches up without a reset."""
        if self._last is None:
            return []
        older = list(self._backlog)[:-1] if self._last["patch"]["reset"] is None else []
        return [*older, self._last]

    def new_run(self) -> None:
        """A new run streams into the view: a fresh run id (the browser follows a new run's newest
        token) and a reset next."""
        self.run, self.seq, self.state = uuid.uuid4().hex[:12], 0, None
        self._backlog.clear()
        self._reset_pending = True

    def resync(self) -> None:
        """The browser lost track: the next message is a reset."""
        self._reset_pending = True

    def set_mode(self, mode: str) -> None:
        """Switch view mode; the next message is a reset."""
        if mode != self.mode:
            self.mode = mode
            self._reset_pending = True


def container_html(target: str, follow: str | None = None) -> str:
    """The empty container a channel streams into, under the box a clicked token's details are pinned in;
    ``follow`` is the elem_id of the "follow the newest token" checkbox it obeys."""
    toggle = f' data-follow="{follow}"' if follow else ""
    return pin_host(target, f'<div id="{target}" class="tv-container"{toggle}></div>')


def bus_payload(messages: dict[str, Any] | list[dict[str, Any]]) -> str:
    """One message or a list of them (applied in order), as the bus carries them."""
    return json.dumps(messages, ensure_ascii=False, separators=(",", ":"))


def chart_frame(
    messages: list[dict[str, Any]],
    charts: Mapping[str, go.Figure | None],
    done: bool,
    revision: str,
    first: bool = False,
) -> tuple[str, list[go.Figure | None]]:
    """One frame's bus payload and the figures for its ``gr.Plot`` outputs (``None``: leave it).

    ``charts`` maps a ``gr.Plot``'s elem_id to the frame's new figure for it (``None``: none due;
    in a run's ``first`` frame such a chart is dimmed, since it still shows the previous run, and
    the last frame undims them all).
    While the run streams, the new figures travel on the bus before ``messages`` (a payload still
    ends with the token views' newest patches) and the ``gr.Plot`` values stay; the last frame
    (``done``) sets them instead.  ``revision`` (one per run) becomes each figure's
    ``layout.uirevision``: plotly.js keeps what the user changed in a chart (a zoom, a series
    hidden from its legend) across the redraws of one run, and a run's last figure differs from
    the one an identical earlier run left in the ``gr.Plot``, so the ``gr.Plot`` draws it."""
    for figure in charts.values():
        if figure is not None:
            figure.update_layout(uirevision=revision)
    if done:
        return bus_payload([*({"chart": target, "dim": False} for target in charts), *messages]), list(charts.values())
    moving = [
        {"chart": target, "figure": figure.to_json()} if figure is not None else {"chart": target, "dim": True}
        for target, figure in charts.items()
        if figure is not None or first
    ]
    return bus_payload([*moving, *messages]), [None] * len(charts)


RESYNC_BUTTON_ID = "tv-resync"

PATCH_BUS_JS = (
    "(payload) => {\n"
    f"  const apply = ({TOKEN_PATCH_JS});\n"
    f"  const resyncId = {json.dumps(RESYNC_BUTTON_ID)};\n"
    """  if (!payload) return [];
  const messages = JSON.parse(payload);
  for (const m of (Array.isArray(messages) ? messages : [messages])) {
    if (m && m.chart) {
      // Redrawn in place as gr.Plot draws a figure (under a label), in a task of its own after the token
      // patches. Not once gr.Plot has drawn anew (the run's last frame: the chart found now is gone by then),
      // nor while hidden (a tab away): the next one, or the last frame, draws it then.
      const chart = document.querySelector(`#${m.chart} [data-testid=plotly]`);
      if (m.dim != null) {  // the previous run's chart, until this run's first figure (opacity: no redraw)
        if (chart) chart.style.opacity = m.dim ? '0.35' : '';
        continue;
      }
      setTimeout(() => {
        if (!window.Plotly || !chart || !chart.getClientRects().length) return;
        chart.style.opacity = '';
        const figure = JSON.parse(m.figure), layout = figure.layout || {};
        layout.autosize = true;
        layout.margin = {...layout.margin, autoexpand: true};
        if (layout.title) layout.margin.t = Math.max(100, layout.margin.t || 0);
        window.Plotly.react(chart, figure.data, layout, {...figure.config, responsive: true});
      });
      continue;
    }
    if (!m || !m.patch) continue;
    const root = document.getElementById(m.target);
    if (!root) continue;
    const sameRun = root.dataset.tvRun === m.run;
    const applied = sameRun ? Number(root.dataset.tvSeq) : 0;
    if (sameRun && m.seq <= applied) continue;  // seen already (Gradio repeats the last value)
    if (m.patch.reset == null && !(sameRun && m.seq === applied + 1)) {
      // A message was missed (a busy page merges changes): ask for a reset, at most once a second.
      const now = Date.now();
      if (!(now - (window.tvResyncAt || 0) < 1000)) {
        window.tvResyncAt = now;
        document.getElementById(resyncId)?.click();
      }
      continue;
    }
    // The checkbox is looked up each time: Gradio may render it anew, and a stale one clicks nothing.
    const followBox = () => root.dataset.follow ? document.querySelector(`#${root.dataset.follow} input`) : null;
    const toggle = followBox();
    if (toggle && !root.dataset.tvWatched) {
      // Scrolling up to read stops following; the view follows again when shown (a tab switch) or resized.
      root.dataset.tvWatched = "1";
      const stop = () => { const box = followBox(); if (box && box.checked) box.click(); };
      root.addEventListener("wheel", (e) => { if (e.deltaY < 0) stop(); }, {passive: true});
      root.addEventListener("keydown", (e) => { if (["ArrowUp", "PageUp", "Home"].includes(e.key)) stop(); });
      new ResizeObserver(() => { if (followBox()?.checked) root.scrollTop = root.scrollHeight; }).observe(root);
    }
    if (toggle && !sameRun && !toggle.checked) toggle.click();  // every new run follows its newest token
    const following = toggle ? toggle.checked : root.scrollHeight - root.scrollTop - root.clientHeight < 48;
    apply(root, m.patch);
    if (following) root.scrollTop = root.scrollHeight;
    root.dataset.tvRun = m.run;
    root.dataset.tvSeq = String(m.seq);
  }
  return [];
}"""
)
"""Gradio ``js=`` for the hidden bus ``gr.Textbox`` (a :func:`bus_payload` string)."""
