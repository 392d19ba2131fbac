"""Ragged keep sets in the engine: per-layer lengths, padded heads, honest bytes; budgets as a
fraction of the tokens seen."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from thinkviz.core.cache import EvictingCache
from thinkviz.text.chat import build_chat
from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.policies import make_policy


def _prompt(loaded, n, seed=0):
    vocab = loaded.model.config.vocab_size
    return torch.randint(10, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _recording(policy):
    """Wrap ``policy.compress`` so every keep set it returns is kept in a list."""
    decisions, decide = [], policy.compress

    def compress(view, cache):
        keep = decide(view, cache)
        decisions.append(keep.clone())
        return keep

    policy.compress = compress
    return decisions


def test_ragged_keep_gives_layers_their_own_lengths_and_pads_heads(tiny_llama):
    config = tiny_llama.model.config
    heads, dim = config.num_key_value_heads, config.head_dim
    cache = EvictingCache(config)
    generator = torch.Generator().manual_seed(0)
    written = [
        (torch.randn(1, heads, 10, dim, generator=generator), torch.randn(1, heads, 10, dim, generator=generator))
        for _ in range(2)
    ]
    for layer, (keys, values) in enumerate(written):
        cache.update(keys, values, layer)
    cache.record_positions(torch.arange(100, 110))
    mask = torch.zeros(2, heads, 10, dtype=torch.bool)
    mask[0, 0, [1, 4, 7]] = True  # layer 0: head 0 keeps 3, head 1 keeps 1
    mask[0, 1, [8]] = True
    mask[1, :, [2, 9]] = True  # layer 1: both keep 2
    cache.keep(mask)
    assert cache.ragged and cache.lengths() == [3, 2]
    assert cache.kept_counts().tolist() == [[3, 1], [2, 2]]
    valid, table = cache.valid_table(), cache.position_table()
    assert valid.shape == table.shape == (2, heads, 3)
    assert table[0, 0].tolist() == [101, 104, 107] and valid[0, 0].all()
    # head 1 is padded with its lowest slots it does not keep, in physical order
    assert table[0, 1].tolist() == [100, 101, 108] and valid[0, 1].tolist() == [False, False, True]
    assert table[1, :, :2].tolist() == [[102, 109]] * heads and not valid[1, :, 2].any()
    keys0 = cache.layers[0].keys[0]
    assert torch.equal(keys0[0], written[0][0][0, 0, [1, 4, 7]]) and torch.equal(
        keys0[1], written[0][0][0, 1, [0, 1, 8]]
    )
    # physical bytes include the padding; logical bytes do not
    slot = 2 * dim * 4  # K and V, float32
    tensors = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    assert cache.nbytes() == tensors == (3 + 2) * heads * slot
    assert cache.logical_nbytes() == (3 + 1 + 2 + 2) * slot
    # new tokens go after each layer's own slots
    for layer in range(len(cache.layers)):
        cache.update(torch.zeros(1, heads, 1, dim), torch.zeros(1, heads, 1, dim), layer)
    cache.record_positions(torch.tensor([110]))
    assert cache.position_table()[0, 0, 3] == 110 and cache.position_table()[1, 0, 2] == 110
    assert cache.kept_counts().tolist() == [[4, 2], [3, 3]]


def test_a_uniform_keep_given_as_a_mask_changes_nothing(tiny_llama):
    """Same logits bit for bit, same bytes, and the cache stays dense: uniform policies are unchanged."""

    class AsMask:
        def __init__(self, policy):
            self.policy = policy

        def __call__(self, view, cache):
            keep = self.policy.select(view)
            return torch.zeros(view.positions.shape, dtype=torch.bool).scatter(-1, keep, True)

    runs = []
    for as_mask in (False, True):
        policy = make_policy("h2o", budget=16, interval=2, recent=4)
        if as_mask:
            policy.compress = AsMask(policy)
        logits = []
        run = Run(tiny_llama, policy, _prompt(tiny_llama, 20), DecodeSettings(max_new_tokens=30, stop_at_eos=False))
        events = list(
            run.replay(_prompt(tiny_llama, 30, seed=1), on_logits=lambda p, chunk, out=logits: out.append(chunk))
        )
        assert not run.cache.ragged
        runs.append((events, logits))
    (dense, dense_logits), (masked, masked_logits) = runs
    assert all(torch.equal(a, b) for a, b in zip(dense_logits, masked_logits, strict=True))
    assert [e.kv_bytes for e in dense] == [e.kv_bytes for e in masked] == [e.logical_kv_bytes for e in masked]


def test_adakv_run_reports_kept_counts_and_the_bytes_of_its_padded_tensors(tiny_llama):
    policy = make_policy("adakv", budget=24, interval=4, recent=4, alpha=0.0)
    decisions = _recording(policy)
    run = Run(tiny_llama, policy, _prompt(tiny_llama, 40), DecodeSettings(max_new_tokens=40, stop_at_eos=False))
    geometry = tiny_llama.geometry
    per_head_slot = 2 * geometry.head_dim * geometry.dtype_bytes
    padded = 0
    compressing = [e for e in run.generate() if e.compressed]
    assert len(compressing) == len(decisions) - 1 >= 5  # the first decision cut the prompt (no event)
    for event, mask in zip(compressing, decisions[1:]):
        kept = mask.sum(-1).numpy()  # (L, H_kv): what the policy chose
        assert np.array_equal(event.kept, kept)
        assert (kept.sum(-1) == 24 * geometry.kv_heads).all(), "each layer keeps exactly budget × kv-heads"
        assert event.kv_bytes == kept.max(-1).sum() * geometry.kv_heads * per_head_slot  # padded to the longest head
        assert event.logical_kv_bytes == kept.sum() * per_head_slot
        padded += event.kv_bytes > event.logical_kv_bytes
    assert padded, "some step must pad a head"
    assert run.record.events[-1].kv_bytes == sum(layer.keys.nbytes + layer.values.nbytes for layer in run.cache.layers)


def test_pyramidkv_run_keeps_budget_times_layers_and_less_with_depth(tiny_llama):
    policy = make_policy("pyramidkv", budget=24, interval=4, window=4, protect_system=False, protect_question=False)
    run = Run(tiny_llama, policy, _prompt(tiny_llama, 80), DecodeSettings(max_new_tokens=24, stop_at_eos=False))
    compressing = [e for e in run.generate() if e.compressed]
    assert compressing
    heads = tiny_llama.geometry.kv_heads
    for event in compressing:
        per_layer = event.kept[:, 0]
        assert (event.kept == per_layer[:, None]).all(), "every head of a layer keeps the same number"
        assert per_layer.sum() == 24 * len(per_layer) and per_layer[0] > per_layer[-1]
        assert event.kv_tokens == 24 and event.kv_bytes == event.logical_kv_bytes  # no padding
    assert run.cache.lengths() == run.cache.kept_counts()[:, 0].tolist()  # the layers' own lengths
    assert len(set(run.cache.lengths())) == len(run.cache.lengths()) and heads > 1


@pytest.mark.parametrize("fraction, protect", [(0.3, False), (0.55, True)])
def test_budget_fraction_keeps_the_ceiling_of_f_times_n_or_the_forced_slots(tiny_llama, fraction, protect):
    policy = make_policy(
        "h2o",
        budget_mode="fraction",
        budget_fraction=fraction,
        recent=4,
        interval=1,
        protect_system=protect,
        protect_question=protect,
    )
    prompt = (
        build_chat(tiny_llama.tokenizer, "Be brief.", "What is two plus two?") if protect else _prompt(tiny_llama, 30)
    )
    run = Run(tiny_llama, policy, prompt, DecodeSettings(max_new_tokens=40, stop_at_eos=False, prefill_chunk=8))
    events = list(run.generate())
    protected = int(run.segmenter.protected_mask().sum()) if protect else 0
    compressing = [e for e in events if e.compressed]
    assert len(compressing) > 20
    for event in compressing:
        seen = event.positions[-1] + 1
        assert event.kv_tokens == max(math.ceil(fraction * seen), protected + 4)
