"""Attention matching: fit a per-slot log-mass bias ``β`` and new values for a kept subset of slots.

Zweiger, Fu, Guo, Kim, "Fast KV Compaction via Attention Matching" (arXiv:2602.16284): keep a
subset ``S`` of ``k`` of the ``T`` cached keys, then choose, per (layer, kv-head), an additive
bias ``β_j`` for every kept key and new values ``C_j`` so that for a set of *reference queries*
the compacted cache reproduces the full cache's attention **mass** and attention **output**.
Both are small linear problems once the keys are fixed:

- Reference query ``r`` (scaled, so its logits are ``s_rj = q_r·k_j + b_j``, ``b`` the bias the
  slots already carry) attends to the full cache with ``p_rj = softmax_j(s_rj)`` over the slots it
  can see (causal, and never a hole of a ragged layout).
- **Mass** (``w = e^β``, non-negative least squares): ``Σ_{j∈S} w_j p_rj ≈ Σ_j p_rj`` — a kept key
  with ``w_j = 3`` weighs like three copies of itself: it *stands for* the dropped keys near it.
- **Values** (least squares): with ``x_rj = w_j p_rj / Σ_{i∈S} w_i p_ri`` the compacted attention,
  ``Σ_{j∈S} x_rj C_j ≈ Σ_j p_rj V_j``.

*Groups* (TAM's thought segments; one group for ``am``) split both problems
block-wise: each group's kept slots match that group's own mass and its own share of the
output, ``Σ_{j∈S_g} w_j p_rj ≈ Σ_{j∈g} p_rj`` and ``Σ_{j∈S_g} x_rj C_j ≈ Σ_{j∈g} p_rj V_j``
(the paper's chunked compaction: per-chunk mass and output add up to the whole).  A group with
no kept slot in a head joins the nearest earlier group that has one (else the first later one),
so no mass is left without a slot to carry it.  A reference query may also belong to one group
only (``query_groups``; tam's segments' own queries): it then takes part in that group's two
problems and in no other's.

Numerics, per (kv-head), in float64 whatever the input dtype:

- both fits are ridge regressions *towards selection* (``w = 1``, ``C = V_S``), with
  ``λ = ridge · trace(G) / k`` (``G`` the problem's Gram matrix, so ``ridge`` is relative to the
  data's own scale) plus ``1e-12``: with few reference queries or duplicate keys the problem is
  underdetermined and the ridge picks the solution nearest to plain selection; with no
  attention at all (``G = 0``) it *is* selection (``β`` unchanged, values unchanged);
- both are solved in the dual, one ``n × n`` Cholesky system per group (there are far fewer
  reference queries than kept slots);
- mass: the ridge solution in closed form, then, where it leaves ``[W_MIN, T]``, up to
  :data:`ACTIVE_SET_ROUNDS` active-set rounds (fix the weights past a bound at it, solve again
  for the others) and a final clamp;
- values: closed form, ``C = V_S + Xᵀ(XXᵀ + λI)⁻¹ r`` (``r`` the output residual of ``V_S``);
- fallbacks: every candidate (selection, bias only, bias + values) is scored by the mean
  squared output error over the reference queries and the best finite one is kept, so on the
  reference queries a fit is never worse than selection alone.  When nothing is dropped the
  exact solution ``w = 1, C = V`` is the unique optimum.

Shapes: ``H`` kv-heads, ``n`` reference queries per kv-head (a GQA group's query heads stacked),
``T`` slots, ``k`` kept, ``D`` key and ``D_v`` value width.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import CacheView

GOLDEN = (5**0.5 - 1) / 2  # query samples: a position's priority is frac(position · GOLDEN)
W_MIN = 1e-6  # smallest mass weight: β ≥ ln(1e-6) ≈ -13.8
RIDGE = 0.1  # default relative ridge (module docstring): few reference queries need a firm one
ACTIVE_SET_ROUNDS = 4  # mass fit: rounds of fixing out-of-bound weights and solving again


@dataclass
class MatchFit:
    """A fitted compaction of one layer.

    - ``bias`` ``(H, k)`` float32: the new total bias of every kept slot (old bias + ``ln w``);
    - ``values`` ``(H, k, D_v)`` in the input values' dtype;
    - ``error_select`` / ``error_fit`` ``(H,)``: mean squared attention-output error over the
      reference queries of plain selection and of the fit kept;
    - ``choice`` ``(H,)`` int: 0 selection kept, 1 bias only, 2 bias and values (the fallbacks).
    """

    bias: torch.Tensor
    values: torch.Tensor
    error_select: torch.Tensor
    error_fit: torch.Tensor
    choice: torch.Tensor


def join_orphans(groups: torch.Tensor, keep: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``(H, m)`` the effective group of every group number in ``labels`` ``(H, m)``: an orphan
    group (no kept slot in that head) joins the nearest earlier group with one, else the first
    later one.  ``groups`` ``(H, T)`` non-negative ints, ``keep`` ``(H, k)``; effective groups are
    numbered ``0 ..`` densely per head."""
    out = torch.empty_like(labels)
    for head in range(groups.shape[0]):
        kept = torch.unique(groups[head, keep[head]])  # sorted
        slot = torch.searchsorted(kept, labels[head], right=True) - 1  # index of the last kept group ≤ g
        out[head] = slot.clamp(min=0)
    return out


def effective_groups(groups: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``(H, T)`` group of every slot after orphan groups joined a neighbour (:func:`join_orphans`)."""
    return join_orphans(groups, keep, groups)


@dataclass
class RowSets:
    """Which reference rows each group's fit uses, when not all of them: ``index`` ``(H, G, m)``
    the rows of every group (padded), ``present`` ``(H, G, m)`` which entries are real rows, and
    ``seen`` ``(H, n, k)`` float 1 where row ``r`` takes part in the fit of kept slot ``j``'s group."""

    index: torch.Tensor
    present: torch.Tensor
    seen: torch.Tensor

    @classmethod
    def of(cls, member: torch.Tensor, kept_hot: torch.Tensor) -> RowSets:
        """From ``member`` ``(H, n, G)`` bool (row ``r`` joins group ``g``'s fit) and the kept
        slots' groups one-hot ``kept_hot`` ``(H, k, G)``."""
        counts = member.sum(1)  # (H, G)
        width = int(counts.max())
        order = member.to(torch.int8).argsort(dim=1, descending=True, stable=True)  # members first
        index = order[:, :width, :].transpose(1, 2)  # (H, G, m)
        present = torch.arange(width, device=member.device) < counts[..., None]
        return cls(index, present, member.to(kept_hot.dtype) @ kept_hot.transpose(1, 2))


def _masses(logits: torch.Tensor, visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention ``p`` ``(H, n, T)`` of every reference query over what it can see, and ``(H, n)``
    whether the row sees anything at all."""
    logits = logits.masked_fill(~visible, float("-inf"))
    alive = visible.any(-1)
    peak = logits.amax(-1, keepdim=True).masked_fill(~alive[..., None], 0.0)
    raw = torch.exp(logits - peak).masked_fill(~visible, 0.0)
    total = raw.sum(-1, keepdim=True)
    return raw / total.clamp(min=torch.finfo(raw.dtype).tiny), alive


def _row_mass(logits: torch.Tensor, visible: torch.Tensor, alive: torch.Tensor) -> torch.Tensor:
    """``(H, n)`` every row's exp-score mass ``Σ_j e^{s_rj}`` over what it sees, divided by the
    head's largest (0 for a row that sees nothing)."""
    lse = torch.logsumexp(logits.masked_fill(~visible, float("-inf")), -1).masked_fill(~alive, float("-inf"))
    return torch.exp(lse - lse.amax(-1, keepdim=True)).nan_to_num(0.0)


def _blocks(kept_groups: torch.Tensor) -> list[list[tuple[int, torch.Tensor]]]:
    """Per head, ``(group, indices of its kept slots)`` for every group with kept slots
    (``kept_groups`` ``(H, k)``)."""
    blocks = []
    for row in kept_groups:
        order = row.argsort(stable=True)
        counts = torch.bincount(row).tolist()
        pieces = order.split(counts)
        blocks.append([(g, piece) for g, piece in enumerate(pieces) if len(piece)])
    return blocks


def _dual_solve(
    rows: torch.Tensor, blocks: list, targets: torch.Tensor, lam: torch.Tensor, row_sets: RowSets | None = None
) -> torch.Tensor:
    """``argmin_u Σ_g ‖R_g u_g − t_g‖² + λ‖u‖²`` for ``rows`` ``(H, n, k)`` split into the column
    blocks ``R_g`` of :func:`_blocks`, ``targets`` ``(H, n, G, m)``: ``u`` ``(H, k, m)``.  With
    ``row_sets`` the block of group ``g`` has only that group's rows.

    In the dual, ``u_g = R_gᵀ (R_g R_gᵀ + λI)⁻¹ t_g``: one ``n × n`` system per group instead of a
    ``k × k`` one (there are far fewer reference queries than kept slots); padding rows of a
    shorter row set are zero and get a zero dual variable."""
    heads, n, k = rows.shape
    out = torch.zeros(heads, k, targets.shape[-1], dtype=rows.dtype, device=rows.device)
    for head, head_blocks in enumerate(blocks):
        if row_sets is None:
            pieces = [rows[head][:, index] for _, index in head_blocks]  # (n, k_g) each
            rhs = [targets[head, :, g] for g, _ in head_blocks]  # (n, m) each
        else:
            picks = [(row_sets.index[head, g], row_sets.present[head, g, :, None]) for g, _ in head_blocks]
            pieces = [rows[head][at][:, index] * real for (at, real), (_, index) in zip(picks, head_blocks)]
            rhs = [targets[head, at, g] * real for (at, real), (g, _) in zip(picks, head_blocks)]
        eye = torch.eye(pieces[0].shape[0], dtype=rows.dtype, device=rows.device)
        system = torch.stack([piece @ piece.T for piece in pieces]) + lam[head] * eye  # (G', n, n)
        dual = _solve_spd(system, torch.stack(rhs))  # (G', n, m)
        for piece, (_, index), z in zip(pieces, head_blocks, dual):
            out[head, index] = piece.T @ z
    return out


def _solve_spd(matrix: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """``matrix⁻¹ rhs`` for symmetric positive definite ``(..., n, n)``; falls back to lstsq."""
    factor, info = torch.linalg.cholesky_ex(matrix)
    if bool((info == 0).all()):
        return torch.cholesky_solve(rhs, factor)
    return torch.linalg.lstsq(matrix, rhs).solution


def _ridge(rows: torch.Tensor, ridge: float, row_sets: RowSets | None = None) -> torch.Tensor:
    """``λ`` ``(H,)`` = ``ridge · trace(RᵀR) / k + 1e-12``: relative to the data's own scale (with
    ``row_sets``, of the rows the fits use)."""
    used = rows if row_sets is None else rows * row_sets.seen
    return ridge * used.pow(2).sum((1, 2)) / rows.shape[-1] + 1e-12


def _group_sums(rows: torch.Tensor, kept_hot: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``(H, n, G)``: ``Σ_{j∈S_g} w_j R_rj`` (``rows`` ``(H, n, k)``, ``kept_hot`` ``(H, k, G)``)."""
    return (rows * w[:, None, :]) @ kept_hot


def _fit_weights(
    p_kept: torch.Tensor,
    mass: torch.Tensor,
    blocks: list,
    kept_hot: torch.Tensor,
    ridge: float,
    w_max: float,
    row_sets: RowSets | None = None,
) -> torch.Tensor:
    """Mass weights ``w`` ``(H, k)``: ``min Σ_g ‖Σ_{j∈S_g} w_j p_·j − mass_·g‖² + λ‖w − 1‖²`` with
    ``W_MIN ≤ w ≤ w_max`` — the ridge solution, then up to :data:`ACTIVE_SET_ROUNDS` rounds that
    fix the weights past a bound at it and solve again for the others (an active-set NNLS), then a
    final clamp."""
    lam = _ridge(p_kept, ridge, row_sets)
    free = torch.ones_like(p_kept[:, 0, :], dtype=torch.bool)  # (H, k)
    base = torch.ones_like(p_kept[:, 0, :])  # 1 where free, the bound where fixed
    for _ in range(ACTIVE_SET_ROUNDS):
        residual = mass - _group_sums(p_kept, kept_hot, base)  # (H, n, G)
        rows = p_kept * free[:, None, :]
        w = base + _dual_solve(rows, blocks, residual[..., None], lam, row_sets)[..., 0] * free
        low, high = free & (w < W_MIN), free & (w > w_max)
        if not bool((low | high).any()):
            return w
        base = torch.where(low, W_MIN, torch.where(high, w_max, base))
        free &= ~(low | high)
    return w.clamp(W_MIN, w_max)


def _output_error(x: torch.Tensor, values: torch.Tensor, target: torch.Tensor, alive: torch.Tensor) -> torch.Tensor:
    """``(H,)`` mean over live rows of ``‖x C − o‖²``: ``x`` ``(H, n, k)``, ``values`` ``(H, k, D_v)``,
    ``target`` ``(H, n, D_v)``."""
    squared = ((x @ values - target) ** 2).sum(-1) * alive
    return squared.sum(-1) / alive.sum(-1).clamp(min=1)


def _compacted(p_kept: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The compacted attention ``x`` ``(H, n, k)`` from ``p_kept`` ``(H, n, k)`` and weights ``w`` ``(H, k)``."""
    weighted = p_kept * w[:, None, :]
    total = weighted.sum(-1, keepdim=True)
    return weighted / total.clamp(min=torch.finfo(weighted.dtype).tiny)


def _group_outputs(p: torch.Tensor, values: torch.Tensor, groups: torch.Tensor, n_groups: int) -> torch.Tensor:
    """``(H, n, G, D_v)``: each group's share ``Σ_{t∈g} p_rt V_t`` of every row's attention output
    (``p`` ``(H, n, T)``, ``values`` ``(H, T, D_v)``, ``groups`` ``(H, T)``)."""
    heads, n, _ = p.shape
    if n_groups == 1:
        return (p @ values)[:, :, None, :]
    out = torch.zeros(heads, n, n_groups, values.shape[-1], dtype=p.dtype, device=p.device)
    for head, head_blocks in enumerate(_blocks(groups)):
        for g, index in head_blocks:
            out[head, :, g] = p[head][:, index] @ values[head, index]
    return out


def fit_compaction(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    keep: torch.Tensor,
    bias: torch.Tensor | None = None,
    visible: torch.Tensor | None = None,
    groups: torch.Tensor | None = None,
    ridge: float = RIDGE,
    query_groups: torch.Tensor | None = None,
    unnormalised: bool = False,
) -> MatchFit:
    """Fit ``β`` and values for the kept slots of one layer (module docstring).

    ``queries`` ``(H, n, D)`` reference queries already multiplied by the attention scale;
    ``keys`` ``(H, T, D)``, ``values`` ``(H, T, D_v)`` as attention reads them; ``keep`` ``(H, k)``
    kept slot indices; ``bias`` ``(H, T)`` the slots' current bias (default 0); ``visible``
    ``(H, n, T)`` bool, which slots each reference query may attend to (default all);
    ``groups`` ``(H, T)`` int, the group of every slot (default one group); ``query_groups``
    ``(H, n)`` int, the one group (of ``groups``' numbering) whose fit a reference query joins,
    ``-1`` for a query every group's fit uses (default: all ``-1``).  ``unnormalised``: the mass
    fit matches the exp-score mass ``Σ e^{s_rj}`` itself, as the paper does (rows then weigh by
    their mass; scaled by one constant per head, ``e^{-max_r logsumexp_j s_rj}``, for range),
    instead of each row's share of its softmax.  The fallbacks score the output error over all
    reference queries.
    """
    heads, total, _ = keys.shape
    f64 = torch.float64
    q, k_all, v_all = queries.to(f64), keys.to(f64), values.to(f64)
    b_all = torch.zeros(heads, total, dtype=f64, device=keys.device) if bias is None else bias.to(f64)
    if visible is None:
        visible = torch.ones(heads, q.shape[1], total, dtype=torch.bool, device=keys.device)
    if groups is None:
        groups = torch.zeros(heads, total, dtype=torch.long, device=keys.device)
    own_rows = query_groups is not None and bool((query_groups >= 0).any())
    joined = join_orphans(groups.long(), keep, query_groups.long().clamp(min=0)) if own_rows else None
    groups = effective_groups(groups.long(), keep)
    n_groups = int(groups.max()) + 1

    logits = q @ k_all.transpose(1, 2) + b_all[:, None, :]
    p, alive = _masses(logits, visible)  # (H, n, T)
    p = p * alive[..., None]
    row_mass = _row_mass(logits, visible, alive) if unnormalised else torch.ones_like(p[..., 0])  # (H, n)
    mass = torch.zeros(heads, p.shape[1], n_groups, dtype=f64, device=p.device).scatter_add_(
        2, groups[:, None, :].expand_as(p), p * row_mass[..., None]
    )  # (H, n, G): each group's share of every row's attention (times the row's mass)
    output_parts = _group_outputs(p, v_all, groups, n_groups)  # (H, n, G, D_v)
    output = output_parts.sum(2)  # (H, n, D_v) the full cache's attention output

    p_kept = p.gather(2, keep[:, None, :].expand(-1, p.shape[1], -1))  # (H, n, k)
    g_kept = groups.gather(1, keep)  # (H, k)
    kept_hot = torch.nn.functional.one_hot(g_kept, n_groups).to(f64)  # (H, k, G)
    row_sets = None
    if own_rows:
        shared = (query_groups < 0).to(keys.device)[..., None]  # (H, n, 1)
        row_sets = RowSets.of(shared | torch.nn.functional.one_hot(joined, n_groups).bool(), kept_hot)
    v_kept = v_all.gather(1, keep[..., None].expand(-1, -1, v_all.shape[-1]))  # (H, k, D_v)

    # mass: Σ_{j∈S_g} w_j p_rj ≈ mass_rg, one block per group
    blocks = _blocks(g_kept)
    w = _fit_weights(p_kept * row_mass[..., None], mass, blocks, kept_hot, ridge, float(max(total, 1)), row_sets)

    # values: Σ_{j∈S_g} x_rj C_j ≈ output_rg, ridge towards the selected values
    x = _compacted(p_kept, w)  # (H, n, k)
    residual = output_parts - _group_outputs(x, v_kept, g_kept, n_groups)  # (H, n, G, D_v)
    c_fit = v_kept + _dual_solve(x, blocks, residual, _ridge(x, ridge, row_sets), row_sets)

    # fallbacks: the best finite candidate on the reference queries
    ones = torch.ones_like(w)
    errors = torch.stack(
        [
            _output_error(_compacted(p_kept, ones), v_kept, output, alive),
            _output_error(x, v_kept, output, alive),
            _output_error(x, c_fit, output, alive),
        ]
    )  # (3, H)
    finite = torch.stack(
        [
            torch.ones_like(w[:, 0], dtype=torch.bool),
            w.isfinite().all(-1),
            w.isfinite().all(-1) & c_fit.isfinite().all(-1).all(-1),
        ]
    )
    errors = torch.where(finite & errors.isfinite(), errors, torch.full_like(errors, float("inf")))
    choice = errors.argmin(0)  # (H,) ties keep the simpler candidate
    new_w = torch.where((choice >= 1)[:, None], w, ones)
    new_values = torch.where((choice == 2)[:, None, None], c_fit, v_kept)
    return MatchFit(
        bias=(b_all.gather(1, keep) + torch.log(new_w)).float(),
        values=new_values.to(values.dtype),
        error_select=errors[0].float(),
        error_fit=errors.gather(0, choice[None])[0].float(),
        choice=choice,
    )


@dataclass
class MatchStats:
    """What one compaction's fits did, over all layers and kv-heads: ``seconds`` spent fitting,
    the mean output error of selection and of the fits kept (over the reference queries), and
    how many (layer, kv-head) fits kept selection / the bias only / bias and values."""

    seconds: float
    error_select: float
    error_fit: float
    choices: tuple[int, int, int]

    def info(self) -> dict[str, float | int]:
        return {
            "fit_seconds": self.seconds,
            "fit_error_select": self.error_select,
            "fit_error": self.error_fit,
            "fits_select": self.choices[0],
            "fits_bias": self.choices[1],
            "fits_values": self.choices[2],
        }


def layer_queries(queries: torch.Tensor, positions: torch.Tensor, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's reference queries ``(H, R, D)`` at ``positions`` ``(R,)`` grouped by kv-head,
    ``(H_kv, G·R, D)``, and their positions ``(H_kv, G·R)`` (a GQA group's query heads stacked, as
    :func:`fit_compaction` takes them)."""
    heads, rows, dim = queries.shape
    group = heads // kv_heads
    stacked = positions.repeat(group)  # (G·R,), head-major like the reshape
    return queries.reshape(kv_heads, group * rows, dim), stacked.expand(kv_heads, -1)


@dataclass
class GroupQueries:
    """Reference queries that each join one group's fit only (tam's segments' own queries):
    ``queries`` ``(L, H, M, D)`` scaled and with RoPE applied like ``CacheView.queries``, their
    ``positions`` ``(M,)`` and ``groups`` ``(M,)`` (the numbering of :func:`match_cache`'s ``groups``)."""

    queries: torch.Tensor
    positions: torch.Tensor
    groups: torch.Tensor


def _layer_reference(
    view: CacheView, own: GroupQueries | None, layer: int, kv_heads: int, shared: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One layer's reference queries ``(H_kv, n, D)``, their positions ``(H_kv, n)`` and the group
    each joins ``(H_kv, n)`` (``-1``: every group's; ``None`` when all are shared): ``view``'s
    queries (when ``shared``), then ``own``'s."""
    parts = [layer_queries(view.queries[layer], view.query_positions, kv_heads)] if shared else []
    if own is None or len(own.positions) == 0:
        return *parts[0], None
    more, at = layer_queries(own.queries[layer], own.positions, kv_heads)
    parts.append((more.to(parts[0][0].device) if parts else more, at))
    queries, positions = torch.cat([part[0] for part in parts], 1), torch.cat([part[1] for part in parts], 1)
    labels = own.groups.repeat(own.queries.shape[1] // kv_heads)  # (G·M,) like the positions
    query_groups = F.pad(labels, (queries.shape[1] - len(labels), 0), value=-1).expand(kv_heads, -1)
    return queries, positions, query_groups


def match_cache(
    view: CacheView,
    cache,
    keep: torch.Tensor,
    groups: torch.Tensor | None = None,
    ridge: float = RIDGE,
    own: GroupQueries | None = None,
    unnormalised: bool = False,
) -> MatchStats:
    """Fit every layer's kept slots ``keep`` ``(L, H_kv, k)`` against ``view``'s reference queries and
    write the fitted values and biases into ``cache`` (before the engine gathers ``keep``).

    ``groups`` ``(L, H_kv, T)`` the group of every slot (default one group); ``own`` more reference
    queries, each used by its own group's fit only.  Keys and values are read as attention reads
    them; only the kept rows whose values changed are written back (a quantized store re-encodes
    just those).  A cache without reference queries yet is left alone.  ``unnormalised``: see
    :func:`fit_compaction`.
    """
    start = time.perf_counter()
    shared = view.queries is not None and view.query_positions is not None and len(view.query_positions) > 0
    if not shared and (own is None or len(own.positions) == 0):
        return MatchStats(0.0, 0.0, 0.0, (0, 0, 0))
    errors_select, errors_fit, choices = [], [], torch.zeros(3, dtype=torch.long)
    for layer in range(len(cache.layers)):
        keys, values = cache.layer_kv(layer)  # (1, H_kv, T_l, D)
        kv_heads, length = keys.shape[1], keys.shape[2]
        queries, positions, query_groups = _layer_reference(view, own, layer, kv_heads, shared)
        slots = view.positions[layer, :, :length]  # (H_kv, T_l)
        visible = slots[:, None, :] <= positions[:, :, None]  # (H_kv, n, T_l)
        if view.valid is not None:
            visible &= view.valid[layer, :, None, :length]
        device = keys.device
        layer_keep = keep[layer].to(device)
        bias = None if view.bias is None else view.bias[layer, :, :length].to(device)
        fit = fit_compaction(
            queries.to(device),
            keys[0],
            values[0],
            layer_keep,
            bias=bias,
            visible=visible.to(device),
            groups=None if groups is None else groups[layer, :, :length].to(device),
            ridge=ridge,
            query_groups=None if query_groups is None else query_groups.to(device),
            unnormalised=unnormalised,
        )
        changed = fit.choice == 2  # (H_kv,)
        if bool(changed.any()):
            new_values = values[0].clone()
            new_values.scatter_(1, layer_keep[..., None].expand_as(fit.values), fit.values)
            rows = torch.zeros(kv_heads, length, dtype=torch.bool, device=device)
            rows.scatter_(1, layer_keep, changed[:, None].expand_as(layer_keep))
            cache.set_values(layer, new_values[None], rows)
        new_bias = torch.zeros(kv_heads, length, device=device) if bias is None else bias.float().clone()
        new_bias.scatter_(1, layer_keep, fit.bias.to(device))
        cache.set_bias(layer, new_bias)
        errors_select.append(fit.error_select)
        errors_fit.append(fit.error_fit)
        choices += torch.bincount(fit.choice.cpu(), minlength=3)
    return MatchStats(
        time.perf_counter() - start,
        float(torch.cat(errors_select).mean()),
        float(torch.cat(errors_fit).mean()),
        tuple(choices.tolist()),
    )


def own_sample(positions: torch.Tensor, segments: torch.Tensor, rows: int) -> torch.Tensor:
    """Sorted indices of the query rows at ``positions`` ``(M,)`` to keep, at most ``rows`` of each
    segment (``segments`` ``(M,)``): those whose priority ``frac(position · GOLDEN)`` is lowest.

    A bottom-k sample on a fixed hash: deterministic, spread evenly along a segment (the golden
    ratio's multiples fill ``[0, 1)`` evenly, so the positions below any threshold are nearly evenly
    spaced), and the same whichever batches the rows arrived in: thinning the union of two samples
    gives the sample of the union."""
    priority = torch.frac(positions.double() * GOLDEN)
    order = priority.argsort(stable=True)
    order = order[segments[order].argsort(stable=True)]  # by segment, lowest priority first
    seg = segments[order]
    sizes = torch.bincount(seg)
    rank = torch.arange(len(order)) - (torch.cumsum(sizes, 0) - sizes)[seg]
    return order[rank < rows].sort().values


@dataclass
class Rereads:
    """Queries of repeat-prefills (``CacheView.reread``), kept between compactions: ``queries``
    ``(L, H, M, D)`` (``None`` before the first), ``read_at`` ``(M,)`` the positions they were
    read at (what they may attend to), ``source`` ``(M,)`` the position of the token each re-read,
    and ``upto``: every position below it has been re-read (a token is read once)."""

    queries: torch.Tensor | None = None
    read_at: torch.Tensor = dataclasses.field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    source: torch.Tensor = dataclasses.field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    upto: int = 0

    def read(self, view: CacheView, pieces: list[tuple[int, int]], piece_of, rows: int) -> None:
        """Re-read, one repeat-prefill each, the part not read yet of every piece ``[lo, hi)`` of
        ``pieces`` (ascending), then keep at most ``rows`` queries of each piece (``piece_of(source)``
        ``(M,)`` numbers the pieces; :func:`own_sample`)."""
        fresh = [(max(lo, self.upto), hi) for lo, hi in pieces if hi > max(lo, self.upto)]
        if not fresh or view.reread is None:
            return
        for lo, hi in fresh:
            queries, read_at = view.reread(range(lo, hi))
            self.queries = queries if self.queries is None else torch.cat([self.queries, queries], 2)
            self.read_at = torch.cat([self.read_at, read_at])
            self.source = torch.cat([self.source, torch.arange(lo, hi)])
            self.upto = hi
        kept = own_sample(self.source, piece_of(self.source), rows)
        self.queries = self.queries[:, :, kept.to(self.queries.device)].clone()
        self.read_at, self.source = self.read_at[kept], self.source[kept]

    def view(self, view: CacheView) -> CacheView:
        """``view`` with the re-read queries as its reference queries (``None`` before any)."""
        positions = self.read_at if len(self.read_at) else None
        return dataclasses.replace(view, queries=self.queries, query_positions=positions)


def reference_attention(view: CacheView) -> torch.Tensor:
    """``(L, H_kv, T)`` root mean square of the attention ``view``'s reference queries pay every slot
    (softmax over what each query may see, the slots' biases added; mean over a kv group's query
    heads), on the CPU; zero where no query sees a slot."""
    out = torch.zeros(view.positions.shape, dtype=torch.float32)
    for layer, keys in enumerate(view.keys):
        kv_heads, length = keys.shape[1], keys.shape[2]
        queries, at = layer_queries(view.queries[layer], view.query_positions, kv_heads)
        logits = queries.to(keys.device) @ keys[0].float().transpose(1, 2)  # (H_kv, n, T_l)
        if view.bias is not None:
            logits = logits + view.bias[layer, :, None, :length].to(logits)
        visible = view.positions[layer, :, None, :length] <= at[:, :, None]
        if view.valid is not None:
            visible &= view.valid[layer, :, None, :length]
        p, _ = _masses(logits, visible.to(logits.device))
        out[layer, :, :length] = p.pow(2).mean(1).sqrt().cpu()
    return out


class Matching:
    """Mixin for the policies that fit (``am``, ``tam`` with ``compaction=match``; before
    :class:`~thinkviz.policies.base.Policy` in the bases): the newest ``window`` queries of every
    head are the reference queries while :attr:`fits_bias`, :meth:`match` fits a compaction and
    keeps its :class:`MatchStats`, which :meth:`take_fit_info` hands to ``step_info`` once.  With
    ``reference=repeat`` the mass fit matches the un-normalised exp-score mass (:func:`fit_compaction`)."""

    window: int  # the host policy's knobs
    ridge: float
    reference: str
    last_fit: MatchStats | None = None

    @property
    def repeats(self) -> bool:
        """Whether the reference queries come from repeat-prefills (``reference=repeat``)."""
        return self.reference == "repeat"

    @property
    def query_rows(self) -> int:
        return self.window if self.fits_bias else 0

    def match(
        self,
        view: CacheView,
        cache,
        keep: torch.Tensor,
        groups: torch.Tensor | None = None,
        own: GroupQueries | None = None,
    ) -> None:
        self.last_fit = match_cache(view, cache, keep, groups, ridge=self.ridge, own=own, unnormalised=self.repeats)

    def take_fit_info(self) -> dict[str, float | int]:
        fit, self.last_fit = self.last_fit, None
        return {} if fit is None else fit.info()
