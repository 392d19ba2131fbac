"""Shared fixtures: the embedded model and the tiny random models, each built once per session.

Tests marked ``gpu`` are skipped, with the reason in the summary, where PyTorch sees no CUDA GPU.
Property tests run Hypothesis's ``default`` profile, set here to a few examples so the suite answers
in minutes; ``pytest --hypothesis-profile=thorough`` runs at least as many as each test once asked for.
"""

import contextlib
import os
from collections.abc import Callable

import pytest
import torch

from thinkviz.models.loading import EMBEDDED, LoadedModel, choose_backend, load_model
from tiny_models import tiny_model

NO_GPU = "gpu: no CUDA GPU here (torch.cuda.is_available() is False); make gpu-check runs these on one"

with contextlib.suppress(ImportError):  # the borrowed GPU machines (make gpu-check) have no Hypothesis
    from hypothesis import settings

    settings.register_profile("default", max_examples=25, deadline=None)
    settings.register_profile("thorough", max_examples=300, deadline=None)


# Under pytest-xdist (make test: one worker per core) each worker computes on one thread, and so
# does every process it starts (an app, the CLI, a Ray worker): torch's default of one thread per
# core in each of them oversubscribes the cores, and its waiting threads spin.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason=NO_GPU)
    for item in items:
        if _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
        if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
            item.add_marker(skip)


def _shares_a_module_fixture(item) -> bool:
    """Whether ``item`` uses a module- or class-scoped fixture (a page, a served app, a Ray runtime).

    Under pytest-xdist's ``--dist loadgroup`` (the Makefile) the tests of such a module form one group
    and run on one worker, in order: the fixture is built once, and a test that goes on from what an
    earlier test left on a shared page finds it. Every other test goes to whichever worker is free."""
    definitions = getattr(item, "_fixtureinfo", None)  # pytest keeps a test's fixture definitions here
    if definitions is None:
        return False
    return any(d.scope in ("module", "class") for defs in definitions.name2fixturedefs.values() for d in defs)


@pytest.fixture(scope="session")
def embedded_loads() -> Callable[..., LoadedModel]:
    """``load(quantization, device=None, backend="auto")``: the embedded model as
    :func:`~thinkviz.models.loading.load_model` loads it, once per session for each quantization,
    device and backend (``auto`` shares the load of the backend it picks)."""
    loaded: dict[tuple[str, str, str], LoadedModel] = {}

    def load(quantization: str, device: str | None = None, backend: str = "auto") -> LoadedModel:
        where = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        key = (quantization, where.type, choose_backend(quantization, backend, where))
        if key not in loaded:
            loaded[key] = load_model(EMBEDDED, quantization, device, backend=backend)
        return loaded[key]

    return load


@pytest.fixture(scope="session")
def embedded_model(embedded_loads) -> LoadedModel:
    """The embedded SmolLM2-135M-Instruct in 4-bit, shared by the session: on CUDA when available
    (bitsandbytes NF4), else on the CPU with the automatic backend (torch-int4 on AVX512)."""
    return embedded_loads("4bit")


@pytest.fixture(scope="session")
def embedded_model_int4(embedded_loads) -> LoadedModel:
    """The embedded model on the CPU with the torch-int4 backend, whatever ``auto`` would pick."""
    return embedded_loads("4bit", "cpu", "torch-int4")


@pytest.fixture(scope="session")
def embedded_model_fp32(embedded_loads) -> LoadedModel:
    """The embedded model unquantized in float32: the reference precision of the eviction oracle."""
    return embedded_loads("none", "cpu")


# The tiny models are shared by the session (building one costs a fraction of a second, and
# hundreds of tests use them): a test leaves its model as it found it (``monkeypatch`` for a change).


@pytest.fixture(scope="session")
def tiny_llama() -> LoadedModel:
    """A 2-layer random Llama (4 query heads over 2 kv-heads) with the SmolLM2 tokenizer."""
    return tiny_model("llama")


@pytest.fixture(scope="session")
def tiny_qwen3() -> LoadedModel:
    """A 2-layer random Qwen3 (4 query heads over 2 kv-heads) with the SmolLM2 tokenizer."""
    return tiny_model("qwen3")


@pytest.fixture(scope="session")
def tiny_llama_int4() -> LoadedModel:
    """``tiny_llama`` with its linears in 4 bits (the torch-int4 CPU backend)."""
    return tiny_model("llama", quantization="4bit")


@pytest.fixture(scope="session")
def tiny_qwen3_int4() -> LoadedModel:
    """``tiny_qwen3`` with its linears in 4 bits (the torch-int4 CPU backend)."""
    return tiny_model("qwen3", quantization="4bit")


@pytest.fixture(scope="session")
def tiny_llama_d32() -> LoadedModel:
    """The tiny Llama with head_dim 32 (hidden 128), the smallest that holds one 32-value
    quantization block per head: the model of the KV-format tests."""
    return tiny_model("llama", hidden=128)


@pytest.fixture(scope="session")
def tiny_qwen3_d32() -> LoadedModel:
    """The tiny Qwen3 with head_dim 32 (hidden 128)."""
    return tiny_model("qwen3", hidden=128)


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
