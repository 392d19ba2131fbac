"""snapkv as SnapKV's code scores (FasterDecoding/SnapKV snapkv/monkeypatch/snapkv_utils.py,
NVIDIA/kvpress kvpress/presses/snapkv_press.py): expected scores computed by hand."""

from __future__ import annotations

import pytest
import torch

from thinkviz.policies import CacheView, make_policy

# the mean votes of an 8-slot cache at position 7, window 2: slots 0-5 are the prefix, 6-7 the window
VOTES = torch.tensor([0.0, 0.6, 0.0, 0.0, 0.3, 0.0, 0.9, 0.3])
SPREAD = torch.tensor([0.0, 0.2, 0.0, 0.0, 0.1, 0.0, 0.1, 0.1])


def _view(rows, positions=None, valid=None):
    """``rows`` ``(W, T)``: the window's attention rows of one layer and kv-head, oldest first."""
    total = rows.shape[-1]
    return CacheView(
        positions=(torch.arange(total) if positions is None else positions).expand(1, 1, total).clone(),
        received=torch.zeros(1, 1, total),
        window=rows[None, None],
        token_entropy=torch.zeros(total),
        protected=torch.zeros(total, dtype=torch.bool),
        current=total - 1,
        valid=None if valid is None else valid.expand(1, 1, total),
    )


def _snapkv(**knobs):
    return make_policy("snapkv", budget=8, window=2, kernel=3, protect_system=False, protect_question=False, **knobs)


def test_the_window_rows_are_averaged_and_the_prefix_is_average_pooled_without_the_window():
    # an older row (not in the window) votes 5 everywhere and must not count; the two window rows average to VOTES
    rows = torch.stack([torch.full((8,), 5.0), VOTES + SPREAD, VOTES - SPREAD])
    score = _snapkv().score(_view(rows))[0, 0]
    # avg_pool1d, kernel 3, zero padding at both ends of the prefix [0, .6, 0, 0, .3, 0], divisor 3;
    # slot 5 does not see the window's .9 (pooled across the edge it would be .4); the window keeps its votes
    assert torch.allclose(score, torch.tensor([0.2, 0.2, 0.2, 0.1, 0.1, 0.1, 0.9, 0.3]))


def test_max_pooling_is_the_knob_and_also_stops_at_the_window():
    rows = torch.stack([VOTES + SPREAD, VOTES - SPREAD])
    score = _snapkv(pool="max").score(_view(rows))[0, 0]
    assert torch.allclose(score, torch.tensor([0.6, 0.6, 0.6, 0.3, 0.3, 0.3, 0.9, 0.3]))  # the old rule: slot 5 = .9


def test_the_group_mean_commutes_with_average_pooling_and_max_pools_the_group_mean():
    """The engine keeps the window averaged over a kv group's query heads.  For ``avg`` that is
    kvpress's order (pool each head, then average); for ``max`` it is AdaKV's (average, then pool)."""
    one = torch.tensor([0.8, 0.0, 0.0, 0.0, 0.1, 0.1])  # two query heads' votes over 4 prefix slots + window 2
    two = torch.tensor([0.0, 0.0, 0.4, 0.0, 0.1, 0.1])
    group = _view(torch.stack([(one + two) / 2] * 2))
    per_head = [_snapkv().score(_view(torch.stack([votes] * 2))) for votes in (one, two)]
    assert torch.allclose(_snapkv().score(group), (per_head[0] + per_head[1]) / 2)
    assert torch.allclose(_snapkv().score(group)[0, 0, :4], torch.tensor([0.4, 0.6, 0.2, 0.2]) / 3)
    # max of the mean [.4, 0, .2, 0]; the mean of the two heads' max-pools would give .6 at slot 1
    assert torch.allclose(_snapkv(pool="max").score(group)[0, 0, :4], torch.tensor([0.4, 0.4, 0.2, 0.2]))


def test_the_prefix_is_pooled_in_position_order_and_a_hole_is_skipped():
    """After evictions of a ragged cache the slots may hold positions out of order and holes: the
    pooling runs over the held prefix tokens in position order, as if they were contiguous."""
    rows = torch.stack([VOTES, VOTES])
    order = torch.tensor([3, 0, 6, 5, 1, 7, 4, 2])  # slot s holds position order[s]
    shuffled = torch.cat([rows[:, order], torch.full((2, 1), 9.0)], dim=1)  # and a hole voted 9 at the end
    positions = torch.cat([order, torch.tensor([2])])  # a hole's position is meaningless
    valid = torch.ones(9, dtype=torch.bool)
    valid[-1] = False
    view = _view(shuffled, positions=positions, valid=valid)
    view.current = 7
    score = _snapkv().score(view)[0, 0]
    assert torch.allclose(score[:8], torch.tensor([0.2, 0.2, 0.2, 0.1, 0.1, 0.1, 0.9, 0.3])[order])


def test_snapkv_keeps_the_window_and_the_best_pooled_prefix_slots():
    votes = torch.tensor([0.0, 0.9, 0.0, 0.3, 0.6, 0.0, 0.0, 0.0])  # the window (slots 6, 7) votes nothing
    policy = make_policy("snapkv", budget_mode="fraction", budget_fraction=0.5, window=2, kernel=1)
    keep = policy.select(_view(torch.stack([votes, votes])))  # keeps ⌈0.5 · 8⌉ = 4
    assert keep[0, 0].tolist() == [1, 4, 6, 7]


def test_the_default_window_is_32_and_an_even_kernel_is_refused():
    policy = make_policy("snapkv")
    assert (policy.window, policy.kernel, policy.pool) == (32, 5, "avg")
    with pytest.raises(ValueError, match="odd"):
        make_policy("snapkv", kernel=4)
