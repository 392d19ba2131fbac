"""A session's recordings: what Explore offers, within a byte budget, the oldest dropped first and said so."""

from __future__ import annotations

import numpy as np

from thinkviz.core.events import RunRecord, StepEvent
from thinkviz.ui.handlers import RUN_PICKER_INFO, run_picker
from thinkviz.ui.session import Session, Shelf

KIB = 1024


def _record(policy: str, steps: int = 4, tokens: int = 32) -> RunRecord:
    """A record whose arrays take ``steps * tokens * 8`` bytes (float32 scores and keep fractions)."""
    events = [
        StepEvent(step, [1], ["x"], [tokens - 1], np.zeros(tokens, np.float32), np.ones(tokens, np.float32))
        for step in range(steps)
    ]
    return RunRecord(meta={"policy": policy}, events=events)


def test_a_record_counts_the_bytes_of_its_arrays():
    record = _record("h2o", steps=3, tokens=100)
    record.snapshots[2] = np.ones((2, 4, 100), dtype=bool)
    assert record.nbytes == 3 * 100 * 8 + 800


def test_the_budget_drops_the_oldest_run_and_says_so():
    session = Session(shelf=Shelf(budget=2 * KIB))  # each record below: 1 KiB
    first, second, third = _record("h2o"), _record("window"), _record("tova")
    for record in (first, second):
        session.live_record = record
        session.keep_live(record)
    assert session.sources() == ["Live 2 · window", "Live 1 · h2o"] and not session.shelf.note
    assert run_picker(session)["info"] == RUN_PICKER_INFO

    session.live_record = third
    assert session.keep_live(third) == "Live 3 · tova"
    assert session.sources() == ["Live 3 · tova", "Live 2 · window"]
    assert session.record_for("Live 1 · h2o") is None and session.record_for("Live 2 · window") is second
    assert "Dropped Live 1 · h2o" in session.shelf.note and "2.0 KiB" in session.shelf.note
    update = run_picker(session, "Live 3 · tova")
    assert update["choices"] == ["Live 3 · tova", "Live 2 · window"] and update["value"] == "Live 3 · tova"
    assert update["info"] == session.shelf.note


def test_a_run_a_tab_still_shows_is_never_dropped():
    session = Session(shelf=Shelf(budget=2 * KIB))
    opened = _record("h2o")
    session.keep_live(opened)
    session.explore_record = opened  # open in Explore
    columns = [_record("full"), _record("window")]
    session.compare_records = {r.meta["policy"]: r for r in columns}
    assert session.keep_compare(columns) == ["Compare 1 · full", "Compare 1 · window"]
    # 3 KiB held, over the budget, but Explore shows the oldest and Compare the rest: nothing goes
    assert session.sources() == ["Compare 1 · window", "Compare 1 · full", "Live 1 · h2o"]
    session.explore_record = None
    session.compare_records = {}
    later = _record("tova")
    session.live_record = later
    session.keep_live(later)
    assert session.sources() == ["Live 2 · tova", "Compare 1 · window"]
    assert session.shelf.note.startswith("Dropped Live 1 · h2o, Compare 1 · full:")


def test_a_run_shelved_at_its_start_is_trimmed_against_when_it_ends():
    session = Session(shelf=Shelf(budget=2 * KIB))
    first = _record("h2o")
    session.keep_live(first)
    growing = _record("window", steps=1)  # 256 bytes when it goes on the shelf
    session.live_record = growing
    session.keep_live(growing)
    assert session.sources() == ["Live 2 · window", "Live 1 · h2o"] and not session.shelf.note
    growing.events += _record("window", steps=6).events  # it streams on: 1.75 KiB, 2.75 KiB with the first
    session.trim()
    assert session.sources() == ["Live 2 · window"] and session.shelf.note.startswith("Dropped Live 1 · h2o:")


def test_closing_a_session_lets_go_of_its_runs_and_stops_the_run():
    session = Session()
    cancel = session.begin()
    record = _record("h2o")
    session.live_record = session.explore_record = record
    session.keep_live(record)
    channel = session.live_channel
    session.close()
    assert cancel.is_set()
    assert session.sources() == [] and session.live_record is None and session.explore_record is None
    assert session.live_channel is not channel


def test_a_column_in_a_quantized_format_is_its_own_entry_on_the_shelf():
    quantized = _record("full")
    quantized.meta["kv_quant"] = {"format": "q4_0", "bits": 4, "residual": 32}
    session = Session(shelf=Shelf(budget=64 * KIB))
    labels = session.keep_compare([_record("full"), quantized])
    assert labels == ["Compare 1 · full", "Compare 1 · full · q4_0"]
    assert session.record_for(labels[1]) is quantized


def test_columns_of_one_policy_are_shelved_under_their_column_titles():
    session = Session(shelf=Shelf(budget=64 * KIB))
    small, large = _record("h2o"), _record("h2o")
    labels = session.keep_compare([small, large], ["h2o · recent 32", "h2o · recent 128"])
    assert labels == ["Compare 1 · h2o · recent 32", "Compare 1 · h2o · recent 128"]
    assert session.record_for(labels[0]) is small and session.record_for(labels[1]) is large
