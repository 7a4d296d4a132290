"""tool_calc env and its `calc_answer` reward: deterministic disjoint splits, the opening chat, the tool's
observation (a fake sandbox that returns fixed results: no process runs), and the grading of the final answer.
The env in a real sandbox with the real model: tests/slow/test_learning_tool_calc.py and benchmarks/bench_learning.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agentrl_tool_calc import CalcAnswer, ToolCalcEnv
from agentrl_tool_calc.reward import final_answer
from agentrl_tool_calc.tasks import expected_answer, pair_split

from agentrl.envs import get_env
from agentrl.errors import ConfigError
from agentrl.reward import Scorer, parse_reward_list
from agentrl.sandbox.base import ExecResult
from agentrl.tools import parse_tool_calls
from agentrl.types import Message, Status, ToolCall, Trajectory, Turn


def test_registered_and_options_validated() -> None:
    env = get_env("tool_calc", split="eval", tasks=8)
    assert isinstance(env, ToolCalcEnv) and env.name == "tool_calc" and env.action_format == "codeblock"
    with pytest.raises(ConfigError, match="split"):
        ToolCalcEnv(split="test")
    with pytest.raises(ConfigError, match="ops"):
        ToolCalcEnv(ops="/")
    with pytest.raises(ConfigError, match="nonsense"):
        ToolCalcEnv(nonsense=1)


def test_tasks_are_deterministic_disjoint_and_right() -> None:
    train, again = ToolCalcEnv(tasks=300).tasks(), ToolCalcEnv(tasks=300).tasks()
    assert train == again and len({t.prompt for t in train}) == 300
    evals = ToolCalcEnv(split="eval", tasks=100, ops="*+-").tasks()
    evals_mul = ToolCalcEnv(split="eval", tasks=100).tasks()
    assert not {t.prompt for t in train} & {t.prompt for t in evals + evals_mul}
    for task in train[:50] + evals:
        d = task.data
        assert pair_split(d["a"], d["op"], d["b"]) == task.id.split("-")[1]
        assert expected_answer(task.prompt) == d["answer"] == eval(f"{d['a']} {d['op']} {d['b']}")
        assert 100 <= d["a"] <= 999 and 100 <= d["b"] <= 999
    assert {t.data["op"] for t in evals} == {"*", "+", "-"}
    with pytest.raises(ValueError, match="too many"):
        ToolCalcEnv(digits=2, tasks=5000).tasks()


def test_opening_chat_is_system_one_shot_then_question() -> None:
    env = ToolCalcEnv()
    task = env.tasks()[0]
    msgs = env.messages(task)
    assert [m.role for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert msgs[-1].content == task.prompt and "ANSWER:" in msgs[0].content
    shown = parse_tool_calls(msgs[2].content, "codeblock", env.tools)
    assert [c.arguments["code"].strip() for c in shown.calls] == ["print(1234 * 5678)"]
    assert msgs[3].content == str(1234 * 5678) and msgs[4].content == f"ANSWER: {1234 * 5678}"


class FakeSandbox:
    def __init__(self, result: ExecResult) -> None:
        self.result, self.files, self.commands = result, {}, []

    async def write_file(self, path: str, data: str) -> None:
        self.files[path] = data

    async def exec(self, cmd: list[str], **kw: Any) -> ExecResult:
        self.commands.append(cmd)
        return self.result


@pytest.mark.parametrize("result,shown", [
    (ExecResult(exit_code=0, stdout="793016\n", stderr=""), "793016"),
    (ExecResult(exit_code=0, stdout="", stderr=""), "(no output: print the result)"),
    (ExecResult(exit_code=1, stdout="", stderr="NameError: x"), "error (exit code 1):\nNameError: x"),
    (ExecResult(exit_code=None, stdout="", stderr="", timed_out=True), "error: the code did not finish within 10s"),
])
def test_tool_runs_the_block_and_shows_its_output(result: ExecResult, shown: str) -> None:
    env = ToolCalcEnv()
    sandbox = FakeSandbox(result)
    call = ToolCall(id="call_0_0", name="run_python", arguments={"code": "print(833 * 952)"})
    out = asyncio.run(env.call_tool(sandbox, call, task=env.tasks()[0]))  # type: ignore[arg-type]
    assert out.output == shown and sandbox.files == {"main.py": "print(833 * 952)"}
    assert sandbox.commands == [["python3", "main.py"]]


def _traj(task_id: str, *texts: str) -> Trajectory:
    turns = [Turn(index=i, start=0, model_len=1, text=t) for i, t in enumerate(texts)]
    return Trajectory(id=f"t-{texts[-1] if texts else ''}", group_id="g", task_id=task_id, env="tool_calc",
                      status=Status.ok, prompt_ids=[1], turns=turns)


def _score(traj: Trajectory, env: ToolCalcEnv, reward: list[Any]) -> float | None:
    by_id = {t.id: t for t in env.tasks()}
    scorer = Scorer(parse_reward_list(reward, "test"), prompt_messages=lambda tr: env.messages(by_id[tr.task_id]))
    return asyncio.run(scorer.score(traj)).reward


def test_calc_answer_grades_the_last_turn_against_the_question() -> None:
    env = ToolCalcEnv(tasks=4)
    task = env.tasks()[0]
    truth = task.data["answer"]
    code = f"```python\nprint({task.data['a']} * {task.data['b']})\n```"
    reward = [{"calc_answer": 1.0}]
    assert _score(_traj(task.id, code, f"ANSWER: {truth}"), env, reward) == 1.0
    assert _score(_traj(task.id, code, f"ANSWER: {truth:,}"), env, reward) == 1.0  # commas allowed
    assert _score(_traj(task.id, code, f"ANSWER: {truth + 1}"), env, reward) == 0.0
    assert _score(_traj(task.id, f"ANSWER: {truth}", code), env, reward) == 0.0  # not the last turn
    assert _score(_traj(task.id, f"The answer is {truth}"), env, reward) == 0.0  # not the format
    assert _score(_traj(task.id), env, reward) == 0.0
    credit = [{"calc_answer": {"weight": 1.0, "format_credit": 0.1}}]
    assert _score(_traj(task.id, code, f"ANSWER: {truth + 1}"), env, credit) == pytest.approx(0.1)
    assert final_answer(_traj(task.id, "ANSWER: -12")) == -12
    # a number past int()'s digit limit is a wrong answer, scored 0 (it raised, and left the episode unscored)
    assert _score(_traj(task.id, code, "ANSWER: " + "9" * 5000), env, reward) == 0.0
    assert _score(_traj(task.id, code, "ANSWER: " + "9," * 3000 + "9"), env, reward) == 0.0


def test_calc_answer_refuses_other_envs_and_a_missing_prompt() -> None:
    src = CalcAnswer(CalcAnswer.Options(), prompt_messages=lambda tr: [Message(role="user", content="Fix the bug")])
    with pytest.raises(ConfigError, match="not a tool_calc question"):
        asyncio.run(src.value(_traj("x", "ANSWER: 1")))
    with pytest.raises(ConfigError, match="needs the task's prompt"):
        asyncio.run(CalcAnswer(CalcAnswer.Options()).value(_traj("x", "ANSWER: 1")))
