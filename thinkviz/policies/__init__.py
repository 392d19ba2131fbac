"""Eviction policies: one per module, each registered under its ``name``."""

from . import full, h2o, snapkv, streaming, tova, window  # noqa: F401  (registration)
from .base import CacheView, Param, Policy, PolicyConfigError
from .registry import POLICIES, make_policy, policy_class, policy_names, policy_params

__all__ = [
    "CacheView",
    "Param",
    "Policy",
    "PolicyConfigError",
    "POLICIES",
    "make_policy",
    "policy_class",
    "policy_names",
    "policy_params",
]
