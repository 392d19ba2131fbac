"""Failures inside a run (the model, a policy, device memory) turned into one-line messages.

A run that fails must end with a message and leave the process usable: the UI and the CLI
drive their runs through :func:`guard_frames`, which turns any exception raised while a
run streams into a :class:`RunFault`.  The original traceback is logged as text and not
kept, so nothing holds the failed run's cache once the fault is raised; on a GPU the
allocator's freed blocks are then handed back (``torch.cuda.empty_cache``).
"""

from __future__ import annotations

import gc
import logging
import traceback
from typing import TypeVar
from collections.abc import Iterator

import torch

log = logging.getLogger(__name__)
T = TypeVar("T")


class RunFault(RuntimeError):
    """A run ended by a failure inside the model, a policy or the device; the message says which."""


def fault_message(exc: BaseException, label: str) -> str:
    """One line for the user: what failed in ``label`` (e.g. ``"the h2o run"``) and what to try."""
    if isinstance(exc, torch.OutOfMemoryError):
        return (
            f"{label} ran out of device memory and was stopped; its cache is freed. "
            "Try a smaller budget, fewer new tokens or a shorter prompt."
        )
    reason = " ".join(str(exc).split()) or "no message"
    return f"{label} failed: {type(exc).__name__}: {reason}"


def release_device_memory(device: str | torch.device | None) -> None:
    """Collect freed objects and, on CUDA, return the allocator's cached blocks to the device."""
    gc.collect()
    if device is not None and torch.device(device).type == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()


def guard_frames(
    frames: Iterator[T], label: str, device: str | torch.device | None, passthrough: tuple[type, ...] = ()
) -> Iterator[T]:
    """Yield from ``frames``; an exception inside (other than ``passthrough``) ends them with a
    :class:`RunFault` raised after the failed run is dropped and device memory released."""
    try:
        yield from frames
    except passthrough:
        raise
    except Exception as exc:  # a boundary: the caller shows the message, the process lives on
        log.error("%s failed:\n%s", label, "".join(traceback.format_exception(exc)))
        fault = RunFault(fault_message(exc, label))
    else:
        return
    # Out of the ``except`` block the traceback (and with it the run's frames) is gone.
    frames = None
    release_device_memory(device)
    raise fault
