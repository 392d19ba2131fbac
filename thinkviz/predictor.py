"""The DynTS importance predictor and its file: what ``dynts`` loads at run time.

DynTS ("Dynamic Thinking-Token Selection for Efficient Reasoning in Large Reasoning Models")
observes that few thinking tokens steer the answer and trains a small head on the
model's hidden state to spot them while they are generated.  Here:

- model: a learned softmax mix of the hidden states of ``layers`` (each standardised with
  the training set's mean and spread) and four position features (:func:`position_features`:
  where the token sits in the text so far, the log of its age, of its position and of the
  text's length), then ``d + 4 → width → 1`` (GELU), predicting the ``log`` of the attention
  the answer will pay the token, up to a constant per trace (:class:`ImportancePredictor`);
- files: safetensors (tensors only, never pickle) with metadata naming the model, its hidden
  size and the layers read, so a predictor for another model is refused (:func:`find_predictor`);
  its evaluation table lies beside it (:func:`eval_path`);
- blend (:func:`blend`): the predictor's output and the log of the attention a token has
  received so far, each standardised over the tokens ranked, summed with weight
  :data:`BLEND_WEIGHT` on the predictor — the two carry different evidence (what the hidden
  state says of a token, what the thinking so far did with it); on the embedded model the sum
  ranks held-out traces better than either alone on average, though not on every trace.

Training and evaluation live in :mod:`thinkviz.commands.predictor_training`, driven by
``python -m thinkviz train-predictor``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

FORMAT = "thinkviz-dynts"
VERSION = "3"  # 3: four position features (2 read the relative position only)
ASSETS = Path(__file__).resolve().parent.parent / "assets"


class PredictorError(ValueError):
    """A predictor file is missing, unreadable or made for another model; one-line message."""


class ImportancePredictor(nn.Module):
    """``(N, k, d)`` hidden states of the ``k`` layers in ``layers`` (``(N, d)`` when ``k == 1``)
    and ``(N, 4)`` position features (:func:`position_features`) → ``(N,)`` predicted ``log``
    attention from the answer, centred per trace (only the order within one trace is learned).

    ``layers`` index the model's ``hidden_states`` (``0`` the embeddings, ``-1`` the final
    norm's output).  ``mean`` / ``std`` ``(k, d)`` standardise each layer (buffers, saved with
    the weights); ``mix`` ``(k,)`` are the logits of the layer weights.

    The first linear layer is split in two: :meth:`encode` is its hidden-state part ``(N, width)``,
    fixed once a token is written, and :meth:`head` adds the position part (which changes as the
    text grows) and runs the rest.  A run keeps only the encoding of each token — ``width``
    numbers instead of ``k · d`` — and ranks from it; ``forward`` is the two in a row.
    """

    def __init__(self, hidden_size: int, width: int = 64, layers: tuple[int, ...] = (-1,)) -> None:
        super().__init__()
        self.hidden_size, self.width, self.layers = hidden_size, width, tuple(layers)
        self.register_buffer("mean", torch.zeros(len(self.layers), hidden_size))
        self.register_buffer("std", torch.ones(len(self.layers), hidden_size))
        self.mix = nn.Parameter(torch.zeros(len(self.layers)))
        self.net = nn.Sequential(nn.Linear(hidden_size + POSITION_FEATURES, width), nn.GELU(), nn.Linear(width, 1))

    def encode(self, hidden: torch.Tensor) -> torch.Tensor:
        """``(N, k, d)`` hidden states (``(N, d)`` when ``k == 1``) → ``(N, width)``: the mixed,
        standardised states through the hidden-state columns of the first layer (no bias)."""
        if hidden.dim() == 2:
            hidden = hidden.unsqueeze(1)
        standard = (hidden.float() - self.mean) / self.std  # (N, k, d)
        mixed = torch.einsum("k,nkd->nd", self.mix.softmax(0), standard)
        return mixed @ self.net[0].weight[:, : self.hidden_size].T

    def head(self, encoded: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
        """``(N, width)`` encodings (:meth:`encode`) and ``(N, 4)`` position features → ``(N,)``."""
        first = self.net[0]
        inner = encoded + where.float() @ first.weight[:, self.hidden_size :].T + first.bias
        return self.net[2](self.net[1](inner)).squeeze(-1)

    def forward(self, hidden: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
        return self.head(self.encode(hidden), where)


POSITION_FEATURES = 4
_LOG_SCALE = 8.0  # log(3000) ≈ 8: the log features of a few thousand tokens lie near [0, 1]


# The predictor's weight in blend(): picked by 4-fold cross-validation over the training
# histories (1.5 and 2 tie; the smaller one), never on a held-out trace (docs/benchmarks.md).
BLEND_WEIGHT = 1.5


def blend(
    attention: torch.Tensor, predicted: torch.Tensor, weight: float = BLEND_WEIGHT, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """``z(log attention) + weight · z(predicted)`` along the last axis (``attention`` > 0 the
    attention received per query, ``predicted`` the predictor's log importance, broadcast to one
    shape); ``z`` standardises over the entries ``valid`` marks (all when ``None``), so only the
    order within each row and the two scores' relative weight matter.  Entries outside ``valid``
    come out NaN."""
    held = torch.ones_like(attention, dtype=torch.bool) if valid is None else valid.expand_as(attention)
    total = _standard(attention.float().clamp(min=1e-30).log(), held) + weight * _standard(
        predicted.float().expand_as(attention), held
    )
    return total.masked_fill(~held, math.nan)


def _standard(values: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """``values`` less their mean over ``held``, over their spread (1 where it vanishes), per row."""
    count = held.sum(-1, keepdim=True).clamp(min=1)
    kept = values.masked_fill(~held, 0.0)
    mean = kept.sum(-1, keepdim=True) / count
    spread = ((kept - mean).masked_fill(~held, 0.0).square().sum(-1, keepdim=True) / count).sqrt()
    return (values - mean) / torch.where(spread > 0, spread, torch.ones_like(spread))


def position_features(n: int) -> torch.Tensor:
    """``(n, 4)`` for each of ``n`` tokens seen so far: position ÷ ``n`` (in ``[0, 1)``),
    ``log(1 + age)``, ``log(1 + position)`` and ``log n``, the logs ÷ 8.  Age (``n`` − position)
    is what the answer's attention fades with in a long text; the relative position alone
    cannot tell a token 50 tokens back in a 300-token answer from one 500 back in 3,000."""
    positions = torch.arange(n, dtype=torch.float32)
    logs = torch.stack([torch.log1p(n - positions), torch.log1p(positions), torch.full((n,), math.log(max(n, 1)))], 1)
    return torch.cat([(positions / n)[:, None], logs / _LOG_SCALE], dim=1)


@dataclass(frozen=True)
class PredictorMeta:
    """What a predictor file says about itself."""

    model: str
    hidden_size: int
    width: int
    layers: tuple[int, ...] = (-1,)
    heldout_spearman: float = math.nan
    trained_on: str = ""


def model_slug(model_name: str) -> str:
    """``"SmolLM2-135M-Instruct (embedded)"`` → ``"smollm2-135m-instruct-embedded"``."""
    return re.sub(r"[^a-z0-9]+", "-", model_name.lower()).strip("-") or "model"


def predictor_path(model_name: str, folder: Path = ASSETS) -> Path:
    """Where the predictor for ``model_name`` lives."""
    return folder / f"dynts_{model_slug(model_name)}.safetensors"


def eval_path(predictor_file: str | Path) -> Path:
    """The evaluation table written beside a predictor file (``dynts_<model>.eval.json``)."""
    path = Path(predictor_file)
    return path.with_name(path.name.removesuffix(".safetensors") + ".eval.json")


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
            "layers": ",".join(map(str, meta.layers)),
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
            layers=tuple(int(i) for i in header["layers"].split(",")),
            heldout_spearman=float(header.get("heldout_spearman", "nan")),
            trained_on=header.get("trained_on", ""),
        )
        predictor = ImportancePredictor(meta.hidden_size, meta.width, meta.layers)
        predictor.load_state_dict(tensors, strict=True)
    except (KeyError, ValueError, RuntimeError) as exc:
        raise PredictorError(f"{path.name} is damaged ({str(exc).splitlines()[0]})") from None
    return predictor.eval(), meta


def find_predictor(
    model_name: str, hidden_size: int, folder: Path = ASSETS, depth: int | None = None
) -> ImportancePredictor:
    """The predictor trained for ``model_name``; :class:`PredictorError` says why there is none
    (also when it reads a hidden state a model of ``depth`` decoder layers does not have)."""
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
    if depth is not None and any(not -depth - 1 <= i <= depth for i in meta.layers):
        raise PredictorError(
            f"{path.name} reads hidden states {','.join(map(str, meta.layers))}, "
            f"but {model_name} has only 0 .. {depth} (embeddings, {depth} layers)"
        )
    return predictor


def content_digest(path: Path) -> str:
    """A short digest of a file's content: its bytes, except that a ``.safetensors`` file's JSON
    header is read with its keys sorted — safetensors writes the metadata in an arbitrary order,
    so the same tensors and metadata saved twice differ in bytes but not here."""
    data = path.read_bytes()
    if path.suffix == ".safetensors" and len(data) >= 8:
        size = int.from_bytes(data[:8], "little")
        try:
            header = json.loads(data[8 : 8 + size])
        except ValueError:
            pass  # not a readable header: the bytes are the content
        else:
            data = json.dumps(header, sort_keys=True).encode() + data[8 + size :]
    return hashlib.sha256(data).hexdigest()[:16]
