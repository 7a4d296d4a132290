"""ToolChainEnv (`tool_chain`): apply a hidden function k times, where only the sandbox can evaluate it, so the
answer needs what the tool printed, turn after turn (tasks and truth: chain.py). The tool and the episode are
tool_calc's (a ```python block runs in the sandbox as main.py, after this task's `f`); the reward is `chain_answer`:
the last turn's `ANSWER: n` against the env's own truth, never anything the policy ran.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentrl.envs import Task, register_env
from agentrl.errors import ConfigError
from agentrl.reward import register_reward
from agentrl.types import Message, Trajectory
from agentrl_tool_calc.chain import HIGH, LOW, TIMES, expected_chain, make_tasks, prelude, question
from agentrl_tool_calc.env import ToolCalcEnv
from agentrl_tool_calc.reward import CalcAnswer, CalcAnswerOptions

SYSTEM_PROMPT = (
    f"There is a hidden function f on the numbers {LOW} to {HIGH}. You cannot know its values: write a ```python "
    "block that calls f and prints the result, and you will see its output. Then reply with one line: "
    "ANSWER: <number>"
)
# the worked examples, by hop count: one application per turn, then the answer. Their f is made up (not any task's).
EXAMPLES: dict[int, list[Message]] = {
    1: [Message(role="user", content=question(24, 1)),
        Message(role="assistant", content="```python\nprint(f(24))\n```"),
        Message(role="user", content="71"),
        Message(role="assistant", content="ANSWER: 71")],
    2: [Message(role="user", content=question(31, 2)),
        Message(role="assistant", content="```python\nprint(f(31))\n```"),
        Message(role="user", content="58"),
        Message(role="assistant", content="```python\nprint(f(58))\n```"),
        Message(role="user", content="17"),
        Message(role="assistant", content="ANSWER: 17")],
}


class ToolChainOptions(BaseModel):
    """`get_env("tool_chain", **options)`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    split: Literal["train", "eval"] = "train"  # disjoint seeds of the hidden functions
    tasks: int = Field(default=256, ge=1, le=100_000)
    hops: tuple[int, ...] = (2, 3)  # applications of f per question, cycled over the tasks
    example_hops: tuple[int, ...] = (2,)  # the worked examples before the question, by hop count, in this order
    run_timeout_s: float = Field(default=10.0, gt=0)
    output_chars: int = Field(default=400, ge=64)

    @field_validator("hops")
    @classmethod
    def _hops(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or set(value) - set(TIMES):
            raise ValueError(f"hops={list(value)}: a non-empty list of counts among {sorted(TIMES)}")
        return value

    @field_validator("example_hops")
    @classmethod
    def _example_hops(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if set(value) - set(EXAMPLES) or len(set(value)) != len(value):
            raise ValueError(f"example_hops={list(value)}: distinct counts among {sorted(EXAMPLES)} (or [] for none)")
        return value


@register_env("tool_chain")
class ToolChainEnv(ToolCalcEnv):
    """Apply a hidden function k times through the sandbox; reward: the final `ANSWER: n` is right."""

    system_prompt = SYSTEM_PROMPT

    def __init__(self, **options: Any) -> None:  # noqa: D107 - ToolCalcEnv's, with this env's options
        self.options = options
        try:
            self.config = ToolChainOptions.model_validate(options)  # type: ignore[assignment]  # same used fields
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'options'}: {e['msg']}" for e in exc.errors())
            raise ConfigError(f"env tool_chain: invalid options ({problems}). Fields: "
                              f"{', '.join(ToolChainOptions.model_fields)}") from exc
        self._tasks: list[Task] | None = None

    def tasks(self) -> list[Task]:
        if self._tasks is None:
            c: ToolChainOptions = self.config  # type: ignore[assignment]
            self._tasks = make_tasks(c.split, c.tasks, c.hops)
        return list(self._tasks)

    def messages(self, task: Task) -> list[Message]:
        c: ToolChainOptions = self.config  # type: ignore[assignment]
        shots = [m for k in c.example_hops for m in EXAMPLES[k]]
        return [Message(role="system", content=self.system_prompt), *shots, Message(role="user", content=task.prompt)]

    def program(self, code: str, task: Task) -> str:
        return prelude(dict(task.data["table"])) + code

    def reference_solution(self, task: Task) -> str | None:
        return f"print({'f(' * task.data['hops']}{task.data['start']}{')' * task.data['hops']})"


class ChainAnswerOptions(CalcAnswerOptions):
    # training-time shaping: an answer that is the chain's j-th value (of k) earns j/k, so a group where nobody
    # reached the end still prefers the samples that went further; evaluate without it (docs/configs)
    hop_credit: bool = False


@register_reward("chain_answer")
class ChainAnswer(CalcAnswer):
    """1.0 for the right `ANSWER: n` in the last turn (truth: chain.expected_chain); with `hop_credit`, j/k for the
    j-th intermediate value of k; `format_credit` for another number; else 0."""

    Options = ChainAnswerOptions

    def truth(self, traj: Trajectory) -> list[int]:
        chain = expected_chain(traj.task_id, self.question(traj))
        if chain is None:
            raise self.foreign(traj, "tool_chain task", "tool_chain")
        return chain

    def grade(self, given: int, truth: Any) -> float:
        chain: list[int] = truth
        opts: ChainAnswerOptions = self.options  # type: ignore[assignment]  # built from cls.Options
        if given == chain[-1]:
            return 1.0
        if opts.hop_credit and given in chain[1:]:  # the values are distinct (chain.make_tasks)
            return chain.index(given) / (len(chain) - 1)
        return opts.format_credit
