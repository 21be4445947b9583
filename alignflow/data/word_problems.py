"""A second built-in task, for real pretrained models: arithmetic word problems in English.

The addition demo (``demo.py``) is sized for a from-scratch model of a few million
parameters. A pretrained chat model such as SmolLM2-135M-Instruct already reads English
and follows a stated answer format, but gets two-digit sums wrong often enough to have
room to learn ("17 + 25 = 32"). So here every problem is a short story with two-digit
numbers (addition or subtraction), and the prompt itself states the answer format: the
base model is judged on the same instruction the trained one saw.

Responses come in the demo's three tiers, shaped for this task:

- ``best``: the working and the right number in the format, ``17 + 25 = 42. The answer is 42.``;
- ``sloppy``: the right number without the format, ``I think 42``;
- ``wrong``: the working with a slip and a wrong number, in the format.

A worked response is written in one of two styles, as people answer: most in one line
(``direct``, as above), some step by step, tens and ones apart and then joined (``stepwise``:
``17 + 25: 10 + 20 = 30, 7 + 5 = 12, 30 + 12 = 42. The answer is 42.``; a borrow shows as a
negative ones difference, worked from the positive one: ``52 - 27: 50 - 20 = 30,
2 - 7 = -(7 - 2) = -5, 30 - 5 = 25.``). Both are right in
the data, so SFT imitates both; a 135M model gets the carries right far more often in the
stepwise style. Which style to use is learnt from outcomes, not from the data: that is
the room this task leaves to reinforcement learning with a verifiable reward.

A wrong answer is formatted here (unlike the demo) because the base model already states
answers in the format: what separates good from bad responses is the arithmetic. Task
accuracy is the demo's strict score: the stated ``The answer is N.`` must be right.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from alignflow.data.answers import TIER_SCORES, format_answer

INSTRUCTION = "End your reply with 'The answer is N.' where N is the number."
NAMES = ("Sam", "Mia", "Ravi", "Lena", "Tom", "Aiko", "Omar", "Zoe", "Ivan", "Nora")
THINGS = ("apples", "stickers", "marbles", "books", "coins", "shells", "cards", "pencils")
ADDITION = (
    "{name} has {a} {things} and gets {b} more. How many {things} does {name} have now?",
    "There are {a} {things} in a box. {name} puts in {b} more. How many {things} are in the box?",
    "{name} collected {a} {things} on Monday and {b} on Tuesday. How many {things} in all?",
)
SUBTRACTION = (
    "{name} has {a} {things} and gives {b} away. How many {things} does {name} have left?",
    "A shelf holds {a} {things}. {name} takes {b} of them. How many {things} are still on the shelf?",
    "{name} had {a} {things} and lost {b}. How many {things} does {name} have now?",
)
# the share of worked responses written step by step (the rest: one line)
STEPWISE_SHARE = 0.3
# chosen is the best tier in most pairs: SFT on chosen learns the working, not the slips
_PAIR_TIERS = [("best", "sloppy"), ("best", "wrong"), ("sloppy", "wrong")]
_PAIR_WEIGHTS = (1, 3, 1)


@dataclass(frozen=True)
class Problem:
    """One word problem: its operands, operation and the wording it is asked in."""

    a: int
    b: int
    op: str  # "+" or "-"
    template: str
    name: str
    things: str

    @property
    def answer(self) -> int:
        return self.a + self.b if self.op == "+" else self.a - self.b

    @property
    def prompt(self) -> str:
        story = self.template.format(a=self.a, b=self.b, name=self.name, things=self.things)
        return f"{story} {INSTRUCTION}"

    def working(self, result: int) -> str:
        """One line: ``a op b = result.``"""
        return f"{self.a} {self.op} {self.b} = {result}."

    def stepwise_working(self, result: int) -> str:
        """Tens with tens, ones with ones, then the two joined; a slip (``result`` wrong) shows in the join.

        Every step is a fact a small model knows (``30 + 20``, ``9 + 7``, ``7 - 2``) or a join of
        a round number with a small one (``50 + 16``, ``30 - 5``): the carries and borrows that a
        one-line sum hides are written out. A borrow's negative ones difference is worked from the
        positive one (``2 - 7 = -(7 - 2) = -5``): SmolLM2 got ``2 - 7`` wrong far more often
        than ``7 - 2``, and taking the smaller digit from the larger without the sign shown
        was worse still (recipes.md).
        """
        a_tens, b_tens = self.a - self.a % 10, self.b - self.b % 10
        a_ones, b_ones = self.a % 10, self.b % 10
        tens = a_tens + b_tens if self.op == "+" else a_tens - b_tens
        ones = a_ones + b_ones if self.op == "+" else a_ones - b_ones
        if ones < 0:
            ones_step = f"{a_ones} - {b_ones} = -({b_ones} - {a_ones}) = {ones}"
            join = f"{tens} - {-ones}"
        else:
            ones_step, join = f"{a_ones} {self.op} {b_ones} = {ones}", f"{tens} + {ones}"
        steps = (f"{a_tens} {self.op} {b_tens} = {tens}", ones_step, f"{join} = {result}")
        return f"{self.a} {self.op} {self.b}: {', '.join(steps)}."


def draw_problem(rng: random.Random, low: int = 10, high: int = 49) -> Problem:
    """A problem with two operands in [low, high]; a subtraction never goes below zero."""
    a, b = rng.randint(low, high), rng.randint(low, high)
    op = rng.choice("+-")
    if op == "-" and b > a:
        a, b = b, a
    template = rng.choice(ADDITION if op == "+" else SUBTRACTION)
    return Problem(a, b, op, template, rng.choice(NAMES), rng.choice(THINGS))


def all_problems(n: int = 1200, seed: int = 0) -> list[Problem]:
    """The task's fixed universe of ``n`` distinct problems (same list in every clone)."""
    rng = random.Random(seed)
    seen: dict[str, Problem] = {}
    while len(seen) < n:
        problem = draw_problem(rng)
        seen.setdefault(problem.prompt, problem)
    return list(seen.values())


def worked(problem: Problem, result: int, style: str) -> str:
    """The working in ``style`` (``direct`` or ``stepwise``) ending in ``result``, in the format."""
    working = problem.stepwise_working(result) if style == "stepwise" else problem.working(result)
    return f"{working} {format_answer(result)}"


def draw_style(rng: random.Random) -> str:
    return "stepwise" if rng.random() < STEPWISE_SHARE else "direct"


def response(tier: str, problem: Problem, rng: random.Random) -> str:
    """A response of the given quality tier to ``problem``."""
    answer = problem.answer
    if tier == "best":
        return worked(problem, answer, draw_style(rng))
    if tier == "sloppy":
        return f"I think {answer}"
    # the slips a person (or a small model) makes: off by one, or a carry dropped or doubled
    wrong = answer + rng.choice([-10, -2, -1, 1, 2, 10])
    return worked(problem, wrong, draw_style(rng))


def iter_pairs(problems: list[Problem], n: int, seed: int = 0) -> Iterator[dict]:
    """``n`` pairwise records over ``problems`` (chosen is the better tier)."""
    rng = random.Random(seed)
    for i in range(n):
        problem = rng.choice(problems)
        better, worse = rng.choices(_PAIR_TIERS, weights=_PAIR_WEIGHTS)[0]
        yield {
            "id": f"word-pair-{seed}-{i}",
            "prompt": problem.prompt,
            "chosen": response(better, problem, rng),
            "rejected": response(worse, problem, rng),
            "source": "word_problems",
            "metadata": {"answer": problem.answer, "tiers": [better, worse]},
        }


def iter_scored(problems: list[Problem], n: int, seed: int = 1) -> Iterator[dict]:
    """``n`` rated responses over ``problems`` (score by tier, as in the demo)."""
    rng = random.Random(seed)
    for i in range(n):
        problem = rng.choice(problems)
        tier = rng.choice(list(TIER_SCORES))
        yield {
            "id": f"word-scored-{seed}-{i}",
            "prompt": problem.prompt,
            "response": response(tier, problem, rng),
            "score": TIER_SCORES[tier],
            "source": "word_problems",
            "metadata": {"answer": problem.answer},
        }


def iter_prompts(problems: list[Problem]) -> Iterator[dict]:
    """Every problem once as a prompt-only row with its answer (pinned set, online RL)."""
    for i, problem in enumerate(problems):
        yield {"id": f"word-prompt-{i}", "prompt": problem.prompt, "metadata": {"answer": problem.answer}}
