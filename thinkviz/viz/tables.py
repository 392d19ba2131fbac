"""Tables and headline numbers of a run, as plain lists and dicts a UI can show as they are.

Everything is computed from the record's events, so the same functions serve a run that
is still streaming (its ``summary`` is filled only at the end) and a loaded recording.
"""

from __future__ import annotations

import dataclasses
import html
import math
from typing import Any
from collections.abc import Mapping, Sequence

import numpy as np

from ..core.events import RunRecord
from ..core.kvquant import KVQuant, KVQuantError
from ..measure.metrics import TokenFidelity, summarize
from ..units import format_bytes

SEGMENT_TABLE_HEADERS = ["segment", "tokens", "kept %", "mean importance"]
MASS_HEADER = "mean mass (e^β)"  # the extra column of a run that fits attention biases
FIDELITY_TABLE_HEADERS = ["segment", "tokens", "NLL Δ (nats)", "KL(full‖policy)", "top-1 agree %"]
TURN_PREVIEW_HEADERS = ["turn", "role", "tokens", "blocks", "begins with"]  # blocks: think blocks
_BARE_TAGS = ("<think>", "</think>")
# Kinds listed in the segment table; steps and tags are too fine-grained for a table.
TABLE_KINDS = ("system", "user", "tool", "signature", "think", "code", "answer")


def record_kv_quant(record: RunRecord) -> KVQuant:
    """The KV format the run stored its cache in (full precision for older recordings, and for
    a format this version does not know)."""
    try:
        return KVQuant.from_meta(record.meta.get("kv_quant"))
    except KVQuantError:
        return KVQuant()


def kv_label(row: Mapping[str, Any]) -> str:
    """A sweep row's KV format (``none`` for sweeps written before the column existed)."""
    return row.get("kv_quant") or "none"


def mixes_formats(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether any sweep row is in a KV format other than full precision."""
    return any(kv_label(row) != "none" for row in rows)


def _event_at(record: RunRecord, step: int | None):
    """The event of ``step`` (the last one at or before it); the last event for ``None``."""
    if not record.events:
        return None
    if step is None:
        return record.events[-1]
    before = [e for e in record.events if e.step <= step]
    if not before:
        raise ValueError(f"step {step} is before the first step ({record.events[0].step}) of this run")
    return before[-1]


def _segment_name(span: Mapping[str, Any]) -> str:
    kind, index = span["kind"], int(span.get("index", 0)) + 1
    if kind in ("system", "user"):
        return kind if index == 1 else f"{kind} {index}"
    name = f"{kind} {index}"
    parent = span.get("parent")
    return f"{name} (in think {int(parent) + 1})" if kind == "code" and parent is not None else name


def _round(value: float, digits: int) -> float | None:
    return None if not math.isfinite(value) else round(value, digits)


def segment_headers(record: RunRecord) -> list[str]:
    """The columns of :func:`segment_table` for ``record``: :data:`SEGMENT_TABLE_HEADERS`, and
    :data:`MASS_HEADER` when its policy fits attention biases."""
    biased = bool(record.events) and record.events[-1].mass is not None
    return SEGMENT_TABLE_HEADERS + [MASS_HEADER] if biased else list(SEGMENT_TABLE_HEADERS)


def segment_table(record: RunRecord, step: int | None = None, spans: Sequence[Any] | None = None) -> list[list]:
    """Rows ``[segment, tokens, kept %, mean importance]`` after ``step`` (default: the last).

    ``kept %`` is the mean fraction of (layer, kv-head) slots still holding the segment's
    tokens; ``mean importance`` the mean of the policy's finite scores there (``None`` when the
    policy scored none of them).  Segments not reached yet at ``step`` are left out; a run
    without segments gets one row, ``all tokens``.  ``spans``: the live segmenter's spans
    while a run streams (the record stores its segments when it ends).  A run whose policy fits
    attention biases gets a fifth column, the mean mass its kept tokens carry (``e^β``: each
    stands for about that many tokens; ``None`` when none is kept).
    """
    event = _event_at(record, step)
    if event is None:
        return []
    keep = np.asarray(event.keep_fraction, dtype=np.float64)
    scores = np.asarray(event.scores, dtype=np.float64)
    mass = None if event.mass is None else np.asarray(event.mass, dtype=np.float64)
    seen = len(keep)
    spans = record.segments if spans is None else [s if isinstance(s, dict) else dataclasses.asdict(s) for s in spans]
    spans = [s for s in spans if s["kind"] in TABLE_KINDS] or [
        {"kind": "all", "start": 0, "end": seen, "name": "all tokens"}
    ]
    rows = []
    for span in spans:
        lo, hi = int(span["start"]), min(int(span["end"]), seen)
        if hi <= lo:
            continue
        finite = scores[lo:hi][np.isfinite(scores[lo:hi])]
        row = [
            span.get("name") or _segment_name(span),
            hi - lo,
            round(100 * float(keep[lo:hi].mean()), 1),
            _round(float(finite.mean()), 4) if len(finite) else None,
        ]
        if mass is not None:
            carried = mass[lo:hi][np.isfinite(mass[lo:hi])]
            row.append(_round(float(carried.mean()), 2) if len(carried) else None)
        rows.append(row)
    return rows


def run_label(row: Mapping[str, Any]) -> str:
    """A sweep row's run as tables and legends name it: the policy, and the knobs it varied
    (``h2o · recent=32``)."""
    knobs = row.get("knobs") or ""
    return f"{row['policy']} · {knobs}" if knobs else str(row["policy"])


def stats_strip(record: RunRecord, fidelity: TokenFidelity | None = None) -> dict[str, str]:
    """Headline numbers, formatted: decode speed, share of tokens kept, peak KV, compression (of
    the full-precision full cache), for a quantized cache its KV format, and with a ``fidelity``
    measured so far, the mean ΔNLL and KL against the full cache."""
    strip = _stats(record)
    kv = record_kv_quant(record)
    if kv.spec.quantized:
        strip["KV format"] = kv.label
    if fidelity is not None and len(fidelity.positions):
        means = summarize(fidelity)
        strip.update({"ΔNLL": f"{means['nll_delta']:+.3f}", "KL": f"{means['kl']:.4f}"})
    return strip


def peak_kv_bytes(record: RunRecord) -> int:
    """Peak KV: the most bytes the cache held at any moment of the run — the engine's reading
    inside each forward pass (``summary["peak_kv_bytes"]``: a step's new tokens in, before the step
    compresses; a prompt chunk in, during prefill), or, while a run streams and has no summary
    yet, the most held after a step.  The one definition every table, header and chart shows."""
    after_steps = max((e.kv_bytes for e in record.events), default=0)
    return max(int(record.summary.get("peak_kv_bytes", 0)), after_steps)


def _stats(record: RunRecord) -> dict[str, str]:
    events = record.events
    if not events:
        return {"tok/s": "—", "kept": "—", "peak KV": "—", "compression": "—"}
    last = events[-1]
    seconds = sum(e.seconds_forward + e.seconds_policy for e in events)
    new_tokens = sum(len(e.token_ids) for e in events)
    seen = last.positions[-1] + 1 if last.positions else len(last.keep_fraction)
    peak = peak_kv_bytes(record)
    return {
        "tok/s": f"{new_tokens / seconds:.1f}" if seconds > 0 else "—",
        "kept": f"{100 * last.kv_tokens / seen:.0f}% ({last.kv_tokens:,} of {seen:,} tokens)" if seen else "—",
        "peak KV": format_bytes(peak),
        "compression": f"{last.full_kv_bytes / last.kv_bytes:.1f}×" if last.kv_bytes else "—",
    }


def fidelity_table(by_kind: Mapping[str, Mapping[str, float]]) -> list[list]:
    """Rows ``[segment, tokens, NLL Δ, KL, top-1 %]`` from :func:`thinkviz.measure.metrics.summarize_by_kind`.

    Kinds with no tokens are left out; ``None`` marks a mean that is not a number.
    """
    rows = []
    for kind, summary in by_kind.items():
        if not summary.get("tokens"):
            continue
        rows.append(
            [
                "all tokens" if kind == "all" else kind,
                int(summary["tokens"]),
                _round(float(summary["nll_delta"]), 4),
                _round(float(summary["kl"]), 4),
                _round(100 * float(summary["top1"]), 1),
            ]
        )
    return rows


def stats_html(record: RunRecord, fidelity: TokenFidelity | None = None) -> str:
    """The stats strip (:func:`stats_strip`) as a row of labelled numbers."""
    cells = "".join(
        f"<div class='tv-stat'><span>{html.escape(label)}</span><b>{html.escape(value)}</b></div>"
        for label, value in stats_strip(record, fidelity).items()
    )
    return f"<div class='tv-stats'>{cells}</div>"


def turn_preview(messages: Sequence[Any], report: Mapping[str, Any] | None = None, width: int = 40) -> list[list]:
    """Rows ``[turn, role, tokens, think blocks, begins with]``, one per message of a conversation.

    ``messages`` have ``role`` and ``content``; ``report`` is an inspection of the same
    conversation (:func:`thinkviz.measure.inspection.inspect_trace`), whose turns give the token counts
    and think blocks (``None`` without one, e.g. before a model is loaded).  The last column is
    the message's first line of text (blank lines and bare ``<think>`` / ``</think>`` lines
    skipped), cut to ``width`` characters (an empty tool output shows as "(empty)").
    """
    turns = list(report["turns"]) if report else []
    blocks = [b["turn"] for b in report["think_blocks"]] if report else []
    rows = []
    for k, message in enumerate(messages):
        line = next((ln.strip() for ln in message.content.splitlines() if ln.strip() not in ("", *_BARE_TAGS)), "")
        begins = line if len(line) <= width else line[: width - 1] + "…"
        tokens = turns[k]["tokens"] if k < len(turns) else None
        rows.append([k + 1, message.role, tokens, blocks.count(k) if report else None, begins or "(empty)"])
    return rows
