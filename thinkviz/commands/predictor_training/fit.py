"""Fit the DynTS importance predictor on labelled traces.

The predictor learns, from a token's hidden states and its position features, the ``log`` of
the attention the answer pays it (floored at ``1e-6``), on the thinking tokens only — the tokens dynts ranks.  Within
a trace only the order matters to dynts, and a trace's overall level of attention mostly
reflects its length (the answer's attention is spread over more tokens in a longer trace),
so each trace's targets are centred on their mean.  Full-batch AdamW on the mean squared
error; inputs are standardised per layer with the training set's mean and spread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from ...predictor import ImportancePredictor, position_features
from .labels import Examples

LABEL_FLOOR = 1e-6  # attention below this counts as this, so log() stays finite
EPOCHS, LEARNING_RATE, WIDTH = 300, 1e-3, 64


def targets(examples: Examples) -> torch.Tensor:
    """Regression targets of the thinking tokens: ``log`` attention, centred per trace."""
    logs = examples.labels[examples.thinking].clamp(min=LABEL_FLOOR).log()
    return logs - logs.mean()


def train(
    examples: Sequence[Examples],
    layers: tuple[int, ...] = (-1,),
    epochs: int = EPOCHS,
    lr: float = LEARNING_RATE,
    width: int = WIDTH,
    seed: int = 0,
    progress: Callable[[int, float], None] | None = None,
) -> ImportancePredictor:
    """Fit a predictor on the thinking tokens of ``examples`` (features ``(n, k, d)`` of ``layers``).

    ``progress(epoch, loss)`` is called after every epoch.
    """
    examples = [e for e in examples if e.thinking.any()]
    if not examples:
        raise ValueError("no training examples")
    features = torch.cat([e.features[e.thinking] for e in examples]).float()  # (N, k, d)
    where = torch.cat([position_features(len(e.thinking))[e.thinking] for e in examples])  # (N, 4)
    if features.shape[1] != len(layers):
        raise ValueError(f"the examples carry {features.shape[1]} layers, the predictor reads {len(layers)}")
    goal = torch.cat([targets(e) for e in examples])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        predictor = ImportancePredictor(features.shape[-1], width, layers)
    predictor.mean.copy_(features.mean(0))
    predictor.std.copy_(features.std(0).clamp(min=1e-6))
    optimizer = torch.optim.AdamW(predictor.parameters(), lr=lr, weight_decay=1e-2)
    for epoch in range(epochs):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(predictor(features, where), goal)
        loss.backward()
        optimizer.step()
        if progress is not None:
            progress(epoch, loss.item())
    return predictor.eval()
