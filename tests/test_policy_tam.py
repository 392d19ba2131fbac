"""tam (TAM, thought-aware compaction): segment budgets ∝ √(w·n) that sum exactly, pivotal tokens,
thought segments."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from thinkviz.text.chat import token_texts
from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.policies import make_policy
from thinkviz.policies.tam import allocate_budgets, merge_short
from thinkviz.text.segments import Segmenter

from thought_trace import chat_and_trace


@pytest.mark.parametrize(
    "weights, sizes, budget, expected",
    [
        ([4, 1, 1], [10, 10, 10], 12, [6, 3, 3]),  # √(40):√(10):√(10) = 2:1:1
        ([9, 1], [4, 4], 8, [4, 4]),  # budget covers everything
        ([100, 1], [2, 50], 10, [2, 8]),  # ideal 6.7 > 2 tokens: capped, surplus to the other
        ([1, 1, 1], [10, 10, 10], 10, [4, 3, 3]),  # 3.33 each: the tie goes to the earliest
        ([0.4, 0.1, 0.0], [4, 4, 3], 5, [3, 2, 0]),  # 3.33 / 1.67 / 0: largest remainder
        ([0, 0], [4, 16], 6, [2, 4]),  # no attention at all: ∝ √n
        ([5, 0, 0], [1, 4, 16], 7, [1, 2, 4]),  # capped, and the rest has zero weight: ∝ √n
        ([1, float("nan"), -3], [4, 4, 4], 4, [4, 0, 0]),  # NaN / negative weights count as 0
        ([1, 2], [0, 5], 3, [0, 3]),  # an empty segment gets nothing
    ],
)
def test_allocate_budgets_on_hand_numbers(weights, sizes, budget, expected):
    assert allocate_budgets(weights, sizes, budget) == expected


@settings(deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 1e3), st.integers(0, 60)), min_size=1, max_size=12),
    st.integers(0, 400),
)
def test_allocate_budgets_sums_exactly_and_follows_sqrt_wn(segments, budget):
    weights, sizes = [w for w, _ in segments], [n for _, n in segments]
    counts = allocate_budgets(weights, sizes, budget)
    assert sum(counts) == min(budget, sum(sizes))
    assert all(0 <= t <= n for t, n in zip(counts, sizes))
    # between two segments that are not capped, the larger √(w·n) never gets fewer tokens
    # (rounding moves a share by less than one token)
    raw = [math.sqrt(w * n) for w, n in zip(weights, sizes)]
    for i in range(len(counts)):
        for j in range(len(counts)):
            if raw[i] > raw[j] and counts[i] < sizes[i] and counts[j] < sizes[j] and raw[j] > 0:
                assert counts[i] >= counts[j]


def test_allocate_budgets_refuses_bad_input():
    with pytest.raises(ValueError, match="one length"):
        allocate_budgets([1, 2], [3], 4)
    with pytest.raises(ValueError, match="negative"):
        allocate_budgets([1], [3], -1)


def test_merge_short_joins_short_segments_to_the_previous_one():
    # (0,2) is short and first: joins the next; (10,12) and (30,31) join the previous one
    assert merge_short([0, 2, 10, 12, 30, 31], 5) == [(0, 12), (12, 31)]
    assert merge_short([0, 10, 20], 5) == [(0, 10), (10, 20)]
    assert merge_short([0, 3], 5) == [(0, 3)]  # a single short segment stays


def _choose(tam, attention, forced, segments):
    return set(
        tam.choose(torch.tensor(attention), torch.tensor(forced), torch.tensor(segments), tam.budget)
        .nonzero()
        .flatten()
        .tolist()
    )


def test_each_segment_keeps_its_top_tokens_within_its_budget():
    tam = make_policy("tam", budget=8, recent=0, pivot_factor=100.0)
    attention = [0.13, 0.07, 0.11, 0.09, 0.03, 0.02, 0.026, 0.024, 0.0, 0.0, 0.0, 0.5]
    forced = [False] * 9 + [True] * 3
    segments = [0] * 4 + [1] * 4 + [2] * 4
    # 8 - 3 forced = 5 slots; candidates: w = (0.4, 0.1, 0), n = (4, 4, 1) → budgets (3, 2, 0)
    assert allocate_budgets([0.4, 0.1, 0.0], [4, 4, 1], 5) == [3, 2, 0]
    assert _choose(tam, attention, forced, segments) == {0, 2, 3, 4, 6}


def test_pivotal_tokens_survive_a_segment_budget_of_zero():
    # segment 0: one strong token among 2; segment 1: 100 weak ones with more total mass;
    # segment 2: 7 forced slots, so a budget of 8 leaves a single slot to give
    attention = [0.3, 0.0] + [0.007] * 100 + [0.0] * 7
    segments = [0, 0] + [1] * 100 + [2] * 7
    forced = [False] * 102 + [True] * 7
    # √(0.3·2) < √(0.7·100): segment 0 gets nothing ...
    assert allocate_budgets([0.3, 0.7], [2, 100], 1) == [0, 1]
    without = make_policy("tam", budget=8, recent=0, pivot_factor=100.0)
    assert 0 not in _choose(without, attention, forced, segments)
    # ... but 0.3 is about 33 × the mean attention: a pivot, kept first
    tam = make_policy("tam", budget=8, recent=0, pivot_factor=4.0)
    assert _choose(tam, attention, forced, segments) == {0}


def _thought_view_segments(tokenizer, l_min):
    prompt, trace = chat_and_trace(tokenizer)
    texts = token_texts(tokenizer, prompt.ids + trace)
    segmenter = Segmenter(prompt.roles, texts)
    tam = make_policy("tam", budget=64, l_min=l_min)

    class View:  # what segment_ids reads
        segments = segmenter
        protected = torch.zeros(len(texts), dtype=torch.bool)

    return segmenter, tam.segment_ids(View)


def test_segments_are_steps_and_label_runs(tiny_llama):
    segmenter, ids = _thought_view_segments(tiny_llama.tokenizer, l_min=1)
    starts = {0} | set(np.flatnonzero(np.diff(ids.numpy())) + 1)
    labels = segmenter.labels()
    label_changes = {i for i in range(1, len(labels)) if labels[i] != labels[i - 1]}
    step_starts = {s.start for s in segmenter.spans() if s.kind == "step"}
    assert starts == {0} | label_changes | step_starts
    assert len(step_starts) == 6  # two steps in each of the three blocks
    _, merged = _thought_view_segments(tiny_llama.tokenizer, l_min=20)
    lengths = np.bincount(merged.numpy())
    assert len(lengths) > 1 and lengths.min() >= 20


def test_keeps_exactly_the_budget_with_protected_spans_and_tail(tiny_llama):
    prompt, trace = chat_and_trace(tiny_llama.tokenizer)
    budget = len(prompt.ids) + 48
    policy = make_policy("tam", budget=budget, interval=8, recent=8, window=8, l_min=4)
    run = Run(tiny_llama, policy, prompt, DecodeSettings())
    events = list(run.replay(trace))
    protected = np.flatnonzero(run.segmenter.protected_mask())
    compressed = [e for e in events if e.compressed]
    assert len(compressed) >= 10
    for event in compressed:
        assert event.kv_tokens == budget
        assert np.all(event.keep_fraction[protected] == 1.0)
        newest = event.positions[-1]
        assert np.all(event.keep_fraction[newest - 7 : newest + 1] == 1.0)
    assert events[-1].info["segments"] > 10
