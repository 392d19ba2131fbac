"""How well a score ranks thinking tokens by the attention the answer pays them.

Two measures per held-out trace, over its thinking tokens: Spearman's rank correlation with
the labels, and precision at 30 % — of the 30 % of tokens that truly receive the most
attention from the answer, the share that the score also puts in its top 30 %.  Five scores
are compared (:func:`scorer_table`): the predictor, the dynts attention fallback (attention
received per query when the answer begins), their blend (dynts ``scorer=blend`` at its default
weight, :func:`~thinkviz.predictor.blend`), recency (position) and h2o's score at selection
time (the same statistic when the token first leaves h2o's local window).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from ...predictor import blend, position_features
from .labels import Examples

TOP_FRACTION = 0.3
SCORERS = ("predictor", "fallback", "blend", "recency", "h2o")


def ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their average rank."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return ((ends - counts + 1 + ends) / 2)[inverse]


def spearman(a: Sequence[float] | torch.Tensor, b: Sequence[float] | torch.Tensor) -> float:
    """Spearman rank correlation (average ranks for ties); NaN when either side is constant."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) != len(b):
        raise ValueError("spearman needs two sequences of one length")
    ra, rb = ranks(a), ranks(b)
    if len(ra) < 2 or ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def precision_at(
    score: Sequence[float] | torch.Tensor, truth: Sequence[float] | torch.Tensor, fraction: float = TOP_FRACTION
) -> float:
    """Share of the top ``fraction`` of ``truth`` that is also in the top ``fraction`` of ``score``
    (``k = ceil(fraction · n)``; ties broken by position)."""
    score, truth = np.asarray(score, dtype=np.float64), np.asarray(truth, dtype=np.float64)
    if len(score) != len(truth) or not len(score):
        raise ValueError("precision_at needs two non-empty sequences of one length")
    k = math.ceil(fraction * len(score))
    top = lambda values: set(np.argsort(-values, kind="stable")[:k].tolist())  # noqa: E731
    return len(top(score) & top(truth)) / k


Predict = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (hidden, position features) -> score


def scores_of(examples: Examples, predict: Predict) -> dict[str, torch.Tensor]:
    """Every scorer's value on the thinking tokens of ``examples`` (the predictor's when the
    answer begins: position features over the tokens before it)."""
    thinking = examples.thinking
    with torch.inference_mode():
        predicted = predict(examples.features[thinking], position_features(len(thinking))[thinking])
    fallback = examples.attention_so_far[thinking]
    return {
        "predictor": predicted,
        "fallback": fallback,
        "blend": blend(fallback, predicted),
        "recency": torch.arange(len(thinking))[thinking].float(),
        "h2o": examples.h2o_at_selection[thinking],
    }


MEASURES = ("spearman", "precision_at_30")


def measures(examples: Examples, predict: Predict) -> dict[str, dict[str, float]]:
    """``{scorer: {"spearman", "precision_at_30"}}`` on the thinking tokens of one trace."""
    truth = examples.labels[examples.thinking]
    return {
        name: {"spearman": spearman(score, truth), "precision_at_30": precision_at(score, truth)}
        for name, score in scores_of(examples, predict).items()
    }


def scorer_table(heldout: Mapping[str, Sequence[Examples]], predict: Predict) -> dict:
    """``{"heldout_traces": [...], "scorers": {name: {"spearman", "precision_at_30"}},
    "per_trace": {row: {name: {...}}}}``.  Each row of ``heldout`` is one trace, or a group of
    traces (held-out corpus generations) whose measures are averaged; the scorers' values are
    means over the rows."""
    per_trace = {}
    for row, group in heldout.items():
        each = [measures(examples, predict) for examples in group]
        per_trace[row] = {name: {m: _mean([e[name][m] for e in each]) for m in MEASURES} for name in SCORERS}
    means = {name: {m: _mean([row[name][m] for row in per_trace.values()]) for m in MEASURES} for name in SCORERS}
    return {"heldout_traces": list(heldout), "scorers": means, "per_trace": per_trace}


def _mean(values: Sequence[float]) -> float:
    """The mean of the finite values; NaN when there are none."""
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def format_table(table: dict) -> str:
    """The table as aligned text: one row per scorer and trace, plus the mean."""
    traces = table["heldout_traces"]
    head = f"{'scorer':<10}" + "".join(f"{t[:22]:>24}" for t in traces) + f"{'mean':>16}"
    lines = [head, f"{'':<10}" + "".join(f"{'rho  P@30':>24}" for _ in traces) + f"{'rho  P@30':>16}"]
    for name in SCORERS:
        cells = [table["per_trace"][t][name] for t in traces] + [table["scorers"][name]]
        widths = [24] * len(traces) + [16]
        lines.append(
            f"{name:<10}"
            + "".join(f"{c['spearman']:>{w - 6}.3f}{c['precision_at_30']:>6.2f}" for c, w in zip(cells, widths))
        )
    return "\n".join(lines)


def write_table(table: dict, path: str | Path) -> Path:
    """Write the table as JSON (``NaN`` as ``null``)."""
    path = Path(path)
    path.write_text(json.dumps(_finite(table), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path


def _finite(value):
    """``value`` with every NaN float replaced by ``None``."""
    if isinstance(value, dict):
        return {key: _finite(v) for key, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return None if isinstance(value, float) and math.isnan(value) else value
