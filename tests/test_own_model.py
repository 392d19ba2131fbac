"""A user's own model: GGUF files (written here, random weights), Ollama's store and LM Studio's
folder in a temporary home, and each model's own reasoning format.  Nothing is downloaded."""

from __future__ import annotations

import copy
import dataclasses
import json

import gguf
import pytest
import torch

from gguf_models import HARMONY_TEMPLATE, QWEN3_TEMPLATE, R1_TEMPLATE, ollama_store, write_gguf
from thinkviz.cli import main
from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.measure.inspection import inspect_trace
from thinkviz.measure.replay import LockstepReplay, Trace, prepare_trace
from thinkviz.memory import TargetModel
from thinkviz.models.gguf_file import file_digest
from thinkviz.models.loading import ModelLoadError, embedded_tokenizer
from thinkviz.models.sources import load_any, tokenizer_any
from thinkviz.models.stores import resolve_store
from thinkviz.policies import make_policy
from thinkviz.text.chat import build_chat
from thinkviz.text.reasoning import reasoning_format
from thinkviz.text.segments import Segmenter
from tiny_models import tiny_model

Q = gguf.GGMLQuantizationType
QWEN3_GEOMETRY = {"hidden": 256, "q_heads": 2, "kv_heads": 1}  # transformers reads Qwen3's head_dim as 128
PROMPT_IDS = torch.tensor([[1, 504, 913, 33, 77, 2048, 9, 311]])


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A temporary home and ThinkViz cache; the GGUFs: a Llama in F32, a Qwen3 in Q8_0."""
    root = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(root))
        patch.setenv("THINKVIZ_CACHE", str(root / "cache"))
        patch.delenv("OLLAMA_MODELS", raising=False)
        llama = tiny_model("llama", seed=3)
        qwen3 = tiny_model("qwen3", seed=4, **QWEN3_GEOMETRY)
        files = {
            "llama": write_gguf(root / "tiny-llama-F32.gguf", llama.model, "llama", Q.F32),
            "qwen3": write_gguf(root / "tiny-qwen3-Q8_0.gguf", qwen3.model, "qwen3", Q.Q8_0, QWEN3_TEMPLATE),
        }
        yield root, files, {"llama": llama, "qwen3": qwen3}


def _logits(model, ids=PROMPT_IDS):
    with torch.no_grad():
        return model(ids).logits[0]


def _greedy(loaded, n=12):
    prompt = build_chat(loaded.tokenizer, "Be brief.", "What is 2 + 3?")
    run = Run(loaded, make_policy("full"), prompt, DecodeSettings(max_new_tokens=n))
    return [i for event in run.generate() for i in event.token_ids]


@pytest.mark.slow  # writes GGUF files and converts them to float weights
def test_a_gguf_loads_as_the_float_model_it_was_written_from(home):
    """F32 in the file: the Llama's weights come back exactly (names, rotary permutation, tying)."""
    _, files, refs = home
    loaded = load_any(str(files["llama"]), "none", "cpu")
    assert loaded.name == str(files["llama"]) and loaded.geometry == refs["llama"].geometry
    assert torch.equal(_logits(loaded.model), _logits(refs["llama"].model))
    assert _greedy(loaded) == _greedy(refs["llama"])
    four_bit = load_any(str(files["llama"]), "4bit", "cpu", backend="torch-int4")  # the CPU 4-bit backend
    reference = tiny_model("llama", seed=3, quantization="4bit")
    assert four_bit.backend == "torch-int4"
    assert torch.equal(_logits(four_bit.model), _logits(reference.model))


@pytest.mark.slow  # writes GGUF files and converts them to float weights
def test_a_quantized_qwen3_gguf_generates_as_its_float_model_within_q8_tolerance(home):
    _, files, refs = home
    loaded = load_any(str(files["qwen3"]), "none", "cpu")
    assert loaded.geometry.kv_heads == 1 and loaded.geometry.q_heads == 2  # grouped-query attention kept
    got, want = _logits(loaded.model), _logits(refs["qwen3"].model)
    assert not torch.equal(got, want)  # Q8_0 really rounded the weights...
    assert (got - want).abs().max() <= 0.02 * want.abs().max()  # ...by Q8_0's half a step in 127
    assert _greedy(loaded) == _greedy(dataclasses.replace(refs["qwen3"], tokenizer=loaded.tokenizer))
    assert TargetModel.from_config("mine", loaded.model.config).bytes_per_token == 2 * 2 * 1 * 128 * 2


@pytest.mark.slow  # writes GGUF files and converts them to float weights
def test_a_gguf_model_evicts_and_replays_like_the_embedded_one(home):
    _, files, _ = home
    loaded = load_any(str(files["qwen3"]), "4bit", "cpu")
    prompt = build_chat(loaded.tokenizer, "Be brief.", "Count to twenty.")
    run = Run(
        loaded,
        make_policy("h2o", budget=16, recent=4, protect_system=False),
        prompt,
        DecodeSettings(max_new_tokens=24, stop_at_eos=False),
    )
    events = list(run.generate())
    assert any(event.evicted for event in events)
    trace = "<think>\nTwo and three.\n\nThat is five.\n</think>\n\nFive."
    prompt, ids = prepare_trace(loaded, "Be brief.", "What is 2 + 3?", trace)
    replay = LockstepReplay(loaded, [make_policy("window", budget=12, protect_system=False)], prompt, ids).run()
    assert len(replay.fidelity[0].positions) == len(ids)


@pytest.mark.slow  # writes GGUF files and converts them to float weights
def test_one_line_errors_for_a_truncated_file_an_unknown_architecture_and_not_a_gguf(home, tmp_path):
    _, files, _ = home
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(files["llama"].read_bytes()[:-1000])
    with pytest.raises(ModelLoadError, match="truncated") as caught:
        load_any(str(cut), "none", "cpu")
    assert "\n" not in str(caught.value)
    odd = gguf.GGUFWriter(tmp_path / "odd.gguf", "rwkv6")
    odd.add_tensor("token_embd.weight", torch.zeros(4, 32).numpy())
    odd.write_header_to_file(), odd.write_kv_data_to_file(), odd.write_tensors_to_file(), odd.close()
    with pytest.raises(ModelLoadError, match="architecture 'rwkv6' cannot be loaded; transformers reads GGUF .*llama"):
        load_any(str(tmp_path / "odd.gguf"), "none", "cpu")
    (tmp_path / "noise.gguf").write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(ModelLoadError, match="not a readable GGUF"):
        tokenizer_any(str(tmp_path / "noise.gguf"))
    assert main(["generate", "hi", "--model", str(cut)]) == 2


@pytest.mark.slow  # writes GGUF files and converts them to float weights
def test_ollama_and_lm_studio_names_resolve_in_their_stores(home, capsys):
    root, files, refs = home
    with pytest.raises(ModelLoadError, match="No Ollama model store"):
        resolve_store("ollama:tiny")
    with pytest.raises(ModelLoadError, match="No LM Studio models folder"):
        resolve_store("lmstudio:someone/tiny")
    ollama_store(root / ".ollama" / "models", files["qwen3"], "tiny-qwen3", "q8")
    lmstudio = root / ".lmstudio" / "models" / "someone" / "tiny-llama"
    lmstudio.mkdir(parents=True)
    (lmstudio / "tiny-llama-F32.gguf").write_bytes(files["llama"].read_bytes())
    (lmstudio / "mmproj-tiny.gguf").write_bytes(b"a vision projector, not a language model")

    assert resolve_store("lmstudio:someone/tiny-llama") == lmstudio / "tiny-llama-F32.gguf"
    with pytest.raises(ModelLoadError, match="Ollama has no model 'qwen3:0.6b'.*ollama:tiny-qwen3:q8"):
        resolve_store("ollama:qwen3:0.6b")
    blob = resolve_store("ollama:tiny-qwen3:q8")
    assert blob.parent.name == "blobs" and file_digest(blob) == file_digest(files["qwen3"])  # its converted cache
    loaded = load_any("ollama:tiny-qwen3:q8", "none", "cpu")
    assert loaded.name == "ollama:tiny-qwen3:q8"
    assert _greedy(loaded) == _greedy(dataclasses.replace(refs["qwen3"], tokenizer=loaded.tokenizer))
    assert tokenizer_any("lmstudio:someone/tiny-llama").name == "lmstudio:someone/tiny-llama"

    assert main(["models", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["name"], r["architecture"], r["quantization"]) for r in rows] == [
        ("ollama:tiny-qwen3:q8", "qwen3", "Q8_0"),
        ("lmstudio:someone/tiny-llama", "llama", "F32"),
    ]
    assert rows[0]["kv_bytes_per_token"] == 2 * 2 * 1 * 128 * 2 and rows[1]["kv_heads"] == 2
    assert main(["models"]) == 0
    assert "ollama:tiny-qwen3:q8" in capsys.readouterr().out
    generate = ["generate", "Hi", "--model", "ollama:tiny-qwen3:q8", "--quant", "none", "--device", "cpu"]
    assert main([*generate, "--max-new-tokens", "2", "--no-thinking"]) == 0
    assert "reasoning: Qwen3 template" in capsys.readouterr().err


def _with_template(template: str | None):
    tokenizer = copy.deepcopy(embedded_tokenizer())
    tokenizer.chat_template = template
    return tokenizer


def test_reasoning_rules_are_read_from_the_chat_template():
    assert reasoning_format(embedded_tokenizer()).rule == "prompted"
    assert reasoning_format(_with_template(R1_TEMPLATE)).rule == "r1"
    tagged = _with_template(None)  # no template, but <think> is one token of its vocabulary
    tagged.add_tokens(["<think>", "</think>"], special_tokens=True)
    assert reasoning_format(tagged).rule == "think-tags"
    qwen3 = _with_template(QWEN3_TEMPLATE)
    assert reasoning_format(qwen3).template_kwargs == {"enable_thinking": True}
    on = build_chat(qwen3, None, "Hi")
    assert on.text.endswith("<|im_start|>assistant\n<think>\n") and on.reasoning.rule == "qwen3"
    off = build_chat(qwen3, None, "Hi", reasoning=reasoning_format(qwen3, enable_thinking=False))
    assert off.text.endswith("<think>\n\n</think>\n\n") and off.assistant_prefix == ""
    r1 = build_chat(_with_template(R1_TEMPLATE), None, "Hi")
    assert r1.text.endswith("<|Assistant|><think>\n") and r1.text.count("<think>") == 1


def test_harmony_channels_are_think_and_answer_segments():
    tokenizer = _with_template(HARMONY_TEMPLATE)
    prompt = build_chat(tokenizer, None, "What is 2 + 3?")
    assert prompt.reasoning.rule == "harmony" and prompt.assistant_prefix == "<|channel|>analysis<|message|>"
    reply = "Two plus three.\n\nThat is five.<|end|><|start|>assistant<|channel|>final<|message|>Five."
    ids = tokenizer(reply, add_special_tokens=False)["input_ids"]
    trace = Trace("harmony", None, "What is 2 + 3?", prompt.assistant_prefix + reply)
    report = inspect_trace(tokenizer, 8192, trace)
    assert report["reasoning"]["rule"] == "harmony"
    assert len(report["think_blocks"]) == 1 and report["think_blocks"][0]["closed"]
    segmenter = Segmenter(prompt.roles, prompt.texts, tags=(prompt.reasoning.open, prompt.reasoning.close))
    segmenter.feed([tokenizer.decode([i]) for i in ids])
    kinds = {span.kind for span in segmenter.spans()}
    assert {"think", "step", "answer"} <= kinds
