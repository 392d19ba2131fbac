"""Every declared knob is a typed attribute of the policy, equal to its validated config value."""

from __future__ import annotations

import inspect

import pytest

from thinkviz.policies import Param, make_policy, policy_class, policy_names, policy_params

KIND_TYPES = {"bool": bool, "int": int, "float": float, "choice": str}


def _other_value(param: Param) -> float | int | bool | str:
    """A valid value of ``param`` other than its default: the other flag, another choice, or the
    end of its range the default is not at."""
    if param.kind == "bool":
        return not param.default
    if param.kind == "choice":
        return next(choice for choice in param.choices if choice != param.default)
    return param.high if param.default != param.high else param.low


@pytest.mark.parametrize("name", policy_names())
def test_every_declared_knob_is_an_attribute_of_its_kind(name):
    policy = make_policy(name)
    assert [p.name for p in policy_params(name)] == list(policy.config)
    for param in policy_params(name):
        value = getattr(policy, param.name)
        assert value == policy.config[param.name] == param.coerce(param.default), param.name
        assert type(value) is KIND_TYPES[param.kind], param.name


@pytest.mark.parametrize("name", policy_names())
def test_a_knob_set_through_make_policy_shows_as_the_attribute(name):
    for param in policy_params(name):
        value = _other_value(param)
        budget = {"budget": value} if param.name == "budget" else {"budget": 4096}
        policy = make_policy(name, **{**budget, param.name: value})
        assert getattr(policy, param.name) == policy.config[param.name] == value, param.name
        assert type(getattr(policy, param.name)) is KIND_TYPES[param.kind], param.name


@pytest.mark.parametrize("name", policy_names())
def test_no_knob_hides_a_method_or_property(name):
    cls = policy_class(name)
    for param in policy_params(name):
        found = inspect.getattr_static(cls, param.name, None)
        assert not callable(found) and not isinstance(found, property), f"{name}.{param.name}"
