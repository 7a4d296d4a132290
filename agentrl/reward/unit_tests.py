"""Rule sources over the env's test report: `unit_tests` (fraction of hidden tests passed, the default reward) and
`length_penalty` (shaping once the answer is fully correct). Pure: no sandbox, no I/O.

`infra_error` trajectories get `None`, never 0: an infrastructure failure says nothing about the policy.
"""

from __future__ import annotations

from pydantic import Field

from agentrl.reward.base import RewardSource, SourceOptions
from agentrl.reward.registry import register_reward
from agentrl.types import RewardResult, Status, Trajectory


def unit_test_fraction(traj: Trajectory) -> RewardResult | None:
    """Fraction of hidden unit tests passed; None when the trajectory must not be scored."""
    if traj.status is Status.infra_error or traj.tests is None:
        return None
    frac = traj.tests.fraction
    return RewardResult(reward=frac, components={"tests_passed": float(traj.tests.passed),
                                                 "tests_total": float(traj.tests.total)})


def fully_correct(traj: Trajectory) -> bool:
    return traj.tests is not None and traj.tests.total > 0 and traj.tests.passed == traj.tests.total


def length_penalty(traj: Trajectory, *, expected_tokens: int, alpha: float) -> float:
    """-alpha * max(0, model tokens - expected) on a fully correct answer, else 0. Tool/env tokens never count."""
    if not fully_correct(traj):
        return 0.0
    return -alpha * max(0, traj.num_model_tokens - expected_tokens)


def length_shaped(traj: Trajectory, *, expected_tokens: int = 512, alpha: float = 0.001) -> RewardResult | None:
    """correctness - alpha * max(0, model_tokens - expected), applied only once the answer is fully correct."""
    base = unit_test_fraction(traj)
    if base is None or base.reward < 1.0:
        return base
    penalty = length_penalty(traj, expected_tokens=expected_tokens, alpha=alpha)
    return RewardResult(reward=base.reward + penalty, components={**base.components, "length_penalty": penalty})


def score(traj: Trajectory) -> Trajectory:
    """A copy of `traj` scored by the default reward alone (`unit_tests`, weight 1), synchronously."""
    result = unit_test_fraction(traj)
    if result is None:
        return traj.model_copy(update={"reward": None, "reward_components": {}})
    return traj.model_copy(update={"reward": result.reward, "reward_components": {"unit_tests": result.reward}})


@register_reward("unit_tests")
class UnitTests(RewardSource):
    """Fraction of the env's hidden unit tests passed (0 for a harness with no tests)."""

    async def value(self, traj: Trajectory) -> float | None:
        result = unit_test_fraction(traj)
        return None if result is None else result.reward


class LengthPenaltyOptions(SourceOptions):
    expected_tokens: int = Field(default=512, ge=0)  # model tokens allowed before the penalty starts
    alpha: float = Field(default=0.001, ge=0.0)  # penalty per model token beyond expected_tokens


@register_reward("length_penalty")
class LengthPenalty(RewardSource):
    """-alpha * max(0, model tokens - expected_tokens), only on fully correct answers (else 0)."""

    Options = LengthPenaltyOptions

    async def value(self, traj: Trajectory) -> float | None:
        if traj.tests is None:
            return None
        opts: LengthPenaltyOptions = self.options  # type: ignore[assignment]  # built from cls.Options
        return length_penalty(traj, expected_tokens=opts.expected_tokens, alpha=opts.alpha)
