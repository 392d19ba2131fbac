"""Input components that check what API callers send, not only what a browser's widget allows.

Gradio checks a slider's range on the server, but a value that is not a number at all (a
string, ``NaN``, ``true``) fails deep inside it with an anonymous "the app raised an
exception".  :class:`Slider` refuses it first, with a message naming the control.
"""

from __future__ import annotations

import math
from typing import Any

import gradio as gr

from .text import no_markup


class Slider(gr.Slider):
    """A ``gr.Slider`` whose server side refuses non-numbers with ``"<label> must be a number"``."""

    def preprocess(self, payload: Any) -> float:
        if isinstance(payload, bool) or not isinstance(payload, (int, float)) or not math.isfinite(payload):
            shown = no_markup(repr(payload)[:40])
            raise gr.Error(f"{self.label or 'This value'} must be a number, got {shown}", print_exception=False)
        return super().preprocess(payload)
