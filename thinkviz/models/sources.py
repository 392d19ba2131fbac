"""One entry from a model name to a loaded model: ``random:NAME`` builds random weights in a real
geometry (:mod:`.random_weights`); ``ollama:NAME[:TAG]`` and ``lmstudio:PUBLISHER/MODEL`` are GGUF
files found where those apps keep them (:mod:`.stores`); anything else is a ``.gguf`` file, a local
folder, the embedded model or a Hugging Face id (:mod:`.loading`)."""

from __future__ import annotations

import dataclasses

from .loading import LoadedModel, LoadedTokenizer, Progress, load_model, load_tokenizer
from .random_weights import PREFIX, load_random
from .stores import is_store_name, resolve_store


def load_any(
    name: str,
    quantization: str = "4bit",
    device: str | None = None,
    progress: Progress | None = None,
    backend: str = "auto",
) -> LoadedModel:
    """:func:`~thinkviz.models.random_weights.load_random` for ``random:`` names, the store's GGUF
    for ``ollama:`` / ``lmstudio:`` names (loaded under that name), :func:`~thinkviz.models.loading.load_model`
    for the rest."""
    if name.strip().startswith(PREFIX):
        return load_random(name, quantization, device, progress, backend=backend)
    if is_store_name(name):
        loaded = load_model(str(resolve_store(name)), quantization, device, progress, backend=backend)
        return dataclasses.replace(loaded, name=name.strip())
    return load_model(name, quantization, device, progress, backend=backend)


def tokenizer_any(name: str) -> LoadedTokenizer:
    """:func:`~thinkviz.models.loading.load_tokenizer` for any name :func:`load_any` takes but ``random:``."""
    if is_store_name(name):
        return dataclasses.replace(load_tokenizer(str(resolve_store(name))), name=name.strip())
    return load_tokenizer(name)
