"""The launched app under hostile or concurrent API use (gradio_client; the embedded model, few tokens).

The server validates what it is sent instead of trusting the browser's sliders and
dropdowns; two clients generating at once each get what they would alone; uploads over
the size limit are refused before any handler runs.
"""

from __future__ import annotations

import json
import re
import threading

import pytest
from test_app_client import _compare_args, _compare_formats, _live_args  # the /generate and /compare argument layouts

pytestmark = [pytest.mark.browser, pytest.mark.integration]

BUDGET, BUDGET_MODE, BUDGET_FRACTION, INTERVAL, POLICY, RUN_MODE, QUESTION_AT = 6, 7, 8, 9, 5, 1, 3
MAX_NEW, TEMPERATURE = -6, -5  # counted from the end: decode settings, then the chart controls (3)


def _client(app_url):
    from gradio_client import Client

    return Client(app_url, verbose=False)


@pytest.fixture(scope="module")
def client(app_url):
    return _client(app_url)


def _request(policy: str, budget: int, question: str) -> list:
    args = _live_args(policy=policy, budget=budget, interval=2, max_new_tokens=6)
    args[QUESTION_AT] = question
    return args


def _outcome(final: tuple) -> tuple[str, str]:
    """The final status line without the run's time (#11: "… in 0.5 s."; it differs run to run) and the
    final token view (the last patch is a full reset)."""
    status, bus = final[0], json.loads(final[1])  # the bus: a list of messages, the frame's own last
    return re.sub(r" in [0-9.]+ s\.", ".", status), bus[-1]["patch"]["reset"]


def _recording_policy(client) -> str:
    from thinkviz.export import import_recording

    return import_recording([client.predict(api_name="/export_recording")]).meta["policy"]


def test_two_clients_generating_at_once_each_get_what_they_would_alone(app_url):
    first = _request("h2o", 64, "Name three prime numbers and explain why each is prime.")
    second = _request("window", 32, "Write a haiku about a lighthouse at night.")
    a, b = _client(app_url), _client(app_url)
    start = threading.Barrier(2)
    results: dict[str, tuple] = {}

    def generate(name, client, args):
        start.wait()
        results[name] = client.predict(*args, api_name="/generate")

    threads = [
        threading.Thread(target=generate, args=("a", a, first)),
        threading.Thread(target=generate, args=("b", b, second)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    together_a, together_b = _outcome(results["a"]), _outcome(results["b"])
    assert (_recording_policy(a), _recording_policy(b)) == ("h2o", "window")  # each session kept its own run

    alone_a = _outcome(a.predict(*first, api_name="/generate"))
    alone_b = _outcome(b.predict(*second, api_name="/generate"))
    assert together_a == alone_a and together_b == alone_b
    assert together_a[0].startswith("Done: 6 tokens generated") and together_a[1] != together_b[1]


@pytest.mark.parametrize(
    "where, value, reason",
    [
        (BUDGET, -5, "less than minimum value 8"),  # below the slider's range
        (BUDGET, 10**9, "greater than maximum value"),  # above it
        (BUDGET, "lots", "must be a number, got 'lots'"),  # not a number
        (INTERVAL, 0, "less than minimum value 1"),
        (BUDGET_MODE, "bogus", "not in the list of choices"),
        (BUDGET_FRACTION, 5.0, "greater than maximum value"),
        (POLICY, "nope", "not in the list of choices"),  # not a registered policy
        (POLICY, "../../etc/passwd", "not in the list of choices"),
        (RUN_MODE, "bogus", "not in the list of choices"),
        (MAX_NEW, 10**9, "greater than maximum value"),
        (TEMPERATURE, 99.0, "greater than maximum value"),
        (QUESTION_AT, "   \n\t ", "question is empty"),  # whitespace only
    ],
)
def test_values_outside_the_controls_are_refused_by_the_server(client, where, value, reason):
    from gradio_client.exceptions import AppError

    args = _live_args(max_new_tokens=2)
    args[where] = value
    with pytest.raises(AppError, match=re.escape(reason)):
        client.predict(*args, api_name="/generate")


def test_budget_below_sinks_and_window_is_refused_with_the_reason(client):
    from gradio_client.exceptions import AppError

    args = _live_args(policy="h2o", budget=24, max_new_tokens=2)  # h2o's recent window defaults to 32
    with pytest.raises(AppError, match="budget \\(24\\) must be larger than sinks \\+ recent window"):
        client.predict(*args, api_name="/generate")


@pytest.mark.parametrize(
    "policies", [["full"], ["full", "nope"], ["full", "h2o", "window", "tova", "snapkv", "streaming", "entropy"]]
)
def test_compare_refuses_bad_policy_lists(client, policies):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError):
        client.predict(*_compare_args("Hi", policies, 2), api_name="/compare")


# the dropdown and the slider refuse what they do not offer (Gradio checks choices and ranges)
@pytest.mark.parametrize(
    "kv, reason", [(["q5_1", 32], "q5_1 is not in the list of choices"), (["kivi2", 4], "less than minimum value 8")]
)
def test_generate_refuses_bad_kv_settings_with_a_message(client, kv, reason):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match=reason):
        client.predict(*_live_args(max_new_tokens=2), *kv, api_name="/generate")


def test_compare_refuses_a_bad_kv_format_with_a_message(client):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="q9 is not in the list of choices"):
        client.predict(*_compare_args("Hi", ["full", "h2o"], 2, _compare_formats(h2o="q9")), api_name="/compare")


def test_sweep_takes_only_listed_presets(client):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError):
        client.predict("/etc/hostname", ["window"], "0.5", 32, "kl", api_name="/sweep")


def test_an_upload_over_the_limit_is_refused_before_any_handler_runs(app_url):
    import httpx

    from app import MAX_UPLOAD_BYTES

    def body():
        boundary = b"--tvboundary\r\n"
        yield boundary + b'Content-Disposition: form-data; name="files"; filename="big.zip"\r\n'
        yield b"Content-Type: application/zip\r\n\r\n"
        chunk = b"\0" * 2**20
        for _ in range(MAX_UPLOAD_BYTES // len(chunk) + 1):
            yield chunk
        yield b"\r\n--tvboundary--\r\n"

    response = httpx.post(
        f"{app_url.rstrip('/')}/gradio_api/upload",
        content=body(),
        timeout=120,
        headers={"Content-Type": "multipart/form-data; boundary=tvboundary"},
    )
    assert response.status_code == 413, response.text[:200]


def test_a_hostile_recording_upload_gets_a_message_and_the_app_stays_up(client, tmp_path):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    junk = tmp_path / "junk.zip"
    junk.write_bytes(b"PK\x03\x04 this is not really a zip")
    with pytest.raises(AppError, match="not a zip archive"):
        client.predict([handle_file(str(junk))], "combined", api_name="/open_recording")
    final = client.predict(*_live_args(max_new_tokens=2), api_name="/generate")
    assert final[0].startswith("Done: 2 tokens generated")


def test_a_prompt_longer_than_the_context_is_refused_by_the_served_app(client):
    from gradio_client.exceptions import AppError

    args = _live_args(max_new_tokens=2)
    args[QUESTION_AT] = "go " * 10000  # SmolLM2's context is 8192 tokens
    with pytest.raises(AppError, match=r"the prompt has \d+ tokens; the model's context is 8192"):
        client.predict(*args, api_name="/generate")
