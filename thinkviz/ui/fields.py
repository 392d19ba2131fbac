"""Server-side checks for values API callers send, beyond what a browser's widget allows.

Gradio checks a slider's range on the server, but a value that is not a number at all (a
string, ``NaN``, ``true``) fails deep inside it with an anonymous "the app raised an
exception", and one out of range shows a bare "Error" toast and a server traceback.
:func:`numbers_only` makes a slider refuse both first, with a message naming the control.
(A ``gr.Slider`` subclass would do the same, but Gradio writes a ``.pyi`` stub next to the
module of every component class; binding the check to the instance does not, and survives
Gradio's per-session deep copies, which rebind bound methods.)
"""

from __future__ import annotations

import math
import types
from typing import Any

import gradio as gr

from .text import no_markup


def numbers_only(slider: gr.Slider | gr.Number) -> gr.Slider | gr.Number:
    """``slider`` (or a number box), whose server side now refuses non-numbers with ``"<label> must be a number"``."""
    slider.preprocess = types.MethodType(_preprocess_number, slider)
    return slider


def _preprocess_number(slider: gr.Slider | gr.Number, payload: Any) -> float:
    label = slider.label or "This value"
    if isinstance(payload, bool) or not isinstance(payload, (int, float)) or not math.isfinite(payload):
        shown = no_markup(repr(payload)[:40])
        raise gr.Error(f"{label} must be a number, got {shown}", print_exception=False)
    # the range in words naming the control (Gradio's own check says only "Error" in a toast, with a traceback)
    if slider.minimum is not None and payload < slider.minimum:
        raise gr.Error(f"{label}: {payload:g} is less than minimum value {slider.minimum:g}", print_exception=False)
    if slider.maximum is not None and payload > slider.maximum:
        raise gr.Error(f"{label}: {payload:g} is greater than maximum value {slider.maximum:g}", print_exception=False)
    return type(slider).preprocess(slider, payload)


def slider(*args: Any, **kwargs: Any) -> gr.Slider:
    """A ``gr.Slider(*args, **kwargs)`` with the :func:`numbers_only` check."""
    return numbers_only(gr.Slider(*args, **kwargs))
