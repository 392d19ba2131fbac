"""Runs batched as rows of one forward pass compute what they compute alone: every registered
policy (per-head and per-layer budgets, attention matching among them) and every KV format, in
replay and in generate mode; runs that cannot share a pass run alone and say why."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from thinkviz.core import engine
from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.core.kvquant import KVQuant, format_names
from thinkviz.core.together import MAX_BATCHED_TOKENS, QUANTIZED_ALONE, generate_together, replay_together
from thinkviz.policies import make_policy, policy_names, policy_params
from thinkviz.text.chat import build_chat

TOLERANCE = 1e-4  # the oracle's: float32 logits
SYSTEM = "You are a careful assistant. Think inside <think> tags, then answer."
QUESTION = "Fix def area(r: float) -> float: it returns 2*pi*r instead of pi*r**2. Why?"
TRACE = "<think>\nThe area of a circle is pi r squared, not the circumference 2 pi r. So return pi*r**2.</think>"


def _knobs(name: str) -> dict:
    """Small windows and no protected prompt, so that every policy evicts within a short trace (the
    per-head and per-layer ones leaving ragged caches)."""
    values: dict = {"protect_system": False, "protect_question": False}
    for param in policy_params(name):
        if param.name == "n_sink":
            values[param.name] = 4
        elif param.name in {"recent", "window"}:
            values[param.name] = 6
    return values


def _rows(interval: int) -> list[tuple[str, KVQuant]]:
    """Every registered policy at full precision, and the full cache and h2o in every KV format."""
    rows = [(name, KVQuant()) for name in policy_names()]
    for fmt in format_names():
        if fmt != "none":
            kv = KVQuant(fmt, residual=8) if fmt.startswith("kivi") else KVQuant(fmt)
            rows += [("full", kv), ("h2o", kv)]
    return rows


def _make_runs(loaded, rows, settings, interval):
    prompt = build_chat(loaded.tokenizer, SYSTEM, QUESTION)
    return [
        Run(loaded, make_policy(name, budget=24, interval=interval, **_knobs(name)), prompt, settings, kv_quant=kv)
        for name, kv in rows
    ]


def _check_meta(run: Run, kv: KVQuant, rows: list) -> None:
    """Full-precision rows share one pass; a quantized format runs alone and says why."""
    if kv.spec.quantized:
        assert run.record.meta["batch"] == {"rows": 1, "batched": False, "reason": QUANTIZED_ALONE}
    else:
        shared = sum(1 for _, other in rows if not other.spec.quantized)
        assert run.record.meta["batch"] == {"rows": shared, "batched": True, "reason": None}


def _same_run(alone: Run, batched: Run) -> None:
    """The same tokens, kept slots, per-position scores and sizes, step by step."""
    assert len(alone.record.events) == len(batched.record.events)
    for one, other in zip(alone.record.events, batched.record.events):
        assert one.token_ids == other.token_ids
        assert one.kv_tokens == other.kv_tokens and one.kv_bytes == other.kv_bytes
        np.testing.assert_array_equal(one.kept, other.kept)
        np.testing.assert_allclose(one.scores, other.scores, rtol=1e-3, atol=1e-4, equal_nan=True)
    assert torch.equal(alone.cache.position_table(), batched.cache.position_table())
    assert alone.record.summary["stopped"] == batched.record.summary["stopped"]


@pytest.mark.slow  # every policy and KV format replayed twice: 5-13 s
@pytest.mark.parametrize("interval", [1, 4])
def test_batched_replay_equals_each_run_alone(tiny_llama_d32, interval):
    loaded = tiny_llama_d32
    settings = DecodeSettings(prefill_chunk=16)
    trace = loaded.tokenizer.encode(TRACE, add_special_tokens=False)
    rows = _rows(interval)
    alone, batched = _make_runs(loaded, rows, settings, interval), _make_runs(loaded, rows, settings, interval)
    alone_logits: list[list[torch.Tensor]] = [[] for _ in rows]
    batch_logits: list[list[torch.Tensor]] = [[] for _ in rows]
    for run, box in zip(alone, alone_logits):
        for _ in run.replay(trace, on_logits=lambda p, logits, box=box: box.append(logits)):
            pass
    sinks = [lambda p, logits, box=box: box.append(logits) for box in batch_logits]
    steps = list(replay_together(batched, trace, sinks))
    assert len(steps) == len(alone[0].record.events)
    for (name, kv), one, other, ones, others in zip(rows, alone, batched, alone_logits, batch_logits):
        _check_meta(other, kv, rows)
        assert len(ones) == len(others)
        for a, b in zip(ones, others):
            assert (a - b).abs().max() <= TOLERANCE, f"{name} {kv.describe()}"
        _same_run(one, other)


@pytest.mark.slow  # every policy and KV format decoded twice: 10 s
def test_batched_generate_equals_each_run_alone(tiny_llama_d32, monkeypatch):
    """Each row samples its own token (temperature 1: its own generator) from logits equal to its own alone."""
    loaded = tiny_llama_d32
    settings = DecodeSettings(max_new_tokens=24, temperature=1.0, prefill_chunk=16, stop_at_eos=False)
    rows = _rows(interval=2)
    seen: dict[int, list[torch.Tensor]] = {}
    pick = engine.pick_token

    def recording(logits, settings, generator):
        seen.setdefault(id(generator), []).append(logits.clone())
        return pick(logits, settings, generator)

    monkeypatch.setattr(engine, "pick_token", recording)
    alone, batched = _make_runs(loaded, rows, settings, 2), _make_runs(loaded, rows, settings, 2)
    for run in alone:
        for _ in run.generate():
            pass
    steps = list(generate_together(batched))
    assert len(steps) == settings.max_new_tokens
    for (name, kv), one, other in zip(rows, alone, batched):
        ones, others = seen[id(one.generator)], seen[id(other.generator)]
        assert len(ones) == len(others) == settings.max_new_tokens
        for a, b in zip(ones, others):
            assert (a - b).abs().max() <= TOLERANCE, f"{name} {kv.describe()}"
        _check_meta(other, kv, rows)
        _same_run(one, other)


def test_rows_stop_on_their_own(tiny_llama):
    """A row that reaches its end of sequence leaves the batch; the others go on as they would alone."""
    settings = DecodeSettings(max_new_tokens=12, prefill_chunk=16)
    prompt = build_chat(tiny_llama.tokenizer, SYSTEM, QUESTION)
    short = DecodeSettings(max_new_tokens=5, prefill_chunk=16)
    runs = [
        Run(tiny_llama, make_policy("h2o", budget=16, recent=4), prompt, settings),
        Run(tiny_llama, make_policy("full"), prompt, short),
        Run(tiny_llama, make_policy("window", budget=16), prompt, settings),
    ]
    steps = list(generate_together(runs))
    assert len(steps) == 12
    assert [step[1] is None for step in steps] == [False] * 5 + [True] * 7
    assert [len(run.record.events) for run in runs] == [12, 5, 12]
    lone = Run(tiny_llama, make_policy("window", budget=16), prompt, settings)
    for _ in lone.generate():
        pass
    _same_run(lone, runs[2])


def test_runs_that_cannot_share_a_pass_run_alone_and_say_why(tiny_llama, tiny_qwen3):
    settings = DecodeSettings(prefill_chunk=16)
    prompt = build_chat(tiny_llama.tokenizer, SYSTEM, QUESTION)
    trace = tiny_llama.tokenizer.encode(TRACE, add_special_tokens=False)
    runs = [
        Run(tiny_llama, make_policy("h2o", budget=16, recent=4, interval=2), prompt, settings),
        Run(tiny_llama, make_policy("window", budget=16, interval=2), prompt, settings),
        Run(tiny_qwen3, make_policy("h2o", budget=16, recent=4, interval=2), prompt, settings),
        Run(tiny_llama, make_policy("window", budget=16, interval=3), prompt, settings),
    ]
    steps = list(replay_together(runs, trace))
    assert steps
    metas = [run.record.meta["batch"] for run in runs]
    assert metas[0] == metas[1] == {"rows": 2, "batched": True, "reason": None}
    assert metas[2] == {"rows": 1, "batched": False, "reason": "another model"}
    assert metas[3] == {"rows": 1, "batched": False, "reason": "its interval (chunk) differs"}
    alone = Run(tiny_qwen3, make_policy("h2o", budget=16, recent=4, interval=2), prompt, settings)
    for _ in alone.replay(trace):
        pass
    _same_run(alone, runs[2])
    long = [Run(tiny_llama, make_policy(name, budget=16, interval=16), prompt, settings) for name in ("full", "window")]
    list(replay_together(long, trace))
    reason = f"its chunks of 16 tokens are over {MAX_BATCHED_TOKENS}: faster one pass each"
    assert [run.record.meta["batch"] for run in long] == [{"rows": 1, "batched": False, "reason": reason}] * 2
    off = [Run(tiny_llama, make_policy("full"), prompt, settings) for _ in range(2)]
    list(replay_together(off, trace, batched=False))
    assert off[0].record.meta["batch"] == {"rows": 1, "batched": False, "reason": "batching is off"}
