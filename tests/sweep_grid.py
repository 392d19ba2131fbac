"""A small sweep grid on a tiny model folder, shared by the resume and the Ray tests."""

from __future__ import annotations

import contextlib
from pathlib import Path
from collections.abc import Iterator

import torch

from thinkviz.cli import main
from tiny_models import save_tiny_model

TEXT = (
    "<think>\nMultiplication binds tighter, so 3 * 4 = 12 first.\n\nThen 2 + 12 = 14.\n</think>\n\n"
    "<think>\nCheck: (2 + 3) * 4 would be 20, which is not what the expression says.\n</think>\n\n"
    "The answer is 14.\n\n```python\nassert 2 + 3 * 4 == 14\n```\n"
)
RESULT_FILES = ("sweep.csv", "sweep.json")


KV_QUANTS = ("none", "q8_0")
GROUPS = 2 * (1 + 2 * len(KV_QUANTS))  # per trace: full in q8_0, then 2 budgets × 2 formats


def sweep_grid(folder: Path) -> list[str]:
    """CLI arguments (``bench sweep …``) for 2 traces × 2 budgets × 2 KV formats of window and h2o,
    plus the full cache in q8_0 per trace (:data:`GROUPS` groups), on a tiny random Llama of
    head_dim 32 saved under ``folder``."""
    model = save_tiny_model(folder / "model", hidden=128)
    traces = []
    for name, extra in (("alpha", ""), ("beta", "\n\nSo 14 it is, twice checked.\n")):
        (folder / f"{name}.md").write_text(TEXT + extra, encoding="utf-8")
        traces.append(str(folder / f"{name}.md"))
    return [
        "bench",
        "sweep",
        "--model",
        model,
        "--quant",
        "none",
        "--device",
        "cpu",
        "--trace",
        *traces,
        "--policies",
        "window,h2o",
        "--budgets",
        "0.5,40",
        "--kv-quants",
        ",".join(KV_QUANTS),
        "--interval",
        "8",
        "--param",
        "recent=4",
    ]


def same_results(out: Path, reference: Path) -> None:
    """``out``'s sweep.csv and sweep.json are byte for byte ``reference``'s."""
    for name in RESULT_FILES:
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one thread here, as on each Ray worker, so both compute the same bits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def sweep_whole(grid: list[str], out: Path) -> Path:
    """Sweep ``grid`` into ``out`` in this process, start to end, on one thread: the bytes every
    other way of running it must give."""
    with one_thread():
        assert main([*grid, "--out", str(out)]) == 0
    return out
