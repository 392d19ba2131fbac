"""The app's parses take turns where CPython's parser is not thread-safe (gh-106905).

On CPython 3.11.0–3.11.7 a recording read on one thread (numpy parses each array header with
``ast``) while think_drop parses model output on another raised ``SystemError: AST constructor
recursion depth mismatch`` once the garbage collector ran Python code mid-parse; the Lessons
warm-up reads recordings in the background while requests run, so the app met it for real.
"""

from __future__ import annotations

import gc
import threading

import pytest

from thinkviz.demos import recordings
from thinkviz.parser_lock import parser_is_shared
from thinkviz.policies.think_drop import code_parses


@pytest.mark.parametrize(
    ("version", "shared"),
    [((3, 11, 7), True), ((3, 11, 8), False), ((3, 12, 0), True), ((3, 12, 2), False), ((3, 13, 0), False)],
)
def test_the_lock_is_taken_only_where_the_parser_is_shared(version, shared):
    assert parser_is_shared(version) is shared


class _Finalized:
    """A reference cycle whose collection runs Python code (what lets another thread in mid-parse)."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        sum(range(100))


def test_recordings_read_on_a_thread_while_model_code_is_parsed_on_another():
    path = recordings.recording_path("math_h2o_vs_window")
    source = "\n".join(f"def f{i}(x):\n    return [x + {i} for _ in range(3)]" for i in range(150))
    errors: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        try:
            while not done.is_set():
                recordings.load(path)
                _Finalized()
        except BaseException as exc:  # noqa: BLE001 - the thread hands its error to the test
            errors.append(exc)

    threshold = gc.get_threshold()
    gc.set_threshold(50)  # collect often: each collection may run a finalizer mid-parse
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        for i in range(150):
            _Finalized()
            assert code_parses(f"{source}\n# draft {i}")  # a new text each time: code_parses caches
    finally:
        done.set()
        reader.join(timeout=60)
        gc.set_threshold(*threshold)
    assert errors == []
