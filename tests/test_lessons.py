"""Lessons (#39): the shipped lessons resolve against the committed recordings, and ``lesson check``
names every broken step in one line (a missing or stale recording, a moment not found, a number that
does not resolve or is typed by hand).  Recordings are read from disk; no model is needed."""

from __future__ import annotations

import copy
import json
import shutil
import textwrap

import numpy as np
import pytest

from thinkviz.cli import main
from thinkviz.demos import lesson_facts, lessons, recordings
from thinkviz.demos.record import load_preset_recording
from thinkviz.ui import lesson_views
from thinkviz.viz.tokens import MODES, PREDICTION_MODES

SHIPPED = ("kv_cache_basics", "thinking_under_a_budget")


def _lesson(tmp_path, steps: str, name: str = "broken"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(f'title: "A broken lesson"\nsteps:\n{textwrap.indent(textwrap.dedent(steps), "  ")}')
    return path


def _check(capsys, *args: str) -> tuple[int, list[str]]:
    code = main(["lesson", "check", *args])
    return code, capsys.readouterr().out.splitlines()


def test_the_shipped_lessons_check_clean_and_are_listed(capsys):
    code, lines = _check(capsys)
    assert code == 0, lines
    assert lines == ["2 lessons, 16 steps: every step resolves"]
    assert main(["lesson", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in listed] == list(SHIPPED)
    assert listed[0]["title"] == "What the KV cache is and why it runs out"
    assert listed[1]["title"] == "Thinking under a budget"
    assert all(6 <= row["steps"] <= 10 for row in listed)


def test_a_broken_lesson_gets_one_line_per_problem(tmp_path, capsys):
    path = _lesson(
        tmp_path,
        """
        - recording: no_such_preset
          narration: "Nothing here."
        - recording: math_h2o_vs_window
          frame: first evicton
          narration: "A typo in the moment."
        - recording: math_h2o_vs_window
          run: full
          frame: first eviction
          narration: "The full cache never evicts."
        - recording: math_h2o_vs_window
          run: window
          narration: "Window keeps 512 tokens."
        - recording: math_h2o_vs_window
          run: window
          narration: "Its ΔNLL is {delta_nll@nosuch} and {wobble}."
        - recording: math_h2o_vs_window
          run: window
          frame: 9999
          narration: "Past the end."
        - recording: math_h2o_vs_window
          run: window
          narration: "Fine: {budget} tokens, ΔNLL {delta_nll}, h2o {delta_nll@h2o}."
        """,
    )
    code, lines = _check(capsys, str(path))
    assert code == 1
    assert lines == [
        "broken step 1: recording 'no_such_preset' names no preset (or a .zip of the lesson's own)",
        "broken step 2: unknown moment 'first evicton'; use a step number or one of: "
        + ", ".join(lesson_facts.MOMENTS),
        "broken step 3: moment 'first eviction' is not found in run 'full' of math_h2o_vs_window",
        "broken step 4: narration types the number 512 by hand; read it from the recording with a placeholder",
        "broken step 5: {delta_nll@nosuch} does not resolve: no run 'nosuch' in math_h2o_vs_window "
        "(its runs: full, window, h2o)",
        "broken step 6: frame 9999 is outside run 'window': its steps go from 0 to 139",
    ]


def test_a_missing_and_a_stale_recording_are_named(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "recordings"
    folder.mkdir()
    shutil.copy(recordings.recording_path("tam_math"), folder / "math_h2o_vs_window.zip")  # another preset's
    monkeypatch.setattr(recordings, "RECORDINGS_DIR", folder)
    path = _lesson(
        tmp_path,
        """
        - recording: math_h2o_vs_window
          narration: "Recorded for another preset."
        - recording: sinks_window_vs_streaming
          narration: "Not recorded at all."
        """,
    )
    code, lines = _check(capsys, str(path))
    assert code == 1
    assert len(lines) == 2
    assert lines[0].startswith("broken step 1: the recording of preset 'tam_math' is stale (")
    assert lines[0].endswith("record it again: python -m thinkviz presets record tam_math")
    assert lines[1] == (
        "broken step 2: preset 'sinks_window_vs_streaming' has no recording yet "
        "(python -m thinkviz presets record sinks_window_vs_streaming)"
    )


def test_a_re_recorded_preset_changes_the_narration_not_the_file(tmp_path):
    """The numbers are read from the recording: change the data and the same text says the new number."""
    path = _lesson(
        tmp_path,
        """
        - recording: math_h2o_vs_window
          run: window
          frame: end
          narration: "Window holds {kv_tokens} tokens of {tokens}, budget {budget}."
        """,
        name="numbers",
    )
    spec = lessons.load_lesson(path).steps[0]
    step = lessons.resolve_step(spec)
    event = step.run.record.events[-1]
    seen = len(step.run.record.prompt_ids) + sum(len(e.token_ids) for e in step.run.record.events)
    assert step.narration == f"Window holds {event.kv_tokens:,} tokens of {seen:,}, budget 512."
    event.kv_tokens += 7  # as a new recording would hold it (the recording is restored below)
    try:
        assert (
            lessons.fill(spec, step.run, step.frame)
            == f"Window holds {event.kv_tokens:,} tokens of {seen:,}, budget 512."
        )
    finally:
        event.kv_tokens -= 7


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("title: x\nsteps: []\n", "'steps' must be a non-empty list"),
        ("title: x\nsteps:\n  - recording: a\n    narration: b\n    tabs: live\n", "unknown key(s) tabs"),
        ("title: x\nsteps:\n  - recording: a\n    narration: b\n    chart: pie\n", "chart 'pie' is not one of"),
        ("title: x\nsteps:\n  - recording: a\n    narration: b\n    card: {model: nope, gb: 3}\n", "card: unknown"),
    ],
)
def test_a_malformed_lesson_is_a_one_line_cli_error(tmp_path, capsys, text, problem):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["lesson", "check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("thinkviz: error: lesson bad.yaml") and problem in err and "\n" not in err


def test_the_lesson_modes_are_the_token_views():
    assert set(lessons.MODES) == set(MODES) | set(PREDICTION_MODES)


def test_divergence_in_a_generation_is_the_first_token_written_differently():
    recording = copy.deepcopy(load_preset_recording("generate_muffins"))  # its runs all write the same answer
    labels = lesson_facts.run_labels(recording)
    run = lesson_facts.RunAt(recording, labels.index("window"), "window")
    assert lesson_facts.divergence_position(run) is None
    with pytest.raises(lesson_facts.FactError, match="'divergence from the full cache' is not found in run 'window'"):
        lesson_facts.moment_frame(run, "divergence from the full cache")
    event = run.record.events[20]
    event.token_ids = [event.token_ids[0] + 1, *event.token_ids[1:]]  # the run writes one token differently
    position = lesson_facts.divergence_position(run)
    full = recording.records[recording.reference]
    assert run.record.token_ids[:position] == full.token_ids[:position]
    assert run.record.token_ids[position] != full.token_ids[position]
    assert lesson_facts.moment_frame(run, "divergence from the full cache") == 20


def test_divergence_in_a_replay_is_the_first_changed_top_choice_after_the_first_eviction():
    recording = load_preset_recording("math_h2o_vs_window")
    run = lesson_facts.RunAt(recording, lesson_facts.run_labels(recording).index("window"), "window")
    position = lesson_facts.divergence_position(run)
    fidelity, evicts = run.fidelity(), lesson_facts.first_eviction(run)
    after = fidelity.positions >= run.seen()[evicts - 1]
    assert not fidelity.top1[fidelity.positions == position].any()
    assert fidelity.top1[after & (fidelity.positions < position)].all()


def test_out_of_memory_is_where_the_priced_full_cache_outgrows_the_card():
    step = lessons.built_steps(lessons.load_lesson("kv_cache_basics"))[2]
    run, frame = step.run, step.frame
    seen = run.seen()
    room = run.projection.max_tokens
    assert seen[frame] > room and (frame == 0 or seen[frame - 1] <= room)
    assert f"room for {room:,} tokens" in step.narration and f"at token {seen[frame]:,}" in step.narration


def test_every_shipped_step_draws_one_view_with_its_narration_and_marks():
    for name in SHIPPED:
        lesson = lessons.load_lesson(name)
        for index, step in enumerate(lessons.built_steps(lesson)):
            view = lesson_views.lesson_view(lesson, index)
            assert view.problem is None and view.narration == step.narration
            assert view.indicator == f"{index + 1} / {len(lesson.steps)}"
            assert (view.tokens is None) != (view.figure is None)  # one view
            if view.tokens is not None and step.highlight:
                marked = {int(p) for p in _marked_positions(view.tokens)}
                assert marked == set(step.highlight)


def _marked_positions(tokens_html: str) -> list[str]:
    import re

    return re.findall(rf'class="[^"]*{lesson_views.MARK_CLASS}[^"]*" data-pos="(\d+)"', tokens_html)


def test_the_evicted_highlight_is_what_left_the_cache_at_the_first_eviction():
    step = lessons.built_steps(lessons.load_lesson("kv_cache_basics"))[4]
    keep = np.asarray(step.run.record.events[step.frame].keep_fraction)
    assert step.highlight == tuple(int(p) for p in np.flatnonzero(keep == 0))
    assert step.highlight and not (np.asarray(step.run.record.events[step.frame - 1].keep_fraction) == 0).any()


def test_a_step_number_from_a_link_is_clamped_to_the_lesson():
    lesson = lessons.load_lesson("kv_cache_basics")
    assert [lesson_views.step_index(lesson, s) for s in ("3", 0, 99, "x", None)] == [2, 0, 7, 0, 0]


def test_the_lessons_readme_names_every_moment_and_placeholder():
    text = (lessons.LESSONS_DIR / "README.md").read_text(encoding="utf-8")
    assert all(f"`{moment}`" in text for moment in lesson_facts.MOMENTS if moment not in ("start", "end"))
    assert all(f"`{{{name}}}`" in text for name in lesson_facts.QUANTITIES)
    assert all(f"`{{{prefix}NAME}}`" in text for prefix in lesson_facts.PREFIXED)


def test_a_link_or_the_picker_opens_lessons_by_name_only(tmp_path):
    path = _lesson(tmp_path, "- recording: math_h2o_vs_window\n  narration: x\n", name="elsewhere")
    assert lessons.load_lesson(path).name == "elsewhere"  # the CLI may check a file by its path
    for name in (str(path), "../lessons/kv_cache_basics", ""):
        with pytest.raises(lessons.LessonError, match="unknown lesson"):
            lessons.named_lesson(name)
    assert lessons.named_lesson("kv_cache_basics").title == "What the KV cache is and why it runs out"


def test_the_warm_up_builds_every_lesson_once_in_the_background():
    lessons.warm_up()
    lessons.warm_up()  # once per process
    assert len(lessons._WARMING) == 1
    lessons._WARMING[0].join(timeout=120)
    for name in SHIPPED:
        lesson = lessons.load_lesson(name)
        stat = lesson.path.stat()
        assert (str(lesson.path), stat.st_mtime_ns, stat.st_size) in lessons._BUILT


def test_a_step_draws_from_a_recording_of_the_lessons_own(tmp_path, capsys):
    shutil.copy(recordings.recording_path("tam_math"), tmp_path / "my_run.zip")  # any recording, no preset's name
    path = _lesson(
        tmp_path,
        """
        - recording: my_run.zip
          frame: end
          narration: "After {tokens} tokens the cache holds {full_kv_mib} MiB."
        - recording: gone.zip
          narration: "Not beside the lesson."
        """,
        name="own",
    )
    step = lessons.resolve_step(lessons.load_lesson(path).steps[0])
    assert step.run.recording.preset == load_preset_recording("tam_math").preset
    assert "{" not in step.narration and any(ch.isdigit() for ch in step.narration)
    code, lines = _check(capsys, str(path))
    assert code == 1 and lines == ["own step 2: recording gone.zip does not exist"]
    elsewhere = _lesson(tmp_path, '- recording: ../x.zip\n  narration: "A path."', name="path")
    with pytest.raises(lessons.LessonError, match="a file name beside it, not a path"):
        lessons.load_lesson(elsewhere)


def test_opening_the_tab_draws_its_step_only_when_none_is_shown():
    import gradio as gr

    from thinkviz.ui.tabs import lessons as lessons_tab

    with gr.Blocks():
        tab = lessons_tab.lessons_tab()
    name = lessons.list_lessons()[0]
    assert isinstance(lessons_tab.entered(tab, name, 1, '<span role="status">3 / 8</span>'), type(gr.skip()))
    drawn = lessons_tab.entered(tab, name, 2, "")
    assert drawn[tab.step] == 2 and "2 / " in drawn[tab.indicator]
