"""The Lessons tab's view of one step: the narration, "N / M", and one view — the run's tokens at the
step's frame with the named tokens marked, or its chart with the frame and the named region marked.

Pure functions of a resolved lesson step (:mod:`thinkviz.demos.lessons`, read from the recordings:
no model, no Gradio), which tests call directly.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go

from ..demos.lesson_facts import RunAt
from ..demos.lessons import Lesson, LessonStep, built_steps
from ..demos.playback import PlayedRun
from ..viz.compare_chart import compare_memory_figure
from ..viz.fidelity import fidelity_figure
from ..viz.keep_maps import keep_heatmap
from ..viz.legend import view_legend
from ..viz.memory_chart import memory_figure
from ..viz.tokens import render_tokens
from .explore_views import token_data_at

MARK_CLASS = "tv-mark"  # a highlighted token (app.css)
MARK_COLOUR = "rgba(255, 196, 0, 0.28)"
FRAME_COLOUR = "#d62728"


@dataclass(frozen=True)
class LessonView:
    """What the tab shows for one step (``tokens`` or ``figure`` is the one view; ``problem``: why the step
    cannot be shown, instead of both)."""

    title: str
    narration: str  # plain text
    indicator: str  # "N / M"
    caption: str  # which recording, run and step the view shows
    tokens: str | None = None
    figure: Any | None = None
    problem: str | None = None


def step_index(lesson: Lesson, step: Any) -> int:
    """``step`` (1-based, as a link or the indicator says it) as an index into the lesson, clamped to its steps."""
    try:
        number = int(step)
    except (TypeError, ValueError):
        number = 1
    return min(max(number, 1), len(lesson.steps)) - 1


def lesson_view(lesson: Lesson, index: int) -> LessonView:
    """Step ``index`` (0-based) of ``lesson``."""
    step = built_steps(lesson)[index]
    indicator = f"{index + 1} / {len(lesson.steps)}"
    if isinstance(step, str):
        return LessonView(lesson.title, "", indicator, "", problem=f"This step cannot be shown: {step}")
    spec, run = step.spec, step.run
    caption = f"{run.recording.preset} · {run.label} · step {run.record.events[step.frame].step} of {run.frames - 1}"
    if spec.chart == "none":
        return LessonView(lesson.title, step.narration, indicator, caption, tokens=step_tokens(step))
    return LessonView(lesson.title, step.narration, indicator, caption, figure=step_figure(step))


def mark(tokens_html: str, positions: tuple[int, ...]) -> str:
    """``tokens_html`` with the tokens at ``positions`` given the :data:`MARK_CLASS` class."""
    if not positions:
        return tokens_html
    wanted = {str(p) for p in positions}

    def one(match: re.Match) -> str:
        classes, pos = match.group(1), match.group(2)
        return f'class="{classes} {MARK_CLASS}" data-pos="{pos}"' if pos in wanted else match.group(0)

    return re.sub(r'class="([^"]*)" data-pos="(\d+)"', one, tokens_html)


def step_tokens(step: LessonStep) -> str:
    """The run's token view at the frame, in the step's mode, its legend above, the named tokens marked."""
    record = step.run.record
    data, _, _ = token_data_at(record, step.frame)
    legend = view_legend(step.spec.mode, str(record.meta.get("policy")), data)
    view = mark(render_tokens(data, step.spec.mode), step.highlight)
    return f"{legend}<div class='tv-container'>{view}</div>"


def _as_shown(run: RunAt, index: int, frame: int):
    """Run ``index`` of ``run``'s recording as it stood after event ``frame``."""
    played = PlayedRun(run.recording, index)
    played.show(min(frame, len(played.full.events) - 1) + 1)
    return played.record


def step_figure(step: LessonStep) -> go.Figure:
    """The step's chart, drawn as the run stood at the frame, with the frame and the named region marked."""
    run, chart, frame = step.run, step.spec.chart, step.frame
    compare = step.spec.tab == "compare"
    indexes = list(range(len(run.recording.labels))) if compare else [run.index]  # Compare: every column
    labels = run.recording.labels
    if chart == "memory":
        if compare:
            fig = compare_memory_figure({labels[i]: _as_shown(run, i, frame) for i in indexes})
        else:
            fig = memory_figure(_as_shown(run, run.index, frame), projection=run.projection)
    elif chart == "keep":
        fig = keep_heatmap(_as_shown(run, run.index, frame))
    else:
        seen = int(run.seen()[frame])
        curves = {}
        for i in indexes:
            other = RunAt(run.recording, i, labels[i] if i < len(labels) else run.label)
            found = other.fidelity()
            if found is not None and len(found.positions):
                curves[other.label] = found.first(int(np.searchsorted(found.positions, seen)))
        fig = fidelity_figure(curves, run.record.segments, texts=run.record.texts)
    return _marked(fig, chart, int(run.seen()[frame]), step.highlight)


def _marked(fig: go.Figure, chart: str, seen: int, highlight: tuple[int, ...]) -> go.Figure:
    where = {"row": "all", "col": "all"} if fig._grid_ref is not None else {}
    if chart != "keep":  # the keep map has the steps on its y axis: the region alone
        fig.add_vline(x=seen, line_dash="dot", line_color=FRAME_COLOUR, **where)
    if highlight:
        fig.add_vrect(
            x0=highlight[0], x1=highlight[-1] + 1, fillcolor=MARK_COLOUR, line_width=0, layer="below", **where
        )
    return fig


def narration_html(view: LessonView) -> str:
    """The narration (or the step's problem) as the tab shows it, large, labelled for screen readers."""
    text = view.problem or view.narration
    attributes = 'class="tv-lesson-narration" role="region" aria-label="lesson narration" aria-live="polite"'
    return f"<div {attributes}>{html.escape(text)}</div>"
