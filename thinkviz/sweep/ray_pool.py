"""Sweep groups on Ray: a local runtime of N workers, or an existing cluster; one model per worker.

Each worker is an actor (:class:`SweepWorker`, one CPU, ``OMP_NUM_THREADS=1`` so N workers do not
oversubscribe the cores) that loads the model once and then computes every group it is handed
with :func:`thinkviz.sweep.work.compute_group` — the function the in-process sweep runs.
:class:`RayExecutor` hands a group to each idle worker and collects them with ``ray.wait`` as
they finish, so a long group never holds up the others; a worker that dies is replaced by a
fresh one (its group then fails, and :func:`~thinkviz.sweep.runner.run_groups` tries it again).
(``ray.util.ActorPool`` does the handing out too, but it cannot say which group a failed
result belonged to, and it hands a dead actor the next task.)

A cluster: ``ray start --head --port=6379`` on the head machine, ``ray start --address=HEAD:6379``
on every other, then ``--ray-address HEAD:6379``.  Every machine needs the project's
requirements (torch, transformers, …) and the model; the ``thinkviz`` package itself travels
with the job (``runtime_env`` ``py_modules``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from collections.abc import Iterator, Sequence

import ray
import ray.exceptions

import thinkviz

from ..models.loading import ModelLoadError
from .grid import Group, GroupResult, SweepSettings
from .work import ModelSpec, Outcome, WorkerError, compute_group

THREADS_PER_WORKER = "1"
LOCAL_OBJECT_STORE_BYTES = 256 * 1024**2  # results are a few kB; do not reserve 30 % of the memory


class WorkerDied(RuntimeError):
    """The worker computing a group died (killed, out of memory, its machine gone)."""


@ray.remote(num_cpus=1)
class SweepWorker:
    """One model, loaded when the worker starts; :meth:`run` computes one group on it."""

    def __init__(self, spec: ModelSpec) -> None:
        try:
            self.loaded, self.error = spec.load(), None
        except ModelLoadError as exc:
            self.loaded, self.error = None, str(exc)

    def ready(self) -> dict[str, object]:
        """Why the model did not load (``error``), or None, and this worker's process id."""
        return {"error": self.error, "pid": os.getpid()}

    def run(self, group: Group, settings: SweepSettings, runs_dir: Path | None) -> GroupResult:
        if self.loaded is None:
            raise WorkerError(self.error)
        return compute_group(self.loaded, group, settings, runs_dir)


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def connect(address: str | None = None, workers: int | None = None) -> bool:
    """Start a local Ray runtime of ``workers`` CPUs (``address`` None) or join the cluster at
    ``address``, with the workers' environment (one thread each, the ``thinkviz`` package).
    Does nothing when this process is connected to Ray already (a notebook, a test module).
    True when it connected here, so the caller shuts Ray down; :class:`WorkerError` if it cannot."""
    if ray.is_initialized():
        return False
    runtime_env = {
        "env_vars": {"OMP_NUM_THREADS": THREADS_PER_WORKER, "MKL_NUM_THREADS": THREADS_PER_WORKER},
        "py_modules": [thinkviz],
    }
    local = address is None
    try:
        ray.init(
            address="local" if local else address,
            num_cpus=workers if local else None,
            object_store_memory=LOCAL_OBJECT_STORE_BYTES if local else None,
            runtime_env=runtime_env,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise WorkerError(f"cannot start Ray at {address or 'this machine'}: {_first_line(exc)}") from None
    return True


class RayExecutor:
    """``workers`` Ray workers on a local runtime (``address`` None) or on the cluster at ``address``
    (``workers`` None: one per CPU of the cluster; never more workers than CPUs); a process
    already connected to Ray starts them there.  Use as a context manager: entering connects
    (:func:`connect`) and waits until every worker has loaded its model (:class:`WorkerError`
    if one cannot); leaving ends the workers, and shuts Ray down if it was started here."""

    def __init__(
        self, spec: ModelSpec, workers: int | None, address: str | None = None, runs_dir: Path | None = None
    ) -> None:
        self.spec = spec
        self.count = workers
        self.address = address
        self.runs_dir = runs_dir
        self.workers: list = []
        self.pids: list[int] = []
        self._owns = False

    def __enter__(self) -> RayExecutor:
        self._owns = connect(self.address, self.count)
        try:
            cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
            count = min(self.count or cpus, cpus)  # a worker more than the CPUs would wait for one forever
            self.workers = [SweepWorker.remote(self.spec) for _ in range(count)]
            self.pids = [self._wait_ready(worker) for worker in self.workers]
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
        if self._owns:
            ray.shutdown()

    def _wait_ready(self, worker) -> int:
        try:
            report = ray.get(worker.ready.remote())
        except ray.exceptions.RayActorError as exc:
            raise WorkerError(f"a Ray worker did not start: {_first_line(exc)}") from None
        if report["error"]:
            raise WorkerError(f"a Ray worker could not load the model: {report['error']}")
        return int(report["pid"])

    def run(self, groups: Sequence[Group], settings: SweepSettings) -> Iterator[tuple[Group, Outcome]]:
        """Yield ``(group, result or exception)`` as the workers finish them, in any order."""
        queue = list(reversed(groups))  # popped from the end: handed out in the sweep's order
        idle = list(range(len(self.workers)))
        pending: dict = {}
        while queue or pending:
            while queue and idle:
                slot, group = idle.pop(0), queue.pop()
                pending[self.workers[slot].run.remote(group, settings, self.runs_dir)] = (group, slot)
            [ready], _ = ray.wait(list(pending), num_returns=1)
            group, slot = pending.pop(ready)
            try:
                outcome: Outcome = ray.get(ready)
            except ray.exceptions.RayActorError as exc:
                outcome = WorkerDied(f"its worker died: {_first_line(exc)}")
                self.workers[slot] = SweepWorker.remote(self.spec)
                self.pids[slot] = self._wait_ready(self.workers[slot])
            except ray.exceptions.RayTaskError as exc:
                outcome = exc.cause if isinstance(exc.cause, BaseException) else exc
            idle.append(slot)
            yield group, outcome
