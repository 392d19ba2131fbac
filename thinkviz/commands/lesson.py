"""``python -m thinkviz lesson list|check``: the guided lessons in ``presets/lessons/`` (no model needed).

``lesson list`` names each lesson with its title and number of steps (``--json`` for scripts);
``lesson check`` resolves every step against its preset's recording and prints one line per problem
(a missing or stale recording, a moment not found, a number that does not resolve or is typed by
hand), exiting 1 if there is any (:func:`thinkviz.demos.lessons.check_lesson`).
"""

from __future__ import annotations

import argparse
import json

from ..demos.lessons import LessonError, check_lesson, list_lessons, load_lesson
from .common import CliError, command


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="name, title and number of steps of every lesson")
    listing.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    check = actions.add_parser("check", help="check every step against its recording; exit 1 with one line per problem")
    check.add_argument("lessons", nargs="*", metavar="LESSON", help="lesson names or .yaml files (default: all)")


def _lessons(given: list[str]):
    try:
        return [load_lesson(name) for name in given or list_lessons()]
    except LessonError as exc:
        raise CliError(str(exc)) from None


@command("lesson", configure)
def lesson(args: argparse.Namespace) -> int:
    """List the guided lessons (lesson list) or check them against the recordings (lesson check)."""
    if args.action == "list":
        rows = [{"name": x.name, "title": x.title, "steps": len(x.steps)} for x in _lessons([])]
        if args.json:
            print(json.dumps(rows, ensure_ascii=False, indent=2))
        else:
            for row in rows:
                print(f"{row['name']}  {row['steps']} steps  {row['title']}")
        return 0
    lessons = _lessons(args.lessons)
    problems = [line for x in lessons for line in check_lesson(x)]
    for line in problems:
        print(line)
    if not problems:
        print(f"{len(lessons)} lessons, {sum(len(x.steps) for x in lessons)} steps: every step resolves")
    return 1 if problems else 0
