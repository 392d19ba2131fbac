"""Sweeps on Ray: a local runtime of 2 workers (started once for this module) gives the same
CSV/JSON bytes as the in-process sweep (over a grid with two KV formats), a worker that dies is
replaced and its group tried again, and the app starts without Ray."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import ray

from sweep_grid import GROUPS, KV_QUANTS, one_thread, same_results, sweep_grid, sweep_whole
from thinkviz.core.kvquant import KVQuant
from thinkviz.cli import main
from thinkviz.models.sources import load_any
from thinkviz.measure.replay import load_trace
from thinkviz.sweep.grid import RESULT_COLUMNS, Budget, SweepSettings, plan_groups, write_rows
from thinkviz.sweep.ray_pool import RayExecutor, connect
from thinkviz.sweep.runner import run_groups
from thinkviz.sweep.work import ModelSpec
from thinkviz.ui.sweep_run import RayTarget, sweep_frames

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # a Ray runtime and a new Python process


@pytest.fixture(scope="module")
def runtime():
    """One local Ray runtime of 2 CPUs for the whole module (starting one costs seconds)."""
    started = connect(workers=2)
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    return sweep_grid(tmp_path_factory.mktemp("sweep-grid"))


@pytest.fixture(scope="module")
def in_process(grid, tmp_path_factory):
    return sweep_whole(grid, tmp_path_factory.mktemp("in-process"))


def test_two_workers_write_the_same_bytes_as_the_in_process_sweep(runtime, grid, in_process, tmp_path, capsys):
    capsys.readouterr()
    assert main([*grid, "--out", str(tmp_path), "--workers", "2"]) == 0
    assert f"{GROUPS} of {GROUPS} finished (0 reused" in capsys.readouterr().out
    same_results(tmp_path, in_process)
    assert len(list((tmp_path / "groups").glob("*.json"))) == GROUPS


def test_a_worker_that_dies_is_replaced_and_its_group_tried_again(runtime, grid, in_process, tmp_path):
    model, traces = grid[grid.index("--model") + 1], grid[grid.index("--trace") + 1 : grid.index("--policies")]
    groups = plan_groups(
        [load_trace(t) for t in traces], [Budget(0.5, True), Budget(40, False)], [KVQuant(kv) for kv in KV_QUANTS]
    )
    settings = SweepSettings(("window", "h2o"), 8, {"recent": 4, "protect_system": True, "protect_question": True})
    spec = ModelSpec(model, "none", "cpu")
    with RayExecutor(spec, 2) as executor:
        victim = executor.pids[0]
        os.kill(victim, signal.SIGKILL)  # the worker of the first group is gone before it starts
        outcome = run_groups(groups, settings, executor)
        assert victim not in executor.pids and len(set(executor.pids)) == 2
    assert outcome.failures == [] and len(outcome.results) == GROUPS
    write_rows(outcome.rows(groups), tmp_path, _meta(in_process))
    same_results(tmp_path, in_process)


def _meta(folder: Path) -> dict:
    return json.loads((folder / "sweep.json").read_text(encoding="utf-8"))["meta"]


def test_the_sweep_tab_runs_its_groups_on_a_ray_address(runtime, grid):
    model, trace = grid[grid.index("--model") + 1], load_trace(grid[grid.index("--trace") + 1])
    loaded = load_any(model, "none", "cpu")
    budgets, params = [Budget(0.5, True), Budget(40, False)], {"recent": 4}
    with one_thread():
        here = list(sweep_frames(loaded, trace, ["window", "h2o"], budgets, 8, params, poll=0.0))[-1]
    target = RayTarget(ray.get_runtime_context().gcs_address, ModelSpec(model, "none", "cpu"))
    frames = list(sweep_frames(loaded, trace, ["window", "h2o"], budgets, 8, params, poll=0.0, ray=target))
    assert any("on Ray at" in frame.status and "groups" in frame.status for frame in frames[:-1])
    final = frames[-1]
    assert final.status == here.status and final.table is not None
    assert [_results(row) for row in final.rows] == [_results(row) for row in here.rows]


def _results(row: dict) -> dict:
    return {key: row[key] for key in RESULT_COLUMNS}


def test_bench_scale_times_both_paths_and_checks_their_results_match(runtime, grid, capsys):
    assert main(["bench", "scale", *grid[2:], "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "| in-process |" in out and "| 2 Ray workers |" in out and "speed-up over the groups" in out
    assert "sweep.csv and sweep.json identical: yes" in out
    assert out.count(" @ ") == GROUPS  # one line per group with both replay times


def test_the_app_starts_without_importing_ray():
    code = (
        "import sys, urllib.request\n"
        "sys.modules['ray'] = None  # importing Ray now fails\n"
        "import app\n"
        "from thinkviz.bench.browser import free_port\n"
        "from thinkviz.ui.app import build_app\n"
        "from thinkviz.ui.model_slot import ModelSlot\n"
        "args = app.parse_args([])\n"
        "demo = build_app(ModelSlot(), model=args.model, quantization=args.quant)\n"
        "demo.launch(server_name='127.0.0.1', server_port=free_port(), prevent_thread_lock=True, quiet=True)\n"
        "assert urllib.request.urlopen(demo.local_url, timeout=30).status == 200\n"
        "demo.close()\n"
        "print('served without ray')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "served without ray" in result.stdout
