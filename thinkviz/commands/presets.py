"""``python -m thinkviz presets record [PRESET …]``: the committed recordings the app plays at once.

Each preset is run on the embedded model in 4 bits, as the Live tab (its policy, fidelity measured
against the full cache) and the Compare tab (its columns) would run it, and saved as
``presets/recordings/<preset>.zip`` (:mod:`thinkviz.demos.recordings`).  ``presets check`` reads every
recording back and says which are missing or stale, without a model.  Recording every preset takes
the better part of an hour on a shared 2-core CPU: run it niced, with ``OMP_NUM_THREADS=1``.
"""

from __future__ import annotations

import argparse
import sys
import time

from ..models.loading import load_model
from ..demos.presets import list_presets
from ..demos.recordings import RECORDINGS_DIR, recording_path, save
from ..demos.record import RECORDING_MODEL, record_preset, recording_problem
from ..units import format_bytes
from .common import CliError, command


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    record = actions.add_parser("record", help="run presets on the embedded model and save their recordings")
    record.add_argument("names", nargs="*", metavar="PRESET", help="only these presets (default: all)")
    record.add_argument("--stale", action="store_true", help="only presets whose recording is missing or stale")
    check = actions.add_parser("check", help="say which recordings are missing or stale (no model needed)")
    check.add_argument("names", nargs="*", metavar="PRESET", help="only these presets (default: all)")


def _names(given: list[str]) -> list[str]:
    known = list_presets()
    unknown = [name for name in given if name not in known]
    if unknown:
        raise CliError(f"unknown preset {', '.join(map(repr, unknown))}; available: {', '.join(known)}")
    return given or known


def _total() -> str:
    files = sorted(RECORDINGS_DIR.glob("*.zip"))
    return f"{len(files)} recordings, {format_bytes(sum(f.stat().st_size for f in files))} in {RECORDINGS_DIR}"


def _reporter(name: str):
    """A progress callback printing where recording ``name`` is, every ten seconds, on stderr."""
    last = [0.0]

    def progress(phase: str, done: int, total: int) -> None:
        if time.monotonic() - last[0] > 10:
            last[0] = time.monotonic()
            print(f"  {name}: {phase} {done}/{total}", file=sys.stderr)

    return progress


@command("presets", configure)
def presets(args: argparse.Namespace) -> int:
    """Record the presets' demo runs (presets record), or check the recordings (presets check)."""
    names = _names(args.names)
    if args.action == "check":
        problems = {name: recording_problem(name) for name in names}
        for name, problem in problems.items():
            print(f"{name}: {problem or 'ok'}")
        print(_total())
        return 1 if any(problems.values()) else 0
    if args.stale:
        names = [name for name in names if recording_problem(name) is not None]
    if not names:
        print("every recording is current; nothing to record")
        return 0
    model, quantization = RECORDING_MODEL
    loaded = load_model(model, quantization, progress=lambda f, msg: print(f"[{f:4.0%}] {msg}", file=sys.stderr))
    for name in names:
        start = time.monotonic()
        path = save(record_preset(loaded, name, _reporter(name)), recording_path(name))
        print(f"{name}: {format_bytes(path.stat().st_size)} in {time.monotonic() - start:.0f} s -> {path}")
    print(_total())
    return 0
