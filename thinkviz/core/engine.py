"""The decode loop: prefill, then step token by token (or chunk by chunk) with real eviction.

One :class:`Run` owns an :class:`~thinkviz.core.cache.EvictingCache` (stored in the run's
:class:`~thinkviz.core.kvquant.KVQuant` format: full precision or quantized), the per-slot attention
statistics that must move with the slots when they are gathered, and the per-position
facts (token text, entropy of its own attention row, hidden state).  Every ``interval``
steps it asks the policy which slots to keep and gathers them.  Each step yields a
:class:`~thinkviz.core.events.StepEvent`; ``Run.record`` collects them into a
:class:`~thinkviz.core.events.RunRecord`.

Positions: a new token at absolute position ``p`` gets ``position_ids = p`` (its rotary
phase) whatever the physical length of the cache.  The attention mask is passed as a
prepared 4-D additive mask ``(1, 1, q, T + q)``: every cached slot is visible, the ``q`` new
tokens see each other causally.  After a ragged keep set (layers of different lengths ``T_l``,
padded heads) every layer gets its own mask ``(1, H, q, T_l + q)`` that also hides its padding
per head (:class:`~thinkviz.core.attention.LayerArguments`); the per-slot statistics then live on
the cache's padded ``(L, H_kv, W)`` table, zero at its holes.

A policy that fits attention biases (:attr:`~thinkviz.policies.base.Policy.fits_bias`: the
attention-matching ones) gets a cache that holds a bias per slot and runs
:func:`~thinkviz.core.attention.biased_attention`, which adds it to the logits and hands the engine
the newest ``query_rows`` queries of every layer (``CacheView.queries``, the fit's reference
queries); every other policy runs the model's own attention kernel exactly as before.  Such a
policy may also ask for a *repeat-prefill* (``CacheView.reread``, :meth:`Run.reread`): the
model reads :data:`REPEAT_INSTRUCTION` and a stretch of the text again on top of a copy of the
cache, and the queries of that re-read become reference queries (Zweiger et al.,
arXiv:2602.16284; :mod:`thinkviz.core.reread`); the run's cache and statistics are left as they were.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .attention import BIASED_ATTENTION, AttentionCapture, LayerArguments, attention_implementation, causal_mask
from .attention import model_lock
from .cache import EvictingCache
from ..text.chat import ChatPrompt, token_texts
from .events import RunRecord, StepEvent
from .kvquant import KVQuant, KVQuantError
from .reread import REPEAT_INSTRUCTION, repeat_prefill
from ..models.loading import LoadedModel
from ..policies.base import CacheView, Policy
from ..text.segments import Segmenter


class EngineError(ValueError):
    """The request cannot be run (empty prompt, too long for the model, bad settings)."""


@dataclass(frozen=True)
class DecodeSettings:
    """How to decode. ``temperature == 0`` means greedy.  ``scoring``: compute the per-token
    scores the views show; ``fast_attention``: run the model's fused attention (SDPA) when nothing
    needs the attention weights (:func:`attention_kernel`)."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    prefill_chunk: int = 256
    scoring: bool = True
    snapshot_limit: int = 64
    stop_at_eos: bool = True
    fast_attention: bool = True

    def validate(self) -> None:
        if not 1 <= self.max_new_tokens <= 32768:
            raise EngineError(f"max_new_tokens must be between 1 and 32768, got {self.max_new_tokens}")
        if not 0.0 <= self.temperature <= 5.0:
            raise EngineError(f"temperature must be between 0 and 5, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise EngineError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.prefill_chunk < 1:
            raise EngineError("prefill_chunk must be at least 1")


def needs_weights(policy: Policy, settings: DecodeSettings) -> bool:
    """Whether a run needs the attention weights: its policy reads them, to decide (when it evicts)
    or to show its scores (when scoring is on)."""
    return policy.reads_attention and (settings.scoring or policy.evicts)


def attention_kernel(model: torch.nn.Module, policy: Policy, settings: DecodeSettings) -> str:
    """:data:`~thinkviz.core.attention.BIASED_ATTENTION` for a policy that fits biases; ``"sdpa"`` (the
    fused kernel, no weights) when nothing needs the weights and the model has it; else ``"eager"``."""
    if policy.fits_bias:
        return BIASED_ATTENTION
    fast = settings.fast_attention and not needs_weights(policy, settings)
    return "sdpa" if fast and getattr(model, "_supports_sdpa", False) else "eager"


def eos_ids(loaded: LoadedModel) -> set[int]:
    """Token ids that end generation (tokenizer and generation config)."""
    ids: set[int] = set()
    for source in (loaded.tokenizer.eos_token_id, getattr(loaded.model.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(i) for i in source)
    return ids


def pick_token(logits: torch.Tensor, settings: DecodeSettings, generator: torch.Generator) -> int:
    """Greedy argmax, or temperature + nucleus (top-p) sampling from ``logits`` ``(V,)``."""
    if settings.temperature == 0.0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / settings.temperature, dim=-1)
    if settings.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        outside = sorted_probs.cumsum(-1) - sorted_probs > settings.top_p
        sorted_probs[outside] = 0.0
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))


class Run:
    """One run of a model through a policy.  Use :meth:`generate` or :meth:`replay`.

    ``prompt``: a :class:`~thinkviz.text.chat.ChatPrompt` (roles known, segments tracked) or plain
    token ids.  ``cancel``: set it from another thread to stop after the current step.
    ``kv_quant``: how the cache stores keys and values (default: full precision); the policy
    scores what attention computed on the stored (decoded) entries.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        policy: Policy,
        prompt: ChatPrompt | Sequence[int],
        settings: DecodeSettings = DecodeSettings(),
        cancel: threading.Event | None = None,
        kv_quant: KVQuant = KVQuant(),
    ) -> None:
        settings.validate()
        try:
            kv_quant.check(loaded.geometry.head_dim)
        except KVQuantError as exc:
            raise EngineError(str(exc)) from None
        self.loaded, self.policy, self.settings, self.kv_quant = loaded, policy, settings, kv_quant
        self.cancel = cancel or threading.Event()
        geometry = loaded.geometry
        if isinstance(prompt, ChatPrompt):
            ids, texts = list(prompt.ids), list(prompt.texts)
            self.segmenter = Segmenter(
                prompt.roles,
                texts,
                protect_system=policy.protect_system,
                protect_question=policy.protect_question,
                tags=(prompt.reasoning.open, prompt.reasoning.close),
            )
        else:
            ids = [int(i) for i in prompt]
            texts = token_texts(loaded.tokenizer, ids)
            self.segmenter = None
        if not ids:
            raise EngineError("the prompt is empty")
        if len(ids) >= geometry.max_context:
            raise EngineError(f"the prompt has {len(ids)} tokens; the model's context is {geometry.max_context}")
        self.ids: list[int] = ids
        self.texts: list[str] = texts
        self.device = loaded.device
        self.mask_dtype = loaded.model.get_input_embeddings().weight.dtype  # the attention compute dtype
        self.cache = EvictingCache(loaded.model.config, kv_quant, bias_device=self.device if policy.fits_bias else None)
        layers, heads = geometry.layers, geometry.kv_heads
        self.window_rows = max(1, policy.window_rows)
        self.received = torch.zeros(layers, heads, 0)
        self.window = torch.zeros(layers, heads, self.window_rows, 0)
        self.token_entropy = torch.zeros(0)
        self._hidden: torch.Tensor | None = None  # (capacity, ...); rows 0 .. _hidden_rows - 1 hold tokens
        self._hidden_rows = 0
        self.query_rows = policy.query_rows
        self.queries: torch.Tensor | None = None  # (L, H, R, D) scaled, when the policy reads queries
        self.query_positions = torch.zeros(0, dtype=torch.long)  # (R,)
        self.processed = 0  # tokens already run through the model
        self.steps_since_compress = 0
        self.peak_kv_bytes = 0
        self.generator = torch.Generator().manual_seed(settings.seed)
        # Hooks are installed around each forward pass only, so several runs sharing one model
        # can be interleaved (Compare, lockstep fidelity) without seeing each other's attention.
        text_config = loaded.model.config.get_text_config()
        self.capture = AttentionCapture(
            loaded.model,
            heads,
            tail_rows=self.window_rows,
            hidden_layers=policy.hidden_layers(loaded.name, text_config.hidden_size, text_config.num_hidden_layers),
            query_rows=self.query_rows,
        )
        self.attention = attention_kernel(loaded.model, policy, settings)
        self.capture.enabled = needs_weights(policy, settings)
        self._snapshot_stride = 1
        self.record = RunRecord(
            meta={
                "model": loaded.name,
                "quantization": loaded.quantization,
                "device": str(loaded.device),
                "policy": policy.name,
                "params": dict(policy.config),
                "budget": policy.budget,
                "interval": policy.interval,
                "kv_quant": kv_quant.describe(),
                "geometry": {
                    "layers": layers,
                    "kv_heads": heads,
                    "head_dim": geometry.head_dim,
                    "dtype_bytes": geometry.dtype_bytes,
                },
                "weights_bytes": loaded.weights_bytes,
                "settings": settings.__dict__.copy(),
                "attention": self.attention,
            },
            prompt_ids=list(ids),
            prompt_texts=list(texts),
            prompt_labels=self.segmenter.labels()[: len(ids)] if self.segmenter is not None else [],
            segments=self._segments(),
        )

    # ---- public loops --------------------------------------------------------------
    def generate(self) -> Iterator[StepEvent]:
        """Prefill the prompt, then decode until EOS, ``max_new_tokens`` or cancel."""
        stop_ids = eos_ids(self.loaded) if self.settings.stop_at_eos else set()
        logits = self._prefill()
        for step in range(self.settings.max_new_tokens):
            if self.cancel.is_set():
                self.record.summary["stopped"] = "cancelled"
                break
            token = pick_token(logits, self.settings, self.generator)
            event, step_logits = self._advance(step, [token], logits_to_keep=1)
            logits = step_logits[-1]
            yield event
            if token in stop_ids:
                self.record.summary["stopped"] = "eos"
                break
        else:
            self.record.summary["stopped"] = "max_new_tokens"
        self._finish()

    def replay(
        self,
        ids: Sequence[int],
        on_logits: Callable[[list[int], torch.Tensor], None] | None = None,
    ) -> Iterator[StepEvent]:
        """Teacher-force ``ids`` after the prompt, ``interval`` tokens per forward pass.

        ``on_logits(positions, logits)`` receives each chunk's logits ``(q, V)``: row ``i``
        predicts the token after absolute position ``positions[i]``.
        """
        ids = self.check_trace(ids)
        chunk = self.policy.interval
        last = self._prefill()
        if on_logits is not None:
            on_logits([len(self.ids) - 1], last[None])
        for step, start in enumerate(range(0, len(ids), chunk)):
            if self.cancel.is_set():
                self.record.summary["stopped"] = "cancelled"
                break
            event, logits = self._advance(step, ids[start : start + chunk], logits_to_keep=0)
            if on_logits is not None:
                on_logits(event.positions, logits)
            yield event
        else:
            self.record.summary["stopped"] = "end of trace"
        self._finish()

    def check_trace(self, ids: Sequence[int]) -> list[int]:
        """``ids`` as a list of ints; :class:`EngineError` when empty or past the model's context."""
        ids = [int(i) for i in ids]
        if not ids:
            raise EngineError("the trace is empty")
        if len(self.ids) + len(ids) > self.loaded.geometry.max_context:
            raise EngineError(
                f"prompt + trace is {len(self.ids) + len(ids)} tokens; "
                f"the model's context is {self.loaded.geometry.max_context}"
            )
        return ids

    # ---- internals -----------------------------------------------------------------
    def _prefill(self) -> torch.Tensor:
        """Run the prompt in chunks, compressing between chunks; return the last logits ``(V,)``."""
        start_time = time.perf_counter()
        for chunk in self._prompt_chunks():
            logits = self._forward(chunk, logits_to_keep=1)
            self._prefilled_chunk()
        self.record.summary["prefill_seconds"] = time.perf_counter() - start_time
        return logits[-1]

    def _prompt_chunks(self) -> list[list[int]]:
        """The prompt's tokens not run yet, in chunks of ``prefill_chunk`` (recording how many there are)."""
        prompt, chunk = self.ids[self.processed :], self.settings.prefill_chunk
        self.record.summary["prompt_tokens"] = len(prompt)
        return [prompt[start : start + chunk] for start in range(0, len(prompt), chunk)]

    def _prefilled_chunk(self) -> None:
        self.steps_since_compress += self.policy.interval  # a chunk always makes a compression due
        self._maybe_compress()

    @torch.inference_mode()
    def _forward(self, ids: list[int], logits_to_keep: int) -> torch.Tensor:
        """Run ``ids`` at the next absolute positions; return logits ``(q', V)`` (float32)."""
        q = len(ids)
        positions = torch.arange(self.processed, self.processed + q)
        arguments: list[dict] = [{} for _ in self.cache.layers]  # each layer's own attention arguments
        if self.cache.ragged:
            masks = self._layer_masks(q)
            mask = masks[0]
            for extra, layer_mask in zip(arguments, masks):
                extra["attention_mask"] = layer_mask
        else:
            mask = causal_mask(self.cache.n_slots, q, self.mask_dtype, self.device)
        if self.policy.fits_bias:
            for layer, extra in enumerate(arguments):
                extra["slot_bias"] = self.cache.layer_bias(layer)
                if self.query_rows and self.capture.enabled:
                    extra["query_sink"] = self.capture.keep_queries
        model = self.loaded.model
        per_layer = LayerArguments(model, arguments) if any(arguments) else contextlib.nullcontext()
        with model_lock(model), attention_implementation(model, self.attention), self.capture, per_layer:
            out = self.loaded.model(
                input_ids=torch.tensor([ids], device=self.device),
                position_ids=positions[None].to(self.device),
                attention_mask=mask,
                cache=self.cache,
                use_cache=True,
                logits_to_keep=logits_to_keep,
            )
        return self._after_forward(positions, out.logits[0])

    def _after_forward(self, positions: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Book a forward of the tokens at ``positions`` (its cache entries are written); its logits as float32."""
        self.cache.record_positions(positions)
        self.processed += len(positions)
        self.peak_kv_bytes = max(self.peak_kv_bytes, self.cache.nbytes())
        if self.capture.enabled:
            self._absorb(self.capture.take(), len(positions))
        return logits.float()

    def _layer_masks(self, q: int) -> list[torch.Tensor]:
        """One mask ``(1, H, q, T_l + q)`` per layer of a ragged cache: its padding hidden per head."""
        valid = self.cache.valid_table()
        group = self.loaded.geometry.q_heads // self.loaded.geometry.kv_heads
        masks = []
        for layer, length in enumerate(self.cache.lengths()):
            padding = ~valid[layer, :, :length].repeat_interleave(group, 0)  # (H, T_l)
            masks.append(causal_mask(length, q, self.mask_dtype, self.device, hidden=padding))
        return masks

    def _absorb(self, scores, q: int) -> None:
        """Fold one forward's reduced attention into the slot-aligned statistics."""
        cached = self.received.shape[-1]  # slots before this forward; the capture covers them and the q new ones
        self.received = F.pad(self.received, (0, q)).add_(scores.received.cpu())  # (L, H_kv, T + q)
        rows = scores.tail.cpu()  # (L, H_kv, r, T + q)
        kept = self.window_rows - rows.shape[2]  # rows of the old window that stay
        if kept > 0:
            window = rows.new_zeros(*rows.shape[:2], self.window_rows, rows.shape[-1])
            window[:, :, :kept, :cached] = self.window[:, :, -kept:]
            window[:, :, kept:] = rows
            rows = window
        self.window = rows[:, :, -self.window_rows :]
        self.token_entropy = torch.cat([self.token_entropy, scores.row_entropy.cpu()])
        if scores.hidden is not None:
            self._keep_hidden(self.policy.hidden_kept(self.loaded.name, scores.hidden.cpu()))
        if scores.queries is not None:  # (L, H, r, D), the forward's last r tokens
            rows = scores.queries.shape[2]
            grown = scores.queries if self.queries is None else torch.cat([self.queries, scores.queries], dim=2)
            self.queries = grown[:, :, -self.query_rows :]
            new_positions = torch.arange(self.processed - rows, self.processed)
            self.query_positions = torch.cat([self.query_positions, new_positions])[-self.query_rows :]

    def _keep_hidden(self, new: torch.Tensor) -> None:
        """Append what the policy keeps of a forward's hidden states (``(q, ...)``,
        :meth:`Policy.hidden_kept`); the buffer doubles when full, so a decode step copies only
        its own row, not all the rows before it."""
        rows = self._hidden_rows + len(new)
        if self._hidden is None or rows > len(self._hidden):
            grown = new.new_empty((max(2 * rows, 64), *new.shape[1:]))
            if self._hidden is not None:
                grown[: self._hidden_rows] = self._hidden[: self._hidden_rows]
            self._hidden = grown
        self._hidden[self._hidden_rows : rows] = new
        self._hidden_rows = rows

    @property
    def hidden(self) -> torch.Tensor | None:
        """``(N, ...)`` what the policy keeps of every token's hidden states so far, or ``None``."""
        return None if self._hidden is None else self._hidden[: self._hidden_rows]

    def _view(self) -> CacheView:
        total = self.processed
        protected = (
            torch.from_numpy(self.segmenter.protected_mask()[:total].copy())
            if self.segmenter is not None
            else torch.zeros(total, dtype=torch.bool)
        )
        entropy = self.token_entropy if len(self.token_entropy) == total else torch.zeros(total)
        return CacheView(
            positions=self.cache.position_table(),
            received=self.received,
            window=self.window,
            token_entropy=entropy,
            protected=protected,
            current=total - 1,
            keys=self.cache.key_views(),
            hidden=self.hidden,
            texts=self.texts,
            segments=self.segmenter,
            model=self.loaded.name,
            valid=self.cache.valid_table(),
            queries=self.queries,
            query_positions=None if self.queries is None else self.query_positions,
            bias=self.cache.bias_table(),
            reread=self.reread if self.policy.fits_bias else None,
        )

    def reread(self, positions: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Repeat-prefill (:func:`~thinkviz.core.reread.repeat_prefill`): read
        :data:`~thinkviz.core.reread.REPEAT_INSTRUCTION` then the tokens at ``positions`` at the next
        absolute positions, on top of a copy of the cache; the run itself is left as it was."""
        ids = self.loaded.tokenizer.encode(REPEAT_INSTRUCTION, add_special_tokens=False)
        ids += [self.ids[p] for p in positions]
        q = len(ids)
        if self.cache.ragged:
            masks = self._layer_masks(q)
        else:
            masks = [causal_mask(self.cache.n_slots, q, self.mask_dtype, self.device)] * len(self.cache.layers)
        with model_lock(self.loaded.model):
            return repeat_prefill(self.loaded.model, self.cache, ids, self.processed, len(positions), masks)

    def _maybe_compress(self) -> tuple[np.ndarray | None, float]:
        """Compress if due and over budget.

        Returns the ``(N,)`` holder counts from just before compressing (``None`` when it did
        not compress) and the seconds spent in the policy.
        """
        if not self.policy.evicts or self.steps_since_compress < self.policy.interval:
            return None, 0.0
        if self.cache.mean_kept() <= self.policy.target(self.processed):
            return None, 0.0
        start = time.perf_counter()
        held_before = self._holders()
        keep = self.policy.compress(self._view(), self.cache)
        expected = (len(self.cache.layers), self.loaded.geometry.kv_heads)
        mask_width = keep.dtype == torch.bool and keep.shape[-1:] != (self.cache.n_slots,)
        if keep.dim() != 3 or tuple(keep.shape[:2]) != expected or mask_width:
            raise RuntimeError(f"policy {self.policy.name} returned keep indices of shape {tuple(keep.shape)}")
        index = self.cache.keep(keep.cpu())  # (L, H_kv, W): each new slot's old slot
        if self.capture.enabled:
            self._move_statistics(index)
        self.steps_since_compress = 0
        return held_before, time.perf_counter() - start

    def _move_statistics(self, index: torch.Tensor) -> None:
        """Gather the per-slot attention statistics along with the slots (holes get zeros)."""
        self.received = self.received.gather(-1, index)
        self.window = self.window.gather(-1, index[:, :, None, :].expand(-1, -1, self.window_rows, -1))
        valid = self.cache.valid_table()
        if valid is not None:
            self.received = self.received * valid
            self.window = self.window * valid[:, :, None, :]

    def _advance(self, step: int, ids: list[int], logits_to_keep: int) -> tuple[StepEvent, torch.Tensor]:
        """Append ``ids``, compress if due; return the StepEvent and the logits ``(q', V)``."""
        start = time.perf_counter()
        new_texts = self._take_tokens(ids)
        logits = self._forward(ids, logits_to_keep)
        return self._step_event(step, ids, new_texts, time.perf_counter() - start), logits

    def _take_tokens(self, ids: list[int]) -> list[str]:
        """Append ``ids`` (about to be run) to the run's text; their texts."""
        new_texts = token_texts(self.loaded.tokenizer, ids, prefix_ids=self.ids[-8:])
        self.ids.extend(ids)
        self.texts.extend(new_texts)
        if self.segmenter is not None:
            self.segmenter.feed(new_texts)
            self.record.segments = self._segments()  # current while the run streams
        return new_texts

    def _step_event(self, step: int, ids: list[int], new_texts: list[str], seconds_forward: float) -> StepEvent:
        """After the forward of ``ids``: compress if due, and the step's event."""
        positions = list(range(self.processed - len(ids), self.processed))
        self.steps_since_compress += len(ids)  # a replayed chunk of `interval` tokens makes a compression due
        held_before, seconds_policy = self._maybe_compress()
        after = self._holders()
        # positions that lost their last slot, including tokens written by this step
        evicted = [] if held_before is None else np.flatnonzero((held_before > 0) & (after == 0)).tolist()
        view = self._view()
        event = StepEvent(
            step=step,
            token_ids=list(ids),
            texts=new_texts,
            positions=positions,
            scores=self._position_scores(view, after),
            mass=self._position_mass(after),
            keep_fraction=after / float(self.cache.position_table()[..., 0].numel()),
            evicted=evicted,
            kv_bytes=self.cache.nbytes(),
            logical_kv_bytes=self.cache.logical_nbytes(),
            kv_tokens=round(self.cache.mean_kept()),
            kept=self.cache.kept_counts().numpy(),
            full_kv_bytes=self.cache.full_precision_nbytes(self.processed),
            seconds_forward=seconds_forward,
            seconds_policy=seconds_policy,
            compressed=held_before is not None,
            info=self.policy.step_info(view),
        )
        self.record.events.append(event)
        self._maybe_snapshot(step)
        return event

    def _slot_positions(self) -> torch.Tensor:
        """``(L, H_kv, W)`` the position each slot holds; a hole gets ``N``, one past the last
        position, a bin every count below drops."""
        table, valid = self.cache.position_table(), self.cache.valid_table()
        return table if valid is None else torch.where(valid, table, self.processed)

    def _holders(self) -> np.ndarray:
        """``(N,)`` number of (layer, kv-head) slots holding each absolute position."""
        table = self._slot_positions().flatten()
        return torch.bincount(table, minlength=self.processed + 1)[: self.processed].numpy().astype(np.float32)

    def _position_scores(self, view: CacheView, holders: np.ndarray) -> np.ndarray:
        """``(N,)`` the policy's importance per position: mean over the slots that hold it."""
        if not self.settings.scoring:
            return np.full(self.processed, np.nan, dtype=np.float32)
        return self._per_position(self.policy.score(view), holders)

    def _position_mass(self, holders: np.ndarray) -> np.ndarray | None:
        """``(N,)`` how many tokens each position stands for, ``e^β`` averaged over the slots that
        hold it (``None`` for a cache without biases)."""
        bias = self.cache.bias_table()
        return None if bias is None else self._per_position(bias.exp(), holders)

    def _per_position(self, slot_values: torch.Tensor, holders: np.ndarray) -> np.ndarray:
        """``(N,)`` the mean of ``slot_values`` ``(L, H_kv, W)`` over the slots holding each position
        (``nan`` where none does)."""
        table = self._slot_positions().flatten()
        weights = torch.nan_to_num(slot_values.float().flatten().cpu())
        sums = torch.bincount(table, weights=weights, minlength=self.processed + 1)[: self.processed].numpy()
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(holders > 0, sums / holders, np.nan).astype(np.float32)

    def _maybe_snapshot(self, step: int) -> None:
        """Keep a bounded, evenly thinned set of ``(L, H_kv, N)`` keep masks for drill-down."""
        if step % self._snapshot_stride:
            return
        table = self._slot_positions()  # (L, H_kv, W)
        mask = torch.zeros(*table.shape[:2], self.processed + 1, dtype=torch.bool)
        mask.scatter_(-1, table, True)
        self.record.snapshots[step] = mask[..., : self.processed].contiguous().numpy()
        if len(self.record.snapshots) > self.settings.snapshot_limit:
            self._snapshot_stride *= 2
            self.record.snapshots = {s: m for s, m in self.record.snapshots.items() if s % self._snapshot_stride == 0}

    def _finish(self) -> None:
        events = self.record.events
        decode_seconds = sum(e.seconds_forward + e.seconds_policy for e in events)
        generated = sum(len(e.token_ids) for e in events)
        final = events[-1] if events else None
        self.record.summary.update(
            {
                "new_tokens": generated,
                "tokens_per_second": generated / decode_seconds if decode_seconds > 0 else 0.0,
                "peak_kv_bytes": self.peak_kv_bytes,
                "final_kv_bytes": final.kv_bytes if final else self.cache.nbytes(),
                "final_full_kv_bytes": final.full_kv_bytes if final else self.cache.nbytes(),
                "kept_fraction": (self.cache.mean_kept() / self.processed) if self.processed else 1.0,
            }
        )
        if self.segmenter is not None:
            self.segmenter.finish()
            self.record.segments = self._segments()

    def _segments(self) -> list[dict]:
        """The segmenter's spans now, as the record stores them (none for a prompt without roles)."""
        return [] if self.segmenter is None else [span.__dict__.copy() for span in self.segmenter.spans()]
