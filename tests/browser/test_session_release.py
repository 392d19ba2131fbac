"""A closed session lets go of everything it held, and the API names every input, in the served app.

The app is built in this process around a tiny model, so the test can see the server's objects:
the client's :class:`~thinkviz.ui.session.Session`, its recordings and token-view channels, and the
engine's :class:`~thinkviz.core.engine.Run` while it streams.  Gradio's heartbeat is shortened so a
closed client is noticed at once (the release itself is what is tested, not how soon it comes).
"""

from __future__ import annotations

import gc
import re
import time
import weakref

import gradio as gr
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from test_ui_browser import wait_for_text
from tiny_app import served_demo

from thinkviz.core.engine import Run
from thinkviz.export import import_recording
from thinkviz.ui.session import Session

pytestmark = pytest.mark.browser

LIVE = {
    "run_mode": "generate",
    "question": "Count the ships that pass the lighthouse.",
    "policy": "h2o",
    "budget": 48,
    "interval": 1,
    "temperature": 0.0,
}
COMPARE = {
    "run_mode": "generate",
    "question": "Name three colours.",
    "policies": ["full", "window"],
    "budget": 16,
    "interval": 1,
    "max_new_tokens": 4,
    "stop_at_eos": False,
}
RELEASE_DEADLINE = 60  # seconds allowed for the server to notice the closed client and release it


def _session(demo: gr.Blocks, client: Client) -> Session:
    """The Session the app keeps for ``client`` (from Gradio's per-session store)."""
    state = next(block for block in demo.blocks.values() if isinstance(block, gr.State))
    session = demo.state_holder[client.session_hash].get(state._id)
    assert isinstance(session, Session)
    return session


def _wait_for_frames(job, count: int) -> None:
    deadline = time.monotonic() + RELEASE_DEADLINE
    while len(job.outputs()) < count:
        assert not job.done(), job.result()
        assert time.monotonic() < deadline, "the run did not stream"
        time.sleep(0.05)


def _survivors(refs: dict[str, weakref.ref]) -> list[str]:
    """The names of the objects still alive once the release had its time."""
    deadline = time.monotonic() + RELEASE_DEADLINE
    while True:
        gc.collect()
        alive = [name for name, ref in refs.items() if ref() is not None]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.25)


def test_closing_a_session_mid_run_releases_its_run_recordings_and_channels(monkeypatch):
    monkeypatch.setenv("GRADIO_HEARTBEAT_INTERVAL", "0.25")
    with served_demo() as demo:
        leaving, staying = Client(demo.local_url, verbose=False), Client(demo.local_url, verbose=False)
        assert leaving.predict(**LIVE, max_new_tokens=6, api_name="/generate")[0].startswith("Done: 6 tokens")
        assert leaving.predict(**COMPARE, api_name="/compare")[0].startswith("Done")
        assert staying.predict(**LIVE, max_new_tokens=3, api_name="/generate")[0].startswith("Done: 3 tokens")
        session, other = _session(demo, leaving), _session(demo, staying)
        finished = dict(session.shelf.records)
        assert len(finished) == 3  # one Live run and two Compare columns on the shelf

        job = leaving.submit(**LIVE, max_new_tokens=2000, stop_at_eos=False, api_name="/generate")
        _wait_for_frames(job, 3)  # prefill and streaming: the run is in the middle
        runs = [obj for obj in gc.get_objects() if isinstance(obj, Run)]
        assert runs, "no Run while the run streams"
        refs = {
            "session": weakref.ref(session),
            "live record": weakref.ref(session.live_record),
            "live channel": weakref.ref(session.live_channel),
            "live view": weakref.ref(session.live_view),
            **{f"compare channel {i}": weakref.ref(c) for i, c in enumerate(session.compare_channels)},
            **{f"shelf: {label}": weakref.ref(r) for label, r in finished.items()},
            **{f"run {i}": weakref.ref(run) for i, run in enumerate(runs)},
        }
        del session, finished, runs

        leaving.close()
        assert _survivors(refs) == []
        # the run was stopped and the model handed back: the other session runs at once and keeps its own
        assert staying.predict(**LIVE, max_new_tokens=2, api_name="/generate")[0].startswith("Done: 2 tokens")
        assert other.live_record is not None and len(other.shelf.records) == 2
        staying.close()


def test_closing_the_browser_tab_releases_its_session(browser, monkeypatch):
    monkeypatch.setenv("GRADIO_HEARTBEAT_INTERVAL", "0.25")
    with served_demo() as demo:
        page = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
        page.goto(demo.local_url)
        wait_for_text(page, "#tv-model-status", "Model: Ready", 120)
        page.fill("#tv-live-question textarea", "Count to three.")
        page.click("#tv-live-run")
        wait_for_text(page, "#tv-live-status", r"Done: \d+ tokens generated", 120)
        state = next(block for block in demo.blocks.values() if isinstance(block, gr.State))
        held = [values.get(state._id) for values in demo.state_holder.session_data.values()]
        sessions = [session for session in held if isinstance(session, Session) and session.live_record is not None]
        assert len(sessions) == 1
        refs = {"session": weakref.ref(sessions[0]), "live record": weakref.ref(sessions[0].live_record)}
        del held, sessions
        page.context.close()
        assert _survivors(refs) == []


def test_every_api_input_has_a_name_and_run_policy_takes_knobs_by_name(tmp_path):
    with served_demo() as demo:
        client = Client(demo.local_url, verbose=False)
        endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
        unnamed = [
            (endpoint, p["parameter_name"], p["label"])
            for endpoint, info in endpoints.items()
            for p in info["parameters"]
            if any(
                re.fullmatch(r"(param|parameter)[ _]?\d+", text or "", re.I)
                for text in (p["parameter_name"], p["label"])
            )
        ]
        assert unnamed == []
        assert not [name for name in endpoints if name.startswith("/lambda")]
        names = [p["parameter_name"] for p in endpoints["/run_policy"]["parameters"]]
        assert names[:3] == ["policy", "knobs", "preset"]

        summary, archive = client.predict(
            policy="window",
            knobs='{"budget": 24, "protect_system": false}',
            question="Why is the sky blue?",
            max_new_tokens=5,
            api_name="/run_policy",
        )
        assert summary["run"] == "Live 1 · window" and summary["new_tokens"] == 5
        assert summary["params"] == {
            "budget": 24,
            "budget_mode": "tokens",
            "budget_fraction": 0.25,
            "interval": 1,
            "protect_system": False,
            "protect_question": True,
        }
        assert import_recording([archive]).meta["params"] == summary["params"]
        fraction, _ = client.predict(
            policy="h2o",
            knobs='{"budget_mode": "fraction", "budget_fraction": 0.5}',
            question="Hi",
            max_new_tokens=2,
            api_name="/run_policy",
        )
        assert fraction["params"]["budget_mode"] == "fraction" and fraction["params"]["budget_fraction"] == 0.5
        preset, _ = client.predict(preset="generate_muffins", knobs='{"recent": 8}', api_name="/run_policy")
        assert preset["policy"] == "h2o" and preset["params"]["recent"] == 8 and preset["params"]["budget"] == 160

        refused = {
            '{"budgte": 64}': "has no parameter budgte",
            '{"budget": 4}': "budget must be between 8",
            '{"recent": 2000}': "recent must be between 0 and 1024",
            '{"budget": 64': "JSON object",
            "[64]": "JSON object",
            '{"protect_system": "maybe"}': "protect_system must be true or false",
        }
        for knobs, reason in refused.items():
            with pytest.raises(AppError, match=re.escape(reason)):
                client.predict(policy="h2o", knobs=knobs, question="Hi", max_new_tokens=2, api_name="/run_policy")
        with pytest.raises(AppError, match="unknown policy 'lru'"):
            client.predict(policy="lru", question="Hi", api_name="/run_policy")
        with pytest.raises(AppError, match="unknown preset"):
            client.predict(preset="../app", api_name="/run_policy")
        client.close()
