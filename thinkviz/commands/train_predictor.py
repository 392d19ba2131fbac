"""``python -m thinkviz train-predictor``: build the corpus, fit the DynTS predictor and measure
it on traces it never saw.

The corpus is the model's own reasoning on the committed prompt set (``--generate N``,
cached); ``--histories N`` long conversations chained from its training answers
(:mod:`.predictor_training.histories`), shipped traces that are not held out and any ``--add``
trace join it.  The held-out
traces (every shipped one by default, or those ``--holdout`` names; a shipped trace one of them
holds leaves training) and every fifth answered generation
(``--holdout-corpus``) are only measured: one table of Spearman and precision at 30 % for the
predictor and its baselines, printed and written beside the predictor as
``dynts_<model>.eval.json``.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from .. import predictor as P
from ..text.chat import REASONING_SYSTEM_PROMPT
from .common import CliError, add_model_args, command, load_from_args
from ..demos.presets import PRESETS_DIR, list_presets, load_preset
from ..measure.replay import Trace, TraceError, load_trace
from .predictor_training import corpus as C
from .predictor_training import evaluate as E
from .predictor_training import histories as H
from .predictor_training.fit import EPOCHS, LEARNING_RATE, WIDTH, train
from .predictor_training.labels import check_answered, label_trace, label_transcript
from .predictor_training.prompts import corpus_prompts

DEFAULT_CORPUS = 440  # the committed predictor's corpus: every prompt of the set answered twice
DEFAULT_HISTORIES = 40  # long conversations chained from the corpus's training answers
LAYER_COUNT = 6  # --layers auto: how many hidden states the predictor mixes


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    parser.add_argument(
        "--generate",
        type=int,
        default=DEFAULT_CORPUS,
        metavar="N",
        help="answer N prompts of the committed set with the model (the set is sampled again "
        "past its end; cached under the user's cache directory); 0: no corpus",
    )
    parser.add_argument(
        "--corpus",
        default=None,
        metavar="FILE",
        help="read the generated text from FILE (a corpus cache --generate wrote, for example under "
        "another 4-bit backend) instead of generating; it is labelled under the loaded model",
    )
    parser.add_argument(
        "--think-tokens",
        type=int,
        default=C.GenerationSettings.think_tokens,
        metavar="N",
        help="a generation that has not closed </think> after N new tokens is dropped",
    )
    parser.add_argument(
        "--answer-tokens",
        type=int,
        default=C.GenerationSettings.answer_tokens,
        metavar="N",
        help="answers are cut after N tokens",
    )
    parser.add_argument(
        "--histories",
        type=int,
        default=DEFAULT_HISTORIES,
        metavar="N",
        help=f"also train on N long conversations ({H.TOKENS[0]}-{H.TOKENS[1]} tokens) chained from the "
        "corpus's training answers, so the predictor sees long contexts; 0: none",
    )
    parser.add_argument(
        "--add",
        action="append",
        default=[],
        metavar="TRACE",
        help="a preset name or a trace file (assistant text: thinking, </think>, answer; or a transcript) "
        "added to the training data (repeatable; refused when it holds a held-out trace)",
    )
    parser.add_argument(
        "--holdout",
        action="append",
        default=None,
        metavar="TRACE",
        help="a trace kept out of training and measured on: a shipped one (file stem in presets/traces), "
        "a preset or a trace file (repeatable; default: every shipped reasoning trace)",
    )
    parser.add_argument(
        "--holdout-corpus",
        type=float,
        default=0.2,
        metavar="FRACTION",
        help="share of the answered corpus generations kept out of training and measured on "
        "(every k-th by index, k = 1/FRACTION; 0: none)",
    )
    parser.add_argument(
        "--layers",
        default="auto",
        help="comma-separated hidden-state layers the predictor mixes (0 = embeddings, -1 = the "
        f"final norm), or auto (the default): {LAYER_COUNT} evenly spaced from the embeddings to the final one",
    )
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--lr", type=float, default=LEARNING_RATE)
    parser.add_argument("--width", type=int, default=WIDTH)
    parser.add_argument("--seed", type=int, default=0, help="seed of the corpus sampler and of the fit")
    parser.add_argument(
        "--output", default=None, help="where to write the predictor (default: assets/dynts_<model>.safetensors)"
    )
    parser.add_argument(
        "--evaluate-only",
        action="store_true",
        help="measure the predictor at --output (default: the shipped one) on the held-out traces "
        "with this model, quantization and backend; train and write nothing",
    )


def reasoning_traces() -> dict[str, Trace]:
    """Each shipped trace or transcript with a ``</think>`` (an answer to label with), as replayed
    by its first preset: ``{trace file stem: thinkviz.measure.replay.Trace}``."""
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
        if _answered(trace):
            traces[path.stem] = trace
    return traces


def _answered(trace: Trace) -> bool:
    """Whether ``trace`` has an answer to label its thinking with (:func:`.labels.check_answered`)."""
    try:
        check_answered(trace)
    except ValueError:
        return False
    return True


def _read(flag: str, spec: str) -> Trace:
    """The trace ``spec`` names (a preset or a file), answered; :class:`CliError` naming ``flag`` if not."""
    try:
        trace = load_trace(spec)
    except TraceError as exc:
        raise CliError(f"{flag} {spec}: {exc}") from None
    try:
        check_answered(trace)
    except ValueError as exc:
        raise CliError(
            f"{flag} {spec}: no answer after a </think> in an assistant turn to label its thinking with ({exc})"
        ) from None
    return trace


def _layers(text: str, depth: int) -> tuple[int, ...]:
    """The hidden-state indices ``--layers`` names for a model of ``depth`` decoder layers."""
    if text == "auto":
        return tuple(sorted({round(i * depth / (LAYER_COUNT - 1)) for i in range(LAYER_COUNT)}))
    try:
        layers = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise CliError(f"--layers takes comma-separated integers, got {text!r}") from None
    if len(set(i % (depth + 1) for i in layers)) != len(layers):
        raise CliError(f"--layers names a layer twice: {text!r}")
    if any(not -depth - 1 <= i <= depth for i in layers):
        raise CliError(f"--layers must lie in -{depth + 1} .. {depth} for a model of {depth} layers")
    return layers


def _check(args: argparse.Namespace, traces: dict[str, Trace]) -> dict[str, Trace]:
    """The held-out traces by name; :class:`CliError` for bad values (before any model is loaded)."""
    if args.epochs < 1 or args.lr <= 0 or args.width < 1:
        raise CliError("--epochs and --width must be at least 1 and --lr positive")
    if args.generate < 0 or args.histories < 0:
        raise CliError("--generate and --histories must be 0 or more")
    if args.think_tokens < 1 or args.answer_tokens < 1:
        raise CliError("--think-tokens and --answer-tokens must be at least 1")
    if not 0 <= args.holdout_corpus < 1:
        raise CliError("--holdout-corpus must be at least 0 and below 1")
    holdout = {}
    for spec in args.holdout or list(traces):
        if spec in traces:
            holdout[spec] = traces[spec]
            continue
        try:
            trace = _read("--holdout", spec)
        except CliError as exc:
            raise CliError(f"{exc} (the shipped traces: {', '.join(traces)})") from None
        holdout[spec if trace.name in holdout or trace.name in traces else trace.name] = trace
    return holdout


def _overlap(one: Trace, other: Trace) -> bool:
    """Whether one trace holds every assistant turn of the other (a preset replaying a trace file,
    that file, a transcript around its reasoning): training on one teaches the other."""
    turns = [
        {m.content.strip() for m in t.conversation if m.role == "assistant" and m.content.strip()} for t in (one, other)
    ]
    return bool(turns[0] and turns[1]) and (turns[0] <= turns[1] or turns[1] <= turns[0])


def _training_traces(specs: list[str], traces: dict[str, Trace], holdout: dict[str, Trace]) -> dict[str, Trace]:
    """The shipped traces that no held-out trace overlaps and the ``--add`` traces, by name;
    :class:`CliError` for an added one that cannot be read, that overlaps a held-out trace (the
    table would measure the predictor on what it was trained on) or one already trained on."""
    chosen = {name: t for name, t in traces.items() if not any(_overlap(t, held) for held in holdout.values())}
    for spec in specs:
        trace = _read("--add", spec)
        held = next((name for name, t in holdout.items() if _overlap(trace, t)), None)
        if held is not None:
            raise CliError(
                f"--add {spec} holds the reasoning of the held-out trace {held}: the table would measure "
                f"the predictor on what it was trained on; drop --add {spec} or hold out other traces"
            )
        repeated = next((name for name, t in chosen.items() if _overlap(trace, t)), None)
        if repeated is not None:
            raise CliError(f"--add {spec} repeats {repeated}, which is already trained on")
        chosen[spec] = trace
    return chosen


def _corpus(args: argparse.Namespace, loaded) -> list[C.Generation]:
    """The kept generations of the corpus ``--generate`` asks for, with a progress bar and the keep rate."""
    if not args.generate:
        return []
    if args.corpus:
        try:
            generations = C.read_corpus(Path(args.corpus))[: args.generate]
        except (OSError, ValueError) as exc:
            raise CliError(f"--corpus {args.corpus}: {exc}") from None
        kept = [g for g in generations if g.kept]
        print(f"corpus: {len(kept)} answered of {len(generations)} generations read from {args.corpus}")
        return kept
    settings = C.GenerationSettings(seed=args.seed, think_tokens=args.think_tokens, answer_tokens=args.answer_tokens)
    with tqdm(total=args.generate, desc="corpus (the model answers)", unit="prompt", file=sys.stderr) as bar:

        def progress(done: int, kept: int) -> None:
            bar.update(done - bar.n)
            bar.set_postfix(kept=kept)

        generations = C.build_corpus(loaded, corpus_prompts(), args.generate, settings, progress)
    kept = [g for g in generations if g.kept]
    totals, kinds = Counter(g.kind for g in generations), Counter(g.kind for g in kept)
    print(
        f"corpus: {len(kept)} of {len(generations)} generations closed </think> and answered "
        f"({len(kept) / len(generations):.0%}; "
        + ", ".join(f"{k} {kinds[k]}/{n}" for k, n in totals.items())
        + f"); cached in {C.corpus_cache_path(loaded, corpus_prompts(), settings)}"
    )
    return kept


@command("train-predictor", configure)
def run(args: argparse.Namespace) -> int:
    """Train the DynTS importance predictor on the model's own reasoning and measure it on held-out traces."""
    traces = reasoning_traces()
    holdout = _check(args, traces)
    extra = _training_traces(args.add, traces, holdout)
    path = Path(args.output) if args.output else None
    loaded = load_from_args(args)
    path = path or P.predictor_path(loaded.name)
    layers = _layers(args.layers, loaded.geometry.layers)

    def label(name: str, trace: Trace):
        try:
            if trace.messages is not None:
                return label_transcript(loaded, name, trace.messages, layers)
            return label_trace(loaded, name, trace.system, trace.question, trace.text, layers)
        except ValueError as exc:
            raise CliError(f"{name} cannot be labelled: {exc}") from None

    if args.evaluate_only:
        try:
            model, meta = P.load(path)
        except P.PredictorError as exc:
            raise CliError(str(exc)) from None
        heldout = {name: [label(name, trace)] for name, trace in holdout.items()}
        print(f"{path.name} ({meta.trained_on}) on {loaded.name} ({loaded.quantization}, {loaded.backend}):")
        print(E.format_table(E.scorer_table(heldout, model)))
        return 0
    generations = _corpus(args, loaded)
    every = round(1 / args.holdout_corpus) if args.holdout_corpus else 0
    labelled = [
        (g, label(f"corpus #{g.index}", Trace(g.question, REASONING_SYSTEM_PROMPT, g.question, g.text)))
        for g in tqdm(generations, desc="labelling the corpus", unit="trace", file=sys.stderr)
    ]
    training = [e for g, e in labelled if not every or g.index % every]
    held_corpus = [e for g, e in labelled if every and not g.index % every]
    histories = H.build_histories(
        [g for g in generations if not every or g.index % every], args.histories, seed=args.seed
    )
    training += [
        label_transcript(loaded, f"history {k}", messages, layers)
        for k, messages in enumerate(tqdm(histories, desc="labelling histories", unit="history", file=sys.stderr))
    ]
    training += [label(name, t) for name, t in extra.items()]
    if not training:
        raise CliError("nothing to train on: use --generate N, --add TRACE or hold out fewer traces")
    heldout = {name: [label(name, trace)] for name, trace in holdout.items()}
    if held_corpus:
        heldout[f"corpus ({len(held_corpus)} held out)"] = held_corpus
    with tqdm(total=args.epochs, desc="training", unit="epoch", file=sys.stderr) as bar:

        def step(epoch: int, loss: float) -> None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")

        model = train(training, layers, epochs=args.epochs, lr=args.lr, width=args.width, seed=args.seed, progress=step)
    table = E.scorer_table(heldout, model)
    n_tokens = sum(int(e.thinking.sum()) for e in training)
    described = (
        f"{len(generations) - len(held_corpus)} corpus generations, {len(histories)} histories of them"
        + "".join(f", {name}" for name in extra)
    )
    meta = P.PredictorMeta(
        model=loaded.name,
        hidden_size=int(training[0].features.shape[-1]),
        width=args.width,
        layers=layers,
        heldout_spearman=table["scorers"]["predictor"]["spearman"],
        trained_on=described,
    )
    P.save(model, meta, path)
    E.write_table(table, P.eval_path(path))
    print(
        f"model: {loaded.name} ({loaded.quantization}, {loaded.backend}, {loaded.device}); trained on {n_tokens} "
        f"thinking tokens of {described}; layers {','.join(map(str, layers))}"
    )
    print("held-out traces (Spearman with attention from the answer, precision at 30 %, thinking tokens):")
    print(E.format_table(table))
    print(f"predictor written to {path}, evaluation to {P.eval_path(path)}")
    return 0
