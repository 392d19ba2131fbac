"""Reading a Chromium performance trace: the renderer's long tasks, split by the script their samples ran
in (``bench browser --profile``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from thinkviz.bench.trace_profile import breakdown_lines, long_task_breakdown

PLOTLY = "http://127.0.0.1:7860/assets/PlotlyPlot-D9Pvz5DK.js"
GRADIO = "http://127.0.0.1:7860/assets/index-DphvyggB.js"
MAIN, OTHER = (10, 1), (10, 7)  # the renderer's main thread; another thread of the same process


def _thread(key, name):
    return {"ph": "M", "name": "thread_name", "pid": key[0], "tid": key[1], "args": {"name": name}}


def _task(start_ms, ms, name="ThreadControllerImpl::RunTask", key=MAIN):
    return {"ph": "X", "name": name, "pid": key[0], "tid": key[1], "ts": start_ms * 1000, "dur": ms * 1000}


def _trace():
    nodes = [
        {"id": 1, "callFrame": {"functionName": "(root)"}},
        {"id": 2, "parent": 1, "callFrame": {"functionName": "react", "url": PLOTLY}},
        {"id": 3, "parent": 2, "callFrame": {"functionName": "getBoundingClientRect"}},  # native, for plotly
        {"id": 4, "parent": 1, "callFrame": {"functionName": "flush", "url": GRADIO}},
        {"id": 5, "parent": 1, "callFrame": {"functionName": "(garbage collector)"}},
    ]
    # one sample every 10 ms from t = 1000 ms: 2 in plotly, 1 native call of plotly's, 1 Gradio, 1 GC, then idle
    samples, deltas = [2, 2, 3, 4, 5, 1, 1], [10_000] * 7
    return [
        _thread(MAIN, "CrRendererMain"),
        _thread(OTHER, "Compositor"),
        _task(1000, 60, "RunTask"),
        _task(1000, 59),  # one task under two names: counted once
        _task(1100, 20),  # short: not a long task
        _task(1000, 90, key=OTHER),  # another thread's
        {"ph": "X", "name": "Layout", "pid": 10, "tid": 1, "ts": 1_045_000, "dur": 8_000},
        {"ph": "P", "name": "Profile", "pid": 10, "tid": 9, "ts": 990_000, "args": {"data": {"startTime": 990_000}}},
        {
            "ph": "P",
            "name": "ProfileChunk",
            "pid": 10,
            "tid": 9,
            "ts": 1_200_000,
            "args": {"data": {"cpuProfile": {"nodes": nodes, "samples": samples}, "timeDeltas": deltas}},
        },
    ]


def test_long_tasks_are_split_by_the_script_their_samples_ran_in():
    tasks = long_task_breakdown(_trace())
    assert [(task.start_ms, task.ms) for task in tasks] == [(0.0, 60.0)]
    scripts = tasks[0].scripts
    assert scripts["PlotlyPlot"] == pytest.approx(30.0)  # its own samples and the native call it made
    assert scripts["index"] == pytest.approx(10.0) and scripts["(garbage collector)"] == pytest.approx(10.0)
    assert tasks[0].phases == {"layout": 8.0}
    lines = breakdown_lines(tasks)
    assert lines[0].startswith("long tasks in the trace: 1, 60 ms in all")
    assert lines[1].split() == ["js", "30", "ms", "PlotlyPlot"]


def test_a_trace_without_a_renderer_has_no_long_tasks():
    assert long_task_breakdown([_task(0, 500, key=OTHER)]) == []


@pytest.mark.slow
def test_profile_takes_one_run():
    done = subprocess.run(
        [sys.executable, "-m", "thinkviz", "bench", "browser", "--profile", "t.json", "--threads", "torch,auto"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "--profile traces one run" in done.stderr
