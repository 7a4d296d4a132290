"""The `calc_answer` reward source: 1.0 when the model's last turn answers the tool_calc question right.

The answer is the first `ANSWER: <integer>` line of the trajectory's last model turn (commas allowed); the true
value is computed from the env's question text (the task prompt, given by the composition root), never from
anything the policy wrote or ran. `format_credit` (default 0) is given for a well-formed `ANSWER:` line with a
wrong number. Read from the stored turns only, so `agentrl rescore` reproduces it.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field

from agentrl.errors import ConfigError
from agentrl.reward import RewardSource, SourceOptions, register_reward
from agentrl.types import Trajectory
from agentrl_tool_calc.tasks import expected_answer

ANSWER = re.compile(r"^\s*ANSWER:\s*(-?\d[\d,]*)\s*\.?\s*$", re.MULTILINE)


class CalcAnswerOptions(SourceOptions):
    format_credit: float = Field(default=0.0, ge=0.0, le=1.0)


MAX_ANSWER_DIGITS = 100  # no question's answer is longer; a longer number is wrong, never parsed


def final_answer(traj: Trajectory) -> int | None:
    """The integer the last model turn gives as `ANSWER:`, or None (none, or one over MAX_ANSWER_DIGITS digits:
    int() of a 5,000-digit string raises, and a grader that raises on the policy's text would leave it unscored)."""
    if not traj.turns:
        return None
    m = ANSWER.search(traj.turns[-1].text or "")
    if m is None:
        return None
    digits = m.group(1).replace(",", "")
    return int(digits) if len(digits.lstrip("-")) <= MAX_ANSWER_DIGITS else None


@register_reward("calc_answer")
class CalcAnswer(RewardSource):
    """1.0 for the right `ANSWER: n` in the last turn, `format_credit` for a wrong one, else 0."""

    Options = CalcAnswerOptions

    def question(self, traj: Trajectory) -> str:
        """The env's question of `traj`'s task: the last user message of its opening chat (from the scorer)."""
        if self.prompt_messages is None:
            raise ConfigError(f"reward {self.name} needs the task's prompt (run it through agentrl's scorer)")
        prompt = [m for m in self.prompt_messages(traj) if m.role == "user"]
        return prompt[-1].content if prompt else ""

    def foreign(self, traj: Trajectory, kind: str, env: str) -> ConfigError:
        return ConfigError(f"reward {self.name}: trajectory {traj.id} (task {traj.task_id}) is not a {kind}; use it "
                           f"with env {env}")

    def truth(self, traj: Trajectory) -> Any:
        """What grading compares the answer with, from the env's own question (never from the policy)."""
        truth = expected_answer(self.question(traj))
        if truth is None:
            raise self.foreign(traj, "tool_calc question", "tool_calc")
        return truth

    def grade(self, given: int, truth: Any) -> float:
        opts: CalcAnswerOptions = self.options  # type: ignore[assignment]  # built from cls.Options
        return 1.0 if given == truth else opts.format_credit

    async def value(self, traj: Trajectory) -> float | None:
        truth = self.truth(traj)  # first: a foreign trajectory is a config error even without an answer
        given = final_answer(traj)
        return 0.0 if given is None else self.grade(given, truth)
