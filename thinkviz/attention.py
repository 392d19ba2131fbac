"""Forward hooks that reduce attention weights to per-slot scores while they are produced.

Under ``attn_implementation="eager"`` every ``self_attn`` module returns
``(attn_output, attn_weights)`` with weights of shape ``(B, H, q, T)``: ``H`` query heads,
``q`` new tokens, ``T`` cached slots + ``q``.  A hook reduces them right away, so at no time
do all layers' full matrices exist together:

- ``received``  ``(L, H_kv, T)``   attention each slot received, summed over the ``q`` queries;
- ``tail``      ``(L, H_kv, r, T)`` the last ``r = min(q, tail_rows)`` query rows;
- ``row_entropy`` ``(q,)``        Shannon entropy (bits) of each new token's own attention
  row, averaged over layers and query heads (seed 001's "focus" of a token).

GQA: query heads are grouped ``H = H_kv * G``; a kv-head's score is the mean over its group.
Optionally the final hidden states ``(q, d)`` are captured from the model's last norm
(the DynTS predictor reads them).  When layers hold different numbers of slots (a ragged
cache), each layer's rows are padded with zeros on the right to the longest layer's ``T``, so
column ``t`` is physical slot ``t`` of every layer.

:class:`LayerMasks` gives each decoder layer its own attention mask for one forward pass (a
ragged cache's layers differ in length and in which slots are padding).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

_LN2 = math.log(2.0)


@dataclass
class ForwardScores:
    """Reduced attention of one forward pass (shapes in the module docstring)."""

    received: torch.Tensor
    tail: torch.Tensor
    row_entropy: torch.Tensor
    hidden: torch.Tensor | None


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The ``self_attn`` module of every decoder layer, in order."""
    layers = model.model.layers
    return [layer.self_attn for layer in layers]


class AttentionCapture:
    """Context manager installing the reducing hooks on a causal LM.

    ``kv_heads``: number of key/value heads; ``tail_rows``: how many of the latest query rows to
    keep per forward (the widest observation window any policy asked for).
    """

    def __init__(self, model: nn.Module, kv_heads: int, tail_rows: int = 1, capture_hidden: bool = False):
        self.model = model
        self.kv_heads = kv_heads
        self.tail_rows = max(1, tail_rows)
        self.capture_hidden = capture_hidden
        self.enabled = True
        self._handles: list = []
        self._reset()

    def _reset(self) -> None:
        self._received: list[torch.Tensor] = []
        self._tail: list[torch.Tensor] = []
        self._entropy_sum: torch.Tensor | None = None
        self._hidden: torch.Tensor | None = None

    def __enter__(self) -> AttentionCapture:
        for module in attention_modules(self.model):
            self._handles.append(module.register_forward_hook(self._on_attention, with_kwargs=True))
        if self.capture_hidden:
            self._handles.append(self.model.model.norm.register_forward_hook(self._on_hidden))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _on_attention(self, module, args, kwargs, output) -> None:
        if not self.enabled:
            return
        weights = output[1]
        if weights is None:
            raise RuntimeError("attention weights are missing: load the model with attn_implementation='eager'")
        weights = weights[0].float()  # (H, q, T)
        heads, q, total = weights.shape
        grouped = weights.view(self.kv_heads, heads // self.kv_heads, q, total).mean(1)  # (H_kv, q, T)
        self._received.append(grouped.sum(1))
        self._tail.append(grouped[:, -self.tail_rows :, :].clone())
        entropy = torch.special.entr(weights).sum(-1).mean(0) / _LN2  # (q,) bits
        self._entropy_sum = entropy if self._entropy_sum is None else self._entropy_sum + entropy

    def _on_hidden(self, module, args, output) -> None:
        if self.enabled:
            self._hidden = output[0].detach().float()  # (q, d)

    def take(self) -> ForwardScores:
        """Return the reductions of the last forward pass and clear the buffers."""
        if not self._received:
            raise RuntimeError("no attention was captured (capture disabled or no forward pass)")
        scores = ForwardScores(
            received=_stack_padded(self._received),
            tail=_stack_padded(self._tail),
            row_entropy=self._entropy_sum / len(self._received),
            hidden=self._hidden,
        )
        self._reset()
        return scores


def _stack_padded(rows: list[torch.Tensor]) -> torch.Tensor:
    """Stack per-layer tensors ``(..., T_l)`` into ``(L, ..., max T_l)``, zeros on the right."""
    width = max(row.shape[-1] for row in rows)
    return torch.stack([F.pad(row, (0, width - row.shape[-1])) for row in rows])


@contextlib.contextmanager
def attention_implementation(model: nn.Module, name: str):
    """Run ``model`` with the attention kernel ``name`` (``"eager"`` or ``"sdpa"``) inside the block,
    then restore its own.  Only eager returns attention weights; SDPA's fused kernel is faster.
    The caller holds the model's forward lock, so no other run sees the switch."""
    own = model.config._attn_implementation
    if name == own:
        yield
        return
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(own)


class LayerMasks:
    """Context manager: while installed, decoder layer ``l``'s attention gets ``masks[l]`` (a 4-D
    additive mask ``(1, H or 1, q, T_l + q)``) instead of the one the model passes to all layers."""

    def __init__(self, model: nn.Module, masks: list[torch.Tensor]) -> None:
        self.modules = attention_modules(model)
        if len(masks) != len(self.modules):
            raise ValueError(f"{len(masks)} masks for {len(self.modules)} layers")
        self.masks = masks
        self._handles: list = []

    def __enter__(self) -> LayerMasks:
        for module, mask in zip(self.modules, self.masks):
            self._handles.append(module.register_forward_pre_hook(_mask_swapper(mask), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _mask_swapper(mask: torch.Tensor):
    def hook(module, args, kwargs):
        kwargs["attention_mask"] = mask
        return args, kwargs

    return hook
