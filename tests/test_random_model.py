"""Random weights in a real geometry: the shapes, parameters and KV bytes of memory.py's targets."""

from __future__ import annotations

import bitsandbytes as bnb
import pytest
import torch

from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.memory import TARGETS, TargetModel
from thinkviz.models.loading import ModelLoadError
from tiny_models import SMALL
from thinkviz.policies import make_policy
from thinkviz.models.sources import load_any
from thinkviz.models.random_weights import (
    label,
    load_random,
    random_config,
    random_model,
    random_names,
)


@pytest.mark.parametrize("name", list(TARGETS))
def test_full_size_geometries_build_with_the_counted_parameters(name):
    target = TARGETS[name]
    loaded = random_model(target, "meta", dtype=torch.bfloat16)  # shapes only: no memory
    model = loaded.model
    assert sum(p.numel() for p in model.parameters()) == target.params
    assert loaded.geometry.bytes_per_token == target.bytes_per_token
    g = loaded.geometry
    assert (g.layers, g.q_heads, g.kv_heads, g.head_dim, g.max_context) == (
        target.layers,
        target.q_heads,
        target.kv_heads,
        target.head_dim,
        target.max_context,
    )
    # the weights are what the projection prices at 16 bits (plus rotary buffers, a few bytes)
    assert 0 <= loaded.weights_bytes - target.weights_bytes(16) < 1024
    assert model.config._attn_implementation == "eager"
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == target.tied_embeddings
    assert loaded.name == f"{name} geometry, random weights" == label(target)


def test_qwen3_4b_costs_147456_kv_bytes_per_token():
    assert random_model(TARGETS["Qwen3-4B"], "meta", dtype=torch.bfloat16).geometry.bytes_per_token == 147456


def test_small_geometry_runs_with_the_right_kv_bytes_per_token():
    loaded = random_model(SMALL, "cpu", dtype=torch.bfloat16)
    settings = DecodeSettings(max_new_tokens=12, stop_at_eos=False)
    run = Run(loaded, make_policy("full"), list(range(1000, 1040)), settings)
    events = list(run.generate())
    assert len(events) == 12
    for event in events:
        assert event.kv_bytes == event.kv_tokens * SMALL.bytes_per_token == event.kv_tokens * 2 * 2 * 2 * 16 * 2
    # greedy decoding never picks an id the tokenizer has no text for
    assert all(t < len(loaded.tokenizer) for e in events for t in e.token_ids)
    assert run.record.meta["model"] == "small-qwen3 geometry, random weights"


def test_ids_without_text_have_zero_rows():
    loaded = random_model(SMALL, "cpu")
    n = len(loaded.tokenizer)
    weight = loaded.model.get_input_embeddings().weight
    assert weight.shape[0] == SMALL.vocab > n
    assert torch.count_nonzero(weight[n:]) == 0 and torch.count_nonzero(weight[:n]) > 0.99 * weight[:n].numel()


def test_untied_geometries_zero_the_lm_head_rows_too():
    untied = TargetModel(
        "untied",
        layers=1,
        q_heads=2,
        kv_heads=1,
        head_dim=16,
        hidden=32,
        intermediate=64,
        vocab=50_000,
        tied_embeddings=False,
    )
    model = random_model(untied, "cpu").model
    head = model.get_output_embeddings().weight
    assert head is not model.get_input_embeddings().weight
    n = len(random_model(untied, "cpu").tokenizer)
    assert torch.count_nonzero(head[n:]) == 0 and torch.count_nonzero(head[:n]) > 0


def test_weights_are_seeded_and_leave_the_global_rng_alone():
    state = torch.random.get_rng_state()
    a, b, c = (random_model(SMALL, "cpu", seed=s).model for s in (1, 1, 2))
    assert torch.equal(torch.random.get_rng_state(), state)
    pa, pb, pc = (next(m.model.layers[0].mlp.parameters()) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_default_dtype_is_float32_on_the_cpu():
    loaded = random_model(SMALL, "cpu")
    assert loaded.model.get_input_embeddings().weight.dtype == torch.float32
    assert loaded.geometry.bytes_per_token == 2 * SMALL.bytes_per_token  # 4-byte cache


def test_four_bit_goes_through_the_real_loader(tmp_path, monkeypatch):
    monkeypatch.setenv("THINKVIZ_CACHE", str(tmp_path))
    messages = []
    loaded = load_random(SMALL, "4bit", "cpu", progress=lambda f, m: messages.append((f, m)), backend="bitsandbytes")
    linears = [m for m in loaded.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(linears) == SMALL.layers * 7  # q k v o gate up down
    assert loaded.quantization == "4bit" and loaded.name == label(SMALL)
    assert loaded.geometry.layers == SMALL.layers and loaded.geometry.kv_heads == SMALL.kv_heads
    assert list(tmp_path.iterdir()) == []  # the temporary checkpoint is gone
    fractions = [f for f, _ in messages]
    assert fractions == sorted(fractions) and messages[-1] == (1.0, f"Ready: {label(SMALL)}")
    run = Run(
        loaded,
        make_policy("h2o", budget=16, recent=4),
        list(range(1000, 1030)),
        DecodeSettings(max_new_tokens=4, stop_at_eos=False),
    )
    assert len(list(run.generate())) == 4


def test_load_any_dispatches_random_names():
    assert random_names() == [f"random:{name}" for name in TARGETS]
    message = "Unknown random-weights model 'random:GPT-9'; choose one of random:Qwen3-4B"
    with pytest.raises(ModelLoadError, match=message):
        load_any("random:GPT-9", "none", "cpu")
    with pytest.raises(ModelLoadError, match="Unknown quantization '3bit'"):
        load_random("random:Qwen3-4B", "3bit", "cpu")


def test_load_random_by_name_builds_the_target(monkeypatch):
    # Build Qwen3-4B's shapes on the meta device: loading by name picks the TARGETS entry.
    loaded = load_any(" random:Qwen3-4B ", "none", "meta")
    assert loaded.name == "Qwen3-4B geometry, random weights"
    assert loaded.geometry.bytes_per_token == 2 * TARGETS["Qwen3-4B"].bytes_per_token  # float32 off CUDA


def test_inconsistent_families_are_refused():
    tokenizer = random_model(SMALL, "meta").tokenizer
    with pytest.raises(ValueError, match="qwen3 model has qk_norm=True"):
        random_config(TargetModel("x", 1, 1, 1, 8, 8, 16, 50_000, True, family="qwen3"), tokenizer)
    with pytest.raises(ValueError, match="family must be one of"):
        random_config(TargetModel("x", 1, 1, 1, 8, 8, 16, 50_000, True, family="gpt2"), tokenizer)
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        random_config(TargetModel("x", 1, 1, 1, 8, 8, 16, 1000, True), tokenizer)
