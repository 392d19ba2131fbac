"""Token views streamed to the browser as patches, never re-sent whole while a run appends.

Each token view is a plain ``<div id=…>`` container the UI owns.  A :class:`TokenChannel`
diffs every frame against the previous one with :func:`~thinkviz.viz.tokens.token_delta` and
wraps the patch in a message ``{"target", "run", "seq", "patch"}``.  All messages of a tab
travel through one hidden ``gr.JSON``; its ``.change`` runs :data:`PATCH_BUS_JS` in the
browser, which applies each message to its container.

Gradio fires ``.change`` again with the final value when a generator ends, so messages are
numbered: the browser applies a message only if it is the next one of the run it shows (or
a reset, which starts over).  A run's last frame is always a reset, so a view that missed a
message for any reason still ends exact.  A view scrolled to its end follows new tokens.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..viz.tokens import TOKEN_PATCH_JS, TokenViewState, token_delta

TITLE_REFRESH_SECONDS = 2.0


@dataclass
class TokenData:
    """Everything one token view frame shows: ``(n,)`` texts, scores, keep fractions, labels, spans."""

    texts: list[str]
    scores: np.ndarray | None
    keep_fraction: np.ndarray | None
    labels: list[str] | None
    spans: Sequence[Any]


@dataclass
class TokenChannel:
    """One token view in the browser: turns successive :class:`TokenData` into patch messages.

    Tooltips carry each token's current score, which changes every step for every scored
    token; sending them every frame would re-send most of the view.  Class changes (heat,
    eviction) go out every frame; tooltip changes at most every ``title_refresh`` seconds
    (resets always carry fresh ones, and a run's final frame is a reset).
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

    def message(self, data: TokenData, *, reset: bool = False) -> dict[str, Any]:
        """The patch from what the browser shows now to ``data`` (a whole view if ``reset``)."""
        if reset:
            self.state = None
        self.state, patch = token_delta(
            self.state, data.texts, data.scores, data.keep_fraction, data.labels, data.spans, self.mode
        )
        looks, now = self.state.looks, self.clock()
        update: dict[str, dict[str, str]] = {}
        if patch["reset"] is not None:
            self._titles, self._titles_at = [look.title for look in looks], now
        else:
            self._titles.extend(look.title for look in looks[len(self._titles):])  # appended with their titles
            for pos, change in patch["update"].items():
                kept = {k: v for k, v in change.items() if k != "title"}
                if kept:
                    update[str(pos)] = kept  # JSON object keys must be strings
            if now - self._titles_at >= self.title_refresh:
                for i, look in enumerate(looks):
                    if look.title != self._titles[i]:
                        update.setdefault(str(self.state.start + i), {})["title"] = look.title
                        self._titles[i] = look.title
                self._titles_at = now
        self.seq += 1
        return {"target": self.target, "run": self.run, "seq": self.seq, "patch": {**patch, "update": update}}

    def set_mode(self, mode: str) -> None:
        """Switch view mode; the next message is a reset."""
        if mode != self.mode:
            self.mode = mode
            self.state = None


def container_html(target: str) -> str:
    """The empty container a channel streams into."""
    return f'<div id="{target}" class="tv-container"></div>'


PATCH_BUS_JS = (
    "(messages) => {\n"
    f"  const apply = ({TOKEN_PATCH_JS});\n"
    """  for (const m of (Array.isArray(messages) ? messages : [messages])) {
    if (!m || !m.patch) continue;
    const root = document.getElementById(m.target);
    if (!root) continue;
    const fresh = m.patch.reset != null;
    const next = root.dataset.tvRun === m.run && Number(root.dataset.tvSeq) + 1 === m.seq;
    if (!fresh && !next) continue;
    if (fresh && root.dataset.tvRun === m.run && Number(root.dataset.tvSeq) >= m.seq) continue;
    const following = root.scrollHeight - root.scrollTop - root.clientHeight < 48;  // reader is at the end
    apply(root, m.patch);
    if (following) root.scrollTop = root.scrollHeight;
    root.dataset.tvRun = m.run;
    root.dataset.tvSeq = String(m.seq);
  }
  return [];
}"""
)
"""Gradio ``js=`` for a hidden ``gr.JSON`` carrying one message or a list of messages."""
