"""One forward pass for several runs: each run a row of the batch, with its own cache.

Runs on the same model that step together (Compare's columns, a policy and its full-cache
reference, a sweep group) differ only in their caches: each keeps its own slots, in its own KV
format, ragged or dense, with or without attention biases.  :func:`forward_rows` runs their next
tokens as the rows of one forward pass, so the weights are read once for all of them.

**Layout.**  Layer ``l`` of row ``i`` holds ``T_il`` slots.  The batch's keys and values for that
layer are ``(N, H_kv, W_l, D)``, ``W_l = max_i T_il + q``: row ``i``'s slots first, its ``q`` new
tokens right after them (columns ``T_il .. T_il + q - 1``), then padding.  The additive mask
``(N, 1 or H, q, W_l)`` lets new token ``j`` of row ``i`` see column ``c`` when ``c - T_il <= j``,
and hides a ragged row's padded heads as its own mask does (:func:`row_masks`).  Row ``i``'s
attention weights are then columns ``0 .. T_il + q - 1`` of its batch row, exactly the layout it
has alone, so each run's :class:`~thinkviz.core.attention.AttentionCapture` takes its own
(:meth:`~thinkviz.core.attention.AttentionCapture.in_batch`).

**Storage.**  :class:`KVRows` keeps one buffer per layer, ``(N, H_kv, capacity, D)``, for the whole
batch and across steps.  Each row's store (full precision, :class:`~thinkviz.core.cache.DenseStore`;
quantized formats run alone, :mod:`thinkviz.core.together` says why) *is* a view into it: the
new tokens are written after its slots in place, so a decode step copies nothing old; after an
eviction (its store gathered into a new tensor) the row is copied in once.  Masked columns hold
finite stale values and get exactly zero weight.

Everything else (positions, statistics, compression, events) stays per run: the engine's own
methods book each row's forward (``Run._after_forward``).  The kernel is the one every row can
share: :data:`~thinkviz.core.attention.BIASED_ATTENTION` when any row fits biases (the others
get a zero bias, which adds exactly nothing), else eager when any row needs weights, else SDPA.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from .attention import BIASED_ATTENTION, LayerArguments, attention_implementation, model_lock
from .cache import DenseStore, EvictingCache

if TYPE_CHECKING:
    from .engine import Run

HEADROOM = 256  # slots a layer's buffer grows by beyond what a forward needs (fewer reallocations)


class KVRows:
    """Per layer, the batch's keys and values ``(N, H_kv, capacity, D)`` (module docstring), and
    which rows' stores are views of them."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self._buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._views: dict[int, list[tuple | None]] = {}  # per layer and row: the store's (keys, values) views

    def buffers(self, layer: int, like: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's buffers, at least ``width`` slots wide (grown, rows copied, when narrower)."""
        held = self._buffers.get(layer)
        if held is not None and held[0].shape[2] >= width:
            return held
        _, heads, _, dim = like.shape
        grown = tuple(like.new_zeros(self.rows, heads, width + HEADROOM, dim) for _ in range(2))
        if held is not None:
            for new, old in zip(grown, held):
                new[:, :, : old.shape[2]] = old
        self._buffers[layer] = grown
        self._views.setdefault(layer, [None] * self.rows)
        return grown

    def write(self, layer: int, row: int, store, keys: torch.Tensor, values: torch.Tensor, held: int) -> None:
        """Put row ``row``'s ``held`` slots and its new ``keys`` / ``values`` ``(1, H_kv, q, D)`` into the
        layer's buffers; its store (full precision) becomes a view of them."""
        if not isinstance(store, DenseStore):
            raise ValueError("only full-precision caches share a forward (thinkviz.core.together)")
        key_buffer, value_buffer = self._buffers[layer]
        q = keys.shape[2]
        if not store.is_initialized:
            store.lazy_initialization(keys, values)
        view = self._views[layer][row]
        if held and (view is None or view[0] is not store.keys or view[1] is not store.values):  # evicted, merged, new
            key_buffer[row, :, :held] = store.keys[0]
            value_buffer[row, :, :held] = store.values[0]
        key_buffer[row, :, held : held + q] = keys[0]
        value_buffer[row, :, held : held + q] = values[0]
        store.keys = key_buffer[row : row + 1, :, : held + q]
        store.values = value_buffer[row : row + 1, :, : held + q]
        self._views[layer][row] = (store.keys, store.values)


class BatchCache:
    """What the model sees as its cache in a batched forward: ``update`` hands every row's new
    entries to its own cache and returns the batch's keys and values (module docstring)."""

    def __init__(self, caches: Sequence[EvictingCache], kv_rows: KVRows, q: int) -> None:
        self.caches, self.kv_rows, self.q = list(caches), kv_rows, q
        self.held = [cache.lengths() for cache in self.caches]  # (N, L) slots before this forward

    def width(self, layer: int) -> int:
        return max(lengths[layer] for lengths in self.held) + self.q

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        width = self.width(layer_idx)
        keys, values = self.kv_rows.buffers(layer_idx, key_states, width)
        for row, cache in enumerate(self.caches):
            store = cache.layers[layer_idx]
            held = self.held[row][layer_idx]
            self.kv_rows.write(layer_idx, row, store, key_states[row : row + 1], value_states[row : row + 1], held)
        return keys[:, :, :width], values[:, :, :width]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.width(layer_idx) - self.q


def row_masks(runs: Sequence[Run], held: list[list[int]], q: int) -> list[torch.Tensor]:
    """One additive mask ``(N, 1 or H, q, W_l)`` per layer (module docstring): each row sees its own
    slots (a ragged row's padded heads hidden) and its new tokens causally."""
    first = runs[0]
    dtype, device = first.mask_dtype, first.device
    group = first.loaded.geometry.q_heads // first.loaded.geometry.kv_heads
    lengths = torch.tensor(held)  # (N, L)
    ragged = any(run.cache.ragged for run in runs)
    layers = range(lengths.shape[1]) if ragged else range(1)
    masks = []
    for layer in layers:
        own = lengths[:, layer]
        width = int(own.max()) + q
        relative = torch.arange(width)[None, None, :] - own[:, None, None]  # (N, 1, W) column - T_i
        hidden = (relative > torch.arange(q)[None, :, None])[:, None]  # (N, 1, q, W)
        if ragged:
            padding = torch.zeros(len(runs), first.loaded.geometry.kv_heads, width, dtype=torch.bool)
            for row, run in enumerate(runs):
                valid = run.cache.valid_table()
                if valid is not None:
                    padding[row, :, : own[row]] = ~valid[layer, :, : own[row]]
            hidden = hidden | padding.repeat_interleave(group, 1)[:, :, None, :]
        mask = torch.zeros(hidden.shape, dtype=dtype).masked_fill_(hidden, torch.finfo(dtype).min)
        masks.append(mask.to(device))
    return masks if ragged else masks * lengths.shape[1]


def batch_kernel(runs: Sequence[Run]) -> str:
    """The attention kernel all rows can share (module docstring)."""
    kernels = {run.attention for run in runs}
    for kernel in (BIASED_ATTENTION, "eager"):
        if kernel in kernels:
            return kernel
    return kernels.pop()


def _bias_arguments(runs: Sequence[Run], cache: BatchCache, arguments: list[dict]) -> None:
    """Each layer's ``slot_bias`` ``(N, H_kv, W_l)`` (zeros for rows without biases) and a query sink
    that hands every row's queries to its own capture."""
    sinks = [run.capture for run in runs if run.policy.fits_bias and run.query_rows and run.capture.enabled]
    heads = runs[0].loaded.geometry.kv_heads
    for layer, extra in enumerate(arguments):
        bias = torch.zeros(len(runs), heads, cache.width(layer), device=runs[0].device)
        for row, run in enumerate(runs):
            own = run.cache.layer_bias(layer)
            if own is not None:
                bias[row, :, : own.shape[-1]] = own
        extra["slot_bias"] = bias
        if sinks:
            extra["query_sink"] = lambda index, queries: [sink.keep_queries(index, queries) for sink in sinks]


@torch.inference_mode()
def forward_rows(
    runs: Sequence[Run], ids: Sequence[list[int]], logits_to_keep: int, kv_rows: KVRows
) -> list[torch.Tensor]:
    """Run ``ids[i]`` (as many tokens for every row) as the next tokens of run ``i``, all in one forward;
    each run's logits ``(q', V)`` float32, its cache, positions and statistics advanced as if it ran
    alone."""
    q, first = len(ids[0]), runs[0]
    cache = BatchCache([run.cache for run in runs], kv_rows, q)
    masks = row_masks(runs, cache.held, q)
    arguments: list[dict] = [{"attention_mask": mask} for mask in masks] if len(set(map(id, masks))) > 1 else []
    kernel = batch_kernel(runs)
    if kernel == BIASED_ATTENTION:
        arguments = arguments or [{} for _ in masks]
        _bias_arguments(runs, cache, arguments)
    positions = [torch.arange(run.processed, run.processed + q) for run in runs]
    model = first.loaded.model
    captures = [run.capture for run in runs]
    for row, (capture, lengths) in enumerate(zip(captures, cache.held)):
        capture.in_batch(row, [length + q for length in lengths])
    per_layer = LayerArguments(model, arguments) if arguments else contextlib.nullcontext()
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(model_lock(model))
            stack.enter_context(attention_implementation(model, kernel))
            for capture in captures:
                stack.enter_context(capture)
            stack.enter_context(per_layer)
            out = model(
                input_ids=torch.tensor([list(row) for row in ids], device=first.device),
                position_ids=torch.stack(positions).to(first.device),
                attention_mask=masks[0],
                cache=cache,
                use_cache=True,
                logits_to_keep=logits_to_keep,
            )
    finally:
        for capture in captures:
            capture.in_batch(None)
    return [run._after_forward(position, out.logits[row]) for row, (run, position) in enumerate(zip(runs, positions))]
