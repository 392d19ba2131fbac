"""The run-time estimate: calibrated and checked on a tiny model under a fake clock (no timing).

The fake clock advances only inside the model's forward pass, by a cost that grows with the
new tokens and the cached ones (like attention on a CPU), so "actual time" is exact and the
same on any machine, and the estimator is judged against a cost model it does not know.
"""

from __future__ import annotations

import pytest

from thinkviz.text.chat import build_chat
from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.measure.estimate import RECENT_STEPS, Phase, Progress, Speed, format_seconds, measure_speed
from thinkviz.policies import make_policy
from thinkviz.measure.replay import LockstepReplay, prepare_trace
from tiny_models import tiny_model

TRACE = "<think>\n" + " ".join(f"Step {i}: add {i} to the running total and check it twice." for i in range(60))


class ForwardClock:
    """Time that passes only in forward passes: ``base + q · (per_token + per_context · cached)`` each."""

    def __init__(self, model, base=0.02, per_token=0.002, per_context=4e-6) -> None:
        self.now, self.base, self.per_token, self.per_context = 0.0, base, per_token, per_context
        model.register_forward_pre_hook(self._advance, with_kwargs=True)

    def _advance(self, module, args, kwargs) -> None:
        q = kwargs["input_ids"].shape[1]
        cached = int(kwargs["position_ids"][0, 0])
        self.now += self.base + q * (self.per_token + self.per_context * cached)

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def timed_tiny():
    loaded = tiny_model("llama")
    return loaded, ForwardClock(loaded.model)


@pytest.mark.slow
def test_a_replay_in_lockstep_takes_about_what_was_estimated(timed_tiny):
    loaded, clock = timed_tiny
    speed = measure_speed(loaded, clock)
    prompt, ids = prepare_trace(loaded, None, "Add them up.", TRACE)
    interval = 16
    policies = [make_policy("h2o", budget=64, interval=interval), make_policy("window", budget=64, interval=interval)]
    plan = [Phase("replay", runs=len(policies) + 1, prompt_tokens=len(prompt.ids), tokens=len(ids), rows=interval)]
    estimated = speed.estimate(plan)
    start = clock()
    LockstepReplay(loaded, policies, prompt, ids).run()
    actual = clock() - start
    assert len(ids) > 600  # long enough that context growth matters
    assert 0.5 <= estimated / actual <= 2.0, (estimated, actual)


@pytest.mark.slow
def test_a_generation_takes_about_what_was_estimated_and_progress_counts_down(timed_tiny):
    loaded, clock = timed_tiny
    speed = measure_speed(loaded, clock)
    prompt = build_chat(loaded.tokenizer, "Think step by step.", "Count to a hundred.")
    tokens = 200
    plan = [Phase("generate", runs=1, prompt_tokens=len(prompt.ids), tokens=tokens)]
    progress = Progress(speed, plan, clock)
    start = clock()
    run = Run(
        loaded,
        make_policy("h2o", budget=48, interval=1),
        prompt,
        DecodeSettings(max_new_tokens=tokens, stop_at_eos=False),
    )
    left_at_half = None
    for event in run.generate():
        progress.step()
        if event.step == tokens // 2:
            left_at_half, half_time = progress.left(), clock()
    actual = clock() - start
    assert 0.5 <= speed.estimate(plan) / actual <= 2.0
    assert 0.5 <= left_at_half / (clock() - half_time) <= 2.0
    assert progress.left() == 0.0


def test_the_estimate_grows_with_the_trace_and_the_runs():
    speed = Speed(base=0.02, per_token=0.002, per_context=1e-6)
    one = speed.estimate([Phase("replay", 1, 300, 1000, rows=32)])
    assert speed.estimate([Phase("replay", 1, 300, 2000, rows=32)]) > 1.9 * one
    assert speed.estimate([Phase("replay", 3, 300, 1000, rows=32)]) == pytest.approx(3 * one)


def test_learning_moves_the_estimate_towards_what_runs_take():
    speed = Speed(base=0.02, per_token=0.002)
    plan = [Phase("replay", 2, 300, 1000, rows=32)]
    before = speed.estimate(plan)
    for _ in range(6):
        speed.learn(plan, 3 * before)
    assert speed.estimate(plan) == pytest.approx(3 * before, rel=0.1)


@pytest.mark.parametrize(
    "seconds, text",
    [(3, "under 5 s"), (41, "about 40 s"), (130, "about 2 min 10 s"), (120, "about 2 min"), (1500, "about 25 min")],
)
def test_durations_read_as_people_say_them(seconds, text):
    assert format_seconds(seconds) == text


def test_the_fit_prices_a_decode_step_as_well_as_a_replayed_chunk():
    # calibration timings shaped like this machine's: decode steps of 15 ms, 32-row chunks of 80 ms, and two
    # prefills that grow faster than their length (attention over the prompt)
    samples = (
        [(1, 96 + i, 0.015) for i in range(4)]
        + [(1, 384 + i, 0.016) for i in range(4)]
        + [(32, 96 + 32 * i, 0.080) for i in range(1, 3)]
        + [(32, 384 + 32 * i, 0.085) for i in range(1, 3)]
        + [(128, 0, 0.35), (416, 0, 2.2)]
    )
    speed = Speed.fit(samples)
    for q, cached, seconds in samples:
        if q <= 32:  # what a generation and a replay take step after step
            assert 0.75 < speed.forward(q, cached) / seconds < 1.33


def test_a_phase_running_slower_than_priced_says_how_much_and_slows_the_later_phases_too():
    now = [0.0]
    speed = Speed(base=0.0, per_token=0.01)  # 0.01 s a token, priced
    plan = [Phase("generate", 1, 0, 100), Phase("fidelity", 1, 0, 100, rows=10)]
    progress = Progress(speed, plan, lambda: now[0])
    progress.step(1)
    assert progress.slowdown() is None  # no pace before a second step
    assert progress.left() == pytest.approx(2.0)  # all as priced
    now[0] = 2.0
    progress.step(11)  # 10 tokens in 2 s: 0.2 s a token, 20 times the price (a busy server)
    assert progress.slowdown() == pytest.approx(20.0)
    assert progress.left() == pytest.approx(89 * 0.2 + 1.0 * 20)


def test_a_run_is_paced_by_its_last_steps_so_a_burst_of_load_passes():
    """A served app's load comes and goes (a room's playbacks all ending at once): once the model runs at
    its priced speed again for a few steps, the estimate says so instead of carrying the burst along."""
    now = [0.0]
    progress = Progress(Speed(base=0.0, per_token=0.01), [Phase("generate", 1, 0, 1000)], lambda: now[0])
    progress.step(1)
    for done in range(2, 12):  # ten steps at 2 s each: 200 times the price
        now[0] += 2.0
        progress.step(done)
    assert progress.slowdown() == pytest.approx(200.0)
    for done in range(12, 12 + RECENT_STEPS):  # then as priced again
        now[0] += 0.01
        progress.step(done)
    assert progress.slowdown() == pytest.approx(1.0)
    assert progress.left() == pytest.approx((1000 - progress.done) * 0.01)
