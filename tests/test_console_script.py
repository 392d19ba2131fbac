"""The ``thinkviz`` console script (pyproject's ``[project.scripts]``) in the venv running the tests:
``make run`` and ``make test`` install the package editable (``pip install -e . --no-deps``) so it is there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).parent / "thinkviz"


@pytest.mark.slow
@pytest.mark.skipif(
    not SCRIPT.exists(), reason=f"{SCRIPT} is not installed: `make test` installs it (pip install -e . --no-deps)"
)
def test_the_console_script_answers_help():
    done = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("usage: thinkviz ")  # its own name, not "python -m thinkviz"
    assert "generate" in done.stdout and "bench" in done.stdout
