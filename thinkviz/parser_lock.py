"""Python's parser one thread at a time, on the CPython releases whose parser is not thread-safe.

CPython 3.11.0–3.11.7 and 3.12.0–3.12.1 count the depth of the tree ``ast.parse`` builds in one
counter that every thread shares (gh-106905; fixed in 3.11.8 and 3.12.2).  When the garbage
collector runs Python code in the middle of one parse and another thread parses meanwhile, the
first raises ``SystemError: AST constructor recursion depth mismatch`` on valid input.

The app parses on several threads at once: numpy reads the header of every array in a ``.npz``
with ``ast.literal_eval``, the Lessons warm-up reads recordings in the background while requests
read others, and think_drop parses the code a model writes.  Each of them holds
:data:`PARSER_LOCK` around its parse (:func:`read_arrays` for the arrays); on a CPython without
the bug it is a context that does nothing, so nothing waits.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import IO

import numpy as np


def parser_is_shared(version: tuple[int, ...]) -> bool:
    """Whether this CPython shares the parser's depth counter between threads (gh-106905)."""
    return (3, 11, 0) <= version < (3, 11, 8) or (3, 12, 0) <= version < (3, 12, 2)


PARSER_LOCK: contextlib.AbstractContextManager[object] = (
    threading.RLock() if parser_is_shared(sys.version_info[:3]) else contextlib.nullcontext()
)


def read_arrays(source: str | os.PathLike[str] | IO[bytes]) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` (a path or a binary file), by name; no pickles.

    Each array is read under :data:`PARSER_LOCK` (numpy parses its header with ``ast``), one at a
    time, so a thread waits for one array's header and bytes at most, not for a whole file.
    """
    with np.load(source, allow_pickle=False) as npz:
        arrays = {}
        for name in npz.files:
            with PARSER_LOCK:
                arrays[name] = npz[name]
        return arrays
