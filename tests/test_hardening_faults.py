"""Faults inside a run: a policy that raises, device out-of-memory, Stop mid-run.

Each must end that run with a one-line message (:class:`RunFault`), free the run's cache
(checked with weak references to every :class:`Run` made) and leave the next run working.
Driven through the public frame generators on a tiny model.
"""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch

from thinkviz.core import engine
from thinkviz.core.engine import DecodeSettings
from thinkviz.core.faults import RunFault, fault_message, guard_frames, release_device_memory
from thinkviz.policies import make_policy
from thinkviz.policies.base import Policy
from thinkviz.policies.registry import POLICIES
from thinkviz.ui.compare_run import compare_frames
from thinkviz.ui.live_run import live_frames
from thinkviz.measure.requests import RunInput
from thinkviz.ui.stream import TokenChannel
from thinkviz.ui.throttle import FramePacer
from tiny_models import tiny_model

QUESTION = RunInput(system="Think step by step.", question="What is 2 + 3?")
SETTINGS = DecodeSettings(max_new_tokens=12, stop_at_eos=False)


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("llama")


@pytest.fixture
def runs_made(monkeypatch) -> list[weakref.ref]:
    """Weak references to every :class:`~thinkviz.core.engine.Run` built during the test."""
    refs: list[weakref.ref] = []
    original = engine.Run.__init__

    def tracked(self, *args, **kwargs):
        refs.append(weakref.ref(self))
        original(self, *args, **kwargs)

    monkeypatch.setattr(engine.Run, "__init__", tracked)
    return refs


def alive(refs: list[weakref.ref]) -> int:
    gc.collect()
    return sum(ref() is not None for ref in refs)


class ExplodingPolicy(Policy):
    """Scores like nobody else: raises on its first compression (a policy with a bug)."""

    name = "exploding"
    summary = "raises inside score"

    def score(self, view):
        raise ZeroDivisionError("bad bookkeeping in score")


@pytest.fixture
def exploding(monkeypatch):
    monkeypatch.setitem(POLICIES, ExplodingPolicy.name, ExplodingPolicy)
    return ExplodingPolicy(budget=16)


def _live(tiny, policy, cancel=None):
    return live_frames(
        tiny, policy, QUESTION, SETTINGS, cancel or threading.Event(), TokenChannel("t"), None, FramePacer(0.0)
    )


def _compare(tiny, policies):
    channels = [TokenChannel(f"c{i}") for i in range(len(policies))]
    return compare_frames(tiny, policies, QUESTION, SETTINGS, threading.Event(), channels, False, FramePacer(0.0))


def test_a_policy_that_raises_ends_the_live_run_with_a_message_and_the_next_run_works(tiny, exploding, runs_made):
    with pytest.raises(RunFault, match=r"the exploding run failed: ZeroDivisionError: bad bookkeeping") as info:
        list(_live(tiny, exploding))
    assert "\n" not in str(info.value)
    assert info.value.__cause__ is None and info.value.__context__ is None  # nothing holds the failed run
    del info
    assert runs_made and alive(runs_made) == 0
    frames = list(_live(tiny, make_policy("h2o", budget=24, recent=4)))
    assert frames[-1].done and frames[-1].status.startswith("Done: 12 tokens")


def test_a_policy_that_raises_ends_the_comparison_and_frees_every_run(tiny, exploding, runs_made):
    with pytest.raises(RunFault, match="the comparison of full, exploding failed: ZeroDivisionError"):
        list(_compare(tiny, [make_policy("full"), exploding]))
    assert len(runs_made) == 2 and alive(runs_made) == 0
    frames = list(_compare(tiny, [make_policy("full"), make_policy("window", budget=16)]))
    assert frames[-1].done


def test_out_of_memory_mid_run_is_reported_and_the_run_freed(tiny, monkeypatch, runs_made):
    calls = {"n": 0}
    forward = tiny.model.forward

    def forward_until_oom(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:  # prefill, then a few decode steps, then the device is full
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return forward(*args, **kwargs)

    monkeypatch.setattr(tiny.model, "forward", forward_until_oom)
    frames = _live(tiny, make_policy("h2o", budget=24, recent=4))
    with pytest.raises(RunFault, match="the h2o run ran out of device memory .* its cache is freed"):
        for _ in frames:
            pass
    assert alive(runs_made) == 0
    assert not any(m._forward_hooks for m in tiny.model.modules())  # the attention hooks came off too
    monkeypatch.setattr(tiny.model, "forward", forward)
    assert list(_live(tiny, make_policy("h2o", budget=24, recent=4)))[-1].done


def test_stop_mid_run_drops_the_run_and_its_cache(tiny, runs_made):
    cancel = threading.Event()
    frames = _live(tiny, make_policy("h2o", budget=24, recent=4), cancel)
    seen = []
    for frame in frames:
        seen.append(frame)
        if len(seen) == 3:
            cancel.set()  # what the Stop button does
    assert seen[-1].done and seen[-1].record.summary["stopped"] == "cancelled"
    record = seen[-1].record  # the UI keeps the recording, not the run
    del frames, seen
    assert alive(runs_made) == 0 and record.events
    assert list(_live(tiny, make_policy("h2o", budget=24, recent=4)))[-1].done


def test_release_device_memory_empties_the_cuda_cache_only_on_cuda(monkeypatch):
    emptied = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    release_device_memory("cpu")
    assert emptied == []
    release_device_memory("cuda:0")
    assert emptied == [True]


def test_input_errors_pass_through_the_guard_unchanged():
    def frames():
        yield 1
        raise ValueError("the question is empty")

    guarded = guard_frames(frames(), "the run", "cpu", passthrough=(ValueError,))
    assert next(guarded) == 1
    with pytest.raises(ValueError, match="the question is empty"):
        next(guarded)


def test_fault_messages_are_one_line_and_name_the_exception():
    message = fault_message(RuntimeError("multi\nline\n  reason"), "the tam run")
    assert message == "the tam run failed: RuntimeError: multi line reason"
    assert "out of device memory" in fault_message(torch.OutOfMemoryError("x"), "the run")


def test_the_cli_ends_a_failed_run_with_one_line_and_exit_code_1(tiny, exploding, monkeypatch, capsys):
    from thinkviz import cli
    from thinkviz.commands import generate

    monkeypatch.setattr(generate, "load_from_args", lambda args: tiny)
    code = cli.main(["generate", "--policy", "exploding", "--budget", "16", "--max-new-tokens", "4", "What?"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 1
    assert errors == ["thinkviz: error: the exploding run failed: ZeroDivisionError: bad bookkeeping in score"]


def test_stop_mid_comparison_drops_every_run(tiny, runs_made):
    cancel = threading.Event()
    policies = [make_policy("full"), make_policy("window", budget=16)]
    channels = [TokenChannel("c0"), TokenChannel("c1")]
    frames = compare_frames(tiny, policies, QUESTION, SETTINGS, cancel, channels, True, FramePacer(0.0))
    seen = 0
    for frame in frames:  # noqa: B007  (the last frame is read after the loop)
        seen += 1
        if seen == 3:
            cancel.set()
    assert frame.done and frame.status == "Stopped."
    records = frame.records  # what the session keeps
    del frames, frame
    assert len(runs_made) >= 2 and alive(runs_made) == 0 and set(records) == {"full", "window"}


def test_a_policy_that_raises_ends_the_sweep_with_a_message(tiny, exploding, runs_made):
    from thinkviz.sweep.grid import parse_budgets
    from thinkviz.measure.replay import Trace
    from thinkviz.ui.sweep_run import sweep_frames

    trace = Trace("tiny", None, "Sum the list.", "<think>\nFirst add 1 and 2.\n\nThen add 3.\n</think>\n\n" * 4)
    with pytest.raises(RunFault, match="the sweep failed: ZeroDivisionError: bad bookkeeping"):
        list(sweep_frames(tiny, trace, ["exploding"], parse_budgets("0.5"), 4, {}, poll=0.0))
    assert runs_made and alive(runs_made) == 0
