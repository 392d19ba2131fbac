"""What the browser's main-thread long tasks spend their time on, from a Chromium performance trace.

``bench browser --profile TRACE.json`` records the Live run under a trace (categories
:data:`TRACE_CATEGORIES`: the timeline and V8's sampling profiler) and reads it back here.
:func:`long_task_breakdown` finds the renderer's main-thread tasks over 50 ms (the ``RunTask``
events of the ``CrRendererMain`` thread) and splits each one by where its JavaScript samples
ran: a sample counts for the script file of its innermost frame that has one (a native call such
as ``getBoundingClientRect`` counts for the script that made it), by file name without its
content hash (``PlotlyPlot``: plotly.js as Gradio bundles it; ``index``: Gradio's own bundle);
a sample with no script on its stack keeps V8's name (``(program)``, ``(garbage collector)``).
Beside the samples, each task sums Blink's own phases (style, layout, paint, compositor commit).
Pure: trace events in, numbers out.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Iterable, Sequence

TRACE_CATEGORIES = [
    "devtools.timeline",
    "disabled-by-default-devtools.timeline",
    "v8.execute",
    "disabled-by-default-v8.cpu_profiler",
    "toplevel",
]
LONG_TASK_MS = 50.0
TASK_EVENTS = ("ThreadControllerImpl::RunTask", "RunTask")
BLINK_PHASES = {
    "UpdateLayoutTree": "style",
    "Layout": "layout",
    "Paint": "paint",
    "PrePaint": "paint",
    "Commit": "commit",
    "Layerize": "commit",
}


@dataclass
class TaskBreakdown:
    """One long task: when it started (ms after the trace's first task), how long it ran, the ms
    of JavaScript samples per source and the ms of Blink's phases in it."""

    start_ms: float
    ms: float
    scripts: Counter = field(default_factory=Counter)
    phases: Counter = field(default_factory=Counter)


def _source(url: str) -> str:
    """``http://…/assets/PlotlyPlot-D9Pvz5DK.js`` → ``PlotlyPlot``."""
    name = url.rsplit("/", 1)[-1].split("?", 1)[0]
    return re.sub(r"-[A-Za-z0-9_]{6,}$", "", name.removesuffix(".js")) or url


def _main_thread(events: Sequence[dict[str, Any]]) -> tuple[int, int] | None:
    """The renderer main thread with the most tasks (a page may have several renderers)."""
    names = {
        (e["pid"], e["tid"]): e.get("args", {}).get("name")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    mains = [key for key, name in names.items() if name == "CrRendererMain"]
    counts = Counter((e.get("pid"), e.get("tid")) for e in events if e.get("name") in TASK_EVENTS)
    return max(mains, key=lambda key: counts[key], default=None)


def _samples(events: Sequence[dict[str, Any]], pid: int) -> tuple[list[tuple[float, float, int]], dict, dict]:
    """The V8 samples of process ``pid`` in time order: ``(time µs, µs until the next sample, node
    id)``, the nodes' call frames and parents."""
    frames: dict[int, dict] = {}
    parents: dict[int, int] = {}
    start = next(
        (e["args"]["data"]["startTime"] for e in events if e.get("name") == "Profile" and e.get("pid") == pid), None
    )
    if start is None:
        return [], frames, parents
    out: list[tuple[float, int]] = []
    now = float(start)
    chunks = sorted(
        (e for e in events if e.get("name") == "ProfileChunk" and e.get("pid") == pid), key=lambda e: e.get("ts", 0)
    )
    for chunk in chunks:
        data = chunk.get("args", {}).get("data", {})
        profile = data.get("cpuProfile", {})
        for node in profile.get("nodes", []):
            frames[node["id"]] = node.get("callFrame", {})
            if "parent" in node:
                parents[node["id"]] = node["parent"]
        for node, delta in zip(profile.get("samples", []), data.get("timeDeltas", [])):
            now += delta
            out.append((now, node))
    out.sort(key=lambda sample: sample[0])
    timed = [(when, max(0.0, later - when), node) for (when, node), (later, _) in zip(out, out[1:] + out[-1:])]
    return timed, frames, parents


def _attribute(node: int, frames: dict, parents: dict) -> str:
    leaf = frames.get(node, {})
    while node is not None:
        url = frames.get(node, {}).get("url")
        if url:
            return _source(url)
        node = parents.get(node)
    return leaf.get("functionName") or "(unknown)"


def long_task_breakdown(events: Iterable[dict[str, Any]], threshold_ms: float = LONG_TASK_MS) -> list[TaskBreakdown]:
    """Every main-thread task over ``threshold_ms`` in the trace ``events``, in order, split as the
    module says."""
    events = list(events)
    main = _main_thread(events)
    if main is None:
        return []
    nested = sorted(
        (
            e
            for e in events
            if (e.get("pid"), e.get("tid")) == main
            and e.get("ph") == "X"
            and e.get("name") in TASK_EVENTS
            and e.get("dur", 0) > threshold_ms * 1000
        ),
        key=lambda e: (e["ts"], -e["dur"]),
    )
    tasks: list[dict[str, Any]] = []
    for task in nested:  # Chromium nests ThreadControllerImpl::RunTask in RunTask: one task, counted once
        if not tasks or task["ts"] >= tasks[-1]["ts"] + tasks[-1]["dur"]:
            tasks.append(task)
    samples, frames, parents = _samples(events, main[0])
    phases = [
        e
        for e in events
        if (e.get("pid"), e.get("tid")) == main and e.get("ph") == "X" and e.get("name") in BLINK_PHASES
    ]
    out = []
    first = tasks[0]["ts"] if tasks else 0
    for task in tasks:
        begin, end = task["ts"], task["ts"] + task["dur"]
        breakdown = TaskBreakdown((begin - first) / 1000, task["dur"] / 1000)
        for when, weight, node in samples:
            if begin <= when < end:
                breakdown.scripts[_attribute(node, frames, parents)] += min(weight, end - when) / 1000
        for phase in phases:
            if begin <= phase["ts"] < end:
                breakdown.phases[BLINK_PHASES[phase["name"]]] += phase.get("dur", 0) / 1000
        out.append(breakdown)
    return out


def breakdown_lines(tasks: Sequence[TaskBreakdown], top: int = 6) -> list[str]:
    """The long tasks summed: their count and ms, the JavaScript sources and Blink phases that took most."""
    scripts, phases = Counter(), Counter()
    for task in tasks:
        scripts.update(task.scripts)
        phases.update(task.phases)
    total = sum(task.ms for task in tasks)
    lines = [
        f"long tasks in the trace: {len(tasks)}, {total:.0f} ms in all; "
        f"JavaScript samples {sum(scripts.values()):.0f} ms, Blink phases {sum(phases.values()):.0f} ms"
    ]
    lines += [f"  js  {ms:8.0f} ms  {source}" for source, ms in scripts.most_common(top)]
    lines += [f"  blink {ms:6.0f} ms  {phase}" for phase, ms in phases.most_common(top)]
    return lines
