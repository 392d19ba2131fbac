"""UI building blocks without a browser: pacing, policy controls, export, the model slot, inputs."""

from __future__ import annotations

import threading
import zipfile

import json

import numpy as np
import plotly.graph_objects as go
import pytest

from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.core.events import RecordingError
from thinkviz.models.loading import ModelLoadError
from thinkviz.policies import make_policy, policy_names, policy_params
from thinkviz.ui import controls, inputs
from thinkviz.export import export_figures, export_recording, import_recording
from thinkviz.ui.learn_cards import kv_format_card, learn_markdown, policy_card
from thinkviz.ui.model_slot import ModelSlot, ModelUnavailable
from thinkviz.measure.requests import RunInputError, decode_settings, run_input
from thinkviz.ui.stream import chart_frame
from thinkviz.ui.throttle import FIGURE_INTERVAL, FramePacer, chart_pacer
from tiny_models import tiny_model


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_pacer_lets_through_one_frame_per_interval_whatever_the_step_rate():
    clock = FakeClock()
    pacer = FramePacer(0.15, clock)
    due = []
    for _ in range(300):  # 300 steps at 100 steps/s = 3 s
        due.append(pacer.due())
        clock.now += 0.01
    assert due[0]
    assert sum(due) == 20  # 3 s / 0.15 s
    slow = FramePacer(0.15, clock)
    slow_due = []
    for _ in range(5):  # a step every second: every step is a frame
        slow_due.append(slow.due())
        clock.now += 1.0
    assert all(slow_due)


def test_charts_ride_the_bus_while_a_run_streams_and_set_the_plots_at_its_end():
    token = {"target": "view", "run": "r1", "seq": 3, "patch": {}}
    memory, curve = go.Figure(go.Scatter(x=[1], y=[2])), go.Figure(go.Scatter(x=[3], y=[4]))
    payload, plots = chart_frame([token], {"tv-memory": memory, "tv-curve": None}, False, "r1")
    messages = json.loads(payload)
    assert plots == [None, None]  # the gr.Plot values stay while it streams
    assert [m["chart"] for m in messages[:-1]] == ["tv-memory"] and messages[-1] == token  # the patch last
    sent = json.loads(messages[0]["figure"])
    assert sent["data"][0]["x"] == [1] and sent["layout"]["uirevision"] == "r1"  # the user's zoom stays
    payload, plots = chart_frame([token], {"tv-memory": memory, "tv-curve": curve}, True, "r2")
    undim = [{"chart": "tv-memory", "dim": False}, {"chart": "tv-curve", "dim": False}]
    assert json.loads(payload) == [*undim, token] and plots == [memory, curve]  # the last frame sets them
    assert memory.layout.uirevision == curve.layout.uirevision == "r2"  # unlike an identical earlier run's


def test_a_runs_first_frame_dims_the_charts_instead_of_drawing_them():
    token = {"target": "view", "run": "r1", "seq": 1, "patch": {"reset": ""}}
    payload, plots = chart_frame([token], {"tv-memory": None, "tv-curve": None}, False, "r1", first=True)
    assert json.loads(payload) == [{"chart": "tv-memory", "dim": True}, {"chart": "tv-curve", "dim": True}, token]
    assert plots == [None, None]
    payload, _ = chart_frame([token], {"tv-memory": None, "tv-curve": None}, False, "r1")
    assert json.loads(payload) == [token]  # a later frame with no chart due sends nothing for them


def test_the_chart_pacer_waits_an_interval_before_its_first_redraw():
    clock = FakeClock()
    pacer = chart_pacer(clock)
    due = []
    for _ in range(12):  # a step a second
        due.append(pacer.due())
        clock.now += 1.0
    assert not due[0] and due.count(True) == 12 // FIGURE_INTERVAL
    plain = FramePacer(FIGURE_INTERVAL, clock)
    assert plain.due() and not plain.due()  # without wait_first the first call is due


@pytest.mark.parametrize("name", policy_names())
def test_every_policy_round_trips_through_the_control_pool(name):
    specs = controls.slot_specs(name, controls.pool_sizes())
    numbers, flags, choices = specs
    own = controls.own_params(name)
    shown = [s.name for s in numbers + flags + choices if s is not None]
    assert sorted(shown) == sorted(p.name for p in own)
    for spec in numbers:
        if spec is not None:
            assert spec.low <= spec.value <= spec.high and spec.step > 0
    values = controls.collect_params(name, controls.Pools(*([s.value for s in pool if s] for pool in specs)))
    defaults = {p.name: p.default for p in policy_params(name) if p.name in values}
    assert values == defaults
    policy = controls.build_policy(name, values, budget=512, interval=4, protect_system=True, protect_question=False)
    assert policy.budget == 512 and policy.interval == 4 and policy.config["protect_question"] is False


def test_controls_report_bad_values_in_words():
    with pytest.raises(controls.ControlError, match="budget"):
        controls.build_policy("h2o", {"recent": 32}, budget=16, interval=1, protect_system=True, protect_question=True)
    with pytest.raises(controls.ControlError, match="whole number"):
        controls.build_policy("h2o", {}, budget="lots", interval=1, protect_system=True, protect_question=True)
    with pytest.raises(controls.ControlError, match="unknown policy"):
        controls.build_policy("nope", {}, budget=64, interval=1, protect_system=True, protect_question=True)


def test_preset_values_overrides_defaults_in_the_slots():
    numbers, _, _ = controls.slot_specs("h2o", controls.pool_sizes(), {"recent": 7, "budget": 99})
    assert [s.value for s in numbers if s is not None] == [7]


def test_learn_tab_names_every_policy_with_its_source_and_parameters():
    text = learn_markdown()
    for name in policy_names():
        assert f"### `{name}`" in text
        card = policy_card(name)
        assert make_policy(name).source.split()[0] in card
        for param in controls.own_params(name):
            assert f"`{param.name}`" in card
    assert "<think>" not in text  # tags are shown escaped, never as markup


def test_learn_tab_has_a_card_for_every_kv_format_with_its_bits_and_source():
    text = learn_markdown()
    assert "## How the KV cache can be stored" in text
    for name, bits, source in [
        ("none", "16", "—"),
        ("q8_0", "8.5", "GGML_TYPE_Q8_0"),
        ("q4_0", "4.5", "GGML_TYPE_Q4_0"),
        ("kivi2", "3.06", "arXiv:2402.02750"),
        ("kivi4", "5.06", "arXiv:2402.02750"),
    ]:
        card = kv_format_card(name)
        assert card in text and f"**Bits per value.** {bits} (of 16)" in card and source in card


@pytest.fixture(scope="module")
def record():
    run = Run(
        tiny_model("llama"),
        make_policy("h2o", budget=12, recent=2),
        list(range(100, 120)),
        DecodeSettings(max_new_tokens=8, stop_at_eos=False),
    )
    list(run.generate())
    return run.record


def test_recording_exports_as_one_zip_and_loads_back(record, tmp_path):
    archive = export_recording(record, tmp_path)
    with zipfile.ZipFile(archive) as zf:
        assert sorted(n.rsplit(".", 1)[1] for n in zf.namelist()) == ["json", "npz"]
    loaded = import_recording([archive])
    assert loaded.token_ids == record.token_ids
    np.testing.assert_array_equal(loaded.events[-1].keep_fraction, record.events[-1].keep_fraction)
    pair = import_recording([tmp_path / f"{archive.stem}.json", tmp_path / f"{archive.stem}.npz"])
    assert pair.texts == record.texts


def test_bad_uploads_get_a_clear_message(record, tmp_path):
    junk = tmp_path / "junk.zip"
    junk.write_bytes(b"not a zip")
    with pytest.raises(RecordingError, match="not a zip"):
        import_recording([junk])
    lonely = tmp_path / "only.json"
    lonely.write_text("{}")
    with pytest.raises(RecordingError, match="expected one .zip"):
        import_recording([lonely])
    with pytest.raises(RecordingError, match="choose a recording"):
        import_recording([])


def test_figures_export_as_one_offline_page(tmp_path):
    import plotly.graph_objects as go

    page = export_figures({"a <b>": go.Figure(go.Scatter(y=[1, 2])), "skipped": None}, tmp_path)
    text = page.read_text()
    assert "a &lt;b&gt;" in text and text.count("<section>") == 1
    assert "plotly.js" in text or "Plotly" in text  # inlined, no CDN needed
    with pytest.raises(ValueError):
        export_figures({}, tmp_path)


def test_model_slot_reports_progress_then_lends_the_model(tiny_llama):
    release = threading.Event()

    def loader(name, quantization, device, progress):
        progress(0.5, "halfway")
        release.wait(5)
        return tiny_llama

    slot = ModelSlot(loader=loader)
    slot.start("tiny", "none")
    seen = []
    for status in slot.watch(poll=0.01):
        seen.append(status)
        if status.message == "halfway":
            assert 0 < status.fraction < 1 and not status.done
            release.set()
    assert seen[-1].ready and "halfway" in [s.message for s in seen]
    with slot.use() as loaded:
        assert loaded is tiny_llama


def test_model_slot_turns_a_failed_load_into_a_message():
    def loader(name, quantization, device, progress):
        raise ModelLoadError("no such model")

    slot = ModelSlot(loader=loader)
    slot.start("missing/model", "4bit")
    assert slot.wait(5).error == "no such model"
    with pytest.raises(ModelUnavailable, match="no such model"):
        with slot.use():
            pass


def test_inputs_refuse_empty_and_mismatched_requests():
    with pytest.raises(RunInputError, match="needs a trace"):
        run_input("replay", None, "q", "  ")
    with pytest.raises(RunInputError, match="max_new_tokens"):
        decode_settings(0, 0.0)
    with pytest.raises(RunInputError, match="projection"):
        inputs.projection("Qwen3-4B", -1)
    assert inputs.projection(inputs.NO_PROJECTION, 8) is None
    request = run_input("generate", "  ", "Why?", "ignored")
    assert request.system is None and request.trace is None


def test_every_preset_fills_the_controls():
    for _, name in inputs.preset_choices():
        choice = inputs.choose_preset(name)
        assert choice.preset.question.strip()
        assert (choice.trace != "") == (choice.preset.mode == "replay")


def test_a_failed_switch_keeps_the_previous_model(tiny_llama):
    def loader(name, quantization, device, progress):
        if name == "broken":
            raise ModelLoadError("not a model folder")
        return tiny_llama

    slot = ModelSlot(loader=loader)
    slot.start("tiny", "none")
    assert slot.wait(5).ready
    slot.start("broken", "4bit")
    status = slot.wait(5)
    assert status.ready and "not a model folder" in status.note
    with slot.use() as loaded:
        assert loaded is tiny_llama


def test_app_binds_localhost_without_a_share_link_by_default():
    import app

    args = app.parse_args([])
    assert (args.host, args.share, args.model, args.quant) == ("127.0.0.1", False, "embedded", "4bit")
    with pytest.raises(SystemExit):
        app.parse_args(["--port", "70000"])


def test_a_new_page_does_not_replace_the_model_chosen_in_settings(tiny_llama):
    asked = []

    def loader(name, quantization, device, progress):
        asked.append(name)
        if name == "broken":
            raise ModelLoadError("nope")
        return tiny_llama

    slot = ModelSlot(loader=loader)
    slot.start_once("embedded", "4bit")
    slot.wait(5)
    slot.start("other", "none")
    slot.wait(5)
    slot.start_once("embedded", "4bit")  # what every new page does
    slot.start("broken", "4bit")
    slot.wait(5)
    slot.start("other", "none")  # still the model in use: nothing to load
    assert asked == ["embedded", "other", "broken"]
    assert (slot.status.name, slot.status.ready) == ("other", True)


def test_a_transcript_in_the_trace_box_replays_as_a_conversation(tiny_llama):
    from thinkviz.measure.replay import load_trace, prepare
    from thinkviz.measure.requests import RunInput
    from thinkviz.measure.requests import prepare as prepare_input

    loaded = tiny_model("llama", max_context=8192)
    choice = inputs.choose_preset("think_drop_syntax_error")
    prompt, ids = prepare_input(loaded, run_input("replay", choice.system, choice.preset.question, choice.trace))
    want_prompt, want_ids = prepare(loaded, load_trace("think_drop_syntax_error"))
    assert (prompt.ids, ids, prompt.roles) == (want_prompt.ids, want_ids, want_prompt.roles)
    standalone = "SYSTEM: Be brief.\nUSER: Add 2 and 3.\nASSISTANT: <think>\n2 + 3 = 5\n</think>\n5\nTOOL: ok"
    prompt, ids = prepare_input(tiny_llama, RunInput(None, "", standalone))  # its own question: the box may be empty
    assert [r.role for r in prompt.roles] == ["system", "user", "assistant", "tool"]
    with pytest.raises(RunInputError, match="question is empty"):
        prepare_input(tiny_llama, RunInput(None, " ", "ASSISTANT: hi"))
    with pytest.raises(RunInputError, match="unknown role 'bot'"):
        prepare_input(tiny_llama, RunInput(None, "q", '[{"role": "bot", "content": "x"}]'))


def test_uploads_and_the_turn_preview_of_the_replay_panel(tmp_path):
    import json

    from thought_trace import MESSAGES

    path = tmp_path / "agent.jsonl"
    path.write_text("\n".join(json.dumps({"role": r, "content": c}) for r, c in MESSAGES), encoding="utf-8")
    text = inputs.read_upload(str(path))
    assert text.startswith('{"role": "system"')
    loaded = tiny_model("llama")
    caption, rows = inputs.trace_preview(loaded, "replay", None, "", text)
    assert [r[1] for r in rows] == [role for role, _ in MESSAGES]
    assert caption.startswith(f"{len(MESSAGES)} turns (a transcript):") and "3 think blocks" in caption
    assert all(isinstance(r[2], int) for r in rows) and rows[3][4].startswith("F.")
    caption, rows = inputs.trace_preview(None, "replay", "S", "Why?", "<think>\nhm\n</think>\nBecause.")
    assert [r[1] for r in rows] == ["system", "user", "assistant"] and "once the model is loaded" in caption
    assert inputs.trace_preview(loaded, "generate", None, "q", text) == ("", [])
    caption, rows = inputs.trace_preview(loaded, "replay", None, "q", '[{"role": "bot", "content": "x"}]')
    assert rows == [] and "Cannot replay this" in caption and "unknown role 'bot'" in caption
    for content, reason in [(b"\x00\x01", "binary"), ("\u00e9t\u00e9".encode("latin-1"), "not UTF-8"), (b"", "empty")]:
        bad = tmp_path / "bad.json"
        bad.write_bytes(content)
        with pytest.raises(RunInputError, match=f"the uploaded file bad.json is .*{reason}"):
            inputs.read_upload(str(bad))
    with pytest.raises(RunInputError, match="No file"):
        inputs.read_upload(None)
