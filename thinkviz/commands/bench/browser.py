"""``bench browser``: the Live tab timed in headless Chromium against an app it starts (or one at
``--url``): a long run's paints and long tasks, ``--play`` a recording, ``--tune`` the tuning loop,
``--lesson`` a lesson's steps."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from ...bench.browser import BenchError, launched_app, measure, measure_lesson, measure_play, measure_tune
from ...bench.trace_profile import breakdown_lines, long_task_breakdown
from ...cores import AUTO, TORCH, choose_threads, usable_cores
from ...demos.lessons import LessonError, named_lesson
from ...demos.presets import MAX_NEW_TOKENS_RANGE, list_presets, load_preset
from ...demos.record import recording_problem
from ...sweep.grid import check_vary, parse_vary
from ..common import CliError, add_model_args
from .app_launch import app_args


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    parser.add_argument("--tokens", type=int, default=500, help="tokens to generate in the Live tab")
    parser.add_argument("--url", default=None, help="measure an app already running there instead of starting app.py")
    parser.add_argument(
        "--threads",
        default=AUTO,
        metavar="T1,T2,...",
        help=f"torch threads of the app started, one run each: numbers, {AUTO!r} (the app's "
        f"choice) and {TORCH!r} (torch's default: one per core), e.g. {TORCH},{AUTO}",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="TRACE.json",
        help="record the run as a Chromium performance trace in TRACE.json (open it in Chrome's "
        "Performance panel) and print what the main-thread long tasks spent their time on",
    )
    parser.add_argument(
        "--play",
        default=None,
        metavar="PRESET",
        help="time a preset's committed recording instead: in Live, 'Play recording' as fast as it "
        "draws, from the click to its first painted token (target <= 2 s) and to its end",
    )
    parser.add_argument(
        "--lesson",
        default=None,
        metavar="NAME",
        help="time a lesson instead: its link ?lesson=NAME&step=N opened (page load included), then each "
        "step by Next and by Back, from the click to the step shown (target < 1 s a step)",
    )
    parser.add_argument(
        "--links", type=int, default=3, help="--lesson: times its link is opened, each with a baseline page"
    )
    parser.add_argument(
        "--tune",
        action="store_true",
        help="time the tuning loop instead: in Live, a preset's first --tune-tokens trace tokens "
        "measured against the full cache; each --tune-vary value set by hand, then Generate, "
        "to the new ΔNLL on screen (target <= 10 s)",
    )
    parser.add_argument("--tune-preset", default="math_h2o_vs_window", help="the replay preset --tune runs")
    parser.add_argument("--tune-tokens", type=int, default=512, help="trace tokens --tune replays")
    parser.add_argument(
        "--tune-vary",
        default="recent=16,64",
        metavar="KNOB=V1,V2,...",
        help="the knob of the preset's policy --tune changes, and the values it sets in turn",
    )


def _thread_counts(text: str) -> list[tuple[str, int]]:
    """``"torch,auto"`` → ``[("torch", 2), ("auto", 1)]`` on two cores: explicit counts, whatever
    OMP_NUM_THREADS this process runs with (the app started for each run gets its count)."""
    out = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        try:
            threads = usable_cores() if item == TORCH else choose_threads(item, env={})
        except ValueError as exc:
            raise CliError(f"--threads: {exc}") from None
        out.append((item, threads))
    if not out:
        raise CliError("--threads needs at least one setting")
    return out


def _tune(args: argparse.Namespace, settings: list[tuple[str, int]]) -> int:
    """``bench browser --tune``: the seconds from a knob's change to the new ΔNLL on screen."""
    if args.tune_preset not in list_presets():
        raise CliError(f"--tune-preset: unknown preset {args.tune_preset!r}; available: {', '.join(list_presets())}")
    preset = load_preset(args.tune_preset)
    if preset.mode != "replay":
        raise CliError(f"--tune-preset: {args.tune_preset} generates; --tune needs a replay preset")
    try:
        vary = parse_vary(args.tune_vary)
        check_vary([preset.policy], vary)
    except ValueError as exc:
        raise CliError(f"--tune-vary: {exc}") from None
    if len(vary) != 1:
        raise CliError("--tune-vary changes one knob: KNOB=V1,V2,...")
    if args.tune_tokens < 1:
        raise CliError(f"--tune-tokens must be at least 1, got {args.tune_tokens}")
    ((knob, values),) = vary.items()
    for label, threads in settings:
        try:
            if args.url:
                cycles = measure_tune(args.url, args.tune_preset, args.tune_tokens, knob, values)
            else:
                with launched_app(app_args(args, threads)) as url:
                    cycles = measure_tune(url, args.tune_preset, args.tune_tokens, knob, values)
        except BenchError as exc:
            raise CliError(str(exc)) from None
        where = "" if args.url else f", torch threads {threads} ({label})"
        print(
            f"Live tab, {args.tune_preset} ({preset.policy}), first {args.tune_tokens} trace tokens measured "
            f"against the full cache{where}"
        )
        for cycle in cycles:
            print(
                f"{knob} -> {cycle.value:>6}: change -> new ΔNLL on screen {cycle.seconds:6.1f} s "
                f"(target <= 10 s); ΔNLL {cycle.nll_delta}, KL {cycle.kl}"
            )
    return 0


def _play(args: argparse.Namespace) -> int:
    """``bench browser --play PRESET``: how soon a preset's recording shows in the Live tab."""
    if args.play not in list_presets():
        raise CliError(f"--play: unknown preset {args.play!r}; available: {', '.join(list_presets())}")
    problem = recording_problem(args.play)
    if problem is not None:
        raise CliError(f"--play: {problem}")
    try:
        if args.url:
            result = measure_play(args.url, args.play)
        else:
            with launched_app(app_args(args)) as url:
                result = measure_play(url, args.play)
    except BenchError as exc:
        raise CliError(str(exc)) from None
    print(f"Live tab, {args.play}'s recording played as fast as it draws (no model needed)")
    print(f"click -> first token painted:     {result.first_token_painted:6.2f} s  (target <= 2 s)")
    print(f"click -> the end on screen:        {result.done:6.2f} s  (the status polled every 0.25 s)")
    print(f"status: {result.status.splitlines()[0] if result.status else ''}")
    return 0


def _lesson(args: argparse.Namespace) -> int:
    """``bench browser --lesson NAME``: how soon each of a lesson's steps shows."""
    try:
        steps = len(named_lesson(args.lesson).steps)
    except LessonError as exc:
        raise CliError(f"--lesson: {exc}") from None
    if args.links < 1:
        raise CliError(f"--links must be at least 1, got {args.links}")
    try:
        if args.url:
            times = measure_lesson(args.url, args.lesson, steps, args.links)
        else:
            with launched_app(app_args(args)) as url:
                times = measure_lesson(url, args.lesson, steps, args.links)
    except BenchError as exc:
        raise CliError(str(exc)) from None
    middle = (steps + 1) // 2
    print(f"Lessons tab, {args.lesson} ({steps} steps, no model needed), 1920x1080")
    print(
        f"link ?lesson=...&step={middle} -> step shown: {', '.join(f'{t:.2f}' for t in times.link)} s "
        "(page load included; the first right after the app answered)"
    )
    beyond = statistics.median(times.link) - statistics.median(times.page)
    print(
        f"baseline, the app's page without a lesson -> busy until: {', '.join(f'{t:.2f}' for t in times.page)} s "
        f"(its last long task's end); the link's step {beyond:+.2f} s beyond it (medians)"
    )
    for label, seconds in (("Next", times.next), ("Back", times.back)):
        print(
            f"{label} -> step shown:  median {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s "
            f"over {len(seconds)} steps (target < 1 s)"
        )
    return 0


def run(args: argparse.Namespace) -> int:
    """Headless Chromium: click → first painted token, frames per second and long tasks during a long Live run."""
    low, high = MAX_NEW_TOKENS_RANGE  # what the Live tab's slider allows
    if not low <= args.tokens <= high:
        raise CliError(f"--tokens must be between {low} and {high}, got {args.tokens}")
    settings = _thread_counts(args.threads)
    if args.tune:
        return _tune(args, settings)
    if args.play is not None:
        return _play(args)
    if args.lesson is not None:
        return _lesson(args)
    if args.url and len(settings) > 1:
        raise CliError("--threads with several settings starts the app for each; it cannot measure --url")
    if args.profile is not None and len(settings) > 1:
        raise CliError("--profile traces one run: give one --threads setting")
    results = []
    try:
        for label, threads in settings:
            if args.url:
                results.append((label, None, measure(args.url, args.tokens, trace=args.profile)))
                continue
            with launched_app(app_args(args, threads)) as url:
                results.append((label, threads, measure(url, args.tokens, trace=args.profile)))
    except BenchError as exc:
        raise CliError(str(exc)) from None
    for label, threads, result in results:
        where = "" if threads is None else f", torch threads {threads} ({label})"
        print(
            f"Live tab, h2o, {result.new_tokens} new tokens{where}; "
            f"the app reports {result.app_tokens_per_second} tok/s"
        )
        print(f"click -> prompt painted:          {result.prompt_painted:6.2f} s")
        print(f"click -> first generated token:   {result.first_token_painted:6.2f} s")
        print(
            f"frames painted while streaming:   {result.frames} in {result.run_seconds:.1f} s "
            f"= {result.frames_per_second:.1f} fps  (target 5-10)"
        )
        print(
            f"main-thread long tasks (>50 ms):  {result.long_tasks}, longest {result.longest_task_ms:.0f} ms, "
            f"over 200 ms: {result.tasks_over_200ms} (target 0); p95 per frame {result.task_p95_ms:.0f} ms "
            "(target <= 50)"
        )
    if args.profile is not None:
        trace = json.loads(args.profile.read_text(encoding="utf-8"))
        print(
            "\n".join(
                breakdown_lines(long_task_breakdown(trace.get("traceEvents", []) if isinstance(trace, dict) else trace))
            )
        )
        print(f"trace: {args.profile}")
    if len(results) > 1:
        base_label, _, base = results[0]
        for label, _, result in results[1:]:
            print(
                f"{label} / {base_label}: run time {result.run_seconds / base.run_seconds:.2f}, "
                f"fps {result.frames_per_second / max(base.frames_per_second, 1e-9):.2f}"
            )
    return 0
