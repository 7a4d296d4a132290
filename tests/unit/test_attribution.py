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


SEPARATED = {"uid_separated": True, "control_plane_separated": True}


@pytest.mark.parametrize("in_flight", [True, False])
def test_agent_killed_by_a_signal_the_policy_cannot_send_nor_provoke_is_infra(in_flight: bool) -> None:
    v = classify(DIED, Stage.turns, death=DeathFacts(in_flight=in_flight, cause="signal:9", **SEPARATED))
    assert (v.status, v.kind) == (Status.infra_error, "sandbox_died:signal:9")


@pytest.mark.parametrize("in_flight", [True, False])
def test_an_unproven_sigkill_is_infra_only_where_the_policy_cannot_cause_it(in_flight: bool) -> None:
    """A SIGKILL with no record of who sent it: with the agent uid-separated and on its own memory and pids, the
    policy could neither send it nor provoke it (the OOM killer of the agent's own cgroup is not the policy's doing
    either), so no OOM flag is needed to call it infra; with the resources shared it stays the policy's."""
    separated = classify(DIED, Stage.turns, death=DeathFacts(in_flight=in_flight, cause="sigkill_unproven",
                                                             **SEPARATED))
    assert (separated.status, separated.kind) == (Status.infra_error, "sandbox_died:sigkill_unproven")
    shared = classify(DIED, Stage.turns, death=DeathFacts(in_flight=in_flight, uid_separated=True,
                                                          cause="sigkill_unproven"))
    assert shared.status is Status.policy_error
    single = classify(DIED, Stage.turns, death=DeathFacts(in_flight=in_flight, cause="sigkill_unproven"))
    assert single.status is Status.policy_error


@pytest.mark.parametrize("in_flight", [True, False])
def test_a_signal_is_the_policys_when_the_agent_shares_the_commands_resources(in_flight: bool) -> None:
    """uid separation alone proves the commands cannot signal the agent, not that they cannot starve it (a cgroup
    OOM / pids exhaustion the backend did not name)."""
    v = classify(DIED, Stage.turns, death=DeathFacts(in_flight=in_flight, uid_separated=True, cause="signal:9"))
    assert v.status is Status.policy_error
    assert v.kind == ("sandbox_died_in_command:signal:9" if in_flight else "sandbox_died_shared_resources:signal:9")


def test_death_between_commands_without_proof_is_the_policys() -> None:
    shared = classify(DIED, Stage.turns, death=DeathFacts(cause=None))
    assert (shared.status, shared.kind) == (Status.policy_error, "sandbox_died_single_uid")
    for cause in (None, "exited:1", "oom"):
        v = classify(DIED, Stage.turns, death=DeathFacts(cause=cause, **SEPARATED))
        assert v.status is Status.policy_error and v.kind.startswith("sandbox_died_unproven"), cause


@pytest.mark.parametrize("stage", [Stage.turns, Stage.finalize])
def test_a_sandbox_that_still_answers_did_not_die_its_missed_deadline_is_the_policys(stage: Stage) -> None:
    late = SandboxDiedError("read timed out", in_flight=True, request="POST /read")
    v = classify(late, stage, death=DeathFacts(answers=True, **SEPARATED))
    assert (v.status, v.kind) == (Status.policy_error, "sandbox_answers")
    assert "still answers" in v.message and "read timed out" in v.message


@pytest.mark.parametrize("cause", ["deadline", "signal:14"])
def test_a_ttl_kill_is_infra_only_when_the_budgets_allowed_the_episode_to_still_run(cause: str) -> None:
    within = classify(DIED, Stage.finalize, death=DeathFacts(cause=cause, uid_separated=True, within_budgets=True))
    assert (within.status, within.kind) == (Status.infra_error, f"sandbox_lost:{cause}")
    beyond = classify(DIED, Stage.finalize, death=DeathFacts(cause=cause, uid_separated=True, within_budgets=False))
    assert (beyond.status, beyond.kind) == (Status.policy_error, "sandbox_ttl_below_budgets")
    assert "sandbox.spec.ttl_s" in beyond.message


def test_sigalrm_is_no_ttl_proof_in_a_single_uid_sandbox() -> None:
    v = classify(DIED, Stage.turns, death=DeathFacts(cause="signal:14", within_budgets=True))
    assert v.status is Status.policy_error


# every failure the policy can provoke after its first action: (exception, stage, deadline expired, facts, kind).
# The attack suite's causes: its output breaks our parsing / rendering / path handling, its files cannot be read,
# the agent refuses a request about its data, it exhausts memory or pids (in its commands or starving the agent),
# kills the agent of a single-uid sandbox, stalls a request on a sandbox that still answers, runs grading out.
POLICY_CAUSES = [
    (KeyError("tool_calls"), Stage.turns, False, None, "turn_failed"),
    (ValueError("bad escape"), Stage.turns, False, None, "turn_failed"),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), Stage.turns, False, None, "turn_failed"),
    (RecursionError("deep json"), Stage.turns, False, None, "turn_failed"),
    (FileNotFoundError("solution.py"), Stage.turns, False, None, "turn_failed"),
    (TimeoutError(), Stage.turns, False, None, "turn_failed"),
    (SandboxError("read 'x': HTTP 500 from the agent"), Stage.turns, False, None, "sandbox_error"),
    (SandboxError("read 'x': HTTP 500 from the agent"), Stage.finalize, False, None, "sandbox_error"),
    (DIED, Stage.turns, False, DeathFacts(in_flight=True, cause="oom", **SEPARATED), "sandbox_died_in_command:oom"),
    (DIED, Stage.turns, False, DeathFacts(in_flight=True, cause="signal:9"), "sandbox_died_in_command:signal:9"),
    (DIED, Stage.turns, False, DeathFacts(cause="oom", uid_separated=True), "sandbox_died_shared_resources:oom"),
    (DIED, Stage.turns, False, DeathFacts(cause="signal:9", uid_separated=True),
     "sandbox_died_shared_resources:signal:9"),
    (DIED, Stage.turns, False, DeathFacts(cause="signal:9"), "sandbox_died_single_uid"),
    (DIED, Stage.turns, False, DeathFacts(cause="oom", **SEPARATED), "sandbox_died_unproven:oom"),
    (DIED, Stage.finalize, False, DeathFacts(answers=True, uid_separated=True), "sandbox_answers"),
    (DIED, Stage.finalize, False, None, "sandbox_died_single_uid"),
    (TimeoutError(), Stage.finalize, True, None, "finalize_timeout"),
    (OSError("EMFILE"), Stage.finalize, False, None, "finalize_failed"),
]


@pytest.mark.parametrize(("exc", "stage", "expired", "facts", "kind"), POLICY_CAUSES,
                         ids=[row[-1] + "-" + row[1].value for row in POLICY_CAUSES])
def test_every_policy_caused_failure_is_scored_and_never_reaches_the_guard(
        exc: Exception, stage: Stage, expired: bool, facts: DeathFacts | None, kind: str) -> None:
    v = classify(exc, stage, deadline_expired=expired, death=facts)
    assert (v.status, v.kind) == (Status.policy_error, kind)
    assert type(exc).__name__ in v.message  # precise: the message names what was raised
    guard = UnscoredGuard(max_frac=0.0, min_trajectories=1)
    guard.add(_traj(v.status, v.kind))
    guard.check()  # scored: a run full of these never stops as "unscored"
    assert guard.unscored == 0


def test_the_guard_names_only_proven_infra_causes_with_their_counts() -> None:
    guard = UnscoredGuard(max_frac=0.10, min_trajectories=4)
    for exc, stage, expired, facts, _ in POLICY_CAUSES:
        v = classify(exc, stage, deadline_expired=expired, death=facts)
        guard.add(_traj(v.status, v.kind))
    infra = [classify(DIED, Stage.turns, death=DeathFacts(cause="deleted")),
             classify(DIED, Stage.turns, death=DeathFacts(cause="deleted")),
             classify(EngineUnavailableError("down"), Stage.turns)]
    for v in infra:
        guard.add(_traj(v.status, v.kind))
    with pytest.raises(UnscoredLimitError) as err:
        guard.check()
    assert "most common cause: sandbox_lost:deleted (2x)" in str(err.value)
    assert "Unscored by error_kind: {'sandbox_lost:deleted': 2, 'engine': 1}" in str(err.value)


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


# -- budgets agree with the sandbox TTL -------------------------------------------------------------------------------

def test_the_default_config_has_a_ttl_that_covers_its_budgets() -> None:
    from agentrl.config import RolloutConfig, check_ttl_covers_budgets
    from agentrl.runner import SchedulerConfig

    cfg = RolloutConfig()
    check_ttl_covers_budgets(cfg.budgets, cfg.sandbox)
    assert cfg.sandbox.spec.ttl_s >= SchedulerConfig.from_config(cfg).episode_budget_s() == cfg.budgets.episode_s()


def test_a_ttl_shorter_than_the_budgets_is_refused_naming_the_fields_and_the_fix() -> None:
    from agentrl.config import RolloutConfig, check_ttl_covers_budgets
    from agentrl.errors import ConfigError

    cfg = RolloutConfig.model_validate({"sandbox": {"spec": {"ttl_s": 3600}}})
    with pytest.raises(ConfigError, match=r"sandbox.spec.ttl_s=3600s is shorter .*trajectory_timeout_s.* = 4980s; "
                                          r"raise sandbox.spec.ttl_s to at least 4980"):
        check_ttl_covers_budgets(cfg.budgets, cfg.sandbox)


class _TTLPool:
    async def death_cause(self, sandbox: object) -> str:
        return "deadline"


class _DeadSandbox:
    uid_separated = True
    agent_info: dict[str, object] = {}

    def __init__(self, ttl_s: int) -> None:
        from agentrl.sandbox import SandboxSpec

        self.spec = SandboxSpec(ttl_s=ttl_s)

    async def health(self) -> bool:
        return False


@pytest.mark.parametrize(("ttl_s", "status"), [(None, Status.infra_error), (3600, Status.policy_error)])
async def test_a_ttl_kill_during_grading_is_infra_when_the_ttl_covers_the_budgets(ttl_s: int | None,
                                                                                 status: Status) -> None:
    """Kubernetes ends a pod at its TTL (cause "deadline"). With the default budgets (4,980 s) the TTL kill of a
    legitimate long episode during grading is the system's; only a TTL below the budgets leaves no proof."""
    from types import SimpleNamespace

    from agentrl.config import RolloutConfig
    from agentrl.runner import Scheduler, SchedulerConfig

    cfg = RolloutConfig()  # the defaults: budgets and the sandbox TTL
    rollout = SimpleNamespace(env=SimpleNamespace(name="e", grading_sandbox="same"))
    sched = Scheduler(rollout, _TTLPool(), SchedulerConfig.from_config(cfg))  # type: ignore[arg-type]
    died = SandboxDiedError("agent stopped answering", in_flight=True, request="POST /exec")
    v = await sched._verdict(died, Stage.finalize, _DeadSandbox(ttl_s or cfg.sandbox.spec.ttl_s))
    assert v.status is status
    assert v.kind == ("sandbox_lost:deadline" if status is Status.infra_error else "sandbox_ttl_below_budgets")
