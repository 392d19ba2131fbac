"""knorm, keydiff and random: rules that read the cached keys (or nothing) instead of attention."""

from __future__ import annotations

import torch

from thinkviz.policies import CacheView, make_policy
from thinkviz.policies.keydiff import dissimilarity


def _view(keys, current=None, protected=None):
    """One layer; ``keys`` ``(H_kv, T, D)``; positions ``0 .. T-1`` in every head."""
    heads, total, _ = keys.shape
    return CacheView(
        positions=torch.arange(total).expand(1, heads, total),
        received=torch.zeros(1, heads, total),
        window=torch.zeros(1, heads, 1, total),
        token_entropy=torch.zeros(total),
        protected=torch.zeros(total, dtype=torch.bool) if protected is None else protected,
        current=total - 1 if current is None else current,
        keys=[keys[None]],
    )


def test_knorm_keeps_the_lowest_norm_keys_per_head():
    generator = torch.Generator().manual_seed(0)
    norms = torch.stack([torch.randperm(20, generator=generator).float() + 1, torch.arange(20.0) + 1])  # (2, 20)
    direction = torch.nn.functional.normalize(torch.randn(2, 20, 4, generator=generator), dim=-1)
    keys = direction * norms[..., None]
    policy = make_policy("knorm", budget=8, recent=0)
    assert torch.allclose(policy.score(_view(keys))[0], -norms)
    keep = policy.select(_view(keys))[0]
    assert keep[0].tolist() == sorted(norms[0].argsort()[:8].tolist())
    assert keep[1].tolist() == list(range(8))
    # the recent window and protected spans come first, whatever their norm
    protected = torch.zeros(20, dtype=torch.bool)
    protected[15] = True
    keep = make_policy("knorm", budget=8, recent=2).select(_view(keys, protected=protected))[0]
    assert keep[1].tolist() == [0, 1, 2, 3, 4, 15, 18, 19]


def test_keydiff_keeps_the_key_furthest_from_the_mean_direction():
    keys = torch.tensor([[[1.0, 0.0], [2.0, 0.1], [3.0, -0.1], [0.9, 0.05], [0.0, 1.0], [-1.0, 0.0]]])
    score = dissimilarity(keys)[0]
    anchor = torch.nn.functional.normalize(keys[0], dim=-1).mean(0)
    want = -torch.nn.functional.cosine_similarity(keys[0], anchor[None], dim=-1)
    assert torch.allclose(score, want)
    assert score.argsort()[-2:].sort().values.tolist() == [4, 5]  # the orthogonal and the opposite key
    keep = make_policy("keydiff", budget=8, recent=0).select(_view(keys.repeat(1, 2, 1)))[0, 0]
    assert {4, 5, 10, 11} <= set(keep.tolist())
    # the anchor ignores key length: scaling one key changes nothing
    scaled = keys.clone()
    scaled[0, 1] *= 10
    assert torch.allclose(dissimilarity(scaled), score)


def test_random_is_reproducible_and_independent_of_how_positions_arrive():
    keys = torch.randn(2, 50, 4)
    one = make_policy("random", budget=8, seed=3)
    assert torch.equal(one.select(_view(keys)), make_policy("random", budget=8, seed=3).select(_view(keys)))
    assert not torch.equal(one.select(_view(keys)), make_policy("random", budget=8, seed=4).select(_view(keys)))
    stepwise = make_policy("random", budget=8, seed=3)
    for seen in (1, 7, 20, 50):  # the table grows in pieces, as in a decode loop
        stepwise.priorities(1, 2, seen)
    assert torch.equal(stepwise.priorities(1, 2, 50), one.priorities(1, 2, 50))
    heads = one.priorities(1, 2, 50)
    assert not torch.equal(heads[0, 0], heads[0, 1]), "each kv-head draws its own priorities"


def test_random_keeps_a_uniform_sample_of_the_history():
    """Decode 2000 positions one by one under budget 100: the kept positions are spread evenly
    over the whole history (a rule drawing fresh numbers each step would hold mostly recent ones)."""
    policy = make_policy("random", budget=100, seed=0)
    held = torch.arange(0)
    for position in range(2000):
        held = torch.cat([held, torch.tensor([position])])
        view = CacheView(
            positions=held.expand(1, 1, -1),
            received=torch.zeros(1, 1, len(held)),
            window=torch.zeros(1, 1, 1, len(held)),
            token_entropy=torch.zeros(position + 1),
            protected=torch.zeros(position + 1, dtype=torch.bool),
            current=position,
        )
        if len(held) > policy.budget:
            held = held[policy.select(view)[0, 0]]
    assert len(held) == 100
    quarters = torch.bincount(held // 500, minlength=4)
    assert quarters.min() >= 15, f"kept positions per quarter of the history: {quarters.tolist()}"
