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
from typing import get_type_hints


def bind(handler: Callable[..., Any], *bound: Any) -> partial:
    """``handler`` with its first arguments ``bound``, still under its own name.

    Gradio reads the rest of its parameters as the endpoint's (their names are the API's), its
    docstring as the endpoint's description, and names an event without an ``api_name`` after it.
    """
    event = partial(handler, *bound)
    event.__name__ = handler.__name__  # a partial has no name of its own: Gradio would say "partial"
    event.__doc__ = handler.__doc__  # nor a docstring: Gradio would describe the endpoint with partial's
    return event


def bind_request(handler: Callable[..., Any], *bound: Any) -> Callable[[Any], Any]:
    """:func:`bind` for a handler whose one parameter left is the page's request (``request: gr.Request``),
    which Gradio fills in only for a function whose own annotations say so (a partial has none)."""

    def event(request):  # annotated below with the handler's own type: this module imports no Gradio
        return handler(*bound, request)

    event.__annotations__ = {"request": get_type_hints(handler)["request"]}
    event.__name__, event.__doc__ = handler.__name__, handler.__doc__
    return event
