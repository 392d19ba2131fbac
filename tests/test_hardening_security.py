"""Security: where the app listens, what it uploads, and user or model text never becoming markup.

(Model output is never executed: think_drop's ``ast.parse``-only check has its own test in
test_policy_thinkdrop; the token renderer's escaping is fuzzed in test_viz_tokens.)
"""

from __future__ import annotations

import dataclasses
import re
from html.parser import HTMLParser

import gradio as gr
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import app
from thinkviz.core.events import MAX_RECORDING_BYTES
from thinkviz.ui import inputs
from thinkviz.ui.handlers import user_error
from thinkviz.ui.model_slot import LoadStatus, ModelSlot
from thinkviz.ui.text import no_markup, plain_markdown
from thinkviz.ui.model_panel import load_status_markdown

HOSTILE = "<img src=x onerror=alert(1)><script>alert(2)</script>[click](javascript:alert(3)) **bold** <think>"


class Tags(HTMLParser):
    def __init__(self, markup: str) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.feed(markup)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)


@pytest.fixture
def launch_kwargs(monkeypatch) -> dict:
    """What app.main passes to Blocks.launch, plus the app as ``"demo"`` (no server, no model)."""
    seen: dict = {}
    monkeypatch.setattr(ModelSlot, "start", lambda self, name, quantization: None)
    monkeypatch.setattr(gr.Blocks, "launch", lambda self, **kwargs: seen.update(kwargs, demo=self))
    return seen


def _api_names(demo: gr.Blocks) -> set[str]:
    return {fn.api_name for fn in demo.fns.values()}


def test_the_app_listens_on_localhost_without_a_share_link_and_caps_uploads(launch_kwargs):
    assert app.main([]) == 0
    assert launch_kwargs["server_name"] == "127.0.0.1" and launch_kwargs["share"] is False
    assert launch_kwargs["max_file_size"] == MAX_RECORDING_BYTES == 256 * 2**20


def test_other_addresses_and_share_links_only_when_asked(launch_kwargs):
    assert app.main(["--host", "0.0.0.0", "--share"]) == 0
    assert launch_kwargs["server_name"] == "0.0.0.0" and launch_kwargs["share"] is True


@pytest.mark.parametrize(
    "argv, loading",
    [
        ([], True),
        (["--host", "localhost"], True),
        (["--host", "::1"], True),
        (["--host", "0.0.0.0"], False),
        (["--host", "192.168.1.20"], False),
        (["--host", "my-laptop.local"], False),
        (["--share"], False),
        (["--host", "0.0.0.0", "--allow-model-loading"], True),
    ],
)
def test_strangers_cannot_load_models_unless_allowed(launch_kwargs, argv, loading):
    """Reachable from elsewhere, the model loader (and its API endpoint) is left out."""
    assert app.main(argv) == 0
    demo = launch_kwargs["demo"]
    assert ("load_model" in _api_names(demo)) is loading
    assert ("Loading another model is off" in str(demo.config)) is not loading
    assert "generate" in _api_names(demo)  # the rest of the app is there either way


@settings(deadline=None)
@given(st.text())
def test_plain_markdown_never_lets_text_become_a_tag_or_a_link(text):
    out = plain_markdown(text)
    assert "<" not in out and ">" not in out and "\n" not in out
    assert not re.search(r"(?<!\\)[\[\]()*_`]", out)  # every Markdown bracket / emphasis is escaped


def test_model_status_shows_names_and_errors_as_text():
    failed = load_status_markdown(LoadStatus(HOSTILE, "4bit", 1.0, "Loading failed", error=f"no model {HOSTILE}"))
    switched = load_status_markdown(
        LoadStatus("embedded", "4bit", 1.0, "Still using embedded", ready=True, note=f"Could not load {HOSTILE}")
    )
    loading = load_status_markdown(LoadStatus(HOSTILE, "4bit", 0.5, f"Loading {HOSTILE}"))
    for line in (failed, switched):
        assert Tags(line).tags == [] and "&lt;script&gt;" in line and "\\[click\\]" in line
    assert Tags(loading).tags == ["progress"]  # the progress bar is ours; the name is text


def test_error_toasts_show_tags_as_text():
    toast = user_error(ValueError(f"unknown policy {HOSTILE!r}"))
    assert Tags(toast.message).tags == [] and "&lt;think&gt;" in toast.message
    assert "'" in toast.message  # quotes stay readable for API clients


def test_preset_notices_keep_their_markdown_but_show_tags_as_text():
    choice = inputs.choose_preset(inputs.list_presets()[0])
    hostile = dataclasses.replace(choice.preset, title="T <b>", notice="Uses **two** <think> blocks")
    notice = inputs.PresetChoice(hostile, choice.system, choice.trace).notice
    assert notice == "**T &lt;b&gt;**\n\nUses **two** &lt;think&gt; blocks"
    assert no_markup("a < b & c") == "a &lt; b &amp; c"


def test_a_bad_vram_cap_stops_the_app_with_one_line(launch_kwargs, capsys):
    assert app.main(["--vram-cap", "0"]) == 2
    assert capsys.readouterr().err.strip() == "app.py: error: the VRAM cap must be a positive number of GiB, got 0.0"
    assert "demo" not in launch_kwargs


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_vram_cap_is_refused_on_a_cpu_at_start(launch_kwargs, capsys):
    assert app.main(["--vram-cap", "8"]) == 2
    assert capsys.readouterr().err.startswith("app.py: error: a VRAM cap needs a CUDA GPU")
