"""Registry of eviction policies by name, with their declared parameters."""

from __future__ import annotations

from typing import Any

from .base import Param, Policy, PolicyConfigError, ScoreScale

POLICIES: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make ``cls`` available under ``cls.name``."""
    if not cls.name or cls.name in POLICIES:
        raise ValueError(f"policy name {cls.name!r} is empty or already registered")
    POLICIES[cls.name] = cls
    return cls


def policy_names() -> list[str]:
    return list(POLICIES)


def policy_class(name: str) -> type[Policy]:
    try:
        return POLICIES[name]
    except KeyError:
        raise PolicyConfigError(f"unknown policy {name!r}; choose one of: {', '.join(POLICIES)}") from None


def make_policy(name: str, **values: Any) -> Policy:
    """Build a policy from its name and parameter values (validated against declared ranges)."""
    return policy_class(name)(**values)


def policy_params(name: str) -> tuple[Param, ...]:
    """Every parameter (common + own) the named policy accepts, with ranges for sliders."""
    return policy_class(name).all_params()


def lookup(name: str) -> type[Policy]:
    """The class registered as ``name``, or for a name this version does not know (an older
    recording's policy) the :class:`Policy` base, whose class traits are the generic ones."""
    return POLICIES.get(name, Policy)


def score_scale(name: str) -> ScoreScale | None:
    """What policy ``name``'s score grades (``None``: nothing graded, no heat to show); a policy
    this version does not know gets the generic scale."""
    return lookup(name).score_scale


def policy_values(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The subset of ``params`` that policy ``name`` declares (others ignore a knob they lack)."""
    declared = {p.name for p in policy_params(name)}
    return {key: value for key, value in params.items() if key in declared}
