"""rkv (R-KV): a key repeated by a newer one is penalised.  merge (KV merging): evicted values are
folded into their most similar kept slot exactly as documented."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from thinkviz.core.cache import EvictingCache
from thinkviz.policies import CacheView, make_policy
from thinkviz.policies.merge import fold_values
from thinkviz.policies.rkv import redundancy


def _view(keys, attention, received=None):
    """One layer; ``keys`` ``(H_kv, T, D)``; ``attention`` ``(H_kv, T)`` as the newest query's row."""
    heads, total, _ = keys.shape
    return CacheView(
        positions=torch.arange(total).expand(1, heads, total),
        received=torch.zeros(1, heads, total) if received is None else received[None],
        window=attention[None, :, None, :],
        token_entropy=torch.zeros(total),
        protected=torch.zeros(total, dtype=torch.bool),
        current=total - 1,
        keys=[keys[None]],
    )


def _orthogonal_keys(total, dim=16):
    return torch.eye(dim)[:total]  # (T, D): pairwise cosine 0


def test_older_copy_of_a_repeated_key_loses_lambda():
    keys = _orthogonal_keys(10)
    keys[7] = keys[2] * 3.0  # slot 7 repeats slot 2 (same direction)
    attention = torch.full((1, 10), 0.1)
    score = make_policy("rkv", budget=8, lam=0.5, recent=0, window=1).score(_view(keys[None], attention))[0, 0]
    assert torch.allclose(score[2], torch.tensor(1.0 - 0.5))  # normalised attention 1, redundancy 1
    others = [p for p in range(10) if p != 2]
    assert torch.allclose(score[others], torch.ones(9))  # the newer copy is not penalised
    keep = make_policy("rkv", budget=9, lam=0.5, recent=0, window=1).select(_view(keys[None], attention))
    assert 2 not in keep[0, 0].tolist() and 7 in keep[0, 0].tolist()


def test_redundancy_is_chunked_without_changing_it():
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(2, 1300, 8, generator=generator)  # more rows than one chunk
    positions = torch.stack([torch.arange(1300), torch.randperm(1300, generator=generator)])
    unit = F.normalize(keys, dim=-1)
    similarity = unit @ unit.transpose(1, 2)  # (H, T, T), the unchunked reference
    newer = positions[:, None, :] > positions[:, :, None]
    want = torch.where(newer, similarity, torch.zeros_like(similarity)).amax(-1).clamp(min=0)
    assert torch.allclose(redundancy(keys, positions), want, atol=1e-6)


def test_fold_rule_on_hand_numbers():
    keys = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.1], [0.1, 1.0], [0.9, -0.2]]])  # (1, 5, 2)
    values = torch.tensor([[[1.0], [2.0], [3.0], [4.0], [5.0]]])
    weights = torch.tensor([[1.0, 2.0, 3.0, 4.0, 0.0]])
    keep = torch.tensor([[0, 1]])
    folded = fold_values(keys, values, weights, keep)
    # slot 2 → 0 and slot 4 → 0 (closest to [1, 0]); slot 3 → 1
    assert torch.allclose(folded[0, 0], torch.tensor([(1 * 1 + 3 * 3 + 0 * 5) / (1 + 3 + 0)]))
    assert torch.allclose(folded[0, 1], torch.tensor([(2 * 2 + 4 * 4) / (2 + 4)]))
    assert torch.equal(folded[0, 2:], values[0, 2:])  # evicted slots untouched (about to go)
    # no attention anywhere: a plain mean
    flat = fold_values(keys, values, torch.zeros(1, 5), keep)
    assert torch.allclose(flat[0, :2, 0], torch.tensor([(1 + 3 + 5) / 3, (2 + 4) / 2]))


@pytest.mark.parametrize("normalize", ["none", "queries"])
def test_merge_compress_edits_the_cache_values_of_kept_slots(tiny_llama, normalize):
    config = tiny_llama.model.config
    cache = EvictingCache(config)
    heads, total, dim = config.num_key_value_heads, 20, config.head_dim
    generator = torch.Generator().manual_seed(1)
    received = torch.rand(heads, total, generator=generator)
    for layer in range(config.num_hidden_layers):
        keys = torch.randn(1, heads, total, dim, generator=generator)
        cache.update(keys, torch.randn(1, heads, total, dim, generator=generator), layer)
    cache.record_positions(torch.arange(total))
    before = [layer.values.clone() for layer in cache.layers]
    view = CacheView(
        positions=cache.position_table(),
        received=received.expand(config.num_hidden_layers, -1, -1),
        window=torch.zeros(config.num_hidden_layers, heads, 1, total),
        token_entropy=torch.zeros(total),
        protected=torch.zeros(total, dtype=torch.bool),
        current=total - 1,
        keys=[layer.keys for layer in cache.layers],
    )
    policy = make_policy("merge", budget=12, recent=2, normalize=normalize)
    keep = policy.compress(view, cache)
    h2o = make_policy("h2o", budget=12, recent=2, normalize=normalize)
    assert torch.equal(keep, h2o.select(view))  # h2o's keep set
    # the h2o score: attention received (H2O's sum), or per query that could see the slot
    weights = received if normalize == "none" else received / view.queries_seen[0]
    for layer_idx, layer in enumerate(cache.layers):
        want = fold_values(layer.keys[0], before[layer_idx][0], weights, keep[layer_idx])
        assert torch.allclose(layer.values[0], want)
        kept = keep[layer_idx]
        changed = (layer.values[0] != before[layer_idx][0]).any(-1)  # (H_kv, T)
        assert changed.gather(1, kept).any()  # kept slots absorbed evicted ones
    cache.keep(keep)
    assert cache.layers[0].values.shape[-2] == 12
