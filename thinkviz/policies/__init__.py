"""Eviction policies: one per module, each registered under its ``name``."""

from . import full, window, streaming, h2o, tova, snapkv  # noqa: F401  (registration, in this order)
from . import entropy, think_drop, tam, am, dynts, rkv, merge  # noqa: F401
from . import knorm, keydiff, random_eviction, pyramidkv, adakv  # noqa: F401
from .base import CacheView, Param, Policy, PolicyConfigError, ScoreScale
from .full import REFERENCE_POLICY
from .registry import POLICIES, lookup, make_policy, policy_class, policy_names, policy_params, score_scale

__all__ = [
    "CacheView",
    "Param",
    "Policy",
    "PolicyConfigError",
    "POLICIES",
    "lookup",
    "REFERENCE_POLICY",
    "ScoreScale",
    "make_policy",
    "policy_class",
    "policy_names",
    "policy_params",
    "score_scale",
]
