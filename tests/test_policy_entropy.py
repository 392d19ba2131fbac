"""entropy (semantic KV-eviction by attention entropy): importance 1/(H+ε), low relative-entropy
anchors, capacity vs budget."""

from __future__ import annotations

import math

import torch

from thinkviz.policies import CacheView, make_policy

T = 14


def _view(entropy, protected=()):
    """One layer, two kv-heads, ``T`` slots holding positions 0..T-1 (nothing evicted yet)."""
    positions = torch.arange(T).expand(1, 2, T)
    mask = torch.zeros(T, dtype=torch.bool)
    mask[list(protected)] = True
    return CacheView(
        positions=positions,
        received=torch.zeros(1, 2, T),
        window=torch.zeros(1, 2, 1, T),
        token_entropy=torch.tensor(entropy, dtype=torch.float32),
        protected=mask,
        current=T - 1,
    )


def _kept(policy, view):
    keep = policy.select(view)
    assert torch.equal(keep[:, :1].expand_as(keep), keep), "one decision for every kv-head"
    return set(keep[0, 0].tolist())


# Entropies (bits) of positions 0..13.  Uniform-row entropy log2(p+1), floored at 1:
# p:        0    1    2    3    4    5     6    7    8    9    10   11   12   13
# log2:     1    1   1.58  2  2.32 2.58  2.81  3  3.17 3.32 3.46 3.58  3.70 3.81
ENTROPY = [0.0, 0.9, 1.5, 0.2, 2.0, math.nan, 2.5, 0.4, 3.0, 1.2, 3.3, 0.5, 3.5, 3.6]
# relative entropy rho = H / log2: 0, .9, .95, .1, .86, inf, .89, .133, .95, .36, .95, .14, .95, .94
# anchors at threshold 0.15: positions 0, 3, 7, 11


def test_score_is_inverse_entropy_and_nan_is_worthless():
    scores = make_policy("entropy", budget=10).score(_view(ENTROPY))
    assert scores.shape == (1, 2, T)
    for p, h in enumerate(ENTROPY):
        want = 0.0 if math.isnan(h) else 1.0 / (h + 1e-5)
        assert math.isclose(float(scores[0, 1, p]), want, rel_tol=1e-6)


def test_capacity_cuts_the_cache_but_anchors_and_protected_stay():
    policy = make_policy("entropy", budget=10, max_capacity_tokens=8, retention_threshold=0.15)
    view = _view(ENTROPY, protected=[12, 13])
    assert set(policy.anchors(view).nonzero().flatten().tolist()) == {0, 3, 7, 11}
    # k = min(budget 10, max(capacity 8, 2 forced + 4 anchors)) = 8: the 2 protected, the 4
    # anchors, then the 2 non-anchors with the lowest entropy (1: 0.9 bits, 9: 1.2 bits)
    assert _kept(policy, view) == {12, 13, 0, 3, 7, 11, 1, 9}


def test_anchors_may_exceed_the_capacity_up_to_the_budget():
    policy = make_policy("entropy", budget=10, max_capacity_tokens=8, retention_threshold=0.9)
    view = _view(ENTROPY, protected=[12, 13])
    anchors = set(policy.anchors(view).nonzero().flatten().tolist())
    assert anchors == {0, 1, 3, 4, 6, 7, 9, 11}  # rho <= 0.9
    # 2 forced + 8 anchors = 10 = budget: every anchor stays although capacity is 8
    assert _kept(policy, view) == {12, 13} | anchors
    # with a budget of 9 only the 7 most important anchors fit; the least (6: 2.5 bits) goes
    tighter = make_policy("entropy", budget=9, max_capacity_tokens=8, retention_threshold=0.9)
    assert _kept(tighter, view) == {12, 13} | (anchors - {6})


def test_default_capacity_defers_to_the_budget():
    policy = make_policy("entropy", budget=8)
    kept = _kept(policy, _view(ENTROPY))
    # the 8 most important tokens: the 4 anchors first, then the lowest entropies 0.9, 1.2, 1.5, 2.0
    assert kept == {0, 3, 7, 11, 1, 9, 2, 4}
    assert 5 not in kept  # the NaN row


def test_degenerate_rows_do_not_crash():
    policy = make_policy("entropy", budget=8, max_capacity_tokens=8)
    for entropy in ([math.nan] * T, [0.0] * T, [math.inf] * T, [-1.0] * T):
        keep = policy.select(_view(entropy, protected=[0]))
        assert keep.shape == (1, 2, 8) and 0 in keep[0, 0].tolist()
    info = policy.step_info(_view([0.0] * T))
    assert info == {"anchors_in_cache": T}  # an all-zero row counts as perfectly focused
