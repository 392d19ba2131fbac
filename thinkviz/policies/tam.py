"""tam: Thought-Aware attention Matching — budgets per reasoning step, ∝ √(importance · size).

TAM ("Thought-Aware KV Cache Compaction for Reasoning via Adaptive Attention Matching"): a
chain of thought is a sequence of steps of unequal value, so compress it step by step instead
of as a flat sequence.  Three mechanisms, at every compression and in every
(layer, kv-head):

1. *Thought segmentation.*  Segments are the segmenter's reasoning steps (a think block split
   at blank lines) and, outside thinking, runs of one label (system, question, template,
   answer, code, tag); segments shorter than ``l_min`` tokens merge into the previous one (a
   short first one into the next).  Without a segmenter (a plain token prompt) the whole text
   is one segment.
2. *Pivotal tokens.*  ``a`` ``(T,)`` = mean attention from the last ``window`` queries (``R``).  Slots
   with ``a > pivot_factor · mean(a)`` are pivotal and kept first, strongest first, as far as
   the budget allows once the forced slots (protected spans and the ``recent`` tail ``τ``) are in.
3. *Adaptive budgets.*  The budget left, ``B``, is split over the segments by
   :func:`allocate_budgets`: ``t_i ∝ √(w_i · n_i)`` with ``w_i`` the attention mass (sum of ``a``)
   and ``n_i`` the number of a segment's slots still undecided, ``t_i ≤ n_i``, ``Σ t_i = B``.
   Inside each segment the ``t_i`` slots with the highest ``a`` are kept.

The kept count is therefore exactly ``budget`` (or the forced count, if larger).  TAM's
allocation is optimal under its convex error model.

4. *Compaction* (``compaction``).  ``select`` stops here: the kept keys and values are the
   cache's own (this app's first, selection-only reading of TAM).  ``match`` is TAM's attention
   matching: for every segment's kept slots :func:`~thinkviz.policies.matching.match_cache`
   fits a log-mass bias ``β`` (``w = e^β``, non-negative least squares) and new values (least
   squares) so that they reproduce *that segment's* attention mass and its share of the
   attention output for the reference queries (Zweiger et al., arXiv:2602.16284, per segment
   instead of per fixed-size chunk); a segment left with no kept slot in a head is matched
   together with the nearest earlier one.  A kept token then stands for ``≈ e^β`` tokens of its
   step.

5. *Reference queries* (``reference``).  ``window``: the last ``window`` queries of every query
   head — the same rows that weigh segments and tokens, so the fit matches what the newest
   tokens attend to, the best cheap guess of what the next ones will (a segment nobody attends
   to keeps its selection: the ridge holds ``w = 1`` and its values where its rows carry no
   mass).  ``window+own`` (the paper's other candidate): each segment's fit also matches a sample
   of that segment's *own* queries, what its tokens asked while it was written (attending, at
   its position, only to what came before; a fit of an orphan segment's slots joined to a
   neighbour takes its sample along).  The sample is at most ``own_rows`` rows per segment,
   chosen by :func:`own_sample` (deterministic, evenly spread); every query passes through
   ``CacheView.queries`` once — the engine then keeps ``max(window, interval)`` rows (at most
   64), so a replayed chunk's every query is offered, and :meth:`collect` runs at every step
   (``step_info``) and compression — except the prompt's, of which only a prefill chunk's last
   rows pass: its segments' samples are only what is available.  Samples are drawn over the
   segments as they are at each step; a short segment written into its predecessor and split
   off later keeps only the rows that survived the joint sample.  A row weighs as much as a
   window row (both are one query each).  Memory: at most ``own_rows × S × L × H × D × 4`` bytes
   (``S`` segments so far; float32) besides the cache — on SmolLM2-135M (30 layers, 9 query
   heads, 64 wide) 67.5 KiB a row, 540 KiB a segment at ``own_rows = 8``, the KV of 24 tokens
   (the peak KV of a sweep does not count it).

   The default is ``window``, by what the sweep measured (docs/benchmarks.md, "Reference
   queries", NF4, interval 32): ``window+own`` was worse on every budget that selects among
   the thinking — math at 10 / 25 / 50 %: ΔNLL 0.529 / 0.148 / 0.064 against 0.374 / 0.112 /
   0.051; the rate limiter's first 2,048 trace tokens at 25 / 50 %: 0.363 / 0.193 against
   0.313 / 0.187; three coding traces' first 1,024 at 50 %: 0.042 / 0.041 / 0.048 against
   0.039 / 0.022 / 0.035 — and better only where the budget was below the protected prompt
   (the cache then holds no key of any thought step: 0.243–0.364 against 0.293–0.431), while
   its fit took 4–14× as long per compression (math: 4.1–6.4 s against 0.3–0.8 s).

   ``repeat`` (Zweiger et al.'s repeat-prefill, arXiv:2602.16284): each thought segment, once it
   is closed (a later one has begun), is re-read once — the model reads a short repeat
   instruction and then the segment, on top of the cache
   (:meth:`~thinkviz.core.engine.Run.reread`) — and at most ``own_rows`` of the queries over that
   re-read (:func:`~thinkviz.policies.matching.own_sample`) join that segment's fit only, in place
   of every decode query; the mass fit then matches the un-normalised exp-score mass, as the
   paper.  The open newest segment has no re-read rows yet and keeps its selection.

Where ThinkViz departs from TAM and from attention matching, and why: segments are the
segmenter's steps (blank lines inside a think block) rather than a learned or model-marked
segmentation, so the app can show them; the default compaction is ``select`` (the budgets and
pivots alone), because ``match`` measured no better (docs/benchmarks.md); matching runs at every
compression of a decode rather than once, with a ridge towards selection and a per-(layer,
kv-head) fallback to selection where the fit does not lower the reference queries' output error;
the default reference queries are the newest decode queries (no extra forward), ``repeat`` is the
paper's, read on top of the cache as it is then (already compacted), not the original context.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from collections.abc import Sequence

import numpy as np
import torch

from .base import CacheView, Param, Policy, ScoreScale, keep_top
from .matching import RIDGE, GroupQueries, Matching, Rereads, own_sample
from .registry import register


def allocate_budgets(weights: Sequence[float], sizes: Sequence[int], budget: int) -> list[int]:
    """Split ``budget`` tokens over segments: ``t_i ∝ √(w_i · n_i)``, ``0 ≤ t_i ≤ n_i``,
    ``Σ t_i = min(budget, Σ n_i)``.

    A share that would exceed its segment is capped at ``n_i`` and the surplus goes to the
    others in the same proportion (repeated until no share overflows); segments with zero
    ``w_i`` still open when every open segment has zero weight share ``∝ √n_i`` (no attention
    evidence: size alone).  Real shares become integers by largest remainder: each gets its
    floor, the tokens left go one each to the largest fractional parts (ties: larger share,
    then earlier segment).  Negative or NaN weights count as 0.
    """
    w = np.clip(np.nan_to_num(np.asarray(weights, dtype=np.float64), nan=0.0), 0.0, None)
    n = np.asarray(sizes, dtype=np.int64)
    if w.shape != n.shape or w.ndim != 1:
        raise ValueError(f"weights and sizes must be two lists of one length, got {w.shape} and {n.shape}")
    if budget < 0 or (n < 0).any():
        raise ValueError("budget and sizes must not be negative")
    total = int(min(budget, n.sum()))
    shares = np.zeros(len(n))
    open_ = n > 0
    left = float(total)
    while open_.any() and left > 0:
        raw = np.sqrt(w * n) * open_
        if raw.sum() <= 0:
            raw = np.sqrt(n) * open_
        ideal = left * raw / raw.sum()
        full = open_ & (ideal >= n)
        if not full.any():
            shares[open_] = ideal[open_]
            break
        shares[full] = n[full]
        left -= float(n[full].sum())
        open_ &= ~full
    counts = np.minimum(np.floor(shares).astype(np.int64), n)
    room = [i for i in range(len(n)) if counts[i] < n[i]]
    room.sort(key=lambda i: (-(shares[i] - counts[i]), -shares[i], i))
    for i in room[: total - int(counts.sum())]:
        counts[i] += 1
    return counts.tolist()


def merge_short(bounds: Sequence[int], l_min: int) -> list[tuple[int, int]]:
    """Segments ``[lo, hi)`` between consecutive ``bounds``; one shorter than ``l_min`` joins the
    previous segment (a short first one joins the next)."""
    segments: list[list[int]] = []
    for lo, hi in zip(bounds, bounds[1:]):
        if segments and hi - lo < l_min:
            segments[-1][1] = hi
        else:
            segments.append([lo, hi])
    if len(segments) > 1 and segments[0][1] - segments[0][0] < l_min:
        first = segments.pop(0)
        segments[0][0] = first[0]
    return [(lo, hi) for lo, hi in segments]


@register
class ThoughtAwareMatching(Matching, Policy):
    """Score ``(L, H_kv, T)`` = mean attention from the last ``window`` queries; selection by
    segment budgets ``∝ √(w·n)`` plus pivotal tokens and a recent tail; with ``compaction=match``
    each segment's kept keys are fitted (bias and values) against reference queries — the newest
    decode queries, or with ``reference=repeat`` those of a re-read of the segment, as attention
    matching's paper.  Departs from the sources: segments are the segmenter's steps; matching runs
    at every compression, with a ridge towards selection and a per-head fallback to it; the
    default compaction is ``select``, which measured as good (module docstring)."""

    name = "tam"
    score_scale = ScoreScale(
        "attention from the newest `window` queries",
        "ignored lately",
        "attended lately (pivotal when far above the mean)",
    )
    summary = (
        "Split the reasoning into steps; give each step a share of the budget by its importance "
        "and size (√(w·n)); always keep pivotal tokens and the newest ones. With compaction=match the "
        "kept tokens of each step are also fitted to stand for the dropped ones."
    )
    source = "TAM — Thought-Aware KV Cache Compaction for Reasoning via Adaptive Attention Matching"
    params = (
        Param("recent", 32, 0, 1024, 1, "tail τ: newest tokens always kept"),
        Param("window", 16, 1, 64, 1, "R: the newest queries whose attention weighs segments and tokens"),
        Param("l_min", 16, 1, 512, 1, "segments shorter than this merge into the previous one"),
        Param("pivot_factor", 4.0, 1.0, 100.0, 0.5, "pivotal token: attention above this multiple of the mean"),
        Param(
            "compaction",
            "select",
            choices=("select", "match"),
            help="select: keep the chosen keys as they are; match: also fit a bias β and new values per segment "
            "so the kept keys reproduce the segment's attention",
        ),
        Param("ridge", RIDGE, 0.0, 10.0, 0.01, "match: how firmly the fit is pulled towards plain selection"),
        Param(
            "reference",
            "window",
            choices=("window", "window+own", "repeat"),
            help="match: the queries each segment's fit reproduces — the newest `window` queries, those plus "
            "a sample of the segment's own queries, or (repeat, the paper's) the queries of a repeat-prefill "
            "of the segment: the model re-reads it after an instruction to repeat it, once per segment",
        ),
        Param("own_rows", 8, 1, 64, 1, "match, reference window+own or repeat: the most queries kept per segment"),
    )
    window_rows = 64

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        self._own_queries: torch.Tensor | None = None  # (L, H, M, D) the own-query samples of all segments
        self._own_positions = torch.zeros(0, dtype=torch.long)  # (M,)
        self._collected = -1  # the newest position whose query has been offered to the sample
        self.rereads = Rereads()

    @property
    def fits_bias(self) -> bool:
        return self.compaction == "match"

    @property
    def uses_own_queries(self) -> bool:
        """Whether the fit also uses the segments' own queries (``reference=window+own``)."""
        return self.fits_bias and self.reference == "window+own"

    @property
    def own_queries(self) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The own queries held, every segment's sample: ``(L, H, M, D)`` (``None`` before the first)
        and their positions ``(M,)``, ascending."""
        return self._own_queries, self._own_positions

    @property
    def query_rows(self) -> int:
        # with own queries, a replayed chunk of `interval` tokens passes all its queries (up to 64)
        if self.uses_own_queries:
            return min(max(self.window, self.interval), self.window_rows)
        return super().query_rows

    def score(self, view: CacheView) -> torch.Tensor:
        return view.window[:, :, -self.window :, :].mean(dim=2)  # (L, H_kv, T)

    def segment_ids(self, view: CacheView) -> torch.Tensor:
        """``(N,)`` segment number of every position (step 1 of the module docstring)."""
        total = len(view.protected)
        if view.segments is None or total == 0:
            return torch.zeros(total, dtype=torch.long)
        labels = view.segments.labels()[:total]
        starts = {0} | {i for i in range(1, total) if labels[i] != labels[i - 1]}
        starts |= {s.start for s in view.segments.spans() if s.kind == "step" and s.start < total}
        ids = torch.empty(total, dtype=torch.long)
        for number, (lo, hi) in enumerate(merge_short([*sorted(starts), total], self.l_min)):
            ids[lo:hi] = number
        return ids

    def select(self, view: CacheView) -> torch.Tensor:
        attention = self.score(view).float()  # (L, H_kv, T)
        forced = self.forced(view)
        segments = view.by_position(self.segment_ids(view))  # (L, H_kv, T)
        keep = forced.clone()
        budget = self.target(view.seen)
        layers, heads, _ = attention.shape
        for layer in range(layers):
            for head in range(heads):
                keep[layer, head] |= self.choose(
                    attention[layer, head], forced[layer, head], segments[layer, head], budget
                )
        return keep_top(attention, keep, int(keep.sum(-1).max()))

    def choose(
        self, attention: torch.Tensor, forced: torch.Tensor, segments: torch.Tensor, budget: int
    ) -> torch.Tensor:
        """One (layer, kv-head): ``attention``, ``forced`` and segment numbers ``segments`` per slot
        ``(T,)`` → ``(T,)`` bool, the pivotal and per-segment top slots kept besides ``forced``, for a
        ``budget`` of slots in all."""
        left = budget - int(forced.sum())
        chosen = torch.zeros_like(forced)
        if left <= 0:
            return chosen
        free = ~forced
        pivotal = free & (attention > self.pivot_factor * attention.mean())
        strongest = torch.where(pivotal, attention, torch.full_like(attention, -1.0)).argsort(descending=True)
        chosen[strongest[: min(left, int(pivotal.sum()))]] = True
        left -= int(chosen.sum())
        candidates = (free & ~chosen).nonzero().squeeze(1)
        if left <= 0 or len(candidates) == 0:
            return chosen
        seg = segments[candidates]
        n_segments = int(seg.max()) + 1
        mass = torch.zeros(n_segments).scatter_add_(0, seg, attention[candidates])
        sizes = torch.bincount(seg, minlength=n_segments)
        budgets = torch.tensor(allocate_budgets(mass.tolist(), sizes.tolist(), left))
        # rank inside each segment: order by attention (descending), then stably by segment
        order = attention[candidates].argsort(descending=True, stable=True)
        order = order[seg[order].argsort(stable=True)]
        first_of_segment = torch.cumsum(sizes, 0) - sizes  # (S,)
        rank = torch.arange(len(order)) - first_of_segment[seg[order]]
        chosen[candidates[order[rank < budgets[seg[order]]]]] = True
        return chosen

    def collect(self, view: CacheView) -> None:
        """Offer the queries in ``view`` not offered yet to the own-query samples, then keep at most
        ``own_rows`` per segment (:func:`own_sample`; segments as they are now)."""
        if view.queries is None or view.query_positions is None or len(view.query_positions) == 0:
            return
        new = view.query_positions > self._collected
        if not bool(new.any()):
            return
        self._collected = int(view.query_positions.max())
        fresh = view.queries[:, :, new.to(view.queries.device)]
        queries = fresh if self._own_queries is None else torch.cat([self._own_queries, fresh], dim=2)
        positions = torch.cat([self._own_positions, view.query_positions[new].cpu()])
        kept = own_sample(positions, self.segment_ids(view)[positions], self.own_rows)
        self._own_queries = queries[:, :, kept.to(queries.device)].clone()
        self._own_positions = positions[kept]

    def compress(self, view: CacheView, cache) -> torch.Tensor:
        keep = self.select(view)
        if self.fits_bias:
            ids = self.segment_ids(view)
            groups = view.by_position(ids)  # (L, H_kv, T)
            own = None
            if self.repeats:
                view, own = self.repeat_queries(view, ids)
            elif self.uses_own_queries and view.query_positions is not None and len(view.query_positions):
                self.collect(view)
                rows = self.window
                view = dataclasses.replace(
                    view, queries=view.queries[:, :, -rows:], query_positions=view.query_positions[-rows:]
                )
                older = self._own_positions < int(view.query_positions.min())  # not already a window row
                device = self._own_queries.device
                own = GroupQueries(
                    self._own_queries[:, :, older.to(device)],
                    self._own_positions[older],
                    ids[self._own_positions[older]],
                )
            self.match(view, cache, keep, groups, own)
        return keep

    def repeat_queries(self, view: CacheView, ids: torch.Tensor) -> tuple[CacheView, GroupQueries | None]:
        """``reference=repeat``: re-read every closed segment (all but the newest, still being written)
        not re-read yet, keep at most ``own_rows`` of its queries, and return ``view`` without decode
        queries and the re-read ones, each joining its own segment's fit (``ids`` ``(N,)`` segment numbers)."""
        starts = [0, *(torch.nonzero(ids[1:] != ids[:-1]).squeeze(1) + 1).tolist(), len(ids)]
        closed = list(zip(starts[:-2], starts[1:-1]))
        self.rereads.read(view, closed, lambda source: ids[source], self.own_rows)
        bare = dataclasses.replace(view, queries=None, query_positions=None)
        if self.rereads.queries is None:
            return bare, None
        return bare, GroupQueries(self.rereads.queries, self.rereads.read_at, ids[self.rereads.source])

    def step_info(self, view: CacheView) -> dict[str, Any]:
        segments = int(self.segment_ids(view).max()) + 1 if len(view.protected) else 0
        info = {"segments": segments, **self.take_fit_info()}
        if self.uses_own_queries:
            self.collect(view)  # every step: rows that pass between compressions are offered too
            info["own_queries"] = len(self._own_positions)
        return info
