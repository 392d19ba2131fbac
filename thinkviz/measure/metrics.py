"""Fidelity of an evicting run against the full cache, per token, and its summaries.

Every function here is pure: it takes logits or log-probabilities and returns numbers.
Shapes: ``q`` predictions (rows), ``V`` vocabulary.  Row ``i`` of a chunk's logits predicts
the token *after* the row's position, so "the fidelity of token ``p``" is measured on the
row at position ``p - 1``.

Per token (all in nats):

- ``nll``       ``-log p_policy(true next token)``;
- ``nll_full``  the same under the full cache (the reference);
- ``kl``        ``KL(p_full ‖ p_policy)`` of the two next-token distributions;
- ``top1``      whether both distributions put their maximum on the same token.

The sweep and the UI summarise them overall and per segment kind (think / answer / code; a
run's summary also has tool output, which only transcripts have).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from collections.abc import Iterable, Sequence

import numpy as np
import torch

SEGMENT_KINDS = ("think", "answer", "code")  # the sweep's per-kind columns
FIDELITY_KINDS = (*SEGMENT_KINDS, "tool")  # a run's fidelity summary
# Fidelity metric of a sweep row -> (axis title, higher is better).
METRICS: dict[str, tuple[str, bool]] = {
    "kl": ("mean KL(full ‖ policy), nats/token", False),
    "nll_delta": ("mean NLL − full-cache NLL, nats/token", False),
    "top1": ("top-1 agreement with the full cache", True),
}


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    """``(q, V)`` logits → ``(q, V)`` float32 log-probabilities."""
    return torch.log_softmax(logits.float(), dim=-1)


def token_nll(logprobs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``(q,)`` negative log-likelihood of ``targets`` ``(q,)`` under ``logprobs`` ``(q, V)``; the
    targets may sit on another device (a replay keeps its token ids on the CPU)."""
    index = targets.to(device=logprobs.device, dtype=torch.long).view(-1, 1)  # (q, 1)
    return -logprobs.gather(-1, index).squeeze(-1)


def kl_divergence(reference: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``(q,)`` ``KL(reference ‖ other) = Σ_v p_ref(v) (log p_ref(v) - log p_other(v))``.

    Both arguments are log-probabilities ``(q, V)``.  Summed in float64 and returned in the
    inputs' dtype, so the way torch splits the vocabulary among its threads does not show in the
    result (a sweep resumed on another thread count gives the same bytes).  Clamped at 0
    (rounding can make an identical pair come out a hair negative).
    """
    kl = (reference.exp() * (reference - other)).sum(-1, dtype=torch.float64)  # (q,)
    return kl.clamp(min=0.0).to(reference.dtype)


def top1_agreement(reference: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``(q,)`` bool: the arg-max token of ``reference`` ``(q, V)`` equals that of ``other``."""
    return reference.argmax(-1) == other.argmax(-1)


def divergence_step(full_tokens: Sequence[int], policy_tokens: Sequence[int]) -> int | None:
    """First step at which two greedy generations differ; ``None`` if one is a prefix of the other.

    A run that stopped early while the other went on has not *diverged*: it is ``None``
    too — compare ``len`` to see who stopped.
    """
    for step, (a, b) in enumerate(zip(full_tokens, policy_tokens)):
        if a != b:
            return step
    return None


@dataclass
class TokenFidelity:
    """Per-token fidelity of one run, for the tokens at absolute ``positions`` ``(n,)``."""

    positions: np.ndarray
    nll: np.ndarray
    nll_full: np.ndarray
    kl: np.ndarray
    top1: np.ndarray

    @classmethod
    def empty(cls) -> TokenFidelity:
        return cls(*(np.zeros(0, dtype=t) for t in (np.int64, np.float32, np.float32, np.float32, bool)))

    def extend(self, positions: Sequence[int], nll, nll_full, kl, top1) -> None:
        """Append one chunk's values (tensors or arrays, all ``(q,)``)."""
        self.positions = np.concatenate([self.positions, _numpy(positions, np.int64)])
        self.nll = np.concatenate([self.nll, _numpy(nll, np.float32)])
        self.nll_full = np.concatenate([self.nll_full, _numpy(nll_full, np.float32)])
        self.kl = np.concatenate([self.kl, _numpy(kl, np.float32)])
        self.top1 = np.concatenate([self.top1, _numpy(top1, bool)])

    def first(self, n: int) -> TokenFidelity:
        """The first ``n`` tokens' values."""
        return TokenFidelity(self.positions[:n], self.nll[:n], self.nll_full[:n], self.kl[:n], self.top1[:n])


def _numpy(values, dtype) -> np.ndarray:
    return np.asarray(values.cpu() if isinstance(values, torch.Tensor) else values, dtype=dtype)


def summarize(fidelity: TokenFidelity, mask: np.ndarray | None = None) -> dict[str, float]:
    """Means over the tokens selected by ``mask`` ``(n,)`` (all when ``None``).

    ``nll_delta`` = mean NLL under the policy − under the full cache (≥ 0 means worse);
    ``ppl`` / ``ppl_full`` are ``exp`` of the mean NLLs.  Empty selection: ``tokens == 0``
    and every mean ``nan``.
    """
    pick = np.ones(len(fidelity.positions), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    n = int(pick.sum())
    if n == 0:
        nan = float("nan")
        return {
            "tokens": 0,
            "nll": nan,
            "nll_full": nan,
            "nll_delta": nan,
            "ppl": nan,
            "ppl_full": nan,
            "kl": nan,
            "top1": nan,
        }
    nll = float(fidelity.nll[pick].astype(np.float64).mean())
    nll_full = float(fidelity.nll_full[pick].astype(np.float64).mean())
    return {
        "tokens": n,
        "nll": nll,
        "nll_full": nll_full,
        "nll_delta": nll - nll_full,
        "ppl": math.exp(nll),
        "ppl_full": math.exp(nll_full),
        "kl": float(fidelity.kl[pick].astype(np.float64).mean()),
        "top1": float(fidelity.top1[pick].mean()),
    }


def kind_mask(positions: np.ndarray, segments: Iterable[dict[str, Any]], kind: str) -> np.ndarray:
    """``(n,)`` bool: which ``positions`` lie inside any span of ``kind`` (spans may nest)."""
    mask = np.zeros(len(positions), dtype=bool)
    for span in segments:
        if span["kind"] == kind:
            mask |= (positions >= span["start"]) & (positions < span["end"])
    return mask


def summarize_by_kind(
    fidelity: TokenFidelity, segments: Iterable[dict[str, Any]], kinds: Sequence[str] = SEGMENT_KINDS
) -> dict[str, dict[str, float]]:
    """``{"all": summary, kind: summary, ...}`` using a record's segment spans (``kind``, ``start``, ``end``)."""
    segments = list(segments)
    out = {"all": summarize(fidelity)}
    for kind in kinds:
        out[kind] = summarize(fidelity, kind_mask(fidelity.positions, segments, kind))
    return out
