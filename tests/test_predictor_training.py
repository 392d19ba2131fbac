"""Training the DynTS predictor: the corpus, its labels, the evaluation measures, the fit."""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from thinkviz.measure import answer_attention as A
from thinkviz import predictor as P
from thinkviz.text.chat import build_chat
from thinkviz.commands.predictor_training import corpus as C
from thinkviz.commands.predictor_training import evaluate as E
from thinkviz.commands.predictor_training import fit as F
from thinkviz.commands.predictor_training import histories as H
from thinkviz.commands.predictor_training import labels as L
from thinkviz.commands.predictor_training.prompts import CorpusPrompt, corpus_prompts, prompt_set_digest
from thinkviz.measure.replay import Trace

from thought_trace import QUESTION, SYSTEM, TRACE


# ---- labels -------------------------------------------------------------------------------
def _one_forward_maps(loaded, system, question, trace):
    """The attention maps, hidden states and split of a trace from one plain HF forward."""
    cut = trace.rfind("</think>") + len("</think>")
    prompt = build_chat(loaded.tokenizer, system, question, assistant="<think>\n" + trace[:cut])
    answer = loaded.tokenizer(trace[cut:], add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        out = loaded.model(torch.tensor([prompt.ids + answer]), output_attentions=True, output_hidden_states=True)
    maps = torch.stack([a[0] for a in out.attentions])  # (L, H, N, N)
    return prompt, answer, maps, out.hidden_states


@pytest.mark.parametrize("chunk", [A.CHUNK, 7])
def test_labels_are_the_attention_paid_by_the_answer(tiny_llama, monkeypatch, chunk):
    monkeypatch.setattr(A, "CHUNK", chunk)  # a long trace is labelled in chunks over a KV cache
    examples = L.label_trace(tiny_llama, "t", SYSTEM, QUESTION, TRACE, layers=(0, -1))
    prompt, answer, maps, hidden = _one_forward_maps(tiny_llama, SYSTEM, QUESTION, TRACE)
    n = len(prompt.ids)
    want = maps[:, :, n:, :n].sum(2).mean((0, 1)) / len(answer)  # (n,)
    assert examples.labels.shape == (n,) and torch.allclose(examples.labels, want, atol=1e-6)
    # the fallback's view when the answer began: attention from the thinking queries per query
    so_far = maps[:, :, :n, :n].sum(2).mean((0, 1)) / (n - torch.arange(n))
    assert torch.allclose(examples.attention_so_far, so_far, atol=1e-6)
    # h2o when the token leaves its 32-token local window: queries p .. p+31 only
    mean_map = maps[:, :, :n, :n].mean((0, 1))
    p = 40
    assert examples.h2o_at_selection[p] == pytest.approx(float(mean_map[p : p + 32, p].mean()), abs=1e-6)
    assert examples.h2o_at_selection[n - 1] == pytest.approx(float(mean_map[n - 1, n - 1]), abs=1e-6)
    assert examples.features.shape == (n, 2, tiny_llama.model.config.hidden_size)
    assert torch.allclose(examples.features[:, 0], hidden[0][0, :n], atol=1e-5)
    assert torch.allclose(examples.features[:, 1], hidden[-1][0, :n], atol=1e-5)
    assert examples.thinking.sum() == n - prompt.roles[-1].start


def test_transcript_labels_are_the_attention_paid_after_the_last_block(tiny_llama):
    from thinkviz.text.chat import build_conversation
    from thinkviz.text.transcript import Message

    from thought_trace import MESSAGES

    messages = [Message(role, content) for role, content in MESSAGES]
    examples = L.label_transcript(tiny_llama, "t", messages)
    chat = build_conversation(tiny_llama.tokenizer, messages)
    n = len(examples.labels)
    assert "".join(chat.texts[:n]).endswith("</think>")  # everything up to the last block is prefilled
    with torch.inference_mode():
        out = tiny_llama.model(torch.tensor([chat.ids]), output_attentions=True)
    maps = torch.stack([a[0] for a in out.attentions])  # (L, H, N, N)
    want = maps[:, :, n:, :n].sum(2).mean((0, 1)) / (len(chat.ids) - n)
    assert torch.allclose(examples.labels, want, atol=1e-6)
    assistant = [r for r in chat.roles if r.role == "assistant" and r.start < n]
    assert int(examples.thinking.sum()) == sum(min(r.end, n) - r.start for r in assistant)
    assert not examples.thinking[: chat.roles[1].end].any()


def test_a_trace_without_an_answer_cannot_be_labelled(tiny_llama):
    with pytest.raises(ValueError, match="no </think>"):
        L.label_trace(tiny_llama, "t", SYSTEM, QUESTION, "thinking that never ends")
    with pytest.raises(ValueError, match="nothing after its last </think>"):
        L.label_trace(tiny_llama, "t", SYSTEM, QUESTION, "done\n</think>\n  ")


def test_a_transcript_closes_its_thinking_only_in_an_assistant_turn(tiny_llama):
    """The system prompt's or a user's ``</think>`` is text, not the end of anyone's thinking: a
    transcript whose assistant never closes one has no answer, and one quoted later does not move the cut."""
    from thinkviz.text.chat import build_conversation
    from thinkviz.text.transcript import Message

    quoted = [
        Message("system", "Think inside <think>…</think>, then answer."),
        Message("user", "What is 2 + 2?"),
        Message("assistant", "<think>\nTwo and two.\n</think>\n\nFour."),
        Message("user", "Why did you write </think> there?"),
    ]
    examples = L.label_transcript(tiny_llama, "t", quoted)
    chat = build_conversation(tiny_llama.tokenizer, quoted)
    assert "".join(chat.texts[: len(examples.labels)]).endswith("Two and two.\n</think>")
    for messages in (
        quoted[:2] + [Message("assistant", "Four.")],
        quoted[:2] + [Message("assistant", "Hm.\n</think>")],
    ):
        with pytest.raises(ValueError, match="no </think> in an assistant turn|nothing after its last </think>"):
            L.label_transcript(tiny_llama, "t", messages)
        with pytest.raises(ValueError):
            L.check_answered(Trace.of_transcript("t", messages))


# ---- evaluation measures ------------------------------------------------------------------
def test_spearman_on_hand_numbers():
    assert E.spearman([1, 2, 3], [10, 20, 35]) == pytest.approx(1.0)
    assert E.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # ties share their average rank: ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4)
    assert E.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(4.5 * 5))
    assert math.isnan(E.spearman([1, 1, 1], [1, 2, 3]))


def test_precision_at_30_counts_the_true_top_found():
    truth = np.arange(10.0)  # the true top 30 % is {7, 8, 9}
    assert E.precision_at(truth, truth) == 1.0
    assert E.precision_at(-truth, truth) == 0.0
    assert E.precision_at([0.5, 0, 0, 0, 0, 0, 0, 9, 8, 0], truth) == pytest.approx(2 / 3)
    assert E.precision_at(np.arange(7.0), np.arange(7.0), fraction=0.3) == 1.0  # k = ceil(2.1) = 3


def _synthetic(name, n=200, seed=0):
    """Tokens whose label is a known function of their first feature and of their position."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(n, 1, 6, generator=generator)
    labels = torch.exp(2 * features[:, 0, 0]) * 1e-3
    thinking = torch.ones(n, dtype=torch.bool)
    thinking[:20] = False  # the prompt is not ranked
    reversed_labels = labels.flip(0)  # a fallback that ranks exactly backwards
    return L.Examples(name, features, labels, thinking, reversed_labels, labels.clone())


def test_the_table_ranks_scorers_of_known_quality():
    heldout = [_synthetic("a"), _synthetic("b", seed=1)]
    table = E.scorer_table(
        {"a": heldout[:1], "b": heldout[1:]}, lambda features, relative: features[:, 0, 0]
    )  # a perfect predictor
    assert table["heldout_traces"] == ["a", "b"]
    scorers = table["scorers"]
    assert set(scorers) == {"predictor", "fallback", "blend", "recency", "h2o"}
    assert scorers["predictor"] == {"spearman": pytest.approx(1.0), "precision_at_30": 1.0}
    assert scorers["h2o"]["spearman"] == pytest.approx(1.0)  # h2o's score is the label itself here
    assert abs(scorers["recency"]["spearman"]) < 0.2  # labels do not depend on position
    per_trace = table["per_trace"]["a"]["fallback"]["spearman"]
    assert per_trace == pytest.approx(E.spearman(heldout[0].labels.flip(0)[20:], heldout[0].labels[20:]))
    assert "predictor" in E.format_table(table)
    grouped = E.scorer_table({"both": heldout}, lambda features, relative: features[:, 0, 0])
    assert grouped["per_trace"]["both"]["recency"]["spearman"] == pytest.approx(scorers["recency"]["spearman"])


def test_the_blend_ranks_between_a_noisy_predictor_and_a_perfect_fallback():
    generator = torch.Generator().manual_seed(1)
    noisy = lambda features, relative: features[:, 0, 0] + 3 * torch.randn(len(features), generator=generator)  # noqa: E731
    made = _synthetic("a")
    perfect = L.Examples("a", made.features, made.labels, made.thinking, made.labels.clone(), made.labels)
    rho = {name: m["spearman"] for name, m in E.scorer_table({"a": [perfect]}, noisy)["scorers"].items()}
    assert rho["predictor"] < rho["blend"] < rho["fallback"] == pytest.approx(1.0)


def test_the_table_is_written_as_json_with_nan_as_null(tmp_path):
    table = E.scorer_table(
        {"a": [_synthetic("a")]}, lambda features, relative: torch.zeros(len(features))
    )  # constant: NaN
    path = E.write_table(table, tmp_path / "eval.json")
    data = json.loads(path.read_text())
    assert data["scorers"]["predictor"]["spearman"] is None
    assert data["scorers"]["predictor"]["precision_at_30"] == pytest.approx(
        E.precision_at(torch.zeros(180), _synthetic("a").labels[20:])
    )


# ---- the corpus ---------------------------------------------------------------------------
def test_the_prompt_set_has_200_distinct_prompts_of_three_kinds_taken_in_turn():
    prompts = corpus_prompts()
    assert len(prompts) >= 200 and len({p.question for p in prompts}) == len(prompts)
    assert [p.kind for p in prompts[:6]] == ["math", "code", "explain"] * 2
    assert corpus_prompts() == prompts and prompt_set_digest(prompts) == prompt_set_digest(corpus_prompts())


def _scripted(tiny_llama):
    """A copy of the tiny Llama rewired so its next token depends only on the current one: after the
    prompt's last token it says either "Hmm" (then "Hmm" forever: never an answer) or
    "</think> ok" (then the end of the turn), each half of the time when sampled."""
    tiny_llama = dataclasses.replace(tiny_llama, model=copy.deepcopy(tiny_llama.model))  # the fixture is shared
    tokenizer, model = tiny_llama.tokenizer, tiny_llama.model
    for layer in model.model.layers:  # the residual stream stays the token's embedding
        layer.self_attn.o_proj.weight.data.zero_()
        layer.mlp.down_proj.weight.data.zero_()
    last = C.generation_prompt(tokenizer, "q")[-1]
    hmm = tokenizer(" Hmm", add_special_tokens=False)["input_ids"]
    close = tokenizer("</think> ok", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert len(hmm) == 1 and len(set(close)) == len(close) and last not in close + hmm
    size = model.config.hidden_size
    head = torch.zeros_like(model.lm_head.weight)
    for axis, token in enumerate([last, *hmm, *close]):  # orthogonal embeddings: no cross-talk
        model.model.embed_tokens.weight.data[token] = torch.eye(size)[axis] * size**0.5
    for current, following in [(last, hmm[0]), (last, close[0]), (hmm[0], hmm[0]), *zip(close, close[1:])]:
        head[following] += 4 * model.model.embed_tokens.weight.data[current]
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(head)
    return tiny_llama


def test_corpus_generation_is_deterministic_cached_and_skips_unanswered(tiny_llama, tmp_path, monkeypatch):
    loaded = _scripted(tiny_llama)
    prompts = [CorpusPrompt("math", f"What is {i} plus {i}?") for i in range(12)]
    settings = C.GenerationSettings(seed=3, batch_size=4, think_tokens=6, answer_tokens=8)
    monkeypatch.setenv("THINKVIZ_CACHE", str(tmp_path / "one"))
    first = C.build_corpus(loaded, prompts, 10, settings)
    assert [g.index for g in first] == list(range(10))
    assert {g.kept for g in first} == {True, False}
    for g in first:
        assert g.kept == C.is_answered(g.text)
        assert g.text.strip() == ("</think> ok" if g.kept else " ".join(["Hmm"] * 6))  # dropped rows stop at the limit
    monkeypatch.setenv("THINKVIZ_CACHE", str(tmp_path / "two"))
    assert C.build_corpus(loaded, prompts, 10, settings) == first  # same seed, same corpus
    path = C.corpus_cache_path(loaded, prompts, settings)
    assert len(path.read_text().splitlines()) == 3  # whole batches of 4 are cached

    def no_generation(*args, **kwargs):
        raise AssertionError("the cached corpus should have been read")

    monkeypatch.setattr(loaded.model, "generate", no_generation)
    assert C.build_corpus(loaded, prompts, 12, settings)[:10] == first


def test_a_batch_cut_short_by_a_crash_is_generated_again(tiny_llama, tmp_path, monkeypatch):
    loaded = _scripted(tiny_llama)
    prompts = [CorpusPrompt("math", f"What is {i} plus {i}?") for i in range(8)]
    settings = C.GenerationSettings(seed=1, batch_size=4, think_tokens=4, answer_tokens=4)
    monkeypatch.setenv("THINKVIZ_CACHE", str(tmp_path))
    whole = C.build_corpus(loaded, prompts, 8, settings)
    path = C.corpus_cache_path(loaded, prompts, settings)
    text = path.read_text()
    path.write_text(text[: len(text) - 40])  # the second batch's line lost its end
    assert C.build_corpus(loaded, prompts, 8, settings) == whole
    assert path.read_text() == text


def test_batched_generation_equals_one_prompt_at_a_time(tiny_llama):
    prompts = [
        CorpusPrompt("code", q)
        for q in ("Write a function.", "Explain caches to me in detail, please.", "Why?", "Add 2 and 3.")
    ]
    settings = C.GenerationSettings(batch_size=4, temperature=0.0, think_tokens=12, answer_tokens=4)
    batched = C.generate_batch(tiny_llama, prompts, 0, settings, seed=0)
    alone = [C.generate_batch(tiny_llama, [p], i, settings, seed=0)[0] for i, p in enumerate(prompts)]
    assert batched == alone


# ---- the fit ------------------------------------------------------------------------------
def test_training_learns_a_ranking():
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(600, 1, 12, generator=generator)
    labels = torch.exp(features[:, 0, 0] - 0.5 * features[:, 0, 3]) * 1e-3
    thinking = torch.ones(400, dtype=torch.bool)
    split = [L.Examples("a", features[:400], labels[:400], thinking, torch.zeros(400), torch.zeros(400))]
    model = F.train(split, epochs=300, seed=0)
    with torch.inference_mode():
        rho = E.spearman(model(features[400:], P.position_features(200)), labels[400:])
    assert rho > 0.9


def test_training_learns_which_layer_to_read():
    """Two layers, only the second carries the signal: the learned mix leans on it."""
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(500, 2, 8, generator=generator)
    labels = torch.exp(features[:, 1, 2]) * 1e-3
    split = [L.Examples("a", features, labels, torch.ones(500, dtype=torch.bool), torch.zeros(500), torch.zeros(500))]
    model = F.train(split, layers=(3, -1), epochs=300, seed=0)
    assert model.layers == (3, -1)
    assert model.mix.softmax(0)[1] > 0.6
    with pytest.raises(ValueError, match="carry 2 layers, the predictor reads 1"):
        F.train(split, layers=(-1,), epochs=1)


def _generation(index, tokens, kept=True):
    text = f"step {index}\n</think>\nanswer {index}" if kept else f"step {index} and no end"
    return C.Generation(index, "math", f"question {index}?", text, tokens, kept)


def test_histories_chain_answered_generations_into_long_deterministic_conversations():
    generations = [_generation(i, 100 + 10 * i, kept=i % 4 != 3) for i in range(40)]
    histories = H.build_histories(generations, 6, tokens=(800, 1200), seed=3)
    assert histories == H.build_histories(generations, 6, tokens=(800, 1200), seed=3)
    assert histories != H.build_histories(generations, 6, tokens=(800, 1200), seed=4)
    assert len(histories) == 6
    by_question = {g.question: g for g in generations}
    for messages in histories:
        assert [m.role for m in messages] == ["system"] + ["user", "assistant"] * ((len(messages) - 1) // 2)
        turns = [by_question[m.content] for m in messages if m.role == "user"]
        assert all(g.kept for g in turns) and len({g.index for g in turns}) == len(turns)  # answered, none twice
        assert [m.content for m in messages if m.role == "assistant"] == ["<think>\n" + g.text for g in turns]
        lengths = [g.new_tokens + H.QUESTION_TOKENS for g in turns]
        assert sum(lengths) >= 800 and sum(lengths[:-1]) < 1200  # it stops once its drawn length is reached
    assert H.build_histories(generations[:1], 3) == [] and H.build_histories(generations, 0) == []


def test_a_history_is_labelled_as_a_transcript_by_its_last_answer(tiny_llama):
    generations = [_generation(i, 20) for i in range(5)]
    (messages,) = H.build_histories(generations, 1, tokens=(60, 60))
    examples = L.label_transcript(tiny_llama, "history", messages)
    # the tokens ranked are every assistant turn up to the last </think>: one run of them per turn
    turns = sum(m.role == "assistant" for m in messages)
    starts = torch.diff(examples.thinking.int(), prepend=torch.zeros(1, dtype=torch.int)) == 1
    assert turns >= 2 and int(starts.sum()) == turns
    assert len(examples.labels) == len(examples.thinking) and examples.labels[examples.thinking].sum() > 0


# ---- the command --------------------------------------------------------------------------
@pytest.mark.slow
def test_train_predictor_builds_the_corpus_fits_and_writes_the_table(tiny_llama, tmp_path, monkeypatch, capsys):
    from thinkviz.cli import main
    from thinkviz.commands import train_predictor

    loaded = _scripted(tiny_llama)
    monkeypatch.setattr(train_predictor, "load_from_args", lambda args: loaded)
    monkeypatch.setenv("THINKVIZ_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "dynts_tiny.safetensors"
    code = main(
        [
            "train-predictor",
            "--generate",
            "16",
            "--think-tokens",
            "6",
            "--holdout",
            "math_tilings",
            "--epochs",
            "3",
            "--layers",
            "auto",
            "--histories",
            "2",
            "--output",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "generations closed </think> and answered" in printed and "math_tilings" in printed
    predictor, meta = P.load(out)
    assert meta.model == loaded.name and meta.layers == (0, 1, 2)  # auto: the embeddings to the final norm
    assert "corpus generations, 2 histories of them" in meta.trained_on and "coding_ratelimit" in meta.trained_on
    table = json.loads(P.eval_path(out).read_text())
    assert table["heldout_traces"][0] == "math_tilings"
    assert set(table["scorers"]) == {"predictor", "fallback", "blend", "recency", "h2o"}
    for scores in table["scorers"].values():
        assert set(scores) == {"spearman", "precision_at_30"}
        assert 0 <= scores["precision_at_30"] <= 1
    assert table["scorers"]["predictor"]["spearman"] == pytest.approx(meta.heldout_spearman)
    assert main(["train-predictor", "--evaluate-only", "--holdout", "math_tilings", "--output", str(out)]) == 0
    assert "dynts_tiny.safetensors" in capsys.readouterr().out
    assert main(["train-predictor", "--evaluate-only", "--output", str(tmp_path / "none.safetensors")]) == 2
    assert capsys.readouterr().err.strip().startswith("thinkviz: error: no predictor file at")


@pytest.mark.slow
def test_train_predictor_relabels_a_corpus_read_from_a_file(tiny_llama, tmp_path, monkeypatch, capsys):
    """--corpus: text generated earlier (say under another 4-bit backend) is labelled, not generated again."""
    from thinkviz.cli import main
    from thinkviz.commands import train_predictor

    loaded = _scripted(tiny_llama)
    prompts = corpus_prompts()
    monkeypatch.setenv("THINKVIZ_CACHE", str(tmp_path / "cache"))
    settings = C.GenerationSettings(think_tokens=6)
    generated = C.build_corpus(loaded, prompts, 16, settings)
    cached = C.corpus_cache_path(loaded, prompts, settings)
    assert C.read_corpus(cached) == generated

    def no_generation(*args, **kwargs):
        raise AssertionError("--corpus should not generate")

    monkeypatch.setattr(loaded.model, "generate", no_generation)
    monkeypatch.setattr(train_predictor, "load_from_args", lambda args: loaded)
    monkeypatch.setenv("THINKVIZ_CACHE", str(tmp_path / "empty"))
    out = tmp_path / "dynts_tiny.safetensors"
    assert (
        main(
            [
                "train-predictor",
                "--corpus",
                str(cached),
                "--holdout",
                "math_tilings",
                "--epochs",
                "2",
                "--histories",
                "1",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    kept = sum(g.kept for g in generated)
    assert f"corpus: {kept} answered of 16 generations read from {cached}" in capsys.readouterr().out
    _, meta = P.load(out)
    assert meta.layers == (0, 1, 2)  # the default, auto: the embeddings to the final norm
    held = sum(g.kept and not g.index % 5 for g in generated)  # every fifth answered one is measured on
    assert meta.trained_on.startswith(f"{kept - held} corpus generations")
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not json\n")
    for path in (garbage, tmp_path / "missing.jsonl"):
        assert main(["train-predictor", "--corpus", str(path), "--output", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"thinkviz: error: --corpus {path}: ") and len(err.splitlines()) == 1


def test_added_and_held_out_traces_are_checked_before_the_model_loads(tmp_path, monkeypatch, capsys):
    """--add must not put a held-out trace into training (as a preset replaying it, its file, or a transcript
    around its reasoning), nor train twice on a trace already in; a trace without an answer is refused at
    once, not after the corpus; a trace that passes goes on to the model."""
    import json as jsonlib

    from thinkviz.cli import main
    from thinkviz.commands import train_predictor
    from thinkviz.demos.presets import PRESETS_DIR

    class Loaded(Exception):
        pass

    def load(args):
        raise Loaded

    monkeypatch.setattr(train_predictor, "load_from_args", load)
    math = (PRESETS_DIR / "traces" / "math_tilings.md").read_text(encoding="utf-8")
    wrapped = tmp_path / "wrapped.jsonl"
    wrapped.write_text(
        "\n".join(
            jsonlib.dumps(m)
            for m in (
                {"role": "user", "content": "Tile the strip."},
                {"role": "assistant", "content": math},
                {"role": "user", "content": "Thanks."},
                {"role": "assistant", "content": "<think>\nA reply.\n</think>\n\nYou are welcome."},
            )
        ),
        encoding="utf-8",
    )
    for spec in ("math_h2o_vs_window", str(PRESETS_DIR / "traces" / "math_tilings.md"), str(wrapped)):
        assert main(["train-predictor", "--holdout", "math_tilings", "--add", spec]) == 2
        err = capsys.readouterr().err
        assert f"--add {spec} holds the reasoning of the held-out trace math_tilings" in err
    assert main(["train-predictor", "--holdout", "math_tilings", "--add", "think_drop_lru"]) == 2
    assert "--add think_drop_lru repeats coding_lru_ttl, which is already trained on" in capsys.readouterr().err
    own = tmp_path / "own.md"
    own.write_text("<think>\nTwo and two.\n</think>\n\nFour.", encoding="utf-8")
    with pytest.raises(Loaded):
        main(["train-predictor", "--holdout", "math_tilings", "--add", str(own)])
    assert main(["train-predictor", "--holdout", "math_tilings", "--add", str(own), "--add", str(own)]) == 2
    assert f"--add {own} repeats {own}, which is already trained on" in capsys.readouterr().err
    never_closed, no_answer = tmp_path / "never_closed.md", tmp_path / "no_answer.md"
    never_closed.write_text("Thinking, never closed.", encoding="utf-8")  # the system prompt's </think> is no answer
    no_answer.write_text("<think>\nThinking.\n</think>\n\n", encoding="utf-8")
    for path in (never_closed, no_answer):
        for flag in ("--add", "--holdout"):
            assert main(["train-predictor", flag, str(path)]) == 2
            assert f"{flag} {path}: no answer after a </think> in an assistant turn" in capsys.readouterr().err


@pytest.mark.slow
def test_a_held_out_trace_of_ones_own_is_measured_and_a_shipped_one_it_holds_leaves_training(
    tiny_llama, tmp_path, monkeypatch, capsys
):
    from thinkviz.cli import main
    from thinkviz.commands import train_predictor

    monkeypatch.setattr(train_predictor, "load_from_args", lambda args: tiny_llama)
    own = tmp_path / "own.md"
    own.write_text("<think>\nTwo and two make four; check: four.\n</think>\n\nFour.", encoding="utf-8")
    out = tmp_path / "dynts_tiny.safetensors"
    args = ["--generate", "0", "--histories", "0", "--epochs", "1", "--output", str(out)]
    assert main(["train-predictor", "--holdout", str(own), "--holdout", "math_h2o_vs_window", *args]) == 0
    head = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("scorer"))
    assert head.split() == ["scorer", "own", "math_h2o_vs_window", "mean"]  # the file by its stem
    _, meta = P.load(out)
    assert "coding_ratelimit" in meta.trained_on and "math_tilings" not in meta.trained_on  # held out as its preset
    assert json.loads(P.eval_path(out).read_text())["heldout_traces"] == ["own", "math_h2o_vs_window"]
