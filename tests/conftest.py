"""Shared fixtures: the embedded model (loaded once per session) and tiny random models."""

import pytest

from thinkviz.model import LoadedModel, load_model
from tiny_models import tiny_model


@pytest.fixture(scope="session")
def embedded_model() -> LoadedModel:
    """The embedded SmolLM2-135M-Instruct, 4-bit NF4 (on CUDA when available), shared by the session."""
    return load_model(quantization="4bit")


@pytest.fixture
def tiny_llama() -> LoadedModel:
    """A fresh 2-layer random Llama (4 query heads over 2 kv-heads) with the SmolLM2 tokenizer."""
    return tiny_model("llama")


@pytest.fixture
def tiny_qwen3() -> LoadedModel:
    """A fresh 2-layer random Qwen3 (4 query heads over 2 kv-heads) with the SmolLM2 tokenizer."""
    return tiny_model("qwen3")


@pytest.fixture(scope="session")
def embedded_model_fp32() -> LoadedModel:
    """The embedded model unquantized in float32: the reference precision of the eviction oracle."""
    return load_model(quantization="none", device="cpu")


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium, headless, through Playwright (never ``playwright install``).

    One Playwright driver per session: a second ``sync_playwright()`` while one is open fails.
    """
    from pathlib import Path

    from playwright.sync_api import sync_playwright

    from thinkviz.bench.browser import CHROMIUM, CHROMIUM_ARGS

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
