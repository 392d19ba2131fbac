"""The Explore tab: a recorded run seen at any step, averaged or for one layer / kv-head.

Pure functions of a :class:`~thinkviz.core.events.RunRecord` (a finished run or a loaded
recording; no model needed).  At step ``s`` the token view shows the prompt plus the tokens
of events ``0 … s`` with that event's scores; the keep shading is the event's mean over all
(layer, kv-head) slots, or, for one layer and/or head, the nearest recorded snapshot at or
before ``s`` (the engine keeps a bounded, evenly thinned set of them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..core.events import RunRecord
from ..viz.keep_maps import keep_heatmap, kept_figure
from ..viz.legend import view_legend
from ..viz.tables import segment_headers, segment_table
from ..viz.tokens import TokenData, render_tokens, token_view

AVERAGE = "all"


@dataclass
class ExploreView:
    """What the Explore tab shows for one (step, layer, head, mode)."""

    caption: str
    tokens_html: str
    legend: str
    step: int  # the event shown (a layer or head moves it back to the nearest snapshot)
    heatmap: Any
    segments: Any
    kept: Any  # the layer × kv-head tokens held at the step shown


def geometry(record: RunRecord) -> tuple[int, int]:
    """``(layers, kv_heads)`` of the recorded model."""
    g = record.meta.get("geometry", {})
    return int(g.get("layers", 0)), int(g.get("kv_heads", 0))


def layer_choices(record: RunRecord) -> list[str]:
    return [AVERAGE, *map(str, range(geometry(record)[0]))]


def head_choices(record: RunRecord) -> list[str]:
    return [AVERAGE, *map(str, range(geometry(record)[1]))]


def _index(value: Any, limit: int, what: str) -> int | None:
    """``AVERAGE``/``None`` → ``None``; else an index checked against ``limit``."""
    if value in (None, "", AVERAGE):
        return None
    try:
        index = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be '{AVERAGE}' or a number, got {value!r}") from None
    if not 0 <= index < limit:
        raise ValueError(f"{what} must be between 0 and {limit - 1}, got {index}")
    return index


def _snapshot_at(record: RunRecord, step: int) -> tuple[int, np.ndarray] | None:
    """The latest snapshot ``(step, (L, H_kv, T) bool)`` at or before ``step``."""
    earlier = [s for s in record.snapshots if s <= step]
    if not earlier:
        return None
    best = max(earlier)
    return best, np.asarray(record.snapshots[best], dtype=bool)


def token_data_at(
    record: RunRecord, step: int, layer: int | None = None, head: int | None = None
) -> tuple[TokenData, int, str]:
    """The token view of ``record`` after event ``step``, the step shown and a caption.

    With a ``layer`` and/or ``head`` the view moves to the nearest snapshot at or before
    ``step`` (the caption says which).
    """
    if not record.events:
        raise ValueError("this recording has no steps")
    step = min(max(0, step), len(record.events) - 1)
    scope = "all layers and kv-heads"
    keep = None
    if layer is not None or head is not None:
        found = _snapshot_at(record, record.events[step].step)
        if found is None:
            raise ValueError("this recording has no per-layer snapshot at or before this step; choose 'all'")
        snap_step, mask = found  # (L, H_kv, T)
        step = next(i for i, e in enumerate(record.events) if e.step == snap_step)
        mask = mask[layer] if layer is not None else mask  # (H_kv, T) or (L, H_kv, T)
        if head is not None:
            mask = mask[..., head, :]
        keep = mask.reshape(-1, mask.shape[-1]).mean(axis=0)  # (T,)
        scope = (
            f"layer {'all' if layer is None else layer}, kv-head {'all' if head is None else head}"
            f" (snapshot at step {snap_step})"
        )
    event = record.events[step]
    data = token_view(record, step)
    if keep is not None:
        data = replace(data, keep_fraction=keep)
    held = event.kept_counts(*geometry(record))
    uniform = held.size == 0 or held.min() == held.max()
    kv = f"{event.kv_tokens}" if uniform else f"{held.mean():.1f} on average ({held.min()}–{held.max()})"
    caption = (
        f"Step **{event.step}** of {record.events[-1].step} · {len(data.texts)} tokens seen · cache holds {kv} "
        f"per layer and head · shading: {scope}"
    )
    return data, step, caption


def predicts_importance(record: RunRecord) -> bool:
    """Whether the recorded run's policy reported predicted importance (the prediction view modes)."""
    return any("predicted" in event.info for event in record.events)


def fits_bias(record: RunRecord) -> bool:
    """Whether the recorded run's policy fitted attention biases (its steps carry a mass: the mass view)."""
    return any(event.mass is not None for event in record.events)


def explore_view(record: RunRecord, step: int, layer: Any, head: Any, mode: str) -> ExploreView:
    """Everything the Explore tab shows for the chosen step, layer, head and view mode."""
    layers, heads = geometry(record)
    last = len(record.events) - 1
    if not 0 <= step <= max(0, last):
        raise ValueError(f"step {step} is outside this run: its steps go from 0 to {max(0, last)}")
    layer_index, head_index = _index(layer, layers, "layer"), _index(head, heads, "kv-head")
    data, shown, caption = token_data_at(record, step, layer_index, head_index)
    tokens = render_tokens(data, mode)
    legend = view_legend(mode, str(record.meta.get("policy")), data)
    heatmap = keep_heatmap(record, layer_index, head_index)
    heatmap.add_hline(
        y=record.events[shown].step,
        line_dash="dot",
        line_color="#1f77b4",
        annotation_text="this step",
        annotation_position="bottom right",
    )
    rows = segment_table(record, record.events[shown].step)
    if data.scores is None:  # no graded score: no mean importance either
        rows = [row[:3] + [None] + row[4:] for row in rows]
    return ExploreView(
        caption + _heat_note(data, mode),
        tokens,
        legend,
        shown,
        heatmap,
        {"headers": segment_headers(record), "data": rows},
        kept_figure(record, shown),
    )


def _heat_note(data: TokenData, mode: str) -> str:
    """What the heat of a prediction mode shows, or why there is none (empty for the other modes)."""
    if mode == "predicted":
        return (
            " · heat: the predictor's importance of each token when it was written"
            if data.predicted is not None
            else " · this run reported no predicted importance"
        )
    if mode == "answer":
        return (
            " · heat: attention the answer paid each earlier token (full cache, measured when the run ended)"
            if data.answer_attention is not None
            else " · no attention from the answer here: the answer has not begun at this step, or was not measured"
        )
    return ""
