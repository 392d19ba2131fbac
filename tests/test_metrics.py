"""Fidelity metrics on tiny distributions whose values are worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from thinkviz.measure.metrics import (
    TokenFidelity,
    divergence_step,
    kl_divergence,
    log_probs,
    summarize,
    summarize_by_kind,
    token_nll,
    top1_agreement,
)


def _logits(*rows):
    """Logits whose softmax is exactly the given probability rows."""
    return torch.tensor(rows, dtype=torch.float64).log()


def test_nll_is_minus_log_probability_of_the_target():
    lp = log_probs(_logits([0.5, 0.25, 0.25], [0.1, 0.2, 0.7]))
    nll = token_nll(lp, torch.tensor([1, 2]))
    assert nll.tolist() == pytest.approx([math.log(4), -math.log(0.7)], abs=1e-6)


def test_log_probs_normalise_unnormalised_logits():
    lp = log_probs(torch.tensor([[2.0, 2.0, 2.0, 2.0]]))
    assert lp.exp().sum().item() == pytest.approx(1.0, abs=1e-6)
    assert token_nll(lp, torch.tensor([3])).item() == pytest.approx(math.log(4), abs=1e-6)


def test_kl_matches_hand_computation_and_is_asymmetric():
    p = log_probs(_logits([0.5, 0.5]))
    q = log_probs(_logits([0.25, 0.75]))
    want_pq = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    want_qp = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert kl_divergence(p, q).item() == pytest.approx(want_pq, abs=1e-6)
    assert kl_divergence(q, p).item() == pytest.approx(want_qp, abs=1e-6)
    assert want_pq != pytest.approx(want_qp)


def test_kl_of_identical_distributions_is_zero_and_rows_are_independent():
    a = log_probs(_logits([0.1, 0.9], [0.6, 0.4]))
    b = log_probs(_logits([0.1, 0.9], [0.4, 0.6]))
    kl = kl_divergence(a, b)
    assert kl[0].item() == 0.0
    assert kl[1].item() == pytest.approx(0.6 * math.log(1.5) + 0.4 * math.log(0.4 / 0.6), abs=1e-6)


def test_top1_agreement_compares_argmax_per_row():
    ref = log_probs(_logits([0.6, 0.3, 0.1], [0.2, 0.3, 0.5]))
    other = log_probs(_logits([0.4, 0.35, 0.25], [0.5, 0.3, 0.2]))
    assert top1_agreement(ref, other).tolist() == [True, False]


@pytest.mark.parametrize(
    "full, policy, want",
    [
        ([1, 2, 3, 4], [1, 2, 9, 4], 2),
        ([5, 6], [7, 6], 0),
        ([1, 2, 3], [1, 2, 3], None),
        ([1, 2, 3], [1, 2], None),  # one stopped early: no divergence yet
        ([], [1], None),
    ],
)
def test_divergence_step(full, policy, want):
    assert divergence_step(full, policy) == want


def _fidelity():
    f = TokenFidelity.empty()
    f.extend([10, 11, 12], [1.0, 2.0, 3.0], [1.0, 1.0, 1.0], [0.0, 0.5, 1.0], [True, True, False])
    f.extend(torch.tensor([13]), torch.tensor([4.0]), torch.tensor([2.0]), torch.tensor([0.5]), torch.tensor([False]))
    return f


def test_summaries_overall():
    s = summarize(_fidelity())
    assert s["tokens"] == 4
    assert s["nll"] == pytest.approx(2.5)
    assert s["nll_full"] == pytest.approx(1.25)
    assert s["nll_delta"] == pytest.approx(1.25)
    assert s["ppl"] == pytest.approx(math.exp(2.5))
    assert s["kl"] == pytest.approx(0.5)
    assert s["top1"] == pytest.approx(0.5)


def test_summaries_per_segment_kind_with_nested_spans():
    segments = [
        {"kind": "think", "start": 8, "end": 12},
        {"kind": "step", "start": 9, "end": 12},
        {"kind": "answer", "start": 12, "end": 14},
        {"kind": "code", "start": 13, "end": 14},
    ]
    s = summarize_by_kind(_fidelity(), segments)
    assert s["think"]["tokens"] == 2 and s["think"]["nll"] == pytest.approx(1.5)
    assert s["answer"]["tokens"] == 2 and s["answer"]["kl"] == pytest.approx(0.75)
    assert s["code"]["tokens"] == 1 and s["code"]["nll_delta"] == pytest.approx(2.0)
    assert s["all"]["tokens"] == 4


def test_an_absent_kind_summarises_to_nan_not_an_error():
    s = summarize_by_kind(_fidelity(), [])
    assert s["code"]["tokens"] == 0 and np.isnan(s["code"]["kl"])
