"""Sweeps group by group: results stored as each group finishes, --resume after an interruption
or a damaged file gives the same bytes as one uninterrupted run, and a failing group is
reported by name while the others finish.  In this process, on a tiny model saved to a folder,
over a grid with two KV formats."""

from __future__ import annotations

import json
import shutil

import pytest

from thinkviz.sweep import work as sweep_work
from thinkviz.cli import main
from thinkviz.models.loading import display_name
from thinkviz.policies.dynts import DynTS
from thinkviz.policies.h2o import HeavyHitters
from thinkviz.predictor import predictor_path
from thinkviz.measure.replay import Trace
from thinkviz.sweep.grid import Group, SweepSettings
from thinkviz.sweep.store import GroupStore, fingerprint
from sweep_grid import GROUPS, same_results, sweep_grid, sweep_whole

pytestmark = pytest.mark.slow  # whole sweeps of several groups, resumed and compared


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    return sweep_grid(tmp_path_factory.mktemp("sweep-grid"))


@pytest.fixture(scope="module")
def uninterrupted(grid, tmp_path_factory):
    return sweep_whole(grid, tmp_path_factory.mktemp("whole"))


def test_every_group_is_stored_and_rows_keep_the_sweep_order(uninterrupted):
    assert len(list((uninterrupted / "groups").glob("*.json"))) == GROUPS == 10
    rows = json.loads((uninterrupted / "sweep.json").read_text(encoding="utf-8"))["rows"]
    assert [(r["trace"], r["policy"], r["budget"], r["kv_quant"]) for r in rows] == [
        (t, p, b, kv)
        for t in ("alpha", "beta")
        for p, b, kv in [
            ("full", "100%", "none"),
            ("full", "100%", "q8_0"),
            *((p, b, kv) for p in ("window", "h2o") for b in ("50%", "40") for kv in ("none", "q8_0")),
        ]
    ]
    assert "tokens_per_second" not in rows[0]
    # each group has its own full-precision reference: every group's measures it the same
    assert all(r["full_peak_kv_bytes"] == rows[0]["full_peak_kv_bytes"] for r in rows if r["trace"] == "alpha")
    timings = (uninterrupted / "timings.csv").read_text(encoding="utf-8")
    assert timings.startswith("trace,policy,budget,kv_quant,tokens_per_second")


def test_interrupted_then_resumed_gives_the_same_files(grid, uninterrupted, tmp_path, monkeypatch, capsys):
    real, calls = sweep_work.run_group, []

    def interrupt_the_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the third group
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep_work, "run_group", interrupt_the_third)
    assert main([*grid, "--out", str(tmp_path)]) == 130
    assert len(list((tmp_path / "groups").glob("*.json"))) == 2 and not (tmp_path / "sweep.csv").exists()
    monkeypatch.undo()
    capsys.readouterr()
    assert main([*grid, "--resume", str(tmp_path)]) == 0
    assert f"{GROUPS} of {GROUPS} finished (2 reused" in capsys.readouterr().out
    same_results(tmp_path, uninterrupted)


def test_a_damaged_group_file_is_detected_and_computed_again(grid, uninterrupted, tmp_path, capsys):
    assert main([*grid, "--out", str(tmp_path)]) == 0
    files = sorted((tmp_path / "groups").glob("*.json"))
    truncated, edited, removed = files[0], files[1], files[2]
    truncated.write_text(truncated.read_text(encoding="utf-8")[:200], encoding="utf-8")
    edited.write_text(edited.read_text(encoding="utf-8").replace('"kl": 0.0', '"kl": 0.5', 1), encoding="utf-8")
    removed.unlink()
    capsys.readouterr()
    assert main([*grid, "--resume", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert f"{GROUPS} of {GROUPS} finished ({GROUPS - 3} reused" in captured.out
    assert f"{truncated.name} cannot be read" in captured.err
    assert f"{edited.name} does not match its digest" in captured.err
    same_results(tmp_path, uninterrupted)


def test_changed_settings_never_reuse_a_stored_group(grid, uninterrupted, tmp_path, capsys):
    assert main([*grid, "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main([*grid, "--param", "recent=6", "--resume", str(tmp_path)]) == 0
    assert f"{GROUPS} of {GROUPS} finished (0 reused" in capsys.readouterr().out
    assert (tmp_path / "sweep.csv").read_bytes() != (uninterrupted / "sweep.csv").read_bytes()


def test_resume_keys_groups_by_kv_format(grid, uninterrupted, tmp_path, capsys):
    shutil.copytree(uninterrupted / "groups", tmp_path / "groups")
    formats = grid.index("--kv-quants") + 1
    capsys.readouterr()
    assert main([*grid[:formats], "none,q4_0", *grid[formats + 1 :], "--resume", str(tmp_path)]) == 0
    assert f"{GROUPS} of {GROUPS} finished (4 reused" in capsys.readouterr().out  # the full-precision groups
    rows = json.loads((tmp_path / "sweep.json").read_text(encoding="utf-8"))["rows"]
    whole = json.loads((uninterrupted / "sweep.json").read_text(encoding="utf-8"))["rows"]
    assert [r["kv_quant"] for r in rows] == [r["kv_quant"].replace("q8_0", "q4_0") for r in whole]
    assert [r for r in rows if r["kv_quant"] == "none"] == [r for r in whole if r["kv_quant"] == "none"]
    assert all(a["kl"] != b["kl"] for a, b in zip(rows, whole) if a["kv_quant"] == "q4_0")


def test_a_failing_policy_is_reported_by_group_and_the_other_groups_complete(
    grid, uninterrupted, tmp_path, monkeypatch, capsys
):
    real, raised = HeavyHitters.score, []

    def score(self, view):
        if self.budget == 40:
            raised.append(1)
            raise RuntimeError("h2o cannot score at 40")
        return real(self, view)

    monkeypatch.setattr(HeavyHitters, "score", score)
    assert main([*grid, "--out", str(tmp_path)]) == 1
    assert len(raised) == 8  # each failing group (2 traces × 2 KV formats) was tried twice
    err = capsys.readouterr().err
    for trace in ("alpha", "beta"):
        for kv in ("", " q8_0"):
            assert f"group {trace} @ 40{kv} failed: RuntimeError: h2o cannot score at 40 (tried twice" in err
    doc = json.loads((tmp_path / "sweep.json").read_text(encoding="utf-8"))
    assert [f["name"] for f in doc["meta"]["failed"]] == [
        f"{trace} @ 40{kv}" for trace in ("alpha", "beta") for kv in ("", " q8_0")
    ]
    whole = json.loads((uninterrupted / "sweep.json").read_text(encoding="utf-8"))["rows"]
    assert doc["rows"] == [row for row in whole if row["budget"] != "40"]  # the 50 % groups, complete
    monkeypatch.undo()
    assert main([*grid, "--resume", str(tmp_path)]) == 0  # the failed groups are computed on resume
    same_results(tmp_path, uninterrupted)


@pytest.mark.parametrize(
    "extra, reason",
    [
        (["--resume", "a", "--out", "b"], "leave out --out b"),
        (["--workers", "0"], "--workers must be at least 1"),
        (["--workers", "2", "--vram-cap", "4"], "does not apply to Ray workers"),
    ],
)
def test_bad_sweep_options_are_one_line_errors(grid, extra, reason, capsys):
    assert main([*grid, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and reason in err[0]


def test_two_traces_of_one_name_are_refused_before_loading(grid, capsys):
    alpha = grid[grid.index("--trace") + 1]
    assert main([*grid, "--trace", alpha]) == 2
    err = capsys.readouterr().err
    assert "two traces are named 'alpha'" in err and "Loading" not in err


def test_a_stored_dynts_group_is_not_reused_once_its_predictor_file_changes(tmp_path, monkeypatch):
    group = Group(Trace("t", None, "q", "<think>\nx\n</think>\ny"), None)
    model = {"name": "embedded", "quantization": "4bit", "device": None, "backend": "auto"}
    predictor = predictor_path(display_name("embedded"), tmp_path)
    predictor.write_bytes(b"one")
    monkeypatch.setattr(DynTS, "predictor_folder", tmp_path)
    plain, dynts = SweepSettings(("window", "h2o")), SweepSettings(("h2o", "dynts:scorer=predictor"))
    assert "files" not in fingerprint(group, plain, model)  # a sweep whose policies read no files
    before = GroupStore(tmp_path, dynts, model).path(group)
    assert fingerprint(group, dynts, model)["files"][predictor.name] is not None
    predictor.write_bytes(b"two")  # retrained: a resumed sweep computes its dynts groups again
    assert GroupStore(tmp_path, dynts, model).path(group) != before
