"""The app's tabs, one Blocks module each: ``build(app)`` lays the tab out and wires its events.

A tab declares its components once (a frozen dataclass of them); its handlers are module-level
functions that return Gradio's dict outputs, ``{component: value}``, bound to those components
with :func:`thinkviz.ui.wiring.bind`.  A tab never imports another; what two tabs share comes
from :mod:`thinkviz.ui.widgets` (control groups) and :mod:`thinkviz.ui.handlers` (the handler
skeleton).  The one link between tabs, Live and Compare offering their runs to Explore, goes
through :func:`thinkviz.ui.app.build_app`: their ``build`` returns a function it calls with the
Explore tab's :class:`ExploreLink` once that tab exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

import gradio as gr

from ..model_slot import ModelSlot


@dataclass(frozen=True)
class AppContext:
    """What every tab is built with: the page, the shared model, the browser session's state."""

    demo: gr.Blocks
    slot: ModelSlot
    session: gr.State  # a thinkviz.ui.session.Session per browser tab
    bus: gr.Textbox  # carries token-view patches to the browser (see thinkviz.ui.stream)
    model_status: gr.Markdown
    # the loaded model's name and state (model_panel.model_key), hidden: its change re-prices every tab
    # (the status line's own change fires with each progress step).  Its listeners are never
    # trigger_mode="always_last": Gradio 6.31's page re-dispatches a whole trigger event when a deferred
    # always_last listener ends, so several on one trigger can defer each other for ever (the three
    # price lines did, 8 times a second, once a status change came while one was being computed;
    # tests/test_tab_wiring.py keeps it so).
    model_ready: gr.Textbox
    presets: list[tuple[str, str]]  # (title, name) of every preset, for the preset pickers
    model: str  # the model and quantization the app started with (the settings panel's defaults)
    quantization: str
    model_loading: bool  # whether the settings panel may load other models
    ray_address: str | None = None  # the Sweep tab runs its groups on this Ray cluster (app.py --ray-address)
    quant_backend: str = "auto"  # who holds 4-bit weights, for models loaded elsewhere (Ray workers)


@dataclass(frozen=True)
class ExploreLink:
    """What Live and Compare need of the Explore tab: its run picker (they offer their runs in it)
    and ``refresh``, the event to run after a run ends, so that a run Explore opened while it was
    still streaming is shown whole (``refresh(*inputs)`` returns Gradio's dict outputs, ``{component:
    value}`` for some of ``outputs``, or ``gr.skip()``)."""

    source: gr.Dropdown
    refresh: Callable[..., dict]
    inputs: list[Any]
    outputs: list[Any]
