"""The launched app through its API (gradio_client): streamed generation and a comparison."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.integration]

QUESTION = "A baker packs 24 muffins in boxes of 4 and gives away 2 boxes. How many boxes are left?"


@pytest.fixture(scope="module")
def client(app_url):
    from gradio_client import Client

    return Client(app_url, verbose=False)


def _live_args(policy="h2o", budget=96, interval=4, max_new_tokens=12, stop_at_eos=False, protect=True):
    """Positional values of /generate: view mode, run mode, system, question, trace, the policy group
    (``protect``: the system prompt and question kept by rule), decode settings, projection (target,
    card, device panel)."""
    from thinkviz.ui.controls import pool_choices, pool_sizes, slot_specs

    numbers, flags, choices = slot_specs(policy, pool_sizes())
    slots = (
        [s.value if s else 0 for s in numbers]
        + [s.value if s else False for s in flags]
        + [s.value if s else pool_choices()[0] for s in choices]
    )
    return [
        "combined",
        "generate",
        None,
        QUESTION,
        "",
        policy,
        budget,
        "tokens",
        0.25,
        interval,
        protect,
        protect,
        *slots,
        max_new_tokens,
        0.0,
        stop_at_eos,
        "Qwen3-4B",
        8,
        False,
    ]


def test_generation_streams_updates_from_the_embedded_model(client):
    # unprotected prompt: the 72 tokens are not all kept by rule (prompt + h2o's recent 32), some are ranked
    job = client.submit(*_live_args(protect=False), api_name="/generate")
    frames = list(job)
    statuses = [f[0] for f in frames]
    # the bus: JSON text, a list of messages ending with the frame's own patch
    messages = [json.loads(f[1])[-1] for f in frames if isinstance(f[1], str) and f[1]]
    assert len(frames) >= 3, statuses  # prompt, at least one streamed frame, the final one
    assert statuses[-1].startswith("Done: 12 tokens generated")
    assert messages[0]["patch"]["reset"] and any(m["patch"]["append"] for m in messages[1:-1])
    assert [m["seq"] for m in messages] == sorted(m["seq"] for m in messages)
    final_view = messages[-1]["patch"]["reset"]
    assert final_view.count("data-pos=") > 12 and "tv-h" in final_view  # tokens with heat classes
    assert final_view.count("data-heat=") < final_view.count("data-pos=")  # the recent window: kept by rule
    assert "tok/s" in frames[-1][3]


def test_three_policy_comparison_returns_three_columns_and_a_fidelity_table(client):
    job = client.submit(*_compare_args(QUESTION, ["full", "window", "h2o"], 8), api_name="/compare")
    frames = list(job)
    status, bus, figure, table = frames[-1][:4]
    messages = json.loads(bus)
    headers = frames[-1][5:11]  # the six column headers (the columns and the legend follow)
    assert status.startswith("Done"), status
    assert [m["chart"] for m in messages if "chart" in m] == ["tv-compare-memory", "tv-compare-fidelity"]  # undimmed
    patches = [m["target"] for m in messages if "patch" in m]
    assert patches == ["tv-compare-tokens-0", "tv-compare-tokens-1", "tv-compare-tokens-2"]
    assert sum(bool(h) for h in headers) == 3 and "window" in headers[1]
    rows = table["data"]
    assert [r[0] for r in rows] == ["full", "window", "h2o"]
    assert table["headers"][1].startswith("NLL")
    assert all(r[1] != "—" for r in rows)  # NLL measured for every policy
    assert float(rows[0][3]) == pytest.approx(0.0, abs=1e-6)  # the full cache against itself: KL 0


def test_bad_input_is_refused_with_a_clear_message(client):
    from gradio_client.exceptions import AppError

    args = _live_args()
    args[3] = "   "
    with pytest.raises(AppError, match="question is empty"):
        client.predict(*args, api_name="/generate")


def test_stop_cancels_the_run_and_the_recording_exports_and_opens_again(client):
    import time

    job = client.submit(*_live_args(max_new_tokens=2000), api_name="/generate")
    deadline = time.monotonic() + 300
    while not any(str(o[0]).startswith("Generating") for o in job.outputs()) and time.monotonic() < deadline:
        time.sleep(0.2)
    client.predict(api_name="/stop")
    final = job.result(timeout=120)
    assert "stopped: cancelled" in final[0]
    archive = client.predict(api_name="/export_recording")
    assert str(archive).endswith(".zip")
    from gradio_client import handle_file

    step, layer, head, caption, tokens, heatmap, segments, kept = client.predict(
        [handle_file(archive)], "evicted", api_name="/open_recording"
    )
    assert "Step" in caption and tokens.count("data-pos=") > 30
    assert layer["choices"][:2] == [["all", "all"], ["0", "0"]]  # the recording's 30 layers, or all of them


def test_an_abandoned_run_does_not_block_the_next_one(client):
    import time

    job = client.submit(*_live_args(max_new_tokens=2000), api_name="/generate")
    while not job.outputs():
        time.sleep(0.2)
    job.cancel()
    final = client.predict(*_live_args(max_new_tokens=4), api_name="/generate")
    assert final[0].startswith("Done: 4 tokens generated")


def test_a_model_that_cannot_load_leaves_the_current_one_in_use(client, tmp_path):
    lines = client.predict(str(tmp_path / "no-such-model"), "4bit", api_name="/load_model")
    assert "Could not load" in lines[0] and "SmolLM2" in lines[0] and "still in use" in lines[0]
    final = client.predict(*_live_args(max_new_tokens=2), api_name="/generate")
    assert final[0].startswith("Done: 2 tokens generated")


def test_generation_with_a_quantized_kv_cache_reports_its_format(client):
    frames = list(client.submit(*_live_args(max_new_tokens=6), "q4_0", 128, api_name="/generate"))
    assert frames[-1][0].startswith("Done: 6 tokens generated")
    assert "KV format" in frames[-1][3] and "q4_0" in frames[-1][3]


def _compare_formats(**chosen: str) -> list[str]:
    """The /compare KV-format values: one per registered policy (``none`` unless given)."""
    from thinkviz.policies import policy_names

    return [chosen.get(name, "none") for name in policy_names()]


def _compare_args(question: str, policies, max_new_tokens: int, formats: list[str] | None = None) -> list:
    """Positional values of /compare: view mode, run mode, system, question, trace, the policies, budget
    (64 tokens), interval 4, protections, vary, fidelity on, decode settings; with ``formats``, one KV
    format per registered policy and KIVI's residual (128) after them."""
    kv = [] if formats is None else [*formats, 128]
    return [
        "combined",
        "generate",
        None,
        question,
        "",
        policies,
        64,
        "tokens",
        0.25,
        4,
        True,
        False,
        "",
        True,
        max_new_tokens,
        0.0,
        False,
        *kv,
    ]


def test_comparison_of_a_policy_at_full_precision_and_the_full_cache_in_q4_0(client):
    formats = _compare_formats(full="q4_0")
    job = client.submit(*_compare_args(QUESTION, ["h2o", "full"], 8, formats), api_name="/compare")
    status, _, _, table = list(job)[-1][:4]
    assert status.startswith("Done"), status
    assert [r[0] for r in table["data"]] == ["h2o", "full · q4_0"]
