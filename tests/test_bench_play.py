"""``bench browser --play PRESET`` checks the preset and its recording before it starts an app or a browser."""

from __future__ import annotations

import pytest

from thinkviz.demos import recordings
from thinkviz.bench.browser import busy_until
from thinkviz.cli import main


@pytest.mark.parametrize(
    "preset, reason",
    [
        ("nosuch", "--play: unknown preset 'nosuch'"),
        ("generate_muffins", "--play: preset 'generate_muffins' has no recording yet"),
    ],
)
def test_play_needs_a_preset_with_a_current_recording(preset, reason, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(recordings, "RECORDINGS_DIR", tmp_path)  # a checkout with no recording
    assert main(["bench", "browser", "--play", preset]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and reason in lines[0]


def test_lesson_needs_a_lesson_that_exists(capsys):
    assert main(["bench", "browser", "--lesson", "nosuch"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--lesson: unknown lesson 'nosuch'" in lines[0]


def test_lesson_needs_at_least_one_link(capsys):
    assert main(["bench", "browser", "--lesson", "kv_cache_basics", "--links", "0"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--links must be at least 1, got 0" in lines[0]


@pytest.mark.parametrize(
    "tasks, end",
    [
        ([], 0.0),
        ([[100, 400], [500, 900]], 900.0),  # one stretch of loading
        ([[500, 900], [100, 400], [3000, 3100]], 900.0),  # a timer's task after a quiet 2.1 s is not loading
        ([[100, 400], [300, 1200], [2600, 2700]], 2700.0),  # overlapping tasks, then a gap of only 1.4 s
    ],
)
def test_a_pages_loading_ends_at_its_first_quiet_gap(tasks, end):
    assert busy_until(tasks) == end
