"""Subcommands of ``python -m thinkviz``; importing a module registers it."""

from . import bench, generate, train_predictor  # noqa: F401
