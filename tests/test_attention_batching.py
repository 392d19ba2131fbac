"""The attention hooks reduce the weights of several layers at once (``attention.BATCH_BYTES``):
whatever the bound, a run decides and shows exactly what layer-by-layer reductions give."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from thinkviz.core import attention
from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.policies import make_policy
from tiny_models import tiny_model

pytestmark = pytest.mark.slow  # every batching bound replays the model layer by layer

BOUNDS = (0, 3000, 1 << 40)  # every layer alone, a few layers at a time, a whole forward at once


@pytest.fixture(scope="module")
def five_layers():
    """A 5-layer tiny Llama: enough layers for a bound to split a forward into several batches."""
    return tiny_model("llama", layers=5)


def _run(loaded, monkeypatch, bound: int, policy: str, replay: bool):
    monkeypatch.setattr(attention, "BATCH_BYTES", bound)
    vocab = loaded.model.config.vocab_size
    ids = torch.randint(10, vocab, (120,), generator=torch.Generator().manual_seed(1)).tolist()
    settings = DecodeSettings(max_new_tokens=24, stop_at_eos=False, prefill_chunk=16)
    run = Run(loaded, make_policy(policy, budget=40, interval=4), ids[:50], settings)
    taken, take = [], run.capture.take

    def recorded():
        scores = take()
        taken.append(scores)
        return scores

    run.capture.take = recorded
    events = list(run.replay(ids[50:]) if replay else run.generate())
    return events, run.record, taken


@pytest.mark.parametrize("replay", [False, True], ids=["decode", "replay"])
@pytest.mark.parametrize("policy", ["h2o", "pyramidkv", "entropy"])
def test_any_batching_bound_gives_the_layer_by_layer_run(five_layers, monkeypatch, policy, replay):
    runs = [_run(five_layers, monkeypatch, bound, policy, replay) for bound in BOUNDS]
    (reference, reference_record, reference_scores), others = runs[0], runs[1:]
    assert any(event.compressed for event in reference)
    if policy == "pyramidkv":  # layers of different lengths: batches of unequal shapes are split
        assert len(set(reference_record.events[-1].kept.max(-1).tolist())) > 1
    for events, record, taken in others:
        assert len(taken) == len(reference_scores)
        for scores, expected in zip(taken, reference_scores):  # each layer's own rows, in layer order
            for field in ("received", "tail", "row_entropy"):
                torch.testing.assert_close(getattr(scores, field), getattr(expected, field), rtol=1e-5, atol=1e-6)
        assert [e.token_ids for e in events] == [e.token_ids for e in reference]
        assert [e.evicted for e in events] == [e.evicted for e in reference]
        for event, expected in zip(events, reference):
            np.testing.assert_allclose(event.scores, expected.scores, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(event.kept, expected.kept)
        assert record.snapshots.keys() == reference_record.snapshots.keys()
        for step, mask in record.snapshots.items():
            np.testing.assert_array_equal(mask, reference_record.snapshots[step])
