"""``python -m thinkviz train-predictor``: fit the DynTS importance predictor on the shipped traces."""

from __future__ import annotations

import argparse
import sys

from ..cli import CliError, add_model_args, command, load_from_args


def configure(parser: argparse.ArgumentParser) -> None:
    from ..predictor import EPOCHS, LEARNING_RATE

    add_model_args(parser)
    parser.add_argument("--holdout", default="math_tilings",
                        help="preset trace (file stem in presets/traces) kept out of training to measure on")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--lr", type=float, default=LEARNING_RATE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None,
                        help="where to write the predictor (default: assets/dynts_<model>.safetensors)")


def reasoning_traces() -> dict[str, object]:
    """Each shipped trace or transcript with a ``</think>`` (an answer to label with), as replayed
    by its first preset: ``{trace file stem: thinkviz.replay.Trace}``."""
    from ..presets import PRESETS_DIR, list_presets, load_preset
    from ..replay import load_trace

    by_text = {}
    for name in list_presets():
        preset = load_preset(name)
        if preset.mode == "replay" and preset.trace and preset.trace not in by_text:
            by_text[preset.trace] = load_trace(name)
    traces = {}
    for path in sorted((PRESETS_DIR / "traces").glob("*.md")):
        trace = by_text.get(path.read_text(encoding="utf-8"))
        if trace is None:
            continue
        texts = [trace.text] if trace.messages is None else [m.content for m in trace.messages]
        if any("</think>" in text for text in texts):
            traces[path.stem] = trace
    return traces


@command("train-predictor", configure)
def run(args: argparse.Namespace) -> int:
    """Train the DynTS importance predictor for a model on the preset traces (one held out)."""
    import torch
    from tqdm import tqdm

    from .. import predictor as P

    if args.epochs < 1 or args.lr <= 0:
        raise CliError("--epochs must be at least 1 and --lr positive")
    traces = reasoning_traces()
    if args.holdout not in traces:
        raise CliError(f"--holdout {args.holdout!r} is not a reasoning trace; choose one of: {', '.join(traces)}")
    if len(traces) < 2:
        raise CliError("training needs at least two reasoning traces (one is held out)")
    loaded = load_from_args(args)
    examples = {}
    for stem in tqdm(traces, desc="replaying traces (full cache)", unit="trace", file=sys.stderr):
        trace = traces[stem]
        if trace.messages is not None:
            examples[stem] = P.collect_transcript_examples(loaded, stem, trace.messages)
        else:
            examples[stem] = P.collect_examples(loaded, stem, trace.system, trace.question, trace.text)
    training = [e for stem, e in examples.items() if stem != args.holdout]
    with tqdm(total=args.epochs, desc="training", unit="epoch", file=sys.stderr) as bar:
        def progress(epoch: int, loss: float) -> None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")

        model = P.train(training, epochs=args.epochs, lr=args.lr, seed=args.seed, progress=progress)
    held = examples[args.holdout]
    with torch.inference_mode():
        predicted = model(held.features)
    thinking = held.thinking
    rho_thinking = P.spearman(predicted[thinking], held.labels[thinking])
    rho_all = P.spearman(predicted, held.labels)
    rho_fallback = P.spearman(held.attention_so_far[thinking], held.labels[thinking])
    rho_recency = P.spearman(torch.arange(len(held.labels))[thinking], held.labels[thinking])
    meta = P.PredictorMeta(
        model=loaded.name,
        hidden_size=held.features.shape[1],
        width=model.width,
        heldout_spearman=rho_thinking,
        trained_on=",".join(e.name for e in training),
    )
    path = P.save(model, meta, args.output or P.predictor_path(loaded.name))
    n_train = sum(len(e.labels) for e in training)
    print(f"model: {loaded.name} ({loaded.quantization}, {loaded.device}); trained on {n_train} tokens "
          f"of {len(training)} traces ({meta.trained_on})")
    print(f"held-out trace {args.holdout}: Spearman rank correlation with attention from the answer = "
          f"{rho_thinking:.3f} over its {int(thinking.sum())} thinking tokens, {rho_all:.3f} over all "
          f"{len(held.labels)} tokens before the answer")
    print(f"  baselines on the same thinking tokens: attention received so far (the fallback) "
          f"{rho_fallback:.3f}, recency (position) {rho_recency:.3f}")
    print(f"predictor written to {path}")
    return 0
