"""Models where users already keep them: Ollama's store and LM Studio's models folder.

Both hold GGUF files, found here by reading folders only: no server is contacted and nothing
is downloaded.

- **Ollama** (``$OLLAMA_MODELS``, else ``~/.ollama/models``): ``manifests/HOST/NAMESPACE/MODEL/TAG``
  is a JSON manifest whose layer of media type ``application/vnd.ollama.image.model`` names a
  blob by digest, ``blobs/sha256-<hex>``: that blob is the GGUF.  ``ollama:qwen3:0.6b`` is
  ``registry.ollama.ai/library/qwen3/0.6b``; ``ollama:NAMESPACE/MODEL`` and
  ``ollama:HOST/NAMESPACE/MODEL:TAG`` name the others; the tag defaults to ``latest``.
- **LM Studio** (``~/.lmstudio/models``, or ``~/.cache/lm-studio/models`` from older versions):
  ``PUBLISHER/MODEL/FILE.gguf``, as LM Studio's documentation lays it out.
  ``lmstudio:PUBLISHER/MODEL`` names the folder's GGUF (``…/FILE.gguf`` picks one where it
  holds several quantizations); vision projectors (``mmproj-*``) are not language models.
"""

from __future__ import annotations

import json
import os
import pathlib
from dataclasses import dataclass

from .gguf_file import GGUFError, GGUFInfo, read_info
from .loading import ModelLoadError

OLLAMA, LMSTUDIO = "ollama:", "lmstudio:"
_OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
_OLLAMA_HOST, _OLLAMA_NAMESPACE = "registry.ollama.ai", "library"


@dataclass(frozen=True)
class FoundModel:
    """A GGUF found in a store: the name ``--model`` takes, its file, and its header (or why it
    cannot be loaded)."""

    name: str
    path: pathlib.Path
    info: GGUFInfo | None
    problem: str | None = None


def ollama_root() -> pathlib.Path:
    """Ollama's model store: ``$OLLAMA_MODELS``, else ``~/.ollama/models``."""
    return pathlib.Path(os.environ.get("OLLAMA_MODELS") or pathlib.Path.home() / ".ollama" / "models").expanduser()


def lmstudio_roots() -> list[pathlib.Path]:
    """LM Studio's models folders that exist, newest layout first."""
    home = pathlib.Path.home()
    return [p for p in (home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models") if p.is_dir()]


def is_store_name(name: str) -> bool:
    return name.strip().startswith((OLLAMA, LMSTUDIO))


def resolve_store(name: str) -> pathlib.Path:
    """The GGUF file ``ollama:…`` or ``lmstudio:…`` names; :class:`ModelLoadError` (one line) for
    a missing store, an unknown name or an unreadable manifest."""
    name = name.strip()
    if name.startswith(OLLAMA):
        return _ollama_blob(name.removeprefix(OLLAMA))
    return _lmstudio_file(name.removeprefix(LMSTUDIO))


def _ollama_blob(model: str) -> pathlib.Path:
    root = ollama_root()
    if not (root / "manifests").is_dir():
        raise ModelLoadError(f"No Ollama model store at {root} (set $OLLAMA_MODELS to where it is)")
    manifest = root / "manifests" / _ollama_manifest_path(model)
    if not manifest.is_file():
        known = ", ".join(m.name for m in _ollama_models(root)) or "none"
        raise ModelLoadError(f"Ollama has no model {model!r} in {root}; it has: {known}")
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8"))["layers"]
        digest = next(layer["digest"] for layer in layers if layer.get("mediaType") == _OLLAMA_MODEL_LAYER)
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        raise ModelLoadError(f"Ollama's manifest {manifest} names no model layer") from None
    blob = root / "blobs" / digest.replace(":", "-")
    if not blob.is_file():
        raise ModelLoadError(f"Ollama's model {model!r} lacks its blob {blob.name} in {root / 'blobs'}")
    return blob


def _ollama_manifest_path(model: str) -> pathlib.Path:
    """``qwen3:0.6b`` → ``registry.ollama.ai/library/qwen3/0.6b`` (tag ``latest`` when none)."""
    base, sep, tag = model.rpartition(":")
    if not sep or "/" in tag:
        base, tag = model, "latest"
    parts = [p for p in base.split("/") if p]
    if not parts or len(parts) > 3 or any(p in (".", "..") for p in [*parts, tag]):
        raise ModelLoadError(f"Not an Ollama model name: {model!r} (expected NAME[:TAG])")
    prefix = [_OLLAMA_HOST, _OLLAMA_NAMESPACE][: 3 - len(parts)]
    return pathlib.Path(*prefix, *parts, tag)


def _ollama_name(relative: pathlib.Path) -> str:
    """A manifest's path under ``manifests/`` → the shortest ``ollama:`` name for it."""
    *parts, tag = relative.parts
    if parts[:2] == [_OLLAMA_HOST, _OLLAMA_NAMESPACE]:
        parts = parts[2:]
    elif parts[:1] == [_OLLAMA_HOST]:
        parts = parts[1:]
    return f"{OLLAMA}{'/'.join(parts)}:{tag}"


def _ollama_models(root: pathlib.Path) -> list[FoundModel]:
    found = []
    for manifest in sorted((root / "manifests").glob("*/*/*/*")):
        if manifest.is_file():
            name = _ollama_name(manifest.relative_to(root / "manifests"))
            try:
                found.append(_found(name, _ollama_blob(name.removeprefix(OLLAMA))))
            except ModelLoadError as exc:
                found.append(FoundModel(name, manifest, None, str(exc)))
    return found


def _lmstudio_file(model: str) -> pathlib.Path:
    roots = lmstudio_roots()
    if not roots:
        raise ModelLoadError("No LM Studio models folder (looked in ~/.lmstudio/models and ~/.cache/lm-studio/models)")
    parts = [p for p in model.split("/") if p]
    if len(parts) not in (2, 3) or any(p in (".", "..") for p in parts):
        raise ModelLoadError(f"Not an LM Studio model name: {model!r} (expected PUBLISHER/MODEL[/FILE.gguf])")
    for root in roots:
        folder = root / parts[0] / parts[1]
        files = _gguf_files(folder)
        if len(parts) == 3:
            files = [f for f in files if f.name == parts[2]]
        if len(files) == 1:
            return files[0]
        if len(files) > 1:
            names = ", ".join(f.name for f in files)
            raise ModelLoadError(f"LM Studio's {parts[0]}/{parts[1]} holds several GGUFs ({names}); add /FILE.gguf")
    raise ModelLoadError(f"LM Studio has no model {model!r} in {', '.join(map(str, roots))}")


def _gguf_files(folder: pathlib.Path) -> list[pathlib.Path]:
    """The language-model GGUFs in ``folder`` (vision projectors left out)."""
    if not folder.is_dir():
        return []
    return sorted(f for f in folder.glob("*.gguf") if f.is_file() and not f.name.lower().startswith("mmproj"))


def _lmstudio_models() -> list[FoundModel]:
    found = []
    for root in lmstudio_roots():
        for folder in sorted(p for p in root.glob("*/*") if p.is_dir()):
            files = _gguf_files(folder)
            base = f"{LMSTUDIO}{folder.parent.name}/{folder.name}"
            found += [_found(base if len(files) == 1 else f"{base}/{f.name}", f) for f in files]
    return found


def _found(name: str, path: pathlib.Path) -> FoundModel:
    try:
        return FoundModel(name, path, read_info(path))
    except GGUFError as exc:
        return FoundModel(name, path, None, str(exc))


def found_models() -> list[FoundModel]:
    """Every GGUF in Ollama's store and LM Studio's folders, in that order (nothing loaded)."""
    root = ollama_root()
    return (_ollama_models(root) if (root / "manifests").is_dir() else []) + _lmstudio_models()
