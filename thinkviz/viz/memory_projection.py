"""Where a run's caches, priced on a bigger model (a :class:`~thinkviz.memory.Projection`),
outgrow its card: the numbers and the notes the memory chart's projection panel shows.

The full cache grows by one token per token seen; a policy by its :func:`growth_rate`, the
slope its kept counts settled to.  Past the run's end both are extrapolated to the target
model's context.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.events import RunRecord
from ..memory import Projection
from ..units import format_bytes
from .run_series import oom_step, policy_evicts, tokens_seen
from .tables import record_kv_quant


@dataclass(frozen=True)
class ProjectionOutcome:
    """Where a run's caches, priced on a projection's target, outgrow the card.

    ``policy``: the policy's name, with its KV format when quantized; ``compressed``: its cache is
    not the full-precision full cache (it evicts, or is stored in a quantized format);
    ``room``: tokens of full-precision KV cache the card holds next to the weights (0 when they do
    not fit), ``policy_room`` the same in the run's KV format;
    ``growth``: kept tokens the policy adds per token seen over the run's second half (0 for a
    policy that holds its budget, 1 for the full cache); ``full_oom`` / ``policy_oom``: tokens seen
    when the full cache passes ``room`` / the policy ``policy_room`` (``None``: not within the target's context),
    past the run's ``end`` when extrapolated (the full cache grows by one token per token, the
    policy by ``growth``); ``horizon``: where the projection's x axis ends.
    """

    policy: str
    compressed: bool
    end: int
    kept_end: int
    room: int
    policy_room: int
    weights_fit: bool
    growth: float
    full_oom: float | None
    policy_oom: float | None
    horizon: float
    context: int
    kept_bytes: int  # what ``kept_end`` tokens cost on the target
    fits_at_full_oom: bool = False  # the policy fits where the full cache fails (within the run)

    @property
    def extrapolated(self) -> bool:
        return self.horizon > self.end

    def notes(self) -> list[str]:
        """What the projection shows, in words: the full cache's line, then the policy's (if it says more)."""
        if not self.weights_fit:
            return []  # the figure says why
        policy_fits = self.fits_at_full_oom and self.policy_oom is None and self.growth <= GROWTH_EPSILON
        if self.full_oom is not None and self.full_oom <= self.end:
            first = f"full cache runs out of memory at {self.full_oom:,.0f} tokens"
            if policy_fits and self.compressed:
                return [f"{first}; the policy still fits"]
            lines = [first]
        elif self.full_oom is not None:
            lines = [
                f"a full cache would run out of memory at {self.full_oom:,.0f} tokens "
                f"(extrapolated: this run saw {self.end:,})"
            ]
        else:
            lines = [
                f"a full cache fits {self.room:,} tokens on this card",
                f"(more than the model's {self.context:,}-token context)",
            ]
        if not self.compressed:
            return lines
        if self.policy_oom is not None and self.policy_oom <= self.end:
            lines.append(
                f"{self.policy} runs out too, at {self.policy_oom:,.0f} tokens: it kept {self.kept_end:,} "
                "tokens per layer and head"
            )
        elif self.policy_oom is not None:
            lines.append(
                f"{self.policy} fits to the end of the run but keeps growing ({self.growth:.2f} tokens per "
                f"token seen): it would run out at {self.policy_oom:,.0f} tokens (extrapolated)"
            )
        elif self.growth > GROWTH_EPSILON:
            lines.append(
                f"{self.policy} keeps growing ({self.growth:.2f} tokens per token seen) but fits within "
                "the model's context"
            )
        else:
            lines.append(
                f"{self.policy} holds about {self.kept_end:,} tokens ({format_bytes(self.kept_bytes)}) and fits"
            )
        return lines


GROWTH_EPSILON = 1e-3  # kept tokens per token seen below which a policy holds its budget


def growth_rate(seen: np.ndarray, kept: np.ndarray) -> float:
    """Kept tokens added per token seen: the least-squares slope over the second half of the run
    (what compressions settled to), never below 0; 0 for fewer than two points.

    A policy that compresses every few tokens draws a sawtooth (up by one token per token between
    compressions, down to its budget at each); its slope over a short run is the sawtooth's
    phase, not growth.  So where the run has two or more compressions (drops), the slope is that
    of the counts right after the later half of them (at least two): flat for a policy that holds
    its budget, rising for one that does not (a fraction budget, think_drop keeping code)."""
    after_drop = np.flatnonzero(np.diff(kept) < 0) + 1
    if len(after_drop) >= 2:
        pick = after_drop[-max(2, len(after_drop) // 2) :]
        x, y = seen[pick].astype(np.float64), kept[pick].astype(np.float64)
    else:
        half = slice(len(seen) // 2, None)
        x, y = seen[half].astype(np.float64), kept[half].astype(np.float64)
    if len(x) < 2 or np.ptp(x) == 0:
        return 0.0
    dx = x - x.mean()  # the least-squares slope in closed form: exactly 0 when y is constant (polyfit's is ~1e-16)
    return max(0.0, float(dx @ (y - y.mean()) / (dx @ dx)))


def projection_outcome(record: RunRecord, projection: Projection) -> ProjectionOutcome:
    """Where ``record``'s full cache (at full precision) and its policy (in the run's KV format) run
    out of memory on ``projection``'s card."""
    seen = tokens_seen(record)
    kept = np.array([e.kv_tokens for e in record.events], dtype=np.int64)
    fmt = record_kv_quant(record)
    evicts = policy_evicts(record)
    compressed = evicts or fmt.spec.quantized
    context = projection.target.max_context
    room, policy_room = projection.max_tokens, projection.tokens_fitting(fmt)
    end = int(seen[-1]) if len(seen) else 0
    growth = growth_rate(seen, kept) if evicts else 1.0

    def outgrows(counts: np.ndarray, rate: float, room: int) -> float | None:
        over = np.flatnonzero(counts > room)
        if over.size:
            return float(seen[over[0]])
        if not len(counts) or rate <= GROWTH_EPSILON:
            return None
        at = end + (room - counts[-1]) / rate
        return at if at <= context else None

    full_oom = outgrows(seen, 1.0, room)
    policy_oom = outgrows(kept, growth, policy_room) if compressed else full_oom
    reach = [end, full_oom if full_oom is not None else context] + ([policy_oom] if policy_oom else [])
    horizon = float(min(max(reach), max(end, context))) if projection.available_bytes > 0 else float(end)
    fits = oom_step(projection.kv_bytes(seen), projection.kv_bytes(kept, fmt), projection.available_bytes) is not None
    name = str(record.meta.get("policy", "the policy")) + (f" ({fmt.label})" if fmt.spec.quantized else "")
    kept_end = int(kept[-1]) if len(kept) else 0
    return ProjectionOutcome(
        name,
        compressed,
        end,
        kept_end,
        room,
        policy_room,
        projection.available_bytes > 0,
        growth,
        full_oom,
        policy_oom,
        horizon,
        context,
        int(projection.kv_bytes(kept_end, fmt)),
        fits,
    )
