"""Pareto figure of a sweep: KV memory kept (x) against fidelity lost (y), per policy.

Input rows are the sweep's (see :mod:`thinkviz.sweep.grid`): at least ``trace``, ``policy``,
``budget``, ``kv_fraction`` (peak KV bytes ÷ the full-precision full cache's) and the metric
plotted; ``kv_quant`` (the KV format, full precision when absent) picks the marker, so
"fewer tokens at full precision" and "every token at fewer bits" sit on one plot.  The
frontier connects the points no other point beats on both axes, across policies and formats:
less memory *and* better fidelity.  Pure: rows in, figure out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from ..core.kvquant import format_names
from ..measure.metrics import METRICS
from .tables import kv_label, run_label

# one marker per KV format (circle: full precision)
SYMBOLS = dict(zip(format_names(), ("circle", "square", "diamond", "x", "triangle-up")))


def pareto_front(points: Sequence[tuple[float, float]], higher_is_better: bool = False) -> list[int]:
    """Indices of the non-dominated ``(memory, loss)`` points, by increasing memory.

    A point is on the front when no other point has less or equal memory and a strictly
    better metric (lower, or higher when ``higher_is_better``).  NaN points are skipped.
    """
    sign = -1.0 if higher_is_better else 1.0
    order = sorted(
        (i for i, (x, y) in enumerate(points) if not (math.isnan(x) or math.isnan(y))),
        key=lambda i: (points[i][0], sign * points[i][1]),
    )
    front, best = [], math.inf
    for i in order:
        value = sign * points[i][1]
        if value < best:
            front.append(i)
            best = value
    return front


def _number(value) -> float:
    return float("nan") if value is None else float(value)


def pareto_figure(rows: list[dict], metric: str = "kl") -> go.Figure:
    """Scatter of memory vs ``metric`` (one colour per policy, one marker per KV format, one panel
    per trace) with the front."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    title, higher = METRICS[metric]
    traces = list(dict.fromkeys(row["trace"] for row in rows))
    policies = list(dict.fromkeys(run_label(row) for row in rows))
    series = list(dict.fromkeys((run_label(row), kv_label(row)) for row in rows))
    palette = qualitative.Plotly if len(policies) <= len(qualitative.Plotly) else qualitative.Dark24
    colours = {p: palette[i % len(palette)] for i, p in enumerate(policies)}
    figure = make_subplots(rows=1, cols=max(1, len(traces)), subplot_titles=traces or None, shared_yaxes=True)
    for col, trace in enumerate(traces, start=1):
        mine = [row for row in rows if row["trace"] == trace]
        for policy, fmt in series:
            points = [row for row in mine if run_label(row) == policy and kv_label(row) == fmt]
            if not points:
                continue
            points.sort(key=lambda row: _number(row["kv_fraction"]))
            name = policy if fmt == "none" else f"{policy} · {fmt}"
            figure.add_trace(
                go.Scatter(
                    x=[100 * _number(row["kv_fraction"]) for row in points],
                    y=[_number(row[metric]) for row in points],
                    mode="lines+markers",
                    name=name,
                    legendgroup=name,
                    showlegend=col == 1,
                    marker={"color": colours[policy], "size": 9, "symbol": SYMBOLS.get(fmt.split("/")[0], "circle")},
                    line={"color": colours[policy], "width": 1, "dash": "solid" if fmt == "none" else "dot"},
                    text=[f"budget {row['budget']}, KV {fmt}" for row in points],
                    hovertemplate=(
                        f"<b>{policy}</b> %{{text}}<br>KV kept %{{x:.1f}}%<br>{metric} %{{y:.4g}}<extra>{trace}</extra>"
                    ),
                ),
                row=1,
                col=col,
            )
        xy = [(_number(row["kv_fraction"]), _number(row[metric])) for row in mine]
        front = pareto_front(xy, higher)
        figure.add_trace(
            go.Scatter(
                x=[100 * xy[i][0] for i in front],
                y=[xy[i][1] for i in front],
                mode="lines",
                name="Pareto front",
                legendgroup="front",
                showlegend=col == 1,
                line={"color": "rgba(80,80,80,0.6)", "dash": "dash", "width": 2},
                hoverinfo="skip",
            ),
            row=1,
            col=col,
        )
        figure.update_xaxes(title_text="peak KV memory, % of the full-precision full cache", row=1, col=col)
    figure.update_yaxes(title_text=title, row=1, col=1)
    figure.update_layout(
        title=f"Memory vs fidelity: {'up' if higher else 'down'} and to the left is better",
        template="plotly_white",
        hovermode="closest",
        height=520,
        # below the panels: a side legend of 12 policies + the front scrolls out of sight
        legend={"orientation": "h", "yanchor": "top", "y": -0.22, "xanchor": "left", "x": 0},
        margin={"b": 140},
    )
    return figure
