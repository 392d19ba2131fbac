"""Plotly figures of a run: memory over time (with a projection onto a bigger model),
policy comparisons, the step × position keep/evict heatmap, and the empty chart shown before a run.

Pure functions of a :class:`~thinkviz.events.RunRecord` (and plain values); they read no
model and keep figures light: line traces are thinned to :data:`MAX_POINTS` points and
heatmaps to :data:`MAX_ROWS` × :data:`MAX_COLS` cells.

The x axis of time series is *tokens seen* (prompt + generated or replayed), so live
generation (one token per step) and replay (a chunk per step) read the same way.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..events import RunRecord
from ..memory import GIB, Projection
from ..policies import PolicyConfigError, policy_class
from ..units import format_bytes

MIB = 2**20
MAX_POINTS = 2000
MAX_ROWS = 256
MAX_COLS = 1024

KV_COLOUR, FULL_COLOUR, BUDGET_COLOUR, DEVICE_COLOUR, OOM_COLOUR = "#1f77b4", "#7f7f7f", "#2ca02c", "#9467bd", "#d62728"


# ---- series from a record ----------------------------------------------------------
def tokens_seen(record: RunRecord) -> np.ndarray:
    """``(S,)`` number of tokens the model has seen after each step."""
    return np.array([e.positions[-1] + 1 if e.positions else 0 for e in record.events], dtype=np.int64)


def bytes_per_token(record: RunRecord) -> int:
    """KV bytes one token costs on the recorded model: 2 · layers · kv_heads · head_dim · dtype bytes."""
    g = record.meta["geometry"]
    return 2 * int(g["layers"]) * int(g["kv_heads"]) * int(g["head_dim"]) * int(g["dtype_bytes"])


def _policy_evicts(record: RunRecord) -> bool:
    """Whether the recorded policy has a budget at all (the ``full`` reference does not)."""
    try:
        return policy_class(str(record.meta.get("policy"))).evicts
    except PolicyConfigError:  # a recording from a policy this version does not know
        return True


def _thin(n: int, limit: int) -> np.ndarray:
    """Indices of at most ``limit`` evenly spaced items of ``n``, first and last included."""
    if n <= limit:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, limit).round().astype(np.int64))


def device_series(
    record: RunRecord, device_stats: Mapping[int, Mapping[str, Any]] | None = None
) -> dict[str, np.ndarray]:
    """Device memory per step as ``{name: (S,) bytes}`` (NaN where not measured).

    ``device_stats`` maps a step to what :func:`thinkviz.memory.device_memory` returned then
    (the UI samples it per frame); otherwise each event's ``info["device_memory"]`` is used.
    Names: ``"GPU allocated"``, ``"GPU reserved"`` on CUDA, ``"process RSS"`` on the CPU.
    """
    names = {"allocated": "GPU allocated", "reserved": "GPU reserved", "rss": "process RSS"}
    out: dict[str, np.ndarray] = {}
    for i, event in enumerate(record.events):
        stats = device_stats.get(event.step) if device_stats is not None else event.info.get("device_memory")
        for key, name in names.items():
            if stats and key in stats:
                out.setdefault(name, np.full(len(record.events), np.nan))[i] = float(stats[key])
    return out


def device_cap(record: RunRecord, device_stats: Mapping[int, Mapping[str, Any]] | None = None) -> int | None:
    """The VRAM cap in bytes the run was measured under (its last reading), or ``None``."""
    for event in reversed(record.events):
        stats = device_stats.get(event.step) if device_stats is not None else event.info.get("device_memory")
        if stats and stats.get("cap") is not None:
            return int(stats["cap"])
    return None


def projected_oom_tokens(record: RunRecord, reserved: np.ndarray, cap: float) -> float | None:
    """Tokens seen when a full cache would take this device's reserved memory past ``cap``.

    What the device held besides the cache at the first reading stays; the full cache adds
    :func:`bytes_per_token` per token seen.  ``None`` without a reading.
    """
    measured = np.flatnonzero(~np.isnan(reserved))
    if not measured.size:
        return None
    first = measured[0]
    besides = reserved[first] - record.kv_bytes_series()[first]
    return (cap - besides) / bytes_per_token(record)


def oom_step(full_bytes: np.ndarray, policy_bytes: np.ndarray, available: float) -> int | None:
    """Index of the first step where the full cache exceeds ``available`` while the policy fits."""
    hits = np.flatnonzero((full_bytes > available) & (policy_bytes <= available))
    return int(hits[0]) if len(hits) else None


# ---- memory ------------------------------------------------------------------------
def memory_figure(
    record: RunRecord,
    *,
    projection: Projection | None = None,
    device_stats: Mapping[int, Mapping[str, Any]] | None = None,
) -> go.Figure:
    """KV bytes per step: physical cache, full-cache counterfactual, budget; device memory and
    weights on a second axis.  With ``projection``, a lower panel prices the same kept-token
    counts on the target model against the card's VRAM and marks where the full cache runs
    out of memory while the policy does not."""
    rows = 2 if projection is not None else 1
    fig = make_subplots(
        rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.12,
        specs=[[{"secondary_y": True}]] + [[{"secondary_y": False}]] * (rows - 1),
        subplot_titles=["This run (MiB)"] + ([_projection_title(projection)] if projection else []),
    )
    x = tokens_seen(record)
    pick = _thin(len(x), MAX_POINTS)
    steps = np.array([e.step for e in record.events])[pick]
    kv, full = record.kv_bytes_series(), record.full_kv_bytes_series()
    hover = "tokens %{x}<br>step %{customdata}<br>%{y:.3f} MiB<extra>%{fullData.name}</extra>"
    fig.add_trace(go.Scatter(x=x[pick], y=full[pick] / MIB, name="full cache (no eviction)", customdata=steps,
                             hovertemplate=hover, line=dict(color=FULL_COLOUR, dash="dash")), row=1, col=1)
    fig.add_trace(go.Scatter(x=x[pick], y=kv[pick] / MIB, name="KV cache (physical)", customdata=steps,
                             hovertemplate=hover, line=dict(color=KV_COLOUR, width=2.5)), row=1, col=1)
    if _policy_evicts(record) and len(x):
        budget = int(record.meta["budget"]) * bytes_per_token(record)
        fig.add_trace(go.Scatter(x=[x[0], x[-1]], y=[budget / MIB] * 2, mode="lines", hoverinfo="name",
                                 name=f"budget ({record.meta['budget']} tokens)",
                                 line=dict(color=BUDGET_COLOUR, dash="dot")), row=1, col=1)
    device = device_series(record, device_stats)
    for name, series in device.items():
        fig.add_trace(go.Scatter(x=x[pick], y=series[pick] / MIB, name=name, customdata=steps,
                                 hovertemplate=hover, connectgaps=True,
                                 line=dict(color=DEVICE_COLOUR, dash="dot" if "reserved" in name else "solid")),
                      row=1, col=1, secondary_y=True)
    cap = device_cap(record, device_stats)
    if cap is not None and "GPU reserved" in device:
        _add_cap(fig, record, cap, x, device["GPU reserved"])
    weights = record.meta.get("weights_bytes")
    if weights and len(x):
        fig.add_trace(go.Scatter(x=[x[0], x[-1]], y=[weights / MIB] * 2, mode="lines", hoverinfo="name",
                                 name=f"weights ({record.meta.get('quantization', '?')}, {format_bytes(weights)})",
                                 line=dict(color=DEVICE_COLOUR, width=1, dash="longdash")),
                      row=1, col=1, secondary_y=True)
    fig.update_yaxes(title_text="KV cache (MiB)", rangemode="tozero", row=1, col=1, secondary_y=False)
    fig.update_yaxes(title_text="device / weights (MiB)", rangemode="tozero", row=1, col=1, secondary_y=True,
                     showgrid=False)
    if projection is not None:
        _add_projection(fig, record, projection, x, pick)
    fig.update_xaxes(title_text="tokens seen", row=rows, col=1)
    fig.update_layout(height=360 * rows, margin=dict(l=60, r=60, t=50, b=40), hovermode="x unified",
                      legend=dict(orientation="h", y=-0.18 if rows == 1 else -0.08))
    return fig


def _add_cap(fig: go.Figure, record: RunRecord, cap: int, x: np.ndarray, reserved: np.ndarray) -> None:
    """On the device axis: the VRAM cap, and where a full cache would reach it on this device."""
    cross = projected_oom_tokens(record, reserved, cap)
    end = max(x[-1], cross) if cross is not None else x[-1]
    fig.add_trace(go.Scatter(x=[x[0], end], y=[cap / MIB] * 2, mode="lines", hoverinfo="name",
                             name=f"VRAM cap ({format_bytes(cap)})", line=dict(color=OOM_COLOUR, width=1.5)),
                  row=1, col=1, secondary_y=True)
    if cross is None or cross < x[0]:
        return
    first = int(np.flatnonzero(~np.isnan(reserved))[0])
    fig.add_trace(go.Scatter(
        x=[x[first], cross], y=[reserved[first] / MIB, cap / MIB], mode="lines+markers",
        name="full cache on this device (projected)", line=dict(color=OOM_COLOUR, dash="dash", width=1),
        marker=dict(symbol=["circle", "x"], size=[4, 13], color=OOM_COLOUR),
        hovertemplate=f"a full cache reaches the cap at {cross:,.0f} tokens<extra></extra>"),
        row=1, col=1, secondary_y=True)


def _projection_title(projection: Projection) -> str:
    return (f"Projected on {projection.target.name} ({projection.weights_bits}-bit weights), "
            f"{projection.card_gb:g} GiB card (GiB)")


def _add_projection(fig: go.Figure, record: RunRecord, projection: Projection, x: np.ndarray, pick: np.ndarray) -> None:
    """Lower panel: the run's kept tokens priced on the target model, the VRAM line, the OOM point."""
    kept = np.array([e.kv_tokens for e in record.events], dtype=np.int64)
    policy, full = projection.kv_bytes(kept), projection.kv_bytes(x)
    available = projection.available_bytes
    fig.add_trace(go.Scatter(x=x[pick], y=full[pick] / GIB, name=f"full cache on {projection.target.name}",
                             line=dict(color=FULL_COLOUR, dash="dash"), hovertemplate="%{y:.2f} GiB"), row=2, col=1)
    fig.add_trace(go.Scatter(x=x[pick], y=policy[pick] / GIB, name=f"policy on {projection.target.name}",
                             line=dict(color=KV_COLOUR, width=2.5), hovertemplate="%{y:.2f} GiB"), row=2, col=1)
    if len(x):
        fig.add_trace(go.Scatter(
            x=[x[0], x[-1]], y=[available / GIB] * 2, mode="lines", hoverinfo="name",
            name=f"{projection.card_gb:g} GiB card − weights ({format_bytes(projection.weights_bytes)})",
            line=dict(color=OOM_COLOUR, width=1.5)), row=2, col=1)
    hit = oom_step(full, policy, available)
    if available <= 0:
        note = f"the weights alone ({format_bytes(projection.weights_bytes)}) do not fit this card"
    elif hit is not None:
        fig.add_trace(go.Scatter(
            x=[x[hit]], y=[full[hit] / GIB], mode="markers", name="full cache out of memory",
            marker=dict(color=OOM_COLOUR, size=13, symbol="x"),
            hovertemplate=f"step {record.events[hit].step}: the full cache no longer fits, the policy does"
                          "<extra></extra>"), row=2, col=1)
        note = f"full cache runs out of memory at {x[hit]:,} tokens; the policy still fits"
    else:
        note = f"a full cache fits {projection.max_tokens:,} tokens on this card"
    fig.add_annotation(text=note, xref="x domain", yref="y domain", x=0.01, y=0.98, showarrow=False,
                       xanchor="left", yanchor="top", font=dict(color=OOM_COLOUR), row=2, col=1)
    fig.update_yaxes(title_text="KV cache (GiB)", rangemode="tozero", row=2, col=1)


def placeholder_figure(text: str) -> go.Figure:
    """An empty chart with a hint; showing one at page load also loads plotly.js before the first run."""
    figure = go.Figure()
    figure.add_annotation(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                          font=dict(size=14, color="#888"))
    figure.update_layout(height=260, xaxis_visible=False, yaxis_visible=False, plot_bgcolor="white",
                         margin=dict(l=20, r=20, t=20, b=20))
    return figure


def compare_memory_figure(records: Mapping[str, RunRecord]) -> go.Figure:
    """Physical KV bytes of several runs overlaid, with the full-cache curve of the longest one."""
    fig = go.Figure()
    longest = max(records.values(), key=lambda r: len(r.events), default=None)
    if longest is not None and longest.events:
        x = tokens_seen(longest)
        pick = _thin(len(x), MAX_POINTS)
        fig.add_trace(go.Scatter(x=x[pick], y=longest.full_kv_bytes_series()[pick] / MIB, name="full cache",
                                 line=dict(color=FULL_COLOUR, dash="dash")))
    for label, record in records.items():
        x = tokens_seen(record)
        pick = _thin(len(x), MAX_POINTS)
        fig.add_trace(go.Scatter(x=x[pick], y=record.kv_bytes_series()[pick] / MIB, name=label,
                                 hovertemplate="tokens %{x}<br>%{y:.3f} MiB"))
    fig.update_layout(height=360, margin=dict(l=60, r=20, t=40, b=40), title="KV cache by policy",
                      xaxis_title="tokens seen", yaxis_title="KV cache (MiB)", hovermode="x unified")
    fig.update_yaxes(rangemode="tozero")
    return fig


# ---- keep / evict heatmap ------------------------------------------------------------
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
    row_idx = _thin(matrix.shape[0], rows)
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
    scope = "all layers and heads" if layer is None and head is None else (
        f"layer {'all' if layer is None else layer}, kv-head {'all' if head is None else head}")
    fig = go.Figure(go.Heatmap(
        z=z, x=cols, y=steps, zmin=0.0, zmax=1.0, colorscale=[[0.0, "#303030"], [0.5, "#f2a541"], [1.0, "#7fb3e0"]],
        colorbar=dict(title="kept", tickformat=".0%"),
        hovertemplate="step %{y}<br>position %{x}<br>kept %{z:.0%}<extra></extra>",
    ))
    for span in record.segments:
        if span.get("kind") == "think":
            fig.add_vrect(x0=span["start"] - 0.5, x1=span["end"] - 0.5, line=dict(color="#e0a100", width=1),
                          annotation_text=f"think {int(span.get('index', 0)) + 1}", annotation_position="top left",
                          annotation_font_size=10)
    bounds = [(start, role) for start, role in turn_starts(record.segments) if start > 0]
    if bounds and len(steps):
        xs = [x for start, _ in bounds for x in (start - 0.5, start - 0.5, None)]
        ys = [y for _ in bounds for y in (steps[-1], steps[0], None)]
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines+text", text=[t for _, role in bounds for t in ("", role, "")],
            textposition="bottom right", textfont=dict(size=9, color="#3b4ba8"), hoverinfo="skip",
            line=dict(color="#3b4ba8", width=1, dash="dot"), showlegend=False, name="turns",
        ))
    fig.update_layout(height=420, margin=dict(l=60, r=20, t=50, b=40), title=f"Keep / evict — {scope}",
                      xaxis_title="position", yaxis_title="step", plot_bgcolor="white")  # white: not seen yet
    fig.update_yaxes(autorange="reversed")
    return fig
