"""Forward hooks that reduce attention weights to per-slot scores while they are produced.

Under ``attn_implementation="eager"`` every ``self_attn`` module returns
``(attn_output, attn_weights)`` with weights of shape ``(B, H, q, T)``: ``H`` query heads,
``q`` new tokens, ``T`` cached slots + ``q``.  The hooks hold them until they pass
:data:`BATCH_BYTES`, then reduce what they hold together (a decode step's weights of every
layer at once), so the full matrices of all layers of a long forward never exist together:

- ``received``  ``(L, H_kv, T)``   attention each slot received, summed over the ``q`` queries;
- ``tail``      ``(L, H_kv, r, T)`` the last ``r = min(q, tail_rows)`` query rows;
- ``row_entropy`` ``(q,)``        Shannon entropy (bits) of each new token's own attention
  row, averaged over layers and query heads (the "focus" of a token that semantic KV-eviction,
  the ``entropy`` policy, reads).

GQA: query heads are grouped ``H = H_kv * G``; a kv-head's score is the mean over its group.
Optionally the hidden states ``(q, k, d)`` of ``k`` chosen layers are captured (the DynTS
predictor reads them), indexed as transformers' ``hidden_states``: ``0`` the input of the first
decoder layer (the embeddings), ``i`` the output of decoder layer ``i - 1``, the last (``-1``)
the final norm's output.  When layers hold different numbers of slots (a ragged
cache), each layer's rows are padded with zeros on the right to the longest layer's ``T``, so
column ``t`` is physical slot ``t`` of every layer.

:class:`LayerArguments` gives each decoder layer's attention its own keyword arguments for one
forward pass: its own mask (a ragged cache's layers differ in length and in which slots are
padding), and for :func:`biased_attention` its slots' biases and a sink for its queries.

**Biased attention.**  :func:`biased_attention`, registered in transformers'
``AttentionInterface`` as :data:`BIASED_ATTENTION`, is eager attention plus an additive bias per
(kv-head, cached slot) — the log-mass ``β`` attention matching fits (``policies/matching.py``)
— added to the logits before the softmax, so the weights the hooks capture are the biased
ones.  With ``query_sink`` it also hands every layer's queries (RoPE applied, multiplied by the
attention scale) to :meth:`AttentionCapture.keep_queries`, the reference queries of the fit.
Only policies that fit biases run it; every other run keeps the model's own kernel.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import weakref
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface

_LN2 = math.log(2.0)
# The hooks hold up to this many bytes of attention weights and reduce them together, batched
# over consecutive layers: a decode step's weights (30 layers × 9 heads × 1 row × T floats) are
# reduced once after the forward, about ten operator calls instead of nine per layer.  Larger
# ones (prefill chunks, replays at long context) are reduced as soon as they pass the bound, so
# the full matrices of all layers never exist together.
BATCH_BYTES = 8 * 2**20
BIASED_ATTENTION = "thinkviz_biased"


@dataclass
class ForwardScores:
    """Reduced attention of one forward pass (shapes in the module docstring)."""

    received: torch.Tensor
    tail: torch.Tensor
    row_entropy: torch.Tensor
    hidden: torch.Tensor | None  # (q, k, d) the hidden states of the capture's ``hidden_layers``
    queries: torch.Tensor | None = None  # (L, H, r, D) the last r = min(q, query_rows) queries, scaled


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The ``self_attn`` module of every decoder layer, in order."""
    layers = model.model.layers
    return [layer.self_attn for layer in layers]


class AttentionCapture:
    """Context manager installing the reducing hooks on a causal LM.

    ``kv_heads``: number of key/value heads; ``tail_rows``: how many of the latest query rows to
    keep per forward (the widest observation window any policy asked for); ``query_rows``: how
    many of the latest queries :meth:`keep_queries` keeps per layer (when the run's attention is
    :func:`biased_attention` with this capture's sink); ``hidden_layers``: which hidden states to
    capture (module docstring; ``()``: none); ``enabled``: when ``False`` the context
    installs no hooks (a run that needs no weights captures nothing).
    """

    def __init__(
        self,
        model: nn.Module,
        kv_heads: int,
        tail_rows: int = 1,
        hidden_layers: Sequence[int] = (),
        query_rows: int = 0,
    ):
        self.model = model
        self.modules = attention_modules(model)
        self.kv_heads = kv_heads
        self.tail_rows = max(1, tail_rows)
        depth = len(self.modules)
        if any(not -depth - 1 <= i <= depth for i in hidden_layers):
            raise ValueError(f"hidden-state layers must lie in -{depth + 1} .. {depth}, got {tuple(hidden_layers)}")
        self.hidden_layers = tuple(i % (depth + 1) for i in hidden_layers)
        self.query_rows = query_rows
        self.enabled = True
        self.row: int | None = None  # in a batched forward: this run's batch row (see :meth:`in_batch`)
        self.widths: Sequence[int] = ()  # and each layer's key width for this row, ``T_l + q``
        self._handles: list = []
        self._reset()

    def in_batch(self, row: int | None, widths: Sequence[int] = ()) -> None:
        """Take batch row ``row`` of the next forwards' outputs, each layer's attention weights cut to
        ``widths[l]`` columns (the row's own slots and new tokens; the rest is other rows' padding);
        ``None``: a forward of this run alone."""
        self.row, self.widths = row, widths

    def _reset(self) -> None:
        self._pending: list[torch.Tensor] = []  # (1, H, q, T) weights of consecutive layers, not reduced yet
        self._pending_bytes = 0
        self._received: list[torch.Tensor] = []  # blocks (N, H_kv, T) of consecutive layers
        self._tail: list[torch.Tensor] = []  # blocks (N, H_kv, r, T)
        self._entropy_sum: torch.Tensor | None = None  # (q,) bits, summed over layers
        self._hidden: dict[int, torch.Tensor] = {}  # hidden-state index -> (q, d)
        self._queries: list[torch.Tensor] = []

    def __enter__(self) -> AttentionCapture:
        if not self.enabled:  # nothing to capture: no hooks at all
            return self
        for layer, module in enumerate(self.modules):
            hook = functools.partial(self._on_attention, layer)
            self._handles.append(module.register_forward_hook(hook, with_kwargs=True))
        layers = self.model.model.layers
        for index in set(self.hidden_layers):
            if index == 0:  # the input of the first decoder layer
                hook = functools.partial(self._on_input, index)
                self._handles.append(layers[0].register_forward_pre_hook(hook, with_kwargs=True))
            else:  # the output of decoder layer index - 1, the final norm's for the last index
                module = layers[index - 1] if index < len(layers) else self.model.model.norm
                self._handles.append(module.register_forward_hook(functools.partial(self._on_output, index)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _on_attention(self, layer: int, module, args, kwargs, output) -> None:
        weights = output[1]
        if weights is None:
            raise RuntimeError("attention weights are missing: load the model with attn_implementation='eager'")
        if self.row is not None:
            weights = weights[self.row : self.row + 1, :, :, : self.widths[layer]]
        weights = weights.float()  # (1, H, q, T)
        self._pending.append(weights)
        self._pending_bytes += weights.numel() * weights.element_size()
        if self._pending_bytes > BATCH_BYTES:
            self._reduce_pending()

    def _reduce(self, weights: torch.Tensor) -> None:
        """Reduce the ``(N, H, q, T)`` attention of ``N`` consecutive layers into the buffers."""
        layers, heads, q, total = weights.shape
        grouped = weights.view(layers, self.kv_heads, heads // self.kv_heads, q, total).mean(2)  # (N, H_kv, q, T)
        tail = grouped[:, :, -self.tail_rows :, :]
        self._received.append(grouped.sum(2))
        self._tail.append(tail if self.tail_rows >= q else tail.clone())  # keep no view of all q rows
        entropy = torch.special.entr(weights).sum(-1).mean(1).sum(0) / _LN2  # (q,) bits, summed over layers
        self._entropy_sum = entropy if self._entropy_sum is None else self._entropy_sum + entropy

    def _reduce_pending(self) -> None:
        """Reduce the held weights: one batched reduction per run of layers of the same shape (the
        layers of a ragged cache differ in ``T``)."""
        start = 0
        while start < len(self._pending):
            shape = self._pending[start].shape
            end = start + 1
            while end < len(self._pending) and self._pending[end].shape == shape:
                end += 1
            block = self._pending[start:end]
            self._reduce(block[0] if len(block) == 1 else torch.cat(block))
            start = end
        self._pending, self._pending_bytes = [], 0

    def keep_queries(self, layer_idx: int, queries: torch.Tensor) -> None:
        """Sink for :func:`biased_attention`: keep the last ``query_rows`` of one layer's scaled
        queries ``(B, H, q, D)`` (layers arrive in order)."""
        if self.enabled and self.query_rows:
            if layer_idx != len(self._queries):
                raise RuntimeError(f"queries of layer {layer_idx} arrived after {len(self._queries)} layers")
            row = queries[0 if self.row is None else self.row]
            self._queries.append(row[:, -self.query_rows :, :].detach().float().clone())

    def _on_input(self, index: int, module, args, kwargs) -> None:
        self._keep_hidden(index, args[0] if args else kwargs["hidden_states"])

    def _on_output(self, index: int, module, args, output) -> None:
        self._keep_hidden(index, output[0] if isinstance(output, tuple) else output)

    def _keep_hidden(self, index: int, states: torch.Tensor) -> None:
        self._hidden[index] = states[self.row or 0].detach().float()  # (B, q, d) -> (q, d)

    def take(self) -> ForwardScores:
        """Return the reductions of the last forward pass and clear the buffers."""
        self._reduce_pending()
        if not self._received:
            raise RuntimeError("no attention was captured (capture disabled or no forward pass)")
        received = _stack_padded(self._received)
        scores = ForwardScores(
            received=received,
            tail=_stack_padded(self._tail),
            row_entropy=self._entropy_sum / received.shape[0],
            hidden=torch.stack([self._hidden[i] for i in self.hidden_layers], dim=1) if self.hidden_layers else None,
            queries=torch.stack(self._queries) if self._queries else None,
        )
        self._reset()
        return scores


def _stack_padded(blocks: list[torch.Tensor]) -> torch.Tensor:
    """Join blocks ``(N_i, ..., T_i)`` of consecutive layers into ``(L, ..., max T_i)``, zeros on the right."""
    width = max(block.shape[-1] for block in blocks)
    if all(block.shape[-1] == width for block in blocks):
        return blocks[0] if len(blocks) == 1 else torch.cat(blocks)
    return torch.cat([F.pad(block, (0, width - block.shape[-1])) for block in blocks])


_MODEL_LOCKS: weakref.WeakKeyDictionary[torch.nn.Module, threading.Lock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def model_lock(model: torch.nn.Module) -> threading.Lock:
    """The lock serialising forward passes on ``model``.

    Attention hooks are installed on the shared model for the duration of one forward, so
    two runs (two browser sessions, or Compare columns in threads) must never overlap there.
    """
    with _LOCKS_GUARD:
        lock = _MODEL_LOCKS.get(model)
        if lock is None:
            lock = _MODEL_LOCKS[model] = threading.Lock()
        return lock


# model -> {kernel name: [(config, the value set_attn_implementation gave it), ...]}
_KERNEL_SETTINGS: weakref.WeakKeyDictionary[nn.Module, dict[str, list[tuple[Any, Any]]]] = weakref.WeakKeyDictionary()


def _kernel_configs(model: nn.Module) -> list[Any]:
    """Every distinct config of ``model`` and its sub-models whose ``_attn_implementation`` the
    attention modules read (transformers keeps it in ``_attn_implementation_internal``)."""
    found: dict[int, Any] = {}
    pending = [module.config for module in model.modules() if hasattr(module, "config")]
    while pending:
        config = pending.pop()
        if id(config) in found or not hasattr(config, "_attn_implementation_internal"):
            continue
        found[id(config)] = config
        subs = (getattr(config, key, None) for key in getattr(config, "sub_configs", {}))
        pending.extend(sub for sub in subs if sub is not None)
    return list(found.values())


def _kernel_settings(model: nn.Module, name: str) -> list[tuple[Any, Any]]:
    """What ``model.set_attn_implementation(name)`` writes into the model's configs, found once (it
    validates the kernel, about 0.2 ms) and replayed afterwards (a few attribute writes)."""
    known = _KERNEL_SETTINGS.setdefault(model, {})
    if name not in known:
        configs = _kernel_configs(model)
        own = _current_settings(configs)
        model.set_attn_implementation(name)
        known[name] = _current_settings(configs)
        _apply(own)
    return known[name]


def _current_settings(configs: list[Any]) -> list[tuple[Any, Any]]:
    return [(config, config._attn_implementation_internal) for config in configs]


def _apply(settings: list[tuple[Any, Any]]) -> None:
    for config, value in settings:
        config._attn_implementation_internal = value


@contextlib.contextmanager
def attention_implementation(model: nn.Module, name: str):
    """Run ``model`` with the attention kernel ``name`` (``"eager"``, ``"sdpa"`` or a registered
    one) inside the block, then restore its own.  Only eager returns attention weights; SDPA's
    fused kernel is faster.  The first switch of a model to ``name`` goes through
    ``set_attn_implementation`` (which checks the kernel); later ones write the same config values
    directly, since the engine switches around every forward.  The caller holds the model's
    forward lock, so no other run sees the switch."""
    if name == model.config._attn_implementation:
        yield
        return
    settings = _kernel_settings(model, name)
    own = _current_settings([config for config, _ in settings])
    _apply(settings)
    try:
        yield
    finally:
        _apply(own)


class LayerArguments:
    """Context manager: while installed, decoder layer ``l``'s attention module is called with the
    keyword arguments ``arguments[l]`` added (replacing the model's own of the same name), e.g.
    ``attention_mask`` a 4-D additive mask ``(1, H or 1, q, T_l + q)`` instead of the one the
    model passes to all layers, or :func:`biased_attention`'s ``slot_bias`` and ``query_sink``."""

    def __init__(self, model: nn.Module, arguments: list[dict[str, Any]]) -> None:
        self.modules = attention_modules(model)
        if len(arguments) != len(self.modules):
            raise ValueError(f"{len(arguments)} argument sets for {len(self.modules)} layers")
        self.arguments = arguments
        self._handles: list = []

    def __enter__(self) -> LayerArguments:
        for module, extra in zip(self.modules, self.arguments):
            if extra:
                self._handles.append(module.register_forward_pre_hook(_adder(extra), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _adder(extra: dict[str, Any]):
    def hook(module, args, kwargs):
        kwargs.update(extra)
        return args, kwargs

    return hook


def biased_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    slot_bias: torch.Tensor | None = None,
    query_sink: Callable[[int, torch.Tensor], None] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention with an additive bias per (kv-head, cached slot).

    ``query`` ``(B, H, q, D)``, ``key`` / ``value`` ``(B, H_kv, T + q, D)`` (the cache's ``T`` slots,
    then the ``q`` new tokens), ``attention_mask`` additive ``(B, 1 or H, q, T + q)``;
    ``slot_bias`` ``(H_kv, T)`` is added to the logits of the cached slots of every query head of
    a kv group (the new tokens get none); ``(B, H_kv, S)`` (a batched forward) gives every batch row
    its own, added to the first ``S`` key columns.  Returns ``(output (B, q, H, D), weights (B, H, q, T + q))``
    as transformers' eager attention does, and computes exactly what it computes when
    ``slot_bias`` is ``None``.  ``query_sink(layer_idx, query · scaling)`` sees the queries first.
    """
    if query_sink is not None:
        query_sink(module.layer_idx, query * scaling)
    groups = module.num_key_value_groups
    keys = key.repeat_interleave(groups, dim=1)  # (B, H, T + q, D), query head h reads kv-head h // G
    values = value.repeat_interleave(groups, dim=1)
    logits = torch.matmul(query, keys.transpose(2, 3)) * scaling
    if attention_mask is not None:
        logits = logits + attention_mask[:, :, :, : keys.shape[-2]]
    if slot_bias is not None:
        cached = slot_bias.shape[-1]
        bias = slot_bias.to(logits.dtype).repeat_interleave(groups, dim=-2)  # (H, T) or (B, H, S)
        bias = bias[None, :, None, :] if bias.dim() == 2 else bias[:, :, None, :]
        logits = torch.cat([logits[..., :cached] + bias, logits[..., cached:]], dim=-1)
    weights = F.softmax(logits, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, values).transpose(1, 2).contiguous()
    return output, weights


def causal_mask(cached: int, new: int, dtype: torch.dtype, device, hidden: torch.Tensor | None = None) -> torch.Tensor:
    """Additive mask ``(1, H, new, cached + new)``: cached slots visible, new tokens causal.

    ``hidden`` ``(H, cached)`` bool optionally hides cached slots from the new queries (per
    head, ``H`` may be 1); this is the reference the eviction oracle compares against.
    """
    if hidden is None:  # no bool mask to build: zeros, and the new tokens' upper triangle blocked
        mask = torch.zeros(1, 1, new, cached + new, dtype=dtype, device=device)
        if new > 1:
            mask[0, 0, :, cached:] = torch.full((new, new), torch.finfo(dtype).min, dtype=dtype, device=device).triu(1)
        return mask
    blocked = torch.ones(new, new, dtype=torch.bool, device=device).triu(1)
    visible_past = torch.zeros(new, cached, dtype=torch.bool, device=device)
    mask = torch.cat([visible_past, blocked], dim=-1)[None, None]  # (1, 1, q, T + q)
    hide = hidden.to(device)[:, None, :].expand(-1, new, -1)  # (H, q, T)
    mask = mask.repeat(1, hidden.shape[0], 1, 1)
    mask[0, :, :, :cached] |= hide
    return torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(mask, torch.finfo(dtype).min)


AttentionInterface.register(BIASED_ATTENTION, biased_attention)
