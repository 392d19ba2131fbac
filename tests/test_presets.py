"""Shipped presets load, their traces have the promised shape, and bad preset files fail clearly."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from thinkviz.core.kvquant import KVQuant
from thinkviz.policies import make_policy, policy_names
from thinkviz.policies.think_drop import code_parses
from thinkviz.demos.presets import PRESETS_DIR, Preset, PresetError, list_presets, load_preset
from tiny_models import tiny_model

TRACES_DIR = PRESETS_DIR / "traces"
PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
SYNTAX_ERROR_TRACE = "coding_duration.md"  # its second draft (after think block 2) does not parse


def _trace_files(prefix: str) -> list[Path]:
    return sorted(TRACES_DIR.glob(f"{prefix}*.md"))


def _think_blocks(text: str) -> int:
    opened, closed = text.count("<think>"), text.count("</think>")
    assert opened == closed, "unbalanced <think> tags"
    return opened


@pytest.fixture(scope="module")
def count_tokens():
    """Token counter using the embedded SmolLM2-135M-Instruct tokenizer (the one tiny models share)."""
    tokenizer = tiny_model("llama").tokenizer
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


# ---- shipped presets ---------------------------------------------------------------------


def test_enough_presets_covering_the_demos():
    presets = [load_preset(name) for name in list_presets()]
    assert len(presets) >= 8
    policies = {p.policy for p in presets}
    assert {"think_drop", "streaming", "h2o", "tam", "dynts", "entropy"} <= policies
    assert any(p.mode == "generate" for p in presets)
    assert any(len(p.compare) >= 3 for p in presets)


@pytest.mark.parametrize("name", list_presets())
def test_shipped_preset_loads(name):
    preset = load_preset(name)
    assert preset.name == name and preset.path == PRESETS_DIR / f"{name}.yaml"
    assert preset.title.strip() and preset.notice.strip() and preset.question.strip()
    assert preset.params["budget"] >= 8 and preset.params["budget"] % 8 == 0
    if preset.mode == "replay":
        assert preset.trace and preset.trace.strip()
    else:
        assert preset.trace is None


COMMON_KNOBS = ("budget", "interval", "protect_system", "protect_question")


@pytest.mark.parametrize("name", list_presets())
def test_shipped_preset_knobs_are_accepted_by_its_policies(name):
    """The preset's policy takes all its knobs; every compared policy takes the common ones."""
    preset = load_preset(name)
    make_policy(preset.policy, **preset.params)
    common = {k: v for k, v in preset.params.items() if k in COMMON_KNOBS}
    for compared in preset.compare:
        assert compared in policy_names(), f"{name} compares unknown policy {compared!r}"
        make_policy(compared, **common)


def test_every_trace_is_used_by_a_preset():
    used = {yaml.safe_load(p.read_text(encoding="utf-8")).get("trace") for p in PRESETS_DIR.glob("*.yaml")}
    shipped = {f"traces/{p.name}" for p in TRACES_DIR.glob("*.md")}
    assert shipped <= used


def test_think_drop_runs_on_every_coding_trace():
    presets = [load_preset(name) for name in list_presets()]
    traced = {p.trace for p in presets if p.policy == "think_drop"}
    for path in _trace_files("coding_"):
        assert path.read_text(encoding="utf-8") in traced, path.name


# ---- trace shapes ------------------------------------------------------------------------


def test_trace_families_exist():
    assert len(_trace_files("coding_")) >= 3
    assert _trace_files("math_") and _trace_files("long_")


@pytest.mark.parametrize("path", _trace_files("coding_"), ids=lambda p: p.name)
def test_coding_trace_shape(path, count_tokens):
    text = path.read_text(encoding="utf-8")
    assert 1500 <= count_tokens(text) <= 4000
    assert 3 <= _think_blocks(text) <= 5
    # Every think block is followed by a python draft (the reflection loop: think -> code -> run).
    for tail in text.split("</think>")[1:]:
        assert tail.lstrip().startswith("```python\n")


@pytest.mark.parametrize("path", _trace_files("math_"), ids=lambda p: p.name)
def test_math_trace_shape(path, count_tokens):
    text = path.read_text(encoding="utf-8")
    assert 1000 <= count_tokens(text) <= 2500
    assert 2 <= _think_blocks(text) <= 3


@pytest.mark.parametrize("path", _trace_files("long_"), ids=lambda p: p.name)
def test_long_text_shape(path, count_tokens):
    text = path.read_text(encoding="utf-8")
    assert count_tokens(text) >= 6000
    assert "<think>" not in text and "</think>" not in text
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    assert len(paragraphs) == len(set(paragraphs)), "duplicated paragraph"


def test_exactly_one_draft_has_a_syntax_error():
    parsed = {
        path.name: [code_parses(code) for code in PYTHON_BLOCK.findall(path.read_text(encoding="utf-8"))]
        for path in _trace_files("coding_")
    }
    # The draft after think block 2 of the duration trace is broken; everything else parses.
    assert parsed.pop(SYNTAX_ERROR_TRACE) == [True, False, True, True]
    for name, results in parsed.items():
        assert results and all(results), name


# ---- validation --------------------------------------------------------------------------


_DROP = object()  # marks a key to leave out of the preset


def _valid(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "title": "T",
        "notice": "N",
        "mode": "replay",
        "policy": "window",
        "params": {"budget": 64, "interval": 8, "protect_system": True},
        "system": None,
        "question": "Q?",
        "trace": "traces/t.md",
        "compare": ["window", "h2o"],
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not _DROP}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.md").write_text("<think>\nstep\n</think>\nanswer\n", encoding="utf-8")
    return tmp_path


def _write(folder: Path, data: Any, name: str = "p") -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data, encoding="utf-8")
    return path


def _error(folder: Path, data: Any) -> str:
    _write(folder, data)
    with pytest.raises(PresetError) as info:
        load_preset("p", directory=folder)
    message = str(info.value)
    assert "p.yaml" in message and "\n" not in message
    return message


def test_valid_preset_round_trip(folder):
    _write(folder, _valid(), "demo")
    preset = load_preset("demo", directory=folder)
    assert isinstance(preset, Preset)
    assert preset.trace == "<think>\nstep\n</think>\nanswer\n"
    assert preset.compare == ("window", "h2o") and preset.max_new_tokens == 256
    assert list_presets(folder) == ["demo"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        preset.title = "changed"  # type: ignore[misc]


def test_kv_formats_of_the_run_and_of_each_compared_policy(folder):
    _write(folder, _valid(kv_quant="kivi2", kv_residual=64, compare=["h2o", "full@q4_0", "window@kivi4"]), "kv")
    preset = load_preset("kv", directory=folder)
    assert preset.kv_quant == KVQuant("kivi2", 64)
    assert preset.compare == ("h2o", "full", "window")
    assert preset.compare_kv == (KVQuant("none", 64), KVQuant("q4_0", 64), KVQuant("kivi4", 64))
    _write(folder, _valid(), "plain")
    assert load_preset("plain", directory=folder).kv_quant == KVQuant()


def test_load_by_path_from_elsewhere(folder, tmp_path_factory):
    outside = tmp_path_factory.mktemp("user")
    path = _write(outside, _valid(), "mine")
    assert load_preset(path, directory=folder).name == "mine"
    assert load_preset(str(path), directory=folder).trace.startswith("<think>")


def test_generate_preset(folder):
    _write(folder, _valid(mode="generate", trace=_DROP, max_new_tokens=64))
    preset = load_preset("p", directory=folder)
    assert preset.trace is None and preset.max_new_tokens == 64


def test_unknown_name(folder):
    with pytest.raises(PresetError, match="unknown preset 'nope'"):
        load_preset("nope", directory=folder)


def test_missing_file_path(folder):
    with pytest.raises(PresetError, match="file not found"):
        load_preset(folder / "absent.yaml", directory=folder)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("title: [unclosed\n", "malformed YAML at line"),
        ("a: b\n  c: d\n", "malformed YAML"),
        ("- just\n- a list\n", "top level must be a mapping"),
        ("", "got empty"),
        ("!!python/object/apply:os.system ['true']\n", "malformed YAML"),
    ],
)
def test_malformed_yaml(folder, text, expected):
    assert expected in _error(folder, text)


def test_not_utf8_preset(folder):
    (folder / "p.yaml").write_bytes(b"title: \xff\xfe\n")
    with pytest.raises(PresetError, match="not UTF-8"):
        load_preset("p", directory=folder)


def test_missing_keys(folder):
    message = _error(folder, _valid(title=_DROP, question=_DROP))
    assert "missing required key(s): title, question" in message


def test_unknown_key(folder):
    assert "unknown key(s): compre" in _error(folder, _valid(compre=["h2o"]))


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"title": 3}, "'title' must be a string"),
        ({"question": "   "}, "'question' is empty"),
        ({"policy": ""}, "'policy' is empty"),
        ({"mode": "live"}, "unknown mode 'live'"),
        ({"system": 5}, "'system' must be a string or null"),
        ({"params": [1, 2]}, "'params' must be a mapping"),
        ({"params": {"budget": "big"}}, "params.budget must be a positive integer"),
        ({"params": {"budget": 0}}, "params.budget must be a positive integer"),
        ({"params": {"interval": True}}, "params.interval must be a positive integer"),
        ({"params": {"protect_system": "yes please"}}, "params.protect_system must be true or false"),
        ({"params": {"recent": {"a": 1}}}, "params.recent must be a number"),
        ({"compare": "h2o"}, "'compare' must be a list"),
        ({"compare": ["h2o", 3]}, "'compare' must be a list"),
        ({"compare": ["h2o", "full@q5_1"]}, "compare entry 'full@q5_1': unknown KV format 'q5_1'"),
        ({"compare": ["h2o", "h2o@q8_0"]}, "'compare' lists 'h2o' twice"),
        ({"kv_quant": "fp8"}, "'kv_quant': unknown KV format 'fp8'"),
        ({"kv_quant": 4}, "'kv_quant' must be a KV format name"),
        ({"kv_quant": "kivi2", "kv_residual": 2}, "residual must be between 8 and 512"),
        ({"kv_residual": "long"}, "'kv_residual' must be an integer"),
        ({"max_new_tokens": 0}, "'max_new_tokens' must be an integer in 1..4096"),
        ({"max_new_tokens": 5000}, "'max_new_tokens' must be an integer in 1..4096"),
        ({"max_new_tokens": True}, "'max_new_tokens' must be an integer in 1..4096"),
        ({"max_new_tokens": 12.5}, "'max_new_tokens' must be an integer in 1..4096"),
        ({"trace": _DROP}, "replay mode needs a 'trace'"),
        ({"mode": "generate"}, "'trace' is only for replay mode"),
        ({"trace": 7}, "'trace' must be a non-empty path"),
    ],
)
def test_wrong_types_and_values(folder, overrides, expected):
    assert expected in _error(folder, _valid(**overrides))


@pytest.mark.parametrize("trace", ["../secret.md", "traces/../../secret.md", "/etc/hostname"])
def test_trace_path_must_stay_inside(folder, trace):
    (folder.parent / "secret.md").write_text("not yours", encoding="utf-8")
    assert "escapes the presets folder" in _error(folder, _valid(trace=trace))


def test_trace_symlink_out_of_the_folder(folder, tmp_path_factory):
    secret = tmp_path_factory.mktemp("elsewhere") / "secret.md"
    secret.write_text("not yours", encoding="utf-8")
    (folder / "traces" / "link.md").symlink_to(secret)
    assert "escapes the presets folder" in _error(folder, _valid(trace="traces/link.md"))


def test_missing_trace_file(folder):
    assert "trace file 'traces/absent.md' not found" in _error(folder, _valid(trace="traces/absent.md"))


def test_trace_not_utf8(folder):
    (folder / "traces" / "bad.md").write_bytes(b"caf\xe9 latin-1\n")
    assert "is not UTF-8 text" in _error(folder, _valid(trace="traces/bad.md"))


def test_empty_trace(folder):
    (folder / "traces" / "blank.md").write_text("\n  \n", encoding="utf-8")
    assert "is empty" in _error(folder, _valid(trace="traces/blank.md"))
