"""tool_chain env and its `chain_answer` reward: tasks drawn from the task id (splits with disjoint hidden functions,
no cycle that makes a partial chain the answer), the program the sandbox runs (the task's f before the model's
block, checked by running it with this interpreter), and grading against the env's own truth. Through the real runner
and a bubblewrap sandbox with a scripted policy: tests/integration/test_tool_chain_rollout.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest

from agentrl.envs import get_env
from agentrl.errors import ConfigError
from agentrl.reward import Scorer, parse_reward_list
from agentrl.types import Message, Status, Trajectory, Turn
from agentrl_tool_calc import ChainAnswer, ToolChainEnv
from agentrl_tool_calc.chain import apply, expected_answer, table


def test_registered_and_options_validated() -> None:
    env = get_env("tool_chain", split="eval", tasks=8)
    assert isinstance(env, ToolChainEnv) and env.action_format == "codeblock"
    for bad, field in (({"split": "test"}, "split"), ({"hops": [5]}, "hops"), ({"hops": []}, "hops"),
                       ({"example_hops": [3]}, "example_hops"), ({"example_hops": [2, 2]}, "example_hops"),
                       ({"nonsense": 1}, "nonsense")):
        with pytest.raises(ConfigError, match=field):
            ToolChainEnv(**bad)


def test_the_worked_examples_come_before_the_question_in_the_order_asked() -> None:
    task = ToolChainEnv(tasks=1).tasks()[0]

    def shots(**options: Any) -> list[tuple[str, str]]:
        msgs = ToolChainEnv(tasks=1, **options).messages(task)
        assert msgs[0].role == "system" and msgs[-1] == Message(role="user", content=task.prompt)
        return [(m.role, m.content) for m in msgs[1:-1]]

    default, both, none = shots(), shots(example_hops=[1, 2]), shots(example_hops=[])
    assert none == [] and default == both[4:]  # the default is the two-hop example alone
    assert [c for r, c in default if r == "assistant"].count("```python\nprint(f(31))\n```") == 1
    assert both[0][1].startswith("Start with 24 and apply f once") and both[3] == ("assistant", "ANSWER: 71")
    assert sum(c.startswith("```python") for r, c in both if r == "assistant") == 3  # one + two applications


def test_tasks_are_deterministic_split_apart_and_need_every_hop() -> None:
    train, again = ToolChainEnv(tasks=200).tasks(), ToolChainEnv(tasks=200).tasks()
    assert train == again
    evals = ToolChainEnv(split="eval", tasks=200).tasks()
    assert {t.data["hops"] for t in train} == {2, 3}
    for a, b in zip(train[:20], evals[:20], strict=True):  # same index, another split: another hidden function
        assert a.data["table"] != b.data["table"]
    for task in train + evals:
        f, start, k = dict(task.data["table"]), task.data["start"], task.data["hops"]
        chain = [apply(f, start, j) for j in range(k + 1)]
        assert len(set(chain)) == k + 1  # neither the start nor a partial chain is the answer
        assert task.data["answer"] == chain[-1] == expected_answer(task.id, task.prompt)
        split, index = task.id.split("-")[1], int(task.id.split("-")[2])
        assert table(split, index) == f  # type: ignore[arg-type]


def test_the_sandbox_program_is_the_tasks_f_before_the_models_block() -> None:
    env = ToolChainEnv(tasks=4)
    for task in env.tasks():
        program = env.program(env.reference_solution(task) or "", task)
        out = subprocess.run([sys.executable, "-I", "-c", program], capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == str(task.data["answer"]), out.stderr
    bad = subprocess.run([sys.executable, "-I", "-c", env.program("print(f(5))", env.tasks()[0])],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1 and "f is defined on 10..99 only, not 5" in bad.stderr


def _traj(task_id: str, *texts: str) -> Trajectory:
    turns = [Turn(index=i, start=0, model_len=1, text=t) for i, t in enumerate(texts)]
    return Trajectory(id="t", group_id="g", task_id=task_id, env="tool_chain", status=Status.ok, prompt_ids=[1],
                      turns=turns)


def _score(traj: Trajectory, env: ToolChainEnv, reward: list[Any] | None = None) -> float | None:
    by_id = {t.id: t for t in env.tasks()}
    scorer = Scorer(parse_reward_list(reward or [{"chain_answer": 1.0}], "test"),
                    prompt_messages=lambda tr: env.messages(by_id[tr.task_id]))
    return asyncio.run(scorer.score(traj)).reward


def test_chain_answer_grades_the_last_turn_against_the_envs_truth() -> None:
    env = ToolChainEnv(tasks=4)
    task = env.tasks()[1]
    f, start, k = dict(task.data["table"]), task.data["start"], task.data["hops"]
    truth, first = task.data["answer"], f[start]
    code = f"```python\nprint(f({start}))\n```"
    assert _score(_traj(task.id, code, f"ANSWER: {truth}"), env) == 1.0
    assert _score(_traj(task.id, code, f"ANSWER: {first}"), env) == 0.0  # stopped after one hop
    assert _score(_traj(task.id, code, f"ANSWER: {start}"), env) == 0.0
    assert _score(_traj(task.id, f"ANSWER: {truth}", code), env) == 0.0  # not the last turn
    assert _score(_traj(task.id, code, "ANSWER: " + "9" * 5000), env) == 0.0  # a scored 0, not a grader crash
    assert _score(_traj(task.id), env) == 0.0
    credit = [{"chain_answer": {"weight": 1.0, "format_credit": 0.1}}]
    assert _score(_traj(task.id, code, f"ANSWER: {first}"), env, credit) == pytest.approx(0.1)
    assert k in (2, 3)


def test_hop_credit_pays_each_hop_of_the_chain_and_nothing_else() -> None:
    env = ToolChainEnv(tasks=4)
    task = env.tasks()[1]  # three hops
    f, start = dict(task.data["table"]), task.data["start"]
    chain = [apply(f, start, j) for j in range(4)]
    shaped = [{"chain_answer": {"weight": 1.0, "hop_credit": True}}]
    assert [_score(_traj(task.id, f"ANSWER: {v}"), env, shaped) for v in chain] == pytest.approx([0, 1 / 3, 2 / 3, 1])
    other = next(v for v in range(10, 100) if v not in chain)
    assert _score(_traj(task.id, f"ANSWER: {other}"), env, shaped) == 0.0
    assert _score(_traj(task.id, f"ANSWER: {chain[1]}"), env) == 0.0  # off by default: only the full chain pays


def test_chain_answer_refuses_other_envs_and_a_missing_prompt() -> None:
    tool_calc_prompt = [Message(role="user", content="What is 123 * 456?")]
    src = ChainAnswer(ChainAnswer.Options(), prompt_messages=lambda tr: tool_calc_prompt)
    with pytest.raises(ConfigError, match="not a tool_chain task"):
        asyncio.run(src.value(_traj("calc-train-0000", "ANSWER: 1")))
    chain_prompt = ToolChainEnv(tasks=1).messages(ToolChainEnv(tasks=1).tasks()[0])
    src = ChainAnswer(ChainAnswer.Options(), prompt_messages=lambda tr: chain_prompt)
    with pytest.raises(ConfigError, match="not a tool_chain task"):  # a chain prompt under another env's task id
        asyncio.run(src.value(_traj("easy/add", "ANSWER: 1")))
    with pytest.raises(ConfigError, match="needs the task's prompt"):
        asyncio.run(ChainAnswer(ChainAnswer.Options()).value(_traj("chain-train-0000", "ANSWER: 1")))


class HostSandbox:
    """Runs main.py with this interpreter (no isolation: the test's own programs only)."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    async def write_file(self, path: str, data: str) -> None:
        self.files[path] = data

    async def exec(self, cmd: list[str], **kw: Any) -> Any:
        from agentrl.sandbox.base import ExecResult

        out = subprocess.run([sys.executable, "-I", "-c", self.files[cmd[-1]]], capture_output=True, text=True,
                             timeout=30)
        return ExecResult(exit_code=out.returncode, stdout=out.stdout, stderr=out.stderr)


def test_envs_check_scores_a_given_solution_by_what_it_prints() -> None:
    env = ToolChainEnv(tasks=2)
    task = env.tasks()[0]
    ref = env.reference_solution(task) or ""
    good = asyncio.run(env.score_solution(HostSandbox(), task, ref))  # type: ignore[arg-type]
    assert (good.passed, good.total) == (1, 1)
    short = asyncio.run(env.score_solution(HostSandbox(), task, f"print(f({task.data['start']}))"))  # type: ignore[arg-type]
    assert (short.passed, short.total) == (0, 1) and "printed" in short.outcomes[0].message
