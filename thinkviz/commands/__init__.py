"""Subcommands of ``python -m thinkviz``; importing a module registers it."""

from . import bench, generate, policies, train_predictor  # noqa: F401
