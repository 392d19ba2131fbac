"""Policy parameter controls: a fixed pool of sliders, checkboxes and dropdowns, assigned per policy.

Gradio needs its components up front, so the Live tab owns a pool of number slots, checkbox
slots and choice slots (as many of each as any registered policy needs).  When the user
picks a policy, :func:`slot_specs` says which of its declared :class:`~thinkviz.policies.Param`
goes in which slot (the rest are hidden); on Generate, :func:`collect_params` maps slot
values back to parameter names.  The common knobs (budget, interval, protection) have their
own controls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple
from collections.abc import Sequence

from ..policies import Param, PolicyConfigError, make_policy, policy_class, policy_names
from ..policies.base import COMMON_PARAMS, Policy
from ..policies.registry import policy_values
from ..sweep.grid import check_params

COMMON_NAMES = tuple(p.name for p in COMMON_PARAMS)
POOL_OF_KIND = {"int": "numbers", "float": "numbers", "bool": "flags", "choice": "choices"}


class ControlError(ValueError):
    """Control values that cannot make a policy; the message is shown to the user."""


class Pools(NamedTuple):
    """One entry per kind of slot: sliders, checkboxes, dropdowns (sizes, specs or values)."""

    numbers: Any
    flags: Any
    choices: Any


@dataclass(frozen=True)
class SlotSpec:
    """What one slot shows: a parameter with its range or choices, or nothing (hidden)."""

    name: str
    label: str
    kind: str  # "int" | "float" | "bool" | "choice"
    value: float | int | bool | str
    low: float | int | None = None
    high: float | int | None = None
    step: float | int | None = None
    help: str = ""
    choices: tuple[str, ...] = ()


def own_params(name: str) -> tuple[Param, ...]:
    """The parameters ``name`` declares beyond the common ones, in declaration order."""
    return tuple(p for p in policy_class(name).all_params() if p.name not in COMMON_NAMES)


def _by_pool(params: Sequence[Param]) -> Pools:
    """``params`` split into the pools their slots come from, in declaration order."""
    return Pools(*([p for p in params if POOL_OF_KIND[p.kind] == pool] for pool in Pools._fields))


def pool_sizes(names: Sequence[str] | None = None) -> Pools:
    """How many slots of each pool every policy in ``names`` needs at most."""
    split = [_by_pool(own_params(n)) for n in (names or policy_names())]
    return Pools(*(max((len(getattr(s, pool)) for s in split), default=0) for pool in Pools._fields))


def pool_bounds(names: Sequence[str] | None = None) -> tuple[float, float]:
    """``(lowest, highest)`` over every numeric parameter of ``names``: a range no slot value leaves."""
    specs = [_spec(p, p.default) for n in (names or policy_names()) for p in _by_pool(own_params(n)).numbers]
    if not specs:
        return 0, 1
    return min(s.low for s in specs), max(s.high for s in specs)


def pool_choices(names: Sequence[str] | None = None) -> list[str]:
    """Every choice any parameter of ``names`` offers, in first-seen order: what a choice slot
    accepts on the server (one policy's own choices are narrowed in the browser)."""
    seen = (c for n in (names or policy_names()) for p in _by_pool(own_params(n)).choices for c in p.choices)
    return list(dict.fromkeys(seen))


def _spec(param: Param, value: Any) -> SlotSpec:
    label = param.name.replace("_", " ")
    if param.kind == "bool":
        return SlotSpec(param.name, label, "bool", bool(value), help=param.help)
    if param.kind == "choice":
        return SlotSpec(param.name, label, "choice", value, help=param.help, choices=param.choices)
    low = param.low if param.low is not None else 0
    high = param.high if param.high is not None else max(1, 4 * abs(param.default))
    step = param.step if param.step is not None else (1 if param.kind == "int" else (high - low) / 100)
    return SlotSpec(param.name, label, param.kind, value, low, high, step, param.help)


def slot_specs(name: str, sizes: Pools, values: dict[str, Any] | None = None) -> Pools:
    """Assign ``name``'s own parameters to the slots of each pool (``sizes`` from :func:`pool_sizes`).

    ``values`` overrides defaults (a preset's parameters).  Each pool is a list as long as its
    size; unused slots are ``None``.
    """
    values = values or {}
    split = _by_pool(own_params(name))
    out = []
    for params, size in zip(split, sizes):
        if len(params) > size:
            raise ControlError(f"policy {name!r} has more parameters than the controls can show")
        out.append([_spec(p, values.get(p.name, p.default)) for p in params] + [None] * (size - len(params)))
    return Pools(*out)


def collect_params(name: str, slot_values: Pools) -> dict[str, Any]:
    """Slot values (one sequence per pool) back to ``{param: value}`` for ``name``: the inverse
    of :func:`slot_specs`."""
    out: dict[str, Any] = {}
    for params, given in zip(_by_pool(own_params(name)), slot_values):
        given = list(given)
        for i, param in enumerate(params):
            value = given[i] if i < len(given) else None
            if value is None:
                raise ControlError(f"no value for {param.name}")
            out[param.name] = int(round(value)) if param.kind == "int" else value
    return out


def default_view(name: str) -> str:
    """The token view a policy opens in: ``combined``, or ``evicted`` for a policy without a graded
    score (its heat would mean nothing)."""
    return "combined" if policy_class(name).score_scale is not None else "evicted"


def format_knobs(params: dict[str, Any], leave_out: Sequence[str] = COMMON_NAMES) -> str:
    """``params`` (a preset's) as the knob box shows them: ``recent=128, window=32``, without
    the knobs named in ``leave_out`` (those have controls of their own)."""

    def text(value: Any) -> str:
        return str(value).lower() if isinstance(value, bool) else str(value)

    return ", ".join(f"{key}={text(value)}" for key, value in params.items() if key not in leave_out)


def parse_knobs(text: str | None, policies: Sequence[str]) -> dict[str, str]:
    """The knob box's ``name=value, …`` as ``{name: value}``; :class:`ControlError` for a malformed
    entry or a knob none of ``policies`` takes.  Each policy later takes the knobs it declares
    (:func:`knobs_for`) and checks their values."""
    knobs: dict[str, str] = {}
    for item in (part.strip() for part in (text or "").replace("\n", ",").split(",")):
        if not item:
            continue
        key, sep, value = (piece.strip() for piece in item.partition("="))
        if not sep or not key or not value:
            raise ControlError(f"policy knobs are written name=value, comma-separated; got {item!r}")
        knobs[key] = value
    try:
        check_params(policies, knobs)
    except ValueError as exc:
        raise ControlError(f"{exc} (the knob box)") from None
    return knobs


def knobs_for(name: str, knobs: dict[str, Any]) -> dict[str, Any]:
    """The knobs policy ``name`` declares (another policy's knob is not its business)."""
    return policy_values(name, knobs)


def build_policy(
    name: str,
    params: dict[str, Any],
    *,
    budget: Any,
    interval: Any,
    protect_system: bool,
    protect_question: bool,
    budget_mode: Any = "tokens",
    budget_fraction: Any = 0.25,
) -> Policy:
    """The policy the controls describe; :class:`ControlError` with the policy's own reason."""
    if not name:
        raise ControlError("choose a policy")
    try:
        return make_policy(
            name,
            **params,
            budget=_integer("budget", budget),
            budget_mode=budget_mode,
            budget_fraction=budget_fraction,
            interval=_integer("interval", interval),
            protect_system=bool(protect_system),
            protect_question=bool(protect_question),
        )
    except PolicyConfigError as exc:
        raise ControlError(str(exc)) from None


def json_knobs(text: str | None) -> dict[str, Any]:
    """A JSON object of knob values by name (``{"budget": 128, "recent": 32}``; empty: none);
    :class:`ControlError` if the text is not one."""
    try:
        knobs = json.loads(text) if (text or "").strip() else {}
    except json.JSONDecodeError as exc:
        raise ControlError(f'knobs must be a JSON object such as {{"budget": 128}}: {exc}') from None
    if not isinstance(knobs, dict):
        raise ControlError(f'knobs must be a JSON object such as {{"budget": 128}}, not {type(knobs).__name__}')
    return knobs


def policy_from_knobs(name: str, knobs: dict[str, Any]) -> Policy:
    """Policy ``name`` with ``knobs`` by name: the common ones (budget, interval, protection; their
    declared defaults where left out) and the policy's own, through :func:`build_policy` as the
    controls' values go; an unknown knob or a value out of range is a :class:`ControlError`
    with the policy's reason."""
    try:  # checked here too: build_policy takes a checkbox's bool as it comes, and bool("false") is True
        common = {p.name: p.coerce(knobs[p.name]) if p.name in knobs else p.default for p in COMMON_PARAMS}
    except PolicyConfigError as exc:
        raise ControlError(str(exc)) from None
    return build_policy(name, {k: v for k, v in knobs.items() if k not in COMMON_NAMES}, **common)


def _integer(label: str, value: Any) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ControlError(f"{label} must be a whole number, got {value!r}") from None
    if number != number or number != int(number):
        raise ControlError(f"{label} must be a whole number, got {value!r}")
    return int(number)
