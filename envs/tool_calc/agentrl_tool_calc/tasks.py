"""The tool_calc tasks: integer arithmetic a small model cannot do in its head (e.g. 482 * 719), generated
deterministically, split into disjoint train and eval sets.

Every operand pair (a, b) belongs to exactly one split, decided by a hash of the pair (not by the sampling order), so
`split: eval` never holds a question of `split: train`, for any task counts. Task i of a split is the same for every
run. The question text is fixed (`What is A op B?`): the `calc_answer` reward reads the expected value back from it.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Literal

from agentrl.envs import Task

Split = Literal["train", "eval"]
OPS = {"*": lambda a, b: a * b, "+": lambda a, b: a + b, "-": lambda a, b: a - b}
QUESTION = re.compile(r"What is (\d+) ([-+*]) (\d+)\?\s*$")
EVAL_SHARE = 5  # one pair in 5 is an eval pair
EXAMPLE_PAIR = (1234, "*", 5678)  # the prompt's one-shot example (config.EXAMPLE) is never a task


def pair_split(a: int, op: str, b: int) -> Split:
    digest = hashlib.sha256(f"{a}{op}{b}".encode()).digest()
    return "eval" if digest[0] % EVAL_SHARE == 0 else "train"


def question(a: int, op: str, b: int) -> str:
    return f"What is {a} {op} {b}?"


def expected_answer(prompt: str) -> int | None:
    """The true value of a tool_calc question (the env's own text, never the model's), or None if not one."""
    m = QUESTION.search(prompt.strip())
    if m is None:
        return None
    return int(OPS[m.group(2)](int(m.group(1)), int(m.group(3))))


def make_tasks(split: Split, count: int, digits: int, ops: str) -> list[Task]:
    """`count` distinct questions of `split`: operands of `digits` digits, operators drawn from `ops`."""
    rng = random.Random(f"tool_calc/{split}/{digits}/{ops}")
    lo, hi = 10 ** (digits - 1), 10 ** digits - 1
    capacity = (hi - lo + 1) ** 2 * len(ops) // EVAL_SHARE
    if count > capacity // 2:
        raise ValueError(f"tasks={count} is too many for digits={digits}: use at most {capacity // 2}")
    seen: set[tuple[int, str, int]] = set()
    tasks: list[Task] = []
    while len(tasks) < count:
        a, b, op = rng.randint(lo, hi), rng.randint(lo, hi), rng.choice(ops)
        if (a, op, b) in seen or (a, op, b) == EXAMPLE_PAIR or pair_split(a, op, b) != split:
            continue
        seen.add((a, op, b))
        answer = OPS[op](a, b)
        tasks.append(Task(id=f"calc-{split}-{len(tasks):04d}", prompt=question(a, op, b),
                          data={"a": a, "b": b, "op": op, "answer": answer}))
    return tasks
