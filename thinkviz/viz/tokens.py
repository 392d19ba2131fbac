"""The token view: every token as an escaped ``<span>``, coloured by importance, segment or eviction.

Pure functions of one :class:`TokenData` (token texts, the latest step's ``scores`` and
``keep_fraction``, the segmenter's ``labels`` and ``spans``) and a view mode; the UI only
places the HTML.  :func:`token_view` builds the data from a run's record at any step, for a
run that is streaming and for a finished or loaded one alike.

Appearance is carried by classes (styled once by :data:`TOKEN_CSS`) so that it can be
patched token by token while a run streams:

- importance: ``tv-h0 … tv-h9`` (and ``data-heat="0"`` … ``"9"``), the score's rank among the
  :data:`~thinkviz.viz.heat.HEAT_NEIGHBOURS` ranked tokens nearest in age in ten bands
  (:mod:`thinkviz.viz.heat`: the lowest third is band 0, the top 5 % band 9), on light colours
  from cream over orange to coral that keep black text readable; ``tv-rule`` (no ``data-heat``):
  kept by rule (the recent window, sinks, protected spans), a token whose score decides nothing; a
  policy without a graded score (:attr:`~thinkviz.policies.Policy.score_scale` ``None``) passes no
  scores and shows no heat;
- mass (a policy that fits attention biases: ``am``, ``tam`` with ``compaction=match``): the
  same ten bands over ``e^β``, ranked over the whole frame, how many tokens each kept token stands for;
  the tooltip of every kept token says it ("stands for ≈ 3.2 tokens");
- eviction: ``tv-gone`` (no layer or head holds the token: greyed and struck through),
  ``tv-part tv-k1 … tv-k9`` (kept in that many tenths of the (layer, kv-head) slots:
  faded in proportion and hatched);
- segments: ``tv-seg-<kind>`` (system, user, tool, template, signature, think, step, tag,
  answer, code), ``tv-protected``; think blocks are boxed by per-token classes
  (``tv-think tv-tb<n mod 4>`` with ``tv-think-start`` / ``tv-think-end`` drawing the
  left / right edge), which survive appends, unlike a nested container.  The start
  token numbers its block with an inline ``counter-reset`` the CSS shows as a label.

Incremental updates: :func:`token_delta` compares with the previous frame and returns a
small JSON-able patch ``{"reset": html | None, "append": html, "update": {pos: {...}}}``
that :data:`TOKEN_PATCH_JS` applies in the browser.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from typing import Any, NamedTuple
from collections.abc import Sequence

import numpy as np

from ..core.events import RunRecord
from ..policies import Policy, PolicyConfigError, lookup
from .heat import HEAT_LEVELS, HEAT_NEIGHBOURS, RULE_COLOUR, heat_colour, heat_levels, ranked_tokens

MODES = ("importance", "mass", "segments", "evicted", "combined")
# Heat from another array than the policy's scores, shaded like "importance": for a run whose
# policy reports predicted importance (dynts) — ``{mode: what the UI calls it}``.
PREDICTION_MODES = {"predicted": "predicted importance", "answer": "attention from the answer"}
KEEP_LEVELS = 10  # tv-k1 … tv-k9 for partial keeps

# Which covering span names a token's colour: the most specific one.
_RANK = {"system": 0, "user": 0, "tool": 0, "answer": 0, "think": 1, "signature": 2, "step": 2, "tag": 3, "code": 3}
_THINK_PALETTE = ("#fff4d6", "#fde4ec", "#dcf4f7", "#ecf5dc")
_THINK_BORDER = ("#e0a100", "#d0578a", "#2a9aa8", "#6f9a2a")
_SEGMENT_COLOURS = {
    "system": "#e6e8f6",
    "user": "#dcecfb",
    "tool": "#f5e6d3",
    "template": "#f3f3f3",
    "signature": "#ffd9a8",
    "tag": "#d9cdf0",
    "answer": "#dff2e1",
    "code": "#e6ebee",
}


def view_mode_choices(predicts_importance: bool, fits_bias: bool) -> list[tuple[str, str]]:
    """``(label, mode)`` pairs a view-mode picker offers: ``mass`` only for a run whose policy fits
    attention biases (any other has no mass: the view would show no heat), the prediction modes
    only for one whose policy predicts importance."""
    extra = PREDICTION_MODES.items() if predicts_importance else ()
    return [(mode, mode) for mode in MODES if fits_bias or mode != "mass"] + [(label, mode) for mode, label in extra]


_HEAT_MODES = {"importance", "mass", "combined", *PREDICTION_MODES}
_KEEP_MODES = {"importance", "mass", "evicted", "combined", *PREDICTION_MODES}
_SEGMENT_MODES = {"segments", "combined"}
_BOX_MODES = {"segments", "mass", "evicted", "combined"}


def segment_colour(kind: str, index: int = 0) -> str | None:
    """The fill the segments view gives a span of ``kind`` (a think block and its steps by the
    block's ``index``), or ``None`` for a kind it does not fill."""
    if kind in ("think", "step"):
        return _THINK_PALETTE[index % len(_THINK_PALETTE)]
    return _SEGMENT_COLOURS.get(kind)


# What each view mode draws, in the order a legend explains it: heat, keep/evict, segment colours, think boxes.
MODE_PARTS: dict[str, tuple[str, ...]] = {
    mode: tuple(
        part
        for part, modes in (
            ("heat", _HEAT_MODES),
            ("keep", _KEEP_MODES),
            ("segments", _SEGMENT_MODES),
            ("boxes", _BOX_MODES),
        )
        if mode in modes
    )
    for mode in (*MODES, *PREDICTION_MODES)
}
# Every segment kind the view colours (the think blocks and steps take the box palette).
SEGMENT_KINDS: tuple[str, ...] = tuple(dict.fromkeys([*_SEGMENT_COLOURS, *_RANK]))


@dataclass(frozen=True)
class TokenData:
    """What one token view shows, for the tokens at absolute positions ``start … start+n-1``.

    ``texts`` ``(n,)`` one decoded piece per token; ``scores`` and ``keep_fraction`` ``(n,)`` the
    latest step's values for the same tokens (``None``: unknown); ``labels`` ``(n,)`` the
    segmenter's per-token labels (only ``"template"``, a chat-template marker, changes the
    view; ``None``: none known); ``spans`` the segments over absolute positions
    (:class:`~thinkviz.text.segments.Span` or the ``dict`` form a recording stores); ``ranked`` ``(n,)``
    bool, the tokens whose score is ranked for heat (``None``: all): those the policy keeps by
    rule whatever the score are left out (:func:`~thinkviz.viz.heat.ranked_tokens`); ``mass`` ``(n,)``
    ``e^β`` per token for a run that fits attention biases (``None``: the run has none).
    ``predicted`` ``(n,)``: each token's importance as the policy's predictor judged it when the
    token was written; ``answer_attention`` ``(n,)``: the attention the answer paid each token
    before it (both ``None`` where the run has none; the heat of :data:`PREDICTION_MODES`, all
    tokens ranked).  ``ranked_by``: the latest step's account of which score ranked the tokens
    (step info ``importance``, e.g. dynts' scorer; ``None`` when the policy gives none).
    ``verified``: the think blocks (by index) the latest step's policy verified (think_drop's
    gate: their code parses, or their tests passed); their box label carries a check mark.
    """

    texts: Sequence[str]
    scores: Sequence[float] | np.ndarray | None = None
    keep_fraction: Sequence[float] | np.ndarray | None = None
    labels: Sequence[str] | None = None
    spans: Sequence[Any] = ()
    start: int = 0
    ranked: Sequence[bool] | np.ndarray | None = None
    mass: Sequence[float] | np.ndarray | None = None
    predicted: Sequence[float] | np.ndarray | None = None
    answer_attention: Sequence[float] | np.ndarray | None = None
    ranked_by: str | None = None
    verified: frozenset[int] = frozenset()


def token_view(record: RunRecord, step: int | None = None) -> TokenData:
    """The token view of ``record`` after its event number ``step`` (default: the latest).

    The prompt and every token up to that event, with that event's scores and keep fractions
    (none before the first event), the record's segments and the prompt's labels.  A policy
    without a graded score (:attr:`~thinkviz.policies.Policy.score_scale` ``None``) passes no
    scores: its view shows no heat.  Also the predicted importance the events report (step info
    ``predicted`` / ``predicted_from``) and, once the answer has begun, the attention it paid
    (``record.summary["answer_attention"]``), and what ranked the tokens (step info ``importance``).
    """
    events = record.events if step is None else record.events[: step + 1]
    texts = list(record.prompt_texts)
    for event in events:
        texts.extend(event.texts)
    last = events[-1] if events else None
    labels = None
    if record.prompt_labels:
        labels = list(record.prompt_labels) + [""] * (len(texts) - len(record.prompt_labels))
    policy = lookup(str(record.meta.get("policy")))
    graded = last is not None and policy.score_scale is not None
    ranked = _ranked(policy, record.meta.get("params", {}), len(texts), record.segments) if policy.evicts else None
    return TokenData(
        texts,
        last.scores if graded else None,
        None if last is None else last.keep_fraction,
        labels,
        record.segments,
        ranked=ranked,
        mass=None if last is None else last.mass,
        predicted=_predicted(events, len(texts)),
        answer_attention=_answer_attention(record, len(texts)),
        ranked_by=_ranked_by(last),
        verified=_verified_blocks(last),
    )


def _ranked(policy: type[Policy], params: dict[str, Any], n: int, spans: Sequence[Any]) -> np.ndarray | None:
    """``(n,)`` bool: the tokens ``policy``, built from a record's ``params``, ranks by score
    (:func:`~thinkviz.viz.heat.ranked_tokens`; ``None``: all); its recent window and sinks as the
    built policy forces them (snapkv's observation window is its recent window), as the recorded
    knobs say where it cannot be built (an older recording's)."""
    try:
        built = policy(**params)
        recent, sinks = built.recent, built.n_sink
    except (PolicyConfigError, TypeError):
        recent, sinks = int(params.get("recent", 0) or 0), int(params.get("n_sink", 0) or 0)
    kept = [s for s in spans if _field(s, "protected", False)]
    return ranked_tokens(n, recent, sinks, [(int(_field(s, "start", 0)), int(_field(s, "end", 0))) for s in kept])


def _ranked_by(event: Any) -> str | None:
    """The step info's ``importance`` text of ``event``, when it is one."""
    text = None if event is None else event.info.get("importance")
    return text if isinstance(text, str) and text else None


def _verified_blocks(event: Any) -> frozenset[int]:
    """The think blocks ``event``'s step info marks verified (think_drop's ``blocks``; a recording
    made before the ``verified`` field existed: closed with parsed code, the only gate then)."""
    blocks = [] if event is None else event.info.get("blocks") or []
    return frozenset(b["index"] for b in blocks if b.get("verified", b.get("closed") and b.get("code") == "parsed"))


def _predicted(events: Sequence[Any], n: int) -> np.ndarray | None:
    """``(n,)`` the predicted importance the events report per position (NaN where none did);
    entries that are not a position and a list of numbers (a damaged recording) are skipped."""
    values, found = np.full(n, np.nan), False
    for info in (e.info for e in events if "predicted" in e.info):
        start, chunk = info.get("predicted_from"), _floats(info["predicted"])
        if chunk is None or not isinstance(start, int) or start < 0:
            continue
        chunk = chunk[: max(0, n - start)]
        values[start : start + len(chunk)] = chunk
        found = True
    return values if found else None


def _answer_attention(record: RunRecord, n: int) -> np.ndarray | None:
    """``(n,)`` the attention the answer paid each earlier token, when ``n`` tokens reach into the answer."""
    paid = _floats(record.summary.get("answer_attention"))
    if paid is None or n <= len(paid):
        return None
    values = np.full(n, np.nan)
    values[: len(paid)] = paid
    return values


def _floats(values: Any) -> np.ndarray | None:
    """``values`` as a 1-D float array, ``None`` when it is not a list of numbers (``None`` → NaN)."""
    if not isinstance(values, list):
        return None
    try:
        array = np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return array if array.ndim == 1 else None


class Look(NamedTuple):
    """How one token is drawn: its class list, inline style, tooltip (unescaped) and heat class
    (``data-heat``: ``"0"`` … ``"9"``, ``""`` where the token shows no heat)."""

    cls: str
    style: str
    title: str
    heat: str = ""


RULE = -2  # a heat level: kept by rule, not ranked (tv-rule)


@dataclass(frozen=True)
class _Segment:
    """Segment facts of one token, from the spans covering it (``path`` is the tooltip line)."""

    kind: str | None = None
    think: int | None = None
    think_start: bool = False
    think_end: bool = False
    step: int | None = None
    protected: bool = False
    path: str = ""


# ---- quantisation ------------------------------------------------------------------
def keep_levels(keep_fraction: Sequence[float] | np.ndarray | None, n: int) -> np.ndarray:
    """``(n,)`` int: ``0`` evicted everywhere, ``KEEP_LEVELS`` kept everywhere, ``1 … 9`` partially
    kept (tenths of the slots, rounded), ``-1`` unknown."""
    if keep_fraction is None:
        return np.full(n, -1, dtype=np.int64)
    values = np.asarray(keep_fraction, dtype=np.float64)
    levels = np.full(n, -1, dtype=np.int64)
    finite = np.isfinite(values)
    levels[finite & (values <= 0)] = 0
    levels[finite & (values >= 1)] = KEEP_LEVELS
    partial = finite & (values > 0) & (values < 1)
    levels[partial] = np.clip(np.rint(values[partial] * KEEP_LEVELS), 1, KEEP_LEVELS - 1)
    return levels


# ---- segments ----------------------------------------------------------------------
def _field(span: Any, name: str, default: Any = None) -> Any:
    """Read a span field from a :class:`~thinkviz.text.segments.Span` or its ``dict`` form (recordings)."""
    return span.get(name, default) if isinstance(span, dict) else getattr(span, name, default)


def segment_facts(n: int, spans: Sequence[Any], labels: Sequence[str] | None, start: int = 0) -> list[_Segment]:
    """Per token ``start … start+n-1``: the most specific covering span, its think block and the
    tooltip path (``"think 2 › step 3"``).  ``labels[i] == "template"`` marks template markers.

    Spans are painted onto one row per specificity rank (spans of one rank do not overlap);
    tokens covered by the same spans share one :class:`_Segment`.
    """
    table: list[tuple[str, int, int, int, bool, bool]] = []  # kind, index, start, end, closed, protected
    painted = np.full((max(_RANK.values()) + 1, n), -1, dtype=np.int64)  # (ranks, n) row in `table`
    for span in spans:
        kind = _field(span, "kind")
        if kind not in _RANK:
            continue
        lo, hi = int(_field(span, "start", 0)), int(_field(span, "end", 0))
        a, b = max(lo, start) - start, min(hi, start + n) - start
        if b > a:
            painted[_RANK[kind], a:b] = len(table)
            table.append(
                (
                    kind,
                    int(_field(span, "index", 0)),
                    lo,
                    hi,
                    bool(_field(span, "closed", False)),
                    bool(_field(span, "protected", False)),
                )
            )
    shared: dict[tuple, _Segment] = {}
    facts = []
    for i, ids in enumerate(zip(*painted.tolist())):
        pos = start + i
        cover = [table[j] for j in ids if j >= 0]  # outer to inner
        think = next((c for c in cover if c[0] == "think"), None)
        key = (
            ids,
            labels is not None and labels[i] == "template",
            think is not None and pos == think[2],
            think is not None and think[4] and pos == think[3] - 1,
        )
        if key not in shared:
            shared[key] = _segment(cover, *key[1:])
        facts.append(shared[key])
    return facts


def _segment(cover: list[tuple], template: bool, think_start: bool, think_end: bool) -> _Segment:
    path = " › ".join(f"{kind} {index + 1}" for kind, index, *_ in cover)
    if template:
        path = f"{path} (template)" if path else "template"
    protected = any(c[5] for c in cover)
    return _Segment(
        kind="template" if template else (cover[-1][0] if cover else None),
        think=next((c[1] for c in cover if c[0] == "think"), None),
        think_start=think_start,
        think_end=think_end,
        step=next((c[1] for c in cover if c[0] == "step"), None),
        protected=protected,
        path=path + (" · protected" if protected else ""),
    )


# ---- one token ----------------------------------------------------------------------
def _keep_text(keep: float | None) -> str:
    if keep is None or not np.isfinite(keep):
        return "kept —"
    if keep <= 0:
        return "evicted from every layer and head"
    if keep >= 1:
        return "kept in every layer and head"
    return f"kept in {keep:.0%} of layer×head slots"


def _mass_text(mass: float | None) -> str:
    """The tooltip's mass line: ``" · stands for ≈ 3.2 tokens"`` (empty without a finite mass)."""
    if mass is None or not math.isfinite(mass):
        return ""
    return f" · stands for ≈ {mass:.2g} token{'' if round(mass, 2) == 1 else 's'}"


def _segment_look(mode: str, segment: _Segment, verified: frozenset[int]) -> tuple[str, str]:
    """The class list and inline style a token's segment gives it in ``mode`` (``verified``: the
    think blocks whose label gets a check mark)."""
    cls = ["tv-tok"]
    style = ""
    if mode in _SEGMENT_MODES and segment.kind is not None:
        cls.append(f"tv-seg-{segment.kind}")
        if segment.step is not None:
            cls.append(f"tv-step-{segment.step % 2}")
        if segment.protected:
            cls.append("tv-protected")
    if mode in _BOX_MODES and segment.think is not None:
        cls += ["tv-think", f"tv-tb{segment.think % len(_THINK_PALETTE)}"]
        if segment.think_start:
            cls.append("tv-think-start")
            if segment.think in verified:
                cls.append("tv-think-ok")
            style = f"counter-reset: tv-think {segment.think + 1}"
        if segment.think_end:
            cls.append("tv-think-end")
    return " ".join(cls), style


def _value_classes(mode: str, heat: int, kept: int) -> str:
    """The classes importance (``heat``: a level, ``-1`` none, :data:`RULE` kept by rule) and
    eviction give a token in ``mode`` (leading space included)."""
    out = ""
    if mode in _HEAT_MODES and heat != -1:
        out = " tv-rule" if heat == RULE else f" tv-h{heat}"
    if mode in _KEEP_MODES:
        if kept == 0:
            out += " tv-gone"
        elif 0 < kept < KEEP_LEVELS:
            out += f" tv-part tv-k{kept}"
    return out


def _check(mode: str, texts: Sequence[str], **arrays: Any) -> None:
    if mode not in MODES and mode not in PREDICTION_MODES:
        choices = ", ".join([*MODES, *PREDICTION_MODES])
        raise ValueError(f"unknown token view mode {mode!r}; choose one of: {choices}")
    for name, values in arrays.items():
        if values is not None and len(values) != len(texts):
            raise ValueError(f"{name} has {len(values)} entries for {len(texts)} tokens")


def token_looks(data: TokenData, mode: str) -> list[Look]:
    """The :class:`Look` of every token of ``data`` in ``mode``."""
    texts, keep_fraction, start = data.texts, data.keep_fraction, data.start
    scores = {"predicted": data.predicted, "answer": data.answer_attention}.get(mode, data.scores)
    ranked = None if mode in PREDICTION_MODES else data.ranked  # a prediction ranks every token
    _check(mode, texts, scores=scores, keep_fraction=keep_fraction, labels=data.labels, ranked=ranked, mass=data.mass)
    n = len(texts)
    # mass: every kept token is ranked over the frame (new tokens carry e^0 = 1, below any token that
    # stands for more), a prediction too; the policy's own score among tokens of comparable age
    if mode == "mass":
        levels = heat_levels(data.mass, n)
    else:
        levels = heat_levels(scores, n, ranked, None if mode in PREDICTION_MODES else HEAT_NEIGHBOURS)
        if scores is not None and ranked is not None:
            levels[~np.asarray(ranked, dtype=bool)] = RULE
    heat = levels.tolist()
    kept = keep_levels(keep_fraction, n).tolist()
    score_list = [None] * n if scores is None else np.asarray(scores, dtype=np.float64).tolist()
    keep_list = [None] * n if keep_fraction is None else np.asarray(keep_fraction, dtype=np.float64).tolist()
    mass_list = [None] * n if data.mass is None else np.asarray(data.mass, dtype=np.float64).tolist()
    segment_looks: dict[int, tuple[str, str]] = {}
    looks = []
    for i, segment in enumerate(segment_facts(n, data.spans, data.labels, start)):
        if id(segment) not in segment_looks:
            segment_looks[id(segment)] = _segment_look(mode, segment, data.verified)
        cls, style = segment_looks[id(segment)]
        score = score_list[i]
        score_text = f"{score:.3g}" if score is not None and math.isfinite(score) else "—"
        title = (
            f"{json.dumps(texts[i], ensure_ascii=False)}  pos {start + i}\n"
            f"score {score_text}{' (kept by rule)' if heat[i] == RULE else ''} · "
            f"{_keep_text(keep_list[i])}{_mass_text(mass_list[i])}\n{segment.path or '—'}"
        )
        shown = str(heat[i]) if mode in _HEAT_MODES and heat[i] >= 0 else ""
        looks.append(Look(cls + _value_classes(mode, heat[i], kept[i]), style, title, shown))
    return looks


def _token_html(pos: int, text: str, look: Look) -> str:
    attrs = f' style="{html.escape(look.style, quote=True)}"' if look.style else ""
    attrs += f' data-heat="{look.heat}"' if look.heat else ""
    return (
        f'<span class="{look.cls}" data-pos="{pos}"{attrs} title="{html.escape(look.title, quote=True)}">'
        f"{html.escape(text, quote=True)}</span>"
    )


def _view_html(mode: str, start: int, texts: Sequence[str], looks: Sequence[Look]) -> str:
    body = "".join(_token_html(start + i, t, look) for i, (t, look) in enumerate(zip(texts, looks)))
    return f'<div class="tv-view tv-mode-{mode}" data-start="{int(start)}">{body}</div>'


def render_tokens(data: TokenData, mode: str) -> str:
    """HTML of the token view of ``data`` in ``mode`` (one of :data:`MODES`).  All text is escaped."""
    return _view_html(mode, data.start, data.texts, token_looks(data, mode))


# ---- incremental updates -----------------------------------------------------------
@dataclass(frozen=True)
class TokenViewState:
    """What the browser shows after the last patch (to diff the next frame against)."""

    mode: str
    start: int
    texts: tuple[str, ...]
    looks: tuple[Look, ...]


def token_delta(prev: TokenViewState | None, data: TokenData, mode: str) -> tuple[TokenViewState, dict[str, Any]]:
    """The new state and the patch turning ``prev``'s view into the view of ``data`` in ``mode``.

    The patch is ``{"reset": html}`` (whole view) when there is no previous state, the mode
    or ``start`` changed, or the earlier tokens are not a prefix of ``texts`` (a new run);
    otherwise ``{"reset": None, "append": html of the new tokens, "update": {pos: changes}}``
    where ``changes`` holds only the fields that differ: ``cls``, ``style``, ``title`` (plain
    text, set through the DOM, never parsed as HTML), ``heat`` (``data-heat``; ``""`` removes it).
    """
    texts, start = data.texts, data.start
    looks = tuple(token_looks(data, mode))
    state = TokenViewState(mode, start, tuple(texts), looks)
    old = len(prev.texts) if prev is not None else 0
    if prev is None or (prev.mode, prev.start) != (mode, start) or state.texts[:old] != prev.texts:
        return state, {"reset": _view_html(mode, start, texts, looks), "append": "", "update": {}}
    update: dict[int, dict[str, str]] = {}
    for i, (before, now) in enumerate(zip(prev.looks, looks)):
        if before != now:
            update[start + i] = {f: getattr(now, f) for f in Look._fields if getattr(now, f) != getattr(before, f)}
    append = "".join(_token_html(start + i, texts[i], looks[i]) for i in range(old, len(texts)))
    return state, {"reset": None, "append": append, "update": update}


TOKEN_PATCH_JS = """
function tvApplyTokenPatch(root, patch) {
  if (!root || !patch) return;
  if (typeof patch === "string") patch = JSON.parse(patch);
  if (patch.reset != null) root.innerHTML = patch.reset;
  const view = root.querySelector(".tv-view");
  if (!view) return;
  if (patch.append) view.insertAdjacentHTML("beforeend", patch.append);
  const first = Number(view.dataset.start || 0);
  for (const [pos, change] of Object.entries(patch.update || {})) {
    const el = view.children[Number(pos) - first];
    if (!el) continue;
    if ("cls" in change) el.className = change.cls;
    if ("style" in change) {
      if (change.style) el.setAttribute("style", change.style); else el.removeAttribute("style");
    }
    if ("title" in change) el.title = change.title;
    if ("heat" in change) {
      if (change.heat) el.dataset.heat = change.heat; else delete el.dataset.heat;
    }
  }
}
""".strip()


# ---- the stylesheet ----------------------------------------------------------------
def _stylesheet() -> str:
    rules = [
        ".tv-view { white-space: pre-wrap; word-break: break-word; line-height: 1.9;"
        " font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 15px; }",
        ".tv-view:empty::before { content: 'no tokens yet'; color: #999; font-style: italic; }",
        ".tv-tok { border-radius: 2px; }",
        ".tv-tok:hover { outline: 1px solid #333; }",
    ]
    for level in range(HEAT_LEVELS):
        rules.append(f".tv-h{level} {{ background-color: {heat_colour(level)}; color: #000; }}")
    rules += [
        f".tv-rule {{ background-color: {RULE_COLOUR}; color: #000; }}",
        ".tv-gone { color: #a0a0a0; text-decoration: line-through; background-color: #f1f1f1; }",
        ".tv-part { background-image: repeating-linear-gradient(45deg, rgba(0,0,0,.16) 0 1px, transparent 1px 4px); }",
    ]
    for level in range(1, KEEP_LEVELS):
        rules.append(f".tv-k{level} {{ opacity: {0.45 + 0.4 * level / KEEP_LEVELS:.2f}; }}")  # legible when faded
    for kind, colour in _SEGMENT_COLOURS.items():
        rules.append(f".tv-mode-segments .tv-seg-{kind} {{ background-color: {colour}; }}")
        rules.append(f".tv-mode-combined .tv-seg-{kind} {{ box-shadow: inset 0 -3px 0 {colour}; }}")
    rules += [
        ".tv-seg-template { color: #8a8a8a; }",
        ".tv-seg-tag { font-weight: 600; }",
        ".tv-seg-signature { font-weight: 600; }",
        ".tv-protected { text-decoration: underline dotted #555; }",
        ".tv-mode-segments .tv-step-1 { background-image: linear-gradient(rgba(0,0,0,.06), rgba(0,0,0,.06)); }",
        ".tv-think { border-top: 1.5px solid; border-bottom: 1.5px solid; border-radius: 0; }",
        ".tv-think-start { border-left: 1.5px solid; margin-left: 2px; padding-left: 2px; }",
        ".tv-think-end { border-right: 1.5px solid; margin-right: 2px; padding-right: 2px; }",
        ".tv-think-ok.tv-think-start::before { content: 'think ' counter(tv-think) ' \\2713 verified'; }",
        ".tv-think-start::before { content: 'think ' counter(tv-think); font-size: 12px; font-weight: 600;"
        " vertical-align: super; margin-right: 3px; text-decoration: none; display: inline-block; }",
    ]
    for i, (fill, border) in enumerate(zip(_THINK_PALETTE, _THINK_BORDER)):
        rules.append(f".tv-tb{i} {{ border-color: {border}; }}")
        rules.append(f".tv-tb{i}.tv-think-start::before {{ color: {border}; }}")
        rules.append(
            f".tv-mode-segments .tv-seg-think.tv-tb{i}, .tv-mode-segments .tv-seg-step.tv-tb{i}"
            f" {{ background-color: {fill}; }}"
        )
    return "\n".join(rules)


TOKEN_CSS: str = _stylesheet()
