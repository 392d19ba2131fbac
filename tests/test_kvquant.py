"""KV-cache formats: codecs against llama.cpp's own package, round-trip bounds, stored bytes,
gathering without re-quantizing, and the settings that are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from transformers import DynamicCache

from thinkviz.bench.overhead import measure_overhead
from thinkviz.core.cache import EvictingCache
from thinkviz.core.engine import DecodeSettings, EngineError, Run, causal_mask
from thinkviz.core.kvquant import (
    KVQuant,
    KVQuantError,
    format_names,
    q4_0_decode,
    q4_0_encode,
    q8_0_decode,
    q8_0_encode,
    round_trip_bound,
)
from thinkviz.policies import CacheView, make_policy
from thinkviz.measure.replay import LockstepReplay

QUANTIZED = [name for name in format_names() if name != "none"]


def _awkward(rows: int, dim: int, seed: int) -> torch.Tensor:
    """Random rows with the cases a codec gets wrong: wide scales, an outlier channel, an
    all-zero block, a block whose largest magnitude is negative, ties at the largest magnitude."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim, generator=g) * torch.logspace(-3, 2, rows)[:, None]
    x[:, 3] *= 40.0  # outlier channel (keys have them)
    x[0, :32] = 0.0
    x[1, :32] = torch.linspace(-1, 0.5, 32)
    x[2, :32] = torch.tensor([1.0, -1.0] * 16)
    return x


@pytest.mark.parametrize(
    "fmt, qtype, codec",
    [
        ("q8_0", GGMLQuantizationType.Q8_0, (q8_0_encode, q8_0_decode)),
        ("q4_0", GGMLQuantizationType.Q4_0, (q4_0_encode, q4_0_decode)),
    ],
)
def test_block_formats_are_llama_cpp_bytes(fmt, qtype, codec):
    x = _awkward(64, 128, seed=1)
    encode, decode = codec
    codes, scales = encode(x)
    blocks = x.shape[1] // 32
    ours = torch.cat(
        [
            scales.view(torch.uint8).view(-1, blocks, 2),
            codes.view(torch.uint8).view(-1, blocks, codes.shape[1] // blocks),
        ],
        dim=-1,
    ).flatten(1)
    theirs = gguf_quantize(x.numpy(), qtype)
    assert np.array_equal(ours.numpy(), theirs)
    assert np.array_equal(decode(codes, scales).numpy(), gguf_dequantize(theirs, qtype))


def _real_kv(loaded, tokens=45):
    """Keys and values ``(1, H_kv, T, D)`` of every layer after a forward of ``tokens`` random ids."""
    cache = DynamicCache(config=loaded.model.config)
    ids = torch.randint(10, 5000, (1, tokens), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        loaded.model(input_ids=ids, cache=cache)
    return [(layer.keys, layer.values) for layer in cache.layers]


def _stored(kv_quant, layers_kv, config):
    cache = EvictingCache(config, kv_quant)
    for i, (keys, values) in enumerate(layers_kv):
        cache.update(keys, values, i)
    cache.record_positions(torch.arange(layers_kv[0][0].shape[-2]))
    return cache


def _bound(x, fmt, residual):
    """Per-element round-trip bound of ``x`` ``(1, H, T, D)`` stored in ``fmt`` (KIVI: keys or
    values decided by the caller through ``fmt``'s suffix)."""
    if fmt in ("q8_0", "q4_0"):
        return round_trip_bound(x, fmt)
    name, part = fmt.split(":")
    quantized = KVQuant(name, residual).quantized_tokens(x.shape[2])
    bound = torch.zeros_like(x, dtype=torch.float32)  # the full-precision window is exact
    head = x[:, :, :quantized]
    if part == "keys":  # per channel over each group of 32 tokens
        grouped = round_trip_bound(head.unflatten(2, (-1, 32)), name, dim=3)
        bound[:, :, :quantized] = grouped.flatten(2, 3)
    else:  # per token over 32 channels
        bound[:, :, :quantized] = round_trip_bound(head.unflatten(-1, (-1, 32)), name, dim=-1).flatten(-2)
    return bound


def _check_round_trip(fmt, layers_kv, config, residual=8):
    cache = _stored(KVQuant(fmt, residual), layers_kv, config)
    errors = 0.0
    for i, (keys, values) in enumerate(layers_kv):
        got_k, got_v = cache.layer_kv(i)
        k_fmt, v_fmt = (f"{fmt}:keys", f"{fmt}:values") if fmt.startswith("kivi") else (fmt, fmt)
        assert torch.all((got_k.float() - keys.float()).abs() <= _bound(keys, k_fmt, residual))
        assert torch.all((got_v.float() - values.float()).abs() <= _bound(values, v_fmt, residual))
        errors += (got_k - keys).abs().sum().item()
    assert errors > 0  # it is a lossy format, really applied


@pytest.mark.parametrize("fmt", QUANTIZED)
def test_round_trip_on_random_kv_is_within_the_format_bound(fmt, tiny_llama_d32):
    config = tiny_llama_d32.model.config
    layers = [
        (_awkward(90, 32, seed=2 * i).view(1, 2, 45, 32), _awkward(90, 32, seed=2 * i + 1).view(1, 2, 45, 32))
        for i in range(config.num_hidden_layers)
    ]
    _check_round_trip(fmt, layers, config)


@pytest.mark.parametrize("fmt", QUANTIZED)
def test_round_trip_on_real_kv_is_within_the_format_bound(fmt, tiny_qwen3_d32):
    _check_round_trip(fmt, _real_kv(tiny_qwen3_d32), tiny_qwen3_d32.model.config)


@pytest.mark.integration
@pytest.mark.parametrize("fmt", QUANTIZED)
def test_round_trip_on_the_embedded_models_kv(fmt, embedded_model):
    _check_round_trip(fmt, _real_kv(embedded_model, tokens=200), embedded_model.model.config, residual=128)


def _formula(fmt, tokens, heads, dim, dtype_bytes, residual):
    """Bytes of one layer by the formats' definitions (module docstring of thinkviz.core.kvquant)."""
    if fmt == "none":
        return 2 * tokens * heads * dim * dtype_bytes
    if fmt in ("q8_0", "q4_0"):
        return 2 * tokens * heads * (dim // 32) * (34 if fmt == "q8_0" else 18)
    bits = int(fmt[-1])
    quantized = max(0, tokens - residual) // 32 * 32  # whole key groups of 32 beyond the window
    groups, tail = quantized // 32, tokens - quantized
    keys = quantized * heads * dim * bits // 8 + quantized * heads * 2 + groups * heads * dim * 2 * 2
    values = quantized * heads * dim * bits // 8 + quantized * heads * (dim // 32) * 2 * 2
    return keys + values + 2 * tail * heads * dim * dtype_bytes


@pytest.mark.parametrize("fmt", format_names())
@pytest.mark.parametrize(("residual", "tokens"), [(8, 45), (8, 80), (32, 45), (32, 100)])
def test_stored_bytes_equal_the_formats_formula(fmt, residual, tokens, tiny_llama_d32):
    config = tiny_llama_d32.model.config
    layers_kv = _real_kv(tiny_llama_d32, tokens=tokens)
    cache = _stored(KVQuant(fmt, residual), layers_kv, config)
    heads, dim = layers_kv[0][0].shape[1], layers_kv[0][0].shape[3]
    want = _formula(fmt, tokens, heads, dim, 4, residual)
    assert cache.nbytes() == config.num_hidden_layers * want
    assert KVQuant(fmt, residual).layer_bytes(tokens, heads, dim, 4) == want
    assert cache.full_precision_nbytes(tokens) == config.num_hidden_layers * _formula(
        "none", tokens, heads, dim, 4, residual
    )


@pytest.mark.parametrize("fmt", ["kivi2", "kivi4"])
def test_kivi_keeps_its_newest_128_tokens_at_full_precision_and_the_rest_in_codes(fmt, tiny_llama_d32):
    """KIVI's released defaults (group 32, residual 128): decoding token by token, the newest 128
    tokens (up to 31 more, waiting for a whole key group) stay exactly as written, every older one
    is in codes, and the bytes are those of the stored tensors."""
    config = tiny_llama_d32.model.config
    assert KVQuant(fmt).residual == 128
    keys = _awkward(2 * 200, 32, seed=5).view(1, 2, 200, 32)
    values = _awkward(2 * 200, 32, seed=6).view(1, 2, 200, 32)
    cache = EvictingCache(config, KVQuant(fmt))
    store = cache.layers[0]
    for t in range(200):
        cache.update(keys[:, :, t : t + 1], values[:, :, t : t + 1], 0)
        held = t + 1
        window = store.k_tail.shape[2]
        assert window == (held if held < 160 else 128 + (held - 128) % 32)
        assert store.k_codes.shape[2] == store.v_codes.shape[2] == held - window
        got_k, got_v = store.kv()
        assert torch.equal(got_k[:, :, held - window :], keys[:, :, held - window : held])  # exact, K and V
        assert torch.equal(got_v[:, :, held - window :], values[:, :, held - window : held])
        assert store.nbytes() == KVQuant(fmt).layer_bytes(held, 2, 32, 4)
    assert store.k_tail.shape[2] == 128 + 72 % 32  # 200 tokens: 64 in two key groups, 136 at full precision
    assert store.k_scale.shape[2] == 2
    assert not torch.equal(got_k[:, :, :64], keys[:, :, :64])  # the older ones are codes


def test_bits_per_value():
    assert KVQuant("q8_0").bits_per_value(128) == 8.5
    assert KVQuant("q4_0").bits_per_value(128) == 4.5
    assert KVQuant("none").bits_per_value(128, 2) == 16
    # kivi2, D = 128, a quantized token: K 2 + 0.125 (group id) + 1 (channel scale+zero per 32 tokens),
    # V 2 + 1 (scale+zero per 32 channels)
    assert KVQuant("kivi2").bits_per_value(128) == pytest.approx((3.125 + 3) / 2)


def _decoded_by_position(cache):
    """``{(layer, head, position): (key, value)}`` of every stored slot, decoded."""
    table, out = cache.position_table(), {}
    for layer in range(len(cache.layers)):
        keys, values = cache.layer_kv(layer)
        for head in range(table.shape[1]):
            for slot, position in enumerate(table[layer, head].tolist()):
                out[layer, head, position] = (keys[0, head, slot].clone(), values[0, head, slot].clone())
    return out


def _random_keep(cache, k, seed):
    """Sorted per-head random keep indices ``(L, H_kv, k)`` (heads disagree)."""
    g = torch.Generator().manual_seed(seed)
    layers, heads, total = cache.position_table().shape
    return torch.stack([torch.randperm(total, generator=g)[:k].sort().values for _ in range(layers * heads)]).view(
        layers, heads, k
    )


@pytest.mark.parametrize("fmt", QUANTIZED)
def test_gathering_copies_codes_and_never_requantizes(fmt, tiny_llama_d32):
    config = tiny_llama_d32.model.config
    cache = _stored(KVQuant(fmt, 8), _real_kv(tiny_llama_d32, tokens=45), config)
    before = _decoded_by_position(cache)
    quantized_before = {key for key in before if key[2] < 32}  # KIVI: one key group of 32, 13 in the window
    sizes = [cache.nbytes()]
    for seed, k in enumerate([36, 30, 20, 12]):
        cache.keep(_random_keep(cache, k, seed))
        sizes.append(cache.nbytes())
        after = _decoded_by_position(cache)
        for key, (keys, values) in after.items():
            if key in quantized_before or not fmt.startswith("kivi"):
                assert torch.equal(keys, before[key][0]) and torch.equal(values, before[key][1])
    assert cache.n_slots == 12 and all(a > b for a, b in zip(sizes, sizes[1:]))


def test_kivi_drops_key_groups_no_head_uses_and_keeps_the_others(tiny_llama_d32):
    config = tiny_llama_d32.model.config
    cache = _stored(KVQuant("kivi2", 8), _real_kv(tiny_llama_d32, tokens=168), config)
    store = cache.layers[0]
    assert store.k_scale.shape[2] == 5  # 5 key groups of 32, 8 tokens in the window
    # head 0 keeps group 0's slots, head 1 group 3's: two groups stay, three go
    keep = torch.stack([torch.arange(0, 32), torch.arange(96, 128)])[None].expand(config.num_hidden_layers, -1, -1)
    before = _decoded_by_position(cache)
    cache.keep(keep)
    assert store.k_scale.shape[2] == 2 and store.k_zero.shape[2] == 2
    after = _decoded_by_position(cache)
    assert all(torch.equal(after[key][0], before[key][0]) for key in after)


def test_kivi_keep_that_splits_heads_across_the_tail_quantizes_the_tail_first(tiny_llama_d32):
    config = tiny_llama_d32.model.config
    layers_kv = _real_kv(tiny_llama_d32, tokens=45)
    cache = _stored(KVQuant("kivi4", 8), layers_kv, config)
    store = cache.layers[0]
    assert store.k_tail.shape[2] == 13  # one key group of 32, 13 tokens in the window
    # head 0 keeps 30 quantized + 4 tail slots, head 1 32 + 2: they disagree on the split
    keep = torch.stack(
        [torch.cat([torch.arange(0, 30), torch.arange(40, 44)]), torch.cat([torch.arange(0, 32), torch.arange(43, 45)])]
    )
    cache.keep(keep[None].expand(config.num_hidden_layers, -1, -1))
    assert store.k_tail.shape[2] == 0 and store.k_codes.shape[2] == 34  # dense, all quantized
    assert store.k_scale.shape[2] == 2  # group 0 still used, the short one new
    keys, _ = cache.layer_kv(0)
    tail = layers_kv[0][0][:, :, 32:45]  # the flushed group, per channel over its 13 tokens
    bound = round_trip_bound(tail, "kivi4", dim=2)
    assert torch.all((keys[0, 0, 30:34] - tail[0, 0, 8:12]).abs() <= bound[0, 0, 8:12])
    assert torch.all((keys[0, 1, 32:34] - tail[0, 1, 11:13]).abs() <= bound[0, 1, 11:13])


@pytest.mark.parametrize("fmt", QUANTIZED)
def test_merge_re_encodes_only_the_values_that_absorbed_an_evicted_one(fmt, tiny_llama_d32):
    config = tiny_llama_d32.model.config
    cache = _stored(KVQuant(fmt, 8), _real_kv(tiny_llama_d32, tokens=45), config)
    total, layers = 45, config.num_hidden_layers
    received = torch.rand(layers, cache.kv_heads, total, generator=torch.Generator().manual_seed(5))
    view = CacheView(
        positions=cache.position_table(),
        received=received,
        window=torch.zeros(layers, cache.kv_heads, 1, total),
        token_entropy=torch.zeros(total),
        protected=torch.zeros(total, dtype=torch.bool),
        current=total - 1,
        keys=cache.key_views(),
    )
    before = _decoded_by_position(cache)
    keep = make_policy("merge", budget=20, recent=2).compress(view, cache)
    changed = 0
    for (layer, head, position), (keys, values) in _decoded_by_position(cache).items():
        assert torch.equal(keys, before[layer, head, position][0])  # keys never change
        if not torch.equal(values, before[layer, head, position][1]):
            changed += 1
            assert position in keep[layer, head]
    kept = layers * cache.kv_heads * 20
    assert 0 < changed < kept  # some kept values absorbed evicted ones, the others kept their codes


def test_unknown_formats_and_residuals_are_refused_clearly():
    with pytest.raises(KVQuantError, match="unknown KV format 'q5_1'; choose one of: none, q8_0, q4_0, kivi2, kivi4"):
        KVQuant("q5_1")
    with pytest.raises(KVQuantError, match="residual must be between 8 and 512 tokens, got 4"):
        KVQuant("kivi2", residual=4)
    with pytest.raises(KVQuantError, match="residual must be an integer"):
        KVQuant("kivi2", residual="many")
    assert KVQuant.parse(" Q4_0 ") == KVQuant("q4_0")


def test_a_head_dim_the_blocks_do_not_fit_is_refused_by_the_engine(tiny_llama):
    assert tiny_llama.geometry.head_dim == 16
    refusal = "q8_0 stores blocks of 32 values along head_dim; this model's head_dim is 16"
    with pytest.raises(EngineError, match=refusal):
        Run(tiny_llama, make_policy("full"), [100, 101, 102], kv_quant=KVQuant("q8_0"))
    Run(tiny_llama, make_policy("full"), [100, 101, 102], kv_quant=KVQuant("none"))  # full precision fits any


@pytest.mark.parametrize("fmt", QUANTIZED)
def test_run_reports_the_bytes_it_stores_and_its_format(fmt, tiny_llama_d32):
    run = Run(
        tiny_llama_d32,
        make_policy("h2o", budget=24, recent=4, interval=2),
        list(range(100, 140)),
        DecodeSettings(max_new_tokens=12, stop_at_eos=False),
        kv_quant=KVQuant(fmt, 8),
    )
    for event in run.generate():
        assert event.kv_bytes == run.cache.nbytes() == sum(layer.nbytes() for layer in run.cache.layers)
        assert event.full_kv_bytes == (event.positions[-1] + 1) * tiny_llama_d32.geometry.bytes_per_token
        assert event.kv_bytes < event.kv_tokens * tiny_llama_d32.geometry.bytes_per_token
    bits = {"q8_0": 8, "q4_0": 4, "kivi2": 2, "kivi4": 4}[fmt]
    residual = 8 if fmt.startswith("kivi") else None
    assert run.record.meta["kv_quant"] == {"format": fmt, "bits": bits, "residual": residual}
    # the peak is taken after each forward, before its compression
    assert run.record.summary["peak_kv_bytes"] >= max(e.kv_bytes for e in run.record.events)


def test_full_precision_is_the_plain_transformers_path_bit_for_bit(tiny_qwen3):
    """kv_quant=none: every replayed token's logits equal a plain DynamicCache decode exactly."""
    prompt, trace = list(range(200, 230)), list(range(400, 416))
    logits = []
    run = Run(tiny_qwen3, make_policy("full"), prompt, DecodeSettings(prefill_chunk=len(prompt)))
    list(run.replay(trace, on_logits=lambda positions, chunk: logits.append(chunk)))
    model, cache, seen = tiny_qwen3.model, DynamicCache(config=tiny_qwen3.model.config), 0
    dtype = model.get_input_embeddings().weight.dtype
    for step, ids in enumerate([prompt] + [[t] for t in trace]):
        with torch.inference_mode():
            out = model(
                input_ids=torch.tensor([ids]),
                position_ids=torch.arange(seen, seen + len(ids))[None],
                attention_mask=causal_mask(seen, len(ids), dtype, "cpu"),
                cache=cache,
                logits_to_keep=1 if step == 0 else 0,
            )  # as the engine asks
        seen += len(ids)
        assert torch.equal(out.logits[0, -1:].float(), logits[step][-1:])


def test_lockstep_measures_every_format_against_the_full_precision_full_cache(tiny_llama_d32):
    ids = list(range(300, 364))
    policies = [
        make_policy("full", interval=8),
        make_policy("full", interval=8),
        make_policy("window", budget=32, interval=8),
    ]
    formats = [KVQuant("q8_0"), KVQuant("kivi2", 8), KVQuant("q4_0")]
    replay = LockstepReplay(tiny_llama_d32, policies, list(range(100, 132)), ids, kv_quants=formats).run()
    assert replay.reference.record.meta["kv_quant"]["format"] == "none"
    full = replay.reference.record.summary["peak_kv_bytes"]
    kl = [run.record.summary["fidelity"]["all"]["kl"] for run in replay.runs]
    assert all(value > 0 for value in kl)
    assert kl[1] > kl[0]  # 2 bits cost more than 8
    fractions = [run.record.summary["peak_kv_bytes"] / full for run in replay.runs]
    assert fractions[0] == pytest.approx(34 / 32 / 4)  # fp32 model: 8.5 of 32 bits
    with pytest.raises(EngineError, match="3 policies but 1 KV formats"):
        LockstepReplay(tiny_llama_d32, policies, list(range(100, 132)), ids, kv_quants=formats[:1])


def test_the_overhead_bench_times_the_engine_in_the_kv_format_too(tiny_llama_d32):
    result = measure_overhead(tiny_llama_d32, new_tokens=6, budget=40, repeats=1, kv_quant=KVQuant("q8_0"))
    assert result.quantized_tokens_per_second > 0
    assert result.kv_quant_ratio == result.quantized_tokens_per_second / result.engine_tokens_per_second
    assert measure_overhead(tiny_llama_d32, new_tokens=6, budget=40, repeats=1).kv_quant_ratio is None
