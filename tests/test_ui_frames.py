"""The Live / Compare / Explore frame generators, driven with list(...) on tiny models."""

from __future__ import annotations

import threading
from html.parser import HTMLParser

import numpy as np
import orjson
import pytest
import torch

from thinkviz.core.engine import DecodeSettings
from thinkviz.core.kvquant import KVQuant
from thinkviz.memory import Projection
from thinkviz.policies import make_policy
from thinkviz.ui import explore_views, inputs
from thinkviz.ui.compare_run import FIDELITY_COLUMNS, check_policies, compare_frames
from thinkviz.ui.live_run import live_frames
from thinkviz.measure.requests import RunInput, RunInputError
from thinkviz.ui.stream import TokenChannel
from thinkviz.ui.throttle import FramePacer
from thinkviz.viz.tokens import TokenData
from tiny_models import tiny_model

QUESTION = RunInput(system="Think step by step.", question="What is 2 + 3?")
TRACE = RunInput(
    system=None,
    question="Sum the list.",
    trace="<think>\nFirst add 1 and 2.\n\nThen add 3.\n</think>\n\nThe sum is 6.\n",
)


class StepClock:
    """A clock that advances ``tick`` seconds each time it is read (one read per engine step)."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


class BrowserView(HTMLParser):
    """What PATCH_BUS_JS leaves in the page, modelled in Python: ``{pos: [class, title, text]}``."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens: dict[int, list[str]] = {}
        self._open: int | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "span" and "data-pos" in attrs:
            self._open = int(attrs["data-pos"])
            self.tokens[self._open] = [attrs.get("class", ""), attrs.get("title", ""), ""]

    def handle_data(self, data):
        if self._open is not None:
            self.tokens[self._open][2] += data

    def handle_endtag(self, tag):
        self._open = None

    def apply(self, patch: dict) -> None:
        if patch["reset"] is not None:
            self.tokens = {}
            self.feed(patch["reset"])
        self.feed(patch["append"])
        for pos, change in patch["update"].items():
            token = self.tokens[int(pos)]
            token[0] = change.get("cls", token[0])
            token[1] = change.get("title", token[1])


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("llama")


def _live(tiny, policy, run_input=QUESTION, tokens=24, pacer=None, cancel=None, channel=None):
    channel = channel or TokenChannel("t")
    settings = DecodeSettings(max_new_tokens=tokens, stop_at_eos=False)
    frames = live_frames(
        tiny,
        policy,
        run_input,
        settings,
        cancel or threading.Event(),
        channel,
        Projection.named("Qwen3-4B", 8),
        pacer or FramePacer(0.0),
    )
    return list(frames), channel


def test_live_streams_patches_that_append_then_ends_with_a_reset(tiny):
    frames, _ = _live(tiny, make_policy("h2o", budget=24, recent=4), tokens=24)
    assert len(frames) == 1 + 24 + 1  # the prompt, one frame per token (no pacing), the final frame
    first, *middle, last = frames
    assert first.message["patch"]["reset"] is not None and not first.done
    assert all(f.message["patch"]["reset"] is None for f in middle)
    assert [f.message["seq"] for f in frames] == list(range(1, len(frames) + 1))
    appended = [f.message["patch"]["append"].count("data-pos=") for f in middle]
    assert appended == [1] * 24  # each frame sends only its new token
    assert any(f.message["patch"]["update"] for f in middle)  # older tokens restyled as they are evicted
    for frame in frames:
        orjson.dumps(frame.message)  # what gr.JSON sends: string keys only
    assert last.done and last.message["patch"]["reset"].count("data-pos=") == len(last.record.texts)
    assert "tv-gone" in last.message["patch"]["reset"]  # budget 24 < prompt + 24 tokens: evictions shown
    assert last.figure.layout.height > 0 and len(last.figure.data) >= 3
    assert "tok/s" in last.stats and last.status.startswith("Done: 24 tokens generated")


def test_patches_rebuild_the_final_view_and_refresh_tooltips_every_few_seconds(tiny):
    clock = StepClock(0.5)  # read once per message: a message every 0.5 s
    channel = TokenChannel("t", title_refresh=2.0, clock=clock)
    frames, _ = _live(tiny, make_policy("h2o", budget=24, recent=4), tokens=16, channel=channel)
    browser = BrowserView()
    with_titles = []
    for frame in frames[:-1]:
        browser.apply(frame.message["patch"])
        with_titles.append(any("title" in c for c in frame.message["patch"]["update"].values()))
    final = BrowserView()
    final.apply(frames[-1].message["patch"])
    assert sorted(browser.tokens) == sorted(final.tokens)
    assert all(browser.tokens[p][0] == final.tokens[p][0] for p in final.tokens)  # classes always current
    assert all(browser.tokens[p][2] == final.tokens[p][2] for p in final.tokens)  # same text
    assert 2 <= sum(with_titles) <= 5  # tooltips refreshed about every 4th message, not every one
    assert not with_titles[1]


def test_live_frames_are_paced_whatever_the_token_rate(tiny):
    # 0.05 s per step against a 0.15 s frame interval: about one frame every three tokens
    frames, _ = _live(tiny, make_policy("window", budget=64), tokens=30, pacer=FramePacer(0.15, StepClock(0.05)))
    assert 8 <= len(frames) - 2 <= 12
    # skipped steps are not lost: each patch appends every token since the previous frame
    appended = sum(f.message["patch"]["append"].count("data-pos=") for f in frames[1:-1])
    prompt = frames[0].message["patch"]["reset"].count("data-pos=")
    assert prompt + appended == len(frames[-2].view.texts)
    assert frames[-1].message["patch"]["reset"].count("data-pos=") == len(frames[-1].record.texts)


def test_switching_mode_mid_run_resets_the_view_once(tiny):
    channel = TokenChannel("t")
    settings = DecodeSettings(max_new_tokens=6, stop_at_eos=False)
    frames = live_frames(
        tiny, make_policy("h2o", budget=64), QUESTION, settings, threading.Event(), channel, None, FramePacer(0.0)
    )
    seen = [next(frames), next(frames)]
    channel.set_mode("segments")
    seen += list(frames)
    resets = [f.message["patch"]["reset"] is not None for f in seen]
    assert resets == [True, False, True, False, False, False, False, True]
    assert "tv-mode-segments" in seen[2].message["patch"]["reset"]


def test_a_resync_requested_in_the_middle_of_a_message_takes_effect_on_the_next_one():
    # The browser's resync arrives on another thread at any moment; here it lands inside the
    # second message (the channel reads its clock mid-way), the worst possible time.
    channel = TokenChannel("t", title_refresh=0.0)
    reads = []
    channel.clock = lambda: (reads.append(1), len(reads) == 2 and channel.resync(), 0.0)[-1]
    views = [
        TokenData(["a", "b", "c", "d"][:n], np.arange(n, dtype=float)[::-1], np.ones(n), None, []) for n in (2, 3, 4)
    ]
    first, second, third = (channel.message(view) for view in views)
    assert first["patch"]["reset"] is not None
    assert second["patch"]["reset"] is None and second["patch"]["append"].count("data-pos=") == 1
    assert third["patch"]["reset"] is not None and third["patch"]["reset"].count("data-pos=") == 4


def test_stop_ends_the_run_with_a_final_frame(tiny):
    cancel = threading.Event()
    channel = TokenChannel("t")
    settings = DecodeSettings(max_new_tokens=200, stop_at_eos=False)
    frames = live_frames(
        tiny, make_policy("h2o", budget=64), QUESTION, settings, cancel, channel, None, FramePacer(0.0)
    )
    for i, frame in enumerate(frames):  # noqa: B007  (the last frame is read after the loop)
        if i == 3:
            cancel.set()
    assert frame.done and frame.record.summary["stopped"] == "cancelled"
    assert len(frame.record.events) < 10


def test_replay_mode_streams_the_trace(tiny):
    frames, _ = _live(tiny, make_policy("h2o", budget=32, interval=4, recent=4), TRACE)
    final = frames[-1]
    assert final.status.startswith("Done:") and "replayed" in final.status
    assert "The sum is 6." in final.record.generated_text
    view = final.message["patch"]["reset"]
    assert "<think>" not in view and "&lt;" in view  # tags shown as text, escaped
    assert {s["kind"] for s in final.record.segments} >= {"think", "answer"}


def test_empty_question_is_refused_before_anything_runs(tiny):
    with pytest.raises(RunInputError, match="question is empty"):
        _live(tiny, make_policy("h2o"), RunInput(None, "   "))


@pytest.mark.parametrize("run_input", [QUESTION, TRACE], ids=["generate", "replay"])
def test_compare_streams_three_columns_together_and_measures_fidelity(tiny, run_input):
    policies = [
        make_policy("window", budget=24, interval=4),
        make_policy("h2o", budget=24, interval=4, recent=4),
        make_policy("streaming", budget=24, interval=4),
    ]
    channels = [TokenChannel(f"c{i}") for i in range(6)]
    settings = DecodeSettings(max_new_tokens=20, stop_at_eos=False)
    frames = list(
        compare_frames(tiny, policies, run_input, settings, threading.Event(), channels, True, FramePacer(0.0))
    )
    assert len(frames) > 5
    for frame in frames:
        assert len(frame.messages) == len(frame.headers) == 3
        assert [m["target"] for m in frame.messages] == ["c0", "c1", "c2"]
    # the columns grow together: after each streaming frame their lengths differ by at most one step
    for frame in frames[1:-1]:
        lengths = [len(r.events) for r in frame.records.values()]
        assert max(lengths) - min(lengths) <= 1
    final = frames[-1]
    assert final.done and [row[0] for row in final.table] == ["window", "h2o", "streaming"]
    assert len(final.table[0]) == len(FIDELITY_COLUMNS)
    for row in final.table:
        nll, delta, kl, top1 = row[1:5]
        assert float(nll) > 0 and float(kl) >= 0 and top1.endswith("%")
    assert len(final.figure.data) == 4  # three policies + the full-cache curve


def test_compare_refuses_a_single_policy(tiny):
    with pytest.raises(RunInputError, match="between 2 and 6"):
        list(
            compare_frames(
                tiny,
                [make_policy("h2o")],
                QUESTION,
                DecodeSettings(max_new_tokens=2),
                threading.Event(),
                [TokenChannel("a")],
            )
        )


def test_explore_shows_any_step_of_a_finished_run(tiny):
    frames, _ = _live(tiny, make_policy("h2o", budget=24, recent=4), tokens=20)
    record = frames[-1].record
    early = explore_views.explore_view(record, 2, explore_views.AVERAGE, explore_views.AVERAGE, "evicted")
    late = explore_views.explore_view(record, 19, explore_views.AVERAGE, explore_views.AVERAGE, "evicted")
    assert early.tokens_html.count("data-pos=") == len(record.prompt_texts) + 3
    assert late.tokens_html.count("data-pos=") == len(record.texts)
    assert late.tokens_html.count("tv-gone") > early.tokens_html.count("tv-gone")
    assert early.segments["data"] and early.heatmap.data
    one = explore_views.explore_view(record, 19, "1", "0", "evicted")
    assert "layer 1, kv-head 0" in one.caption
    keep = explore_views.token_data_at(record, 19, 1, 0)[0].keep_fraction
    assert set(np.unique(keep)) <= {0.0, 1.0}  # one head: each token is either held or not
    with pytest.raises(ValueError, match="layer must be between"):
        explore_views.explore_view(record, 0, "99", explore_views.AVERAGE, "importance")
    with pytest.raises(ValueError, match="step 20 is outside this run: its steps go from 0 to 19"):
        explore_views.explore_view(record, 20, explore_views.AVERAGE, explore_views.AVERAGE, "evicted")
    snapped = explore_views.explore_view(record, 19, "1", "0", "evicted")
    assert f"Step **{record.events[snapped.step].step}**" in snapped.caption  # the step box is set to this one


def test_sweep_reports_progress_then_a_pareto_plot_and_a_table(tiny, tmp_path):
    from thinkviz.sweep.grid import parse_budgets
    from thinkviz.measure.replay import Trace
    from thinkviz.ui.sweep_run import TABLE_COLUMNS, export_sweep, sweep_frames

    trace = Trace("tiny", None, TRACE.question, TRACE.trace * 3)
    frames = list(sweep_frames(tiny, trace, ["window", "h2o"], parse_budgets("0.5,0.75"), 4, {"recent": 2}, poll=0.0))
    assert all(f.rows is None for f in frames[:-1]) and len(frames) >= 2
    final = frames[-1]
    assert [r["policy"] for r in final.rows] == ["full", "window", "window", "h2o", "h2o"]
    assert len(final.table) == 5 and len(final.table[0]) == len(TABLE_COLUMNS)
    assert final.figure.data  # one trace per policy + the front
    paths = export_sweep(final.rows, {"trace": "tiny"}, tmp_path)
    assert {"csv", "html", "json"} <= {p.rsplit(".", 1)[1] for p in paths}


def test_sweep_turns_a_bad_budget_into_a_message(tiny):
    from thinkviz.sweep.grid import Budget
    from thinkviz.measure.replay import Trace
    from thinkviz.ui.sweep_run import sweep_frames

    trace = Trace("tiny", None, TRACE.question, TRACE.trace)
    with pytest.raises(RunInputError, match="budget"):
        list(sweep_frames(tiny, trace, ["h2o"], [Budget(4, False)], 4, {}, poll=0.0))


def test_sweep_can_replay_only_the_first_trace_tokens(tiny):
    from thinkviz.sweep.grid import parse_budgets
    from thinkviz.measure.replay import Trace
    from thinkviz.ui.sweep_run import sweep_frames

    trace = Trace("tiny", None, TRACE.question, TRACE.trace * 3)
    rows = list(sweep_frames(tiny, trace, ["window"], parse_budgets("0.5"), 4, {}, max_trace_tokens=12, poll=0.0))[
        -1
    ].rows
    assert {r["trace_tokens"] for r in rows} == {12}


@pytest.mark.slow
def test_live_and_compare_replay_a_transcript_with_its_tool_turns(tiny):
    import json

    from thought_trace import MESSAGES

    transcript = RunInput(None, "", json.dumps([{"role": r, "content": c} for r, c in MESSAGES]))
    frames, _ = _live(tiny, make_policy("think_drop", budget=64, interval=4), transcript)
    final = frames[-1]
    assert "replayed" in final.status and "3 passed in 0.02s" in final.record.generated_text
    kinds = [s["kind"] for s in final.record.segments]
    assert kinds.count("tool") == 3 and kinds.count("user") == 2 and kinds.count("think") == 3
    assert "tv-seg-tool" in final.message["patch"]["reset"]
    policies = [make_policy("window", budget=64, interval=4), make_policy("think_drop", budget=64, interval=4)]
    channels = [TokenChannel(f"t{i}") for i in range(6)]
    compared = list(
        compare_frames(tiny, policies, transcript, DecodeSettings(), threading.Event(), channels, True, FramePacer(0.0))
    )[-1]
    assert compared.done and [row[0] for row in compared.table] == ["window", "think_drop"]
    for record in compared.records.values():
        assert sum(s["kind"] == "tool" for s in record.segments) == 3


def _dynts_with_a_predictor(tiny, folder, monkeypatch):
    """dynts on the tiny model, with a (random) predictor saved for it in ``folder``."""
    from thinkviz import predictor as P
    from thinkviz.policies.dynts import DynTS

    size = tiny.model.config.hidden_size
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(2)
        head = P.ImportancePredictor(size)
    P.save(
        head.eval(),
        P.PredictorMeta(model=tiny.name, hidden_size=size, width=head.width),
        P.predictor_path(tiny.name, folder),
    )
    monkeypatch.setattr(DynTS, "predictor_folder", folder)
    return make_policy("dynts", budget=32, interval=4, recent=4)


def test_a_dynts_replay_ends_with_the_attention_its_answer_paid_beside_the_predictions(tiny, tmp_path, monkeypatch):
    from thinkviz.measure.answer_attention import answer_start, attention_maps, from_answer
    from thinkviz.viz.tokens import render_tokens, token_view

    frames, _ = _live(tiny, _dynts_with_a_predictor(tiny, tmp_path, monkeypatch), TRACE)
    record = frames[-1].record
    assert "Attention from the answer measured." in frames[-1].status
    ids = list(record.prompt_ids) + [t for e in record.events for t in e.token_ids]
    start = answer_start(record.segments)
    assert "".join(record.texts[:start]).endswith("</think>")  # the answer begins after the last think block
    maps, _ = attention_maps(tiny, ids)
    assert np.allclose(record.summary["answer_attention"], from_answer(maps, start).numpy())
    view = token_view(record)
    assert np.isfinite(view.predicted).all()  # every token got its prediction as it was written
    assert np.isnan(view.answer_attention[start:]).all() and np.isfinite(view.answer_attention[:start]).all()
    heat = {mode: render_tokens(view, mode).count(" tv-h") for mode in ("importance", "predicted", "answer")}
    assert heat["predicted"] >= len(view.texts) - 1 and 0 < heat["answer"] <= start
    early = next(i for i, e in enumerate(record.events) if max(e.positions) + 1 <= start)  # before the answer
    assert token_view(record, early).answer_attention is None
    shown = explore_views.explore_view(record, early, explore_views.AVERAGE, explore_views.AVERAGE, "answer")
    assert "no attention from the answer here" in shown.caption
    assert explore_views.predicts_importance(record)
    late = explore_views.explore_view(
        record, len(record.events) - 1, explore_views.AVERAGE, explore_views.AVERAGE, "predicted"
    )
    assert "when it was written" in late.caption


def test_a_policy_without_predictions_records_no_answer_attention(tiny):
    frames, _ = _live(tiny, make_policy("h2o", budget=32, interval=4, recent=4), TRACE)
    record = frames[-1].record
    assert "answer_attention" not in record.summary and not explore_views.predicts_importance(record)
    assert "Attention from the answer" not in frames[-1].status


@pytest.mark.parametrize("run_input", [QUESTION, TRACE], ids=["generate", "replay"])
def test_compare_columns_in_kv_formats_are_measured_against_the_full_precision_cache(tiny_llama_d32, run_input):
    """h2o at full precision beside the full cache in 2-bit KIVI, with the full-precision full cache shown too."""
    policies = [
        make_policy("h2o", budget=24, interval=4, recent=4),
        make_policy("full", interval=4),
        make_policy("full", interval=4),
    ]
    formats = [KVQuant(), KVQuant("kivi2", 8), KVQuant()]
    channels = [TokenChannel(f"c{i}") for i in range(6)]
    settings = DecodeSettings(max_new_tokens=16, stop_at_eos=False)
    frames = list(
        compare_frames(
            tiny_llama_d32,
            policies,
            run_input,
            settings,
            threading.Event(),
            channels,
            True,
            FramePacer(0.0),
            kv_quants=formats,
        )
    )
    final = frames[-1]
    assert [row[0] for row in final.table] == ["h2o", "full · kivi2/r8", "full"]
    kl = [row[3] for row in final.table]
    assert float(kl[1]) > 0 and kl[2] == "0.0000"  # every token kept, at 2 bits: not the reference
    records = final.records
    assert records["full · kivi2/r8"].meta["kv_quant"]["format"] == "kivi2"
    assert records["full"].meta["kv_quant"]["format"] == "none"
    assert "KV format" in final.headers[1] and "KV format" not in final.headers[2]
    quantized, exact = records["full · kivi2/r8"].events[-1], records["full"].events[-1]
    g = records["full"].meta["geometry"]  # KIVI's bytes as stored: key groups of 32 beyond a window of 8
    stored = g["layers"] * KVQuant("kivi2", 8).layer_bytes(
        exact.kv_tokens, g["kv_heads"], g["head_dim"], g["dtype_bytes"]
    )
    assert quantized.kv_tokens == exact.kv_tokens and quantized.kv_bytes == stored < exact.kv_bytes


def test_compare_refuses_the_same_column_twice_but_not_one_policy_in_two_formats(tiny_llama_d32):
    policies = [make_policy("full"), make_policy("full")]
    with pytest.raises(RunInputError, match="compared once"):
        check_policies(policies, [KVQuant("q8_0"), KVQuant("q8_0")])
    check_policies(policies, [KVQuant(), KVQuant("q8_0")])


def test_live_run_in_a_kv_format_records_it_and_prices_its_budget(tiny_llama_d32):
    channel = TokenChannel("live")
    policy = make_policy("h2o", budget=24, recent=4)
    frames = list(
        live_frames(
            tiny_llama_d32,
            policy,
            QUESTION,
            DecodeSettings(max_new_tokens=8, stop_at_eos=False),
            threading.Event(),
            channel,
            None,
            FramePacer(0.0),
            kv_quant=KVQuant("kivi4", 8),
        )
    )
    final = frames[-1]
    assert final.record.meta["kv_quant"] == {"format": "kivi4", "bits": 4, "residual": 8}
    assert "KV format" in final.stats and "kivi4/r8" in final.stats
    names = [trace.name for trace in final.figure.data]
    assert "budget (24 tokens, kivi4/r8)" in names and "full cache (no eviction, full precision)" in names


def test_kv_settings_from_the_controls_are_checked_by_the_app_too():
    assert inputs.kv_quant("kivi2", 64.0) == KVQuant("kivi2", 64)
    with pytest.raises(RunInputError, match="unknown KV format 'q5_1'"):
        inputs.kv_quant("q5_1", 32)
    with pytest.raises(RunInputError, match="residual must be between 8 and 512 tokens, got 1000"):
        inputs.kv_quant("kivi4", 1000)
