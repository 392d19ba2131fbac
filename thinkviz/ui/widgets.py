"""Control groups more than one tab shows: the policy and its knobs, the KV-cache format, decoding,
playback, export buttons, the model settings panel (the chat to run: :mod:`.chat_controls`).

Each group is a dataclass of components built in the layout by its ``…_controls`` function;
``inputs()`` lists the components a handler receives, in order, and a method turns their
values, in that order, into what the run needs (a policy, a request, decode settings).  Each
input's API name is the name of the field that holds it (:meth:`Group.named`), so a control
added to a group is named by adding it: an event wires groups with
``inputs_kwargs=named(*groups)``, ``view_api()`` lists those names, and :meth:`Group.of` picks a
group's values out of a handler's keyword values, so no handler counts positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any
from collections.abc import Iterator, Mapping, Sequence

import gradio as gr

from ..core.engine import DecodeSettings
from ..core.kvquant import RESIDUAL, RESIDUAL_RANGE, KVQuant, format_names
from ..policies import Policy, policy_names
from ..demos.playback import DEFAULT_SPEED, SPEEDS
from ..policies.base import COMMON_PARAMS, Param
from ..demos.presets import MAX_NEW_TOKENS_RANGE, Preset
from . import inputs
from .controls import (
    COMMON_NAMES,
    Pools,
    build_policy,
    collect_params,
    format_knobs,
    pool_bounds,
    pool_choices,
    pool_sizes,
    slot_specs,
)
from ..demos.record import recording_problem
from .fields import numbers_only, slider
from ..measure.requests import decode_settings


class Group:
    """A control group: a dataclass of components (and of nested groups).

    :meth:`inputs` lists the components a handler receives; :meth:`named` gives each the name an
    API caller sends its value by: the field holding it, a nested group's own names, and for
    the ``i``-th component of a list field ``xs`` (or of a NamedTuple of lists, by its field
    names) ``xs_i``.
    """

    def inputs(self) -> list:
        raise NotImplementedError

    def by_component(self, values: Sequence[Any]) -> dict[Any, Any]:
        """``values`` (in :meth:`inputs` order, as the group's ``preset_values`` give them) as the
        ``{component: value}`` a Gradio handler returns."""
        return dict(zip(self.inputs(), values, strict=True))

    def of(self, values: Mapping[str, Any]) -> tuple:
        """This group's values among a handler's keyword values (wired by :func:`named`), in
        :meth:`inputs` order: what the group's own methods read."""
        return tuple(values[name] for name in self.named())

    def named(self) -> dict[str, Any]:
        """:meth:`inputs` by API name, in the same order."""
        names = dict(_field_names(self, ""))
        out: dict[str, Any] = {}
        for component in self.inputs():
            if id(component) not in names:
                raise ValueError(f"{type(self).__name__}.inputs() lists a component none of its fields holds")
            out[names[id(component)]] = component
        return out


def _field_names(value: Any, name: str) -> Iterator[tuple[int, str]]:
    """``(id(component), API name)`` for every component ``value`` holds (see :class:`Group`)."""
    if isinstance(value, Group):
        for field in fields(value):
            yield from _field_names(getattr(value, field.name), field.name)
    elif isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple: its fields name its parts
        for part, item in zip(value._fields, value):
            yield from _field_names(item, part)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _field_names(item, f"{name}_{i + 1}")
    else:
        yield id(value), name


def named(*groups: Group) -> dict[str, Any]:
    """Every group's components by API name (``inputs_kwargs`` of an event); a name used twice is an error."""
    out: dict[str, Any] = {}
    for group in groups:
        for name, component in group.named().items():
            if name in out:
                raise ValueError(f"two controls are named {name!r}")
            out[name] = component
    return out


# ---- the knobs every policy shares ------------------------------------------------------------
@dataclass
class CommonControls(Group):
    """Budget (in tokens or as a fraction of the tokens seen), interval and the two protection
    toggles, in :data:`~thinkviz.policies.base.COMMON_PARAMS` order.

    The budget in tokens is a number box taking any exact value, with a slider under it that drags
    on a log scale (8 … 16384 tokens: every doubling the same distance) and only writes the box, in
    the browser (:data:`LOG_DRAG_JS`); the box is what a handler receives."""

    budget: gr.Number
    budget_mode: gr.Radio
    budget_fraction: gr.Slider
    interval: gr.Slider
    protect_system: gr.Checkbox
    protect_question: gr.Checkbox

    def inputs(self) -> list:
        return [
            self.budget,
            self.budget_mode,
            self.budget_fraction,
            self.interval,
            self.protect_system,
            self.protect_question,
        ]

    @staticmethod
    def knobs(values: Sequence[Any]) -> dict[str, Any]:
        """The values (in :meth:`inputs` order) as :func:`~thinkviz.ui.controls.build_policy` takes them."""
        return dict(zip(COMMON_NAMES, values, strict=True))


LOG_DRAG_JS = "(x) => Math.round(Math.pow(2, x))"  # the drag's position → the budget
LOG_POSITION_JS = "(b) => Math.log2(Math.max(1, Number(b) || 1))"  # the budget → the drag's position


def budget_control(
    tab: str, param: Param, elem_classes: str | None = None, visible: bool = True
) -> tuple[gr.Number, gr.Group]:
    """The budget as an exact number and a log-scale drag under it (see :class:`CommonControls`), and
    the group holding both (what a budget mode shows or hides)."""
    with gr.Group(elem_classes=["tv-budget", *([elem_classes] if elem_classes else [])], visible=visible) as box:
        budget = numbers_only(
            gr.Number(
                value=param.default,
                minimum=param.low,
                maximum=param.high,
                precision=0,
                step=param.step,
                label="Budget (tokens per layer and kv-head)",
                info=f"{param.help}; type any value, or drag (log scale)",
                elem_id=f"tv-{tab}-budget",
            )
        )
        drag = gr.Slider(
            math.log2(param.low),
            math.log2(param.high),
            value=math.log2(param.default),
            step=0.01,
            show_label=False,
            container=False,
            buttons=[],
            elem_classes="tv-log-drag",
            elem_id=f"tv-{tab}-budget-drag",
        )
    drag.input(None, drag, budget, js=LOG_DRAG_JS, api_visibility="private")
    budget.change(None, budget, drag, js=LOG_POSITION_JS, api_visibility="private")
    return budget, box


def common_controls(tab: str, interval: int) -> CommonControls:
    """The budget in tokens (:func:`budget_control`) or as a fraction of the tokens seen (the budget
    mode says which, and which control shows), the interval slider over the range the policies
    declare, and the protection toggles."""
    params = {p.name: p for p in COMMON_PARAMS}
    b, m, f, i = params["budget"], params["budget_mode"], params["budget_fraction"], params["interval"]
    mode = gr.Radio(list(m.choices), value=m.default, label="Budget mode", info=m.help, elem_id=f"tv-{tab}-budget-mode")
    budget, budget_box = budget_control(tab, b, "tv-bar", visible=m.default != "fraction")
    fraction = slider(
        f.low,
        f.high,
        value=f.default,
        step=f.step,
        label="Budget (fraction of the tokens seen)",
        info=f.help,
        elem_id=f"tv-{tab}-budget-fraction",
        visible=m.default == "fraction",
    )
    mode.change(
        lambda chosen: [gr.update(visible=chosen != "fraction"), gr.update(visible=chosen == "fraction")],
        mode,
        [budget_box, fraction],
        show_progress="hidden",
        api_visibility="private",
    )
    interval_slider = slider(
        i.low,
        i.high,
        value=interval,
        step=i.step,
        label="Interval (compress every N tokens)",
        info=i.help,
        elem_id=f"tv-{tab}-interval",
    )
    with gr.Row():
        protect_system = gr.Checkbox(value=True, label="Protect system prompt", elem_id=f"tv-{tab}-protect-system")
        protect_question = gr.Checkbox(value=True, label="Protect question", elem_id=f"tv-{tab}-protect-question")
    return CommonControls(budget, mode, fraction, interval_slider, protect_system, protect_question)


def follow_toggle(tab: str) -> gr.Checkbox:
    """ "Follow the newest token": the token views keep their newest token in view while on (turned
    on by every new run, off by scrolling up; :data:`~thinkviz.ui.stream.PATCH_BUS_JS` reads it)."""
    # interactive: no event reads it on the server, and Gradio disables such a checkbox otherwise
    return gr.Checkbox(
        value=True,
        label="Follow the newest token",
        elem_id=f"tv-{tab}-follow",
        elem_classes="tv-follow",
        container=False,
        interactive=True,
    )


@dataclass
class PlaybackControls(Group):
    """ "Play the recording" of the picked preset (no model needed) and its speed (the input)."""

    play: gr.Button
    speed: gr.Dropdown

    def inputs(self) -> list:
        return [self.speed]

    @staticmethod
    def offer(name: str | None) -> dict:
        """The play button for preset ``name``: usable when it has a current recording."""
        problem = None if not name else recording_problem(name)
        if not name:
            return gr.update(interactive=False, value="▶ Play recording")
        return gr.update(
            interactive=problem is None,
            value="▶ Play recording" if problem is None else "▶ Play recording (none for this preset)",
        )


def playback_controls(tab: str) -> PlaybackControls:
    play = gr.Button(
        "▶ Play recording", variant="secondary", interactive=False, elem_id=f"tv-{tab}-play", elem_classes="tv-bar"
    )
    speed = gr.Dropdown(
        list(SPEEDS),
        value=DEFAULT_SPEED,
        label="Playback speed",
        elem_id=f"tv-{tab}-speed",
        info="× the pace it was recorded at",
        min_width=120,
    )
    return PlaybackControls(play, speed)


def preset_knobs(params: dict[str, Any]) -> list:
    """A preset's common knobs in :meth:`CommonControls.inputs` order (the declared defaults where unset)."""
    return [params.get(p.name, p.default) for p in COMMON_PARAMS]


# ---- one policy and its own parameters (Live) ---------------------------------------------------
@dataclass
class PolicyControls(Group):
    """The policy picker, the common knobs and the pool of per-policy parameter slots.

    A slot has no fixed meaning (it shows the chosen policy's first, second… number, flag or
    choice), so its API name says only that: ``numbers_1``, ``flags_1``, ``choices_1`` (the
    pools' fields); ``/run_policy`` takes knobs by their own names instead.
    """

    policy: gr.Dropdown
    common: CommonControls
    pools: Pools  # lists of gr.Slider, gr.Checkbox and gr.Dropdown slots

    @property
    def slots(self) -> list:
        return [slot for pool in self.pools for slot in pool]

    def inputs(self) -> list:
        return [self.policy, *self.common.inputs(), *self.slots]

    def make(self, values: Sequence[Any]) -> Policy:
        """The policy described by this group's values (in :meth:`inputs` order)."""
        name, *rest = values
        shared = len(self.common.inputs())
        common, slots = rest[:shared], rest[shared:]
        given, start = [], 0
        for pool in self.pools:
            given.append(slots[start : start + len(pool)])
            start += len(pool)
        return build_policy(name, collect_params(name, Pools(*given)), **self.common.knobs(common))

    def preset_values(self, policy: str, params: dict[str, Any]) -> list:
        """Values for :meth:`inputs` that show a preset's ``policy`` with its ``params`` (the
        declared defaults where the preset sets none)."""
        return [policy, *preset_knobs(params), *self.updates(policy, params)]

    def updates(self, name: str, values: dict | None = None) -> list:
        """Component updates that show ``name``'s parameters in the slots."""
        specs = slot_specs(name, Pools(*map(len, self.pools)), values)
        hidden = gr.update(visible=False)
        out = []
        for spec in specs.numbers:
            out.append(
                hidden
                if spec is None
                else gr.update(
                    visible=True,
                    label=spec.label,
                    info=spec.help,
                    minimum=spec.low,
                    maximum=spec.high,
                    step=spec.step,
                    value=spec.value,
                )
            )
        for spec in specs.flags:
            out.append(
                hidden if spec is None else gr.update(visible=True, label=spec.label, info=spec.help, value=spec.value)
            )
        for spec in specs.choices:
            out.append(
                hidden
                if spec is None
                else gr.update(
                    visible=True, label=spec.label, info=spec.help, choices=list(spec.choices), value=spec.value
                )
            )
        return out


def policy_controls(default: str) -> PolicyControls:
    """The policy group, its slots showing ``default``'s parameters.

    Number slots are built with a range covering every policy's parameters, and choice slots
    with every policy's choices, because Gradio checks a value against what the component has
    on the server: API callers never see the per-policy narrowing that
    :meth:`PolicyControls.updates` sends a browser (on page load and when the policy changes).
    """
    sizes = pool_sizes()
    low, high = pool_bounds()
    every_choice = pool_choices()
    specs = slot_specs(default, sizes)
    policy = gr.Dropdown(policy_names(), value=default, label="Policy", elem_id="tv-live-policy", elem_classes="tv-bar")
    common = common_controls("live", interval=1)
    numbers = [
        slider(
            low,
            high,
            value=spec.value if spec else low,
            visible=spec is not None,
            label=spec.label if spec else f"policy number knob {i + 1}",
            info=spec.help if spec else None,
        )
        for i, spec in enumerate(specs.numbers)
    ]
    flags = [
        gr.Checkbox(
            value=bool(spec.value) if spec else False,
            visible=spec is not None,
            label=spec.label if spec else f"policy flag knob {i + 1}",
            info=spec.help if spec else None,
        )
        for i, spec in enumerate(specs.flags)
    ]
    choices = [
        gr.Dropdown(
            every_choice,
            value=spec.value if spec else every_choice[0],
            visible=spec is not None,
            label=spec.label if spec else f"policy choice knob {i + 1}",
            info=spec.help if spec else None,
            elem_id=f"tv-live-choice-{i}",
        )
        for i, spec in enumerate(specs.choices)
    ]
    group = PolicyControls(policy, common, Pools(numbers, flags, choices))
    if group.slots:  # a choice by hand (.input, not .change): a preset sets the policy and its own knobs at once
        policy.input(group.updates, policy, group.slots, show_progress="hidden", api_visibility="private")
    return group


def knob_box(tab: str, params: dict[str, Any] | None = None) -> gr.Textbox:
    """The policy knobs beyond the shared ones, as ``name=value, …`` text (a preset fills it);
    each policy run takes the knobs it declares."""
    return gr.Textbox(
        format_knobs(params or {}),
        label="Policy knobs",
        placeholder="e.g. recent=64, window=32",
        info="name=value, comma-separated; each policy takes the knobs it declares (the Learn tab lists them)",
        elem_id=f"tv-{tab}-knobs",
    )


# ---- how the cache stores keys and values ------------------------------------------------------
KV_FORMAT_INFO = "none: full precision; q8_0 / q4_0: llama.cpp blocks; kivi2 / kivi4: KIVI (Learn tab)"
RESIDUAL_INFO = "KIVI only: this many newest tokens stay at full precision (older ones in key groups of 32)"


def kv_format_dropdown(tab: str, label: str = "KV-cache format", visible: bool = True) -> gr.Dropdown:
    return gr.Dropdown(
        format_names(), value="none", label=label, info=KV_FORMAT_INFO, visible=visible, elem_id=f"tv-{tab}-kv-quant"
    )


def residual_slider(tab: str) -> gr.Slider:
    low, high = RESIDUAL_RANGE
    return slider(
        low,
        high,
        value=RESIDUAL,
        step=8,
        label="KIVI residual (tokens)",
        info=RESIDUAL_INFO,
        elem_id=f"tv-{tab}-kv-residual",
    )


@dataclass
class KVControls(Group):
    """The KV-cache format of one run and KIVI's residual."""

    kv_quant: gr.Dropdown
    kv_residual: gr.Slider

    def inputs(self) -> list:
        return [self.kv_quant, self.kv_residual]

    @staticmethod
    def make(values: Sequence[Any]) -> KVQuant:
        """The format the values (in :meth:`inputs` order) name; a user error otherwise."""
        return inputs.kv_quant(*values)


def kv_controls(tab: str) -> KVControls:
    with gr.Row():
        return KVControls(kv_format_dropdown(tab), residual_slider(tab))


def preset_kv(preset: Preset) -> list:
    """A preset's KV format and residual in :meth:`KVControls.inputs` order."""
    return [preset.kv_quant.format, preset.kv_quant.residual]


@dataclass
class DecodeControls(Group):
    """Max new tokens, temperature and whether end-of-text stops the run."""

    max_new_tokens: gr.Slider
    temperature: gr.Slider
    stop_at_eos: gr.Checkbox

    def inputs(self) -> list:
        return [self.max_new_tokens, self.temperature, self.stop_at_eos]

    @staticmethod
    def settings(values: Sequence[Any]) -> DecodeSettings:
        """Validated decode settings from the values (in :meth:`inputs` order)."""
        return decode_settings(*values)


def decode_controls(tab: str) -> DecodeControls:
    with gr.Row():
        max_new = slider(*MAX_NEW_TOKENS_RANGE, value=128, step=1, label="Max new tokens", elem_id=f"tv-{tab}-max-new")
        temperature = slider(0.0, 1.5, value=0.0, step=0.05, label="Temperature (0 = greedy)")
    stop_at_eos = gr.Checkbox(
        value=True,
        label="Stop at end of text",
        elem_id=f"tv-{tab}-stop-at-eos",
        info="off: keep decoding to the limit, to watch eviction on a long run",
    )
    return DecodeControls(max_new, temperature, stop_at_eos)


def export_controls(tab: str) -> tuple[gr.Button, gr.Button, gr.File]:
    """ "Export recording", "Export figure" and the file they produce."""
    with gr.Row():
        recording = gr.Button("Export recording (JSON + NPZ)", size="sm", elem_id=f"tv-{tab}-export-run")
        figure = gr.Button("Export figure (HTML)", size="sm", elem_id=f"tv-{tab}-export-figure")
    file = gr.File(label="Download", interactive=False, elem_id=f"tv-{tab}-export", elem_classes="tv-download")
    return recording, figure, file
