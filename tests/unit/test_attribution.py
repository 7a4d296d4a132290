"""Failure attribution rules (agentrl.runner.attribution): infra_error only where the system can prove the policy is
not to blame; everything the policy can provoke is scored. And the unscored-fraction guard."""

from __future__ import annotations

import pytest

from agentrl.errors import (
    EngineUnavailableError,
    SandboxDiedError,
    SandboxError,
    SandboxStartError,
    UnscoredLimitError,
)
from agentrl.runner.attribution import DeathFacts, Stage, classify
from agentrl.runner.guard import UnscoredGuard
from agentrl.types import Status, Trajectory

DIED = SandboxDiedError("agent stopped answering")


@pytest.mark.parametrize("stage", list(Stage))
def test_engine_failure_is_infra_in_every_stage(stage: Stage) -> None:
    v = classify(EngineUnavailableError("down"), stage)
    assert v.status is Status.infra_error and v.kind == "engine"


@pytest.mark.parametrize(("stage", "exc", "expired", "kind"), [
    (Stage.start, ValueError("template"), False, "prompt_failed"),
    (Stage.lease, SandboxStartError("no bwrap"), False, "sandbox_start"),
    (Stage.lease, TimeoutError(), True, "lease_timeout"),
    (Stage.setup, DIED, False, "setup_failed"),
    (Stage.setup, TimeoutError(), True, "setup_timeout"),
    (Stage.grade_lease, SandboxStartError("no bwrap"), False, "grade_sandbox_start"),
    (Stage.grade_lease, TimeoutError(), True, "grade_lease_timeout"),
    (Stage.grade_lease, RuntimeError("pool closed"), False, "grade_lease_failed"),
])
def test_failures_before_the_policy_acts_are_infra(stage: Stage, exc: Exception, expired: bool, kind: str) -> None:
    v = classify(exc, stage, deadline_expired=expired)
    assert (v.status, v.kind) == (Status.infra_error, kind)


@pytest.mark.parametrize("stage", [Stage.turns, Stage.finalize])
@pytest.mark.parametrize("cause", ["deleted", "evicted", "killed:9"])
def test_sandbox_lost_from_outside_is_infra_even_during_a_command(stage: Stage, cause: str) -> None:
    v = classify(DIED, stage, death=DeathFacts(in_flight=True, uid_separated=False, cause=cause))
    assert v.status is Status.infra_error and v.kind == f"sandbox_lost:{cause}"


@pytest.mark.parametrize("stage", [Stage.turns, Stage.finalize])
@pytest.mark.parametrize(("cause", "separated"), [(None, True), ("oom", True), ("exited:0", True), (None, False),
                                                  ("oom", False), ("signal:9", False)])
def test_death_during_a_policy_command_is_the_policys(stage: Stage, cause: str | None, separated: bool) -> None:
    v = classify(DIED, stage, death=DeathFacts(in_flight=True, uid_separated=separated, cause=cause))
    assert v.status is Status.policy_error and v.kind.startswith("sandbox_died_in_command")


@pytest.mark.parametrize("in_flight", [True, False])
def test_agent_killed_by_a_signal_the_policy_cannot_send_is_infra(in_flight: bool) -> None:
    v = classify(DIED, Stage.turns, death=DeathFacts(in_flight=in_flight, uid_separated=True, cause="signal:9"))
    assert (v.status, v.kind) == (Status.infra_error, "sandbox_died:signal:9")


def test_death_between_commands_depends_on_uid_separation() -> None:
    separated = classify(DIED, Stage.turns, death=DeathFacts(in_flight=False, uid_separated=True, cause="signal:9"))
    assert separated.status is Status.infra_error and separated.kind == "sandbox_died:signal:9"
    shared = classify(DIED, Stage.turns, death=DeathFacts(in_flight=False, uid_separated=False, cause=None))
    assert shared.status is Status.policy_error, "a single-uid sandbox's agent can be killed by a policy daemon"


def test_death_without_facts_is_charged_to_the_policy() -> None:
    assert classify(DIED, Stage.turns).status is Status.policy_error


def test_finalize_failures_are_the_policys() -> None:
    timeout = classify(TimeoutError(), Stage.finalize, deadline_expired=True)
    assert (timeout.status, timeout.kind) == (Status.policy_error, "finalize_timeout")
    decode = classify(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), Stage.finalize)
    assert (decode.status, decode.kind) == (Status.policy_error, "finalize_failed")


def test_agent_errors_and_our_bugs_in_turns_are_infra() -> None:
    assert classify(SandboxError("500"), Stage.turns).kind == "sandbox_error"
    v = classify(KeyError("x"), Stage.turns)
    assert (v.status, v.kind) == (Status.infra_error, "internal_error")


def _traj(status: Status, kind: str | None = None) -> Trajectory:
    return Trajectory(id="t", group_id="g", task_id="x", env="e", status=status, prompt_ids=[1], error_kind=kind)


def test_guard_waits_for_enough_trajectories_then_names_the_most_common_cause() -> None:
    guard = UnscoredGuard(max_frac=0.10, min_trajectories=10)
    for kind in ["engine", "engine", "lease_timeout"]:
        guard.add(_traj(Status.infra_error, kind))
        guard.check()  # fewer than 10 in: cannot tell yet
    for _ in range(6):
        guard.add(_traj(Status.ok))
    guard.check()
    guard.add(_traj(Status.policy_error, "finalize_failed"))  # scored: not unscored
    with pytest.raises(UnscoredLimitError, match=r"3/10 .*most common cause: engine \(2x\)"):
        guard.check()


def test_guard_allows_the_limit_itself() -> None:
    guard = UnscoredGuard(max_frac=0.25, min_trajectories=4)
    for status in (Status.infra_error, Status.ok, Status.ok, Status.ok):
        guard.add(_traj(status, "engine"))
    guard.check()
    assert guard.summary() == {"infra_error_frac": 0.25, "unscored_causes": {"engine": 1}}


class _NeedyEnv:
    name = "needy"

    def time_needs(self) -> dict[str, float]:
        return {"tool_call": 80.0, "finalize": 50.0}


def test_deadlines_shorter_than_the_env_needs_are_refused_at_start_up() -> None:
    from agentrl.errors import ConfigError
    from agentrl.runner import check_time_needs

    check_time_needs(_NeedyEnv(), tool_timeout_s=80, finalize_timeout_s=50)
    with pytest.raises(ConfigError, match=r"budgets.tool_timeout_s=10s .* at least 80"):
        check_time_needs(_NeedyEnv(), tool_timeout_s=10, finalize_timeout_s=300)
    with pytest.raises(ConfigError, match=r"budgets.finalize_timeout_s=30s .* at least 50"):
        check_time_needs(_NeedyEnv(), tool_timeout_s=300, finalize_timeout_s=30)


def test_code_tests_default_budgets_fit_its_needs() -> None:
    from agentrl.config import BudgetConfig
    from agentrl.envs import get_env
    from agentrl.runner import check_time_needs

    b = BudgetConfig()
    check_time_needs(get_env("code_tests"), tool_timeout_s=b.tool_timeout_s, finalize_timeout_s=b.finalize_timeout_s)
