"""Segment table, stats strip and fidelity table on a real replayed record."""

from __future__ import annotations

import numpy as np
import pytest

from thinkviz.core.events import RunRecord
from thinkviz.measure.metrics import TokenFidelity, summarize_by_kind
from thinkviz.viz.tables import fidelity_table, segment_table, stats_strip
from viz_records import replayed
from tiny_models import tiny_model


@pytest.fixture(scope="module")
def run():
    return replayed(tiny_model("llama"), "h2o", recent=4)


def test_segment_table_rows_match_the_final_event(run):
    record = run.record
    last = record.events[-1]
    rows = segment_table(record)
    names = [r[0] for r in rows]
    assert names == ["system", "user", "think 1", "answer 1", "code 1", "think 2", "answer 2"]
    spans = {n: s for n, s in zip(names, [s for s in record.segments if s["kind"] not in ("step", "tag")])}
    for name, tokens, kept, importance in rows:
        lo, hi = spans[name]["start"], spans[name]["end"]
        assert tokens == hi - lo
        assert kept == pytest.approx(100 * last.keep_fraction[lo:hi].mean(), abs=0.05)
        finite = last.scores[lo:hi][np.isfinite(last.scores[lo:hi])]
        assert importance == (pytest.approx(float(finite.mean()), abs=1e-4) if len(finite) else None)
    assert rows[0][2] == 100.0 and rows[1][2] == 100.0  # the system prompt and question are protected
    assert min(r[2] for r in rows) < 100.0  # and something else was evicted


def test_segment_table_at_an_earlier_step(run):
    record = run.record
    first = record.events[0]
    rows = segment_table(record, step=first.step)
    seen = len(first.keep_fraction)
    assert sum(r[1] for r in rows if not r[0].startswith("code")) <= seen
    assert [r[0] for r in rows][:2] == ["system", "user"]
    assert "think 2" not in [r[0] for r in rows]  # not reached yet
    with pytest.raises(ValueError, match="before the first step"):
        segment_table(record, step=-1)


def test_segment_table_with_live_spans_and_without_segments(run):
    record = run.record
    assert segment_table(record, spans=run.segmenter.spans()) == segment_table(record)
    plain = RunRecord(meta=record.meta, prompt_texts=record.prompt_texts, events=record.events)
    (row,) = segment_table(plain)
    assert row[0] == "all tokens" and row[1] == len(record.events[-1].keep_fraction)
    assert segment_table(RunRecord(meta=record.meta)) == []


def test_stats_strip(run):
    record = run.record
    last = record.events[-1]
    strip = stats_strip(record)
    seen = last.positions[-1] + 1
    assert strip["kept"] == f"{100 * last.kv_tokens / seen:.0f}% ({last.kv_tokens:,} of {seen:,} tokens)"
    assert strip["compression"] == f"{last.full_kv_bytes / last.kv_bytes:.1f}×"
    assert float(strip["compression"][:-1]) > 1.0
    assert float(strip["tok/s"]) > 0
    assert strip["peak KV"].endswith("KiB")
    assert stats_strip(RunRecord(meta=record.meta)) == {"tok/s": "—", "kept": "—", "peak KV": "—", "compression": "—"}


def test_fidelity_table_from_metric_summaries(run):
    record = run.record
    fidelity = TokenFidelity.empty()
    positions = np.arange(40, 104)
    nll_full = np.full(len(positions), 2.0)
    nll = nll_full + np.where(positions < 52, 0.5, 0.0)  # worse inside the first think block
    fidelity.extend(positions, nll, nll_full, np.where(positions < 52, 0.2, 0.0), positions % 2 == 0)
    rows = fidelity_table(summarize_by_kind(fidelity, record.segments))
    by_name = {r[0]: r for r in rows}
    assert by_name["all tokens"][1] == len(positions)
    think = by_name["think"]
    think_tokens = sum(
        1 for p in positions if any(s["kind"] == "think" and s["start"] <= p < s["end"] for s in record.segments)
    )
    assert think[1] == think_tokens
    in_first = sum(1 for p in positions if p < 52)
    assert think[2] == pytest.approx(0.5 * in_first / think_tokens, abs=1e-4)
    assert by_name["answer"][2] == 0.0
    assert 0 <= by_name["all tokens"][4] <= 100


def test_turn_preview_lists_every_message_with_its_tokens_and_blocks():
    from thinkviz.measure.inspection import inspect_trace
    from thinkviz.measure.replay import Trace
    from thinkviz.text.transcript import Message
    from thinkviz.viz.tables import TURN_PREVIEW_HEADERS, turn_preview

    from thought_trace import MESSAGES
    from tiny_models import tiny_model

    messages = [Message(role, content) for role, content in MESSAGES] + [Message("tool", "")]
    report = inspect_trace(tiny_model().tokenizer, 2048, Trace.of_transcript("t", messages))
    rows = turn_preview(messages, report, width=20)
    assert len(rows[0]) == len(TURN_PREVIEW_HEADERS) and [r[0] for r in rows] == list(range(1, len(messages) + 1))
    assert [r[1] for r in rows] == [m.role for m in messages]
    assert [r[2] for r in rows] == [t["tokens"] for t in report["turns"]]
    assert [r[3] for r in rows] == [1 if k in (2, 4, 7) else 0 for k in range(len(messages))]
    assert rows[2][4] == "The function return…" and rows[3][4] == "F." and rows[-1][4] == "(empty)"
    assert rows[1][4].endswith("…") and len(rows[1][4]) == 20
    assert turn_preview(messages[:2])[0][2:4] == [None, None]  # no model yet: no token counts
