"""Replay: trace input, agreement with plain teacher forcing and with live decoding, fidelity."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.core.events import RunRecord
from thinkviz.measure.metrics import log_probs, token_nll
from thinkviz.policies import make_policy, policy_class, policy_names
from thinkviz.policies.base import COMMON_PARAMS
from thinkviz.measure.replay import LockstepReplay, TraceError, prepare_trace, read_trace_file

TOLERANCE = 1e-4
SYSTEM = "You are a careful assistant."
QUESTION = "Why does findall skip the '1.' in '1.5h'?"
TRACE = (
    "<think>\nThe pattern has no decimal point.\n\nSo findall skips what it cannot match and "
    "picks up 5h.\n</think>\n\nAllow a fraction:\n\n```python\n_PART = r'(\\d+(?:\\.\\d+)?)([dhms])'\n```\n"
)


def _random_ids(loaded, n, seed):
    vocab = loaded.model.config.vocab_size
    return torch.randint(10, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# ---- trace input ---------------------------------------------------------------------
def test_prepare_trace_continues_after_the_opened_think_turn(tiny_llama):
    prompt, ids = prepare_trace(tiny_llama, SYSTEM, QUESTION, TRACE)
    assert prompt.text.endswith("<think>\n")
    text = tiny_llama.tokenizer.decode(ids)
    assert text == TRACE[len("<think>\n") :], "the opening <think> must not be duplicated"
    same_prompt, same_ids = prepare_trace(tiny_llama, SYSTEM, QUESTION, TRACE[len("<think>\n") :])
    # (#22 changes this: was same_prompt.ids == prompt.ids) a trace that does not begin with <think> gets none
    assert same_ids == ids and same_prompt.ids == prompt.ids[: len(same_prompt.ids)]
    assert not same_prompt.text.endswith("<think>\n")


def test_prepare_trace_refuses_empty_and_overlong_traces(tiny_llama):
    with pytest.raises(TraceError, match="trace is empty"):
        prepare_trace(tiny_llama, SYSTEM, QUESTION, "<think>\n   \n")
    with pytest.raises(TraceError, match="question is empty"):
        prepare_trace(tiny_llama, SYSTEM, " ", TRACE)
    too_long = " word" * (tiny_llama.geometry.max_context + 10)
    with pytest.raises(TraceError, match=r"context is 2048"):
        prepare_trace(tiny_llama, SYSTEM, QUESTION, too_long)


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", "is empty"),
        (b"  \n\t\n", "is empty"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary"),
        ("Caf\u00e9 na\u00efve r\u00e9sum\u00e9".encode("latin-1"), "not UTF-8"),
    ],
)
def test_bad_trace_files_are_refused_with_a_reason(tmp_path, content, reason):
    path = tmp_path / "trace.md"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=reason):
        read_trace_file(path)


def test_utf8_trace_file_with_bom_reads_as_text(tmp_path):
    path = tmp_path / "trace.md"
    path.write_bytes("\ufeff<think>\nCaf\u00e9\n</think>\n".encode("utf-8"))
    assert read_trace_file(path) == "<think>\nCaf\u00e9\n</think>\n"
    with pytest.raises(TraceError, match="does not exist"):
        read_trace_file(tmp_path / "missing.md")


# ---- replay vs plain teacher forcing ----------------------------------------------------
def test_full_replay_reproduces_a_plain_teacher_forced_forward(tiny_llama):
    prompt, ids = prepare_trace(tiny_llama, SYSTEM, QUESTION, TRACE)
    replay = LockstepReplay(tiny_llama, [], prompt, ids, DecodeSettings(prefill_chunk=16)).run()
    sequence = torch.tensor([prompt.ids + ids])
    with torch.inference_mode():
        logits = tiny_llama.model(input_ids=sequence).logits[0]  # (N, V)
    start = len(prompt.ids)
    want = token_nll(log_probs(logits[start - 1 : -1]), torch.tensor(ids))
    got = replay.reference_fidelity
    assert got.positions.tolist() == list(range(start, start + len(ids)))
    assert np.abs(got.nll - want.numpy()).max() <= TOLERANCE


# ---- replay vs live decoding ------------------------------------------------------------
def _recording_compress(policy):
    """Wrap ``policy.compress`` so every decision is recorded as absolute kept positions ``(L, H_kv, k)``
    (or, for a ragged keep mask, ``(L, H_kv, T)`` with -1 where a slot goes)."""
    kept = []
    decide = policy.compress

    def compress(view, cache):
        keep = decide(view, cache)
        if keep.dtype == torch.bool:  # a ragged keep mask: the positions it keeps, -1 elsewhere
            kept.append(torch.where(keep, view.positions, -1))
        else:
            kept.append(view.positions.gather(-1, keep.to(view.positions.device)))
        return keep

    policy.compress = compress
    return kept


def _small_knobs(name, budget=16):
    """Every own integer knob that takes a part of the default budget (sinks, windows, kernels…; not a
    ceiling above it) at most a quarter of ``budget``: the largest value on its declared grid
    (``low``, ``low + step``, …) not above that or its default."""
    default_budget = next(p.default for p in COMMON_PARAMS if p.name == "budget")
    knobs = {}
    for p in policy_class(name).params:
        if p.kind == "int" and p.default < default_budget:
            cap = min(p.default, budget // 4)
            knobs[p.name] = max(p.low, p.low + (cap - p.low) // p.step * p.step)
    return knobs


@pytest.mark.parametrize("name", [n for n in policy_names() if make_policy(n, **_small_knobs(n), budget=16).evicts])
def test_replay_every_k_tokens_equals_live_decoding_compressing_every_k_steps(tiny_llama, name):
    """A chunk of ``k`` tokens in one forward accumulates the same attention statistics as ``k``
    single-token steps: each query row sees the same slots (nothing is evicted inside a chunk),
    ``received`` sums the same rows, the window keeps the same newest rows and each token's own
    row entropy is the same.  So the keep sets after each compression and the logits must agree."""
    loaded, k, params = tiny_llama, 4, _small_knobs(name)
    prompt = _random_ids(loaded, 20, seed=7)
    settings = DecodeSettings(max_new_tokens=41, stop_at_eos=False, prefill_chunk=64)

    live_policy = make_policy(name, budget=16, interval=k, **params)
    live_kept = _recording_compress(live_policy)
    live_logits = []
    hook = loaded.model.register_forward_hook(lambda m, a, out: live_logits.append(out.logits[0, -1].float().clone()))
    try:
        live = Run(loaded, live_policy, prompt, settings)
        tokens = [t for event in live.generate() for t in event.token_ids]
    finally:
        hook.remove()

    replay_policy = make_policy(name, budget=16, interval=k, **params)
    replay_kept = _recording_compress(replay_policy)
    replay_logits = []
    replay = Run(loaded, replay_policy, prompt, settings)
    list(replay.replay(tokens, on_logits=lambda positions, logits: replay_logits.extend(logits)))

    assert len(live_kept) >= 10, "the test must exercise many evictions"
    assert len(replay_kept) == len(live_kept)
    for live_set, replay_set in zip(live_kept, replay_kept):
        assert torch.equal(live_set, replay_set)
    assert len(replay_logits) == len(live_logits) == len(tokens) + 1
    for a, b in zip(live_logits, replay_logits):
        assert (a - b).abs().max().item() <= TOLERANCE
    live_evicted = [e.evicted for e in live.record.events][k - 1 :: k]
    assert live_evicted == [e.evicted for e in replay.record.events][: len(tokens) // k]


# ---- lockstep fidelity ------------------------------------------------------------------
def test_lockstep_fidelity_is_zero_without_eviction_and_positive_with_it(tiny_llama, tmp_path):
    prompt, ids = prepare_trace(tiny_llama, SYSTEM, QUESTION, TRACE * 3)
    total = len(prompt.ids) + len(ids)
    roomy = make_policy("h2o", budget=total + 8, interval=8, recent=4)
    tight = make_policy("window", budget=24, interval=8, protect_system=False, protect_question=False)
    replay = LockstepReplay(tiny_llama, [roomy, tight], prompt, ids)
    done = list(replay)
    assert done[-1] == len(ids) and done == sorted(done)

    roomy_fid, tight_fid = replay.fidelity
    assert len(roomy_fid.positions) == len(tight_fid.positions) == len(ids)
    assert np.abs(roomy_fid.nll - roomy_fid.nll_full).max() <= TOLERANCE
    assert roomy_fid.kl.max() <= TOLERANCE and roomy_fid.top1.all()
    # a random tiny model predicts nearly uniformly, so eviction moves KL by ~1e-3, not more
    assert tight_fid.kl.max() > 1e-3 and np.abs(tight_fid.nll - tight_fid.nll_full).max() > 1e-3
    assert np.array_equal(tight_fid.nll_full, replay.reference_fidelity.nll)

    record = replay.runs[1].record
    for event in record.events:
        fid = event.info["fidelity"]
        assert len(fid["nll"]) == len(fid["kl"]) == len(fid["top1"]) == len(event.positions)
    summary = record.summary["fidelity"]
    assert summary["all"]["tokens"] == len(ids)
    assert summary["think"]["tokens"] > 0 and summary["code"]["tokens"] > 0
    assert summary["all"]["kl"] == pytest.approx(float(tight_fid.kl.mean()), rel=1e-5)

    record.save(tmp_path / "tight")
    loaded_back = RunRecord.load(tmp_path / "tight")
    assert loaded_back.summary["fidelity"]["all"]["tokens"] == len(ids)
    assert loaded_back.events[3].info["fidelity"]["kl"] == pytest.approx(record.events[3].info["fidelity"]["kl"])


def test_lockstep_refuses_mixed_intervals(tiny_llama):
    from thinkviz.core.engine import EngineError

    prompt, ids = prepare_trace(tiny_llama, SYSTEM, QUESTION, TRACE)
    with pytest.raises(EngineError, match="share one interval"):
        LockstepReplay(
            tiny_llama,
            [make_policy("window", budget=32, interval=4), make_policy("window", budget=32, interval=8)],
            prompt,
            ids,
        )


def test_cancel_stops_every_lockstep_run_after_the_same_chunk(tiny_llama):
    import threading

    prompt, ids = prepare_trace(tiny_llama, SYSTEM, QUESTION, TRACE * 2)
    cancel = threading.Event()
    replay = LockstepReplay(
        tiny_llama,
        [make_policy("h2o", budget=32, interval=8, recent=4), make_policy("window", budget=32, interval=8)],
        prompt,
        ids,
        cancel=cancel,
    )
    for step, _ in enumerate(replay):
        if step == 2:
            cancel.set()
    records = [run.record for run in (replay.reference, *replay.runs)]
    assert [len(r.events) for r in records] == [3, 3, 3]
    assert all(r.summary["stopped"] == "cancelled" for r in records)
    assert records[1].summary["fidelity"]["all"]["tokens"] == 24


def test_load_trace_from_a_preset_or_a_file(tmp_path):
    from thinkviz.demos.presets import load_preset
    from thinkviz.text.chat import REASONING_SYSTEM_PROMPT
    from thinkviz.measure.replay import DEFAULT_QUESTION, load_trace

    preset = load_preset("math_h2o_vs_window")
    trace = load_trace("math_h2o_vs_window")
    assert (trace.name, trace.question, trace.system, trace.text) == (
        preset.name,
        preset.question,
        REASONING_SYSTEM_PROMPT,
        preset.trace,
    )
    assert preset.system is None, "the check above needs a preset whose file says system: null"
    assert load_trace("math_h2o_vs_window", question="Count again.").question == "Count again."
    path = tmp_path / "mine.md"
    path.write_text("<think>\nx\n</think>\n", encoding="utf-8")
    mine = load_trace(str(path))
    assert (mine.name, mine.question, mine.text) == ("mine", DEFAULT_QUESTION, "<think>\nx\n</think>\n")
    with pytest.raises(TraceError, match="has no trace"):
        load_trace("generate_muffins")
    with pytest.raises(TraceError, match="unknown preset"):
        load_trace("no_such_preset")


# ---- multi-turn transcripts -------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, params", [("think_drop", {}), ("h2o", {"recent": 8}), ("tam", {"recent": 4, "window": 8, "l_min": 4})]
)
@pytest.mark.slow
def test_transcript_replay_equals_step_by_step_decoding(tiny_llama, monkeypatch, name, params):
    """The transcript's tokens forced one per decoding step (the live loop, compressing every k
    steps) and replayed k per forward give the same keep sets, logits and segments, tool and
    user turns included."""
    from thinkviz.core import engine

    from thought_trace import conversation_and_trace

    loaded, k = tiny_llama, 4
    prompt, trace = conversation_and_trace(loaded)
    # over budget first after 6 chunks of k, where the live loop (which compresses as soon as it
    # is over budget) and the replay (which can only compress between chunks) both compress
    budget = 64 if name == "think_drop" else len(prompt.ids) + 6 * k - 1
    settings = DecodeSettings(max_new_tokens=len(trace), stop_at_eos=False, prefill_chunk=256)  # one prefill forward
    forced = iter(trace)
    monkeypatch.setattr(engine, "pick_token", lambda logits, settings, generator: next(forced))

    live_policy = make_policy(name, budget=budget, interval=k, **params)
    live_kept = _recording_compress(live_policy)
    live_logits = []
    hook = loaded.model.register_forward_hook(lambda m, a, out: live_logits.append(out.logits[0, -1].float().clone()))
    try:
        live = Run(loaded, live_policy, prompt, settings)
        assert [t for event in live.generate() for t in event.token_ids] == trace
    finally:
        hook.remove()

    replay_policy = make_policy(name, budget=budget, interval=k, **params)
    replay_kept = _recording_compress(replay_policy)
    replay_logits = []
    replay = Run(loaded, replay_policy, prompt, settings)
    list(replay.replay(trace, on_logits=lambda positions, logits: replay_logits.extend(logits)))

    assert len(live_kept) >= 10 and len(replay_kept) == len(live_kept)
    for live_set, replay_set in zip(live_kept, replay_kept):
        assert torch.equal(live_set, replay_set)
    for a, b in zip(live_logits, replay_logits, strict=True):
        assert (a - b).abs().max().item() <= TOLERANCE
    assert live.record.segments == replay.record.segments
    assert {s["kind"] for s in replay.record.segments} >= {"system", "user", "tool", "assistant", "think", "code"}
    if name == "think_drop":
        assert any(b["evicted"] for b in replay.record.events[-1].info["blocks"])


def test_prepare_transcript_prefills_the_first_user_turn_and_forces_the_rest(tiny_llama):
    from thinkviz.text.chat import build_conversation
    from thinkviz.measure.replay import prepare_transcript
    from thinkviz.text.transcript import Message

    from thought_trace import MESSAGES

    messages = [Message(role, content) for role, content in MESSAGES]
    prompt, ids = prepare_transcript(tiny_llama, messages)
    whole = build_conversation(tiny_llama.tokenizer, messages)
    assert prompt.ids + ids == whole.ids and len(prompt.ids) == whole.roles[1].end
    assert [r.ahead for r in prompt.roles] == [False, False] + [True] * (len(messages) - 2)
    short_prompt, short = prepare_transcript(tiny_llama, messages, max_tokens=50)
    assert short == ids[:50] and short_prompt.roles[-1].end == len(prompt.ids) + 50
    with pytest.raises(TraceError, match="nothing after its first user message"):
        prepare_transcript(tiny_llama, messages[:2])
    long = [*messages, Message("tool", "x " * tiny_llama.geometry.max_context), Message("assistant", "ok")]
    with pytest.raises(TraceError, match=r"context is 2,048: message 11 \(tool\) ends at token"):
        prepare_transcript(tiny_llama, long)
    with pytest.raises(TraceError, match=r"message 2 \(user\) contains the special token"):
        forged = [Message("system", "s"), Message("user", "<|im_start|>"), Message("assistant", "a")]
        prepare_transcript(tiny_llama, forged)


@pytest.mark.slow
def test_lockstep_fidelity_on_a_transcript_reports_tool_tokens(tiny_llama):
    from thought_trace import conversation_and_trace

    prompt, ids = conversation_and_trace(tiny_llama)
    replay = LockstepReplay(tiny_llama, [make_policy("window", budget=48, interval=8)], prompt, ids).run()
    summary = replay.runs[0].record.summary["fidelity"]
    assert summary["all"]["tokens"] == len(ids)
    assert summary["tool"]["tokens"] > 0 and summary["think"]["tokens"] > 0
    assert summary["tool"]["kl"] > 0


def test_a_replay_opens_the_assistant_turn_with_think_only_when_the_trace_does(tiny_llama):
    thought, _ = prepare_trace(tiny_llama, None, "Why?", "<think>\nBecause.\n</think>\nSo.")
    essay, ids = prepare_trace(tiny_llama, None, "Why?", "# An essay\n\nNo thinking here.")
    assert "".join(thought.texts).endswith("<think>\n")
    assert "<think>" not in "".join(essay.texts)
    assert tiny_llama.tokenizer.decode(ids) == "# An essay\n\nNo thinking here."
