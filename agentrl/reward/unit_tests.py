"""Unit-test rewards. Pure: the same stored trajectory always gets the same reward; no sandbox, no I/O.

`infra_error` trajectories get `None`, never 0: an infrastructure failure says nothing about the policy.
"""

from __future__ import annotations

from agentrl.types import RewardResult, Status, Trajectory


def unit_test_fraction(traj: Trajectory) -> RewardResult | None:
    """Fraction of hidden unit tests passed; None when the trajectory must not be scored."""
    if traj.status is Status.infra_error or traj.tests is None:
        return None
    frac = traj.tests.fraction
    return RewardResult(reward=frac, components={"tests_passed": float(traj.tests.passed),
                                                 "tests_total": float(traj.tests.total)})


def length_shaped(traj: Trajectory, *, expected_tokens: int = 512, alpha: float = 0.001) -> RewardResult | None:
    """correctness - alpha * max(0, model_tokens - expected), applied only once the answer is fully correct."""
    base = unit_test_fraction(traj)
    if base is None or base.reward < 1.0:
        return base
    penalty = alpha * max(0, traj.num_model_tokens - expected_tokens)
    return RewardResult(reward=base.reward - penalty, components={**base.components, "length_penalty": -penalty})


def score(traj: Trajectory) -> Trajectory:
    """A copy of `traj` with `reward` set from its test report (the default reward)."""
    result = unit_test_fraction(traj)
    return traj.model_copy(update={"reward": None if result is None else result.reward})
