"""h2o keeps the heavy hitters H2O defines (Zhang et al., arXiv:2306.14048): at every compression,
the recent window and then the slots with the largest attention received, summed over every
query since the token was written (``normalize=none``, the default), or that sum per query that
could see it (``normalize=queries``, ThinkViz's rule before issue 36).

The oracle recomputes the score without the engine: the masked full-cache run of
test_oracle.py (each chunk's queries see only the slots the h2o run held), with the attention
weights of every layer read from the model's eager attention and summed by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import test_oracle as oracle
from thinkviz.demos.record import preset_signature
from thinkviz.policies import CacheView, make_policy, policy_names
from thinkviz.ui.learn_cards import policy_card

BUDGET, INTERVAL, RECENT = 24, 4, 4


def _attention_rows(loaded, prompt, trace, visible):
    """Per forward pass of the masked full-cache run, per layer: its attention ``(H, q, T)``."""
    captured: list[list[torch.Tensor]] = []
    layers = loaded.model.model.layers

    def keep(layer_idx):
        def hook(module, args, output):
            if layer_idx == 0:
                captured.append([])
            captured[-1].append(output[1][0].float().cpu())

        return hook

    handles = [layer.self_attn.register_forward_hook(keep(i)) for i, layer in enumerate(layers)]
    try:
        oracle.reference_logits(loaded, prompt, trace, INTERVAL, visible)
    finally:
        for handle in handles:
            handle.remove()
    return captured


def _expected_keeps(loaded, prompt, trace, visible, normalize):
    """Per compression after the prefill and every chunk but the last: ``(L, H_kv, N)`` bool, the
    recent window plus the top accumulated-attention slots among those held, and the scores."""
    group = loaded.geometry.q_heads // loaded.geometry.kv_heads
    passes = _attention_rows(loaded, prompt, trace, visible)
    received = torch.zeros(0)
    out = []
    for k, rows in enumerate(passes[:-1]):
        # (L, H_kv, T): summed over queries, mean over the query heads of a kv group
        per_kv = torch.stack([r.unflatten(0, (-1, group)).mean(1).sum(1) for r in rows])
        seen = per_kv.shape[-1]
        received = F.pad(received, (0, seen - received.shape[-1])) + per_kv
        score = received if normalize == "none" else received / torch.arange(seen, 0, -1)  # seen - p queries saw p
        held = torch.ones_like(score, dtype=torch.bool)
        if k:  # what the pass saw, and the tokens it wrote
            held[..., : visible[k - 1].shape[-1]] = visible[k - 1]
        recent = (torch.arange(seen) >= seen - RECENT).expand_as(held)
        out.append((held, recent, score))
    return out


@pytest.mark.parametrize("normalize", ["none", "queries"])
def test_h2o_keeps_exactly_the_top_accumulated_attention_tokens(tiny_llama, normalize):
    policy = make_policy("h2o", budget=BUDGET, interval=INTERVAL, recent=RECENT, normalize=normalize)
    vocab = tiny_llama.model.config.vocab_size
    prompt, trace = oracle._random_ids(48, vocab, 3), oracle._random_ids(40, vocab, 4)
    events, _, visible, _ = oracle.replay_with_visibility(tiny_llama, policy, prompt, trace)
    assert sum(e.compressed for e in events) >= 3
    expected = _expected_keeps(tiny_llama, prompt, trace, visible, normalize)
    assert len(expected) == len(visible)
    for (held, recent, score), kept in zip(expected, visible):
        assert kept.shape == held.shape
        assert torch.equal(kept & recent, recent), "the recent window is always kept"
        assert not (kept & ~held).any(), "an evicted slot never comes back"
        assert (kept.sum(-1) == BUDGET).all()
        contest = held & ~recent  # what the heavy hitters compete for
        inf = torch.tensor(float("inf"))
        weakest_kept = torch.where(contest & kept, score, inf).amin(-1)
        strongest_dropped = torch.where(contest & ~kept, score, -inf).amax(-1)
        assert (weakest_kept >= strongest_dropped - 1e-6).all(), "a dropped slot scored above a kept one"


def test_the_two_scores_keep_different_tokens(tiny_llama):
    """The knob matters on the same run: the per-query mean and the sum disagree somewhere."""
    vocab = tiny_llama.model.config.vocab_size
    prompt, trace = oracle._random_ids(48, vocab, 3), oracle._random_ids(40, vocab, 4)
    kept = {}
    for normalize in ("none", "queries"):
        policy = make_policy("h2o", budget=BUDGET, interval=INTERVAL, recent=RECENT, normalize=normalize)
        kept[normalize] = oracle.replay_with_visibility(tiny_llama, policy, prompt, trace)[2]
    assert any(not torch.equal(a, b) for a, b in zip(kept["none"], kept["queries"]))


@pytest.mark.parametrize("normalize", ["none", "queries"])
def test_merge_and_dynts_score_with_h2o_s_choice(normalize):
    """merge weighs its folds by h2o's score and dynts' attention fallback is h2o's score: all three
    take the knob, with the paper's sum by default."""
    total = 12
    received = torch.rand(2, 2, total, generator=torch.Generator().manual_seed(0))
    view = CacheView(
        positions=torch.arange(total).expand(2, 2, total),
        received=received,
        window=torch.zeros(2, 2, 1, total),
        token_entropy=torch.zeros(total),
        protected=torch.zeros(total, dtype=torch.bool),
        current=total - 1,
    )
    want = received if normalize == "none" else received / torch.arange(total, 0, -1)
    for name, knobs in (("h2o", {}), ("merge", {}), ("dynts", {"scorer": "attention"})):
        assert make_policy(name, **knobs).normalize == "none"
        assert torch.allclose(make_policy(name, normalize=normalize, **knobs).score(view), want), name


def test_a_knob_at_its_former_value_leaves_a_recording_s_signature_as_it_was():
    """A preset that names ``normalize: queries`` (the rule before the knob existed) keeps its
    recording; one that runs h2o at the paper's default is a different run (Param.before)."""
    assert "normalize" not in preset_signature("math_h2o_vs_window")["live"][1]
    columns = {column[1]: column[2] for column in preset_signature("entropy_duration")["columns"]}
    assert columns["h2o"]["normalize"] == "none"


# the owners of these cards write their departures themselves (issues 36 and 40)
OWNED_ELSEWHERE = {"am", "tam", "snapkv", "adakv", "pyramidkv"}


def test_every_learn_card_says_where_thinkviz_departs_from_its_source():
    for name in policy_names():
        if name in OWNED_ELSEWHERE:
            continue
        card = policy_card(name)
        assert "departs from" in card or "No paper" in card, name
    h2o = policy_card("h2o")
    assert "`normalize`" in h2o and "none / queries" in h2o and "summed over every query" in h2o
