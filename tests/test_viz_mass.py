"""What a run that fits attention biases shows: the mass view, the tooltip, the segment table's column."""

from __future__ import annotations

import numpy as np
import pytest

from thinkviz.ui.explore_views import explore_view
from thinkviz.viz.legend import view_legend
from thinkviz.viz.tables import MASS_HEADER, SEGMENT_TABLE_HEADERS, segment_headers, segment_table
from thinkviz.viz.tokens import TokenData, token_looks, token_view
from tiny_models import tiny_model
from viz_records import replayed


@pytest.fixture(scope="module")
def run():
    return replayed(tiny_model("llama"), "tam", compaction="match", recent=4, window=8, l_min=4)


def test_mass_view_shades_kept_tokens_by_how_many_they_stand_for():
    data = TokenData(
        ["a", "b", "c", "d"], scores=[0.9, 0.1, 0.5, np.nan], keep_fraction=[1, 1, 1, 0], mass=[1.0, 4.0, 0.5, np.nan]
    )
    looks = token_looks(data, "mass")
    levels = [next((int(c[4:]) for c in look.cls.split() if c.startswith("tv-h")), None) for look in looks]
    assert levels[1] == 9 and levels[0] < levels[1] and levels[2] < levels[0] and levels[3] is None
    assert "tv-gone" in looks[3].cls
    # the importance view still shades by score, and says what each token stands for on hover
    importance = token_looks(data, "importance")
    assert "tv-h9" in importance[0].cls
    assert "stands for ≈ 4 tokens" in importance[1].title
    assert "stands for ≈ 1 token\n" in importance[0].title
    assert "stands for" not in importance[3].title
    assert "stands for" not in token_looks(TokenData(["a"], scores=[1.0], keep_fraction=[1]), "combined")[0].title


def test_a_matched_run_carries_mass_into_its_token_view(run):
    record = run.record
    data = token_view(record)
    assert data.mass is not None and len(data.mass) == len(data.texts)
    kept = np.asarray(data.keep_fraction) > 0
    assert np.all(np.isfinite(np.asarray(data.mass)[kept]))
    titles = [look.title for look in token_looks(data, "mass")]
    assert all("stands for ≈" in t for t, k in zip(titles, kept) if k)


def test_segment_table_gains_the_mean_mass_per_segment(run):
    record = run.record
    assert segment_headers(record) == SEGMENT_TABLE_HEADERS + [MASS_HEADER]
    last = record.events[-1]
    rows = segment_table(record)
    spans = [s for s in record.segments if s["kind"] not in ("step", "tag")]
    assert [r[0] for r in rows][:2] == ["system", "user"]
    for row, span in zip(rows, spans):
        carried = last.mass[span["start"] : span["end"]]
        carried = carried[np.isfinite(carried)]
        assert row[4] == (pytest.approx(float(carried.mean()), abs=0.01) if len(carried) else None)
    view = explore_view(record, len(record.events) - 1, "all", "all", "mass")
    assert view.segments["headers"][-1] == MASS_HEADER
    assert "stands for ≈" in view.tokens_html


def test_runs_without_biases_keep_the_four_columns():
    record = replayed(tiny_model("llama"), "h2o", recent=4).record
    assert segment_headers(record) == SEGMENT_TABLE_HEADERS
    assert all(len(row) == 4 for row in segment_table(record))


def test_the_mass_view_legend_explains_e_beta():
    legend = view_legend("mass", "tam", None)
    assert "how many tokens a kept token stands for" in legend and "recent window" not in legend
    assert "recent window" in view_legend("importance", "tam", None)
