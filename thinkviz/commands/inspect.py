"""``python -m thinkviz inspect TRACE``: turns, segments, think blocks and protection of a trace."""

from __future__ import annotations

import argparse
import json

from ..measure.inspection import format_report, inspect_trace
from ..models.loading import ModelLoadError
from ..models.sources import tokenizer_any
from ..measure.replay import TraceError, load_trace
from .common import CliError, command


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "trace", metavar="TRACE", help="a preset name, a trace file or a transcript (.json, .jsonl, ROLE: lines)"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (keys turns, segments, think_blocks, protected_tokens, reasoning)",
    )
    parser.add_argument(
        "--model",
        default="embedded",
        help="whose tokenizer and chat template: 'embedded', a .gguf file, ollama:NAME[:TAG], "
        "lmstudio:PUBLISHER/MODEL, a Hugging Face id or a local folder (only the tokenizer is loaded)",
    )
    parser.add_argument("--question", default=None, help="the question for an assistant-text trace file")
    parser.add_argument("--system", default=None, help="the system prompt for an assistant-text trace file")
    parser.add_argument("--no-protect-system", action="store_true", help="count the system prompt as evictable")
    parser.add_argument("--no-protect-question", action="store_true", help="count the user turns as evictable")


@command("inspect", configure)
def run(args: argparse.Namespace) -> int:
    """What ThinkViz sees in a trace or transcript (no forward pass): turns, segments, think blocks."""
    try:
        trace = load_trace(args.trace, args.question, args.system)
        side = tokenizer_any(args.model)
        report = inspect_trace(
            side.tokenizer, side.max_context, trace, not args.no_protect_system, not args.no_protect_question
        )
    except (TraceError, ModelLoadError) as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        print(format_report(trace.name, side.name, report), end="")
    return 0
