"""On a CUDA GPU: the same engine in bf16 and 4-bit, exact eviction, real bytes, a real out-of-memory.

Every test here is marked ``gpu`` (skipped, with the reason shown, where there is no CUDA GPU;
``make gpu-check`` runs them).  They need no weight file: the embedded model is used where its
files happen to be present, otherwise random weights in its geometry go through the same
loader; the other models are random weights in real or small geometries built in code.  This
module imports nothing that the borrowed GPU machines lack (gradio, plotly, gguf).

Tolerances: float32 on CUDA is compared at the CPU's 1e-4 (PyTorch computes float32 matmuls
in IEEE float32 unless told otherwise).  bf16 keeps 8 significant bits (relative rounding
2^-9 per operation), so a bf16 run is compared against a float32 reference of the same weights
at 5 % of the largest reference logit; on the CPU the same comparison stays below 1.1 %.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import logging

import bitsandbytes as bnb
import pytest
import torch
from test_engine import _hf_greedy, _prompt
from test_oracle import _random_ids, reference_logits, replay_with_visibility

from thinkviz.bench.gpu import gpu_report
from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.core.faults import RunFault, guard_frames
from thinkviz.memory import (
    GIB,
    TargetModel,
    VramCapError,
    device_memory,
    set_vram_cap,
    with_device_memory,
)
from thinkviz.models.loading import (
    EMBEDDED,
    ModelLoadError,
    cache_dir,
    embedded_gguf_path,
    load_model,
)
from thinkviz.policies import make_policy
from thinkviz.models.random_weights import load_random, random_model

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
MIB = 2**20
BLOCK = 512  # PyTorch's CUDA allocator rounds every block up to a multiple of 512 bytes

# The embedded model's geometry (the config.json of its conversion): random weights stand in
# for it where its files are absent.
SMOLLM2 = TargetModel(
    "SmolLM2-135M",
    layers=30,
    q_heads=9,
    kv_heads=3,
    head_dim=64,
    hidden=576,
    intermediate=1536,
    vocab=49152,
    tied_embeddings=True,
    max_context=8192,
)
# Small enough to run in seconds, deep enough for bf16 rounding to compound.
ORACLE = TargetModel(
    "oracle-llama",
    layers=4,
    q_heads=8,
    kv_heads=2,
    head_dim=32,
    hidden=256,
    intermediate=512,
    vocab=49152,
    tied_embeddings=True,
    max_context=4096,
)
# 64 KiB of KV cache per token: a few hundred MiB of cap are reached in a few thousand tokens.
BIG_KV = TargetModel(
    "big-kv-llama",
    layers=8,
    q_heads=16,
    kv_heads=16,
    head_dim=128,
    hidden=1024,
    intermediate=2048,
    vocab=49152,
    tied_embeddings=True,
    max_context=16384,
)


def _embedded_files_present() -> bool:
    try:
        embedded_gguf_path()
        return True
    except ModelLoadError:
        return (cache_dir() / "smollm2-135m-instruct" / "model.safetensors").is_file()


@pytest.fixture(scope="module", params=["4bit", "none"])
def cuda_model(request):
    """The embedded model on CUDA (its geometry with random weights where its files are absent)."""
    if _embedded_files_present():
        return load_model(EMBEDDED, request.param, "cuda")
    return load_random(SMOLLM2, request.param, "cuda")


@pytest.fixture(scope="module")
def oracle_models():
    """The same random weights on CUDA in float32 and in bf16."""
    fp32 = random_model(ORACLE, CUDA, dtype=torch.float32, seed=3)
    bf16 = dataclasses.replace(
        fp32,
        model=copy.deepcopy(fp32.model).to(torch.bfloat16),
        geometry=dataclasses.replace(fp32.geometry, dtype_bytes=2),
    )
    return fp32, bf16


@pytest.fixture
def released():
    """Whatever a test leaves on the GPU is collected and the cap lifted afterwards."""
    yield
    set_vram_cap(None, CUDA)
    gc.collect()
    torch.cuda.empty_cache()


def _run_frames(loaded, policy, prompt, settings):
    """A run that exists only inside its generator, so a fault can drop it entirely."""
    run = Run(loaded, policy, prompt, settings)
    yield from with_device_memory(run.generate(), loaded.device)


# ---- the models on CUDA ------------------------------------------------------------------
def test_the_model_runs_on_cuda_in_bf16(cuda_model):
    loaded = cuda_model
    assert loaded.device.type == "cuda"
    assert all(p.device.type == "cuda" for p in loaded.model.parameters())
    assert loaded.model.get_input_embeddings().weight.dtype == torch.bfloat16
    assert loaded.geometry.dtype_bytes == 2
    linears = [m for m in loaded.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    if loaded.quantization == "4bit":
        assert len(linears) == 30 * 7  # q k v o gate up down, NF4
        assert all(m.compute_dtype == torch.bfloat16 for m in linears)
        assert all(m.weight.quant_state is not None for m in linears)
    else:
        assert not linears
    run = Run(
        loaded,
        make_policy("h2o", budget=48, recent=8),
        _prompt(loaded, 40),
        DecodeSettings(max_new_tokens=16, stop_at_eos=False),
    )
    events = list(run.generate())
    assert len(events) == 16 and max(e.kv_tokens for e in events) <= 48 + 1
    for layer in run.cache.layers:
        assert layer.keys.device.type == "cuda" and layer.keys.dtype == torch.bfloat16
    assert events[-1].kv_bytes == sum(layer.keys.nbytes + layer.values.nbytes for layer in run.cache.layers)


@pytest.mark.parametrize("policy_name", ["full", "h2o", "window"])
def test_greedy_equals_model_generate_with_a_covering_budget(cuda_model, policy_name):
    loaded = cuda_model
    prompt = _prompt(loaded, 24)
    settings = DecodeSettings(max_new_tokens=24, stop_at_eos=False)
    run = Run(loaded, make_policy(policy_name, budget=256), prompt, settings)
    ours = [t for e in run.generate() for t in e.token_ids]
    assert ours == _hf_greedy(loaded, prompt, 24)
    assert all(not e.evicted for e in run.record.events)


# ---- eviction is exact on CUDA -----------------------------------------------------------
@pytest.mark.parametrize(
    "policy",
    [{"name": "window", "budget": 24, "interval": 4}, {"name": "h2o", "budget": 24, "interval": 4, "recent": 4}],
)
def test_oracle_in_float32_on_cuda(oracle_models, policy):
    fp32, _ = oracle_models
    made = make_policy(**policy)
    prompt, trace = _random_ids(48, ORACLE.vocab, 1), _random_ids(40, ORACLE.vocab, 2)
    events, logits, visible = replay_with_visibility(fp32, made, prompt, trace)
    assert sum(e.compressed for e in events) >= 3
    for got, want in zip(logits, reference_logits(fp32, prompt, trace, made.interval, visible), strict=True):
        assert (got - want).abs().max().item() <= 1e-4


def test_oracle_in_bf16_against_a_float32_reference(oracle_models):
    fp32, bf16 = oracle_models
    made = make_policy("h2o", budget=24, interval=4, recent=4)
    prompt, trace = _random_ids(48, ORACLE.vocab, 5), _random_ids(40, ORACLE.vocab, 6)
    events, logits, visible = replay_with_visibility(bf16, made, prompt, trace)
    assert sum(e.compressed for e in events) >= 3
    reference = reference_logits(fp32, prompt, trace, made.interval, visible)  # same slots hidden, float32
    scale = max(w.abs().max().item() for w in reference)
    worst = max((got - want).abs().max().item() for got, want in zip(logits, reference, strict=True))
    assert worst <= 0.05 * scale, f"bf16 differs from float32 by {worst:.4f} (largest logit {scale:.3f})"


# ---- bytes -------------------------------------------------------------------------------
def test_kv_bytes_and_allocated_memory_follow_the_cache_every_step(oracle_models, released):
    _, bf16 = oracle_models
    per_token = bf16.geometry.bytes_per_token
    events = list(
        _run_frames(bf16, make_policy("full"), _prompt(bf16, 20), DecodeSettings(max_new_tokens=64, stop_at_eos=False))
    )
    assert all(e.info["device_memory"]["kind"] == "cuda" for e in events)
    allocated = [e.info["device_memory"]["allocated"] for e in events]
    for before, after, a0, a1 in zip(events, events[1:], allocated, allocated[1:]):
        assert after.kv_bytes - before.kv_bytes == per_token  # one more token in every layer
        # the allocator grew by the new K and V tensors, each rounded up to whole blocks
        assert abs((a1 - a0) - per_token) <= 2 * 2 * ORACLE.layers * BLOCK


def test_reported_kv_bytes_are_the_cuda_tensors_nbytes(oracle_models):
    _, bf16 = oracle_models
    budget, interval = 16, 5
    run = Run(
        bf16,
        make_policy("h2o", budget=budget, interval=interval, recent=4),
        _prompt(bf16, 10),
        DecodeSettings(max_new_tokens=40, stop_at_eos=False),
    )
    for event in run.generate():
        layers = run.cache.layers
        assert all(layer.keys.is_cuda and layer.values.is_cuda for layer in layers)
        assert event.kv_bytes == sum(layer.keys.nbytes + layer.values.nbytes for layer in layers)
        assert event.kv_bytes <= (budget + interval) * bf16.geometry.bytes_per_token


# ---- a card you can hit ------------------------------------------------------------------
def test_the_cap_shows_in_device_memory_and_is_validated(released):
    total = torch.cuda.get_device_properties(CUDA).total_memory
    cap = set_vram_cap(4, CUDA)
    assert abs(cap - 4 * GIB) <= 1 and device_memory(CUDA)["cap"] == cap
    assert set_vram_cap(None, CUDA) is None and "cap" not in device_memory(CUDA)
    with pytest.raises(VramCapError, match="is more than this GPU has"):
        set_vram_cap(total / GIB + 1, CUDA)


def test_a_real_out_of_memory_is_caught_reported_and_its_memory_returned(released, caplog):
    loaded = random_model(BIG_KV, CUDA)
    settings = DecodeSettings(max_new_tokens=8, stop_at_eos=False)
    prompt = _random_ids(8192, BIG_KV.vocab, 7)  # a full cache of 8192 tokens needs 512 MiB
    list(_run_frames(loaded, make_policy("h2o", budget=256), prompt[:600], settings))  # warm-up
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(CUDA)
    # room for the h2o run (at most 512 slots: 32 MiB, and its activations), not the full one
    set_vram_cap((torch.cuda.memory_reserved(CUDA) + 160 * MIB) / GIB, CUDA)
    with (
        caplog.at_level(logging.ERROR, logger="thinkviz.core.faults"),
        pytest.raises(RunFault, match="^the full run ran out of device memory and was stopped; its cache is freed"),
    ):
        for _ in guard_frames(_run_frames(loaded, make_policy("full"), prompt, settings), "the full run", CUDA):
            pass
    assert "OutOfMemoryError" in caplog.text  # a real one, from the allocator
    assert torch.cuda.memory_allocated(CUDA) <= base + MIB  # the failed run's cache is gone
    events = list(guard_frames(_run_frames(loaded, make_policy("h2o", budget=256), prompt, settings), "h2o", CUDA))
    assert len(events) == 8 and max(e.kv_tokens for e in events) <= 256 + 1  # the next run works


def test_the_full_cache_runs_out_where_the_projection_says_while_h2o_goes_on(released):
    """Decoding token by token under a cap: the full cache fails when what was reserved before
    the run plus its KV bytes reach the cap.  It fails a little early, never late: a layer's
    K and V are copied when they grow (up to 1/L of the cache twice for a moment) and the
    allocator reserves each tensor over 10 MiB in whole 2 MiB pages."""
    loaded = random_model(BIG_KV, CUDA)
    per_token = loaded.geometry.bytes_per_token
    settings = DecodeSettings(max_new_tokens=8192, stop_at_eos=False, scoring=False)
    prompt = _prompt(loaded, 64)
    list(_run_frames(loaded, make_policy("full"), prompt, DecodeSettings(max_new_tokens=4, stop_at_eos=False)))
    gc.collect()
    torch.cuda.empty_cache()
    room = 256 * MIB
    set_vram_cap((torch.cuda.memory_reserved(CUDA) + room) / GIB, CUDA)
    projected = room // per_token  # tokens of full cache the cap leaves room for
    seen = []
    with pytest.raises(RunFault, match="ran out of device memory"):
        for event in guard_frames(_run_frames(loaded, make_policy("full"), prompt, settings), "the full run", CUDA):
            seen.append(event.kv_tokens)
    assert 0.75 * projected <= seen[-1] <= projected, (seen[-1], projected)
    goes_on = dataclasses.replace(settings, max_new_tokens=int(1.1 * projected))
    h2o = make_policy("h2o", budget=256, interval=16)
    events = list(guard_frames(_run_frames(loaded, h2o, prompt, goes_on), "h2o", CUDA))
    assert len(events) == int(1.1 * projected)  # past the point where the full cache failed


# ---- the benchmark -----------------------------------------------------------------------
def test_the_gpu_benchmark_reads_peak_memory(oracle_models):
    _, bf16 = oracle_models
    report = gpu_report(bf16, contexts=[256, 1024], budget_fraction=0.1, decode_tokens=4, ratio_tokens=8, repeats=1)
    rows = {(r["policy"], r["context"]): r for r in report["contexts"]}
    for row in rows.values():
        assert row["peak_bytes"] >= bf16.weights_bytes + row["final_kv_bytes"]
    assert rows["h2o", 1024]["final_kv_bytes"] < rows["full", 1024]["final_kv_bytes"]
    assert report["meta"]["device_name"] == torch.cuda.get_device_name(CUDA)
    assert all(r["ratio"] > 0 for r in report["ratio"])
