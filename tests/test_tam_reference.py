"""tam's ``reference`` knob: the segments' own queries as more reference queries of the fit (#16)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.policies import PolicyConfigError, make_policy
from thinkviz.policies.matching import fit_compaction
from thinkviz.policies.tam import own_sample

from thought_trace import chat_and_trace


# ---- the sample --------------------------------------------------------------------------------
def test_own_sample_keeps_at_most_rows_per_segment_spread_along_it():
    positions = torch.arange(300)
    segments = torch.cat([torch.zeros(200), torch.ones(5), torch.full((95,), 2)]).long()
    kept = own_sample(positions, segments, 10)
    assert torch.equal(kept, kept.sort().values)
    counts = torch.bincount(segments[kept], minlength=3).tolist()
    assert counts == [10, 5, 10]  # a segment with fewer rows keeps them all
    first = positions[kept][segments[kept] == 0]
    gaps = torch.diff(first)
    assert first.min() < 40 and first.max() > 160  # spread over the whole segment
    assert gaps.max() <= 2 * 200 / 10  # nearly evenly spaced (the mean gap is 20)


def test_own_sample_is_the_same_whichever_batches_the_rows_came_in():
    positions = torch.randperm(500, generator=torch.Generator().manual_seed(0))[:240]
    segments = positions // 60
    whole = set(positions[own_sample(positions, segments, 6)].tolist())
    held = torch.zeros(0, dtype=torch.long)
    for batch in positions.split(32):  # streaming: thin after every batch
        candidates = torch.cat([held, batch])
        held = candidates[own_sample(candidates, candidates // 60, 6)]
    assert set(held.tolist()) == whole
    assert torch.equal(own_sample(positions, segments, 6), own_sample(positions, segments, 6))


# ---- the fit with per-group reference rows ------------------------------------------------------
def _problem(seed=0, heads=2, n=24, total=90, dim=16):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(heads, total, dim, generator=g)
    values = torch.randn(heads, total, dim, generator=g)
    queries = torch.randn(heads, n, dim, generator=g)
    groups = (torch.arange(total) // 30).expand(heads, -1)
    keep = torch.stack([torch.randperm(total, generator=g)[:24].sort().values for _ in range(heads)])
    return queries, keys, values, groups, keep


def test_rows_every_group_shares_give_the_plain_fit_exactly():
    queries, keys, values, groups, keep = _problem()
    plain = fit_compaction(queries, keys, values, keep, groups=groups)
    shared = fit_compaction(queries, keys, values, keep, groups=groups, query_groups=torch.full((2, 24), -1))
    assert torch.equal(plain.bias, shared.bias) and torch.equal(plain.values, shared.values)


def test_own_rows_are_matched_by_their_group_only():
    queries, keys, values, groups, keep = _problem(1)
    own = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(10))  # 4 queries of group 1
    rows = torch.cat([queries, own], 1)
    tags = torch.cat([torch.full((2, 24), -1), torch.ones(2, 4, dtype=torch.long)], 1)
    # no ridge: the groups' mass fits are then independent of each other
    window = fit_compaction(queries, keys, values, keep, groups=groups, ridge=0.0)
    with_own = fit_compaction(rows, keys, values, keep, groups=groups, query_groups=tags, ridge=0.0)

    def mass_error(fit, group):
        """On the own rows: how far the kept slots' fitted mass in ``group`` is from its full mass."""
        logits = own.double() @ keys.double().transpose(1, 2)
        full = logits.exp() * (groups == group)[:, None, :]
        kept_logits = logits.gather(2, keep[:, None, :].expand(-1, 4, -1)) + fit.bias.double()[:, None, :]
        kept = kept_logits.exp() * (groups.gather(1, keep) == group)[:, None, :]
        return ((kept.sum(-1) / full.sum(-1) - 1) ** 2).mean()

    assert mass_error(with_own, 1) < 0.2 * mass_error(window, 1)  # 0.43 against 4.2
    others = groups.gather(1, keep) != 1
    assert torch.allclose(with_own.bias[others], window.bias[others], atol=1e-3)  # up to rounding
    assert not torch.allclose(with_own.bias[~others], window.bias[~others], atol=1e-2)


# ---- the policy --------------------------------------------------------------------------------
def test_bad_reference_knobs_are_refused_clearly():
    with pytest.raises(PolicyConfigError, match="reference must be one of: window, window\\+own"):
        make_policy("tam", compaction="match", reference="own")
    with pytest.raises(PolicyConfigError, match="own_rows must be between 1 and 64"):
        make_policy("tam", compaction="match", reference="window+own", own_rows=0)


@pytest.mark.parametrize(
    "knobs, rows",
    [
        ({}, 0),
        ({"compaction": "match"}, 16),
        ({"compaction": "match", "reference": "window+own"}, 32),  # a replayed chunk's every query
        ({"compaction": "match", "reference": "window+own", "interval": 200}, 64),
        ({"reference": "window+own"}, 0),  # selection fits nothing
    ],
)
def test_own_queries_make_the_engine_keep_a_chunks_queries(knobs, rows):
    assert make_policy("tam", **{"interval": 32, **knobs}).query_rows == rows


def _replay(loaded, **knobs):
    prompt, trace = chat_and_trace(loaded.tokenizer)
    policy = make_policy(
        "tam", budget=len(prompt.ids) + 24, interval=4, recent=4, window=8, l_min=4, compaction="match", **knobs
    )
    run = Run(loaded, policy, prompt, DecodeSettings(prefill_chunk=len(prompt.ids)))
    logits = []
    events = list(run.replay(trace, on_logits=lambda positions, chunk: logits.append(chunk.clone())))
    return run, events, logits


class _SegmentView:
    """What ``segment_ids`` reads, for a finished run."""

    def __init__(self, run):
        self.segments = run.segmenter
        self.protected = torch.zeros(run.processed, dtype=torch.bool)


@pytest.mark.slow
def test_the_sample_is_bounded_deterministic_and_holds_its_segments_queries(tiny_llama):
    views = []

    class Recording(type(make_policy("tam"))):
        def compress(self, view, cache):
            views.append(view)
            return super().compress(view, cache)

        def step_info(self, view):
            views.append(view)
            return super().step_info(view)

    prompt, trace = chat_and_trace(tiny_llama.tokenizer)
    knobs = {"interval": 4, "recent": 4, "window": 8, "l_min": 4, "compaction": "match", "own_rows": 3}
    policy = Recording(budget=len(prompt.ids) + 24, reference="window+own", **knobs)
    events = list(Run(tiny_llama, policy, prompt, DecodeSettings(prefill_chunk=len(prompt.ids))).replay(trace))
    queries, positions = policy.own_queries
    assert events[-1].info["own_queries"] == len(positions) > 10
    run, _, _ = _replay(tiny_llama, reference="window+own", own_rows=3)
    segments = run.policy.segment_ids(_SegmentView(run))
    assert torch.equal(run.policy.own_queries[1], positions)  # deterministic
    assert torch.equal(run.policy.own_queries[0], queries)
    assert torch.bincount(segments[positions]).max() <= 3
    assert len(positions) <= 3 * (int(segments.max()) + 1)
    # each row is the query the engine captured at its position (the newest views hold them)
    for row, position in enumerate(positions.tolist()):
        view = next(v for v in views if position in v.query_positions.tolist())
        at = view.query_positions.tolist().index(position)
        assert torch.equal(queries[:, :, row], view.queries[:, :, at])


@pytest.mark.slow
def test_window_plus_own_fits_like_window_until_it_has_older_own_queries(tiny_llama):
    _, _, window_logits = _replay(tiny_llama)
    _, own_events, own_logits = _replay(tiny_llama, reference="window+own")
    # the compression after the prompt has only window rows: the same fit, the same next logits
    assert torch.equal(window_logits[1], own_logits[1])
    # later fits also match older own queries: other biases, other logits
    assert max((a - b).abs().max().item() for a, b in zip(window_logits, own_logits)) > 1e-4
    assert all(e.info["fit_error"] <= e.info["fit_error_select"] for e in own_events if e.compressed)
    assert np.isfinite(own_events[-1].mass[own_events[-1].keep_fraction > 0]).all()
