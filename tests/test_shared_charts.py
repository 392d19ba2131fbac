"""Charts a room shares: the fixed places along a recording where a playback's charts are drawn, and
values built once for every caller."""

from __future__ import annotations

import threading

import pytest

from thinkviz.demos.shared import SharedBuilds
from thinkviz.ui.shared_charts import CHART_POINTS, chart_position


@pytest.mark.parametrize("steps", [1, 2, 7, CHART_POINTS, CHART_POINTS + 1, 238, 5000])
def test_a_playback_draws_its_charts_at_a_few_fixed_places_the_last_step_one_of_them(steps):
    places = [chart_position(steps, position) for position in range(steps)]
    assert all(0 <= place <= position for place, position in zip(places, range(steps)))
    assert places == sorted(places) and places[-1] == steps - 1  # a finished playback's charts are exact
    assert len(set(places)) <= CHART_POINTS + 1
    if steps >= CHART_POINTS:
        assert len(set(places)) >= CHART_POINTS // 2  # and the chart still moves along the run


def test_callers_asking_at_once_share_one_build():
    shared: SharedBuilds[list[int]] = SharedBuilds(kept=4)
    gate, values = threading.Event(), []

    def build() -> list[int]:
        gate.wait(5)  # the first caller holds the build while the others ask
        return [1, 2, 3]

    def ask() -> None:
        values.append(shared.get("chart", build))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    gate.set()
    for thread in threads:
        thread.join(10)
    assert shared.builds == 1 and len(values) == 8 and all(value is values[0] for value in values)


def test_the_least_recently_used_build_goes_first_and_a_failed_build_is_tried_again():
    shared: SharedBuilds[str] = SharedBuilds(kept=2)
    for key in ("a", "b", "a", "c"):  # "b" is the least recently used when "c" arrives
        shared.get(key, lambda key=key: key.upper())
    assert shared.builds == 3
    assert shared.get("a", lambda: "rebuilt") == "A" and shared.get("b", lambda: "rebuilt") == "rebuilt"

    def broken() -> str:
        raise ValueError("no chart")

    with pytest.raises(ValueError, match="no chart"):
        shared.get("d", broken)
    assert shared.get("d", lambda: "D") == "D"
