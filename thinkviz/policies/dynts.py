"""dynts: Dynamic Thinking-Token Selection — question + local window + top tokens by *predicted* importance.

Seed 004 (DynTS, "Dynamic Thinking-Token Selection for Efficient Reasoning in Large Reasoning
Models"): only a fifth to a third of the thinking tokens matter to the answer, and a small
head on the model's hidden state can tell which, as each token is written — before any answer
exists to attend to it.  At a compression DynTS keeps the question, a local window of the
newest tokens and, for the rest of the budget, the tokens with the highest predicted importance.

Predicted importance comes from :mod:`thinkviz.predictor` (trained by
``python -m thinkviz train-predictor``), looked up by the loaded model's name.  When there is
none for this model, or it was trained for another one, the score falls back to attention
received per query (as in h2o) and :meth:`DynTS.step_info` says so and why.  The question is
kept through the protection toggles (``protect_question``), like every policy's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch

from ..predictor import ASSETS, ImportancePredictor, PredictorError, find_predictor, predictor_path
from .base import CacheView, Param, Policy, ScoreScale
from .registry import register


@register
class DynTS(Policy):
    """Score ``(L, H_kv, T)`` = ``exp`` of the predictor's output on each slot's final hidden state
    ``CacheView.hidden`` ``(N, d)`` (a predicted attention share, the same in every layer and
    head); forced: protected spans and the newest ``recent`` tokens."""

    name = "dynts"
    score_scale = ScoreScale(
        "predicted attention from the answer (attention per query when the predictor falls back)",
        "predicted unimportant",
        "predicted important for the answer",
    )
    summary = (
        "A small learned head reads each token's hidden state and predicts how much the answer "
        "will need it; keep the question, the newest tokens and the top predicted ones."
    )
    source = "DynTS — Dynamic Thinking-Token Selection for Efficient Reasoning in Large Reasoning Models"
    params = (Param("recent", 32, 0, 1024, 1, "local window: newest tokens always kept"),)
    needs_hidden = True
    predictor_folder: ClassVar[Path] = ASSETS

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        self._predictors: dict[tuple[str, int], ImportancePredictor | str] = {}

    def predictor(self, view: CacheView) -> tuple[ImportancePredictor | None, str]:
        """The predictor for this view's model and what the score is, in words."""
        if view.hidden is None or len(view.hidden) < len(view.protected):
            return None, "attention fallback: no hidden states for every token"
        key = (view.model, int(view.hidden.shape[-1]))
        if key not in self._predictors:
            try:
                self._predictors[key] = find_predictor(*key, folder=self.predictor_folder)
            except PredictorError as exc:
                self._predictors[key] = str(exc)
        found = self._predictors[key]
        if isinstance(found, str):
            return None, f"attention fallback: {found}"
        return found, f"predicted by {predictor_path(view.model, self.predictor_folder).name}"

    def score(self, view: CacheView) -> torch.Tensor:
        predictor, _ = self.predictor(view)
        if predictor is None:
            return view.received / view.queries_seen
        with torch.inference_mode():
            predicted = predictor(view.hidden).exp()  # (N,)
        return view.by_position(predicted)

    def step_info(self, view: CacheView) -> dict[str, Any]:
        return {"importance": self.predictor(view)[1]}
