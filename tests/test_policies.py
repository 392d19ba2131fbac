"""One matrix every registered policy runs through: protected spans, sinks and the recent window
are always kept, the budget holds per (layer, kv-head), declared knob ranges are honoured."""

from __future__ import annotations

import numpy as np
import pytest

from thinkviz.text.chat import build_chat
from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.core.kvquant import KVQuant, format_names
from thinkviz.core.together import generate_together
from thinkviz.policies import PolicyConfigError, make_policy, policy_class, policy_names, policy_params

SYSTEM = "You are a careful assistant. Think inside <think> tags, then answer."
QUESTION = "Fix def area(r: float) -> float: it returns 2*pi*r instead of pi*r**2. Why?"


def _own_params(name):
    """Small, valid values for a policy's own knobs so sinks/windows fit the budget."""
    values = {}
    for p in policy_params(name):
        if p.name in {"n_sink"}:
            values[p.name] = 4
        elif p.name in {"recent", "window"}:
            values[p.name] = 6
    return values


# policies whose choice knobs change what they do run through the matrix in each mode too
VARIANTS = [(name, {}) for name in policy_names()] + [
    ("tam", {"compaction": "match"}),
    ("tam", {"compaction": "match", "reference": "window+own", "own_rows": 2}),
]
VARIANT_IDS = [name + "".join(f"-{v}" for v in knobs.values()) for name, knobs in VARIANTS]


def _run(loaded, name, budget, interval, kv_quant=KVQuant(), **flags):
    """The policy's run, decoded as row 0 of a batch beside the full cache (as Compare and Live run it).
    A quantized format would run alone beside it (:mod:`thinkviz.core.together`; test_batch checks
    that), so it is decoded alone."""
    policy = make_policy(name, budget=budget, interval=interval, **_own_params(name), **flags)
    prompt = build_chat(loaded.tokenizer, SYSTEM, QUESTION)
    settings = DecodeSettings(max_new_tokens=48, stop_at_eos=False, prefill_chunk=32)
    run = Run(loaded, policy, prompt, settings, kv_quant=kv_quant)
    runs = [run] if kv_quant.spec.quantized else [run, Run(loaded, make_policy("full"), prompt, settings)]
    events = [step[0] for step in generate_together(runs) if step[0] is not None]
    assert run.record.meta["batch"]["batched"] == (len(runs) == 2)
    return run, events


def _protected_positions(run):
    return np.flatnonzero(run.segmenter.protected_mask())


@pytest.mark.parametrize("name, knobs", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("interval", [1, 4])
def test_policy_invariants(tiny_llama, name, knobs, interval):
    _check_invariants(tiny_llama, name, interval, KVQuant(), **knobs)


# every policy in every quantized format (KIVI with a residual short enough to flush often)
@pytest.mark.parametrize("name, knobs", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("fmt", [f for f in format_names() if f != "none"])
def test_policy_invariants_in_every_kv_format(tiny_llama_d32, name, knobs, fmt):
    _check_invariants(tiny_llama_d32, name, 4, KVQuant(fmt, residual=8), **knobs)


def _check_invariants(loaded, name, interval, kv_quant, **knobs):
    prompt_len = len(build_chat(loaded.tokenizer, SYSTEM, QUESTION).ids)
    budget = prompt_len + 16  # protected spans fit, so the budget binds on the generated part
    run, events = _run(loaded, name, budget, interval, kv_quant, **knobs)
    policy = run.policy
    protected = _protected_positions(run)
    assert len(protected) > 10
    for event in events:
        # protected spans (system prompt, question) are never evicted anywhere
        assert np.all(event.keep_fraction[protected] == 1.0)
        if policy.evicts:
            # the budget holds between compressions (at most budget + interval slots), or a
            # policy that may only evict certain spans reports that it cannot hold it
            within = event.kv_tokens <= policy.budget + policy.interval
            assert within or (not policy.hard_budget and event.info["over_budget"])
            if policy.n_sink:
                assert np.all(event.keep_fraction[: policy.n_sink] == 1.0)
            if policy.recent:
                newest = event.positions[-1]
                assert np.all(event.keep_fraction[newest - policy.recent + 1 : newest + 1] == 1.0)
        # the bytes reported are below full precision when quantized (exactly the formula for blocks)
        if kv_quant.spec.quantized:
            assert event.kv_bytes < event.kv_tokens * loaded.geometry.bytes_per_token
        if kv_quant.format in ("q8_0", "q4_0"):
            geometry = loaded.geometry
            per_slot = kv_quant.slot_bytes(geometry.kv_heads, geometry.head_dim, geometry.dtype_bytes)
            # per slot that holds a token (a ragged cache's padding costs extra, in kv_bytes), and
            # a float32 attention bias per (layer, kv-head) slot for a policy that fits biases
            bias = 4 if policy.fits_bias else 0
            assert event.logical_kv_bytes == event.kept.sum() * (per_slot / geometry.kv_heads + bias)
    last = events[-1]
    if policy.evicts and policy.hard_budget:
        assert any(e.evicted for e in events), "a binding budget must evict something"
    else:
        assert last.kv_tokens == last.positions[-1] + 1


# full keeps everything; think_drop evicts only think blocks, never the prompt
PROMPT_EVICTORS = [n for n in policy_names() if policy_class(n).evicts and policy_class(n).hard_budget]


@pytest.mark.parametrize("name", PROMPT_EVICTORS)
def test_protection_toggles_off_allow_eviction_of_the_prompt(tiny_llama, name):
    run, events = _run(tiny_llama, name, 24, 1, protect_system=False, protect_question=False)
    prompt_len = len(run.record.prompt_ids)
    assert np.any(events[-1].keep_fraction[:prompt_len] < 1.0)


@pytest.mark.parametrize("name", policy_names())
def test_parameters_are_declared_with_ranges(name):
    for p in policy_params(name):
        assert p.help, f"{name}.{p.name} needs a help text for the UI"
        if p.kind in ("int", "float"):
            assert p.low is not None and p.high is not None and p.low <= p.default <= p.high


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"budget": 0}, "budget"),
        ({"budget": 8, "recent": 8}, "sinks \\+ recent"),
        ({"budget": 64, "nonsense": 1}, "no parameter nonsense"),
        ({"budget": "many"}, "budget must be an integer"),
    ],
)
def test_bad_parameters_are_refused_clearly(kwargs, message):
    with pytest.raises(PolicyConfigError, match=message):
        make_policy("h2o", **kwargs)


def test_unknown_policy_lists_the_choices():
    with pytest.raises(PolicyConfigError, match="unknown policy 'lru'.*h2o"):
        make_policy("lru")
