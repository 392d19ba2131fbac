"""Finished sweep groups on disk, one file each, so a sweep can resume after a crash or Ctrl-C.

Each :class:`~thinkviz.sweep.grid.GroupResult` is written to ``OUT/groups/<key>.json`` through a
temporary file and a rename (:func:`~thinkviz.sweep.grid.write_atomic`), the moment it finishes.
``key`` is a digest of everything that decides the group's numbers — the trace's text, the
budget, the KV format, the sweep's settings and the model as named — so a file is reused only
by the same group of the same sweep; a file for other settings is never mistaken for it.  The
file also holds a digest of its own result: a damaged or hand-edited file is refused by
:meth:`GroupStore.load` (and then recomputed) instead of read back wrong.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from ..models.loading import display_name
from ..policies.registry import policy_class
from .grid import Group, GroupResult, SweepSettings, split_policy, write_atomic

FORMAT = 1  # bump when GroupResult or the file layout changes: older files are then recomputed


class DamagedGroup(Exception):
    """A stored group could not be read back; the message says why."""


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def fingerprint(group: Group, settings: SweepSettings, model: dict[str, Any]) -> dict[str, Any]:
    """What decides a group's numbers, as plain JSON: the group, the sweep's settings, ``model``
    (how the model was asked for: name, quantization, backend, device) and, when a policy of the
    sweep reads files (dynts: its predictor), their fingerprints."""
    files = {}
    for spec in settings.policies:
        files.update(policy_class(split_policy(spec)[0]).file_fingerprints(display_name(model["name"])))
    return {
        "format": FORMAT,
        "group": dataclasses.asdict(group),
        "settings": dataclasses.asdict(settings),
        "model": model,
        **({"files": files} if files else {}),
    }


class GroupStore:
    """``folder/groups/``: one JSON file per finished group, keyed by its fingerprint."""

    def __init__(self, folder: Path, settings: SweepSettings, model: dict[str, Any]) -> None:
        self.folder = Path(folder) / "groups"
        self.settings = settings
        self.model = model

    def path(self, group: Group) -> Path:
        return self.folder / f"{_digest(fingerprint(group, self.settings, self.model))[:24]}.json"

    def save(self, group: Group, result: GroupResult) -> Path:
        """Write ``result`` atomically; return its file."""
        body = dataclasses.asdict(result)
        document = {
            "fingerprint": fingerprint(group, self.settings, self.model),
            "result": body,
            "sha256": _digest(body),
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path(group)
        write_atomic(path, json.dumps(document, indent=1, allow_nan=True))
        return path

    def load(self, group: Group) -> GroupResult | None:
        """The stored result of ``group``, or None when there is none; :class:`DamagedGroup` when a
        file is there but cannot be trusted (unreadable, truncated, or its digest does not match)."""
        path = self.path(group)
        if not path.exists():
            return None
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
            body = document["result"]
            if _digest(document["fingerprint"]) != _digest(fingerprint(group, self.settings, self.model)):
                raise DamagedGroup(f"{path.name} was written for other settings")
            if document["sha256"] != _digest(body):
                raise DamagedGroup(f"{path.name} does not match its digest")
            return GroupResult(**body)
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise DamagedGroup(f"{path.name} cannot be read ({type(exc).__name__}: {exc})") from None
