"""The CLI run in this process, seen as a shell sees it: exit status, stdout and stderr.

Refusing bad input is the CLI's job before anything loads, so those tests need no new Python
process (which costs seconds of imports each): :func:`run_cli` calls :func:`thinkviz.cli.main`
with stdout and stderr captured, and with ``before_loading`` any model load fails the test.
A few end-to-end tests still start ``python -m thinkviz`` itself.
"""

from __future__ import annotations

import io
from contextlib import ExitStack, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from unittest import mock

from thinkviz.models import random_weights
from thinkviz.cli import main


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def _refuse(*args, **kwargs):
    raise AssertionError("the model was loaded before the input was checked")


def run_cli(*args: str, before_loading: bool = False) -> CliResult:
    """``python -m thinkviz ARGS`` in this process; ``before_loading``: loading a model is a failure."""
    out, err = io.StringIO(), io.StringIO()
    with ExitStack() as stack:
        if before_loading:
            stack.enter_context(mock.patch.object(random_weights, "load_model", _refuse))
            stack.enter_context(mock.patch.object(random_weights, "load_random", _refuse))
        stack.enter_context(redirect_stdout(out))
        stack.enter_context(redirect_stderr(err))
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's own exits (--help, usage errors)
            code = exc.code if isinstance(exc.code, int) else 1
    return CliResult(code, out.getvalue(), err.getvalue())
