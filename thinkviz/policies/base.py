"""The policy interface, declared parameters, and the shared keep-set selection.

A policy sees a :class:`CacheView` of the cache and returns which physical slots to keep:
indices of shape ``(L, H_kv, k)`` (the same number in every layer and kv-head), or a keep mask
``(L, H_kv, T)`` bool whose counts may differ per layer and per kv-head (a *ragged* keep set,
see :func:`keep_counts`).  Most policies only override :meth:`Policy.score` (higher = more worth
keeping, shape ``(L, H_kv, T)``); :meth:`Policy.select` then forces the protected spans, the
attention sinks and the recent window in and takes the top :meth:`Policy.target` slots per
(layer, kv-head).  Block-level or value-modifying policies override :meth:`Policy.select` or
:meth:`Policy.compress`.

The budget is ``budget`` tokens (``budget_mode`` ``tokens``) or ``⌈budget_fraction · N⌉`` of the
``N`` tokens seen so far (``fraction``, kvpress's compression-ratio decoding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from ..predictor import content_digest


class PolicyConfigError(ValueError):
    """A policy name or parameter value is not acceptable; the message says which and why."""


@dataclass(frozen=True)
class Param:
    """A tunable knob: a number with the range a UI slider offers, an on/off flag, or one of a
    few named ``choices`` (a string default; the UI shows a dropdown, the CLI takes the name).

    ``before``: for a knob added to an existing rule, the value that runs the rule as it was
    before the knob existed (``None``: a knob as old as its rule).  A
    recording's signature leaves the knob out at that value, so a recording made before the
    knob existed still matches a preset that names it."""

    name: str
    default: float | int | bool | str
    low: float | int | None = None
    high: float | int | None = None
    step: float | int | None = None
    help: str = ""
    choices: tuple[str, ...] = ()
    before: float | int | bool | str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.default, str) != bool(self.choices):
            raise ValueError(f"parameter {self.name}: choices go with a string default, and only with one")
        if self.choices and self.default not in self.choices:
            raise ValueError(f"parameter {self.name}: default {self.default!r} is not one of its choices")

    @property
    def kind(self) -> str:
        """``"bool"``, ``"int"``, ``"float"`` or ``"choice"``."""
        if isinstance(self.default, bool):
            return "bool"
        if isinstance(self.default, str):
            return "choice"
        return "int" if isinstance(self.default, int) else "float"

    @property
    def range_text(self) -> str:
        """What values it takes, for help texts: ``on / off``, ``select / match``, ``0 – 1024``, ``any``."""
        if self.kind == "bool":
            return "on / off"
        if self.kind == "choice":
            return " / ".join(self.choices)
        if self.low is None and self.high is None:
            return "any"
        return f"{self.low} – {self.high}"

    def coerce(self, value: Any) -> float | int | bool | str:
        """Convert and range-check ``value``; raise :class:`PolicyConfigError` otherwise."""
        if self.kind == "choice":
            choice = value.strip() if isinstance(value, str) else value
            if choice not in self.choices:
                raise PolicyConfigError(f"{self.name} must be one of: {', '.join(self.choices)}; got {value!r}")
            return choice
        try:
            if self.kind == "bool":
                if isinstance(value, str):
                    value = {"true": True, "false": False}.get(value.strip().lower(), value)
                if not isinstance(value, bool):
                    raise TypeError
                return value
            number = float(value)
            if number != number:  # NaN
                raise ValueError
            if self.kind == "int":
                if number != int(number):
                    raise ValueError
                number = int(number)
        except (TypeError, ValueError):
            expected = {"bool": "true or false", "int": "an integer", "float": "a number"}[self.kind]
            raise PolicyConfigError(f"{self.name} must be {expected}, got {value!r}") from None
        if self.low is not None and number < self.low or self.high is not None and number > self.high:
            raise PolicyConfigError(f"{self.name} must be between {self.low} and {self.high}, got {number}")
        return number


@dataclass(frozen=True)
class ScoreScale:
    """What a policy's score grades, for the heat colours and their legend: ``what`` it measures
    and what a ``low`` and a ``high`` score mean for a token."""

    what: str
    low: str
    high: str


COMMON_PARAMS: tuple[Param, ...] = (
    Param("budget", 256, 8, 16384, 8, "tokens kept per layer and kv-head after each compression (budget mode tokens)"),
    Param(
        "budget_mode",
        "tokens",
        choices=("tokens", "fraction"),
        help="tokens: keep `budget` tokens; fraction: keep `budget_fraction` of the tokens seen so far",
    ),
    Param(
        "budget_fraction",
        0.25,
        0.01,
        1.0,
        0.01,
        "share of the tokens seen so far kept per layer and kv-head (budget mode fraction)",
    ),
    Param("interval", 1, 1, 512, 1, "compress every N steps; the cache oscillates between budget and budget+N"),
    Param("protect_system", True, help="never evict the system prompt"),
    Param("protect_question", True, help="never evict the user's question"),
)


@dataclass
class CacheView:
    """What a policy may look at when it decides (``N`` = tokens seen, ``T`` = physical slots).

    - ``positions`` ``(L, H_kv, T)`` absolute position of each slot;
    - ``received`` ``(L, H_kv, T)`` attention each slot received from every query since it
      was written (summed over queries, mean over the query heads of a kv group);
    - ``window`` ``(L, H_kv, W, T)`` the attention rows of the last ``W`` queries, oldest
      first, zero where a slot did not exist yet;
    - ``token_entropy`` ``(N,)`` entropy (bits) of each token's own attention row;
    - ``hidden`` ``(N, ...)`` per token, what the policy keeps (:meth:`Policy.hidden_kept`; by
      default all of it, ``(N, k, d)``) of the hidden states of the ``k`` layers it asked for
      (:meth:`Policy.hidden_layers`), else ``None``;
    - ``protected`` ``(N,)`` bool, positions no policy may evict;
    - ``keys`` per layer ``(B, H_kv, T, D)``: the cached keys as attention reads them (decoded
      from a quantized format on access);
    - ``texts`` per position, ``segments`` the live segmenter (or ``None``);
    - ``model`` the loaded model's name (a learned policy checks it was trained for it);
    - ``valid`` ``(L, H_kv, T)`` bool, which slots hold a token, or ``None`` when all do.  Holes
      (a padded head's spare slots, the end of a shorter layer) appear only after a ragged keep
      set; their entries in the other tables are meaningless and a policy must never keep one;
    - ``queries`` ``(L, H, R, D)`` the last ``R`` queries of every layer and *query* head, after
      RoPE and multiplied by the attention scale (logits are ``q·k + bias``), oldest first, and
      ``query_positions`` ``(R,)`` their absolute positions — only for a policy that asks for them
      (:attr:`Policy.query_rows`), else ``None``;
    - ``bias`` ``(L, H_kv, T)`` float32 the additive attention bias every slot carries, or ``None``
      when the cache has none (every policy but the attention-matching ones);
    - ``reread(positions)`` (attention-matching policies only, else ``None``): a repeat-prefill —
      the model reads a short repeat instruction and then the tokens at ``positions`` again, on top
      of the cache, which it leaves as it was; returns their queries ``(L, H, M, D)`` (scaled,
      RoPE applied, like ``queries``) and the positions ``(M,)`` they were read at.
    """

    positions: torch.Tensor
    received: torch.Tensor
    window: torch.Tensor
    token_entropy: torch.Tensor
    protected: torch.Tensor
    current: int
    keys: Sequence[torch.Tensor] = field(default_factory=list)
    hidden: torch.Tensor | None = None
    texts: list[str] = field(default_factory=list)
    segments: Any = None
    model: str = ""
    valid: torch.Tensor | None = None
    queries: torch.Tensor | None = None
    query_positions: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    reread: Callable[[Sequence[int]], tuple[torch.Tensor, torch.Tensor]] | None = None

    @property
    def seen(self) -> int:
        """``N``, the number of tokens seen so far."""
        return self.current + 1

    @property
    def last(self) -> torch.Tensor:
        """``(L, H_kv, T)`` attention from the newest query."""
        return self.window[:, :, -1, :]

    @property
    def queries_seen(self) -> torch.Tensor:
        """``(L, H_kv, T)`` how many queries (itself included) could attend to each slot."""
        return (self.current - self.positions + 1).clamp(min=1)

    def by_position(self, values: torch.Tensor) -> torch.Tensor:
        """Broadcast a per-position tensor ``(N,)`` onto the slots: ``(L, H_kv, T)``."""
        return values.to(self.positions.device)[self.positions]

    def key_scores(self, rule: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``(L, H_kv, T)`` from ``rule(keys)``: ``(H_kv, T_l, D)`` float keys of one layer to
        ``(H_kv, T_l)`` scores.  A layer shorter than ``T`` is padded with NaN (ranked last)."""
        total = self.positions.shape[-1]
        rows = []
        for keys in self.keys:
            scores = rule(keys[0].float()).cpu()
            short = total - scores.shape[-1]
            rows.append(F.pad(scores, (0, short), value=float("nan")) if short else scores)
        return torch.stack(rows)


def rank_desc(values: torch.Tensor) -> torch.Tensor:
    """``values``' rank along the last axis, 0 for the largest; ties go to the lower index."""
    order = values.argsort(dim=-1, descending=True, stable=True)
    ranks = torch.arange(values.shape[-1], device=values.device).expand_as(order)
    return torch.empty_like(order).scatter_(-1, order, ranks)


def keep_counts(
    priority: torch.Tensor, forced: torch.Tensor, counts: torch.Tensor, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """A ragged keep mask ``(L, H_kv, T)``: in each (layer, kv-head) every ``forced`` slot, then the
    highest ``priority``, ``max(counts, forced)`` slots in all (``counts`` ``(L, H_kv)``), never a hole
    (``valid`` False) and never more than the slots held.  NaN ranks last among held slots."""
    held = torch.ones_like(forced) if valid is None else valid
    forced = forced & held
    finite = torch.nan_to_num(priority.float(), nan=-3e38, posinf=3e38, neginf=-3e38)
    ranked = torch.where(forced, torch.full_like(finite, float("inf")), finite)
    ranked = torch.where(held, ranked, torch.full_like(finite, float("-inf")))
    wanted = torch.maximum(counts.to(forced.device), forced.sum(-1)).clamp(max=held.sum(-1))
    return rank_desc(ranked) < wanted[..., None]


def keep_top(priority: torch.Tensor, forced: torch.Tensor, k: int) -> torch.Tensor:
    """Sorted physical indices ``(L, H_kv, k)``: every ``forced`` slot first, then the highest
    ``priority`` ``(L, H_kv, T)``; NaN ranks last.  ``k`` must not exceed ``T``."""
    ranked = torch.nan_to_num(priority.float(), nan=float("-inf"))
    ranked = torch.where(forced, torch.full_like(ranked, float("inf")), ranked)
    return ranked.topk(k, dim=-1).indices.sort(dim=-1).values


class Policy:
    """Base class: subclasses set ``name``, ``summary``, ``source``, ``params`` and override ``score``.

    ``window_rows``: how many recent query rows the policy needs in ``CacheView.window``;
    ``reads_attention``: ``False`` when neither its decision nor its score reads attention (the
    engine then runs the model's fused attention, which returns no weights);
    :meth:`hidden_layers`: which hidden states it reads;
    ``fits_bias``: whether the cache carries a per-slot attention bias the policy fits (the
    attention-matching policies; the engine then runs :mod:`thinkviz.core.attention`'s biased
    attention; every other policy runs the model's own attention unchanged);
    ``query_rows``: how many of the newest queries per layer and query head it reads in
    ``CacheView.queries`` (0: none kept);
    ``predicts_importance``: whether its step info reports each token's predicted importance
    (``predicted`` / ``predicted_from``); the app then offers the prediction heat modes and
    measures the attention from the answer when a run ends;
    ``hard_budget``: ``False`` when the rule may only evict certain spans and can therefore stay
    over budget; such a policy says so with ``"over_budget": True`` in :meth:`step_info`;
    ``score_scale``: what its score grades (the token view paints it as heat), or ``None`` when
    the score only orders slots by a rule (position, a flag, a random draw): no heat is shown.

    Every declared knob (``COMMON_PARAMS`` + ``params``) is an instance attribute of its name
    holding the validated value, of its :attr:`Param.kind` (``policy.window``, ``policy.budget``);
    ``config`` keeps the same values as a ``{name: value}`` record for recordings and sweeps.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    source: ClassVar[str] = ""
    params: ClassVar[tuple[Param, ...]] = ()
    window_rows: ClassVar[int] = 1
    reads_attention: ClassVar[bool] = True
    predicts_importance: ClassVar[bool] = False
    evicts: ClassVar[bool] = True
    hard_budget: ClassVar[bool] = True
    score_scale: ClassVar[ScoreScale | None] = ScoreScale("the policy's score", "evicted first", "kept first")

    # the knobs of COMMON_PARAMS, set from the validated config like every declared knob
    budget: int
    budget_mode: str
    budget_fraction: float
    interval: int
    protect_system: bool
    protect_question: bool
    # forced slots: the first `n_sink` positions, the newest `recent` (0 unless a policy declares them)
    n_sink: int = 0
    recent: int = 0

    @property
    def fits_bias(self) -> bool:
        return False

    @property
    def query_rows(self) -> int:
        return 0

    @classmethod
    def files_read(cls, model: str) -> tuple[Path, ...]:
        """The files a run on ``model`` (its loaded name) reads besides the knobs, present or not;
        ``()``: none."""
        return ()

    @classmethod
    def file_fingerprints(cls, model: str) -> dict[str, str | None]:
        """``{name: a short digest of its content, None when absent}`` of each of :meth:`files_read`:
        what a recording or a stored sweep group of a run on ``model`` must still match."""
        return {path.name: content_digest(path) if path.is_file() else None for path in cls.files_read(model)}

    def hidden_layers(self, model: str, hidden_size: int, depth: int) -> tuple[int, ...]:
        """The hidden states it reads in ``CacheView.hidden`` when it runs on ``model`` (hidden size
        ``hidden_size``, ``depth`` decoder layers): indices into transformers' ``hidden_states``,
        ``0`` the embeddings … ``depth`` (or ``-1``) the final norm's output; ``()``: none."""
        return ()

    def hidden_kept(self, model: str, hidden: torch.Tensor) -> torch.Tensor:
        """What a run on ``model`` keeps for ``CacheView.hidden`` of new tokens' hidden states
        ``(q, k, d)`` (the layers :meth:`hidden_layers` named): ``(q, ...)``, by default all of
        them.  A policy that reads only a function of each token's states returns that, and the
        run holds it instead of ``k · d`` numbers per token."""
        return hidden

    def __init__(self, **values: Any) -> None:
        declared = {p.name: p for p in self.all_params()}
        unknown = sorted(set(values) - set(declared))
        if unknown:
            raise PolicyConfigError(
                f"policy {self.name!r} has no parameter {', '.join(unknown)} (it takes: {', '.join(declared)})"
            )
        self.config: dict[str, Any] = {
            name: param.coerce(values.get(name, param.default)) for name, param in declared.items()
        }
        for name, value in self.config.items():
            setattr(self, name, value)
        self.fraction: Fraction | None = Fraction(str(self.budget_fraction)) if self.budget_mode == "fraction" else None
        if self.evicts and self.fraction is None and self.n_sink + self.recent >= self.budget:
            raise PolicyConfigError(
                f"budget ({self.budget}) must be larger than sinks + recent window ({self.n_sink} + {self.recent})"
            )

    @classmethod
    def all_params(cls) -> tuple[Param, ...]:
        return COMMON_PARAMS + cls.params

    # ---- the decision ------------------------------------------------------------------
    def target(self, seen: int) -> int:
        """Slots to keep per layer and kv-head once ``seen`` tokens have been seen: ``budget``, or
        ``⌈budget_fraction · seen⌉`` (at least 1) in fraction mode; forced slots may add to it."""
        if self.fraction is None:
            return self.budget
        return max(1, math.ceil(self.fraction * seen))

    def score(self, view: CacheView) -> torch.Tensor:
        """Importance of every slot, ``(L, H_kv, T)``; higher is kept first."""
        raise NotImplementedError

    def forced(self, view: CacheView) -> torch.Tensor:
        """``(L, H_kv, T)`` bool: protected spans, the first ``n_sink`` positions, the last ``recent``."""
        protected = view.by_position(view.protected)
        sinks = view.positions < self.n_sink
        recent = view.positions > view.current - self.recent
        forced = protected | sinks | recent
        return forced if view.valid is None else forced & view.valid

    def select(self, view: CacheView) -> torch.Tensor:
        """Physical indices to keep, ``(L, H_kv, k)`` sorted, ``k = max(target, forced)`` capped at ``T``
        (or a ragged keep mask ``(L, H_kv, T)``, see the module docstring)."""
        forced = self.forced(view)
        k = min(forced.shape[-1], max(self.target(view.seen), int(forced.sum(-1).max())))
        return keep_top(self.score(view), forced, k)

    def compress(self, view: CacheView, cache) -> torch.Tensor:
        """Decide and return the keep indices (or mask); value-modifying policies also edit ``cache`` here."""
        return self.select(view)

    def step_info(self, view: CacheView) -> dict[str, Any]:
        """Policy-specific facts to attach to the step's event (e.g. block verification states)."""
        return {}
