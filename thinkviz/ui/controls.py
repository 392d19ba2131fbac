"""Policy parameter controls: a fixed pool of sliders and checkboxes, assigned per policy.

Gradio needs its components up front, so the Live tab owns ``n`` number slots and ``m``
checkbox slots (the most any registered policy needs).  When the user picks a policy,
:func:`slot_specs` says which of its declared :class:`~thinkviz.policies.Param` goes in which
slot (the rest are hidden); on Generate, :func:`collect_params` maps slot values back to
parameter names.  The common knobs (budget, interval, protection) have their own controls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..policies import Param, make_policy, policy_class, policy_names
from ..policies.base import COMMON_PARAMS, Policy

COMMON_NAMES = tuple(p.name for p in COMMON_PARAMS)


class ControlError(ValueError):
    """Control values that cannot make a policy; the message is shown to the user."""


@dataclass(frozen=True)
class SlotSpec:
    """What one slot shows: a parameter with its range, or nothing (hidden)."""

    name: str
    label: str
    kind: str  # "int" | "float" | "bool"
    value: float | int | bool
    low: float | int | None = None
    high: float | int | None = None
    step: float | int | None = None
    help: str = ""


def own_params(name: str) -> tuple[Param, ...]:
    """The parameters ``name`` declares beyond the common ones, in declaration order."""
    return tuple(p for p in policy_class(name).all_params() if p.name not in COMMON_NAMES)


def pool_sizes(names: Sequence[str] | None = None) -> tuple[int, int]:
    """``(numbers, checkboxes)``: slots needed so every policy in ``names`` fits."""
    names = list(names or policy_names())
    numbers = max((sum(p.kind != "bool" for p in own_params(n)) for n in names), default=0)
    flags = max((sum(p.kind == "bool" for p in own_params(n)) for n in names), default=0)
    return numbers, flags


def pool_bounds(names: Sequence[str] | None = None) -> tuple[float, float]:
    """``(lowest, highest)`` over every numeric parameter of ``names``: a range no slot value leaves."""
    specs = [_spec(p, p.default) for n in (names or policy_names()) for p in own_params(n) if p.kind != "bool"]
    if not specs:
        return 0, 1
    return min(s.low for s in specs), max(s.high for s in specs)


def _spec(param: Param, value: Any) -> SlotSpec:
    label = param.name.replace("_", " ")
    if param.kind == "bool":
        return SlotSpec(param.name, label, "bool", bool(value), help=param.help)
    low = param.low if param.low is not None else 0
    high = param.high if param.high is not None else max(1, 4 * abs(param.default))
    step = param.step if param.step is not None else (1 if param.kind == "int" else (high - low) / 100)
    return SlotSpec(param.name, label, param.kind, value, low, high, step, param.help)


def slot_specs(
    name: str, numbers: int, flags: int, values: dict[str, Any] | None = None
) -> tuple[list[SlotSpec | None], list[SlotSpec | None]]:
    """Assign ``name``'s own parameters to ``numbers`` number slots and ``flags`` checkbox slots.

    ``values`` overrides defaults (a preset's parameters).  Unused slots are ``None``.
    """
    values = values or {}
    own = own_params(name)
    number_specs = [_spec(p, values.get(p.name, p.default)) for p in own if p.kind != "bool"]
    flag_specs = [_spec(p, values.get(p.name, p.default)) for p in own if p.kind == "bool"]
    if len(number_specs) > numbers or len(flag_specs) > flags:
        raise ControlError(f"policy {name!r} has more parameters than the controls can show")
    return (
        number_specs + [None] * (numbers - len(number_specs)),
        flag_specs + [None] * (flags - len(flag_specs)),
    )


def collect_params(name: str, number_values: Sequence[Any], flag_values: Sequence[Any]) -> dict[str, Any]:
    """Slot values back to ``{param: value}`` for ``name`` (the inverse of :func:`slot_specs`)."""
    own = own_params(name)
    numbers = iter(number_values)
    flags = iter(flag_values)
    out: dict[str, Any] = {}
    for param in own:
        source = flags if param.kind == "bool" else numbers
        value = next(source, None)
        if value is None:
            raise ControlError(f"no value for {param.name}")
        out[param.name] = int(round(value)) if param.kind == "int" else value
    return out


def build_policy(name: str, params: dict[str, Any], *, budget: Any, interval: Any,
                 protect_system: bool, protect_question: bool) -> Policy:
    """The policy the controls describe; :class:`ControlError` with the policy's own reason."""
    from ..policies import PolicyConfigError

    if not name:
        raise ControlError("choose a policy")
    try:
        return make_policy(
            name,
            **params,
            budget=_integer("budget", budget),
            interval=_integer("interval", interval),
            protect_system=bool(protect_system),
            protect_question=bool(protect_question),
        )
    except PolicyConfigError as exc:
        raise ControlError(str(exc)) from None


def _integer(label: str, value: Any) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ControlError(f"{label} must be a whole number, got {value!r}") from None
    if number != number or number != int(number):
        raise ControlError(f"{label} must be a whole number, got {value!r}")
    return int(number)
