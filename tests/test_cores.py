"""The app's torch thread count: every core but one for the browser, unless the user chose."""

from __future__ import annotations

import pytest

import app
from thinkviz.cores import AUTO, TORCH, choose_threads


@pytest.mark.parametrize("cores, threads", [(1, 1), (2, 1), (4, 3), (16, 15)])
def test_auto_leaves_one_core_to_the_browser(cores, threads):
    assert choose_threads(AUTO, cores=cores, env={}) == threads


def test_omp_num_threads_and_torch_leave_torch_alone():
    assert choose_threads(AUTO, cores=8, env={"OMP_NUM_THREADS": "3"}) is None
    assert choose_threads(TORCH, cores=8, env={}) is None


def test_a_number_is_taken_as_is_and_nonsense_refused():
    assert choose_threads("3", cores=2, env={"OMP_NUM_THREADS": "1"}) == 3
    for bad in ("0", "-1", "many"):
        with pytest.raises(ValueError, match="threads"):
            choose_threads(bad)


def test_app_refuses_a_bad_thread_count_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        app.parse_args(["--threads", "none"])
    assert exit_info.value.code == 2
    assert "threads must be a number" in capsys.readouterr().err
