"""``bench browser --tune`` checks its arguments before it starts an app or a browser."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # each test starts python -m thinkviz


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
    done = subprocess.run(
        [sys.executable, "-m", "thinkviz", "bench", "browser", "--tune", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and reason in done.stderr
