"""Plotly figures of a run: memory over time (with a projection onto a bigger model),
policy comparisons, the step × position keep/evict heatmap, the layer × kv-head kept counts of
one step, and the empty chart shown before a run.

Pure functions of a :class:`~thinkviz.core.events.RunRecord` (and plain values); they read no
model and keep figures light: line traces are thinned to :data:`MAX_POINTS` points and
heatmaps to :data:`MAX_ROWS` × :data:`MAX_COLS` cells.

The x axis of time series is *tokens seen* (prompt + generated or replayed), so live
generation (one token per step) and replay (a chunk per step) read the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from ..core.events import RunRecord
from ..memory import GIB, Projection
from ..policies import PolicyConfigError, policy_class
from ..units import format_bytes
from .tables import record_kv_quant

MIB = 2**20
MAX_POINTS = 2000
MAX_ROWS = 256
MAX_COLS = 1024

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


# ---- series from a record ----------------------------------------------------------
def tokens_seen(record: RunRecord) -> np.ndarray:
    """``(S,)`` number of tokens the model has seen after each step."""
    return np.array([e.positions[-1] + 1 if e.positions else 0 for e in record.events], dtype=np.int64)


def bytes_per_token(record: RunRecord) -> int:
    """KV bytes one token costs on the recorded model: 2 · layers · kv_heads · head_dim · dtype bytes."""
    g = record.meta["geometry"]
    return 2 * int(g["layers"]) * int(g["kv_heads"]) * int(g["head_dim"]) * int(g["dtype_bytes"])


def budget_token_bytes(record: RunRecord) -> float:
    """KV bytes one budget token costs in the run's KV format (KIVI at its steady state)."""
    g, kv = record.meta["geometry"], record_kv_quant(record)
    return int(g["layers"]) * kv.slot_bytes(int(g["kv_heads"]), int(g["head_dim"]), int(g["dtype_bytes"]))


def _policy_evicts(record: RunRecord) -> bool:
    """Whether the recorded policy has a budget at all (the ``full`` reference does not)."""
    try:
        return policy_class(str(record.meta.get("policy"))).evicts
    except PolicyConfigError:  # a recording from a policy this version does not know
        return True


def budget_series(record: RunRecord, x: np.ndarray) -> tuple[np.ndarray, str]:
    """The budget in KV bytes (priced in the run's KV format) at each number of tokens seen ``x``
    ``(S,)``, and its label: a flat ``budget`` tokens, or ``⌈budget_fraction · x⌉`` tokens when the
    run kept a fraction."""
    params = record.meta.get("params", {})
    fmt = record_kv_quant(record)
    in_format = f", {fmt.label}" if fmt.spec.quantized else ""
    per_token = budget_token_bytes(record)
    if params.get("budget_mode") == "fraction":
        fraction = float(params["budget_fraction"])
        tokens = np.ceil(np.round(fraction * x, 9))
        return tokens * per_token, f"budget ({fraction:.0%} of the tokens seen{in_format})"
    budget = int(record.meta["budget"])
    return np.full(len(x), budget * per_token), f"budget ({budget} tokens{in_format})"


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
@dataclass(frozen=True)
class ProjectionOutcome:
    """Where a run's caches, priced on a projection's target, outgrow the card.

    ``policy``: the policy's name, with its KV format when quantized; ``compressed``: its cache is
    not the full-precision full cache (it evicts, or is stored in a quantized format);
    ``room``: tokens of full-precision KV cache the card holds next to the weights (0 when they do
    not fit), ``policy_room`` the same in the run's KV format;
    ``growth``: kept tokens the policy adds per token seen over the run's second half (0 for a
    policy that holds its budget, 1 for the full cache); ``full_oom`` / ``policy_oom``: tokens seen
    when the full cache passes ``room`` / the policy ``policy_room`` (``None``: not within the target's context),
    past the run's ``end`` when extrapolated (the full cache grows by one token per token, the
    policy by ``growth``); ``horizon``: where the projection's x axis ends.
    """

    policy: str
    compressed: bool
    end: int
    kept_end: int
    room: int
    policy_room: int
    weights_fit: bool
    growth: float
    full_oom: float | None
    policy_oom: float | None
    horizon: float
    context: int
    kept_bytes: int  # what ``kept_end`` tokens cost on the target
    fits_at_full_oom: bool = False  # the policy fits where the full cache fails (within the run)

    @property
    def extrapolated(self) -> bool:
        return self.horizon > self.end

    def notes(self) -> list[str]:
        """What the projection shows, in words: the full cache's line, then the policy's (if it says more)."""
        if not self.weights_fit:
            return []  # the figure says why
        policy_fits = self.fits_at_full_oom and self.policy_oom is None and self.growth <= GROWTH_EPSILON
        if self.full_oom is not None and self.full_oom <= self.end:
            first = f"full cache runs out of memory at {self.full_oom:,.0f} tokens"
            if policy_fits and self.compressed:
                return [f"{first}; the policy still fits"]
            lines = [first]
        elif self.full_oom is not None:
            lines = [
                f"a full cache would run out of memory at {self.full_oom:,.0f} tokens "
                f"(extrapolated: this run saw {self.end:,})"
            ]
        else:
            lines = [
                f"a full cache fits {self.room:,} tokens on this card",
                f"(more than the model's {self.context:,}-token context)",
            ]
        if not self.compressed:
            return lines
        if self.policy_oom is not None and self.policy_oom <= self.end:
            lines.append(
                f"{self.policy} runs out too, at {self.policy_oom:,.0f} tokens: it kept {self.kept_end:,} "
                "tokens per layer and head"
            )
        elif self.policy_oom is not None:
            lines.append(
                f"{self.policy} fits to the end of the run but keeps growing ({self.growth:.2f} tokens per "
                f"token seen): it would run out at {self.policy_oom:,.0f} tokens (extrapolated)"
            )
        elif self.growth > GROWTH_EPSILON:
            lines.append(
                f"{self.policy} keeps growing ({self.growth:.2f} tokens per token seen) but fits within "
                "the model's context"
            )
        else:
            lines.append(
                f"{self.policy} holds about {self.kept_end:,} tokens ({format_bytes(self.kept_bytes)}) and fits"
            )
        return lines


GROWTH_EPSILON = 1e-3  # kept tokens per token seen below which a policy holds its budget


def growth_rate(seen: np.ndarray, kept: np.ndarray) -> float:
    """Kept tokens added per token seen: the least-squares slope over the second half of the run
    (what compressions settled to), never below 0; 0 for fewer than two points.

    A policy that compresses every few tokens draws a sawtooth (up by one token per token between
    compressions, down to its budget at each); its slope over a short run is the sawtooth's
    phase, not growth.  So where the run has two or more compressions (drops), the slope is that
    of the counts right after the later half of them (at least two): flat for a policy that holds
    its budget, rising for one that does not (a fraction budget, think_drop keeping code)."""
    after_drop = np.flatnonzero(np.diff(kept) < 0) + 1
    if len(after_drop) >= 2:
        pick = after_drop[-max(2, len(after_drop) // 2) :]
        x, y = seen[pick].astype(np.float64), kept[pick].astype(np.float64)
    else:
        half = slice(len(seen) // 2, None)
        x, y = seen[half].astype(np.float64), kept[half].astype(np.float64)
    if len(x) < 2 or np.ptp(x) == 0:
        return 0.0
    dx = x - x.mean()  # the least-squares slope in closed form: exactly 0 when y is constant (polyfit's is ~1e-16)
    return max(0.0, float(dx @ (y - y.mean()) / (dx @ dx)))


def projection_outcome(record: RunRecord, projection: Projection) -> ProjectionOutcome:
    """Where ``record``'s full cache (at full precision) and its policy (in the run's KV format) run
    out of memory on ``projection``'s card."""
    seen = tokens_seen(record)
    kept = np.array([e.kv_tokens for e in record.events], dtype=np.int64)
    fmt = record_kv_quant(record)
    evicts = _policy_evicts(record)
    compressed = evicts or fmt.spec.quantized
    context = projection.target.max_context
    room, policy_room = projection.max_tokens, projection.tokens_fitting(fmt)
    end = int(seen[-1]) if len(seen) else 0
    growth = growth_rate(seen, kept) if evicts else 1.0

    def outgrows(counts: np.ndarray, rate: float, room: int) -> float | None:
        over = np.flatnonzero(counts > room)
        if over.size:
            return float(seen[over[0]])
        if not len(counts) or rate <= GROWTH_EPSILON:
            return None
        at = end + (room - counts[-1]) / rate
        return at if at <= context else None

    full_oom = outgrows(seen, 1.0, room)
    policy_oom = outgrows(kept, growth, policy_room) if compressed else full_oom
    reach = [end, full_oom if full_oom is not None else context] + ([policy_oom] if policy_oom else [])
    horizon = float(min(max(reach), max(end, context))) if projection.available_bytes > 0 else float(end)
    fits = oom_step(projection.kv_bytes(seen), projection.kv_bytes(kept, fmt), projection.available_bytes) is not None
    name = str(record.meta.get("policy", "the policy")) + (f" ({fmt.label})" if fmt.spec.quantized else "")
    kept_end = int(kept[-1]) if len(kept) else 0
    return ProjectionOutcome(
        name,
        compressed,
        end,
        kept_end,
        room,
        policy_room,
        projection.available_bytes > 0,
        growth,
        full_oom,
        policy_oom,
        horizon,
        context,
        int(projection.kv_bytes(kept_end, fmt)),
        fits,
    )


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
    :meth:`ProjectionOutcome.notes` says what that means for this policy.
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
    pick = _thin(len(x), MAX_POINTS)
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
    if _policy_evicts(record) and len(x):
        budget, label = budget_series(record, x)
        ends = pick if record.meta.get("params", {}).get("budget_mode") == "fraction" else [0, len(x) - 1]
        fig.add_trace(
            go.Scatter(
                x=x[ends],
                y=budget[ends] / MIB,
                mode="lines",
                hoverinfo="name",
                name=label,
                line=dict(color=BUDGET_COLOUR, dash="dot"),
            ),
            row=1,
            col=1,
        )
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
        fig.add_trace(
            go.Scatter(
                x=[x[0], x[-1]],
                y=[weights / MIB] * 2,
                mode="lines",
                hoverinfo="name",
                name=f"weights ({record.meta.get('quantization', '?')}, {format_bytes(weights)})",
                line=dict(color=DEVICE_COLOUR, width=1, dash="longdash"),
            ),
            row=2,
            col=1,
        )
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
        ahead = np.array([outcome.end, horizon])
        growth = 1.0 if not outcome.compressed else outcome.growth
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
            grown = kept[-1] + growth * (ahead - outcome.end)
            how = f"grows {growth:.2f} tokens per token seen" if growth > GROWTH_EPSILON else "holds its budget"
            fig.add_trace(
                go.Scatter(
                    x=ahead,
                    y=projection.kv_bytes(grown, fmt) / GIB,
                    mode="lines",
                    hoverinfo="name",
                    name=f"policy, extrapolated ({how})",
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
    if available <= 0:
        notes = [f"the weights alone ({format_bytes(projection.weights_bytes)}) do not fit this card"]
    else:
        notes = outcome.notes()
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
    top = max(available, float(projection.kv_bytes(max(x[-1], horizon))), float(policy.max())) / GIB
    fig.update_xaxes(title_text="tokens seen (projection)", rangemode="tozero", row=row, col=1)
    fig.update_yaxes(title_text="KV cache (GiB)", range=[0, top * (1 + 0.12 * (len(notes) + 1))], row=row, col=1)


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
        pick = _thin(len(x), MAX_POINTS)
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
        pick = _thin(len(x), MAX_POINTS)
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
