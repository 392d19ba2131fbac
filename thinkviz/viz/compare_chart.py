"""The Compare tab's memory chart: several runs' KV bytes overlaid, one style per policy that the
per-token fidelity curves (:mod:`.fidelity`) share."""

from __future__ import annotations

from typing import NamedTuple
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from ..core.events import RunRecord
from .figures import FULL_COLOUR, MAX_POINTS, MIB, streamed, thin
from .run_series import tokens_seen

COMPARE_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
COMPARE_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "star")
COMPARE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")  # D3's first six


class SeriesStyle(NamedTuple):
    """How one compared run is drawn in every Compare chart: its colour, dash and marker."""

    colour: str
    dash: str
    symbol: str


def series_styles(names: Sequence[str]) -> dict[str, SeriesStyle]:
    """One style per name, by its place in ``names`` (the Compare columns' order), so a policy
    looks the same in the memory chart and in the per-token fidelity curves."""
    return {
        name: SeriesStyle(
            COMPARE_COLOURS[i % len(COMPARE_COLOURS)],
            COMPARE_DASHES[i % len(COMPARE_DASHES)],
            COMPARE_SYMBOLS[i % len(COMPARE_SYMBOLS)],
        )
        for i, name in enumerate(names)
    }


def coinciding(series: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> list[list[str]]:
    """Groups (two or more names, in order) of ``{name: (x, y)}`` series that are the same line."""
    groups: list[list[str]] = []
    for name, (x, y) in series.items():
        for group in groups:
            gx, gy = series[group[0]]
            if len(gx) == len(x) and np.array_equal(gx, x) and np.allclose(gy, y):
                group.append(name)
                break
        else:
            groups.append([name])
    return [group for group in groups if len(group) > 1]


def compare_memory_figure(records: Mapping[str, RunRecord]) -> go.Figure:
    """Physical KV bytes of several runs overlaid, with the full-cache curve of the longest one.

    Each run has its own colour, dash and marker (:func:`series_styles`, by its place in
    ``records``); runs with the same memory at every step (a budget every policy holds) are drawn
    widest first and thinner on top, so each stays visible, and a note names the policies that
    coincide.
    """
    fig = go.Figure()
    longest = max(records.values(), key=lambda r: len(r.events), default=None)
    series: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if longest is not None and longest.events:
        x = tokens_seen(longest)
        pick = thin(len(x), MAX_POINTS)
        series["full cache"] = (x[pick], longest.full_kv_bytes_series()[pick] / MIB)
        fig.add_trace(
            go.Scatter(
                x=series["full cache"][0],
                y=series["full cache"][1],
                name="full cache",
                line=dict(color=FULL_COLOUR, dash="dash"),
            )
        )
    for label, record in records.items():
        x = tokens_seen(record)
        pick = thin(len(x), MAX_POINTS)
        series[label] = (x[pick], record.kv_bytes_series()[pick] / MIB)
    groups = coinciding(series)
    styles = series_styles(list(records))
    for label in records:
        group = next((g for g in groups if label in g), [label])
        above = len(group) - 1 - group.index(label)  # lines of its group drawn after it, on top
        style = styles[label]
        fig.add_trace(
            go.Scatter(
                x=series[label][0],
                y=series[label][1],
                name=label,
                mode="lines+markers",
                line=dict(color=style.colour, dash=style.dash, width=2 + 2.5 * above),
                marker=dict(color=style.colour, symbol=style.symbol, size=7 + 3 * above, maxdisplayed=14),
                hovertemplate="tokens %{x}<br>%{y:.3f} MiB",
            )
        )
    for i, group in enumerate(groups):
        fig.add_annotation(
            text="same memory at every step: " + " = ".join(group),
            xref="paper",
            yref="paper",
            x=0.01,
            y=0.99 - 0.07 * i,
            showarrow=False,
            xanchor="left",
            yanchor="top",
            font=dict(size=12, color="#374151"),
            bgcolor="rgba(255,255,255,0.8)",
        )
    fig.update_layout(
        height=360,
        margin=dict(l=60, r=20, t=40, b=40),
        title="KV cache by policy",
        xaxis_title="tokens seen",
        yaxis_title="KV cache (MiB)",
        hovermode="x unified",
    )
    fig.update_yaxes(rangemode="tozero")
    return streamed(fig)
