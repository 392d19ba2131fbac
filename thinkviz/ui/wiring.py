"""Binding a module-level handler to the components it fills.

A tab declares its components once, in a frozen dataclass; its handlers are module-level
functions that take that dataclass first and return Gradio's dict outputs
(``{component: value}``), so no list of outputs has to match another list's order.
:func:`bind` gives Gradio the handler with its components in place.
"""

from __future__ import annotations

from functools import partial
from typing import Any
from collections.abc import Callable


def bind(handler: Callable[..., Any], *bound: Any) -> partial:
    """``handler`` with its first arguments ``bound``, still under its own name.

    Gradio reads the rest of its parameters as the endpoint's (their names are the API's), its
    docstring as the endpoint's description, and names an event without an ``api_name`` after it.
    """
    event = partial(handler, *bound)
    event.__name__ = handler.__name__  # a partial has no name of its own: Gradio would say "partial"
    event.__doc__ = handler.__doc__  # nor a docstring: Gradio would describe the endpoint with partial's
    return event
