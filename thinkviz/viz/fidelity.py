"""Per-token fidelity curves: how far each policy's next-token predictions move from the full cache's,
token by token, smoothed, over bands showing which segment each token is in.

A pure function of :class:`~thinkviz.measure.metrics.TokenFidelity` values (one per policy, as a
lockstep replay measures them) and a record's segment spans; the Compare tab draws it, and
anything else that measures fidelity per token can.  Two panels share the x axis (the
token's absolute position): ``ΔNLL = NLL(policy) − NLL(full)`` and ``KL(full ‖ policy)``,
both in nats, each a centred moving mean over ``window`` tokens (a single token's value is
noisy; a jump that lasts shows).  Think blocks, answers, code and later turns are shaded in
the token view's own segment colours.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..measure.metrics import TokenFidelity
from .compare_chart import SeriesStyle, series_styles
from .figures import streamed, thin
from .tokens import segment_colour

DEFAULT_WINDOW = 32
MAX_POINTS = 1500  # per curve, after smoothing
BAND_KINDS = ("think", "answer", "code", "tool", "user")


def smoothed(values: np.ndarray, window: int) -> np.ndarray:
    """``(n,)`` centred moving mean over ``window`` values (fewer at the ends), NaN-free input."""
    values = np.asarray(values, dtype=np.float64)
    if window <= 1 or len(values) == 0:
        return values
    kernel = np.ones(min(window, len(values)))
    sums = np.convolve(values, kernel, mode="same")
    counts = np.convolve(np.ones(len(values)), kernel, mode="same")
    return sums / counts


def _field(span: Any, name: str, default: Any = None) -> Any:
    return span.get(name, default) if isinstance(span, dict) else getattr(span, name, default)


def fidelity_figure(
    curves: Mapping[str, TokenFidelity],
    segments: Sequence[Any] = (),
    *,
    window: int = DEFAULT_WINDOW,
    texts: Sequence[str] | None = None,
    styles: Mapping[str, SeriesStyle] | None = None,
) -> go.Figure:
    """ΔNLL and KL per token for each policy in ``curves`` (name → its per-token fidelity).

    ``segments``: spans over absolute positions (:class:`~thinkviz.text.segments.Span` or their
    ``dict`` form); those of :data:`BAND_KINDS` inside the curves' range become background
    bands.  ``texts``: token texts by absolute position, shown on hover.  ``styles``: each policy's
    colour and dash, the same in both panels (default: :func:`~thinkviz.viz.compare_chart.series_styles`
    of ``curves``; the Compare tab passes its columns' styles, so a policy matches its memory line).
    """
    styles = series_styles(list(curves)) if styles is None else styles
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.1,
        subplot_titles=[
            f"ΔNLL per token vs the full cache (nats, mean of {window})",
            f"KL(full ‖ policy) per token (nats, mean of {window})",
        ],
    )
    lo, hi = None, None
    for name, fidelity in curves.items():
        positions = np.asarray(fidelity.positions)
        if not len(positions):
            continue
        lo = positions[0] if lo is None else min(lo, positions[0])
        hi = positions[-1] if hi is None else max(hi, positions[-1])
        pick = thin(len(positions), MAX_POINTS)
        hover_text = [texts[p] if texts is not None and 0 <= p < len(texts) else "" for p in positions[pick]]
        style = styles[name]
        for row, values, what in ((1, fidelity.nll - fidelity.nll_full, "ΔNLL"), (2, fidelity.kl, "KL")):
            fig.add_trace(
                go.Scatter(
                    x=positions[pick],
                    y=smoothed(values, window)[pick],
                    name=name,
                    legendgroup=name,
                    showlegend=row == 1,
                    customdata=hover_text,
                    line=dict(width=2, color=style.colour, dash=style.dash),
                    hovertemplate=f"position %{{x}} %{{customdata}}<br>{what} %{{y:.3f}}<extra>{name}</extra>",
                ),
                row=row,
                col=1,
            )
    if lo is not None:
        _bands(fig, segments, int(lo), int(hi) + 1)
    fig.add_hline(y=0, line=dict(color="#999", width=1), row=1, col=1)
    fig.update_yaxes(title_text="ΔNLL (nats)", row=1, col=1)
    fig.update_yaxes(title_text="KL (nats)", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="position (token)", row=2, col=1)
    fig.update_layout(
        height=480,
        margin=dict(l=60, r=20, t=50, b=40),
        hovermode="x unified",
        legend=dict(orientation="h", yanchor="top", y=-0.14),
        plot_bgcolor="white",
    )
    return streamed(fig)


def _bands(fig: go.Figure, segments: Sequence[Any], lo: int, hi: int) -> None:
    """Shade each banded span inside ``[lo, hi)`` in both panels; label the wider ones on top."""
    spans = [s for s in segments if _field(s, "kind") in BAND_KINDS]
    spans.sort(key=lambda s: BAND_KINDS.index(_field(s, "kind")))  # think first: code and answers on top
    for span in spans:
        kind, index = _field(span, "kind"), int(_field(span, "index", 0))
        start, end = max(lo, int(_field(span, "start", 0))), min(hi, int(_field(span, "end", 0)))
        if end <= start:
            continue
        label = f"{kind} {index + 1}" if kind == "think" else kind
        wide = (end - start) >= 0.04 * (hi - lo)
        fill = segment_colour(kind, index) or "#eeeeee"
        for row in (1, 2):
            # an annotation only where labelled: plotly writes "new text" into one given no text
            labelled = (
                dict(annotation_text=label, annotation_position="top left", annotation_font_size=10)
                if wide and row == 1
                else {}
            )
            fig.add_vrect(
                x0=start - 0.5,
                x1=end - 0.5,
                fillcolor=fill,
                opacity=0.7,
                line_width=0,
                layer="below",
                row=row,
                col=1,
                **labelled,
            )
