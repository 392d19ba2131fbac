"""Series of a run's memory from its record: tokens seen, the budget and device memory per step,
what one token costs, and where a full cache would reach a memory cap.

Plain ``numpy`` arrays of length ``S`` (one per step) from a
:class:`~thinkviz.core.events.RunRecord`; the memory charts draw them.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping

import numpy as np

from ..core.events import RunRecord
from ..policies import PolicyConfigError, policy_class
from .tables import record_kv_quant


def tokens_seen(record: RunRecord) -> np.ndarray:
    """``(S,)`` number of tokens the model has seen after each step."""
    return np.array([e.positions[-1] + 1 if e.positions else 0 for e in record.events], dtype=np.int64)


def bytes_per_token(record: RunRecord) -> int:
    """KV bytes one token costs on the recorded model: 2 · layers · kv_heads · head_dim · dtype bytes."""
    g = record.meta["geometry"]
    return 2 * int(g["layers"]) * int(g["kv_heads"]) * int(g["head_dim"]) * int(g["dtype_bytes"])


def budget_token_bytes(record: RunRecord) -> float:
    """KV bytes one budget token costs in the run's KV format (KIVI at its steady state)."""
    g, kv = record.meta["geometry"], record_kv_quant(record)
    return int(g["layers"]) * kv.slot_bytes(int(g["kv_heads"]), int(g["head_dim"]), int(g["dtype_bytes"]))


def policy_evicts(record: RunRecord) -> bool:
    """Whether the recorded policy has a budget at all (the ``full`` reference does not)."""
    try:
        return policy_class(str(record.meta.get("policy"))).evicts
    except PolicyConfigError:  # a recording from a policy this version does not know
        return True


def budget_series(record: RunRecord, x: np.ndarray) -> tuple[np.ndarray, str]:
    """The budget in KV bytes (priced in the run's KV format) at each number of tokens seen ``x``
    ``(S,)``, and its label: a flat ``budget`` tokens, or ``⌈budget_fraction · x⌉`` tokens when the
    run kept a fraction."""
    params = record.meta.get("params", {})
    fmt = record_kv_quant(record)
    in_format = f", {fmt.label}" if fmt.spec.quantized else ""
    per_token = budget_token_bytes(record)
    if params.get("budget_mode") == "fraction":
        fraction = float(params["budget_fraction"])
        tokens = np.ceil(np.round(fraction * x, 9))
        return tokens * per_token, f"budget ({fraction:.0%} of the tokens seen{in_format})"
    budget = int(record.meta["budget"])
    return np.full(len(x), budget * per_token), f"budget ({budget} tokens{in_format})"


def device_series(
    record: RunRecord, device_stats: Mapping[int, Mapping[str, Any]] | None = None
) -> dict[str, np.ndarray]:
    """Device memory per step as ``{name: (S,) bytes}`` (NaN where not measured).

    ``device_stats`` maps a step to what :func:`thinkviz.memory.device_memory` returned then
    (the UI samples it per frame); otherwise each event's ``info["device_memory"]`` is used.
    Names: ``"GPU allocated"``, ``"GPU reserved"`` on CUDA, ``"process RSS"`` on the CPU.
    """
    names = {"allocated": "GPU allocated", "reserved": "GPU reserved", "rss": "process RSS"}
    out: dict[str, np.ndarray] = {}
    for i, event in enumerate(record.events):
        stats = device_stats.get(event.step) if device_stats is not None else event.info.get("device_memory")
        for key, name in names.items():
            if stats and key in stats:
                out.setdefault(name, np.full(len(record.events), np.nan))[i] = float(stats[key])
    return out


def device_cap(record: RunRecord, device_stats: Mapping[int, Mapping[str, Any]] | None = None) -> int | None:
    """The VRAM cap in bytes the run was measured under (its last reading), or ``None``."""
    for event in reversed(record.events):
        stats = device_stats.get(event.step) if device_stats is not None else event.info.get("device_memory")
        if stats and stats.get("cap") is not None:
            return int(stats["cap"])
    return None


def projected_oom_tokens(record: RunRecord, reserved: np.ndarray, cap: float) -> float | None:
    """Tokens seen when a full cache would take this device's reserved memory past ``cap``.

    What the device held besides the cache at the first reading stays; the full cache adds
    :func:`bytes_per_token` per token seen.  ``None`` without a reading.
    """
    measured = np.flatnonzero(~np.isnan(reserved))
    if not measured.size:
        return None
    first = measured[0]
    besides = reserved[first] - record.kv_bytes_series()[first]
    return (cap - besides) / bytes_per_token(record)


def oom_step(full_bytes: np.ndarray, policy_bytes: np.ndarray, available: float) -> int | None:
    """Index of the first step where the full cache exceeds ``available`` while the policy fits."""
    hits = np.flatnonzero((full_bytes > available) & (policy_bytes <= available))
    return int(hits[0]) if len(hits) else None
