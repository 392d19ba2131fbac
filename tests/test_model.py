"""Model loading: the embedded SmolLM2 (4-bit, cached conversion), tiny models, clear errors."""

import time
from concurrent.futures import ThreadPoolExecutor

import bitsandbytes as bnb
import gguf
import huggingface_hub.constants
import pytest
import torch
import transformers

from thinkviz.models import loading as tvmodel
from thinkviz.models.loading import (
    EMBEDDED,
    QUANTIZATIONS,
    ModelLoadError,
    cache_dir,
    converted_folder,
    embedded_tokenizer,
    load_model,
    load_tokenizer,
)
from tiny_models import tiny_model

PROMPT = [{"role": "user", "content": "What is 2+2?"}]


def _greedy(loaded, messages, new_tokens):
    """Greedy continuation of a chat, decoded."""
    inputs = loaded.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    ).to(loaded.device)
    with torch.no_grad():
        out = loaded.model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False)
    return loaded.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


@pytest.mark.integration
def test_embedded_model_is_4bit_smollm2(embedded_loads):
    loaded = embedded_loads("4bit", None, "bitsandbytes")
    linears = [m for m in loaded.model.modules() if isinstance(m, torch.nn.Linear)]
    assert sum(isinstance(m, bnb.nn.Linear4bit) for m in linears) == 30 * 7  # q k v o gate up down
    assert loaded.name == "SmolLM2-135M-Instruct (embedded)"
    assert loaded.quantization == "4bit" and loaded.backend == "bitsandbytes"
    assert loaded.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert loaded.model.config._attn_implementation == "eager"
    assert not loaded.model.training
    g = loaded.geometry
    assert (g.layers, g.q_heads, g.kv_heads, g.head_dim, g.max_context) == (30, 9, 3, 64, 8192)
    assert g.dtype_bytes == loaded.model.get_input_embeddings().weight.element_size()
    assert g.bytes_per_token == 2 * 30 * 3 * 64 * g.dtype_bytes
    # 135M parameters: a float32 copy is 538 MB; NF4 linears + float embeddings are far less.
    assert 50e6 < loaded.weights_bytes < 200e6


@pytest.mark.integration
def test_auto_backend_on_this_machine(embedded_model):
    """``auto`` picks torch-int4 on an AVX512 CPU and bitsandbytes elsewhere (and on CUDA)."""
    fast = embedded_model.device.type == "cpu" and tvmodel.cpu_int4.fast_here()
    assert embedded_model.backend == ("torch-int4" if fast else "bitsandbytes")


@pytest.mark.integration
def test_embedded_model_answers_greedily(embedded_model):
    # 12 tokens: NF4 answers "2 + 2 = 4"; torch-int4, like the float model, first says
    # "The answer to this classic math problem is 4."
    answer = _greedy(embedded_model, PROMPT, 12)
    assert "4" in answer  # real weights, not noise
    assert _greedy(embedded_model, PROMPT, 12) == answer


@pytest.mark.integration
def test_embedded_model_exposes_eager_attention_weights(embedded_model):
    captured = []
    attn = embedded_model.model.model.layers[0].self_attn
    handle = attn.register_forward_hook(lambda mod, args, kwargs, out: captured.append(out[1]), with_kwargs=True)
    try:
        with torch.no_grad():
            embedded_model.model(torch.tensor([[1, 2, 3, 4, 5]], device=embedded_model.device))
    finally:
        handle.remove()
    assert captured[0].shape == (1, 9, 5, 5)  # (B, H, q, T)


@pytest.mark.integration
def test_embedded_model_runs_in_8bit(embedded_model):  # embedded_model: the conversion is cached
    loaded = load_model(EMBEDDED, "8bit")
    assert sum(isinstance(m, bnb.nn.Linear8bitLt) for m in loaded.model.modules()) == 30 * 7
    assert loaded.geometry.dtype_bytes == 2  # LLM.int8 computes in float16
    assert "4" in _greedy(loaded, PROMPT, 12)


def _gguf_parses(monkeypatch) -> list[str]:
    """The files each ``gguf.GGUFReader`` built from now on parses (transformers builds them)."""
    parses, build = [], gguf.GGUFReader

    def counted(path, mode="r"):
        parses.append(str(path))
        return build(path, mode)

    monkeypatch.setattr(gguf, "GGUFReader", counted)
    return parses


@pytest.mark.integration
def test_conversion_happens_once_and_is_then_read_from_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("THINKVIZ_CACHE", str(tmp_path))
    first, second = [], []
    parses = _gguf_parses(monkeypatch)
    load_model(EMBEDDED, "none", "cpu", progress=lambda f, m: first.append((f, m)))
    assert parses == [str(tvmodel.embedded_gguf_path())]  # config, weights and tokenizer from one parse
    folder = cache_dir() / "smollm2-135m-instruct"
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert [p.name for p in tmp_path.iterdir() if p.suffix != ".lock"] == [folder.name]  # no staging folder left

    loaded = load_model(EMBEDDED, "none", "cpu", progress=lambda f, m: second.append((f, m)))
    assert any("Converting" in m for _, m in first)
    assert not any("Converting" in m for _, m in second)
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp and len(parses) == 1
    fractions = [f for f, _ in second]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert loaded.quantization == "none" and loaded.geometry.dtype_bytes == 4


def test_failed_conversion_leaves_no_cache(tmp_path, monkeypatch):
    class HalfWritten:
        def save_pretrained(self, folder):
            (folder / "model.safetensors").write_bytes(b"partial")
            raise RuntimeError("disk full\nmore detail")

    monkeypatch.setenv("THINKVIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(tvmodel.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: HalfWritten())
    with pytest.raises(ModelLoadError, match="disk full") as caught:
        load_model(EMBEDDED, "none", "cpu")
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert [p.name for p in tmp_path.iterdir() if p.suffix != ".lock"] == []


def test_processes_converting_the_same_model_at_once_take_turns(tmp_path, monkeypatch):
    """Two loads of one model at once (threads here; an app and a test worker in practice): one converts,
    the other waits on the lock beside the folder and reads what the first wrote."""
    writes = []

    class Converted:
        def save_pretrained(self, folder):
            writes.append(folder)
            time.sleep(0.3)  # a conversion that takes a while: the other load arrives meanwhile
            (folder / "model.safetensors").write_bytes(b"weights")

    class Tokenizer:
        def save_pretrained(self, folder):
            (folder / "tokenizer.json").write_text("{}")

    monkeypatch.setenv("THINKVIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(tvmodel.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: Converted())
    monkeypatch.setattr(tvmodel.AutoTokenizer, "from_pretrained", lambda *a, **k: Tokenizer())
    gguf = tvmodel.embedded_gguf_path()
    with ThreadPoolExecutor(2) as pool:
        folders = list(pool.map(lambda _: converted_folder(gguf, "same", lambda f, m: None), range(2)))
    assert folders == [tmp_path / "same"] * 2 and len(writes) == 1
    assert (tmp_path / "same" / "model.safetensors").read_bytes() == b"weights"


@pytest.mark.slow  # reads the GGUF's 49k-entry vocabulary three times, seconds each
def test_the_embedded_tokenizer_is_read_from_the_gguf_once_then_from_its_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("THINKVIZ_TOKENIZER", raising=False)
    monkeypatch.setenv("THINKVIZ_CACHE", str(tmp_path / "cache"))
    parses = _gguf_parses(monkeypatch)
    first = load_tokenizer(EMBEDDED)
    assert len(parses) == 1  # the tokenizer's config and the model's from one parse
    folder = tmp_path / "cache" / "smollm2-135m-instruct-tokenizer"
    assert [p.name for p in folder.parent.iterdir() if p.suffix != ".lock"] == [folder.name]  # no staging left
    stamp = (folder / "tokenizer.json").stat().st_mtime_ns
    assert load_tokenizer(EMBEDDED).max_context == first.max_context == 8192
    assert (folder / "tokenizer.json").stat().st_mtime_ns == stamp

    # a cache that cannot be written: the tokenizer comes straight from the GGUF, and is the same
    (tmp_path / "a file").write_text("")
    monkeypatch.setenv("THINKVIZ_CACHE", str(tmp_path / "a file"))
    embedded_tokenizer.cache_clear()
    try:
        from_gguf = embedded_tokenizer()
    finally:
        embedded_tokenizer.cache_clear()
    read_back = transformers.AutoTokenizer.from_pretrained(folder)
    text = from_gguf.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True) + "<think>\n2+2"
    assert read_back(text)["input_ids"] == from_gguf(text)["input_ids"]
    assert read_back.chat_template == from_gguf.chat_template and len(read_back) == len(from_gguf)


def test_damaged_cache_says_how_to_recover(tmp_path, monkeypatch):
    monkeypatch.setenv("THINKVIZ_CACHE", str(tmp_path))
    (tmp_path / "smollm2-135m-instruct").mkdir()
    (tmp_path / "smollm2-135m-instruct" / "config.json").write_text("{not json")
    assert "delete the folder" in str(_one_line_error(EMBEDDED, "none", "cpu"))


def test_a_damaged_tokenizer_cache_says_how_to_recover(tmp_path, monkeypatch):
    monkeypatch.delenv("THINKVIZ_TOKENIZER", raising=False)
    monkeypatch.setenv("THINKVIZ_CACHE", str(tmp_path))
    folder = tmp_path / "smollm2-135m-instruct-tokenizer"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{not json")
    (folder / "config.json").write_text("{not json")
    embedded_tokenizer.cache_clear()
    try:
        with pytest.raises(ModelLoadError, match="delete its smollm2-135m-instruct\\* folders") as caught:
            load_tokenizer(EMBEDDED)
    finally:
        embedded_tokenizer.cache_clear()
    assert "\n" not in str(caught.value) and str(tmp_path) in str(caught.value)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tiny_model(arch):
    loaded = tiny_model(arch, layers=3, hidden=96, q_heads=6, kv_heads=2)
    assert type(loaded.model).__name__ == {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]
    assert loaded.model.config._attn_implementation == "eager" and not loaded.model.training
    assert (loaded.quantization, loaded.device) == ("none", torch.device("cpu"))
    g = loaded.geometry
    assert (g.layers, g.q_heads, g.kv_heads, g.head_dim, g.dtype_bytes) == (3, 6, 2, 16, 4)
    assert loaded.model.config.vocab_size == len(loaded.tokenizer)
    assert loaded.weights_bytes == sum(p.nbytes for p in loaded.model.parameters()) + sum(
        b.nbytes for b in loaded.model.buffers()
    )
    ids = loaded.tokenizer("Hello there", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = loaded.model(ids, output_attentions=True)
    assert out.logits.shape == (1, ids.shape[1], len(loaded.tokenizer))
    assert out.attentions[0].shape == (1, 6, ids.shape[1], ids.shape[1])


def test_tiny_model_is_seeded_and_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    a, b, c = tiny_model(seed=1), tiny_model(seed=1), tiny_model(seed=2)
    assert torch.equal(torch.random.get_rng_state(), state)
    weight = lambda m: m.model.model.layers[0].self_attn.q_proj.weight  # noqa: E731
    assert torch.equal(weight(a), weight(b))
    assert not torch.equal(weight(a), weight(c))
    assert tiny_model(dtype=torch.bfloat16).geometry.dtype_bytes == 2


def test_tiny_model_rejects_unknown_arch():
    with pytest.raises(ValueError, match="arch"):
        tiny_model("gpt2")


def _one_line_error(*args, **kwargs) -> ModelLoadError:
    with pytest.raises(ModelLoadError) as caught:
        load_model(*args, **kwargs)
    message = str(caught.value)
    assert message and "\n" not in message
    return caught.value


def test_unknown_quantization_is_refused():
    error = _one_line_error(EMBEDDED, "3bit")
    assert "3bit" in str(error) and all(q in str(error) for q in QUANTIZATIONS)


def test_missing_local_folder_is_reported():
    assert "not found: /no/such/model" in str(_one_line_error("/no/such/model", "none"))
    assert "not found" in str(_one_line_error("./no-such-model", "none"))


def test_folder_without_a_model_is_reported(tmp_path):
    error = _one_line_error(str(tmp_path), "none")
    assert str(tmp_path) in str(error) and error.__cause__ is not None


def test_unreachable_hub_model_is_reported(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # fail fast, no retries
    error = _one_line_error("nobody-xyz/no-such-model-123", "none")
    assert "nobody-xyz/no-such-model-123" in str(error) and error.__cause__ is not None


def test_empty_name_is_refused():
    assert "No model given" in str(_one_line_error("  ", "none"))


def test_invalid_hub_name_is_reported():
    assert "not a valid name!" in str(_one_line_error("not a valid name!", "none"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_reported():
    assert "CUDA" in str(_one_line_error(EMBEDDED, "4bit", "cuda"))
