"""The DynTS importance predictor: a tiny MLP from a token's final hidden state to the
attention the answer will pay it.

Seed 004 (DynTS, "Dynamic Thinking-Token Selection for Efficient Reasoning in Large Reasoning
Models") observes that few thinking tokens steer the answer and trains a small head on the
model's hidden state to spot them while they are generated.  Here:

- labels: replay a trace through the engine with the ``full`` policy; a token's label is the
  attention it receives from the *answer* (the tokens after the last ``</think>``), mean over
  answer queries, layers and kv-heads (:func:`collect_examples`; for a transcript,
  :func:`collect_transcript_examples`);
- model: ``d → 64 → 1`` (standardised input, GELU) predicting ``log`` of that attention, so
  ``exp`` of the output is a predicted attention share (:class:`ImportancePredictor`);
- files: safetensors (tensors only, never pickle) with metadata naming the model and its
  hidden size, so a predictor for another model is refused (:func:`find_predictor`).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

FORMAT = "thinkviz-dynts"
VERSION = "1"
ASSETS = Path(__file__).resolve().parent.parent / "assets"
_LABEL_FLOOR = 1e-6  # attention below this counts as this, so log() stays finite
EPOCHS, LEARNING_RATE = 100, 1e-3  # chosen by leave-one-trace-out Spearman on the shipped traces


class PredictorError(ValueError):
    """A predictor file is missing, unreadable or made for another model; one-line message."""


class ImportancePredictor(nn.Module):
    """``(N, d)`` hidden states → ``(N,)`` predicted ``log`` attention from the answer.

    Inputs are standardised with the training set's ``mean``/``std`` ``(d,)`` (buffers, saved
    with the weights).
    """

    def __init__(self, hidden_size: int, width: int = 64) -> None:
        super().__init__()
        self.hidden_size, self.width = hidden_size, width
        self.register_buffer("mean", torch.zeros(hidden_size))
        self.register_buffer("std", torch.ones(hidden_size))
        self.net = nn.Sequential(nn.Linear(hidden_size, width), nn.GELU(), nn.Linear(width, 1))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net((hidden.float() - self.mean) / self.std).squeeze(-1)


@dataclass(frozen=True)
class PredictorMeta:
    """What a predictor file says about itself."""

    model: str
    hidden_size: int
    width: int
    heldout_spearman: float = math.nan
    trained_on: str = ""


def model_slug(model_name: str) -> str:
    """``"SmolLM2-135M-Instruct (embedded)"`` → ``"smollm2-135m-instruct-embedded"``."""
    return re.sub(r"[^a-z0-9]+", "-", model_name.lower()).strip("-") or "model"


def predictor_path(model_name: str, folder: Path = ASSETS) -> Path:
    """Where the predictor for ``model_name`` lives."""
    return folder / f"dynts_{model_slug(model_name)}.safetensors"


def save(predictor: ImportancePredictor, meta: PredictorMeta, path: str | Path) -> Path:
    """Write weights + metadata to a safetensors file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in predictor.state_dict().items()}
    save_file(
        tensors,
        str(path),
        metadata={
            "format": FORMAT,
            "version": VERSION,
            "model": meta.model,
            "hidden_size": str(meta.hidden_size),
            "width": str(meta.width),
            "heldout_spearman": repr(meta.heldout_spearman),
            "trained_on": meta.trained_on,
        },
    )
    return path


def load(path: str | Path) -> tuple[ImportancePredictor, PredictorMeta]:
    """Read a file written by :func:`save`; :class:`PredictorError` when it is not one."""
    path = Path(path)
    if not path.is_file():
        raise PredictorError(f"no predictor file at {path}")
    try:
        with safe_open(str(path), framework="pt") as fh:
            header = fh.metadata() or {}
            tensors = {key: fh.get_tensor(key) for key in fh.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise PredictorError(f"{path.name} is not a readable safetensors file ({exc})") from None
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise PredictorError(f"{path.name} is not a ThinkViz DynTS predictor (version {VERSION})")
    try:
        meta = PredictorMeta(
            model=header["model"],
            hidden_size=int(header["hidden_size"]),
            width=int(header["width"]),
            heldout_spearman=float(header.get("heldout_spearman", "nan")),
            trained_on=header.get("trained_on", ""),
        )
        predictor = ImportancePredictor(meta.hidden_size, meta.width)
        predictor.load_state_dict(tensors, strict=True)
    except (KeyError, ValueError, RuntimeError) as exc:
        raise PredictorError(f"{path.name} is damaged ({str(exc).splitlines()[0]})") from None
    return predictor.eval(), meta


def find_predictor(model_name: str, hidden_size: int, folder: Path = ASSETS) -> ImportancePredictor:
    """The predictor trained for ``model_name``; :class:`PredictorError` says why there is none."""
    path = predictor_path(model_name, folder)
    if not path.is_file():
        raise PredictorError(
            f"no predictor trained for {model_name} (expected {path.name}; "
            "run: python -m thinkviz train-predictor --model ...)"
        )
    predictor, meta = load(path)
    if meta.model != model_name or meta.hidden_size != hidden_size:
        raise PredictorError(
            f"{path.name} was trained for {meta.model} (hidden size {meta.hidden_size}), "
            f"not {model_name} (hidden size {hidden_size})"
        )
    return predictor


# ---- training data ------------------------------------------------------------------------
@dataclass
class Examples:
    """One replayed trace: ``features`` ``(n, d)`` hidden states and ``labels`` ``(n,)`` attention
    from the answer, for positions ``0 .. n-1`` (everything before the answer); ``thinking``
    ``(n,)`` bool marks the assistant's positions (what DynTS ranks); ``attention_so_far``
    ``(n,)`` is what the fallback score knew when the answer began (attention received per
    query, mean over layers and kv-heads), a baseline to compare the predictor with."""

    name: str
    features: torch.Tensor
    labels: torch.Tensor
    thinking: torch.Tensor
    attention_so_far: torch.Tensor


def collect_examples(loaded, name: str, system: str | None, question: str, trace: str) -> Examples:
    """Replay ``trace`` (the assistant's text after the prompt's ``<think>``) with the ``full`` policy.

    The part before the answer (everything up to the last ``</think>``) is the prompt's
    assistant prefix, so it is prefilled; the answer is replayed after it.  The attention each
    earlier token receives from the answer is the ``received`` statistic after the replay minus
    the one after the prefill.  Hidden states come from a hook on the model's final norm.
    """
    from .chat import build_chat
    from .replay import ASSISTANT_PREFIX as opening

    trace = trace.removeprefix(opening)  # the prompt opens the think block already
    cut = trace.rfind("</think>")
    if cut < 0:
        raise ValueError(f"trace {name!r} has no </think>: it has no answer to label with")
    cut += len("</think>")
    prefix = opening + trace[:cut]
    prompt = build_chat(loaded.tokenizer, system, question, assistant=prefix)
    answer = loaded.tokenizer(trace[cut:], add_special_tokens=False)["input_ids"]
    if not answer:
        raise ValueError(f"trace {name!r} has nothing after its last </think>")
    thinking = torch.zeros(len(prompt.ids), dtype=torch.bool)
    thinking[prompt.roles[-1].start :] = True
    return _label(loaded, name, prompt, answer, thinking)


def collect_transcript_examples(loaded, name: str, messages) -> Examples:
    """:func:`collect_examples` for a transcript: the conversation up to its last ``</think>``
    is prefilled and the rest (the last answer, and any tool and later turns) is replayed; the
    assistant turns before the cut are the thinking positions."""
    from .chat import anchor, build_conversation, split_conversation, token_boundary

    chat = build_conversation(loaded.tokenizer, messages)
    close = chat.text.rfind("</think>")
    if close < 0:
        raise ValueError(f"transcript {name!r} has no </think>: it has no answer to label with")
    starts = [0, *itertools.accumulate(map(len, chat.texts))]
    cut = token_boundary([anchor(p, a) for p, a in zip(chat.texts, starts)], close + len("</think>"))
    if cut >= len(chat.ids):
        raise ValueError(f"transcript {name!r} has nothing after its last </think>")
    prompt, answer = split_conversation(chat, cut)
    thinking = torch.zeros(cut, dtype=torch.bool)
    for role in prompt.roles:
        if role.role == "assistant":
            thinking[role.start : min(role.end, cut)] = True
    return _label(loaded, name, prompt, answer, thinking)


def _label(loaded, name: str, prompt, answer: Sequence[int], thinking: torch.Tensor) -> Examples:
    """Prefill ``prompt``, replay ``answer`` with the full cache; the examples of the prompt's positions."""
    from .engine import DecodeSettings, Run
    from .policies import make_policy

    hidden: list[torch.Tensor] = []
    norm = loaded.model.model.norm
    handle = norm.register_forward_hook(lambda module, args, output: hidden.append(output[0].detach().float().cpu()))
    run = Run(loaded, make_policy("full", interval=64), prompt, DecodeSettings(prefill_chunk=256))
    after_prefill: list[torch.Tensor] = []

    def remember_prefill(positions, logits) -> None:
        if not after_prefill:  # the first call comes right after the prefill
            after_prefill.append(run.received.clone())

    try:
        for _ in run.replay(answer, on_logits=remember_prefill):
            pass
    finally:
        handle.remove()
    n = len(prompt.ids)
    from_answer = (run.received[:, :, :n] - after_prefill[0]).mean(dim=(0, 1)) / len(answer)  # (n,)
    queries_seen = n - torch.arange(n)  # (n,) queries of the prefill that could see each position
    so_far = after_prefill[0].mean(dim=(0, 1)) / queries_seen
    return Examples(name, torch.cat(hidden)[:n], from_answer.clamp(min=0), thinking, so_far)


def targets(labels: torch.Tensor) -> torch.Tensor:
    """Regression targets: ``log`` attention, floored at ``1e-6``."""
    return labels.clamp(min=_LABEL_FLOOR).log()


def train(
    examples: Sequence[Examples],
    epochs: int = EPOCHS,
    lr: float = LEARNING_RATE,
    width: int = 64,
    seed: int = 0,
    progress: Callable[[int, float], None] | None = None,
) -> ImportancePredictor:
    """Fit a predictor on ``examples`` (full-batch AdamW on mean squared error of log attention).

    ``progress(epoch, loss)`` is called after every epoch.
    """
    if not examples:
        raise ValueError("no training examples")
    features = torch.cat([e.features for e in examples]).float()
    goal = torch.cat([targets(e.labels) for e in examples])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        predictor = ImportancePredictor(features.shape[1], width)
    predictor.mean.copy_(features.mean(0))
    predictor.std.copy_(features.std(0).clamp(min=1e-6))
    with torch.no_grad():
        predictor.net[-1].bias.fill_(float(goal.mean()))  # start at the mean log attention
    optimizer = torch.optim.AdamW(predictor.parameters(), lr=lr, weight_decay=1e-2)
    for epoch in range(epochs):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(predictor(features), goal)
        loss.backward()
        optimizer.step()
        if progress is not None:
            progress(epoch, float(loss))
    return predictor.eval()


def spearman(a: Sequence[float] | torch.Tensor, b: Sequence[float] | torch.Tensor) -> float:
    """Spearman rank correlation (average ranks for ties); NaN when either side is constant."""
    ra, rb = _ranks(np.asarray(a, dtype=np.float64)), _ranks(np.asarray(b, dtype=np.float64))
    if len(ra) != len(rb):
        raise ValueError("spearman needs two sequences of one length")
    if len(ra) < 2 or ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def _ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their average rank."""
    order = values.argsort(kind="stable")
    ranks = np.empty(len(values))
    sorted_values = values[order]
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_values[j + 1] == sorted_values[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks
