"""Where a run's caches, priced on a bigger model (a :class:`~thinkviz.memory.Projection`),
outgrow its card: the numbers and the notes the memory chart's projection panel shows.

Past the run's end the caches are projected by their own rules, not by the slope of the curve:
the full cache grows by one token per token seen; a policy that holds a budget grows by one
token per token until it reaches its cap (:class:`KeptCap`: ``max(budget, forced)`` plus the
tokens read between compressions, as the engine compresses) and stays there, whether or not the
run reached it; only a cache that really grows (a fraction budget, a policy that may stay over
budget such as think_drop, a policy this version does not know) is extrapolated at its
:func:`growth_rate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.events import RunRecord
from ..memory import Projection
from ..policies import Policy, PolicyConfigError, make_policy
from ..policies.registry import policy_values
from ..units import format_bytes
from .run_series import oom_step, policy_evicts, tokens_seen
from .tables import record_kv_quant

GROWTH_EPSILON = 1e-3  # kept tokens per token seen below which a cache holds its size


@dataclass(frozen=True)
class KeptCap:
    """The most tokens per layer and kv-head a policy's cache holds at any moment, by the engine's
    rule (:meth:`thinkviz.core.engine.Run._maybe_compress` and :meth:`Policy.select`): once the cache
    holds more than the policy's target, a compression (due every ``interval`` tokens read) keeps
    ``max(target, forced)`` slots, ``forced`` being the protected spans (system prompt, question),
    the first ``n_sink`` positions and the newest ``recent``; the ``interval`` tokens read until
    the next one are in the cache when the forward pass that reads the last of them runs, so the
    cap is ``max(target, forced) + interval`` — the run's peak KV at its steady state (a step's
    event, taken after it compressed, shows at most ``interval − 1`` of them).  Per-layer and
    per-head budgets (pyramidkv, adakv) share ``budget`` out so that their mean is the same;
    ``target`` is ``budget``, or ``⌈budget_fraction · seen⌉`` for a fraction budget, which grows.
    Ignored: a prompt chunk read during prefill (a one-off spike, before the first step)."""

    budget: int
    fraction: float | None  # the share of the tokens seen kept, for a fraction budget
    protected: int  # protected positions (the prompt's protected spans)
    sinks: int  # attention sinks outside them
    recent: int  # the newest tokens always kept
    interval: int  # tokens read between two compressions

    @property
    def forced(self) -> int:
        return self.protected + self.sinks + self.recent

    def at(self, seen):
        """The cap once ``seen`` tokens have been seen (numbers or numpy arrays)."""
        target = self.budget if self.fraction is None else np.maximum(1, np.ceil(np.round(self.fraction * seen, 9)))
        return np.maximum(target, self.forced) + self.interval

    def first_over(self, room: int) -> float | None:
        """Tokens seen from which the cap is above ``room`` (0: always; ``None``: never)."""
        if self.forced + self.interval > room:
            return 0.0
        if self.fraction is None:
            return 0.0 if self.budget + self.interval > room else None
        return (room - self.interval) / self.fraction

    def label(self) -> str:
        """What makes the cap, in words (``"207 kept by rule (175 protected + 32 recent) > budget 128,
        + 32 read between compressions"``)."""
        forced = [
            f"{n:,} {what}"
            for n, what in ((self.protected, "protected"), (self.sinks, "sinks"), (self.recent, "recent"))
            if n
        ]
        budget = f"{self.fraction:.0%} of the tokens seen" if self.fraction is not None else f"budget {self.budget:,}"
        if self.fraction is None and self.forced > self.budget:
            text = f"{self.forced:,} kept by rule ({' + '.join(forced)}) > {budget}"
        else:
            text = budget
        return f"{text}, + {self.interval:,} read between compressions"


def kept_cap(record: RunRecord) -> KeptCap | None:
    """The cap of ``record``'s policy (its knobs as recorded, its protected spans from the record's
    segments), or ``None`` for a cache without one: the full cache, a policy that may stay over
    budget (``hard_budget = False``: think_drop) and a policy this version does not know or whose
    knobs it refuses."""
    name, params = str(record.meta.get("policy")), record.meta.get("params")
    if not params:
        return None  # a record without its knobs: its budget cannot be told from the defaults
    try:
        policy: Policy = make_policy(name, **policy_values(name, dict(params)))
    except PolicyConfigError:
        return None
    if not policy.evicts or not policy.hard_budget:
        return None
    protected = set()
    for span in record.segments:
        if span.get("protected"):
            protected.update(range(int(span["start"]), int(span["end"])))
    return KeptCap(
        budget=policy.budget,
        fraction=None if policy.fraction is None else float(policy.fraction),
        protected=len(protected),
        sinks=len(set(range(policy.n_sink)) - protected),
        recent=policy.recent,
        interval=policy.interval,
    )


@dataclass(frozen=True)
class ProjectionOutcome:
    """Where a run's caches, priced on a projection's target, outgrow the card.

    ``policy``: the policy's name, with its KV format when quantized; ``compressed``: its cache is
    not the full-precision full cache (it evicts, or is stored in a quantized format);
    ``room``: tokens of full-precision KV cache the card holds next to the weights (0 when they do
    not fit), ``policy_room`` the same in the run's KV format; ``cap``: the policy's
    :class:`KeptCap` (``None``: its cache has none); ``growth``: kept tokens added per token seen
    past the run's end below the cap (1 for the full cache and a capped policy that has not reached
    its cap, :func:`growth_rate` for a cache without a cap); ``full_oom`` / ``policy_oom``: tokens
    seen when the full cache passes ``room`` / the policy ``policy_room`` (``None``: not within the
    target's context), past the run's ``end`` when projected (:meth:`kept_at`); ``horizon``: where
    the projection's x axis ends; ``kept_bytes``: what the policy holds on the target at its cap
    (``kept_end`` tokens for a cache without one).
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
    kept_bytes: int
    cap: KeptCap | None = None
    reached: bool = False  # the run filled the cache to its cap (less the tokens read between compressions)
    fits_at_full_oom: bool = False  # the policy fits where the full cache fails (within the run)

    @property
    def extrapolated(self) -> bool:
        return self.horizon > self.end

    @property
    def grows(self) -> bool:
        """Whether the policy's cache keeps growing however long the run (no cap, or a fraction one)."""
        if self.cap is None:
            return self.growth > GROWTH_EPSILON
        return self.cap.fraction is not None

    def kept_at(self, seen):
        """Tokens per layer and kv-head the policy holds once ``seen ≥ end`` tokens have been seen."""
        grown = self.kept_end + self.growth * (np.asarray(seen, dtype=np.float64) - self.end)
        return grown if self.cap is None else np.minimum(grown, self.cap.at(seen))

    def notes(self) -> list[str]:
        """What the projection shows, in words: the full cache's line, then the policy's (if it says more)."""
        if not self.weights_fit:
            return []  # the figure says why
        policy_fits = self.fits_at_full_oom and self.policy_oom is None and not self.grows
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
        if self.compressed:
            lines.append(self._policy_note())
        return lines

    def _policy_note(self) -> str:
        """The policy's line: where it runs out, or that it fits (at its cap, if it has one)."""
        at = self.policy_oom
        if at is not None and at <= self.end:
            return (
                f"{self.policy} runs out too, at {at:,.0f} tokens: it kept {self.kept_end:,} tokens per layer and head"
            )
        cap = self.cap
        if cap is not None and cap.fraction is None:
            top = int(cap.at(self.end))
            if at is not None:
                return (
                    f"{self.policy}'s cap ({top:,} tokens: {cap.label()}) is more than this card holds: "
                    f"it would run out at {at:,.0f} tokens (extrapolated)"
                )
            reached = "" if self.reached else ", not reached in this run"
            return (
                f"{self.policy} holds at most {top:,} tokens ({cap.label()}{reached}): "
                f"{format_bytes(self.kept_bytes)} on this card, and fits"
            )
        rate = (
            f"{cap.fraction:.0%} of the tokens seen" if cap is not None else f"{self.growth:.2f} tokens per token seen"
        )
        if at is not None:
            return (
                f"{self.policy} fits to the end of the run but keeps growing ({rate}): it would run out "
                f"at {at:,.0f} tokens (extrapolated)"
            )
        if self.grows:
            return f"{self.policy} keeps growing ({rate}) but fits within the model's context"
        return f"{self.policy} holds about {self.kept_end:,} tokens ({format_bytes(self.kept_bytes)}) and fits"


def growth_rate(seen: np.ndarray, kept: np.ndarray) -> float:
    """Kept tokens added per token seen: the least-squares slope over the second half of the run
    (what compressions settled to), never below 0; 0 for fewer than two points.  Used only for a
    cache without a :class:`KeptCap` (think_drop, an unknown policy's recording).

    A policy that compresses every few tokens draws a sawtooth (up by one token per token between
    compressions, down to its budget at each); its slope over a short run is the sawtooth's
    phase, not growth.  So where the run has two or more compressions (drops), the slope is that
    of the counts right after the later half of them (at least two): flat for a policy that holds
    its budget, rising for one that does not (think_drop keeping code)."""
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


def _projected_oom(seen: np.ndarray, counts: np.ndarray, room: int, growth: float, cap: KeptCap | None) -> float | None:
    """Tokens seen when ``counts`` (kept per step at ``seen``) pass ``room``: the first step over it,
    else where the projection past the run's end does (it grows by ``growth`` per token up to
    ``cap``); ``None`` when neither does."""
    over = np.flatnonzero(counts > room)
    if over.size:
        return float(seen[over[0]])
    if not len(counts):
        return None
    end = float(seen[-1])
    grown = end + (room - counts[-1]) / growth if growth > GROWTH_EPSILON else math.inf
    capped = cap.first_over(room) if cap is not None else 0.0
    return None if capped is None else max(grown, capped)


def projection_outcome(record: RunRecord, projection: Projection) -> ProjectionOutcome:
    """Where ``record``'s full cache (at full precision) and its policy (in the run's KV format) run
    out of memory on ``projection``'s card, the policy projected at its :class:`KeptCap`."""
    seen = tokens_seen(record)
    kept = np.array([e.kv_tokens for e in record.events], dtype=np.int64)
    fmt = record_kv_quant(record)
    cap = kept_cap(record)
    evicts = policy_evicts(record)
    compressed = evicts or fmt.spec.quantized
    context = projection.target.max_context
    room, policy_room = projection.max_tokens, projection.tokens_fitting(fmt)
    end = int(seen[-1]) if len(seen) else 0
    growth = 1.0 if cap is not None or not evicts else growth_rate(seen, kept)

    def within(at: float | None) -> float | None:
        return at if at is not None and at <= context else None

    full_oom = within(_projected_oom(seen, seen, room, 1.0, None))
    policy_oom = within(_projected_oom(seen, kept, policy_room, growth, cap)) if compressed else full_oom
    reach = [end, full_oom if full_oom is not None else context] + ([policy_oom] if policy_oom else [])
    horizon = float(min(max(reach), max(end, context))) if projection.available_bytes > 0 else float(end)
    fits = oom_step(projection.kv_bytes(seen), projection.kv_bytes(kept, fmt), projection.available_bytes) is not None
    name = str(record.meta.get("policy", "the policy")) + (f" ({fmt.label})" if fmt.spec.quantized else "")
    kept_end = int(kept[-1]) if len(kept) else 0
    held = int(cap.at(max(end, 1))) if cap is not None and cap.fraction is None else kept_end
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
        int(projection.kv_bytes(held, fmt)),
        cap,
        cap is not None and len(kept) > 0 and int(kept.max()) >= int(cap.at(end)) - cap.interval,
        fits,
    )
