"""The decode loop: agreement with model.generate, real byte accounting, stopping."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from thinkviz.core.engine import DecodeSettings, EngineError, Run, causal_mask
from thinkviz.policies import make_policy

from thought_trace import chat_and_trace


def _prompt(loaded, n=12, seed=0):
    vocab = loaded.model.config.vocab_size
    return torch.randint(10, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _hf_greedy(loaded, prompt, n):
    ids = torch.tensor([prompt], device=loaded.device)
    with torch.inference_mode():
        out = loaded.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("arch_fixture", ["tiny_llama", "tiny_qwen3", "tiny_llama_int4", "tiny_qwen3_int4"])
@pytest.mark.parametrize("policy_name", ["full", "h2o", "window"])
def test_greedy_equals_model_generate_when_budget_covers_everything(arch_fixture, policy_name, request):
    loaded = request.getfixturevalue(arch_fixture)
    prompt = _prompt(loaded)
    run = Run(loaded, make_policy(policy_name, budget=64), prompt, DecodeSettings(max_new_tokens=24, stop_at_eos=False))
    ours = [t for e in run.generate() for t in e.token_ids]
    assert ours == _hf_greedy(loaded, prompt, 24)
    assert all(not e.evicted for e in run.record.events)


@pytest.mark.parametrize("interval", [1, 5])
def test_kv_bytes_are_real_and_bounded(tiny_llama, interval):
    loaded = tiny_llama
    budget = 16
    run = Run(
        loaded,
        make_policy("h2o", budget=budget, interval=interval, recent=4),
        _prompt(loaded, 10),
        DecodeSettings(max_new_tokens=40, stop_at_eos=False),
    )
    per_token = loaded.geometry.bytes_per_token
    for event in run.generate():
        tensors = sum(layer.keys.nbytes + layer.values.nbytes for layer in run.cache.layers)
        assert event.kv_bytes == tensors
        assert event.kv_tokens == run.cache.layers[0].keys.shape[-2]
        assert event.kv_bytes <= (budget + interval) * per_token
        assert event.full_kv_bytes == (event.positions[-1] + 1) * per_token
    assert run.record.summary["peak_kv_bytes"] <= (budget + interval) * per_token
    assert run.record.summary["final_kv_bytes"] < run.record.summary["final_full_kv_bytes"]


def test_keep_fraction_and_evicted_agree(tiny_llama):
    run = Run(
        tiny_llama,
        make_policy("h2o", budget=12, recent=2),
        _prompt(tiny_llama, 8),
        DecodeSettings(max_new_tokens=20, stop_at_eos=False),
    )
    gone: set[int] = set()
    for event in run.generate():
        gone |= set(event.evicted)
        assert event.keep_fraction.shape == event.scores.shape == (event.positions[-1] + 1,)
        assert np.all(event.keep_fraction[sorted(gone)] == 0)
        assert np.all(np.isnan(event.scores[sorted(gone)]))
        assert np.isclose(event.keep_fraction.sum(), event.kv_tokens)
    assert gone


def test_sampling_is_reproducible_with_a_seed(tiny_llama):
    def sample(seed):
        run = Run(
            tiny_llama,
            make_policy("tova", budget=16),
            _prompt(tiny_llama),
            DecodeSettings(max_new_tokens=12, temperature=1.0, top_p=0.9, seed=seed, stop_at_eos=False),
        )
        return [t for e in run.generate() for t in e.token_ids]

    assert sample(3) == sample(3)
    assert sample(3) != sample(4)


def test_cancel_stops_the_run(tiny_llama):
    cancel = threading.Event()
    run = Run(
        tiny_llama,
        make_policy("window", budget=16),
        _prompt(tiny_llama),
        DecodeSettings(max_new_tokens=50, stop_at_eos=False),
        cancel=cancel,
    )
    events = []
    for event in run.generate():
        events.append(event)
        if len(events) == 3:
            cancel.set()
    assert len(events) == 3
    assert run.record.summary["stopped"] == "cancelled"


def test_eos_stops_generation(tiny_llama, monkeypatch):
    prompt = _prompt(tiny_llama)
    first = _hf_greedy(tiny_llama, prompt, 1)[0]
    monkeypatch.setattr(tiny_llama.model.generation_config, "eos_token_id", first)  # the model is shared
    run = Run(tiny_llama, make_policy("full"), prompt, DecodeSettings(max_new_tokens=10))
    assert [e.token_ids for e in run.generate()] == [[first]]
    assert run.record.summary["stopped"] == "eos"


def test_empty_and_overlong_prompts_are_refused(tiny_llama):
    with pytest.raises(EngineError, match="empty"):
        Run(tiny_llama, make_policy("full"), [])
    too_long = [5] * tiny_llama.geometry.max_context
    with pytest.raises(EngineError, match="context"):
        Run(tiny_llama, make_policy("full"), too_long)


def test_chunked_prefill_compresses_long_prompts(tiny_llama):
    run = Run(
        tiny_llama,
        make_policy("streaming", budget=16, n_sink=4),
        _prompt(tiny_llama, 100),
        DecodeSettings(max_new_tokens=2, prefill_chunk=16, stop_at_eos=False),
    )
    events = list(run.generate())
    assert run.record.summary["peak_kv_bytes"] <= (16 + 16) * tiny_llama.geometry.bytes_per_token
    kept = np.flatnonzero(events[-1].keep_fraction)
    assert kept[:4].tolist() == [0, 1, 2, 3]  # the sinks survived the chunked prefill


@pytest.mark.integration
def test_embedded_4bit_model_generates_32_tokens_through_h2o(embedded_model):
    from thinkviz.text.chat import REASONING_SYSTEM_PROMPT, build_chat

    assert embedded_model.quantization == "4bit"
    prompt = build_chat(embedded_model.tokenizer, REASONING_SYSTEM_PROMPT, "What is 12 times 3?")
    policy = make_policy("h2o", budget=64, recent=16, protect_system=False, protect_question=False)
    run = Run(embedded_model, policy, prompt, DecodeSettings(max_new_tokens=32, stop_at_eos=False))
    events = list(run.generate())
    assert len(events) == 32
    assert run.record.generated_text.strip()
    assert max(e.kv_tokens for e in events) <= 64 + 1
    # h2o decides per kv-head: tokens leave some of the 30 x 3 (layer, head) slots first
    assert (events[-1].keep_fraction < 1).sum() > len(prompt.ids) // 2


def test_two_threads_sharing_one_model_get_their_own_results(tiny_llama):
    """Runs in parallel threads on one model equal the same runs done one after the other."""

    def tokens_and_scores(policy, prompt):
        run = Run(
            tiny_llama, make_policy(policy, budget=40), prompt, DecodeSettings(max_new_tokens=20, stop_at_eos=False)
        )
        events = list(run.generate())
        return [e.token_ids for e in events], events[-1].scores

    jobs = [("h2o", _prompt(tiny_llama, 20, seed=1)), ("tova", _prompt(tiny_llama, 30, seed=2))]
    alone = [tokens_and_scores(*job) for job in jobs]
    together: dict[int, tuple] = {}
    threads = [
        threading.Thread(target=lambda i=i, job=job: together.__setitem__(i, tokens_and_scores(*job)))
        for i, job in enumerate(jobs)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (tokens, scores) in enumerate(alone):
        assert together[i][0] == tokens
        np.testing.assert_allclose(together[i][1], scores, rtol=1e-5, atol=1e-6)


def test_the_record_keeps_segments_and_prompt_labels_current_while_the_run_streams(tiny_llama):
    """What the token view of a streaming run is built from: ``record.segments`` after every step
    (a think block grows, then closes), the prompt's labels with its template markers."""
    prompt, trace = chat_and_trace(tiny_llama.tokenizer)
    run = Run(tiny_llama, make_policy("h2o", budget=64, interval=8, recent=4), prompt, DecodeSettings())
    assert run.record.prompt_labels == run.segmenter.labels()[: len(prompt.ids)]
    assert "template" in run.record.prompt_labels and "user" in run.record.prompt_labels
    assert {s["kind"] for s in run.record.segments} >= {"system", "user"}
    seen_open = seen_closed = False
    for event in run.replay(trace):
        assert run.record.segments == [span.__dict__ for span in run.segmenter.spans()]
        thinks = [s for s in run.record.segments if s["kind"] == "think"]
        assert thinks and thinks[0]["end"] <= event.positions[-1] + 1
        seen_open |= not thinks[-1]["closed"]
        seen_closed |= thinks[0]["closed"]
    assert seen_open and seen_closed
    assert run.record.segments == [span.__dict__ for span in run.segmenter.spans()]


def test_a_prompt_of_plain_ids_has_no_segments_or_labels(tiny_llama):
    run = Run(
        tiny_llama,
        make_policy("window", budget=16),
        list(range(100, 120)),
        DecodeSettings(max_new_tokens=3, stop_at_eos=False),
    )
    list(run.generate())
    assert run.record.segments == [] and run.record.prompt_labels == []


@pytest.mark.parametrize("cached, new", [(0, 1), (0, 5), (7, 1), (7, 4), (130, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_causal_mask_without_hidden_slots_is_the_one_hiding_nothing(cached, new, dtype):
    mask = causal_mask(cached, new, dtype, "cpu")
    expected = causal_mask(cached, new, dtype, "cpu", hidden=torch.zeros(1, cached, dtype=torch.bool))
    assert mask.shape == (1, 1, new, cached + new) and mask.dtype == dtype
    assert torch.equal(mask, expected)
    blocked = mask[0, 0] == torch.finfo(dtype).min
    assert torch.equal(blocked, torch.ones(new, cached + new, dtype=torch.bool).triu(cached + 1))
