"""am: Attention Matching on the whole cache — keep the keys with the highest RMS attention, then
fit a log-mass bias β and new values for them.

Zweiger, Fu, Guo, Kim, "Fast KV Compaction via Attention Matching", 2026 (arXiv:2602.16284),
the "highest attention keys" variant, applied here at every compression of a running decode
(the paper compacts a prefix once).  Per layer and kv-head:

1. *Reference queries* (``reference``).  ``recent``: the newest ``window`` decode queries of
   every query head.  ``repeat`` (the paper's repeat-prefill): the model reads a short repeat
   instruction and then a piece of the text again, on top of the cache
   (:meth:`~thinkviz.core.engine.Run.reread`), and the queries over that re-read are the
   reference set; the text is re-read in pieces of :data:`CHUNK` tokens, each once, as soon as
   it is whole, and at most ``rows`` re-read queries are kept, spread evenly over the text.
2. *Keys.*  Score ``(L, H_kv, T)`` = root mean square of the attention the reference queries pay
   each slot (``recent``: ``view.window``, the kv group's mean attention rows), so a key that
   one reference query relies on heavily outranks one that many brush past.  Protected spans
   and the ``recent`` newest tokens are always kept; the rest by score, ``budget`` in all.
3. *Bias and values.*  :func:`~thinkviz.policies.matching.match_cache` fits, for the kept slots
   and against the reference queries (RoPE applied, as attention saw them), ``w = e^β ≥ 0`` by
   non-negative least squares so the kept keys carry the whole cache's attention mass, then
   values by least squares so they reproduce its attention output; one group for the whole
   cache (``tam``'s ``compaction=match`` does the same per thought segment).  The cache stores
   ``β`` beside every kept slot and attention adds it to the logits from then on: a kept token
   with ``e^β ≈ 4`` stands for about four.

Where ThinkViz departs from the paper, and why:

- it compacts every ``interval`` tokens of a running decode, refitting keys already fitted,
  where the paper compacts a finished prefix once: the app shows eviction during decoding;
- ``recent`` (the default, as measured in docs/benchmarks.md) fits on the newest decode queries,
  which cost nothing extra but stand for the next tokens poorly (a few rows against hundreds of
  kept keys); ``repeat`` is the paper's choice, reading each piece once, on top of the cache as
  it is then (already compacted, not the original context), and thinned to ``rows`` queries
  because the fit is solved in the dual (an ``n × n`` system per head); self-generated questions
  are not offered;
- the mass fit is pulled towards plain selection by a ``ridge`` (``0``: the paper's plain NNLS),
  and with ``recent`` it matches each query's softmax share rather than the paper's
  un-normalised exp-score mass (``repeat`` matches the mass itself);
- a (layer, kv-head) whose fit does not lower the reference queries' output error keeps plain
  selection (the per-head fallback), so matching is never worse than selection on them.

Because values change, the eviction oracle (evicted cache = full cache with slots hidden) does
not apply; ``tests/test_oracle.py`` checks the biased step against the full cache with the same
kept keys, biases and values applied by an explicit mask and value substitution.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import CacheView, Param, Policy, ScoreScale
from .matching import RIDGE, Matching, Rereads, reference_attention
from .registry import register

CHUNK = 64  # reference=repeat: the text is re-read in pieces of this many tokens, each once


@register
class AttentionMatching(Matching, Policy):
    """Score ``(L, H_kv, T)`` = RMS attention of the reference queries (the newest ``window`` decode
    queries, or with ``reference=repeat`` those of a repeat-prefill of the text, as the paper); the
    kept slots' ``β`` (non-negative least squares on the attention mass) and values (least squares
    on the attention output) fitted against them.  Departs from the paper: it compacts every
    ``interval`` tokens of a decode, not a prefix once; the default reference is the newest decode
    queries (cheap, but few), ``repeat`` re-reads 64-token pieces once each on top of the cache as
    it is then; the fit has a ridge towards selection and keeps selection per head where it does
    not help (module docstring)."""

    name = "am"
    score_scale = ScoreScale(
        "root mean square of the attention from the newest `window` queries",
        "no recent query relies on it",
        "some recent query relies on it heavily",
    )
    summary = (
        "Keep the keys the newest queries rely on most, then fit a weight and a value for each kept "
        "key so the small cache gives the same attention as the full one."
    )
    source = "Attention Matching — Zweiger, Fu, Guo, Kim, 2026 (arXiv:2602.16284)"
    params = (
        Param("recent", 32, 0, 1024, 1, "newest tokens always kept"),
        Param("window", 16, 1, 64, 1, "reference queries: the newest queries the fit matches"),
        Param("ridge", RIDGE, 0.0, 10.0, 0.01, "how firmly the fit is pulled towards plain selection"),
        Param(
            "reference",
            "recent",
            choices=("recent", "repeat"),
            help="the queries the keys are chosen by and the fit reproduces: the newest `window` decode queries, "
            "or those of a repeat-prefill (the model re-reads the text after an instruction to repeat it; the paper's)",
        ),
        Param("rows", 64, 8, 512, 8, "reference repeat: re-read queries kept, spread evenly over the text"),
    )
    window_rows = 64

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        self.rereads = Rereads()

    @property
    def fits_bias(self) -> bool:
        return True

    def reference_view(self, view: CacheView) -> CacheView:
        """``view`` with the fit's reference queries: as it is (``recent``), or with the re-read
        queries in place of the decode ones (``repeat``; every whole :data:`CHUNK` of the text not
        re-read yet is re-read first, at most ``rows`` queries kept in all, evenly spread)."""
        if not self.repeats:
            return view
        pieces = [(lo, lo + CHUNK) for lo in range(0, view.seen - CHUNK + 1, CHUNK)]
        self.rereads.read(view, pieces, torch.zeros_like, self.rows)
        return self.rereads.view(view)

    def score(self, view: CacheView) -> torch.Tensor:
        if self.repeats and self.rereads.queries is not None:
            return reference_attention(self.rereads.view(view))
        rows = view.window[:, :, -self.window :, :].float()  # (L, H_kv, R, T)
        return rows.pow(2).mean(dim=2).sqrt()

    def compress(self, view: CacheView, cache) -> torch.Tensor:
        view = self.reference_view(view)
        keep = self.select(view)  # (L, H_kv, k)
        self.match(view, cache, keep)
        return keep

    def step_info(self, view: CacheView) -> dict[str, Any]:
        return self.take_fit_info()
