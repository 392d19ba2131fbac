"""Classroom presets: a question, a policy with its knobs and (for replay) a hand-written trace.

A preset is one YAML file in ``presets/`` (schema in ``presets/README.md``).  Loading checks
the structure and types, reads the trace file (which must stay inside the presets folder,
even when the preset file itself comes from elsewhere) and returns a frozen :class:`Preset`.
A trace file holds the assistant's text, or a transcript that continues the preset's chat
(``ASSISTANT:`` / ``TOOL:`` / ``USER:`` lines, or JSON; :mod:`thinkviz.text.transcript`): the preset's
system prompt and question come first, then its messages.
Policy names are only checked to be non-empty strings here; the policy registry and the UI
decide whether they exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

import yaml

from ..text.chat import REASONING_SYSTEM_PROMPT
from ..core.kvquant import RESIDUAL, KVQuant, KVQuantError
from ..text.transcript import Message, TraceError, is_transcript, join_chat, parse_transcript

PRESETS_DIR = Path(__file__).resolve().parents[2] / "presets"

MODES = ("replay", "generate")
DEFAULT_MAX_NEW_TOKENS = 256
MAX_NEW_TOKENS_RANGE = (1, 4096)

_REQUIRED = ("title", "notice", "mode", "policy", "params", "question")
_OPTIONAL = ("system", "trace", "max_new_tokens", "compare", "kv_quant", "kv_residual")
# Common knobs whose type is part of the schema; policy-specific knobs only need to be scalars.
_POSITIVE_INT_PARAMS = ("budget", "interval")
_BOOL_PARAMS = ("protect_system", "protect_question")


class PresetError(ValueError):
    """A preset cannot be used; the one-line message names the preset file and the problem."""


Fail = Callable[[str], PresetError]


@dataclass(frozen=True)
class Preset:
    """One loaded preset.  ``trace`` is the trace file's text (replay mode), ``trace_file`` its path
    as the preset names it (relative to the presets folder); ``messages`` the whole conversation
    when that file is a transcript (else ``None``).

    ``kv_quant`` is the KV format of the preset's run; ``compare_kv`` the format of each
    ``compare`` column (``full@q4_0`` in the file: the full cache stored in q4_0).
    """

    name: str
    title: str
    notice: str
    mode: str
    policy: str
    params: dict[str, Any]
    system: str | None
    question: str
    trace: str | None
    max_new_tokens: int
    compare: tuple[str, ...]
    path: Path
    messages: tuple[Message, ...] | None = None
    trace_file: str | None = None
    kv_quant: KVQuant = KVQuant()
    compare_kv: tuple[KVQuant, ...] = ()

    @property
    def system_prompt(self) -> str:
        """The system prompt a run of this preset sends: the file's, or the reasoning prompt
        when the file says ``null``."""
        return REASONING_SYSTEM_PROMPT if self.system is None else self.system


def list_presets(directory: Path | str = PRESETS_DIR) -> list[str]:
    """Names (file stems) of the ``*.yaml`` presets in ``directory``, sorted."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p.stem for p in directory.glob("*.yaml") if p.is_file())


def load_preset(name_or_path: str | Path, directory: Path | str = PRESETS_DIR) -> Preset:
    """Load and validate a preset by name (a stem in ``directory``) or by path to a YAML file.

    A ``Path`` or a string ending in ``.yaml`` / ``.yml`` is a file path; anything else is a
    preset name.  The trace path inside the file is resolved relative to ``directory`` and
    must stay inside it.  Raises :class:`PresetError` with a one-line reason.
    """
    directory = Path(directory)
    path = _locate(name_or_path, directory)
    data = _read_yaml(path)
    where = path.name

    def fail(problem: str) -> PresetError:
        return PresetError(f"preset {where}: {problem}")

    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise fail(f"missing required key(s): {', '.join(missing)}")
    unknown = sorted(str(key) for key in data if key not in _REQUIRED + _OPTIONAL)
    if unknown:
        raise fail(f"unknown key(s): {', '.join(unknown)} (allowed: {', '.join(_REQUIRED + _OPTIONAL)})")

    title = _text(data, "title", fail)
    notice = _text(data, "notice", fail)
    question = _text(data, "question", fail)
    policy = _text(data, "policy", fail)
    mode = _text(data, "mode", fail)
    if mode not in MODES:
        raise fail(f"unknown mode {mode!r}; use one of: {', '.join(MODES)}")
    system = data.get("system")
    if system is not None and not isinstance(system, str):
        raise fail(f"'system' must be a string or null, got {type(system).__name__}")
    params = _params(data["params"], fail)
    residual = data.get("kv_residual", RESIDUAL)
    if isinstance(residual, bool) or not isinstance(residual, int):
        raise fail(f"'kv_residual' must be an integer, got {residual!r}")
    kv_quant = _kv_quant(data.get("kv_quant", "none"), residual, "'kv_quant'", fail)
    compare, compare_kv = _compare(data.get("compare"), residual, fail)
    max_new_tokens = _max_new_tokens(data.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS), fail)

    trace_ref = data.get("trace")
    messages = None
    if mode == "replay":
        if trace_ref is None:
            raise fail("replay mode needs a 'trace' file (path relative to the presets folder)")
        trace = _read_trace(trace_ref, directory, fail)
        if is_transcript(trace, trace_ref):
            system_prompt = REASONING_SYSTEM_PROMPT if system is None else system
            messages = join_chat(system_prompt, question, _continuation(trace, trace_ref, fail))
    else:
        if trace_ref is not None:
            raise fail("'trace' is only for replay mode; a generate preset decodes from the question")
        trace = None

    return Preset(
        name=path.stem,
        title=title,
        notice=notice,
        mode=mode,
        policy=policy,
        params=params,
        system=system,
        question=question,
        trace=trace,
        max_new_tokens=max_new_tokens,
        compare=compare,
        path=path,
        messages=messages,
        trace_file=trace_ref if mode == "replay" else None,
        kv_quant=kv_quant,
        compare_kv=compare_kv,
    )


def _locate(name_or_path: str | Path, directory: Path) -> Path:
    """The preset file for a name or a path; :class:`PresetError` if there is none."""
    if isinstance(name_or_path, Path) or str(name_or_path).endswith((".yaml", ".yml")):
        path = Path(name_or_path)
        if not path.is_file():
            raise PresetError(f"preset {path}: file not found")
        return path
    name = str(name_or_path)
    available = list_presets(directory)
    if name not in available:
        raise PresetError(f"unknown preset {name!r}; available: {', '.join(available) or 'none'}")
    return directory / f"{name}.yaml"


def _read_yaml(path: Path) -> dict[Any, Any]:
    """The top-level mapping of a YAML file (``yaml.safe_load`` only)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise PresetError(f"preset {path.name}: file is not UTF-8 text") from None
    except OSError as exc:
        raise PresetError(f"preset {path.name}: cannot read file ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise PresetError(f"preset {path.name}: malformed YAML{at}: {problem}") from None
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise PresetError(f"preset {path.name}: top level must be a mapping of keys, got {kind}")
    return data


def _text(data: dict[Any, Any], key: str, fail: Fail) -> str:
    value = data[key]
    if not isinstance(value, str):
        raise fail(f"{key!r} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise fail(f"{key!r} is empty")
    return value


def _params(value: Any, fail: Fail) -> dict[str, Any]:
    """A copy of ``params``: string keys, scalar values (numbers, true/false, a choice's name), sane common
    knobs; the policy checks the rest when it is made."""
    if not isinstance(value, dict):
        raise fail(f"'params' must be a mapping, got {type(value).__name__}")
    params: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise fail(f"params: every key must be a non-empty string, got {key!r}")
        if key in _BOOL_PARAMS:
            if not isinstance(item, bool):
                raise fail(f"params.{key} must be true or false, got {item!r}")
        elif key in _POSITIVE_INT_PARAMS:
            if isinstance(item, bool) or not isinstance(item, int) or item < 1:
                raise fail(f"params.{key} must be a positive integer, got {item!r}")
        elif not isinstance(item, (bool, int, float, str)):
            raise fail(f"params.{key} must be a number, true/false or a choice's name, got {type(item).__name__}")
        params[key] = item
    return params


def _kv_quant(value: Any, residual: int, where: str, fail: Fail) -> KVQuant:
    if not isinstance(value, str):
        raise fail(f"{where} must be a KV format name, got {value!r}")
    try:
        return KVQuant.parse(value, residual)
    except KVQuantError as exc:
        raise fail(f"{where}: {exc}") from None


def _compare(value: Any, residual: int, fail: Fail) -> tuple[tuple[str, ...], tuple[KVQuant, ...]]:
    """The compared policy names and their KV formats (``name@format``; plain ``name``: full precision)."""
    if value is None:
        return (), ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise fail("'compare' must be a list of policy names (name@format for a KV format)")
    names, formats = [], []
    for entry in value:
        name, _, fmt = entry.partition("@")
        if name.strip() in names:
            raise fail(f"'compare' lists {name.strip()!r} twice; the Compare tab shows each policy once")
        names.append(name.strip())
        formats.append(_kv_quant(fmt or "none", residual, f"compare entry {entry!r}", fail))
    return tuple(names), tuple(formats)


def _max_new_tokens(value: Any, fail: Fail) -> int:
    low, high = MAX_NEW_TOKENS_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise fail(f"'max_new_tokens' must be an integer in {low}..{high}, got {value!r}")
    return value


def _read_trace(ref: Any, directory: Path, fail: Fail) -> str:
    """The UTF-8 text of the trace file ``ref``, which must resolve to a file inside ``directory``."""
    if not isinstance(ref, str) or not ref.strip():
        raise fail("'trace' must be a non-empty path relative to the presets folder")
    root = directory.resolve()
    path = (root / ref).resolve()
    if not path.is_relative_to(root):
        raise fail(f"trace path {ref!r} escapes the presets folder {root}")
    if not path.is_file():
        raise fail(f"trace file {ref!r} not found in {root}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise fail(f"trace file {ref!r} is not UTF-8 text (bad byte at offset {exc.start})") from None
    except OSError as exc:
        raise fail(f"cannot read trace file {ref!r} ({exc.strerror})") from None
    if not text.strip():
        raise fail(f"trace file {ref!r} is empty")
    return text


def _continuation(text: str, ref: str, fail: Fail) -> tuple[Message, ...]:
    """The messages of a transcript trace file, which continue the preset's question."""
    try:
        messages = parse_transcript(text, continues=True)
    except TraceError as exc:
        raise fail(f"trace file {ref!r}: {exc}") from None
    if messages[0].role in ("system", "user"):
        raise fail(
            f"trace file {ref!r} starts with a {messages[0].role} message, but a preset's transcript continues "
            "the preset's system prompt and question: start it with its first ASSISTANT: message"
        )
    return messages
