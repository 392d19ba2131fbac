"""The Sweep tab's run: a trace through policies × budgets, then the memory-vs-fidelity plot.

:func:`~thinkviz.sweep.grid.sweep_trace` reports progress through a callback, so it runs in
a worker thread and :func:`sweep_frames` turns its progress into paced status frames; the
last frame carries :func:`~thinkviz.viz.pareto.pareto_figure` and the result table.  With a
:class:`RayTarget` (``app.py --ray-address``) the trace's groups run on that Ray cluster
instead (:func:`~thinkviz.sweep.runner.run_groups`), each worker loading the app's model.
:func:`sweep_request` checks the tab's control values into a :class:`SweepRequest`, by name.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Iterator, Sequence

from ..core.faults import RunFault, fault_message, release_device_memory
from ..models.loading import LoadedModel
from ..policies import REFERENCE_POLICY, PolicyConfigError, policy_names
from ..demos.presets import Preset
from ..measure.replay import Trace, TraceError, load_trace
from ..sweep.grid import (
    Budget,
    SweepSettings,
    check_vary,
    parse_budgets,
    parse_policies,
    parse_vary,
    plan_groups,
    sweep_trace,
    vary_grid,
    write_rows,
)
from ..sweep.runner import open_executor, run_groups
from ..sweep.work import ModelSpec, WorkerError
from ..units import format_bytes
from ..viz.pareto import pareto_figure
from ..viz.tables import run_label
from .controls import ControlError, parse_knobs
from .model_slot import ModelSlot
from ..measure.requests import RunInputError

TABLE_COLUMNS = ["policy", "budget", "peak KV", "KV kept", "compression", "ΔNLL (nats)", "KL(full‖policy)", "top-1"]


@dataclass(frozen=True)
class RayTarget:
    """Where the Sweep tab runs its groups: the Ray cluster at ``address``, each worker loading ``spec``."""

    address: str
    spec: ModelSpec


def ray_target(address: str | None, slot: ModelSlot, backend: str) -> RayTarget | None:
    """The Ray cluster at ``address`` with workers loading the slot's model as it was asked for
    (name, quantization, device, ``backend``); None without an address."""
    if address is None:
        return None
    status = slot.status
    return RayTarget(address, ModelSpec(status.name, status.quantization, slot.device, backend))


@dataclass
class SweepFrame:
    """Progress of a sweep; ``rows`` / ``figure`` / ``table`` are set on the last frame."""

    status: str
    rows: list[dict[str, Any]] | None = None
    figure: Any = None
    table: list[list[Any]] | None = None


@dataclass(frozen=True)
class SweepPreset:
    """What a replay preset sets in the Sweep tab: the policies it compares (the full cache is
    always the reference), its interval and its knobs (the protection flags among them)."""

    policies: list[str]
    interval: int
    params: dict[str, Any]

    @classmethod
    def of(cls, preset: Preset) -> SweepPreset:
        wanted = [name for name in (preset.compare or (preset.policy,)) if name != REFERENCE_POLICY]
        known = [name for name in wanted if name in policy_names()]
        params = {key: value for key, value in preset.params.items() if key not in ("budget", "interval")}
        return cls(known, int(preset.params.get("interval", 32)), params)


def table_rows(rows: Sequence[dict[str, Any]]) -> list[list[Any]]:
    """The sweep rows as the tab's table (formatted, one per run, the full cache first)."""

    def number(value: Any, fmt: str) -> str:
        return "—" if value is None or value != value else format(value, fmt)

    return [
        [
            run_label(row),
            row["budget"],
            format_bytes(row["peak_kv_bytes"]),
            number(row["kv_fraction"], ".0%"),
            number(row["compression"], ".1f") + "×",
            number(row["nll_delta"], "+.4f"),
            number(row["kl"], ".4f"),
            number(row["top1"], ".1%"),
        ]
        for row in rows
    ]


def sweep_frames(
    loaded: LoadedModel,
    trace: Trace,
    policies: Sequence[str],
    budgets: Sequence[Budget],
    interval: int,
    params: dict[str, Any],
    metric: str = "kl",
    max_trace_tokens: int | None = None,
    poll: float = 0.25,
    ray: RayTarget | None = None,
    vary: dict[str, list[str]] | None = None,
) -> Iterator[SweepFrame]:
    """Run the sweep in a worker thread (its groups on the ``ray`` cluster when given); yield a
    status frame with the newest progress at most every ``poll`` seconds, then the result.
    ``vary`` (:func:`~thinkviz.sweep.grid.parse_vary`) runs each policy once per value of the knobs it
    declares, as ``bench sweep --vary`` does.  Raises :class:`RunInputError` for a bad trace or knob
    and :class:`~thinkviz.core.faults.RunFault` when the model or a policy fails mid-sweep (on Ray: when
    every group failed; otherwise the last frame names the failed ones)."""
    if not policies:
        raise RunInputError("Choose at least one policy to sweep.")
    reports: queue.Queue = queue.Queue()
    outcome: dict[str, Any] = {"failed": []}
    variants = sum(len(vary_grid(name, vary or {})) for name in policies)
    runs = 1 + variants * len(budgets)

    def in_process() -> None:
        def progress(name: str, done: int, total: int) -> None:
            reports.put(f"Replaying {name} through {runs} runs in lockstep… {done}/{total} tokens")

        outcome["rows"], _ = sweep_trace(
            loaded,
            trace,
            policies,
            budgets,
            interval,
            params,
            progress=progress,
            max_trace_tokens=max_trace_tokens,
            vary=vary,
        )

    def on_ray() -> None:
        settings = SweepSettings(tuple(policies), interval, dict(params), max_trace_tokens, dict(vary or {}))
        groups = plan_groups([trace], budgets)
        with open_executor(lambda: loaded, ray.spec, len(groups), ray.address) as executor:
            reports.put(f"Replaying {trace.name} on Ray at {ray.address}: 0/{len(groups)} groups…")
            done = run_groups(
                groups,
                settings,
                executor,
                progress=lambda finished, total, name: reports.put(
                    f"Replaying {trace.name} on Ray at {ray.address}: {finished}/{total} groups…"
                ),
            )
        if not done.results:
            raise WorkerError("; ".join(failure.reason for failure in done.failures))
        outcome["rows"], outcome["failed"] = done.rows(groups), done.failures

    def work() -> None:
        try:
            (in_process if ray is None else on_ray)()
        except (TraceError, PolicyConfigError) as exc:
            outcome["error"] = RunInputError(str(exc))
        except Exception as exc:  # a boundary: the tab must show why the sweep failed
            outcome["error"] = RunFault(fault_message(exc, "the sweep"))
        finally:
            reports.put(None)

    worker = threading.Thread(target=work, name="thinkviz-sweep", daemon=True)
    worker.start()
    where = "" if ray is None else f" — starting workers on Ray at {ray.address}"
    varied = f" in {variants} variants" if variants != len(policies) else ""
    yield SweepFrame(
        f"Prefilling {runs} runs (the full cache + {len(policies)} policies{varied} × {len(budgets)} budgets){where}…"
    )
    finished = False
    while not finished:
        batch = [reports.get()]
        while not reports.empty():
            batch.append(reports.get_nowait())
        finished = None in batch
        progress = [report for report in batch if report is not None]
        if progress:
            yield SweepFrame(progress[-1])
        if not finished:
            time.sleep(poll)  # pace the frames; reports arriving meanwhile are merged
    worker.join()
    if "error" in outcome:
        release_device_memory(loaded.device)  # the worker's runs are gone with its frames
        raise outcome["error"]
    rows = outcome["rows"]
    failed = "".join(f" Failed twice: {failure.reason}." for failure in outcome["failed"])
    yield SweepFrame(
        f"Done: {len(rows)} runs on {trace.name}.{failed}", rows, pareto_figure(rows, metric), table_rows(rows)
    )


@dataclass(frozen=True)
class SweepRequest:
    """A sweep as the Sweep tab's controls describe it, checked (:func:`sweep_request`)."""

    trace: Trace
    policies: list[str]
    budgets: list[Budget]
    budgets_text: str | None  # the budgets as the user wrote them (the result files keep them so)
    budget_mode: str  # "tokens": a fraction of the whole trace; "fraction": of the tokens seen so far
    interval: int  # tokens per forward pass
    max_trace_tokens: int | None  # replay only the trace's first tokens (None: all of it)
    params: dict[str, Any]  # the policies' knobs, the protection flags among them
    vary: dict[str, list[str]]  # knob → values: each policy that takes the knob runs once per value


def sweep_request(
    *,
    trace: str | None,
    policies: Sequence[str] | None,
    budgets: str | None,
    budget_mode: str,
    interval: float,
    protect_system: bool,
    protect_question: bool,
    knobs: str,
    trace_tokens: float,
    vary: str | None,
) -> SweepRequest:
    """The sweep the controls' values describe (``trace``: a trace file; ``knobs``: ``name=value, …``;
    ``vary``: ``KNOB=V1,V2;…``; ``trace_tokens`` 0: the whole trace).  Raises :class:`RunInputError`
    or :class:`~thinkviz.ui.controls.ControlError` with the reason."""
    if not trace:
        raise RunInputError("Choose a trace to sweep.")
    chosen = parse_policies(",".join(policies or []))
    own = parse_knobs(knobs, chosen)
    params = {**own, "protect_system": bool(protect_system), "protect_question": bool(protect_question)}
    try:
        varied = parse_vary(vary or "")
        check_vary(chosen, varied)
    except ValueError as exc:
        raise ControlError(f"{exc} (vary)") from None
    both = sorted(set(varied) & set(own))
    if both:
        raise ControlError(f"{', '.join(both)} is both varied and set in the policy knobs: give it one way.")
    running = budget_mode == "fraction"
    if running and "budget" in varied:
        raise ControlError(
            "The budget is a fraction of the tokens seen: give its values in Budgets, not in Vary a knob."
        )
    return SweepRequest(
        trace=load_trace(trace),
        policies=chosen,
        budgets=parse_budgets(budgets or "", running),
        budgets_text=budgets,
        budget_mode=budget_mode,
        interval=int(interval),
        max_trace_tokens=int(trace_tokens) or None,
        params=params,
        vary=varied,
    )


def sweep_meta(loaded: LoadedModel, request: SweepRequest) -> dict[str, Any]:
    """What a sweep's result files say about how it was run."""
    return {
        "model": loaded.name,
        "quantization": loaded.quantization,
        "backend": loaded.backend,
        "trace": request.trace.name,
        "interval": request.interval,
        "budgets": request.budgets_text,
        "budget_mode": request.budget_mode,
        "policies": list(request.policies),
        "params": dict(request.params),
        "max_trace_tokens": request.max_trace_tokens,
        "vary": dict(request.vary),
    }


def export_sweep(rows: list[dict[str, Any]], meta: dict[str, Any], folder: str | Path) -> list[str]:
    """Write the sweep's CSV, JSON and Pareto HTML into ``folder``; return their paths."""
    return [str(path) for path in write_rows(rows, Path(folder), meta).values()]
