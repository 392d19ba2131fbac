"""The tests of a module that share a module-scoped fixture run on one worker under ``make test``
(``--dist loadgroup``, grouped in ``tests/conftest.py``). pytest 9.2 made xdist ignore the groups
without a word (pytest-dev/pytest-xdist#1386): browser tests that go on from an earlier test's page
then failed one run in four. This runs a few tests the way the Makefile does and reads where they ran."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODULE = "tests/test_viz_tokens.py"  # its browser tests share a module-scoped page


@pytest.mark.slow  # starts pytest with two workers
def test_tests_sharing_a_module_fixture_run_on_one_worker():
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", MODULE],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    ran = re.findall(r"^\[(gw\d)\] .*PASSED (\S+)", done.stdout, re.MULTILINE)
    shared = {(worker, test) for worker, test in ran if test.endswith(f"@{MODULE}")}
    assert len(shared) >= 3 and len({worker for worker, _ in shared}) == 1, shared
    assert len({worker for worker, _ in ran}) == 2  # the others went to either worker
