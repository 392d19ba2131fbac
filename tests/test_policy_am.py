"""am and tam's compaction=match: which keys they keep, what the fit reports, what the run shows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.core.events import RunRecord
from thinkviz.policies import CacheView, make_policy
from thinkviz.policies.am import AttentionMatching

from thought_trace import chat_and_trace


def _view(window):
    """A hand-built view of one layer and kv-head: ``window`` ``(R, T)`` attention rows."""
    rows, total = window.shape
    return CacheView(
        positions=torch.arange(total)[None, None],
        received=torch.zeros(1, 1, total),
        window=window[None, None],
        token_entropy=torch.zeros(total),
        protected=torch.zeros(total, dtype=torch.bool),
        current=total - 1,
    )


def test_am_keeps_the_keys_with_the_highest_rms_attention():
    # slot 0: one query relies on it (0.8, then nothing); slot 1: every query gives it 0.25 —
    # a higher mean (0.25 > 0.2) but a lower root mean square (0.25 < 0.4)
    window = torch.tensor([[0.8, 0.25, 0.0], [0.0, 0.25, 0.1], [0.0, 0.25, 0.0], [0.0, 0.25, 0.1]])  # (R, 3)
    window = torch.cat([window, torch.zeros(4, 13)], dim=1)  # 13 more slots nobody looks at
    am = make_policy("am", budget=8, recent=7, window=4)
    kept = am.select(_view(window))[0, 0].tolist()
    assert kept == [0, 9, 10, 11, 12, 13, 14, 15]  # the 7 newest, then slot 0 (h2o's mean would take slot 1)


def _replay(loaded, name, **knobs):
    prompt, trace = chat_and_trace(loaded.tokenizer)
    policy = make_policy(name, budget=len(prompt.ids) + 24, interval=4, recent=4, window=8, **knobs)
    run = Run(loaded, policy, prompt, DecodeSettings(prefill_chunk=len(prompt.ids)))
    return run, list(run.replay(trace))


@pytest.mark.parametrize("name, knobs", [("am", {}), ("tam", {"compaction": "match", "l_min": 4})])
def test_every_fit_beats_selection_on_its_reference_queries(tiny_qwen3, name, knobs):
    run, events = _replay(tiny_qwen3, name, **knobs)
    fits = [e.info for e in events if e.compressed]
    assert len(fits) >= 10 and all(f["fit_seconds"] > 0 for f in fits)
    assert all(f["fit_error"] <= f["fit_error_select"] for f in fits)
    assert sum(f["fit_error"] < 0.5 * f["fit_error_select"] for f in fits) > len(fits) // 2
    layers, heads = tiny_qwen3.geometry.layers, tiny_qwen3.geometry.kv_heads
    assert all(f["fits_select"] + f["fits_bias"] + f["fits_values"] == layers * heads for f in fits)
    mass = events[-1].mass
    held = events[-1].keep_fraction > 0
    assert np.all(np.isfinite(mass[held])) and np.all(mass[held] > 0) and np.all(np.isnan(mass[~held]))
    assert mass[held].max() > 1.5, "some kept token stands for more than itself"


def test_reference_queries_are_the_newest_and_reproduce_the_captured_attention(tiny_llama):
    """The queries the fit reads, with the cache's biases, give exactly the attention the hooks saw."""
    views = []

    class Recording(AttentionMatching):
        def compress(self, view, cache):
            keys = [cache.layer_kv(i)[0][0].clone() for i in range(len(cache.layers))]
            views.append((view, keys))
            return super().compress(view, cache)

    prompt, trace = chat_and_trace(tiny_llama.tokenizer)
    policy = Recording(budget=len(prompt.ids) + 24, interval=4, recent=4, window=8)
    run = Run(tiny_llama, policy, prompt, DecodeSettings(prefill_chunk=len(prompt.ids)))
    list(run.replay(trace[:40]))
    group = tiny_llama.geometry.q_heads // tiny_llama.geometry.kv_heads
    for view, keys in views[1:]:
        assert view.query_positions.tolist() == list(range(view.current - 7, view.current + 1))
        for layer, layer_keys in enumerate(keys):
            newest = view.queries[layer, :, -1]  # (H, D) the last query of every query head
            logits = (newest[:, None, :] @ layer_keys.repeat_interleave(group, 0).transpose(1, 2))[:, 0]
            logits = logits + view.bias[layer].repeat_interleave(group, 0)
            grouped = logits.softmax(-1).view(-1, group, logits.shape[-1]).mean(1)  # (H_kv, T)
            assert torch.allclose(grouped, view.window[layer, :, -1], atol=1e-5)


@pytest.mark.slow
def test_tam_match_starts_from_selections_keep_set_and_only_match_fits(tiny_llama):
    _, select = _replay(tiny_llama, "tam", l_min=4)
    _, match = _replay(tiny_llama, "tam", compaction="match", l_min=4)
    first = next(i for i, e in enumerate(select) if e.compressed)
    assert np.array_equal(select[first].keep_fraction, match[first].keep_fraction)  # same decision, then a fit
    assert all(e.mass is None and "fit_seconds" not in e.info for e in select)
    assert any("fit_seconds" in e.info for e in match)


def test_mass_survives_a_recording(tiny_llama, tmp_path):
    run, events = _replay(tiny_llama, "am")
    run.record.save(tmp_path / "am")
    loaded = RunRecord.load(tmp_path / "am")
    assert np.array_equal(loaded.events[-1].mass, events[-1].mass, equal_nan=True)
    last_fit = max(i for i, e in enumerate(events) if e.compressed)
    assert loaded.events[last_fit].info == events[last_fit].info
