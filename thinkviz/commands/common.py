"""What every subcommand shares: the one-line user error, the model and policy argument groups,
the model and policy they name, and the registry :mod:`thinkviz.cli` builds its parser from.

A subcommand is a module in this package that calls :func:`command` with its argument setup
and its ``run(args) -> exit code``; :mod:`thinkviz.cli` imports it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from ..core.kvquant import RESIDUAL, RESIDUAL_RANGE, KVQuant, KVQuantError, format_names
from ..memory import VramCapError, set_vram_cap
from ..models.loading import BACKENDS, QUANTIZATIONS, ModelLoadError
from ..policies import PolicyConfigError, make_policy, policy_names
from ..models.sources import load_any


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


def parse_param(text: str) -> tuple[str, str]:
    """``key=value`` → ``(key, value)`` for ``--param``."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="embedded",
        help="'embedded', a .gguf file, ollama:NAME[:TAG] or lmstudio:PUBLISHER/MODEL (see "
        "'python -m thinkviz models'), a Hugging Face id, a local folder, or random:Qwen3-4B (that "
        "geometry with random weights: real memory and speed, no text)",
    )
    parser.add_argument("--quant", default="4bit", choices=QUANTIZATIONS, help="weight quantization")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument(
        "--quant-backend",
        default="auto",
        choices=BACKENDS,
        help="who holds 4-bit weights: auto (default: torch-int4 on an AVX512 CPU, else "
        "bitsandbytes), bitsandbytes (NF4) or torch-int4 (PyTorch's int4 kernel, CPU only)",
    )
    parser.add_argument(
        "--vram-cap",
        type=float,
        default=None,
        metavar="GiB",
        help="simulate a card of GiB: cap this process's CUDA memory (weights included)",
    )


def add_policy_args(parser: argparse.ArgumentParser, default_policy: str = "h2o") -> None:
    parser.add_argument("--policy", default=default_policy, help=f"one of: {', '.join(policy_names())}")
    parser.add_argument("--budget", type=int, default=256, help="tokens kept per layer and kv-head")
    parser.add_argument(
        "--budget-mode",
        choices=("tokens", "fraction"),
        default=None,
        help="tokens: keep --budget tokens (the default); fraction: keep --budget-fraction of the tokens seen so far",
    )
    parser.add_argument(
        "--budget-fraction",
        type=float,
        default=None,
        metavar="F",
        help="share of the tokens seen so far to keep, 0.01-1 (implies --budget-mode fraction)",
    )
    parser.add_argument("--interval", type=int, default=1, help="compress every N steps")
    add_param_arg(
        parser,
        "a policy parameter, e.g. --param recent=32, or a choice by name (repeatable; "
        "'python -m thinkviz policies' lists each policy's parameters, ranges and choices)",
    )
    add_protect_args(parser)


def add_param_arg(parser: argparse.ArgumentParser, help_text: str) -> None:
    """``--param KEY=VALUE``, repeatable: a policy knob set by hand."""
    parser.add_argument("--param", type=parse_param, action="append", default=[], metavar="KEY=VALUE", help=help_text)


def add_protect_args(parser: argparse.ArgumentParser) -> None:
    """``--no-protect-system`` and ``--no-protect-question``: let the policy evict the prompt's parts."""
    parser.add_argument("--no-protect-system", action="store_true", help="allow evicting the system prompt")
    parser.add_argument("--no-protect-question", action="store_true", help="allow evicting the question")


def add_trace_limit_arg(parser: argparse.ArgumentParser) -> None:
    """``--max-trace-tokens N``: replay a trace's first N tokens only (read by :func:`trace_limit_from_args`)."""
    parser.add_argument(
        "--max-trace-tokens",
        type=int,
        default=None,
        metavar="N",
        help="replay only the first N tokens of each trace (a cheaper subset)",
    )


def trace_limit_from_args(args: argparse.Namespace) -> int | None:
    """``--max-trace-tokens``: ``None`` (the whole trace) or at least 1; :class:`CliError` otherwise."""
    if args.max_trace_tokens is not None and args.max_trace_tokens < 1:
        raise CliError(f"--max-trace-tokens must be at least 1, got {args.max_trace_tokens}")
    return args.max_trace_tokens


def add_kv_quant_args(parser: argparse.ArgumentParser, several: bool = False) -> None:
    """``--kv-quant FORMAT`` (or ``--kv-quants A,B`` when ``several``) and ``--kv-residual N``."""
    names = ", ".join(format_names())
    if several:
        parser.add_argument(
            "--kv-quants",
            default="none",
            metavar="FORMATS",
            help=f"comma-separated KV-cache formats to sweep, from: {names} (default: none)",
        )
    else:
        parser.add_argument(
            "--kv-quant",
            default="none",
            metavar="FORMAT",
            help=f"KV-cache storage format, one of: {names} (default: none, full precision)",
        )
    low, high = RESIDUAL_RANGE
    parser.add_argument(
        "--kv-residual",
        type=int,
        default=RESIDUAL,
        metavar="N",
        help=f"KIVI: newest tokens kept at full precision ({low}-{high}; default {RESIDUAL}, KIVI's own)",
    )


def kv_quant_from_args(args: argparse.Namespace) -> KVQuant:
    """The ``--kv-quant`` format; :class:`CliError` for an unknown format or residual."""
    try:
        return KVQuant.parse(args.kv_quant, args.kv_residual)
    except KVQuantError as exc:
        raise CliError(str(exc)) from None


def policy_from_args(args: argparse.Namespace, name: str | None = None, budget: int | None = None):
    """Build the policy named on the command line; :class:`CliError` on bad values."""
    values = dict(args.param)
    if args.budget_fraction is not None:
        values["budget_fraction"] = args.budget_fraction
    if args.budget_mode is not None or args.budget_fraction is not None:
        values["budget_mode"] = args.budget_mode or "fraction"
    values.update(
        budget=args.budget if budget is None else budget,
        interval=args.interval,
        protect_system=not args.no_protect_system,
        protect_question=not args.no_protect_question,
    )
    try:
        return make_policy(name or args.policy, **values)
    except PolicyConfigError as exc:
        raise CliError(str(exc)) from None


def load_from_args(args: argparse.Namespace):
    """Load the model named on the command line, reporting progress on stderr; with
    ``--vram-cap`` the cap is set first, so the weights count against the simulated card."""
    if args.vram_cap is not None:
        try:
            cap = set_vram_cap(args.vram_cap, args.device)
        except VramCapError as exc:
            raise CliError(str(exc)) from None
        print(f"[    ] CUDA memory capped at {args.vram_cap:g} GiB ({cap} bytes)", file=sys.stderr)
    try:
        return load_any(
            args.model,
            args.quant,
            args.device,
            progress=lambda f, msg: print(f"[{f:4.0%}] {msg}", file=sys.stderr),
            backend=args.quant_backend,
        )
    except ModelLoadError as exc:
        raise CliError(str(exc)) from None


COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def command(name: str, configure: Callable[[argparse.ArgumentParser], None]):
    """Register ``run(args) -> exit code`` as subcommand ``name`` with its argument setup."""

    def decorate(run: Callable[[argparse.Namespace], int]):
        COMMANDS[name] = (configure, run)
        return run

    return decorate
