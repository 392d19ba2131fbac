"""Several runs on one input, stepped together: batched where they can share a forward pass.

:func:`generate_together` and :func:`replay_together` drive runs as
:meth:`~thinkviz.core.engine.Run.generate` and :meth:`~thinkviz.core.engine.Run.replay` drive one,
and yield, per step, every run's :class:`~thinkviz.core.events.StepEvent` (``None`` for a run that
has stopped).  Runs that can share a forward (:func:`batch_groups`: the same model, prompt, prefill
chunks and, to replay, interval) advance as the rows of one
(:func:`~thinkviz.core.batch.forward_rows`); a run that cannot advances with its own pass, and
``record.meta["batch"]`` says which and why.  Each row computes what it computes alone: in
generate mode each samples its own next token with its own generator and stops on its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import torch

from . import engine
from .batch import KVRows, forward_rows
from .engine import Run
from .events import StepEvent

OnLogits = Callable[[list[int], torch.Tensor], None]
# The most tokens per row a batched forward takes.  A decode step (1 token a row) reads the weights
# once for every row: six rows cost about twice one on the CPU's int4 kernel.  A chunk of 32 (a
# replay's interval) is already bound by arithmetic there, and padding every row to the longest
# (the full cache) makes attention cost more: batched 32-token chunks measured slower than one
# pass per run (``python -m thinkviz bench batch``, docs/benchmarks.md), so longer forwards
# (prefill chunks, replays with a larger interval) take one pass per run.
MAX_BATCHED_TOKENS = 8
QUANTIZED_ALONE = (
    "a quantized KV format: its codes would be rounded from keys the batched projection computes "
    "a rounding error apart, and a flipped code moves the logits past 1e-4"
)


def _key(run: Run, replay: bool) -> tuple[tuple[str, object], ...]:
    """What runs must share to share a forward, each with the reason a difference gives."""
    parts = [
        ("another model", id(run.loaded.model)),
        ("a different prompt", tuple(run.ids)),
        ("its prefill chunk differs", run.settings.prefill_chunk),
        ("it has already run", run.processed),
    ]
    if replay:
        parts.append(("its interval (chunk) differs", run.policy.interval))
    return tuple(parts)


def _long_chunks(run: Run, replay: bool) -> bool:
    return replay and run.policy.interval > MAX_BATCHED_TOKENS


def batch_groups(runs: Sequence[Run], replay: bool, batched: bool = True) -> list[list[int]]:
    """Runs (indices) that share a forward, in order of their first run; writes each run's
    ``record.meta["batch"]``: ``rows`` (the runs in its pass), ``batched``, and ``reason`` when it
    runs alone beside others."""
    groups: dict[tuple, list[int]] = {}
    for index, run in enumerate(runs):
        alone = not batched or run.kv_quant.spec.quantized or _long_chunks(run, replay)
        key = (index,) if alone else tuple(value for _, value in _key(run, replay))
        groups.setdefault(key, []).append(index)
    for members in groups.values():
        for index in members:
            reason = None
            if len(members) == 1 and len(runs) > 1:
                reason = _why_alone(runs, index, replay, batched)
            runs[index].record.meta["batch"] = {"rows": len(members), "batched": len(members) > 1, "reason": reason}
    return list(groups.values())


def _why_alone(runs: Sequence[Run], index: int, replay: bool, batched: bool) -> str:
    """Why run ``index`` has a pass of its own: batching is off, its format, or the first difference
    that keeps it from every other run's pass."""
    if not batched:
        return "batching is off"
    if runs[index].kv_quant.spec.quantized:
        return QUANTIZED_ALONE
    if _long_chunks(runs[index], replay):
        return f"its chunks of {runs[index].policy.interval} tokens are over {MAX_BATCHED_TOKENS}: faster one pass each"
    own = _key(runs[index], replay)
    for position, (reason, value) in enumerate(own):
        if all(_key(other, replay)[position][1] != value for i, other in enumerate(runs) if i != index):
            return reason
    return "it differs from every other run"


def _forward(runs: Sequence[Run], ids: Sequence[list[int]], keep: int, kv_rows: KVRows) -> list[torch.Tensor]:
    """One forward for all rows, or one each when a row runs more than :data:`MAX_BATCHED_TOKENS`."""
    if len(ids[0]) > MAX_BATCHED_TOKENS:
        return [run._forward(row, keep) for run, row in zip(runs, ids)]
    return forward_rows(runs, ids, keep, kv_rows)


def _advance(
    runs: Sequence[Run], step: int, ids: Sequence[list[int]], keep: int, kv_rows: KVRows
) -> tuple[list[StepEvent], list[torch.Tensor]]:
    """One step of every run in ``runs`` (one forward); the events and each run's logits ``(q', V)``."""
    if len(runs) == 1:
        event, logits = runs[0]._advance(step, ids[0], keep)
        return [event], [logits]
    start = time.perf_counter()
    texts = [run._take_tokens(row) for run, row in zip(runs, ids)]
    logits = _forward(runs, ids, keep, kv_rows)
    share = (time.perf_counter() - start) / len(runs)  # each run's share of the pass
    return [run._step_event(step, row, text, share) for run, row, text in zip(runs, ids, texts)], logits


def _prefill(runs: Sequence[Run], kv_rows: KVRows) -> list[torch.Tensor]:
    """Every run's prompt, in chunks, one forward per chunk; each run's last logits ``(V,)``."""
    start = time.perf_counter()
    chunks = runs[0]._prompt_chunks()
    for run in runs[1:]:
        run._prompt_chunks()
    for chunk in chunks:
        logits = _forward(runs, [chunk] * len(runs), 1, kv_rows)
        for run in runs:
            run._prefilled_chunk()
    seconds = (time.perf_counter() - start) / len(runs)
    for run in runs:
        run.record.summary["prefill_seconds"] = seconds
    return [row[-1] for row in logits]


def _stop(run: Run, why: str) -> None:
    run.record.summary["stopped"] = why
    run._finish()


def _generate_group(runs: Sequence[Run]) -> Iterator[list[StepEvent | None]]:
    if len(runs) == 1:
        yield from ([event] for event in runs[0].generate())
        return
    kv_rows = KVRows(len(runs))
    stops = [engine.eos_ids(run.loaded) if run.settings.stop_at_eos else set() for run in runs]
    logits = _prefill(runs, kv_rows)
    active, step = list(range(len(runs))), 0
    while active:
        for i in list(active):
            if step >= runs[i].settings.max_new_tokens or runs[i].cancel.is_set():
                _stop(runs[i], "max_new_tokens" if step >= runs[i].settings.max_new_tokens else "cancelled")
                active.remove(i)
        if not active:
            return
        kv_rows = kv_rows if len(active) == len(runs) else _regroup(kv_rows, len(active))
        tokens = {i: engine.pick_token(logits[i], runs[i].settings, runs[i].generator) for i in active}
        events, new = _advance([runs[i] for i in active], step, [[tokens[i]] for i in active], 1, kv_rows)
        out: list[StepEvent | None] = [None] * len(runs)
        for i, event, row in zip(active, events, new):
            out[i], logits[i] = event, row[-1]
        yield out
        for i in list(active):
            if tokens[i] in stops[i]:
                _stop(runs[i], "eos")
                active.remove(i)
        step += 1


def _regroup(kv_rows: KVRows, rows: int) -> KVRows:
    """Buffers for a batch that lost rows (the remaining rows are copied in once)."""
    return kv_rows if kv_rows.rows == rows else KVRows(rows)


def _replay_group(
    runs: Sequence[Run], ids: list[int], on_logits: Sequence[OnLogits | None]
) -> Iterator[list[StepEvent | None]]:
    if len(runs) == 1:
        yield from ([event] for event in runs[0].replay(ids, on_logits[0]))
        return
    kv_rows = KVRows(len(runs))
    ids = [run.check_trace(ids) for run in runs][0]
    last = _prefill(runs, kv_rows)
    for run, sink, row in zip(runs, on_logits, last):
        if sink is not None:
            sink([len(run.ids) - 1], row[None])
    chunk = runs[0].policy.interval
    for step, start in enumerate(range(0, len(ids), chunk)):
        if any(run.cancel.is_set() for run in runs):
            for run in runs:
                _stop(run, "cancelled")
            return
        part = ids[start : start + chunk]
        events, logits = _advance(runs, step, [part] * len(runs), 0, kv_rows)
        for sink, event, row in zip(on_logits, events, logits):
            if sink is not None:
                sink(event.positions, row)
        yield list(events)
    for run in runs:
        _stop(run, "end of trace")


def _interleave(
    count: int, groups: list[list[int]], drivers: list[Iterator[list[StepEvent | None]]]
) -> Iterator[list[StepEvent | None]]:
    """One step of every group's driver in turn, as one list over all ``count`` runs."""
    live = list(zip(groups, drivers))
    while live:
        out: list[StepEvent | None] = [None] * count
        for members, driver in list(live):
            events = next(driver, None)
            if events is None:
                live.remove((members, driver))
                continue
            for i, event in zip(members, events):
                out[i] = event
        if any(event is not None for event in out):
            yield out


def generate_together(runs: Sequence[Run], batched: bool = True) -> Iterator[list[StepEvent | None]]:
    """Prefill and decode every run, one token each per step (module docstring)."""
    groups = batch_groups(runs, replay=False, batched=batched)
    return _interleave(len(runs), groups, [_generate_group([runs[i] for i in g]) for g in groups])


def replay_together(
    runs: Sequence[Run],
    ids: Sequence[int],
    on_logits: Sequence[OnLogits | None] | None = None,
    batched: bool = True,
) -> Iterator[list[StepEvent | None]]:
    """Teacher-force ``ids`` through every run, one chunk each per step; ``on_logits[i]`` receives
    run ``i``'s chunks as :meth:`~thinkviz.core.engine.Run.replay` hands them."""
    sinks = list(on_logits) if on_logits is not None else [None] * len(runs)
    groups = batch_groups(runs, replay=True, batched=batched)
    ids = [int(i) for i in ids]
    drivers = [_replay_group([runs[i] for i in g], ids, [sinks[i] for i in g]) for g in groups]
    return _interleave(len(runs), groups, drivers)
