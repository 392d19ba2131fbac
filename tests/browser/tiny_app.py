"""The app built in this process around a tiny random model, for tests that register a policy of their own
or look inside the server (its sessions)."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any
from collections.abc import Iterator

import gradio as gr
import pytest

from thinkviz.bench.browser import free_port
from thinkviz.policies.base import Policy
from thinkviz.policies.registry import POLICIES
from thinkviz.ui.app import build_app, queue_for_a_room
from thinkviz.ui.model_slot import ModelSlot
from tiny_models import tiny_model


@contextmanager
def served_demo(
    *extra: type[Policy],
    auth: list[tuple[str, str]] | None = None,
    model: Any = None,
    loads: threading.Event | None = None,
    **build: Any,
) -> Iterator[gr.Blocks]:
    """The launched app (``demo.local_url``: a free 127.0.0.1 port), with the ``extra`` policies
    registered while it runs, behind ``auth``'s logins if given, serving ``model`` (default: a tiny
    random Llama), whose load ends once ``loads`` is set if given; ``build`` goes to
    :func:`~thinkviz.ui.app.build_app`."""
    tiny = model or tiny_model("llama")

    def load(name, quantization, device, progress=None):
        if loads is not None:
            loads.wait()
        return tiny

    with pytest.MonkeyPatch.context() as patch:
        for policy in extra:
            patch.setitem(POLICIES, policy.name, policy)
        slot = ModelSlot(loader=load)
        slot.start("tiny", "none")
        demo = build_app(slot, model="tiny", quantization="none", **build)
        queue_for_a_room(demo)
        demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True, auth=auth)
        try:
            yield demo
        finally:
            demo.close()


@contextmanager
def served_app(*extra: type[Policy]) -> Iterator[str]:
    """The URL of :func:`served_demo`."""
    with served_demo(*extra) as demo:
        yield demo.local_url
