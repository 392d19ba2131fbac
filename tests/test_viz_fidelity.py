"""Per-token fidelity curves: the renderer on constructed values, and Compare drawing them from a replay."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from thinkviz.core.engine import DecodeSettings
from thinkviz.measure.metrics import TokenFidelity
from thinkviz.policies import make_policy
from thinkviz.ui.compare_run import FIDELITY_COLUMNS, compare_frames
from thinkviz.measure.requests import RunInput
from thinkviz.ui.stream import TokenChannel
from thinkviz.ui.throttle import FramePacer
from thinkviz.viz.fidelity import fidelity_figure, smoothed
from thinkviz.viz.tokens import segment_colour
from tiny_models import tiny_model

TRACE = RunInput(
    system=None,
    question="Sum the list.",
    trace="<think>\nFirst add 1 and 2.\n\nThen add 3.\n</think>\n\nThe sum is 6.\n",
)


def fidelity(positions, delta, kl) -> TokenFidelity:
    n = len(positions)
    nll_full = np.full(n, 2.0, dtype=np.float32)
    return TokenFidelity(
        np.asarray(positions),
        nll_full + np.asarray(delta, np.float32),
        nll_full,
        np.asarray(kl, np.float32),
        np.ones(n, bool),
    )


def test_smoothing_is_a_centred_mean_that_keeps_a_lasting_jump():
    np.testing.assert_allclose(smoothed(np.array([0.0, 0, 3, 0, 0]), 3), [0, 1, 1, 1, 0])
    step = np.r_[np.zeros(100), np.ones(100)]
    curve = smoothed(step, 32)
    assert curve[:80].max() == 0 and curve[120:].min() == 1  # the jump stays visible where it lasts
    np.testing.assert_allclose(smoothed(step, 1), step)


def test_the_figure_draws_each_policy_in_both_panels_over_segment_bands():
    positions = np.arange(100, 300)
    jump = np.where(positions >= 200, 1.0, 0.0)
    curves = {"window": fidelity(positions, jump, jump / 2), "streaming": fidelity(positions, 0 * jump, 0 * jump)}
    spans = [
        {"kind": "think", "index": 0, "start": 90, "end": 180},
        {"kind": "answer", "index": 0, "start": 250, "end": 400},
        {"kind": "system", "index": 0, "start": 0, "end": 50},
    ]  # before the curves: no band
    texts = [f"t{i}" for i in range(400)]
    fig = fidelity_figure(curves, spans, window=8, texts=texts)
    assert [(t.name, t.yaxis) for t in fig.data] == [
        ("window", "y"),
        ("window", "y2"),
        ("streaming", "y"),
        ("streaming", "y2"),
    ]
    window_nll = fig.data[0]
    assert window_nll.y[0] == 0 and window_nll.y[-1] == pytest.approx(1.0)
    assert fig.data[1].y[-1] == pytest.approx(0.5)  # KL in the second panel
    assert list(window_nll.customdata[:2]) == ["t100", "t101"]
    bands = [(s.x0, s.x1, s.fillcolor) for s in fig.layout.shapes if s.type == "rect"]
    assert (99.5, 179.5, segment_colour("think", 0)) in bands and (249.5, 299.5, segment_colour("answer")) in bands
    assert len(bands) == 4  # two spans in two panels; the system prompt lies before the curves
    labels = [a.text for a in fig.layout.annotations]
    assert {"think 1", "answer"} <= set(labels) and labels.count("think 1") == 1 and "new text" not in labels


def test_the_figure_is_cheap_to_redraw_while_a_run_streams():
    fig = fidelity_figure({"window": fidelity(np.arange(10), np.zeros(10), np.zeros(10))})
    assert fig.layout.xaxis.ticklabeloverflow == fig.layout.yaxis2.ticklabeloverflow == "allow"
    assert not fig.layout.template.data.heatmap  # only the scatter defaults of the default template


def test_compare_draws_per_token_curves_and_leaves_divergence_out_of_a_replay():
    tiny = tiny_model("llama")
    policies = [
        make_policy("full", interval=4),
        make_policy("window", budget=24, interval=4),
        make_policy("h2o", budget=24, interval=4, recent=4),
    ]
    channels = [TokenChannel(f"c{i}") for i in range(3)]
    final = list(
        compare_frames(tiny, policies, TRACE, DecodeSettings(), threading.Event(), channels, True, FramePacer(0.0))
    )[-1]
    assert final.done and final.fidelity is not None
    assert {t.name for t in final.fidelity.data} == {"window", "h2o"}  # the full cache against itself is all zero
    # each policy has one colour and dash: in both fidelity panels and in the memory chart
    memory = {t.name: (t.line.color, t.line.dash) for t in final.figure.data if t.name != "full cache"}
    assert len(set(memory.values())) == 3
    for trace in final.fidelity.data:
        assert (trace.line.color, trace.line.dash) == memory[trace.name]
    assert len(final.table[0]) == len(FIDELITY_COLUMNS)
    shown = final.shown_table
    assert "diverges at step" not in shown["headers"] and len(shown["data"][0]) == len(FIDELITY_COLUMNS) - 1
    assert shown["headers"][0] == "policy" and "ΔNLL vs full" in shown["headers"]
    question = RunInput(system="Think step by step.", question="What is 2 + 3?")
    generated = list(
        compare_frames(
            tiny,
            policies,
            question,
            DecodeSettings(max_new_tokens=8, stop_at_eos=False),
            threading.Event(),
            channels,
            True,
            FramePacer(0.0),
        )
    )[-1]
    assert "diverges at step" in generated.shown_table["headers"] and generated.fidelity is not None
