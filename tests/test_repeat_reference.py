"""Attention matching's reference queries from a repeat-prefill (Zweiger et al., arXiv:2602.16284):
``reference=repeat`` on am and tam re-reads the text after a repeat instruction, once per piece,
and fits on the queries of that re-read; the per-head fallback to selection stays."""

from __future__ import annotations

import torch

from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.policies import CacheView, make_policy
from thinkviz.policies import matching
from thinkviz.policies.matching import fit_compaction

from thought_trace import chat_and_trace

LAYERS, HEADS, DIM = 2, 4, 8


class Reader:
    """A stand-in for ``CacheView.reread``: every re-read's queries are filled with the first position
    it read, and are read at positions from 1000 on."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def __call__(self, positions) -> tuple[torch.Tensor, torch.Tensor]:
        positions = list(positions)
        self.calls.append(positions)
        queries = torch.full((LAYERS, HEADS, len(positions), DIM), float(positions[0]))
        return queries, torch.arange(1000, 1000 + len(positions))


def _view(seen: int, reader: Reader) -> CacheView:
    return CacheView(
        positions=torch.arange(seen).expand(LAYERS, 2, -1),
        received=torch.zeros(LAYERS, 2, seen),
        window=torch.zeros(LAYERS, 2, 1, seen),
        token_entropy=torch.zeros(seen),
        protected=torch.zeros(seen, dtype=torch.bool),
        current=seen - 1,
        reread=reader,
    )


def test_am_fits_on_the_queries_of_the_re_read_each_piece_read_once():
    reader, am = Reader(), make_policy("am", reference="repeat", rows=512)
    reference = am.reference_view(_view(140, reader))
    assert reader.calls == [list(range(0, 64)), list(range(64, 128))]  # whole pieces of 64 only
    assert torch.equal(reference.query_positions, torch.arange(1000, 1064).repeat(2))
    assert torch.equal(reference.queries[:, :, :64], torch.zeros(LAYERS, HEADS, 64, DIM))
    assert torch.equal(reference.queries[:, :, 64:], torch.full((LAYERS, HEADS, 64, DIM), 64.0))
    am.reference_view(_view(150, reader))
    assert len(reader.calls) == 2  # nothing new to re-read
    am.reference_view(_view(200, reader))
    assert reader.calls[2] == list(range(128, 192))
    assert am.reference_view(_view(200, reader)).queries.shape[2] == 192


def test_am_keeps_at_most_rows_re_read_queries_spread_over_the_text():
    reader, am = Reader(), make_policy("am", reference="repeat", rows=16)
    reference = am.reference_view(_view(640, reader))
    assert reference.queries.shape[2] == 16
    sources = reference.queries[0, 0, :, 0]  # the first position of the piece each row came from
    assert len(set(sources.tolist())) >= 6  # spread over the pieces, not the first ones only


def test_recent_reference_leaves_the_decode_queries():
    reader, am = Reader(), make_policy("am")
    view = _view(140, reader)
    assert am.reference_view(view) is view and reader.calls == []


def test_tam_re_reads_every_closed_segment_once_and_its_rows_join_that_segment_only():
    reader = Reader()
    tam = make_policy("tam", compaction="match", reference="repeat", own_rows=8)
    ids = torch.cat([torch.zeros(20), torch.ones(30), torch.full((10,), 2)]).long()
    bare, own = tam.repeat_queries(_view(60, reader), ids)
    assert reader.calls == [list(range(0, 20)), list(range(20, 50))]  # the newest segment is still open
    assert bare.queries is None and bare.query_positions is None  # no decode query is a reference
    assert torch.bincount(own.groups).tolist() == [8, 8]
    assert torch.equal(own.queries[0, 0, :, 0], torch.tensor([0.0] * 8 + [20.0] * 8))
    assert bool((own.positions >= 1000).all())
    tam.repeat_queries(_view(60, reader), ids)
    assert len(reader.calls) == 2


def test_a_run_fits_on_the_rows_its_re_read_returned(tiny_llama, monkeypatch):
    prompt, trace = chat_and_trace(tiny_llama.tokenizer)
    policy = make_policy("am", budget=len(prompt.ids) + 16, interval=4, recent=4, reference="repeat", rows=16)
    run = Run(tiny_llama, policy, prompt, DecodeSettings(prefill_chunk=len(prompt.ids)))
    read, fitted = [], []
    reread = run.reread

    def spy_reread(positions):
        before = [kv[0].clone() for kv in map(run.cache.layer_kv, range(len(run.cache.layers)))]
        queries, at = reread(positions)
        after = [kv[0] for kv in map(run.cache.layer_kv, range(len(run.cache.layers)))]
        assert all(torch.equal(a, b) for a, b in zip(before, after))  # the cache is left as it was
        assert int(at[0]) > run.processed - 1  # read after everything the cache holds
        read.append(queries)
        return queries, at

    def spy_match(view, *args, **kwargs):
        fitted.append(view.queries)
        assert kwargs["unnormalised"]  # the paper's mass: the exp-scores themselves
        return match_cache(view, *args, **kwargs)

    match_cache = matching.match_cache
    monkeypatch.setattr(run, "reread", spy_reread)
    monkeypatch.setattr(matching, "match_cache", spy_match)
    events = list(run.replay(trace))
    assert read and any(q is not None for q in fitted)
    pool = torch.cat(read, dim=2)  # (L, H, M, D): every re-read row
    for queries in filter(lambda q: q is not None, fitted):
        rows = queries.reshape(-1, queries.shape[2], queries.shape[3]).transpose(0, 1)  # (R, L·H, D)
        candidates = pool.reshape(-1, pool.shape[2], pool.shape[3]).transpose(0, 1)
        for row in rows:
            assert any(torch.equal(row, c) for c in candidates)  # every fitted row is a re-read row
    assert sum(e.info.get("fits_values", 0) + e.info.get("fits_bias", 0) for e in events) > 0


def test_the_paper_mass_fit_falls_back_to_selection_per_head():
    """A head whose reference queries see none of its slots keeps plain selection (β unchanged, the
    same values); the other head fits, never worse than selection on its reference queries."""
    g = torch.Generator().manual_seed(4)
    queries, keys, values = (torch.randn(2, n, 8, generator=g) for n in (12, 40, 40))
    keep = torch.stack([torch.arange(0, 40, 4), torch.arange(1, 40, 4)])
    visible = torch.ones(2, 12, 40, dtype=torch.bool)
    visible[0] = False
    fit = fit_compaction(queries, keys, values, keep, visible=visible, unnormalised=True)
    assert int(fit.choice[0]) == 0 and float(fit.bias[0].abs().max()) == 0.0
    assert torch.equal(fit.values[0], values[0, keep[0]])
    assert int(fit.choice[1]) > 0 and float(fit.error_fit[1]) < float(fit.error_select[1])
