"""The app's tabs, one Blocks module each: ``build(app)`` lays the tab out and wires its events.

A tab never imports another; what two tabs share comes from :mod:`thinkviz.ui.widgets`
(control groups) and :mod:`thinkviz.ui.handlers` (the handler skeleton).  The one link
between tabs, Live and Compare offering their runs to Explore's picker, goes through
:func:`thinkviz.ui.app.build_app`: their ``build`` returns a function it calls with that
picker once the Explore tab exists.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    presets: list[tuple[str, str]]  # (title, name) of every preset, for the preset pickers
    model: str  # the model and quantization the app started with (the settings panel's defaults)
    quantization: str
    model_loading: bool  # whether the settings panel may load other models
