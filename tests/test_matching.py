"""Attention matching (thinkviz.policies.matching) on synthetic keys, values and queries."""

from __future__ import annotations

import pytest
import torch

from thinkviz.policies.matching import W_MIN, effective_groups, fit_compaction

HEADS, N, T, D = 3, 40, 120, 16


def _data(seed=0, heads=HEADS, n=N, total=T, dim=D):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(heads, total, dim, generator=g)
    values = torch.randn(heads, total, dim, generator=g)
    queries = (torch.randn(heads, n, dim, generator=g) + torch.randn(dim, generator=g)) / 2
    return queries, keys, values


def _attend(queries, keys, values, bias=None, visible=None):
    """Reference attention output ``(H, n, D_v)``, written independently of the fit."""
    logits = queries.double() @ keys.double().transpose(1, 2)
    if bias is not None:
        logits = logits + bias.double()[:, None, :]
    if visible is not None:
        logits = logits.masked_fill(~visible, float("-inf"))
    return logits.softmax(-1) @ values.double()


def _take(tensor, keep):
    return tensor.gather(1, keep[..., None].expand(-1, -1, tensor.shape[-1]))


def _top(queries, keys, k):
    attention = (queries @ keys.transpose(1, 2)).softmax(-1).mean(1)
    return attention.topk(k, dim=-1).indices.sort(-1).values


def _errors(queries, keys, values, keep, fit):
    full = _attend(queries, keys, values)
    selected = _attend(queries, _take(keys, keep), _take(values, keep))
    fitted = _attend(queries, _take(keys, keep), fit.values, fit.bias)
    return ((selected - full) ** 2).sum(-1).mean(-1), ((fitted - full) ** 2).sum(-1).mean(-1)


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("k", [10, 30, 60])
def test_fit_reproduces_reference_outputs_better_than_selection(grouped, k):
    queries, keys, values = _data()
    keep = _top(queries, keys, k)
    groups = (torch.arange(T) // 20).expand(HEADS, -1) if grouped else None
    fit = fit_compaction(queries, keys, values, keep, groups=groups)
    selection, fitted = _errors(queries, keys, values, keep, fit)
    assert torch.all(fitted < selection)  # strictly, in every head
    assert torch.allclose(fit.error_select.double(), selection, rtol=1e-4)
    assert torch.allclose(fit.error_fit.double(), fitted, rtol=1e-4)
    assert fit.bias.shape == (HEADS, k) and fit.values.shape == (HEADS, k, D)


def test_fit_preserves_attention_mass_better_than_selection():
    queries, keys, values = _data(1)
    keep = _top(queries, keys, 20)
    fit = fit_compaction(queries, keys, values, keep)
    logits = queries.double() @ keys.double().transpose(1, 2)
    full_mass = logits.exp().sum(-1)  # (H, n)
    kept_logits = logits.gather(2, keep[:, None, :].expand(-1, N, -1))
    selected_mass = kept_logits.exp().sum(-1)
    fitted_mass = (kept_logits + fit.bias.double()[:, None, :]).exp().sum(-1)
    selection_error = ((selected_mass / full_mass - 1) ** 2).mean(-1)
    fitted_error = ((fitted_mass / full_mass - 1) ** 2).mean(-1)
    assert torch.all(fitted_error < selection_error)
    assert torch.all(fit.bias >= torch.log(torch.tensor(W_MIN)) - 1e-4)


@pytest.mark.parametrize("grouped", [False, True])
def test_fit_is_exact_when_nothing_is_dropped(grouped):
    queries, keys, values = _data(2)
    bias = torch.randn(HEADS, T) * 0.5  # slots that already carry a bias keep it
    keep = torch.arange(T).expand(HEADS, -1)
    groups = (torch.arange(T) // 7).expand(HEADS, -1) if grouped else None
    fit = fit_compaction(queries, keys, values, keep, bias=bias, groups=groups)
    assert torch.allclose(fit.bias, bias, atol=1e-6)
    assert torch.allclose(fit.values, values, atol=1e-6)


def test_fit_respects_visibility():
    """A query that cannot see a slot is matched on what it can see; a slot nobody sees keeps
    its values and gets no mass from rows it is hidden from."""
    queries, keys, values = _data(3)
    visible = torch.ones(HEADS, N, T, dtype=torch.bool)
    visible[:, : N // 2, T // 2 :] = False  # the first half of the queries came before the second half of the slots
    keep = _top(queries, keys, 30)
    fit = fit_compaction(queries, keys, values, keep, visible=visible)
    full = _attend(queries, keys, values, visible=visible)
    kept_visible = visible.gather(2, keep[:, None, :].expand(-1, N, -1))
    selected = _attend(queries, _take(keys, keep), _take(values, keep), visible=kept_visible)
    fitted = _attend(queries, _take(keys, keep), fit.values, fit.bias, visible=kept_visible)
    assert torch.all(((fitted - full) ** 2).sum(-1).mean(-1) < ((selected - full) ** 2).sum(-1).mean(-1))


def test_effective_groups_gives_orphan_groups_to_a_neighbour():
    groups = torch.tensor([[0, 0, 1, 1, 2, 2, 3, 3], [0, 0, 1, 1, 2, 2, 3, 3]])
    keep = torch.tensor([[2, 7], [0, 6]])  # head 0 keeps in groups 1 and 3; head 1 in 0 and 3
    out = effective_groups(groups, keep)
    assert out.tolist() == [[0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0, 1, 1]]


# ---- degenerate inputs stay finite ------------------------------------------------------------
def _assert_finite(fit):
    assert torch.isfinite(fit.bias).all() and torch.isfinite(fit.values).all()
    assert torch.isfinite(fit.error_fit).all()


def test_fit_is_finite_on_duplicate_keys():
    queries, keys, values = _data(4)
    keys = keys[:, :1].expand(-1, T, -1).clone()  # every key the same
    fit = fit_compaction(queries, keys, values, _top(queries, keys, 10))
    _assert_finite(fit)
    # ten copies of one key carry the mass of all 120: their weights add up to 120 (12 each)
    assert torch.allclose(fit.bias.exp().sum(-1), torch.full((HEADS,), float(T)), rtol=0.05)


def test_fit_with_zero_attention_keeps_selection():
    queries, keys, values = _data(5)
    keep = _top(queries, keys, 10)
    bias = torch.randn(HEADS, T)
    nothing = torch.zeros(HEADS, N, T, dtype=torch.bool)
    fit = fit_compaction(queries, keys, values, keep, bias=bias, visible=nothing)
    _assert_finite(fit)
    assert torch.equal(fit.bias, bias.gather(1, keep))
    assert torch.equal(fit.values, _take(values, keep))


def test_fit_with_a_single_kept_key():
    queries, keys, values = _data(6)
    keep = _top(queries, keys, 1)
    fit = fit_compaction(queries, keys, values, keep, groups=(torch.arange(T) // 10).expand(HEADS, -1))
    _assert_finite(fit)
    assert fit.bias.shape == (HEADS, 1)
    selection, fitted = _errors(queries, keys, values, keep, fit)
    assert torch.all(fitted <= selection)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fit_on_half_precision_inputs(dtype):
    queries, keys, values = (t.to(dtype) for t in _data(7))
    keep = _top(queries.float(), keys.float(), 20)
    fit = fit_compaction(queries, keys, values, keep)
    _assert_finite(fit)
    assert fit.values.dtype == dtype and fit.bias.dtype == torch.float32
    selection, fitted = _errors(queries, keys, values, keep, fit)
    assert torch.all(fitted < selection)


def test_fit_on_huge_logits_stays_finite():
    queries, keys, values = _data(8)
    fit = fit_compaction(queries * 1e4, keys, values, _top(queries, keys, 10))
    _assert_finite(fit)
