"""Where the kept tokens are: the step × position keep/evict heatmap of a run and the
layer × kv-head kept counts of one step.

Heatmaps are thinned to :data:`MAX_ROWS` steps × :data:`MAX_COLS` position bins.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from ..core.events import RunRecord
from .figures import placeholder_figure, thin

MAX_ROWS = 256
MAX_COLS = 1024


def keep_matrix(record: RunRecord, layer: int | None = None, head: int | None = None) -> np.ndarray:
    """``(S, N)`` fraction of slots holding each position after each step; NaN = not seen yet
    (or, per layer/head, not covered by a snapshot).

    ``layer`` / ``head`` ``None``: the events' ``keep_fraction`` (mean over all layers and
    kv-heads).  Otherwise the nearest snapshot ``(L, H_kv, T)`` at or before each step,
    averaged over the heads (``head=None``) or layers (``layer=None``) not chosen.
    """
    n = len(record.texts)
    matrix = np.full((len(record.events), n), np.nan, dtype=np.float32)
    if layer is None and head is None:
        for i, event in enumerate(record.events):
            values = np.asarray(event.keep_fraction, dtype=np.float32)[:n]
            matrix[i, : len(values)] = values
        return matrix
    if not record.snapshots:
        raise ValueError("this recording has no per-layer snapshots; choose 'all layers and heads'")
    layers, heads = next(iter(record.snapshots.values())).shape[:2]
    if layer is not None and not 0 <= layer < layers:
        raise ValueError(f"layer must be between 0 and {layers - 1}, got {layer}")
    if head is not None and not 0 <= head < heads:
        raise ValueError(f"head must be between 0 and {heads - 1}, got {head}")
    steps = sorted(record.snapshots)
    for i, event in enumerate(record.events):
        at = np.searchsorted(steps, event.step, side="right") - 1
        if at < 0:
            continue
        mask = record.snapshots[steps[at]]  # (L, H_kv, T)
        mask = mask[layer] if layer is not None else mask
        if head is not None:
            mask = mask[..., head, :]
        values = mask.reshape(-1, mask.shape[-1]).mean(axis=0)[:n]
        matrix[i, : len(values)] = values
    return matrix


def _downsample(matrix: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pick ≤ ``rows`` rows (steps are moments: thinned, not averaged) and average positions in
    ≤ ``cols`` bins (NaN-aware); return the matrix and the row / column index it starts at."""
    row_idx = thin(matrix.shape[0], rows)
    matrix = matrix[row_idx]
    n = matrix.shape[1]
    if n <= cols:
        return matrix, row_idx, np.arange(n)
    starts = np.linspace(0, n, cols + 1).astype(np.int64)[:-1]  # strictly increasing since n > cols
    seen = ~np.isnan(matrix)
    sums = np.add.reduceat(np.where(seen, matrix, 0.0), starts, axis=1)
    counts = np.add.reduceat(seen, starts, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        binned = np.where(counts > 0, sums / counts, np.nan).astype(np.float32)  # all-NaN bin: not seen yet
    return binned, row_idx, starts


_TURN_KINDS = ("system", "user", "tool", "assistant")


def turn_starts(segments: Sequence[dict]) -> list[tuple[int, str]]:
    """``(position, role)`` where each chat turn of a recording begins, from its turn spans; an
    assistant turn without a span of its own (the open one of a single-turn chat) begins where
    the turns before it end, when anything follows them."""
    turns = sorted((int(s["start"]), int(s["end"]), s["kind"]) for s in segments if s.get("kind") in _TURN_KINDS)
    last = max((int(s["end"]) for s in segments), default=0)
    starts = []
    for i, (start, end, kind) in enumerate(turns):
        starts.append((start, kind))
        following = turns[i + 1][0] if i + 1 < len(turns) else last
        if following > end:
            starts.append((end, "assistant"))
    return starts


def keep_heatmap(record: RunRecord, layer: int | None = None, head: int | None = None) -> go.Figure:
    """Step × position heatmap: kept (blue), partly kept (orange), evicted (dark), not yet seen
    (white); think blocks outlined, chat turns begin at the dotted lines."""
    matrix = keep_matrix(record, layer, head)
    z, rows, cols = _downsample(matrix, MAX_ROWS, MAX_COLS)
    steps = np.array([e.step for e in record.events], dtype=np.int64)[rows]
    scope = (
        "all layers and heads"
        if layer is None and head is None
        else (f"layer {'all' if layer is None else layer}, kv-head {'all' if head is None else head}")
    )
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=cols,
            y=steps,
            zmin=0.0,
            zmax=1.0,
            colorscale=[[0.0, "#303030"], [0.5, "#f2a541"], [1.0, "#7fb3e0"]],
            colorbar=dict(title="kept", tickformat=".0%"),
            hovertemplate="step %{y}<br>position %{x}<br>kept %{z:.0%}<extra></extra>",
        )
    )
    for span in record.segments:
        if span.get("kind") == "think":
            fig.add_vrect(
                x0=span["start"] - 0.5,
                x1=span["end"] - 0.5,
                line=dict(color="#e0a100", width=1),
                annotation_text=f"think {int(span.get('index', 0)) + 1}",
                annotation_position="top left",
                annotation_font_size=10,
            )
    bounds = [(start, role) for start, role in turn_starts(record.segments) if start > 0]
    if bounds and len(steps):
        xs = [x for start, _ in bounds for x in (start - 0.5, start - 0.5, None)]
        ys = [y for _ in bounds for y in (steps[-1], steps[0], None)]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines+text",
                text=[t for _, role in bounds for t in ("", role, "")],
                textposition="bottom right",
                textfont=dict(size=9, color="#3b4ba8"),
                hoverinfo="skip",
                line=dict(color="#3b4ba8", width=1, dash="dot"),
                showlegend=False,
                name="turns",
            )
        )
    fig.update_layout(
        height=420,
        margin=dict(l=60, r=20, t=50, b=40),
        title=f"Keep / evict — {scope}",
        xaxis_title="position",
        yaxis_title="step",
        plot_bgcolor="white",
    )  # white: not seen yet
    fig.update_yaxes(autorange="reversed")
    return fig


def kept_figure(record: RunRecord, index: int) -> go.Figure:
    """Tokens held per layer (rows, bottom layer first) and kv-head (columns) after event
    ``index``: the allocation a per-layer (pyramidkv) or per-head (adakv) budget made; one flat
    colour for a policy that keeps the same number everywhere."""
    geometry = record.meta.get("geometry") or {}
    event = record.events[index]
    counts = event.kept_counts(int(geometry.get("layers", 0)), int(geometry.get("kv_heads", 0)))  # (L, H_kv)
    if counts.size == 0:
        return placeholder_figure("this recording has no layer geometry")
    layers, heads = counts.shape
    fig = go.Figure(
        go.Heatmap(
            z=counts,
            x=[f"head {h}" for h in range(heads)],
            y=list(range(layers)),
            text=counts,
            texttemplate="%{text}" if counts.size <= 256 else None,
            colorscale="Blues",
            zmin=0,
            colorbar=dict(title="tokens"),
            hovertemplate="layer %{y}, %{x}: %{z} tokens<extra></extra>",
        )
    )
    fig.update_layout(
        height=max(260, 18 * layers + 120),
        margin=dict(l=60, r=20, t=50, b=40),
        title=f"Tokens held per layer and kv-head — step {event.step} "
        f"(mean {counts.mean():.1f}, total {int(counts.sum())})",
        xaxis_title="kv-head",
        yaxis_title="layer",
    )
    return fig
