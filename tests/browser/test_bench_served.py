"""``bench soak`` and ``bench load --mixed`` against ``app.py`` serving a tiny model from a local folder,
and ``bench load --url`` against an app already running (served in this process).

They run to completion with small N and K; what they measure stays in their output (the
test checks the report is there, never its numbers).
"""

from __future__ import annotations

import pytest

from thinkviz.cli import main
from tiny_app import served_app

pytestmark = pytest.mark.browser


def test_bench_soak_reports_memory_across_sessions(tiny_folder, capsys):
    code = main(
        [
            "bench",
            "soak",
            "--model",
            tiny_folder,
            "--quant",
            "none",
            "--sessions",
            "2",
            "--runs",
            "2",
            "--trace-tokens",
            "48",
            "--interval",
            "8",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "2 sessions × 2 replays of 48 trace tokens" in out.out
    for row in (
        "server RSS at start",
        "after 5 sessions",
        "at the end (2 sessions)",
        "peak",
        "growth per finished session",
    ):
        assert f"| {row}" in out.out
    assert "session 2/2" in out.err


def test_bench_load_runs_every_client_to_its_own_result(capsys):
    """At ``--url`` (the app ``--mixed`` and the soak start themselves: the same launch)."""
    with served_app() as url:
        code = main(["bench", "load", "--url", url, "--clients", "3", "--trace-tokens", "40"])
    out = capsys.readouterr()
    assert code == 0, out.err
    rows = [line for line in out.out.splitlines() if line.startswith("| ") and line.endswith(" | yes |")]
    assert [row.split(" | ")[0] for row in rows] == ["| 0", "| 1", "| 2"]
    assert "queue wait: median" in out.out and "for 3 runs" in out.out


def test_bench_load_mixed_reports_first_frames_waits_and_memory(tiny_folder, capsys):
    """``--mixed`` is ``--playback`` with live replays among the clients: one served app checks both."""
    tiny = ["--model", tiny_folder, "--quant", "none", "--trace-tokens", "40"]
    code = main(["bench", "load", *tiny, "--clients", "3", "--mixed", "--live", "2", "--play", "generate_muffins"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "3 concurrent playbacks at 4× of generate_muffins" in out.out and "with 2 live replays" in out.out
    assert "| 3 |" in out.out and "| 3/3 |" in out.out  # every client played its own recording
    assert "server RSS: before" in out.out
    rows = [line for line in out.out.splitlines() if line.startswith("| ") and line.endswith(" | yes |")]
    assert [row.split(" | ")[0] for row in rows] == ["| 0", "| 1"]
    assert "live runs started in arrival order: yes" in out.out


def test_bench_load_playback_on_a_running_app_plays_each_clients_own_recording(capsys):
    """``--playback`` alone, at ``--url``: no process id, so no memory line and no wait for released sessions."""
    with served_app() as url:
        code = main(["bench", "load", "--url", url, "--clients", "3", "--playback", "--play", "generate_muffins"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "3 concurrent playbacks at 4× of generate_muffins" in out.out and "live replays" not in out.out
    assert "| 3 |" in out.out and "| 3/3 |" in out.out  # every client played its own recording
    assert "server RSS" not in out.out


def test_bench_soak_with_url_needs_the_process_id(capsys):
    assert main(["bench", "soak", "--url", "http://127.0.0.1:9/"]) == 2
    assert "--pid" in capsys.readouterr().err
