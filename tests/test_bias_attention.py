"""The biased attention path: per-slot biases in the cache, added to the logits, moved with their slots."""

from __future__ import annotations

import pytest
import torch

from thinkviz.core.attention import BIASED_ATTENTION, LayerArguments, attention_implementation
from thinkviz.core.cache import EvictingCache
from thinkviz.core.engine import DecodeSettings, Run, causal_mask
from thinkviz.policies import make_policy
from thinkviz.policies.h2o import HeavyHitters

from thought_trace import chat_and_trace


class ZeroBiasH2O(HeavyHitters):
    """h2o's keep sets on the biased path, fitting nothing: every bias stays 0, values unchanged."""

    @property
    def fits_bias(self) -> bool:
        return True


def _replay(loaded, policy, prompt, trace):
    logits = []
    run = Run(loaded, policy, prompt, DecodeSettings(prefill_chunk=len(prompt.ids)))
    events = list(run.replay(trace, on_logits=lambda positions, chunk: logits.append(chunk.clone())))
    return run, events, logits


@pytest.mark.parametrize("arch_fixture", ["tiny_llama", "tiny_qwen3"])
def test_zero_bias_gives_the_unbiased_logits(arch_fixture, request):
    loaded = request.getfixturevalue(arch_fixture)
    prompt, trace = chat_and_trace(loaded.tokenizer)
    knobs = {"budget": len(prompt.ids) + 24, "interval": 4, "recent": 4}
    plain_run, plain_events, plain = _replay(loaded, make_policy("h2o", **knobs), prompt, trace)
    biased_run, biased_events, biased = _replay(loaded, ZeroBiasH2O(**knobs), prompt, trace)
    assert biased_run.record.meta["attention"] == BIASED_ATTENTION
    assert plain_run.record.meta["attention"] == "eager"
    assert sum(len(e.evicted) for e in biased_events) >= 30
    for a, b in zip(plain, biased, strict=True):
        assert (a - b).abs().max().item() <= 1e-6
    for a, b in zip(plain_events, biased_events, strict=True):
        assert a.evicted == b.evicted
        assert b.mass is not None and a.mass is None
        assert b.kv_bytes == a.kv_bytes + 4 * b.kept.sum()  # a float32 bias per (layer, kv-head) slot
    assert float(torch.nan_to_num(torch.tensor(biased_events[-1].mass), nan=1.0).sub(1).abs().max()) == 0.0


def test_biased_attention_without_bias_is_the_models_eager_attention(tiny_qwen3):
    model = tiny_qwen3.model
    ids = torch.tensor([[5, 17, 99, 3, 250, 41, 7]])
    mask = causal_mask(0, ids.shape[1], torch.float32, "cpu")
    with torch.inference_mode():
        eager = model(input_ids=ids, attention_mask=mask).logits
        with attention_implementation(model, BIASED_ATTENTION):
            biased = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(eager, biased)


def _filled_cache(loaded, length):
    """An EvictingCache with biases after one forward of ``length`` tokens; every slot's bias set
    to a function of its (layer, kv-head, position) so a misplaced bias shows."""
    cache = EvictingCache(loaded.model.config, bias_device="cpu")
    with torch.inference_mode():
        loaded.model(
            input_ids=torch.arange(10, 10 + length)[None],
            cache=cache,
            attention_mask=causal_mask(0, length, torch.float32, "cpu"),
        )
    cache.record_positions(torch.arange(length))
    for layer in range(len(cache.layers)):
        cache.set_bias(layer, _code(cache.position_table()[layer], layer))
    return cache


def _code(positions, layer):
    heads = torch.arange(positions.shape[0])[:, None]
    return positions.float() * 0.01 + heads + 10.0 * layer


def test_biases_follow_their_slots_through_uniform_per_head_and_ragged_keeps(tiny_llama):
    cache = _filled_cache(tiny_llama, 12)
    layers, heads = len(cache.layers), cache.kv_heads
    assert cache.nbytes() == sum(layer.nbytes() for layer in cache.layers) + layers * heads * 12 * 4

    def check():
        table, valid = cache.position_table(), cache.valid_table()
        for layer in range(layers):
            got, want = cache.bias_table()[layer], _code(table[layer], layer)
            held = torch.ones_like(got, dtype=torch.bool) if valid is None else valid[layer]
            assert torch.equal(got[held], want[held])

    cache.keep(torch.tensor([0, 2, 3, 5, 8, 9, 10, 11]).expand(layers, heads, -1))  # uniform
    check()
    per_head = torch.stack([torch.tensor([0, 1, 2, 4, 6, 7]), torch.tensor([1, 2, 3, 4, 5, 7])])
    cache.keep(per_head.expand(layers, -1, -1))  # per kv-head
    check()
    ragged = torch.zeros(layers, heads, 6, dtype=torch.bool)
    ragged[0, 0, [0, 2, 4, 5]] = True
    ragged[0, 1, [1, 5]] = True
    ragged[1, :, [3, 4, 5]] = True
    cache.keep(ragged)  # layer 0 keeps 4 and 2, layer 1 keeps 3 in each head
    assert cache.ragged
    check()
    assert cache.layer_bias(1).shape == (heads, 3)
    # a new token's bias is 0, in every layer, also where it lands in a shorter layer's padding
    dim = tiny_llama.geometry.head_dim
    for layer in cache.layers:  # what the model's forward does to each layer
        layer.update(torch.randn(1, heads, 1, dim), torch.randn(1, heads, 1, dim))
    cache.record_positions(torch.tensor([12]))
    for layer, length in enumerate(cache.lengths()):
        assert torch.all(cache.bias_table()[layer, :, length - 1] == 0)
    assert cache.logical_nbytes() < cache.nbytes()


def test_set_bias_checks_its_layer(tiny_llama):
    cache = _filled_cache(tiny_llama, 6)
    with pytest.raises(ValueError, match="holds 6 slots"):
        cache.set_bias(0, torch.zeros(cache.kv_heads, 5))
    with pytest.raises(ValueError, match="no attention biases"):
        EvictingCache(tiny_llama.model.config).set_bias(0, torch.zeros(2, 1))


def test_biases_shift_attention_as_the_logits_say(tiny_llama):
    """The captured attention is the biased softmax of the captured queries against the keys."""
    cache = _filled_cache(tiny_llama, 8)
    bias = torch.zeros(cache.kv_heads, 8)
    bias[:, 3] = 2.0
    for layer in range(len(cache.layers)):
        cache.set_bias(layer, bias)
    model = tiny_llama.model
    seen = {}

    def sink(layer_idx, queries):
        seen[layer_idx] = queries

    captured = {}

    def keep_weights(module, args, kwargs, output):
        captured[module.layer_idx] = output[1]

    handles = [layer.self_attn.register_forward_hook(keep_weights, with_kwargs=True) for layer in model.model.layers]
    arguments = [{"slot_bias": cache.layer_bias(i), "query_sink": sink} for i in range(len(cache.layers))]
    try:
        with (
            torch.inference_mode(),
            attention_implementation(model, BIASED_ATTENTION),
            LayerArguments(model, arguments),
        ):
            model(
                input_ids=torch.tensor([[50]]),
                cache=cache,
                position_ids=torch.tensor([[8]]),
                attention_mask=causal_mask(8, 1, torch.float32, "cpu"),
            )
    finally:
        for handle in handles:
            handle.remove()
    group = model.config.num_attention_heads // cache.kv_heads
    for layer in range(len(cache.layers)):
        keys = cache.layer_kv(layer)[0][0].repeat_interleave(group, 0)  # (H, 9, D)
        logits = seen[layer][0] @ keys.transpose(1, 2)  # (H, 1, 9)
        logits[..., :8] += bias.repeat_interleave(group, 0)[:, None, :]
        assert torch.allclose(logits.softmax(-1), captured[layer][0], atol=1e-6)
        assert (captured[layer][0][..., 3] > captured[layer][0][..., 2]).all()
