"""A real ThinkViz app (``python app.py``) on a free 127.0.0.1 port, shared by the browser tests.

The app is started once per test session in a subprocess and loads the embedded model
like a user's would (the ``browser`` fixture, Debian's Chromium, is in ``tests/conftest.py``).
The app comes from :mod:`thinkviz.bench.browser`, which the browser benchmark uses too.
"""

from __future__ import annotations

import pytest

from thinkviz.bench.browser import launched_app
from tiny_models import tiny_model

START_TIMEOUT = 240  # seconds for imports + the page to answer on a busy 2-core machine


@pytest.fixture(scope="session")
def app_url(tmp_path_factory) -> str:
    """URL of a running ``app.py`` (embedded model, 4-bit); stopped after the session."""
    with launched_app(timeout=START_TIMEOUT, log=tmp_path_factory.mktemp("app") / "app.log") as url:
        yield url


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory) -> str:
    """A tiny random Llama saved as a checkpoint: ``app.py --model FOLDER --quant none`` serves it."""
    folder = tmp_path_factory.mktemp("tiny-model")
    tiny = tiny_model("llama")
    tiny.model.save_pretrained(folder)
    tiny.tokenizer.save_pretrained(folder)
    return str(folder)
