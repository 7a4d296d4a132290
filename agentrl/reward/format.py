"""The `format` rule source: 1.0 when the episode followed the env's action format, else 0.0.

Followed means all of: the model produced tokens; it made at least one well-formed tool call (an episode that never
acts, or an empty one, has not followed an action format; `require_call: false` drops this for envs whose answers
need no tool); no turn has a parse error or a call the env rejected as malformed (`parse_error`, `unknown_tool`,
`bad_arguments`); and no turn was cut by the token budget (a cut turn's last call was never checked). Read from the
stored turns only; the model's own text is never trusted to say how it did.
"""

from __future__ import annotations

from agentrl.reward.base import RewardSource, SourceOptions
from agentrl.reward.registry import register_reward
from agentrl.types import Trajectory

MALFORMED_CALL_ERRORS = frozenset({"parse_error", "unknown_tool", "bad_arguments"})


class FormatOptions(SourceOptions):
    require_call: bool = True


def format_followed(traj: Trajectory, *, require_call: bool = True) -> bool:
    if traj.num_model_tokens == 0 or not traj.turns:
        return False
    if require_call and traj.num_tool_calls == 0:
        return False
    for turn in traj.turns:
        if turn.parse_errors or turn.finish_reason == "length":
            return False
        if any(r.error in MALFORMED_CALL_ERRORS for r in turn.tool_results):
            return False
    return True


@register_reward("format")
class Format(RewardSource):
    """1.0 when the env's action format was followed with no malformed call, else 0.0."""

    Options = FormatOptions

    async def value(self, traj: Trajectory) -> float | None:
        opts: FormatOptions = self.options  # type: ignore[assignment]  # built from cls.Options
        return 1.0 if format_followed(traj, require_call=opts.require_call) else 0.0
