"""Running a sweep's groups: in this process (the default) or on Ray workers, resumable, retried.

:func:`run_groups` hands the groups that are not stored yet to an executor, saves each result
the moment it comes back (:class:`~thinkviz.sweep.store.GroupStore`), gives every group that
failed one more try, and reports the groups that failed twice by name, with the reason, while
the others finish.  Bad input — a trace that does not fit, a knob a policy refuses, a KV
format the model cannot store — stops the whole sweep at once, as it always did: retrying
cannot mend it.

The executors are in :mod:`thinkviz.sweep.work` (in this process) and :mod:`thinkviz.sweep.ray_pool`
(Ray workers), which :func:`open_executor` imports only when workers are asked for, so Ray
stays optional.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator, Sequence

from ..core.engine import EngineError
from ..core.faults import fault_message
from ..models.loading import LoadedModel
from ..policies import PolicyConfigError
from ..measure.replay import TraceError
from .grid import Group, GroupResult, Progress, SweepSettings, order_rows
from .store import DamagedGroup, GroupStore
from .work import Executor, InProcess, ModelSpec, WorkerError

FATAL = (TraceError, PolicyConfigError, EngineError)  # bad input: every attempt would fail the same way
GroupsProgress = Callable[[int, int, str], None]  # (groups finished, groups in all, the newest one's name)


@contextlib.contextmanager
def open_executor(
    load: Callable[[], LoadedModel],
    spec: ModelSpec,
    workers: int | None = None,
    address: str | None = None,
    runs_dir: Path | None = None,
    progress: Progress | None = None,
) -> Iterator[Executor]:
    """:class:`InProcess` when neither ``workers`` nor ``address`` is given; otherwise a Ray
    executor: ``workers`` local workers, or the cluster at ``address`` (``workers`` of its CPUs,
    by default all of them).  Closed (Ray shut down) when the block ends."""
    if workers is None and address is None:
        yield InProcess(load, runs_dir, progress)
        return
    try:
        from .ray_pool import RayExecutor  # Ray is optional: imported only when a sweep asks for workers
    except ImportError as exc:
        raise WorkerError(f"sweep workers need Ray ({exc}); install it with 'pip install ray'") from None

    with RayExecutor(spec, workers, address, runs_dir) as executor:
        yield executor


@dataclass(frozen=True)
class GroupFailure:
    """A group that failed on both tries: its name and why."""

    name: str
    reason: str


@dataclass
class SweepOutcome:
    """Every finished group's result by name, the groups that failed, and how many came from the store."""

    results: dict[str, GroupResult] = field(default_factory=dict)
    failures: list[GroupFailure] = field(default_factory=list)
    reused: int = 0

    def rows(self, groups: Sequence[Group]) -> list[dict[str, Any]]:
        return order_rows(groups, self.results)


def run_groups(
    groups: Sequence[Group],
    settings: SweepSettings,
    executor: Executor,
    store: GroupStore | None = None,
    resume: bool = False,
    progress: GroupsProgress | None = None,
    warn: Callable[[str], None] = lambda message: None,
) -> SweepOutcome:
    """Compute ``groups`` with ``executor``; with ``resume``, take the ones ``store`` holds from it
    (a damaged file is reported through ``warn`` and computed again).  Each new result is saved
    to ``store`` as it arrives; a failed group is tried once more after the others.  Raises the
    first :data:`FATAL` error a group meets."""
    outcome = SweepOutcome()
    todo = []
    for group in groups:
        stored = None
        if store is not None and resume:
            try:
                stored = store.load(group)
            except DamagedGroup as exc:
                warn(f"group {group.name}: {exc}; computing it again")
        if stored is None:
            todo.append(group)
        else:
            outcome.results[group.name] = stored
    outcome.reused = len(outcome.results)
    if progress is not None:
        progress(outcome.reused, len(groups), "")
    reasons: dict[str, str] = {}
    for _attempt in range(2):
        failed = []
        for group, result in executor.run(todo, settings):
            if isinstance(result, FATAL):
                raise result
            if isinstance(result, BaseException):
                failed.append(group)
                reasons[group.name] = fault_message(result, f"group {group.name}")
                continue
            outcome.results[group.name] = result
            if store is not None:
                store.save(group, result)
            if progress is not None:
                progress(len(outcome.results), len(groups), group.name)
        todo = failed
        if not todo:
            break
    outcome.failures = [GroupFailure(group.name, reasons[group.name]) for group in todo]
    return outcome
