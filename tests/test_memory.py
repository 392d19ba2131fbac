"""Memory accounting: bytes per token, weight sizes and projections, on hand-computed numbers."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
import torch

from thinkviz.core.events import StepEvent
from thinkviz.core.kvquant import KVQuant
from thinkviz.memory import (
    GIB,
    TARGETS,
    Projection,
    TargetModel,
    VramCapError,
    device_memory,
    process_rss_bytes,
    set_vram_cap,
    vram_cap_bytes,
    vram_cap_fraction,
    with_device_memory,
)

# A model small enough to count by hand: 1 layer, 1 q head, 1 kv head, head_dim 4, hidden 4.
TOY = TargetModel(
    "toy", layers=1, q_heads=1, kv_heads=1, head_dim=4, hidden=4, intermediate=8, vocab=10, tied_embeddings=True
)


def test_bytes_per_token_is_two_layers_heads_dim_dtype():
    assert TARGETS["Qwen3-4B"].bytes_per_token == 2 * 36 * 8 * 128 * 2 == 147456
    assert TARGETS["DeepSeek-R1-Distill-Qwen-7B"].bytes_per_token == 2 * 28 * 4 * 128 * 2 == 57344
    assert TARGETS["Llama-3.1-8B"].bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072


@pytest.mark.parametrize(
    "name, billions",
    [
        ("Qwen3-4B", 4.02),
        ("DeepSeek-R1-Distill-Qwen-7B", 7.62),
        ("Llama-3.1-8B", 8.03),
    ],
)
def test_parameter_counts_match_the_published_sizes(name, billions):
    # The sizes the model cards state (Qwen3-4B: 4.0B, 3.6B without embeddings).
    assert TARGETS[name].params / 1e9 == pytest.approx(billions, abs=0.01)


def test_qwen3_4b_non_embedding_parameters():
    qwen = TARGETS["Qwen3-4B"]
    assert (qwen.params - qwen.vocab * qwen.hidden) / 1e9 == pytest.approx(3.6, abs=0.05)


def test_weights_bytes_by_hand():
    # linear: q 4·4 + k,v 2·4·4 + o 4·4 + mlp 3·4·8 = 160; other: embeddings 10·4 + 3 norms · 4 = 52
    assert TOY.linear_params == 160 and TOY.other_params == 52
    assert TOY.weights_bytes(16) == 2 * 212
    assert TOY.weights_bytes(8) == 160 + 2 * 52
    assert TOY.weights_bytes(4) == 160 * 4.5 / 8 + 2 * 52  # NF4: 4 bits + 0.5 bit of absmax
    with pytest.raises(ValueError, match="4, 8 or 16"):
        TOY.weights_bytes(3)


def test_projection_prices_tokens_and_subtracts_weights():
    proj = Projection(TOY, card_gb=1, weights_bits=16)
    assert TOY.bytes_per_token == 2 * 1 * 1 * 4 * 2 == 16
    assert proj.kv_bytes(100) == 1600
    np.testing.assert_array_equal(proj.kv_bytes(np.array([0, 1, 10])), [0, 16, 160])
    assert proj.card_bytes == GIB
    assert proj.available_bytes == GIB - 424
    assert proj.max_tokens == (GIB - 424) // 16


def test_projection_prices_a_token_in_a_kv_format():
    proj = Projection.named("Qwen3-4B", card_gb=8)
    qwen = proj.target  # 36 layers, 8 kv-heads, head_dim 128
    assert proj.token_bytes() == qwen.bytes_per_token == 36 * 2 * 8 * 128 * 2
    assert proj.token_bytes(KVQuant("q8_0")) == 36 * 2 * 8 * 4 * 34  # 4 blocks of 34 bytes per head, K and V
    assert proj.token_bytes(KVQuant("q4_0")) == 36 * 2 * 8 * 4 * 18
    # kivi2: packed codes, value scale+zero per 32 channels, a group id, and 1/32 of the key group's scales
    assert proj.token_bytes(KVQuant("kivi2")) == 36 * 8 * (2 * 32 + 4 * 4 + 2 + 2 * 128 * 2 / 32)
    assert proj.kv_bytes(1000, KVQuant("q4_0")) == 1000 * proj.token_bytes(KVQuant("q4_0"))
    assert proj.tokens_fitting(KVQuant("q4_0")) == proj.available_bytes // (36 * 2 * 8 * 4 * 18)
    assert proj.tokens_fitting(KVQuant()) == proj.max_tokens
    # KIVI's steady state: the newest 128 tokens at full precision, the rest as quantized tokens
    kivi = KVQuant("kivi2")
    window = 128 * (qwen.bytes_per_token - proj.token_bytes(kivi))
    assert proj.kv_bytes(1000, kivi) == 1000 * proj.token_bytes(kivi) + window
    assert proj.kv_bytes(100, kivi) == 100 * qwen.bytes_per_token
    assert proj.tokens_fitting(kivi) == int((proj.available_bytes - window) // proj.token_bytes(kivi))


def test_projection_when_weights_do_not_fit():
    proj = Projection.named("Llama-3.1-8B", card_gb=6, weights_bits=16)  # 16 GB of weights
    assert proj.available_bytes < 0
    assert proj.max_tokens == 0


def test_projection_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown projection target 'GPT-9'"):
        Projection.named("GPT-9", 8)
    with pytest.raises(ValueError, match="card_gb"):
        Projection(TOY, 0)
    with pytest.raises(ValueError, match="4, 8 or 16"):
        Projection(TOY, 8, weights_bits=2)


def test_process_rss_follows_a_real_allocation():
    """RSS holds a touched 64 MiB mapping and gives it back when the mapping is unmapped.

    The block is an anonymous ``mmap`` of its own, not a numpy array: ``free`` of an array may
    keep its pages (an allocator that retains freed memory, or a raised mmap threshold late in
    a long test run), while ``munmap`` returns them at once.  Read across the unmap
    (microseconds): across the allocation, which takes milliseconds, a loaded machine may
    reclaim the process's file-backed pages meanwhile.
    """
    size = 64 * 2**20
    block = mmap.mmap(-1, size)
    block.write(b"\x01" * size)  # every page touched
    held = process_rss_bytes()
    block.close()
    released = process_rss_bytes()
    assert held - released > 48 * 2**20


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU accounting")
def test_device_memory_on_cpu_is_process_rss():
    stats = device_memory("cpu")
    assert stats["kind"] == "cpu"
    assert abs(stats["rss"] - process_rss_bytes()) < 32 * 2**20


@pytest.mark.gpu
def test_device_memory_on_cuda_counts_a_tensor():
    before = device_memory("cuda")["allocated"]
    tensor = torch.empty(32 * 2**20, dtype=torch.uint8, device="cuda")
    stats = device_memory("cuda")
    assert stats["kind"] == "cuda"
    assert stats["allocated"] - before >= tensor.nbytes
    assert stats["reserved"] >= stats["allocated"]


def test_vram_cap_is_a_share_of_the_card():
    assert vram_cap_fraction(8, 32 * GIB) == 0.25
    assert vram_cap_fraction(0.5, GIB) == 0.5
    assert vram_cap_fraction(141, 141 * GIB) == 1.0


@pytest.mark.parametrize("cap", [0, -2, float("nan"), float("inf"), "8", True, None])
def test_vram_cap_must_be_a_positive_size(cap):
    with pytest.raises(VramCapError, match="must be a positive number of GiB"):
        vram_cap_fraction(cap, 80 * GIB)
    if cap is not None:  # named before anything else, also on a machine without a GPU
        with pytest.raises(VramCapError, match="must be a positive number of GiB"):
            set_vram_cap(cap)


def test_vram_cap_cannot_exceed_the_card():
    with pytest.raises(VramCapError, match=r"the VRAM cap \(24 GiB\) is more than this GPU has \(8.0 GiB\)"):
        vram_cap_fraction(24, 8 * GIB)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("cap", [8, None])
def test_vram_cap_is_refused_on_a_cpu(cap):
    with pytest.raises(VramCapError, match="^a VRAM cap needs a CUDA GPU, and this machine has none"):
        set_vram_cap(cap)
    assert vram_cap_bytes() is None


def test_vram_cap_applies_to_cuda_devices_only():
    expected = "a VRAM cap applies to a CUDA device, not cpu" if torch.cuda.is_available() else "needs a CUDA GPU"
    with pytest.raises(VramCapError, match=expected):
        set_vram_cap(4, "cpu")


def test_device_memory_is_recorded_after_every_step():
    events = [
        StepEvent(
            step=i, token_ids=[i], texts=["x"], positions=[i], scores=np.zeros(i + 1), keep_fraction=np.ones(i + 1)
        )
        for i in range(3)
    ]
    seen = []
    for event in with_device_memory(iter(events), "cpu"):
        seen.append(event)
        assert event.info["device_memory"]["kind"] == "cpu"
    assert seen == events
    assert all(e.info["device_memory"]["rss"] > 0 for e in events)
