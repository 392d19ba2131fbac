"""A playback's charts, built once for a room.

Thirty students playing one preset's recording each drew the same memory and fidelity charts for
themselves: plotly figures of ~0.1 s of the one interpreter each, every few seconds, for every
client.  Profiled under ``bench load --clients 30 --mixed``, those builds were about half of the
server's Python time, and a live run in the model's line waited for the interpreter behind them.

So a playback's charts are drawn at fixed places along its recording (:func:`chart_position`: at most
``CHART_POINTS`` of them, the last step one of its own), the same places for every client, and
:class:`~thinkviz.demos.shared.SharedBuilds` builds each once: the first client to reach it builds
it, the others arriving meanwhile wait for that build, and later ones find it kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import plotly.graph_objects as go

from ..demos.playback import Playback
from ..demos.shared import SharedBuilds

CHART_POINTS = 40  # places along a recording where a playback's charts are drawn
KEPT = 64  # places whose charts are kept (a place's two charts are ~100 kB)


def chart_position(steps: int, position: int) -> int:
    """Which of a ``steps``-step timeline's fixed places stands for its step ``position``: the last one at
    or before it; the last step is a place of its own, so a finished playback's charts are exact."""
    if position >= steps - 1:
        return steps - 1
    stride = max(1, math.ceil(steps / CHART_POINTS))
    return position - position % stride


PLAYBACK_CHARTS: SharedBuilds[tuple[Any, Sequence[go.Figure | None]]] = SharedBuilds(KEPT)


def playback_charts(
    playback: Playback, done: bool, build: Callable[[Playback], Sequence[go.Figure | None]], *key: Hashable
) -> list[go.Figure | None]:
    """``build``'s figures of ``playback`` at its place along the recording (:func:`chart_position`; its own
    step once it is ``done``), built once for every client playing the same recording and view with the
    same ``key`` (what else the figures depend on); each caller gets its own copies (a frame sets its
    run's ``uirevision`` on them; a copy costs ~5 % of a build)."""
    position = playback.position
    if position < 0:  # nothing played yet
        return list(build(playback))
    place = position if done else chart_position(len(playback.steps), position)
    recording = playback.recording  # kept alive by its entry, so its id names it while the entry lasts
    _, built = PLAYBACK_CHARTS.get(
        (id(recording), playback.view, place, *key), lambda: (recording, build(playback.at(place)))
    )
    return [go.Figure(figure) if figure is not None else None for figure in built]
