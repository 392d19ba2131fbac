"""One entry from a model name to a loaded model: ``random:NAME`` builds random weights in a real
geometry (:mod:`.random_weights`); anything else is a local folder, the embedded model or a Hugging Face
id (:mod:`.loading`)."""

from __future__ import annotations

from .loading import LoadedModel, Progress, load_model
from .random_weights import PREFIX, load_random


def load_any(
    name: str,
    quantization: str = "4bit",
    device: str | None = None,
    progress: Progress | None = None,
    backend: str = "auto",
) -> LoadedModel:
    """:func:`~thinkviz.models.random_weights.load_random` for ``random:`` names,
    :func:`~thinkviz.models.loading.load_model` for the rest."""
    if name.strip().startswith(PREFIX):
        return load_random(name, quantization, device, progress, backend=backend)
    return load_model(name, quantization, device, progress, backend=backend)
