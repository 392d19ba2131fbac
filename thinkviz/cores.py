"""How many threads torch computes with in the app: every core this process may use but one, which the
browser showing the page needs to draw it (at least one thread).

On this project's 2-core machine torch's default (one thread per core) makes the model and the
browser fight over both cores: torch's worker threads spin while they wait for each other, and the
page drops frames.  ``python -m thinkviz bench browser --threads torch,auto`` measures the default
against this choice (docs/benchmarks.md has the numbers).  ``OMP_NUM_THREADS`` in the environment
or ``app.py --threads N`` override it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

AUTO, TORCH = "auto", "torch"  # the app's choice; torch's own default (one thread per core)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, which containers narrow), at least one."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def choose_threads(setting: str = AUTO, cores: int | None = None, env: Mapping[str, str] = os.environ) -> int | None:
    """The thread count for ``setting``: a number, :data:`AUTO` (all usable cores but one, unless
    ``OMP_NUM_THREADS`` is set) or :data:`TORCH` (``None``: leave torch's default); ValueError otherwise."""
    if setting == TORCH:
        return None
    if setting == AUTO:
        if env.get("OMP_NUM_THREADS", "").strip():
            return None  # the user chose already, and torch read it
        return max(1, (usable_cores() if cores is None else cores) - 1)
    try:
        threads = int(setting)
    except ValueError:
        raise ValueError(f"threads must be a number, {AUTO!r} or {TORCH!r}, got {setting!r}") from None
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    return threads


def apply_threads(setting: str = AUTO) -> int:
    """Set torch's thread count for ``setting`` (see :func:`choose_threads`); returns the count in use."""
    threads = choose_threads(setting)
    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()
