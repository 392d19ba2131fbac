"""Attention-free policies run the model's fused attention (SDPA); everything else stays eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from thinkviz.core.attention import AttentionCapture, attention_implementation
from thinkviz.core.engine import DecodeSettings, Run, attention_kernel
from thinkviz.policies import make_policy


def _prompt(loaded, n, seed=0):
    vocab = loaded.model.config.vocab_size
    return torch.randint(10, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize(
    "name, scoring, kernel",
    [
        ("knorm", False, "sdpa"),
        ("knorm", True, "sdpa"),  # its scores are key norms: no weights needed to show them
        ("window", True, "sdpa"),
        ("random", False, "sdpa"),
        ("h2o", False, "eager"),  # it decides on attention
        ("full", True, "eager"),
        ("full", False, "sdpa"),  # full shows attention scores, and evicts nothing
    ],
)
def test_the_kernel_follows_what_needs_the_weights(tiny_llama, name, scoring, kernel):
    policy = make_policy(name, budget=64)
    assert attention_kernel(tiny_llama.model, policy, DecodeSettings(scoring=scoring)) == kernel
    assert attention_kernel(tiny_llama.model, policy, DecodeSettings(scoring=scoring, fast_attention=False)) == "eager"


@pytest.mark.parametrize("arch_fixture", ["tiny_llama", "tiny_qwen3"])
@pytest.mark.parametrize("name", ["knorm", "window"])
def test_sdpa_runs_give_the_eager_logits_and_keep_sets(arch_fixture, name, request):
    loaded = request.getfixturevalue(arch_fixture)
    runs = []
    for fast in (True, False):
        logits = []
        run = Run(
            loaded,
            make_policy(name, budget=24, interval=4, recent=4)
            if name == "knorm"
            else make_policy(name, budget=24, interval=4),
            _prompt(loaded, 30),
            DecodeSettings(scoring=True, fast_attention=fast),
        )
        events = list(run.replay(_prompt(loaded, 40, seed=1), on_logits=lambda p, chunk, out=logits: out.append(chunk)))
        runs.append((run, events, logits))
    (fast_run, fast_events, fast_logits), (eager_run, eager_events, eager_logits) = runs
    assert fast_run.record.meta["attention"] == "sdpa" and eager_run.record.meta["attention"] == "eager"
    assert loaded.model.config._attn_implementation == "eager", "the shared model is left as it was"
    for a, b in zip(fast_logits, eager_logits, strict=True):
        assert (a - b).abs().max().item() <= 1e-4
    assert torch.equal(fast_run.cache.position_table(), eager_run.cache.position_table())
    for a, b in zip(fast_events, eager_events, strict=True):
        assert a.evicted == b.evicted and a.kv_bytes == b.kv_bytes
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5, atol=1e-6)  # shown without any weights
    assert not np.isnan(fast_events[-1].scores).all()


def _kernels_read(model) -> set[str]:
    """The kernel names every attention module reads at call time."""
    return {layer.self_attn.config._attn_implementation for layer in model.model.layers}


@pytest.mark.parametrize("arch_fixture", ["tiny_llama", "tiny_qwen3"])
def test_the_kernel_switch_writes_what_set_attn_implementation_writes_and_restores_it(
    arch_fixture, request, monkeypatch
):
    model = request.getfixturevalue(arch_fixture).model
    with attention_implementation(model, "sdpa"):  # the first switch to a kernel may validate it
        assert _kernels_read(model) == {"sdpa"}
    assert _kernels_read(model) == {"eager"}
    validations = []
    monkeypatch.setattr(type(model), "set_attn_implementation", lambda self, name: validations.append(name))
    for _ in range(2):  # later switches replay the same config values, without validating again
        with attention_implementation(model, "sdpa"):
            assert _kernels_read(model) == {"sdpa"} and model.config._attn_implementation == "sdpa"
        assert _kernels_read(model) == {"eager"} and model.config._attn_implementation == "eager"
    with pytest.raises(KeyError), attention_implementation(model, "sdpa"):
        raise KeyError("the block fails")
    assert _kernels_read(model) == {"eager"}, "restored when the block raises"
    assert validations == []


def test_a_capture_that_needs_no_weights_installs_no_hooks(tiny_llama):
    model = tiny_llama.model
    capture = AttentionCapture(model, tiny_llama.geometry.kv_heads, hidden_layers=(0, 1, -1))
    capture.enabled = False
    with capture:
        assert not any(module._forward_hooks for module in model.modules())
    capture.enabled = True
    with capture:
        assert all(layer.self_attn._forward_hooks for layer in model.model.layers)
    assert not any(module._forward_hooks for module in model.modules())
