"""Long conversations chained from the corpus's answers: long contexts for the predictor to learn.

The corpus's answers are a few hundred tokens each; the traces dynts compresses in the app
run to thousands (the shipped ones 2,000–3,600 thinking tokens), and over that distance the
answer's attention follows rules a short answer never shows — how fast it fades with age,
which old tokens it still finds.  A predictor trained on short answers alone ranks the
shipped traces far worse than attention does.  A *history* is one conversation made of
answered generations (:func:`build_histories`): the reasoning system prompt, then each
generation's question and its assistant turn (``<think>``, its thinking, the answer), until
the generations' tokens reach a length drawn from ``tokens``.  It is labelled as a transcript
(:func:`~.labels.label_transcript`): the attention the last answer pays every earlier
assistant token, the kind of multi-turn history an agent's reflection loops (draft, test, rewrite) leave.

Deterministic: a ``random.Random(seed)`` draws each history's length and its generations (no
generation twice in one history).  Only the generations handed in are used, so histories built
from the training split never contain a held-out answer.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from ...text.chat import REASONING_SYSTEM_PROMPT
from ...measure.replay import ASSISTANT_PREFIX
from ...text.transcript import Message
from .corpus import Generation

TOKENS = (1500, 4000)  # a history's length is drawn uniformly from this range (generated tokens)
QUESTION_TOKENS = 40  # what a question and its turn markers add, roughly, to a generation's tokens


def build_histories(
    generations: Sequence[Generation], count: int, tokens: tuple[int, int] = TOKENS, seed: int = 0
) -> list[list[Message]]:
    """``count`` conversations of answered ``generations`` (message lists for
    :func:`~.labels.label_transcript`); ``[]`` when there are fewer than two answered ones."""
    answered = [g for g in generations if g.kept]
    if count < 1 or len(answered) < 2:
        return []
    rng = random.Random(seed)
    histories = []
    for _ in range(count):
        goal = rng.randint(*tokens)
        order = rng.sample(answered, len(answered))
        turns: list[Generation] = []
        for generation in order:
            turns.append(generation)
            if len(turns) >= 2 and sum(g.new_tokens + QUESTION_TOKENS for g in turns) >= goal:
                break
        messages = [Message("system", REASONING_SYSTEM_PROMPT)]
        for generation in turns:
            messages += [Message("user", generation.question), Message("assistant", ASSISTANT_PREFIX + generation.text)]
        histories.append(messages)
    return histories
