"""Human-readable units and table cells."""

from __future__ import annotations

import math
from typing import Any


def format_bytes(n: float) -> str:
    """``1536`` → ``'1.5 KiB'``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def cell(value: Any, spec: str) -> str:
    """``value`` formatted with ``spec`` for a Markdown table; a missing value (None, NaN) is "–"."""
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)
