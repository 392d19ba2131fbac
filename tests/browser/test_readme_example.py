"""The README's gradio_client example runs as printed, against the served app (a tiny model)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
from tiny_app import served_app, served_demo

from thinkviz.export import import_recording

pytestmark = pytest.mark.browser

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_client_example_runs_a_preset_and_saves_its_recording(tmp_path, monkeypatch, capsys):
    text = README.read_text(encoding="utf-8")
    code = re.search(r"<!-- readme-client-example -->\n```python\n(.*?)```", text, re.S).group(1)
    assert 'Client("http://127.0.0.1:7860/")' in code
    monkeypatch.chdir(tmp_path)
    with served_app() as url:
        exec(compile(code.replace("http://127.0.0.1:7860/", url), "README.md", "exec"), {})  # our own README
    assert "Done: 256 tokens generated" in capsys.readouterr().out
    record = import_recording([tmp_path / "muffins-h2o-b96.zip"])
    assert record.meta["policy"] == "h2o" and record.meta["params"]["budget"] == 96


def test_run_policy_called_while_the_model_loads_says_so_and_then_runs():
    from gradio_client import Client

    loads = threading.Event()
    with served_demo(loads=loads) as demo:
        job = Client(demo.local_url, verbose=False).submit(
            preset="generate_muffins", knobs='{"budget": 96}', api_name="/run_policy"
        )
        deadline = time.monotonic() + 60
        while not job.outputs() and not job.done() and time.monotonic() < deadline:
            time.sleep(0.05)  # until the wait is reported (as the summary's status, a JSON object)
        loads.set()
        summary, _ = job.result(timeout=120)
    (waited, _), *_ = job.outputs()
    assert waited == {"status": "Waiting for the model to load…"}
    assert summary["status"].startswith("Done:") and summary["params"]["budget"] == 96
