"""What every Plotly chart of a run shares: its units, colours and thinning, the cheap-redraw
template of the charts a run redraws while it streams, and the empty chart shown before a run.

The charts themselves: :mod:`.memory_chart` (memory over time, with a projection onto a bigger
model), :mod:`.compare_chart` (policies overlaid), :mod:`.keep_maps` (the step × position
keep/evict heatmap and the layer × kv-head kept counts of one step).  They are pure functions of
a :class:`~thinkviz.core.events.RunRecord` (and plain values); they read no model and keep
figures light: line traces are thinned to :data:`MAX_POINTS` points.

The x axis of time series is *tokens seen* (prompt + generated or replayed), so live
generation (one token per step) and replay (a chunk per step) read the same way.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

MIB = 2**20
MAX_POINTS = 2000

KV_COLOUR, FULL_COLOUR, BUDGET_COLOUR, DEVICE_COLOUR, OOM_COLOUR = "#1f77b4", "#7f7f7f", "#2ca02c", "#9467bd", "#d62728"


def streamed(fig: go.Figure) -> go.Figure:
    """``fig`` made cheap to redraw, for the charts a run redraws while it streams (#11: a redraw is
    a main-thread task in the browser); it looks the same.

    Its tick labels may overflow the chart's edge (``ticklabeloverflow="allow"``; plotly.js's default
    hides those that would, measuring every label against the edge once per label, a quadratic
    number of bounding-box reads per redraw), and its template keeps only the default template's
    layout and scatter defaults (plotly.js applies the defaults of every trace type a template
    holds on each redraw, and these charts draw only scatter traces).
    """
    default = pio.templates[pio.templates.default]
    fig.update_layout(template=go.layout.Template(layout=default.layout, data={"scatter": default.data.scatter}))
    fig.update_xaxes(ticklabeloverflow="allow")
    fig.update_yaxes(ticklabeloverflow="allow")
    return fig


def thin(n: int, limit: int) -> np.ndarray:
    """Indices of at most ``limit`` evenly spaced items of ``n``, first and last included."""
    if n <= limit:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, limit).round().astype(np.int64))


def placeholder_figure(text: str) -> go.Figure:
    """An empty chart with a hint; showing one at page load also loads plotly.js before the first run."""
    figure = go.Figure()
    figure.add_annotation(
        text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font=dict(size=14, color="#888")
    )
    figure.update_layout(
        height=260, xaxis_visible=False, yaxis_visible=False, plot_bgcolor="white", margin=dict(l=20, r=20, t=20, b=20)
    )
    return figure
