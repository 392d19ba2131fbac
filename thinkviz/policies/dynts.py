"""dynts: Dynamic Thinking-Token Selection — question + local window + top tokens by *predicted* importance.

DynTS ("Dynamic Thinking-Token Selection for Efficient Reasoning in Large Reasoning Models"):
only a fifth to a third of the thinking tokens matter to the answer, and a small
head on the model's hidden state can tell which, as each token is written — before any answer
exists to attend to it.  At a compression DynTS keeps the question, a local window of the
newest tokens and, for the rest of the budget, the tokens with the highest predicted importance.

Predicted importance comes from :mod:`thinkviz.predictor` (trained by
``python -m thinkviz train-predictor``), looked up by the loaded model's name.  ``scorer`` picks
the score: ``predictor``; ``attention``, the fallback: attention received so far, as h2o scores it
(``normalize`` as h2o's: summed over every query, the default, or per query);
``blend``, both standardised and summed with ``weight`` on the predictor
(:func:`~thinkviz.predictor.blend`); or ``auto``, whichever of the three ranked held-out traces
best in the evaluation table ``train-predictor`` writes beside the predictor (the predictor
when there is no table).  When there is no predictor for this model, or it was trained for
another one, the score falls back to attention.  :meth:`DynTS.step_info` says which score
ranked the tokens, and why, and reports the predictor's importance of every token as it was
written (``predicted``), whichever score ranks, so the app can show it beside the attention the
answer paid.  The question is kept through the protection toggles (``protect_question``), like
every policy's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, ClassVar

import torch

from ..predictor import (
    ASSETS,
    BLEND_WEIGHT,
    ImportancePredictor,
    PredictorError,
    blend,
    eval_path,
    find_predictor,
    predictor_path,
    position_features,
)
from .base import CacheView, Param, Policy, ScoreScale
from .h2o import NORMALIZE, accumulated_attention
from .registry import register

ATTENTION_WORDS = {"none": "attention received so far", "queries": "attention received per query"}  # by normalize


@register
class DynTS(Policy):
    """Score ``(L, H_kv, T)`` = ``exp`` of the predictor's output on each position's hidden states
    (the ``k`` layers the predictor file names, which :meth:`hidden_layers` asks the engine for)
    and position features (the same in every layer and head); the fallback, h2o's score
    (:func:`~thinkviz.policies.h2o.accumulated_attention`, ``normalize`` as h2o's); or ``exp`` of
    their blend, standardised per (layer, kv-head) over the slots held; forced: protected spans and
    the newest ``recent`` tokens.  The run keeps only
    each token's encoding ``CacheView.hidden`` ``(N, width)`` (:meth:`hidden_kept`,
    :meth:`~thinkviz.predictor.ImportancePredictor.encode`), the part of the predictor that does
    not change as the text grows.

    Where ThinkViz departs from DynTS: the paper's importance head is trained on a large reasoning
    model's own traces; ThinkViz trains a small head for the loaded small model on the shipped
    traces (``train-predictor``), and adds the attention fallback and the blend, which the paper
    does not have, so the rule still runs without a predictor.  The fallback sums attention as
    H2O does (``normalize=none``); the predictor's evaluation table (``scorer=auto``) measured
    the per-query mean (``normalize=queries``), the fallback before issue 36."""

    name = "dynts"
    score_scale = ScoreScale(
        "predicted attention from the answer, attention so far, or both, as the scorer knob picks",
        "predicted unimportant",
        "predicted important for the answer",
    )
    summary = (
        "A small learned head reads each token's hidden state and predicts how much the answer "
        "will need it; keep the question, the newest tokens and the top predicted ones."
    )
    source = "DynTS — Dynamic Thinking-Token Selection for Efficient Reasoning in Large Reasoning Models"
    params = (
        Param("recent", 32, 0, 1024, 1, "local window: newest tokens always kept"),
        Param(
            "scorer",
            "auto",
            choices=("auto", "blend", "predictor", "attention"),
            help="rank by the learned predictor, by attention received (the fallback), by both "
            "(blend), or auto: whichever ranked held-out traces best in the predictor's evaluation",
        ),
        Param(
            "weight",
            BLEND_WEIGHT,
            0.0,
            8.0,
            0.05,
            "scorer blend: the predictor's weight against attention so far (0: attention alone)",
        ),
        NORMALIZE,
    )
    predicts_importance = True
    predictor_folder: ClassVar[Path] = ASSETS

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        self._found: dict[tuple[str, int], ImportancePredictor | str] = {}  # the predictor, or why there is none
        self._sizes: dict[str, int] = {}  # model -> hidden size, from hidden_layers
        self._ranking: dict[tuple[str, int], tuple[ImportancePredictor | None, str]] = {}
        self._reported = 0  # positions whose prediction step_info has already reported

    @classmethod
    def files_read(cls, model: str) -> tuple[Path, ...]:
        """The predictor file for ``model`` and its evaluation table (which ``scorer=auto`` reads)."""
        path = predictor_path(model, cls.predictor_folder)
        return path, eval_path(path)

    def hidden_layers(self, model: str, hidden_size: int, depth: int) -> tuple[int, ...]:
        """The layers the predictor for ``model`` reads; none when there is no usable predictor."""
        self._sizes[model] = hidden_size
        found = self._predictor_for((model, hidden_size), depth)
        return () if isinstance(found, str) else found.layers

    def hidden_kept(self, model: str, hidden: torch.Tensor) -> torch.Tensor:
        """``(q, width)`` the predictor's encoding of new tokens' ``(q, k, d)`` hidden states (the
        engine hands some only when :meth:`hidden_layers` found a predictor)."""
        with torch.inference_mode():
            return self._predictor_for((model, int(hidden.shape[-1]))).encode(hidden)

    def _predictor_for(self, key: tuple[str, int], depth: int | None = None) -> ImportancePredictor | str:
        """The predictor for ``key`` (model, hidden size), or why there is none; looked up once, by
        :meth:`hidden_layers` (which knows the model's ``depth``) before the run's first step."""
        if key not in self._found:
            try:
                self._found[key] = find_predictor(*key, folder=self.predictor_folder, depth=depth)
            except PredictorError as exc:
                self._found[key] = str(exc)
        return self._found[key]

    def _lookup(self, view: CacheView) -> tuple[tuple[str, int] | None, ImportancePredictor | str]:
        """``(key, the predictor for this view's model or why there is none)``."""
        size = self._sizes.get(view.model)
        if size is None:
            return None, "no hidden states for every token"
        key = (view.model, size)
        found = self._predictor_for(key)
        if isinstance(found, str):
            return key, found
        if view.hidden is None or len(view.hidden) < len(view.protected):
            return key, "no hidden states for every token"
        if view.hidden.shape[1:] != (found.width,):
            return key, "the run holds something else than the predictor's encoding of each token's hidden states"
        return key, found

    def ranking(self, view: CacheView) -> tuple[str, ImportancePredictor | None, str]:
        """How this view's tokens are ranked: ``(score, predictor, in words)`` with ``score`` one of
        ``"predictor"``, ``"blend"`` and ``"attention"`` (``predictor`` ``None`` for the last)."""
        if self.scorer == "attention":
            return "attention", None, f"{ATTENTION_WORDS[self.normalize]} (scorer: attention)"
        key, found = self._lookup(view)
        if isinstance(found, str):
            return "attention", None, f"attention fallback: {found}"
        if key not in self._ranking:
            self._ranking[key] = self._rank_with(found, key[0])
        return self._ranking[key]

    def _rank_with(self, found: ImportancePredictor, model: str) -> tuple[str, ImportancePredictor | None, str]:
        path = predictor_path(model, self.predictor_folder)
        scorer, why = self.scorer, ""
        if scorer == "auto":
            measured = _heldout_spearman(eval_path(path))
            scorer = max(measured, key=measured.get) if measured else "predictor"
            if measured:
                why = (
                    " (scorer: auto; held-out Spearman " + ", ".join(f"{k} {v:.2f}" for k, v in measured.items()) + ")"
                )
        if scorer == "fallback":
            return "attention", None, f"attention fallback{why}: attention ranked held-out traces best"
        if scorer == "blend":
            return "blend", found, f"blend of {path.name} (weight {self.weight:g}) and attention so far{why}"
        return "predictor", found, f"predicted by {path.name}{why}"

    def score(self, view: CacheView) -> torch.Tensor:
        kind, predictor, _ = self.ranking(view)
        if predictor is None:
            return accumulated_attention(view, self.normalize)
        with torch.inference_mode():
            predicted = predictor.head(view.hidden, position_features(len(view.hidden)))  # (N,) log importance
        if kind == "predictor":
            return view.by_position(predicted.exp())
        attention = accumulated_attention(view, self.normalize)
        return blend(attention, view.by_position(predicted), self.weight, view.valid).exp()

    def step_info(self, view: CacheView) -> dict[str, Any]:
        """``importance``: which score ranked the tokens, and why; ``predicted`` (with
        ``predicted_from``, the first position it covers): the predictor's importance of each
        token new since the last step, as it was written — also when attention ranks them."""
        info: dict[str, Any] = {"importance": self.ranking(view)[2]}
        _, found = self._lookup(view)
        if not isinstance(found, str) and len(view.hidden) > self._reported:
            seen, new = len(view.hidden), slice(self._reported, len(view.hidden))
            with torch.inference_mode():
                predicted = found.head(view.hidden[new], position_features(seen)[new]).exp()
            info.update(predicted=[float(v) for v in predicted], predicted_from=self._reported)
            self._reported = seen
        return info


def _heldout_spearman(path: Path) -> dict[str, float] | None:
    """``{scorer: mean held-out Spearman}`` of the predictor, the fallback and the blend, for those
    an evaluation table measured (a number, not ``null``); ``None`` when there is no readable
    table or it measured none of them (the predictor is then trusted)."""
    try:
        scorers = json.loads(path.read_text(encoding="utf-8"))["scorers"]
        cells = {name: scorers[name]["spearman"] for name in ("predictor", "fallback", "blend") if name in scorers}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    measured = {
        name: float(value)
        for name, value in cells.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    }
    return measured or None
