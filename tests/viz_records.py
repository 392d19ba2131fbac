"""Real run records for the renderer tests: a tiny random Llama driven by the engine."""

from __future__ import annotations

from thinkviz.text.chat import build_chat
from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.core.kvquant import KVQuant
from thinkviz.policies import make_policy

TRACE = (
    "Plan the fix first.\n\nCheck the edge cases: empty input, spaces, and a trailing colon.</think>\n"
    "```python\ndef parse(s):\n    return int(s)\n```\n<think>\nThe test failed on '1:02'.\n\n"
    "Split on the colon and add the parts.</think>\nUse split(':')."
)


def replayed(loaded, policy: str, **params) -> Run:
    """Replay :data:`TRACE` (two closed think blocks, code, answers) through ``policy``."""
    params = {"budget": 24, "interval": 3, **params}
    chat = build_chat(loaded.tokenizer, "Be brief.", "Fix parse(s).")
    run = Run(loaded, make_policy(policy, **params), chat, DecodeSettings(snapshot_limit=8))
    for _ in run.replay(loaded.tokenizer(TRACE, add_special_tokens=False)["input_ids"]):
        pass
    return run


def generated(loaded, policy: str, steps: int = 40, kv_quant: KVQuant = KVQuant(), **params) -> Run:
    """Generate ``steps`` tokens greedily from a short chat through ``policy``, the cache in ``kv_quant``."""
    params = {"budget": 20, **params}
    chat = build_chat(loaded.tokenizer, "Be brief.", "What is 2+2?")
    run = Run(
        loaded,
        make_policy(policy, **params),
        chat,
        DecodeSettings(max_new_tokens=steps, stop_at_eos=False, snapshot_limit=8),
        kv_quant=kv_quant,
    )
    for _ in run.generate():
        pass
    return run
