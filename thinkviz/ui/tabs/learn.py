"""The Learn tab: every registered policy's rule, source and knobs (text from :mod:`thinkviz.ui.learn_cards`)."""

from __future__ import annotations

import gradio as gr

from ..learn_cards import learn_markdown
from . import AppContext


def build(app: AppContext) -> None:
    gr.Markdown(learn_markdown(), elem_id="tv-learn")
