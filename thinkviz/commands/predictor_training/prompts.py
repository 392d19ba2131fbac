"""The committed prompt set the DynTS corpus is generated from: word problems, small coding
tasks and explanations, written as templates and expanded deterministically.

:func:`corpus_prompts` returns the same list on every machine (numbers come from a
``random.Random`` seeded here, names and items from the tables below), so a corpus cached
under one prompt-set digest is the same corpus everywhere.  The set is grown by adding
templates or raising :data:`WORD_PROBLEMS`; the digest (:func:`prompt_set_digest`) changes
with it, so a stale cache is never reused.

:data:`DEMONSTRATIONS` are three worked exchanges (a sum, a function, an explanation) in the
reasoning format — think steps, a closing ``</think>``, then the answer — that precede each
question during generation: SmolLM2-135M almost never closes its think block from the system
prompt alone (0 of 16 sampled answers did in a trial; 5 of 16 with worked turns before them).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from dataclasses import asdict, dataclass

WORD_PROBLEMS = 100  # how many word problems the templates are expanded into


@dataclass(frozen=True)
class CorpusPrompt:
    """One question of the corpus and its kind (``"math"``, ``"code"`` or ``"explain"``)."""

    kind: str
    question: str


DEMONSTRATIONS: tuple[tuple[str, str], ...] = (
    (
        "A box holds 6 rows of 7 eggs. Two eggs break. How many whole eggs are left?",
        "<think>\n6 rows of 7 eggs is 6 × 7 = 42 eggs.\n\nTwo break, so 42 - 2 = 40 are whole.\n"
        "</think>\nThere are 40 whole eggs left.",
    ),
    (
        "Write a Python function that returns the largest of three numbers.",
        "<think>\nThe function takes three numbers.\n\nPython's built-in max already compares them.\n"
        "</think>\n```python\ndef largest(a, b, c):\n    return max(a, b, c)\n```",
    ),
    (
        "Explain why metal feels colder than wood.",
        "<think>\nBoth are at room temperature.\n\nMetal carries heat away from the hand much faster.\n"
        "</think>\nMetal conducts heat away from your skin quickly, so it feels colder than wood at the same "
        "temperature.",
    ),
)

_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jia", "Kofi", "Lena")
_ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "stamps", "shells", "cards")

# Each template: format fields {name}, {other}, {item} and numbers {a}..{d} drawn from the given ranges.
_WORD_TEMPLATES: tuple[tuple[str, dict[str, tuple[int, int]]], ...] = (
    (
        "{name} has {a} {item} and buys {b} more. Then {name} gives {c} to {other}. How many {item} "
        "does {name} have now?",
        {"a": (5, 40), "b": (3, 30), "c": (1, 8)},
    ),
    (
        "A baker makes {a} muffins per tray and bakes {b} trays. She sells {c} muffins. How many are left?",
        {"a": (6, 12), "b": (3, 9), "c": (10, 30)},
    ),
    ("A train travels {a} km in {b} minutes. What is its average speed in km/h?", {"a": (20, 180), "b": (20, 90)}),
    (
        "{name} reads {a} pages a day. How many days does {name} need for a {b}-page book?",
        {"a": (8, 40), "b": (120, 480)},
    ),
    ("A shirt costs ${a} and is on sale for {b}% off. What is the sale price?", {"a": (12, 90), "b": (10, 50)}),
    ("If {a} pencils cost {b} cents, how much do {c} pencils cost?", {"a": (2, 9), "b": (20, 150), "c": (3, 15)}),
    (
        "{name} has {a} times as many {item} as {other}. Together they have {b}. How many does {name} have?",
        {"a": (2, 5), "b": (12, 96)},
    ),
    ("A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?", {"a": (3, 30), "b": (2, 20)}),
    ("What is {a}% of {b}?", {"a": (5, 95), "b": (20, 400)}),
    (
        "A tank holds {a} litres. A pump fills {b} litres per minute. How long does it take to fill "
        "the tank from empty?",
        {"a": (60, 900), "b": (3, 30)},
    ),
    (
        "{name} saves ${a} every week. How many weeks until {name} can buy a bike that costs ${b}?",
        {"a": (5, 25), "b": (80, 400)},
    ),
    (
        "A class has {a} students. {b} of them walk to school and the rest take the bus. What fraction takes the bus?",
        {"a": (20, 36), "b": (4, 18)},
    ),
    (
        "The sum of two numbers is {a} and their difference is {b}. What are the numbers?",
        {"a": (20, 100), "b": (2, 18)},
    ),
    (
        "A recipe needs {a} eggs for {b} people. How many eggs are needed for {c} people?",
        {"a": (2, 6), "b": (2, 6), "c": (6, 24)},
    ),
    (
        "A car uses {a} litres of fuel per 100 km. How much fuel does it need for {b} km?",
        {"a": (4, 12), "b": (50, 900)},
    ),
    (
        "{name} is {a} years old and {other} is {b} years older. How old will {other} be in {c} years?",
        {"a": (5, 40), "b": (2, 30), "c": (1, 15)},
    ),
    (
        "A shop sells {item} in packs of {a}. {name} needs {b} {item}. How many packs must {name} buy?",
        {"a": (4, 12), "b": (15, 100)},
    ),
    (
        "Three friends share {a} {item} equally and {b} are left over. How many did each friend get?",
        {"a": (20, 90), "b": (0, 2)},
    ),
    ("A clock gains {a} minutes every day. How many minutes does it gain in {b} weeks?", {"a": (1, 9), "b": (2, 10)}),
    (
        "A garden is {a} m by {b} m. A path 1 m wide runs around the outside. What is the area of the path?",
        {"a": (4, 20), "b": (3, 15)},
    ),
)

_CODE_TASKS = (
    "returns the second largest number in a list",
    "reverses the words in a sentence",
    "counts the vowels in a string",
    "checks whether a number is prime",
    "returns the factorial of n",
    "checks whether a string is a palindrome",
    "returns the n-th Fibonacci number",
    "removes duplicates from a list while keeping the order",
    "merges two sorted lists into one sorted list",
    "returns the most common element of a list",
    "converts Celsius to Fahrenheit",
    "checks whether two strings are anagrams",
    "flattens a list of lists",
    "returns the sum of the digits of n",
    "counts how often each word appears in a text",
    "returns the greatest common divisor of two numbers",
    "checks whether a year is a leap year",
    "rotates a list by k positions",
    "returns the indices of two numbers in a list that add up to a target",
    "capitalises the first letter of every word",
    "returns all even numbers from a list",
    "finds the longest word in a sentence",
    "checks whether brackets in a string are balanced",
    "converts a binary string to an integer",
    "returns the running total of a list",
    "splits a list into chunks of size n",
    "returns the median of a list of numbers",
    "counts the lines in a text that contain a given word",
    "returns the average of a list, or None if it is empty",
    "returns the characters that two strings have in common",
)
_CODE_FORMS = (
    "Write a Python function that {task}.",
    "Write a short Python function that {task}, with one example call.",
)

_TOPICS = (
    "why the sky is blue",
    "how a refrigerator keeps food cold",
    "the difference between weather and climate",
    "what a prime number is",
    "why we have seasons",
    "how vaccines train the immune system",
    "what photosynthesis does",
    "why ice floats on water",
    "how a rainbow forms",
    "what inflation is",
    "how a bicycle stays upright",
    "why the moon has phases",
    "what an algorithm is",
    "how sound travels",
    "why metals conduct electricity",
    "what a variable is in programming",
    "how tides work",
    "why leaves change colour in autumn",
    "what a cache is in a computer",
    "how a compass finds north",
    "why bread rises",
    "what recursion is",
    "how plants drink water",
    "why the ocean is salty",
    "what a fraction is",
    "how an airplane wing makes lift",
    "why we need sleep",
    "what a binary number is",
    "how earthquakes happen",
    "what gravity does",
)
_EXPLAIN_FORMS = ("Explain {topic}.", "Explain {topic} in a few sentences to a ten-year-old.")


def corpus_prompts() -> list[CorpusPrompt]:
    """The prompt set, kinds taken in turn (word problem, coding task, explanation, ...), so that
    any leading part of it is balanced; :data:`WORD_PROBLEMS` word problems, 60 of each other kind."""
    rng = random.Random(4)  # a fixed draw: the same prompt set on every machine
    math = []
    templates = itertools.cycle(_WORD_TEMPLATES)
    for _ in range(WORD_PROBLEMS):
        template, ranges = next(templates)
        name, other = rng.sample(_NAMES, 2)
        numbers = {key: rng.randint(lo, hi) for key, (lo, hi) in ranges.items()}
        math.append(CorpusPrompt("math", template.format(name=name, other=other, item=rng.choice(_ITEMS), **numbers)))
    code = [CorpusPrompt("code", form.format(task=task)) for form in _CODE_FORMS for task in _CODE_TASKS]
    explain = [CorpusPrompt("explain", form.format(topic=topic)) for form in _EXPLAIN_FORMS for topic in _TOPICS]
    turns = itertools.zip_longest(math, code, explain)
    return [prompt for turn in turns for prompt in turn if prompt is not None]


def prompt_set_digest(prompts: list[CorpusPrompt]) -> str:
    """A short digest of the prompts and demonstrations: part of the corpus cache key."""
    blob = json.dumps([[asdict(p) for p in prompts], DEMONSTRATIONS], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:12]
