"""The `calc_answer` reward source: 1.0 when the model's last turn answers the tool_calc question right.

The answer is the first `ANSWER: <integer>` line of the trajectory's last model turn (commas allowed); the true
value is computed from the env's question text (the task prompt, given by the composition root), never from
anything the policy wrote or ran. `format_credit` (default 0) is given for a well-formed `ANSWER:` line with a
wrong number. Read from the stored turns only, so `agentrl rescore` reproduces it.
"""

from __future__ import annotations

import re

from pydantic import Field

from agentrl.errors import ConfigError
from agentrl.reward import RewardSource, SourceOptions, register_reward
from agentrl.types import Trajectory
from agentrl_tool_calc.tasks import expected_answer

ANSWER = re.compile(r"^\s*ANSWER:\s*(-?\d[\d,]*)\s*\.?\s*$", re.MULTILINE)


class CalcAnswerOptions(SourceOptions):
    format_credit: float = Field(default=0.0, ge=0.0, le=1.0)


def final_answer(traj: Trajectory) -> int | None:
    """The integer the last model turn gives as `ANSWER:`, or None."""
    if not traj.turns:
        return None
    m = ANSWER.search(traj.turns[-1].text or "")
    return int(m.group(1).replace(",", "")) if m else None


@register_reward("calc_answer")
class CalcAnswer(RewardSource):
    """1.0 for the right `ANSWER: n` in the last turn, `format_credit` for a wrong one, else 0."""

    Options = CalcAnswerOptions

    async def value(self, traj: Trajectory) -> float | None:
        if self.prompt_messages is None:
            raise ConfigError("reward calc_answer needs the task's prompt (run it through agentrl's scorer)")
        prompt = [m for m in self.prompt_messages(traj) if m.role == "user"]
        truth = expected_answer(prompt[-1].content) if prompt else None
        if truth is None:
            raise ConfigError(f"reward calc_answer: trajectory {traj.id} (task {traj.task_id}) is not a tool_calc "
                              "question; use it with env tool_calc")
        given = final_answer(traj)
        if given is None:
            return 0.0
        opts: CalcAnswerOptions = self.options  # type: ignore[assignment]  # built from cls.Options
        return 1.0 if given == truth else opts.format_credit
