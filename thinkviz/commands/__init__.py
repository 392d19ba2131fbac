"""Subcommands of ``python -m thinkviz``; importing a module registers it."""

from . import bench, generate  # noqa: F401
