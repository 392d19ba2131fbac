"""What computes a sweep group, wherever it runs: the model as asked for, the one group function,
and the in-process executor.

An executor has ``run(groups, settings)``, which yields ``(group, GroupResult or the exception
that ended it)`` as each group finishes, in any order; every executor computes a group with
:func:`compute_group`.  :class:`InProcess` runs them one after another in this process; the Ray
executor (:mod:`thinkviz.sweep.ray_pool`) runs them on one model per worker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from collections.abc import Callable, Iterator, Sequence

from ..models.loading import LoadedModel
from ..models.sources import load_any
from .grid import Group, GroupResult, Progress, SweepSettings, run_group

Outcome = GroupResult | BaseException


class WorkerError(RuntimeError):
    """The workers could not be started (no Ray, no cluster at the address, a model that does not load)."""


@dataclass(frozen=True)
class ModelSpec:
    """A model as asked for — what a worker loads and what a stored group is keyed by."""

    name: str
    quantization: str = "4bit"
    device: str | None = None
    backend: str = "auto"

    def load(self, progress: Callable[[float, str], None] | None = None) -> LoadedModel:
        return load_any(self.name, self.quantization, self.device, progress, backend=self.backend)


def compute_group(
    loaded: LoadedModel,
    group: Group,
    settings: SweepSettings,
    runs_dir: Path | None = None,
    progress: Progress | None = None,
) -> GroupResult:
    """What every executor runs for one group: :func:`~thinkviz.sweep.grid.run_group`, then, with
    ``runs_dir``, every run's recording saved there as ``TRACE-POLICY-BUDGET`` (the budget's
    label with its punctuation turned into dashes), ``-FORMAT`` added for a quantized KV format and
    ``-KNOB=VALUE`` for the knobs the run varied."""
    result, replay = run_group(loaded, group, settings, progress)
    if runs_dir is not None:
        for row, run in zip(result.rows, [replay.reference, *replay.runs]):
            label = re.sub(r"\W+", "-", row["budget"]).strip("-")  # "25%" -> "25", "25% of seen" -> "25-of-seen"
            kv = "" if row["kv_quant"] == "none" else f"-{row['kv_quant'].replace('/', '-')}"
            varied = re.sub(r"[^A-Za-z0-9_.=-]+", "_", row["knobs"])
            stem = f"{group.trace.name}-{row['policy']}-{label}{kv}" + (f"-{varied}" if varied else "")
            run.record.save(Path(runs_dir) / stem)
    return result


class Executor(Protocol):
    def run(self, groups: Sequence[Group], settings: SweepSettings) -> Iterator[tuple[Group, Outcome]]: ...


class InProcess:
    """Groups one after another in this process, on one model loaded when the first group needs it."""

    def __init__(
        self, load: Callable[[], LoadedModel], runs_dir: Path | None = None, progress: Progress | None = None
    ) -> None:
        self._load = load
        self._loaded: LoadedModel | None = None
        self.runs_dir = runs_dir
        self.progress = progress

    def run(self, groups: Sequence[Group], settings: SweepSettings) -> Iterator[tuple[Group, Outcome]]:
        for group in groups:
            if self._loaded is None:
                self._loaded = self._load()
            try:
                outcome: Outcome = compute_group(self._loaded, group, settings, self.runs_dir, self.progress)
            except Exception as exc:  # a boundary: the group is retried or reported, the sweep goes on
                outcome = exc
            yield group, outcome
