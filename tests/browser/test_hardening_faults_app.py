"""A policy that raises, through the whole app: the run ends with its message, the server lives on.

The app is built in this process (so a broken policy can be registered for the test only)
around a tiny model, launched on a free 127.0.0.1 port and driven with gradio_client.
"""

from __future__ import annotations

import re
import time

import pytest
import torch
from gradio_client import Client
from test_app_client import _live_args
from test_hardening_faults import ExplodingPolicy
from tiny_app import served_app

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def client():
    with served_app(ExplodingPolicy) as url:
        yield Client(url, verbose=False)


def test_a_policy_that_raises_ends_its_run_with_a_message_and_the_next_run_works(client):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="the exploding run failed: ZeroDivisionError: bad bookkeeping in score"):
        client.predict(*_live_args(policy="exploding", budget=16, max_new_tokens=4), api_name="/generate")
    final = client.predict(*_live_args(policy="h2o", budget=64, max_new_tokens=4), api_name="/generate")
    assert final[0].startswith("Done: 4 tokens generated")


def test_a_comparison_with_a_policy_that_raises_ends_with_a_message(client):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="the comparison of full, exploding failed: ZeroDivisionError"):
        client.predict(
            "combined",
            "generate",
            None,
            "What is 2 + 3?",
            "",
            ["full", "exploding"],
            16,
            "tokens",
            0.25,
            1,
            True,
            True,
            "",
            False,
            4,
            0.0,
            False,
            api_name="/compare",
        )


def test_a_failed_live_run_leaves_its_memory_chart_and_says_why(client):
    job = client.submit(*_live_args(policy="exploding", budget=16, max_new_tokens=4), api_name="/generate")
    while not job.done():
        time.sleep(0.1)
    status, _bus, figure, _stats, _source = job.outputs()[-1][:5]  # (the legend follows)
    assert status.startswith("Stopped: the exploding run failed: ZeroDivisionError: bad bookkeeping in score")
    assert figure is not None and figure["type"] == "plotly"  # the chart as it stood when the run failed


@pytest.mark.parametrize(
    "gib, reason", [(-1, "the VRAM cap must be a positive number of GiB, got -1"), (8, "a VRAM cap needs a CUDA GPU")]
)
def test_the_vram_cap_setting_is_validated_and_refused_on_a_cpu(client, gib, reason):
    from gradio_client.exceptions import AppError

    if torch.cuda.is_available() and gib > 0:
        pytest.skip("needs a machine without CUDA")
    with pytest.raises(AppError, match=re.escape(reason)):
        client.predict(gib, api_name="/set_vram_cap")
