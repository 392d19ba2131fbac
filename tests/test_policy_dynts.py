"""dynts (DynTS, dynamic thinking-token selection) and its importance predictor: labels, files,
fallback, what always survives."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from thinkviz import predictor as P
from thinkviz.measure.answer_attention import attention_maps
from thinkviz.cli import main
from thinkviz.core.engine import DecodeSettings, Run
from thinkviz.policies import make_policy
from thinkviz.policies.dynts import DynTS

from thought_trace import chat_and_trace


def _predictor(hidden_size, seed=0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        predictor = P.ImportancePredictor(hidden_size)
    predictor.mean.normal_()
    predictor.std.uniform_(0.5, 2.0)
    return predictor.eval()


def _save_for(loaded, folder, hidden_size=None, model=None):
    hidden_size = hidden_size or loaded.model.config.hidden_size
    predictor = _predictor(hidden_size)
    meta = P.PredictorMeta(model=model or loaded.name, hidden_size=hidden_size, width=predictor.width)
    P.save(predictor, meta, P.predictor_path(loaded.name, folder))
    return predictor


def _replay(loaded, budget, recent=8, **knobs):
    prompt, trace = chat_and_trace(loaded.tokenizer)
    run = Run(loaded, make_policy("dynts", budget=budget, interval=4, recent=recent, **knobs), prompt, DecodeSettings())
    return run, list(run.replay(trace))


def test_question_and_local_window_always_survive_with_a_predictor(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setattr(DynTS, "predictor_folder", tmp_path)
    predictor = _save_for(tiny_llama, tmp_path)
    budget = len(chat_and_trace(tiny_llama.tokenizer)[0].ids) + 24
    run, events = _replay(tiny_llama, budget)
    protected = np.flatnonzero(run.segmenter.protected_mask())
    assert any(e.evicted for e in events)
    for event in events:
        assert event.info["importance"] == f"predicted by {P.predictor_path(tiny_llama.name).name}"
        assert np.all(event.keep_fraction[protected] == 1.0)
        newest = event.positions[-1]
        assert np.all(event.keep_fraction[newest - 7 : newest + 1] == 1.0)
        assert event.kv_tokens <= budget + 4
    # the score of every held position is the predictor's exp(output) on its hidden state
    last = events[-1]
    held = np.flatnonzero(last.keep_fraction > 0)
    with torch.inference_mode():
        want = predictor.head(run.hidden, P.position_features(len(run.hidden))).exp().numpy()
    assert np.allclose(last.scores[held], want[held], rtol=1e-5)


def test_missing_predictor_falls_back_to_attention_and_says_why(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setattr(DynTS, "predictor_folder", tmp_path)
    run, events = _replay(tiny_llama, budget=100)
    info = events[-1].info["importance"]
    assert info.startswith("attention fallback: no predictor trained for tiny-llama (random)")
    assert "train-predictor" in info
    # the fallback score is h2o's: attention received, summed over every query (normalize=none)
    h2o = make_policy("h2o", budget=100).score(run._view())
    assert torch.equal(run.policy.score(run._view()), h2o)


def _write_eval(loaded, folder, predictor_rho, fallback_rho, blend_rho=None):
    table = {
        "heldout_traces": ["t"],
        "scorers": {
            "predictor": {"spearman": predictor_rho, "precision_at_30": 0.5},
            "fallback": {"spearman": fallback_rho, "precision_at_30": 0.5},
        }
        | ({"blend": {"spearman": blend_rho, "precision_at_30": 0.5}} if blend_rho is not None else {}),
    }
    P.eval_path(P.predictor_path(loaded.name, folder)).write_text(json.dumps(table))


FILE = "dynts_tiny-llama-random.safetensors"


@pytest.mark.parametrize(
    "scorer, measured, says",
    [
        (
            "auto",
            (0.4, 0.8),
            "attention fallback (scorer: auto; held-out Spearman predictor 0.40, fallback 0.80): "
            "attention ranked held-out traces best",
        ),
        ("auto", (0.9, 0.8), f"predicted by {FILE} (scorer: auto; held-out Spearman predictor 0.90, fallback 0.80)"),
        (
            "auto",
            (0.4, 0.8, 0.85),
            f"blend of {FILE} (weight {P.BLEND_WEIGHT:g}) and attention so far "
            "(scorer: auto; held-out Spearman predictor 0.40, fallback 0.80, blend 0.85)",
        ),
        (
            "auto",
            (0.4, 0.8, 0.7),
            "attention fallback (scorer: auto; held-out Spearman predictor 0.40, fallback 0.80, blend 0.70): "
            "attention ranked held-out traces best",
        ),
        (  # a table whose predictor row could not be measured (null): the measured rows decide
            "auto",
            (None, 0.8),
            "attention fallback (scorer: auto; held-out Spearman fallback 0.80): attention ranked held-out traces best",
        ),
        ("predictor", (0.4, 0.8), f"predicted by {FILE}"),
        ("blend", (0.4, 0.8), f"blend of {FILE} (weight {P.BLEND_WEIGHT:g}) and attention so far"),
        ("attention", (0.9, 0.8), "attention received so far (scorer: attention)"),
    ],
)
def test_the_scorer_knob_and_the_evaluation_table_pick_the_score(
    tiny_llama, tmp_path, monkeypatch, scorer, measured, says
):
    monkeypatch.setattr(DynTS, "predictor_folder", tmp_path)
    predictor = _save_for(tiny_llama, tmp_path)
    _write_eval(tiny_llama, tmp_path, *measured)
    run, events = _replay(tiny_llama, budget=100, scorer=scorer)
    assert events[-1].info["importance"] == says
    view = run._view()
    attention = make_policy("h2o", budget=100).score(view)
    with torch.inference_mode():
        predicted = view.by_position(predictor.head(run.hidden, P.position_features(len(run.hidden))))
    want = {"attention": attention, "predicted": predicted.exp(), "blend": P.blend(attention, predicted).exp()}
    assert torch.allclose(run.policy.score(view), want[says.split()[0]], rtol=1e-5)


def test_a_blend_of_weight_zero_keeps_what_attention_keeps(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setattr(DynTS, "predictor_folder", tmp_path)
    _save_for(tiny_llama, tmp_path)

    budget = len(chat_and_trace(tiny_llama.tokenizer)[0].ids) + 24

    def kept(**knobs):
        _, events = _replay(tiny_llama, budget, **knobs)
        assert any(e.evicted for e in events)
        return [e.keep_fraction for e in events]

    attention, zero = kept(scorer="attention"), kept(scorer="blend", weight=0.0)
    heavy = kept(scorer="blend", weight=8.0)
    assert all(np.array_equal(a, z) for a, z in zip(attention, zero, strict=True))
    assert not all(np.array_equal(a, h) for a, h in zip(attention, heavy, strict=True))


def test_blend_standardises_each_row_over_the_slots_held():
    attention = torch.tensor([[1.0, 2.0, 4.0, 8.0], [8.0, 4.0, 2.0, 1.0]])
    predicted = torch.tensor([3.0, 2.0, 1.0, 0.0])  # the first row's order reversed, the second's kept
    assert torch.equal(P.blend(attention, predicted, 0.0).argsort(-1), attention.argsort(-1))
    assert torch.equal(P.blend(attention, predicted, 8.0).argsort(-1)[0], predicted.argsort())
    assert torch.allclose(P.blend(attention, predicted, 1.0)[0], torch.zeros(4), atol=1e-6)  # equal and opposite
    valid = torch.tensor([[True, True, True, False], [True, True, True, True]])
    held = P.blend(attention, predicted, 1.0, valid)
    assert torch.isnan(held[0, 3]) and not held[1].isnan().any()
    # the slot not held changes neither the mean nor the spread of the others
    assert torch.allclose(held[0, :3], P.blend(attention[:1, :3], predicted[:3], 1.0)[0])


@pytest.mark.parametrize("hidden_size, model", [(32, None), (None, "another model")])
def test_mismatched_predictor_is_refused_and_labelled(tiny_llama, tmp_path, monkeypatch, hidden_size, model):
    monkeypatch.setattr(DynTS, "predictor_folder", tmp_path)
    _save_for(tiny_llama, tmp_path, hidden_size=hidden_size, model=model)
    _, events = _replay(tiny_llama, budget=100)
    info = events[-1].info["importance"]
    assert info.startswith("attention fallback: ") and "was trained for" in info
    assert f"not {tiny_llama.name} (hidden size {tiny_llama.model.config.hidden_size})" in info


def test_a_predictor_reading_a_layer_the_model_lacks_falls_back_and_says_why(tiny_llama, tmp_path, monkeypatch):
    depth = tiny_llama.model.config.num_hidden_layers
    predictor = P.ImportancePredictor(64, width=8, layers=(0, depth + 1))
    meta = P.PredictorMeta(model=tiny_llama.name, hidden_size=64, width=8, layers=(0, depth + 1))
    path = P.save(predictor, meta, P.predictor_path(tiny_llama.name, tmp_path))
    monkeypatch.setattr(DynTS, "predictor_folder", tmp_path)
    run, events = _replay(tiny_llama, budget=100)
    assert run.hidden is None and any(e.evicted for e in events)
    assert events[-1].info["importance"] == (
        f"attention fallback: {path.name} reads hidden states 0,{depth + 1}, "
        f"but {tiny_llama.name} has only 0 .. {depth} (embeddings, {depth} layers)"
    )


def test_save_load_round_trip(tmp_path):
    predictor = _predictor(24, seed=3)
    meta = P.PredictorMeta(model="m", hidden_size=24, width=64, heldout_spearman=0.42, trained_on="a,b")
    path = P.save(predictor, meta, tmp_path / "p.safetensors")
    loaded, loaded_meta = P.load(path)
    assert loaded_meta == meta
    x, where = torch.randn(7, 24), P.position_features(7)
    assert torch.equal(loaded(x, where), predictor(x, where))


def test_a_predictor_saved_again_keeps_its_fingerprint_and_a_changed_one_does_not(tmp_path, monkeypatch):
    monkeypatch.setattr(DynTS, "predictor_folder", tmp_path)
    predictor = _predictor(24, seed=3)
    meta = P.PredictorMeta(model="m", hidden_size=24, width=64, heldout_spearman=0.5, trained_on="a,b")
    path = P.save(predictor, meta, P.predictor_path("m", tmp_path))
    first = DynTS.file_fingerprints("m")[path.name]
    size = int.from_bytes(path.read_bytes()[:8], "little")
    header = json.loads(path.read_bytes()[8 : 8 + size])
    header["__metadata__"] = dict(reversed(header["__metadata__"].items()))  # the order safetensors may write
    text = json.dumps(header, separators=(",", ":")).encode().ljust(size)
    path.write_bytes(size.to_bytes(8, "little") + text + path.read_bytes()[8 + size :])
    assert P.load(path)[1] == meta
    assert DynTS.file_fingerprints("m")[path.name] == first
    with torch.no_grad():
        predictor.mean[0] += 1
    P.save(predictor, meta, path)
    assert DynTS.file_fingerprints("m")[path.name] != first
    P.save(_predictor(24, seed=3), P.PredictorMeta(model="m", hidden_size=24, width=64, trained_on="c"), path)
    assert DynTS.file_fingerprints("m")[path.name] != first  # other metadata


def test_a_mix_of_layers_round_trips_and_dynts_ranks_with_the_layers_it_reads(tiny_llama, tmp_path, monkeypatch):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        predictor = P.ImportancePredictor(64, width=8, layers=(0, 1, -1))
    predictor.mix.data.normal_()
    meta = P.PredictorMeta(model=tiny_llama.name, hidden_size=64, width=8, layers=(0, 1, -1), heldout_spearman=0.5)
    path = P.save(predictor, meta, P.predictor_path(tiny_llama.name, tmp_path))
    loaded, loaded_meta = P.load(path)
    assert loaded_meta == meta and loaded.layers == (0, 1, -1)
    x, where = torch.randn(5, 3, 64), P.position_features(5)
    assert torch.equal(loaded(x, where), predictor(x, where))
    monkeypatch.setattr(DynTS, "predictor_folder", tmp_path)
    # nothing evicted: the engine hands dynts the embeddings, the first layer's output and the
    # final norm's, the hidden states the predictor is trained on (one teacher-forced pass), and
    # the run keeps only the predictor's encoding of them: 8 numbers per token instead of 3 × 64
    whole, _ = _replay(tiny_llama, budget=4096)
    _, features = attention_maps(tiny_llama, whole.ids[: len(whole.hidden)], (0, 1, -1))
    assert features.shape == (len(whole.hidden), 3, 64) and whole.hidden.shape == (len(whole.hidden), 8)
    with torch.inference_mode():
        assert torch.allclose(whole.hidden, predictor.encode(features), atol=1e-4)
        rolled = predictor.encode(features.roll(1, dims=1))  # the layers in another order
        assert not torch.allclose(whole.hidden, rolled, atol=1e-2)
    run, events = _replay(tiny_llama, budget=100)
    assert any(e.evicted for e in events)
    assert events[-1].info["importance"] == f"predicted by {path.name}"
    last = events[-1]
    held = np.flatnonzero(last.keep_fraction > 0)
    with torch.inference_mode():  # (under eviction the later hidden states differ from a full pass's)
        want = predictor.head(run.hidden, P.position_features(len(run.hidden))).exp().numpy()
    assert np.allclose(last.scores[held], want[held], rtol=1e-5)


def test_unreadable_files_give_one_line_reasons(tmp_path):
    with pytest.raises(P.PredictorError, match="no predictor file"):
        P.load(tmp_path / "missing.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x80\x04not a safetensors file")
    with pytest.raises(P.PredictorError, match="not a readable safetensors file"):
        P.load(junk)
    pickled = tmp_path / "pickled.safetensors"
    torch.save(_predictor(4).state_dict(), pickled)  # a pickle archive is never unpickled
    with pytest.raises(P.PredictorError, match="not a readable safetensors file"):
        P.load(pickled)
    from safetensors.torch import save_file

    other = tmp_path / "other.safetensors"
    save_file({"w": torch.zeros(2)}, str(other), metadata={"format": "something else"})
    with pytest.raises(P.PredictorError, match="not a ThinkViz DynTS predictor"):
        P.load(other)


def test_train_predictor_refuses_an_unknown_holdout(capsys):
    assert main(["train-predictor", "--holdout", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("thinkviz: error: --holdout nope: unknown preset 'nope'")
    assert "math_tilings" in err and len(err.splitlines()) == 1


@pytest.mark.integration
def test_shipped_predictor_ranks_when_asked_and_auto_follows_its_evaluation(embedded_model):
    path = P.predictor_path(embedded_model.name)
    _, meta = P.load(path)
    assert meta.model == embedded_model.name and meta.hidden_size == embedded_model.model.config.hidden_size
    assert meta.layers == (0, 6, 12, 18, 24, 30)  # train-predictor --layers auto: six of the 31 hidden states
    measured = json.loads(P.eval_path(path).read_text())["scorers"]
    prompt, trace = chat_and_trace(embedded_model.tokenizer)

    def replay(scorer):
        run = Run(
            embedded_model,
            make_policy("dynts", budget=len(prompt.ids) + 32, interval=16, recent=8, scorer=scorer),
            prompt,
            DecodeSettings(),
        )
        events = list(run.replay(trace[:64]))
        assert events[-1].kv_tokens < len(prompt.ids) + 64  # it evicted (per head, when attention ranks)
        return events

    def importance(scorer):
        return replay(scorer)[-1].info["importance"]

    predicted = replay("predictor")
    assert predicted[-1].info["importance"] == f"predicted by {path.name}"
    assert any(e.evicted for e in predicted)  # one score for every head: whole tokens go
    best = max(("predictor", "fallback", "blend"), key=lambda name: measured[name]["spearman"])
    opening = {"predictor": f"predicted by {path.name}", "fallback": "attention fallback", "blend": "blend of"}
    auto = importance("auto")
    assert auto.startswith(opening[best]) and "(scorer: auto; held-out Spearman predictor " in auto


def test_every_token_reports_its_predicted_importance_as_written_whichever_score_ranks(
    tiny_llama, tmp_path, monkeypatch
):
    monkeypatch.setattr(DynTS, "predictor_folder", tmp_path)
    predictor = _save_for(tiny_llama, tmp_path)
    run, events = _replay(tiny_llama, budget=100, scorer="attention")
    assert events[-1].info["importance"] == "attention received so far (scorer: attention)"
    covered = []
    for event in events:
        start, values = event.info["predicted_from"], event.info["predicted"]
        seen = start + len(values)  # the tokens written so far, this step's included
        assert seen == max(event.positions) + 1
        with torch.inference_mode():
            want = predictor.head(run.hidden[start:seen], P.position_features(seen)[start:seen]).exp()
        assert np.allclose(values, want.numpy(), rtol=1e-5)
        covered += range(start, seen)
    assert covered == list(range(len(run.hidden)))  # each token once, in order


def test_position_features_tell_age_apart_from_relative_position():
    short, long = P.position_features(300), P.position_features(3000)
    assert short.shape == (300, 4) and long.shape == (3000, 4)
    # 50 tokens back in 300 and 500 back in 3,000 sit at the same relative position, not the same age
    assert short[250, 0] == pytest.approx(long[2500, 0])
    assert long[2500, 1] > short[250, 1]
    assert torch.all(torch.diff(long[:, 1]) < 0) and torch.all(torch.diff(long[:, 2]) > 0)  # age falls, position rises
    assert torch.all(long[:, 3] == long[0, 3]) and long[0, 3] > short[0, 3]  # the text's length, per trace
    assert torch.all((long >= 0) & (long < 1.01))


def test_a_predictor_of_an_older_version_is_refused(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "old.safetensors"
    tensors = {k: v.contiguous() for k, v in _predictor(8).state_dict().items()}
    save_file(tensors, str(path), metadata={"format": P.FORMAT, "version": "2", "model": "m", "hidden_size": "8"})
    with pytest.raises(P.PredictorError, match="not a ThinkViz DynTS predictor \\(version 3\\)"):
        P.load(path)
