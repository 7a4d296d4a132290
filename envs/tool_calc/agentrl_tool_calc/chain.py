"""The tool_chain tasks and their grader: a hidden function f that only the sandbox can evaluate, applied k times.

Each task has its own f, a random map of the numbers 10..99 onto themselves, drawn from the task's id. The model
never sees the table: a ```python block it runs in the sandbox can call `f(x)` and print the result. The question asks
for f applied `hops` times to a start number, each time to the previous result, so the answer needs every
intermediate value from the sandbox: one call per turn (turn k's input is turn k-1's output), or a composed call
(`f(f(x))`) whose output is the answer. Either way the model must use what the tool printed.

The truth is the env's own: the table is regenerated from the task id (never read back from the sandbox, which the
policy controls), the start number and the hop count from the env's question text. Splits draw their tables from
disjoint seeds (`tool_chain/train/i`, `tool_chain/eval/i`), so a held-out task's f was never seen in training.
"""

from __future__ import annotations

import random
import re
from typing import Literal

from agentrl.envs import Task

Split = Literal["train", "eval"]
LOW, HIGH = 10, 99  # f's domain and range
TIMES = {1: "once", 2: "two times", 3: "three times", 4: "four times"}
QUESTION = re.compile(r"Start with (\d+) and apply f (once|two times|three times|four times)\b")
TASK_ID = re.compile(r"^chain-(train|eval)-(\d{4,6})$")


def table(split: Split, index: int) -> dict[int, int]:
    """f of task `index` of `split`: x -> f(x) for x in LOW..HIGH."""
    rng = random.Random(f"tool_chain/{split}/{index}")
    return {x: rng.randint(LOW, HIGH) for x in range(LOW, HIGH + 1)}


def question(start: int, hops: int) -> str:
    return (f"Start with {start} and apply f {TIMES[hops]}, each time to the previous result. "
            "What number do you get?")


def apply(f: dict[int, int], start: int, hops: int) -> int:
    x = start
    for _ in range(hops):
        x = f[x]
    return x


def make_tasks(split: Split, count: int, hops: tuple[int, ...]) -> list[Task]:
    """`count` tasks of `split`; task i's hop count cycles through `hops` (a balanced mix), its start is drawn."""
    tasks = []
    for i in range(count):
        rng = random.Random(f"tool_chain/{split}/{i}/start")
        k, f = hops[i % len(hops)], table(split, i)
        start = rng.randint(LOW, HIGH)
        while len({apply(f, start, j) for j in range(k + 1)}) < k + 1:  # no value twice on the way: neither the
            start = rng.randint(LOW, HIGH)  # start nor a partial chain is ever the answer by a cycle
        tasks.append(Task(id=f"chain-{split}-{i:04d}", prompt=question(start, k),
                          data={"start": start, "hops": k, "answer": apply(f, start, k), "table": f}))
    return tasks


def expected_chain(task_id: str, prompt: str) -> list[int] | None:
    """The values of a tool_chain task, start first and the answer last, from its id (the table) and the env's
    question text (start, hops); None when either is not a tool_chain one."""
    m, q = TASK_ID.match(task_id), QUESTION.search(prompt)
    if m is None or q is None:
        return None
    start = int(q.group(1))
    if not LOW <= start <= HIGH:
        return None
    hops = next(k for k, word in TIMES.items() if word == q.group(2))
    f = table(m.group(1), int(m.group(2)))  # type: ignore[arg-type]  # matched train|eval
    return [apply(f, start, j) for j in range(hops + 1)]


def expected_answer(task_id: str, prompt: str) -> int | None:
    chain = expected_chain(task_id, prompt)
    return chain[-1] if chain else None


def prelude(f: dict[int, int]) -> str:
    """The lines the sandbox runs before the model's block: f over this task's table."""
    return (f"_F = {f!r}\n"
            "def f(x):\n"
            "    x = int(x)\n"
            f"    if x not in _F:\n"
            f"        raise ValueError(f'f is defined on {LOW}..{HIGH} only, not {{x}}')\n"
            "    return _F[x]\n")
