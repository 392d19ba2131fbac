"""The Live tab's memory chart: KV bytes per step against the full cache and the budget, the
device's memory under it, and the same run projected onto a bigger model and its card.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..core.events import RunRecord
from ..core.kvquant import KVQuant
from ..memory import GIB, Projection
from ..units import format_bytes
from .figures import BUDGET_COLOUR, DEVICE_COLOUR, FULL_COLOUR, KV_COLOUR, MAX_POINTS, MIB, OOM_COLOUR, streamed, thin
from .memory_projection import ProjectionOutcome, kept_cap, projection_outcome
from .run_series import (
    budget_series,
    budget_token_bytes,
    device_cap,
    device_series,
    policy_evicts,
    projected_oom_tokens,
    tokens_seen,
)
from .tables import peak_kv_bytes, record_kv_quant


def memory_figure(
    record: RunRecord,
    *,
    projection: Projection | None = None,
    device_stats: Mapping[int, Mapping[str, Any]] | None = None,
    show_device: bool = False,
) -> go.Figure:
    """KV bytes per step on the main axis: physical cache, full-cache counterfactual, budget.

    ``show_device`` (or a VRAM cap in force) adds a small panel under it with the process's or
    GPU's memory and the weights, which dwarf a small model's cache and so get their own axis.
    When a ragged keep set padded some heads, a second line shows the logical bytes (the slots
    that hold tokens) under the physical ones (padding included).
    With ``projection``, a lower panel prices the same kept-token counts on the target model
    against the card's VRAM, on its own x axis: past the run's end the full cache and the
    policy's growth are extrapolated (dotted, labelled) to where they outgrow the card, and
    :meth:`ProjectionOutcome.notes` says what that means for this policy.  The first panel also
    draws the cap the policy holds its cache at where it differs from the budget, and the run's
    peak KV (:func:`~.tables.peak_kv_bytes`).
    """
    cap = device_cap(record, device_stats)
    device = show_device or cap is not None
    titles = ["KV cache of this run (MiB)"] + (["Process memory and weights (MiB)"] if device else [])
    heights = [3.0] + ([1.4] if device else [])
    if projection is not None:
        titles.append(_projection_title(projection))
        heights.append(3.0)
    rows = len(titles)
    fig = make_subplots(
        rows=rows, cols=1, vertical_spacing=0.16 if rows > 1 else 0.1, subplot_titles=titles, row_heights=heights
    )
    x = tokens_seen(record)
    pick = thin(len(x), MAX_POINTS)
    steps = np.array([e.step for e in record.events])[pick]
    kv, full = record.kv_bytes_series(), record.full_kv_bytes_series()
    fmt = record_kv_quant(record)
    in_format = f", {fmt.label}" if fmt.spec.quantized else ""
    hover = "tokens %{x}<br>step %{customdata}<br>%{y:.3f} MiB<extra>%{fullData.name}</extra>"
    full_name = "full cache (no eviction, full precision)" if fmt.spec.quantized else "full cache (no eviction)"
    fig.add_trace(
        go.Scatter(
            x=x[pick],
            y=full[pick] / MIB,
            name=full_name,
            customdata=steps,
            hovertemplate=hover,
            line=dict(color=FULL_COLOUR, dash="dash"),
        ),
        row=1,
        col=1,
    )
    logical = record.logical_kv_bytes_series()
    padded = bool((logical != kv).any())
    fig.add_trace(
        go.Scatter(
            x=x[pick],
            y=kv[pick] / MIB,
            customdata=steps,
            hovertemplate=hover,
            name=f"KV cache (physical{in_format}, padding included)" if padded else f"KV cache (physical{in_format})",
            line=dict(color=KV_COLOUR, width=2.5),
        ),
        row=1,
        col=1,
    )
    if padded:
        fig.add_trace(
            go.Scatter(
                x=x[pick],
                y=logical[pick] / MIB,
                name="KV cache (logical: tokens held)",
                customdata=steps,
                hovertemplate=hover,
                line=dict(color=KV_COLOUR, width=1.5, dash="dot"),
            ),
            row=1,
            col=1,
        )
    _add_budget(fig, record, x, pick)
    _add_peak(fig, record, x)
    fig.update_yaxes(title_text="KV cache (MiB)", rangemode="tozero", row=1, col=1)
    if device:
        _add_device(fig, record, device_stats, cap, x, pick, steps, hover)
    fig.update_xaxes(title_text="tokens seen", row=2 if device else 1, col=1)
    if projection is not None:
        _add_projection(fig, record, projection, x, pick, rows)
    height = 330 + (170 if device else 0) + (380 if projection is not None else 0)
    fig.update_layout(
        height=height,
        margin=dict(l=60, r=20, t=50, b=40),
        hovermode="x unified",
        legend=dict(orientation="h", yanchor="top", y=-70 / height),
    )  # under the last x title
    return streamed(fig)


def _add_budget(fig: go.Figure, record: RunRecord, x: np.ndarray, pick: np.ndarray) -> None:
    """On the first panel: the budget and, where the tokens kept by rule (protected spans, sinks,
    the recent window) outnumber it, the cap the cache is held at instead
    (:class:`~.memory_projection.KeptCap`), so the KV line sits under a line that says why."""
    if not policy_evicts(record) or not len(x):
        return
    budget, label = budget_series(record, x)
    fraction = record.meta.get("params", {}).get("budget_mode") == "fraction"
    ends = pick if fraction else np.array([0, len(x) - 1])
    line = dict(mode="lines", hoverinfo="name")
    fig.add_trace(
        go.Scatter(x=x[ends], y=budget[ends] / MIB, name=label, line=dict(color=BUDGET_COLOUR, dash="dot"), **line),
        row=1,
        col=1,
    )
    cap = kept_cap(record)
    if cap is None or cap.fraction is not None or cap.forced <= cap.budget:
        return
    top = int(cap.at(x[-1]))
    name = f"cap ({top:,} tokens: {cap.label()})"
    _add_level(fig, x, top * budget_token_bytes(record), name, dict(color=BUDGET_COLOUR, dash="dash", width=1.5), 1)


def _add_peak(fig: go.Figure, record: RunRecord, x: np.ndarray) -> None:
    """On the first panel: the run's peak KV (:func:`~.tables.peak_kv_bytes`), which is above the
    line where the cache held more inside a step, before the step compressed it."""
    if not len(x):
        return
    peak = peak_kv_bytes(record)
    inside = " (inside a step, before it compressed)" if peak > int(record.kv_bytes_series().max()) else ""
    line = dict(color=KV_COLOUR, width=1, dash="longdashdot")
    _add_level(fig, x, peak, f"peak KV {format_bytes(peak)}{inside}", line, 1)


def _add_level(fig: go.Figure, x: np.ndarray, level: float, name: str, line: dict, row: int) -> None:
    """A flat line at ``level`` bytes (drawn in MiB) across the run's tokens ``x`` on panel ``row``."""
    fig.add_trace(
        go.Scatter(x=[x[0], x[-1]], y=[level / MIB] * 2, mode="lines", hoverinfo="name", name=name, line=line),
        row=row,
        col=1,
    )


def _add_device(
    fig: go.Figure,
    record: RunRecord,
    device_stats: Mapping[int, Mapping[str, Any]] | None,
    cap: int | None,
    x: np.ndarray,
    pick: np.ndarray,
    steps: np.ndarray,
    hover: str,
) -> None:
    """Second panel (its y axis is ``y2``, its x axis follows the first): device memory, weights, the VRAM cap."""
    device = device_series(record, device_stats)
    for name, series in device.items():
        fig.add_trace(
            go.Scatter(
                x=x[pick],
                y=series[pick] / MIB,
                name=name,
                customdata=steps,
                hovertemplate=hover,
                connectgaps=True,
                line=dict(color=DEVICE_COLOUR, dash="dot" if "reserved" in name else "solid"),
            ),
            row=2,
            col=1,
        )
    if cap is not None and "GPU reserved" in device:
        _add_cap(fig, record, cap, x, device["GPU reserved"])
    weights = record.meta.get("weights_bytes")
    if weights and len(x):
        name = f"weights ({record.meta.get('quantization', '?')}, {format_bytes(weights)})"
        _add_level(fig, x, weights, name, dict(color=DEVICE_COLOUR, width=1, dash="longdash"), 2)
    fig.update_yaxes(title_text="MiB", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(matches="x", row=2, col=1)


def _add_cap(fig: go.Figure, record: RunRecord, cap: int, x: np.ndarray, reserved: np.ndarray) -> None:
    """On the device panel: the VRAM cap, and where a full cache would reach it on this device."""
    cross = projected_oom_tokens(record, reserved, cap)
    end = max(x[-1], cross) if cross is not None else x[-1]
    fig.add_trace(
        go.Scatter(
            x=[x[0], end],
            y=[cap / MIB] * 2,
            mode="lines",
            hoverinfo="name",
            name=f"VRAM cap ({format_bytes(cap)})",
            line=dict(color=OOM_COLOUR, width=1.5),
        ),
        row=2,
        col=1,
    )
    if cross is None or cross < x[0]:
        return
    first = int(np.flatnonzero(~np.isnan(reserved))[0])
    fig.add_trace(
        go.Scatter(
            x=[x[first], cross],
            y=[reserved[first] / MIB, cap / MIB],
            mode="lines+markers",
            name="full cache on this device (projected)",
            line=dict(color=OOM_COLOUR, dash="dash", width=1),
            marker=dict(symbol=["circle", "x"], size=[4, 13], color=OOM_COLOUR),
            hovertemplate=f"a full cache reaches the cap at {cross:,.0f} tokens<extra></extra>",
        ),
        row=2,
        col=1,
    )


def _projection_title(projection: Projection) -> str:
    return (
        f"Projected on {projection.target.name} ({projection.weights_bits}-bit weights), "
        f"{projection.card_gb:g} GiB card (GiB)"
    )


def _add_projection(
    fig: go.Figure, record: RunRecord, projection: Projection, x: np.ndarray, pick: np.ndarray, row: int
) -> None:
    """Bottom panel: the run's kept tokens priced on the target model in the run's KV format, the
    full-precision full cache, the card's room, where each cache outgrows it (extrapolated past the
    run's end, dotted), and the notes."""
    kept = np.array([e.kv_tokens for e in record.events], dtype=np.int64)
    fmt = record_kv_quant(record)
    policy, full = projection.kv_bytes(kept, fmt), projection.kv_bytes(x)
    available = projection.available_bytes
    outcome = projection_outcome(record, projection)
    target = projection.target.name
    fig.add_trace(
        go.Scatter(
            x=x[pick],
            y=full[pick] / GIB,
            name=f"full cache on {target}",
            line=dict(color=FULL_COLOUR, dash="dash"),
            hovertemplate="%{y:.2f} GiB",
        ),
        row=row,
        col=1,
    )
    in_format = f" ({fmt.label})" if fmt.spec.quantized else ""
    fig.add_trace(
        go.Scatter(
            x=x[pick],
            y=policy[pick] / GIB,
            name=f"policy on {target}{in_format}",
            line=dict(color=KV_COLOUR, width=2.5),
            hovertemplate="%{y:.2f} GiB",
        ),
        row=row,
        col=1,
    )
    if not len(x):
        return
    horizon = outcome.horizon
    if outcome.extrapolated:
        _add_extrapolation(fig, projection, outcome, fmt, row)
    fig.add_trace(
        go.Scatter(
            x=[x[0], max(x[-1], horizon)],
            y=[available / GIB] * 2,
            mode="lines",
            hoverinfo="name",
            name=f"{projection.card_gb:g} GiB card − weights ({format_bytes(projection.weights_bytes)})",
            line=dict(color=OOM_COLOUR, width=1.5),
        ),
        row=row,
        col=1,
    )
    notes = _add_out_of_memory(fig, projection, outcome, row)
    _add_notes(fig, notes, row)
    top = max(available, float(projection.kv_bytes(max(x[-1], horizon))), float(policy.max())) / GIB
    fig.update_xaxes(title_text="tokens seen (projection)", rangemode="tozero", row=row, col=1)
    fig.update_yaxes(title_text="KV cache (GiB)", range=[0, top * (1 + 0.12 * (len(notes) + 1))], row=row, col=1)


def _add_extrapolation(
    fig: go.Figure, projection: Projection, outcome: ProjectionOutcome, fmt: KVQuant, row: int
) -> None:
    """On the projection panel, past the run's end: the full cache and, when the policy compresses,
    its cache as its own rule projects it (:meth:`ProjectionOutcome.kept_at`: up to its cap, or
    growing), to the horizon (dotted)."""
    ahead = np.array([outcome.end, outcome.horizon])
    fig.add_trace(
        go.Scatter(
            x=ahead,
            y=projection.kv_bytes(ahead) / GIB,
            mode="lines",
            hoverinfo="name",
            name="full cache, extrapolated",
            line=dict(color=FULL_COLOUR, dash="dot"),
        ),
        row=row,
        col=1,
    )
    if outcome.compressed:
        ahead = np.linspace(outcome.end, outcome.horizon, 65)
        grown = outcome.kept_at(ahead)
        fig.add_trace(
            go.Scatter(
                x=ahead,
                y=projection.kv_bytes(grown, fmt) / GIB,
                mode="lines",
                hoverinfo="name",
                name=f"policy, extrapolated ({_future(outcome)})",
                line=dict(color=KV_COLOUR, width=1.5, dash="dot"),
            ),
            row=row,
            col=1,
        )
    fig.add_vline(
        x=outcome.end,
        line=dict(color="#999", width=1, dash="dot"),
        row=row,
        col=1,
        annotation_text="end of this run",
        annotation_position="top",
        annotation_font_size=10,
    )


def _future(outcome: ProjectionOutcome) -> str:
    """How the policy's cache goes on past the run, in a few words."""
    cap = outcome.cap
    if cap is not None and cap.fraction is None:
        top = int(cap.at(outcome.end))
        return f"holds its cap of {top:,} tokens" if outcome.reached else f"grows to its cap of {top:,} tokens"
    if outcome.grows:
        return f"grows {outcome.growth:.2f} tokens per token seen" if cap is None else f"keeps {cap.fraction:.0%}"
    return "holds its size"


def _add_out_of_memory(fig: go.Figure, projection: Projection, outcome: ProjectionOutcome, row: int) -> list[str]:
    """On the projection panel: a cross where the full cache and a compressing policy outgrow the
    card; returns the panel's notes (why nothing fits, when the weights alone do not)."""
    available = projection.available_bytes
    if available <= 0:
        return [f"the weights alone ({format_bytes(projection.weights_bytes)}) do not fit this card"]
    for at, who in (
        (outcome.full_oom, "full cache"),
        (outcome.policy_oom if outcome.compressed else None, outcome.policy),
    ):
        if at is None:
            continue
        late = at > outcome.end
        height = projection.kv_bytes(at) if who == "full cache" else available  # where the line meets the card
        fig.add_trace(
            go.Scatter(
                x=[at],
                y=[height / GIB],
                mode="markers",
                name=f"{who} out of memory" + (" (extrapolated)" if late else ""),
                marker=dict(color=OOM_COLOUR if who == "full cache" else KV_COLOUR, size=13, symbol="x"),
                hovertemplate=f"{who} outgrows the card at {at:,.0f} tokens<extra></extra>",
            ),
            row=row,
            col=1,
        )
    return outcome.notes()


def _add_notes(fig: go.Figure, notes: list[str], row: int) -> None:
    """The ``notes``, one per line, at the top left of panel ``row``."""
    for i, note in enumerate(notes):
        fig.add_annotation(
            text=note,
            xref=f"x{row} domain" if row > 1 else "x domain",
            yref=f"y{row} domain" if row > 1 else "y domain",
            x=0.01,
            y=0.99 - 0.085 * i,
            showarrow=False,
            xanchor="left",
            yanchor="top",
            font=dict(color=OOM_COLOUR, size=12),
            bgcolor="rgba(255,255,255,0.85)",
        )
