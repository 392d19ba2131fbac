"""Generate the DynTS training corpus: the model answers the prompt set in its own words.

Each prompt is sent with the reasoning system prompt and the worked
:data:`~.prompts.DEMONSTRATIONS` as earlier turns, and the assistant turn opened with
``<think>\\n``.  Only generations that close ``</think>`` and then say something are kept
(:attr:`Generation.kept`); the rest are counted, so the keep rate can be reported.

Efficiency: prompts are answered ``batch_size`` at a time with Hugging Face ``generate``
(left padding; padded slots are masked and positions come from the mask, so a row is the
same computation as alone, up to float rounding of the batched matrix products).  A row
stops as soon as its fate is known — ``think_tokens`` without a ``</think>`` (dropped), or
``answer_tokens`` after it (kept, answer cut there) — and a batch ends when all its rows have.
Each batch seeds the sampler with ``seed + batch number``, so the corpus is deterministic and
an interrupted run resumes at the next batch: finished batches are appended (one JSON line each) to a
cache under :func:`thinkviz.models.loading.cache_dir` (``dynts-corpus/``), keyed by the model, its
quantization and 4-bit backend, the prompt-set digest and these settings.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from collections.abc import Callable, Sequence

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from ...text.chat import REASONING_SYSTEM_PROMPT
from ...models.loading import LoadedModel, cache_dir
from ...predictor import model_slug
from ...measure.replay import ASSISTANT_PREFIX
from .prompts import DEMONSTRATIONS, CorpusPrompt, prompt_set_digest

CLOSE = "</think>"


@dataclass(frozen=True)
class GenerationSettings:
    """How the corpus is sampled; every field is part of the cache key."""

    seed: int = 0
    batch_size: int = 16
    think_tokens: int = 320  # a row with no </think> after this many new tokens is dropped
    answer_tokens: int = 96  # the answer is cut after this many tokens
    temperature: float = 0.7
    top_p: float = 0.9

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:8]


@dataclass(frozen=True)
class Generation:
    """One answered prompt: ``text`` is the assistant's turn after the opening ``<think>\\n``."""

    index: int
    kind: str
    question: str
    text: str
    new_tokens: int
    kept: bool


def generation_prompt(tokenizer, question: str) -> list[int]:
    """Token ids of the chat the model answers: system, the demonstrations, the question, ``<think>\\n``."""
    messages = [{"role": "system", "content": REASONING_SYSTEM_PROMPT}]
    for user, assistant in DEMONSTRATIONS:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    messages.append({"role": "user", "content": question})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not text.endswith(ASSISTANT_PREFIX):
        text += ASSISTANT_PREFIX
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def is_answered(text: str) -> bool:
    """Whether a generation closed its think block and then wrote an answer."""
    cut = text.rfind(CLOSE)
    return cut >= 0 and bool(text[cut + len(CLOSE) :].strip())


class _RowLimits(StoppingCriteria):
    """Stops each row once it is known to be dropped (no ``</think>`` within ``think_tokens``) or
    has ``answer_tokens`` of answer after its first ``</think>``."""

    def __init__(self, tokenizer, prompt_length: int, settings: GenerationSettings):
        self.tokenizer, self.start, self.settings = tokenizer, prompt_length, settings
        self.closed_at: dict[int, int] = {}

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        produced = input_ids.shape[1] - self.start
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for row in range(input_ids.shape[0]):
            if row not in self.closed_at:
                # "</think>" is at most a few tokens: it shows in the text of the last eight
                tail = self.tokenizer.decode(input_ids[row, -8:], skip_special_tokens=True)
                if CLOSE in tail:
                    self.closed_at[row] = produced
            if row in self.closed_at:
                done[row] = produced - self.closed_at[row] >= self.settings.answer_tokens
            else:
                done[row] = produced >= self.settings.think_tokens
        return done


def generate_batch(
    loaded: LoadedModel, prompts: Sequence[CorpusPrompt], first_index: int, settings: GenerationSettings, seed: int
) -> list[Generation]:
    """Answer ``prompts`` in one batched ``generate`` call (sampling seeded with ``seed``)."""
    tokenizer = loaded.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    encoded = [generation_prompt(tokenizer, p.question) for p in prompts]
    width = max(map(len, encoded))
    ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded], device=loaded.device)
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded], device=loaded.device)
    limits = _RowLimits(tokenizer, width, settings)
    with torch.random.fork_rng(devices=[]), torch.inference_mode():
        torch.manual_seed(seed)
        out = loaded.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=settings.think_tokens + settings.answer_tokens,
            do_sample=settings.temperature > 0,
            temperature=settings.temperature or None,
            top_p=settings.top_p if settings.temperature > 0 else None,
            pad_token_id=pad,
            stopping_criteria=StoppingCriteriaList([limits]),
        )
    stops = {tokenizer.eos_token_id, pad}
    generations = []
    for row, prompt in enumerate(prompts):
        new = out[row, width:].tolist()
        end = next((i for i, t in enumerate(new) if t in stops), len(new))
        text = tokenizer.decode(new[:end], skip_special_tokens=True)
        generations.append(Generation(first_index + row, prompt.kind, prompt.question, text, end, is_answered(text)))
    return generations


def corpus_cache_path(loaded: LoadedModel, prompts: Sequence[CorpusPrompt], settings: GenerationSettings) -> Path:
    """Where the corpus of ``loaded`` for these prompts and settings is cached."""
    weights = loaded.quantization if loaded.backend == "none" else f"{loaded.quantization}-{loaded.backend}"
    name = f"{model_slug(loaded.name)}-{weights}-{prompt_set_digest(list(prompts))}-{settings.key()}"
    return cache_dir() / "dynts-corpus" / f"{name}.jsonl"


def build_corpus(
    loaded: LoadedModel,
    prompts: Sequence[CorpusPrompt],
    count: int,
    settings: GenerationSettings = GenerationSettings(),
    progress: Callable[[int, int], None] | None = None,
) -> list[Generation]:
    """The first ``count`` generations (prompt ``i`` is ``prompts[i % len(prompts)]``, so a count
    beyond the set samples it again), read from the cache where present and generated otherwise.

    ``progress(done, kept)`` is called after every batch, cached ones included.
    """
    if count < 1 or not prompts:
        raise ValueError("the corpus needs at least one prompt")
    path = corpus_cache_path(loaded, prompts, settings)
    size = settings.batch_size
    batches = _read_batches(path)
    corpus = [g for batch in batches for g in batch][:count]
    if progress is not None and corpus:
        progress(len(corpus), sum(g.kept for g in corpus))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        while len(batches) * size < count:
            first = len(batches) * size
            chunk = [prompts[i % len(prompts)] for i in range(first, first + size)]
            batch = generate_batch(loaded, chunk, first, settings, settings.seed + len(batches))
            fh.write(json.dumps([asdict(g) for g in batch], ensure_ascii=False) + "\n")
            fh.flush()
            batches.append(batch)
            corpus = [g for b in batches for g in b][:count]
            if progress is not None:
                progress(len(corpus), sum(g.kept for g in corpus))
    return corpus


def read_corpus(path: Path) -> list[Generation]:
    """Every generation of a corpus cache written by :func:`build_corpus` (whichever model or
    backend wrote it); :class:`ValueError` when ``path`` holds none."""
    text = path.read_text(encoding="utf-8")  # OSError when there is no such file
    generations = [g for batch in _parse(text.splitlines()) for g in batch]
    if not generations:
        raise ValueError("not a corpus cache (one JSON list of generations per line)")
    return generations


def _parse(lines: list[str]) -> list[list[Generation]]:
    """The batches of the leading whole lines."""
    batches = []
    for line in lines:
        try:
            batches.append([Generation(**g) for g in json.loads(line)])
        except (ValueError, TypeError):
            break
    return batches


def _read_batches(path: Path) -> list[list[Generation]]:
    """The whole batches cached at ``path`` (one JSON line each); a line cut short by a run that
    died while writing it is dropped, and the file rewritten without it."""
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    batches = _parse(lines)
    if len(batches) < len(lines):
        path.write_text(
            "".join(json.dumps([asdict(g) for g in b], ensure_ascii=False) + "\n" for b in batches), encoding="utf-8"
        )
    return batches
