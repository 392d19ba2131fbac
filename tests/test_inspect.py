"""``python -m thinkviz inspect``: what a replay's segmenter will see, reported without a forward pass."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from thinkviz.cli import main
from thinkviz.core.engine import DecodeSettings, Run
from tiny_models import tiny_model
from thinkviz.policies import make_policy
from thinkviz.policies.think_drop import block_states
from thinkviz.measure.replay import load_trace, prepare


@pytest.mark.parametrize("preset", ["think_drop_syntax_error", "think_drop_lru"])
@pytest.mark.slow
def test_inspect_json_matches_what_a_replay_segments(preset, capsys):
    assert main(["inspect", preset, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"turns", "segments", "think_blocks", "protected_tokens", "reasoning"}
    assert report["reasoning"]["rule"] == "prompted"  # SmolLM2 has no reasoning format of its own

    loaded = tiny_model("llama", max_context=8192)  # the SmolLM2 tokenizer, as the CLI's embedded default
    prompt, ids = prepare(loaded, load_trace(preset))
    run = Run(loaded, make_policy("full", interval=64), prompt, DecodeSettings(scoring=False))
    for _ in run.replay(ids):
        pass
    segmenter = run.segmenter
    assert report["segments"] == dict(Counter(span["kind"] for span in run.record.segments))
    assert report["think_blocks"] == [{**b, "tokens": b["end"] - b["start"]} for b in block_states(segmenter)]
    assert report["protected_tokens"] == int(segmenter.protected_mask().sum())
    assert [(t["role"], t["start"]) for t in report["turns"]] == [(r.role, r.start) for r in prompt.roles]
    assert report["turns"][-1]["end"] == len(run.ids)
    if preset == "think_drop_syntax_error":  # the converted transcript: tool turns and a second user turn
        assert [t["role"] for t in report["turns"]].count("tool") == 4 and report["segments"]["user"] == 2
        assert [b["code"] for b in report["think_blocks"]] == ["parsed", "syntax error", "parsed", "parsed"]
        assert [t["prefilled"] for t in report["turns"]] == [True, True] + [False] * 10


def test_inspect_text_output_and_protection_toggles(capsys):
    assert main(["inspect", "think_drop_syntax_error"]) == 0
    out = capsys.readouterr().out
    assert "turns:" in out and "tool" in out and "code after it: syntax error" in out
    assert main(["inspect", "think_drop_syntax_error", "--json", "--no-protect-question"]) == 0
    unprotected = json.loads(capsys.readouterr().out)
    system = unprotected["turns"][0]["tokens"]
    assert system < unprotected["protected_tokens"]  # the system prompt plus the signature in the question


@pytest.mark.parametrize(
    "content, reason",
    [
        ('[{"role": "assistant", "content": "a"}]', "message 1 is an assistant message"),
        (
            '[{"role": "user", "content": "q"}, {"role": "robot", "content": "a"}]',
            "message 2 of 2: unknown role 'robot'",
        ),
        ('[{"role": "user", "content": "only a question"}]', "nothing after its first user message"),
    ],
)
def test_inspect_bad_transcripts_exit_2_with_one_line(tmp_path, capsys, content, reason):
    path = tmp_path / "t.json"
    path.write_text(content, encoding="utf-8")
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("thinkviz: error: ") and reason in err


def test_inspect_binary_file_and_unknown_model(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\x00\x01\x02")
    assert main(["inspect", str(path)]) == 2
    assert "binary" in capsys.readouterr().err
    assert main(["inspect", "think_drop_lru", "--model", "./no/such/folder"]) == 2
    assert "not found" in capsys.readouterr().err
