"""The legend strip over a token view: what each colour, shade and box means in the current mode.

A pure function of plain data: the view mode (which parts it draws comes from
:data:`~thinkviz.viz.tokens.MODE_PARTS`), the :class:`~thinkviz.policies.ScoreScale` the heat
shows (a policy's own, or any other scale a heat mode paints: the legend only reads its three
texts) or ``None`` for no graded score, and the segment kinds present.  Every sample is a
token ``<span>`` with the token view's own classes, so the legend looks exactly like the
tokens it explains.  The strip is marked up as a legend (``tv-legend`` in its class, ``role=note``
and an ``aria-label``).  A click on a token pins its details (:data:`PIN_JS`) in the box
:func:`pin_host` puts over the view, so nothing needs a hover.
"""

from __future__ import annotations

import html
from typing import Any
from collections.abc import Iterable, Sequence

from ..policies import ScoreScale, lookup, score_scale
from .heat import HEAT_LEVELS, HEAT_NEIGHBOURS
from .tokens import MODE_PARTS, PREDICTION_MODES, SEGMENT_KINDS, TokenData

# How the legend names a segment kind (a kind missing here is shown by its own name).
SEGMENT_NAMES = {
    "system": "system prompt",
    "user": "question",
    "tool": "tool output",
    "template": "chat markers",
    "think": "think block",
    "step": "step",
    "tag": "tag",
    "signature": "signature",
    "answer": "answer",
    "code": "code",
}
# What the mass view's heat shows (any policy: one that fits no biases has no mass, so no heat).
MASS_SCALE = ScoreScale(
    "e^β, how many tokens a kept token stands for (attention matching)",
    "stands for itself or less",
    "stands for the most dropped tokens",
)
# What the heat of a prediction mode (:data:`~thinkviz.viz.tokens.PREDICTION_MODES`) grades.
PREDICTION_SCALES = {
    "predicted": ScoreScale(
        "the predictor's importance of each token, as it was written",
        "predicted unimportant",
        "predicted important for the answer",
    ),
    "answer": ScoreScale(
        "attention the answer paid each earlier token (full cache)", "unused by the answer", "used most by the answer"
    ),
}


def _sample(text: str, cls: str = "", style: str = "") -> str:
    style_attr = f' style="{html.escape(style, quote=True)}"' if style else ""
    return f'<span class="tv-tok {cls}"{style_attr}>{html.escape(text)}</span>'


def _part(title: str, body: str) -> str:
    return f'<span class="tv-legend-part"><b>{html.escape(title)}</b> {body}</span>'


def _heat(
    scale: ScoreScale | None,
    policy: str,
    compact: bool,
    every_token: bool = False,
    ranked_by: str | None = None,
    by_rule: bool = True,
) -> str:
    if scale is None:
        who = html.escape(policy) if policy else "this policy"
        return _part("No heat:", f"{who} keeps tokens by a rule, not by a graded score")
    ramp = "".join(_sample("\u2007", f"tv-h{level} tv-legend-swatch") for level in range(HEAT_LEVELS))
    scale_text = (
        f"<i>{html.escape(scale.low)}</i> <span class='tv-legend-ramp'>{ramp}</span> <i>{html.escape(scale.high)}</i>"
    )
    by = f"<br>ranked by: {html.escape(ranked_by)}" if ranked_by else ""
    whole = every_token or scale is MASS_SCALE  # ranked over the whole frame, every token
    rule = _sample("kept by rule", "tv-rule") if by_rule and not whole else ""
    if compact:
        among = "" if whole else f"<br>each among the {HEAT_NEIGHBOURS} tokens nearest in age"
        rule = f"<br>{rule} not ranked" if rule else ""
        return _part("Heat:", f"{html.escape(scale.what)}<br>{scale_text}{among}{rule}{by}")
    if whole:
        return _part("Heat", f"= {html.escape(scale.what)}: {scale_text} (hottest = top 5 % of this frame){by}")
    rule = f"; {rule} the recent window, sinks and protected prompt, always kept, are not ranked" if rule else ""
    among = f"each token ranked among the {HEAT_NEIGHBOURS} nearest in age, hottest = their top 5 %"
    return _part("Heat", f"= {html.escape(scale.what)}: {scale_text} ({among}{rule}){by}")


def _keep() -> str:
    return _part(
        "Cache:",
        " ".join(
            [
                _sample("kept"),
                _sample("kept in some layers/heads", "tv-part tv-k5"),
                _sample("evicted everywhere", "tv-gone"),
            ]
        ),
    )


def _segments(kinds: Sequence[str]) -> str:
    samples = []
    for kind in kinds:
        cls = f"tv-seg-{kind}"
        if kind in ("think", "step"):
            cls += " tv-think tv-tb0" + (" tv-step-1" if kind == "step" else "")
        samples.append(_sample(SEGMENT_NAMES.get(kind, kind), cls))
    samples.append(_sample("protected", "tv-seg-user tv-protected"))
    return _part("Segments:", " ".join(samples))


def _boxes(verified: bool) -> str:
    box = _sample("…", "tv-think tv-tb0 tv-think-start tv-think-end", "counter-reset: tv-think 1")
    body = f"{box} a &lt;think&gt; block, numbered"
    if verified:
        ok = _sample("…", "tv-think tv-tb1 tv-think-start tv-think-end tv-think-ok", "counter-reset: tv-think 2")
        body += f"; {ok} verified: its code parsed, or its tests passed (as the verify knob says), so it may be dropped"
    return _part("Boxes:", body)


def legend_html(
    mode: str,
    scale: ScoreScale | None,
    *,
    policy: str = "",
    kinds: Iterable[str] | None = None,
    parts: Sequence[str] | None = None,
    compact: bool = False,
    ranked_by: str | None = None,
    verified: bool = False,
    by_rule: bool = True,
) -> str:
    """The legend strip for a token view in ``mode``.

    ``scale``: what the heat shows (``None``: no graded score, said in words with ``policy``'s
    name); ``kinds``: the segment kinds to explain (``None``: all of
    :data:`~thinkviz.viz.tokens.SEGMENT_KINDS`; unknown kinds are shown by name); ``parts``: only
    these of the mode's parts (``"heat"``, ``"keep"``, ``"segments"``, ``"boxes"``), e.g. one
    column's heat; ``compact``: the heat scale in two short lines (a narrow column); ``ranked_by``:
    which score ranked the tokens, in the policy's words, said under the heat of its own score
    (not under the mass or a prediction mode's heat); ``verified``: the view marks verified think
    blocks (think_drop), so the boxes explain the mark; ``by_rule``: the policy keeps some tokens by
    rule (an evicting one), drawn apart from the heat; ``""`` when the mode draws none of the parts.
    """
    if mode not in MODE_PARTS:
        raise ValueError(f"unknown token view mode {mode!r}; choose one of: {', '.join(MODE_PARTS)}")
    shown = [part for part in MODE_PARTS[mode] if parts is None or part in parts]
    present = [k for k in SEGMENT_KINDS if kinds is None or k in set(kinds)]
    present += [k for k in (kinds or ()) if k not in present]
    by = ranked_by if mode != "mass" and mode not in PREDICTION_MODES else None  # said of the policy's own score
    body = {
        "heat": lambda: _heat(scale, policy, compact, mode in PREDICTION_MODES, by, by_rule),
        "keep": _keep,
        "segments": lambda: _segments(present),
        "boxes": lambda: _boxes(verified),
    }
    pieces = [body[part]() for part in shown]
    if not pieces:
        return ""
    label = f"Legend: {mode} view" + (f" of {policy}" if policy else "")
    return (
        f'<div class="tv-legend tv-mode-{mode}" role="note" aria-label="{html.escape(label, quote=True)}">'
        f"{''.join(pieces)}</div>"
    )


def view_kinds(spans: Sequence[Any], labels: Sequence[str] | None = None) -> list[str]:
    """The segment kinds a token view shows: those of its spans (a :class:`~thinkviz.text.segments.Span`
    or its ``dict`` form), plus ``template`` where the labels mark chat markers."""
    kinds = [span.get("kind") if isinstance(span, dict) else getattr(span, "kind", None) for span in spans]
    if labels is not None and "template" in labels:
        kinds.append("template")
    return [k for k in dict.fromkeys(kinds) if k]


def view_legend(
    mode: str, policy: str, view: TokenData | None, parts: Sequence[str] | None = None, compact: bool = False
) -> str:
    """The legend strip of ``policy``'s token view ``view`` in ``mode``: the policy's own score
    scale (:data:`MASS_SCALE` in the mass view, a prediction mode's :data:`PREDICTION_SCALES`),
    what ranked the tokens when the view's step said (``TokenData.ranked_by``), whether it marks
    verified think blocks (``TokenData.verified``) and the segment kinds the view shows (all of
    them before a run); ``parts`` and ``compact`` as in
    :func:`legend_html`."""
    kinds = view_kinds(view.spans, view.labels) if view is not None and view.spans else None
    scale = MASS_SCALE if mode == "mass" else PREDICTION_SCALES.get(mode) or score_scale(policy)
    ranked_by = view.ranked_by if view is not None else None
    verified = view is not None and bool(view.verified)
    by_rule = lookup(policy).evicts
    return legend_html(
        mode,
        scale,
        policy=policy,
        kinds=kinds,
        parts=parts,
        compact=compact,
        ranked_by=ranked_by,
        verified=verified,
        by_rule=by_rule,
    )


LEGEND_CSS = """
.tv-legend { display: flex; flex-wrap: wrap; gap: 4px 14px; align-items: center; font-size: 14px;
  line-height: 1.9; margin: 2px 0 4px; color: #1f2937; }
.tv-legend .tv-tok { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; padding: 0 3px; }
.tv-legend .tv-legend-swatch { padding: 0 4px; margin: 0; border-radius: 0; }
.tv-legend-ramp { white-space: nowrap; }
.tv-legend .tv-legend-swatch:first-of-type { border-radius: 3px 0 0 3px; }
.tv-legend .tv-legend-swatch:last-of-type { border-radius: 0 3px 3px 0; }
.tv-pin { font-size: 14px; min-height: 1.6em; margin: 0 0 4px; padding: 2px 8px; border-radius: 6px;
  background: #f6f7f9; color: #374151; white-space: pre-wrap; }
.tv-pin:empty::before { content: 'Click (or tap) a token to pin its details here.'; color: #9ca3af; }
.tv-pinned { outline: 2px solid #2563eb !important; outline-offset: 1px; }
"""

# Installed once per page: a click on a token pins its details (the tooltip's text) in the
# ``.tv-pin`` box of the same ``.tv-pin-host``; a second click on it unpins.  Pins are kept per
# host key (``data-pin-key``) and re-applied whenever the view changes under them (patches,
# re-renders), so a pinned token stays pinned while a run streams or the timeline moves.
PIN_JS = """() => {
  if (window.tvPins) return;
  window.tvPins = {};
  const show = (host) => {
    const key = host.dataset.pinKey, box = host.querySelector('.tv-pin'), pos = window.tvPins[key];
    if (!box) return;
    const tok = pos == null ? null : host.querySelector(`.tv-container .tv-tok[data-pos="${pos}"]`);
    for (const old of host.querySelectorAll('.tv-pinned')) if (old !== tok) old.classList.remove('tv-pinned');
    if (!tok) { if (box.textContent) box.textContent = ''; return; }
    tok.classList.add('tv-pinned');
    const text = tok.title.split('\\n').join('  ·  ');
    if (box.textContent !== text) box.textContent = text;
  };
  document.addEventListener('click', (event) => {
    const tok = event.target.closest('.tv-container .tv-tok');
    const host = tok && tok.closest('.tv-pin-host');
    if (!host) return;
    const key = host.dataset.pinKey;
    window.tvPins[key] = window.tvPins[key] === tok.dataset.pos ? null : tok.dataset.pos;
    show(host);
  });
  let queued = false;
  new MutationObserver(() => {
    if (queued) return;
    queued = true;
    setTimeout(() => { queued = false; document.querySelectorAll('.tv-pin-host').forEach(show); }, 30);
  }).observe(document.body, {childList: true, subtree: true, attributes: true, attributeFilter: ['title']});
}"""


def pin_host(key: str, inner: str) -> str:
    """``inner`` (a token view container) with the box its pinned token's details go in, above it."""
    return (
        f'<div class="tv-pin-host" data-pin-key="{html.escape(key, quote=True)}">'
        f'<div class="tv-pin" aria-live="polite"></div>{inner}</div>'
    )
