"""``bench browser --tune`` checks its arguments before it starts an app or a browser, and runs
end to end against the app it starts itself (no ``--url``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cli_run import run_cli
from tiny_models import save_tiny_model


@pytest.mark.parametrize(
    "args, reason",
    [
        (["--tune-vary", "nope=1"], "--tune-vary: no selected policy takes parameter nope"),
        (["--tune-vary", "recent=x"], "--tune-vary: recent must be an integer, got 'x'"),
        (["--tune-vary", "recent=8; budget=64,128"], "--tune-vary changes one knob"),
        (["--tune-preset", "generate_muffins"], "generate_muffins generates; --tune needs a replay preset"),
        (["--tune-preset", "nosuch"], "--tune-preset: unknown preset 'nosuch'"),
        (["--tune-tokens", "0"], "--tune-tokens must be at least 1"),
    ],
)
def test_bad_tune_arguments_exit_with_one_line(args, reason):
    done = run_cli("bench", "browser", "--tune", *args, before_loading=True)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and reason in done.stderr


@pytest.mark.browser  # starts python -m thinkviz, which starts the app and Chromium
def test_bench_browser_tune_runs_end_to_end_on_a_tiny_model(tmp_path):
    """The app started for the benchmark (no --url) serves a tiny model; one knob value, a short trace.
    In a process of its own: Playwright's sync API refuses a thread where another test left an
    asyncio loop running."""
    folder = save_tiny_model(tmp_path / "tiny")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "thinkviz",
            "bench",
            "browser",
            "--tune",
            "--model",
            folder,
            "--quant",
            "none",
            "--threads",
            "1",
            "--tune-tokens",
            "24",
            "--tune-vary",
            "recent=8",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "math_h2o_vs_window (h2o), first 24 trace tokens measured against the full cache" in done.stdout
    assert ", torch threads 1 (1)" in done.stdout
    assert "recent ->      8: change -> new ΔNLL on screen" in done.stdout
