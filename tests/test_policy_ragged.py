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


def test_pyramid_budgets_switch_where_the_authors_code_does():
    """KVCache-Factory's PyramidKVCluster: uniform while seen < 2 (budget − window), the pyramid from there."""
    assert pyramid_budgets(64, 4, 70, 16, 20) == [64] * 4
    assert pyramid_budgets(64, 4, 95, 16, 20) == [64] * 4
    # at 96 their bottom layer is clipped to the 96 − 16 tokens before the window, the top takes the rest:
    # 16 + 80 − l · 64/3 = 96, 74.7, 53.3, 32 (their integer steps: 96, 75, 54, 33)
    assert pyramid_budgets(64, 4, 96, 16, 20) == [96, 75, 53, 32]
    # unclipped: 16 + 93.6 − l · 30.4, rounded to the exact total (theirs: 110, 80, 50, 20)
    assert pyramid_budgets(64, 4, 16 + 95, 16, 20) == [110, 79, 49, 18]
    assert pyramid_budgets(64, 4, 1000, 16, 20) == [110, 79, 49, 18]
    assert pyramid_budgets(64, 4, 1000, 70, 20) == [64] * 4  # the floor alone exceeds the budget
    assert pyramid_budgets(64, 1, 1000, 16, 20) == [64]
    # the case, budget 256 and window 16: the pyramid starts at 480 (2 · 240), not at 496
    assert pyramid_budgets(256, 28, 479, 16, 20) == [256] * 28
    at_switch = pyramid_budgets(256, 28, 480, 16, 20)
    assert (at_switch[0], at_switch[-1], sum(at_switch)) == (480, 32, 256 * 28)


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
    assert keep[0, :, 150:160].all() and keep[0, :, -8:].all(), "protected spans and the recent window stay"
    # 18 forced per head, 62 spare each: the layer's best 124 unforced scores are head 1's ten 0.5, head 0's
    # 100 and 14 of head 1's 0.002, so c = (100, 24); each head keeps round(c · 0.75 + ⌊0.25 · 62⌋ = 15) more
    assert counts.tolist() == [18 + 90, 18 + 33]
    assert keep[0, 1, :10].all() and keep[0, 0, 10:100].all() and not keep[0, 0, :10].any()
    # a larger alpha moves slots to the floor: ⌊0.5 · 62⌋ = 31, round(50 + 31), round(12 + 31)
    keep = make_policy("adakv", budget=80, scorer="h2o", alpha=0.5, recent=8).select(view)
    assert keep.sum(-1)[0].tolist() == [18 + 81, 18 + 43]


def _two_heads(head1_high: int):
    """40 slots, h2o scores: head 0 distinct and high, head 1 a thousandth of them but ``head1_high`` at 0.95."""
    total = 40
    attention = torch.linspace(0.9, 0.5, total).expand(1, 2, total).clone()
    attention[0, 1] *= 1e-3
    attention[0, 1, :head1_high] = 0.95
    return _view(attention * (total - torch.arange(total)).float())


def test_adakv_blends_the_adaptive_count_with_the_floor_as_the_authors_code():
    """AdaKV's ``round(c · (1 − α) + ⌊α · (B − W)⌋) + W``; budget 16, window (recent) 4, α 0.2: 12 spare
    per head, the layer ranks 24, the floor is ⌊2.4⌋ = 2."""
    policy = make_policy("adakv", budget=16, scorer="h2o", alpha=0.2, recent=4)
    # head 1 starved (×10⁻³): c = (24, 0), it keeps the floor: 4 + 2 (the old safeguard kept 4 + ⌊0.2 · 16⌋ = 7)
    assert policy.select(_two_heads(0)).sum(-1)[0].tolist() == [4 + 21, 4 + 2]  # round(19.2 + 2) = 21
    # head 1's 5 best beat all of head 0's: c = (19, 5), round(15.2 + 2) = 17 and round(4 + 2) = 6
    assert policy.select(_two_heads(5)).sum(-1)[0].tolist() == [4 + 17, 4 + 6]
    # alpha 0: the adaptive counts alone, exactly budget × heads
    assert make_policy("adakv", budget=16, scorer="h2o", alpha=0.0, recent=4).select(_two_heads(5)).sum() == 32


def test_adakv_ranks_by_snapkv_as_adakv_runs_it():
    ranker = make_policy("adakv").ranker
    assert (ranker.name, ranker.window, ranker.kernel, ranker.pool) == ("snapkv", 32, 7, "max")
    assert make_policy("adakv", recent=8).ranker.window == 8


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
