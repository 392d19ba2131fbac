"""The README's gradio_client example runs as printed, against the served app (a tiny model)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tiny_app import served_app

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
