"""Synthetic but internally consistent trajectories for the viewer's tests, demos and benchmarks.

Every record satisfies the `Trajectory` invariants (equal-length ids / logprobs / env_mask; each turn owns
`completion_ids[start:start+model_len]` model tokens then `env_len` tool tokens) and looks like a code_tests run:
hermes tool calls, pytest-like output, a test report and a reward equal to its pass fraction. Deterministic per seed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

from agentrl.types import (
    Status,
    TestOutcome,
    TestReport,
    Timing,
    ToolCall,
    ToolResult,
    Trajectory,
    Turn,
)

STATUSES = [Status.ok] * 6 + [Status.max_turns] * 2 + [Status.truncated, Status.timeout, Status.infra_error]
WORDS = "the function should return sorted list of values while handling empty input edge cases carefully".split()


def _prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _code(rng: random.Random, lines: int) -> str:
    body = "\n".join(f"    x{k} = sorted(values)[{k}:] if values else []" for k in range(lines))
    return f"def solve(values):\n{body}\n    return sorted(values)\n"


def _turn(rng: random.Random, index: int, start: int, version: int, last: bool, text_words: int,
          output_chars: int) -> tuple[Turn, list[int], list[int]]:
    """One turn and its completion ids and env_mask."""
    code = _code(rng, rng.randint(1, 6))
    call = ToolCall(id=f"call_{index}_0", name="run_python", arguments={"code": code})
    text = f"{_prose(rng, text_words)}\n<tool_call>{json.dumps({'name': call.name, 'arguments': call.arguments})}" \
           f"</tool_call>"
    failed = rng.random() < 0.3
    output = ("F.\nFAILED test_solve - AssertionError: assert [] == [1]\n" if failed else "..\n2 passed\n") * \
        rng.randint(1, 3)
    if output_chars:
        noise = rng.randbytes(output_chars // 2 + 1).hex()[:output_chars]
        output += "\n".join(noise[k:k + 80] for k in range(0, len(noise), 80))
    result = ToolResult(call_id=call.id, name=call.name, output=output, exit_code=1 if failed else 0, stdout=output,
                        duration_s=round(rng.uniform(0.01, 0.8), 4), timed_out=rng.random() < 0.02)
    model_len = max(4, len(text) // 4)
    env_len = 0 if last else min(max(3, len(output) // 4), 512)  # ids are filler: the viewer never decodes them
    turn = Turn(index=index, start=start, model_len=model_len, env_len=env_len, text=text,
                finish_reason="stop", weight_version=version, tool_calls=[call], tool_results=[result],
                observation="" if last else output, gen_duration_s=round(rng.uniform(0.05, 2.0), 4),
                tool_duration_s=result.duration_s, cached_tokens=rng.randint(0, 64))
    ids = [10 + (start + j) * 7919 % 49000 for j in range(model_len + env_len)]
    return turn, ids, [1] * model_len + [0] * env_len


def trajectory(rng: random.Random, k: int, *, step: int | None, group_size: int = 4, max_turns: int = 4,
               text_words: int = 40, output_chars: int = 0) -> Trajectory:
    """The k-th synthetic trajectory (its group is k // group_size); `output_chars` pads every tool output."""
    status = rng.choice(STATUSES)
    n_turns = rng.randint(1, max_turns)
    turns: list[Any] = []
    ids: list[int] = []
    mask: list[int] = []
    version = step or 0
    for i in range(n_turns):
        turn, t_ids, t_mask = _turn(rng, i, len(ids), version, i == n_turns - 1, text_words, output_chars)
        turns.append(turn)
        ids += t_ids
        mask += t_mask
    total = rng.randint(2, 8)
    passed = rng.randint(0, total)
    tests = None if status is Status.infra_error else TestReport(
        passed=passed, total=total,
        outcomes=[TestOutcome(name=f"test_{j}", passed=j < passed, message="" if j < passed else "AssertionError")
                  for j in range(total)])
    gen_s = sum(t.gen_duration_s for t in turns)
    tools_s = sum(t.tool_duration_s for t in turns)
    return Trajectory(
        id=f"s{step if step is not None else 0}-t{k // group_size}-{k % group_size}-{rng.getrandbits(24):06x}",
        group_id=f"g{step}-{k // group_size}", task_id=f"task_{(k // group_size) % 50:03d}", env="code_tests",
        status=status, sample_index=k % group_size, step=step, prompt_ids=list(range(1, rng.randint(40, 120))),
        completion_ids=ids, logprobs=[-0.5 if m else 0.0 for m in mask], env_mask=mask, turns=turns, tests=tests,
        reward=None if tests is None else tests.fraction, solution=turns[-1].tool_calls[0].arguments["code"],
        error="sandbox died" if status is Status.infra_error else None,
        timing=Timing(total_s=gen_s + tools_s + 0.3, generation_s=gen_s, tools_s=tools_s, setup_s=0.1,
                      finalize_s=0.2), meta={"group_size": group_size, "model": "synthetic", "seed": 0})


def trajectories(n: int, *, steps: int = 1, seed: int = 0, **kwargs: int) -> Iterator[Trajectory]:
    """`n` trajectories spread evenly over `steps` steps (step None when steps == 0)."""
    rng = random.Random(seed)
    per_step = max(1, -(-n // max(steps, 1)))
    for k in range(n):
        yield trajectory(rng, k % per_step, step=(k // per_step) if steps else None, **kwargs)
