"""pyramidkv and adakv: keep sets whose sizes differ per layer and per kv-head."""

from __future__ import annotations

import pytest
import torch

from thinkviz.policies import CacheView, make_policy
from thinkviz.policies.pyramidkv import pyramid_budgets


def _view(received, window=None, protected=None, valid=None):
    """``received`` ``(L, H_kv, T)``; positions ``0 .. T-1`` everywhere, the view at position ``T-1``."""
    layers, heads, total = received.shape
    return CacheView(
        positions=torch.arange(total).expand(layers, heads, total).clone(),
        received=received,
        window=received[:, :, None, :].expand(-1, -1, 64, -1) if window is None else window,
        token_entropy=torch.zeros(total),
        protected=torch.zeros(total, dtype=torch.bool) if protected is None else protected,
        current=total - 1,
        valid=valid,
    )


@pytest.mark.parametrize(
    "budget, layers, seen, floor, beta",
    [
        (256, 30, 4000, 16, 20),
        (64, 2, 500, 16, 20),
        (100, 7, 101, 8, 5),
        (40, 12, 41, 4, 1),
        (24, 5, 2000, 6, 100),
    ],
)
def test_pyramid_budgets_sum_to_budget_times_layers_and_shrink_with_depth(budget, layers, seen, floor, beta):
    budgets = pyramid_budgets(budget, layers, seen, floor, beta)
    assert sum(budgets) == budget * layers
    assert all(a >= b for a, b in zip(budgets, budgets[1:]))
    assert max(budgets) <= seen and min(budgets) >= floor
    if seen > 2 * budget:  # room for the full pyramid: the top keeps (budget - floor) / beta beyond the floor
        assert budgets[0] > budgets[-1]
        assert abs(budgets[-1] - (floor + (budget - floor) / beta)) <= 1


def test_pyramid_budgets_stay_uniform_until_the_bottom_layer_can_fill():
    assert pyramid_budgets(64, 4, 70, 16, 20) == [64] * 4
    assert pyramid_budgets(64, 4, 16 + 95, 16, 20) == [64] * 4
    assert pyramid_budgets(64, 4, 16 + 96, 16, 20) == [110, 79, 49, 18]  # 16 + 93.6 − l · 30.4, rounded
    assert pyramid_budgets(64, 4, 1000, 70, 20) == [64] * 4  # the floor alone exceeds the budget
    assert pyramid_budgets(64, 1, 1000, 16, 20) == [64]


def test_pyramidkv_keeps_its_layer_budgets_by_snapkv_score():
    generator = torch.Generator().manual_seed(0)
    received = torch.rand(4, 2, 300, generator=generator)
    policy = make_policy("pyramidkv", budget=64, window=8, kernel=1, protect_system=False, protect_question=False)
    keep = policy.select(_view(received))
    assert keep.dtype == torch.bool
    counts = keep.sum(-1)  # (L, H_kv)
    want = pyramid_budgets(64, 4, 300, 8, 20)
    assert counts.tolist() == [[b, b] for b in want]
    assert int(counts.sum()) == 64 * 4 * 2
    assert keep[..., -8:].all(), "the observation window is always kept"
    score = policy.score(_view(received))
    for layer, budget in enumerate(want):
        for head in range(2):
            rest = score[layer, head, :-8]
            chosen = rest.topk(budget - 8).indices
            assert keep[layer, head, chosen].all()


def test_adakv_shares_a_layer_budget_over_heads_by_need_and_keeps_every_protected_slot():
    total = 200
    attention = torch.full((1, 2, total), 0.001)  # h2o's score: attention received (H2O's sum)
    attention[0, 0, :100] = torch.linspace(0.02, 0.03, 100)  # head 0 spreads its attention over 100 slots
    attention[0, 1, :10] = 0.5  # head 1 looks at 10
    attention[0, 1, 10:] = 0.002
    protected = torch.zeros(total, dtype=torch.bool)
    protected[150:160] = True
    policy = make_policy("adakv", budget=80, scorer="h2o", alpha=0.25, recent=8)
    view = _view(attention, protected=protected)
    assert torch.allclose(policy.score(view), attention)
    keep = policy.select(view)
    counts = keep.sum(-1)[0]
    assert int(counts.sum()) == 80 * 2, "the layer keeps exactly budget × kv-heads"
    assert keep[0, :, 150:160].all() and keep[0, :, -8:].all(), "protected spans and the recent window stay"
    assert keep[0, 0, :100].all() and keep[0, 1, :10].all(), "each head keeps what it attends to"
    # head 1: its 18 forced slots and, as the safeguard, its own ⌊0.25 · 80⌋ = 20 best; head 0 gets
    # its 100, the 4 slots left go to the next best scores (head 1's 0.002 over head 0's 0.001)
    assert counts.tolist() == [100 + 18, 160 - 118]
    # one budget per head would have cut head 0 to 80 of its 118; a larger safeguard moves slots back
    # to head 1: 18 forced + ⌊0.5 · 80⌋ = 58 of its own, head 0 the rest
    keep = make_policy("adakv", budget=80, scorer="h2o", alpha=0.5, recent=8).select(view)
    assert keep.sum(-1)[0].tolist() == [102, 58]


@pytest.mark.parametrize("name", ["pyramidkv", "adakv"])
def test_ragged_policies_never_keep_a_hole(name):
    """After a ragged keep, slots that hold nothing (padding, past a layer's end) are never chosen."""
    generator = torch.Generator().manual_seed(1)
    received = torch.rand(2, 2, 120, generator=generator)
    valid = torch.rand(2, 2, 120, generator=generator) > 0.3
    valid[..., -20:] = True
    keep = make_policy(name, budget=40, protect_system=False, protect_question=False).select(
        _view(received, valid=valid)
    )
    assert not (keep & ~valid).any()
    assert (keep.sum(-1) > 0).all()
