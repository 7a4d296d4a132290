"""How the chaos soak's judge (chaos_judge.py) counts the trajectories a dockerd restart hit: every attempt in flight
at a restart is either recorded infra_error and retried to a score, or was done with its sandbox (its own record is
final and scored right); anything else (lost, unscored, charged to the policy) is reported as wrong. No sandboxes:
these run in every tier."""

from __future__ import annotations

from chaos_dockerd import RestartRecord
from chaos_judge import _only_restart_retries, in_flight_at_restarts, restart_attempts, restart_outcomes
from chaos_plan import Slot
from chaos_run import named_sandboxes


FULL = 2.0  # unit_tests + http, both passed


def _rec(status: str, attempt: int, reward: float | None, kind: str | None = None) -> dict:
    return {"status": status, "attempt": attempt, "reward": reward, "error_kind": kind, "error": None}


def test_each_attempt_in_flight_at_a_restart_is_counted_by_its_outcome() -> None:
    s = Slot
    plan = {("t", 0): s("t", 0, "honest", ""), ("t", 1): s("t", 1, "honest", ""), ("t", 2): s("t", 2, "attack", "x"),
            ("t", 3): s("t", 3, "honest", ""), ("t", 4): s("t", 4, "attack", "y"), ("t", 5): s("t", 5, "honest", "")}
    attempts = {f"a{k}": ("t", k, 0) for k in range(6)} | {"b0": ("t", 0, 1)}
    stored = {("t", 0): _rec("ok", 1, FULL),  # hit, infra, retried to the full reward
              ("t", 1): _rec("ok", 0, FULL),  # finished grading as dockerd stopped
              ("t", 2): _rec("ok", 1, 0.0),  # an attack hit, retried, scored 0
              ("t", 3): _rec("policy_error", 0, 0.0, "sandbox_died_in_command"),  # charged to the policy: wrong
              ("t", 4): _rec("policy_error", 0, 0.0, "sandbox_died_in_command:exited:0")}  # same, for an attack
    infra = {("t", 0): [("sandbox_lost:engine_lost", 0)], ("t", 2): [("sandbox_lost:engine_lost", 0)]}
    out = restart_outcomes(["a0", "a1", "a2", "a3", "a4", "a5", "a0"], attempts, plan, stored, infra)
    assert (out["affected"], out["infra_retried_scored"], out["done_before_death"]) == (6, 2, 1)
    assert out["kinds"] == {"sandbox_lost:engine_lost": 2}
    assert sorted(b["traj_id"] for b in out["bad"]) == ["a3", "a4", "a5"]  # a5: lost (no record)


def test_an_infra_record_left_unscored_is_wrong_even_when_retried() -> None:
    plan = {("t", 0): Slot("t", 0, "honest", "")}
    stored = {("t", 0): _rec("infra_error", 2, None, "sandbox_start")}  # retries exhausted while dockerd was away
    infra = {("t", 0): [("sandbox_lost:engine_lost", 0), ("sandbox_start", 1)]}
    out = restart_outcomes(["a"], {"a": ("t", 0, 0)}, plan, stored, infra)
    assert out["infra_retried_scored"] == 0 and len(out["bad"]) == 1


def test_extra_attempts_are_accepted_only_when_a_restart_ended_them() -> None:
    attempts = {"a": ("t", 0, 0), "b": ("t", 0, 1), "c": ("t", 1, 0), "d": ("t", 2, 0)}
    log = [("a", "t", "sandbox_lost:engine_lost", 0), ("b", "t", "sandbox_start", 1),
           ("c", "t", "sandbox_died:signal:9", 0),  # in flight at a restart (its marker was seen): accepted
           ("d", "t", "sandbox_died:signal:9", 0)]  # neither seen nor a kind only a missing engine gives
    hit = restart_attempts(log, {"c"}, attempts)
    assert hit == {("t", 0): {0, 1}, ("t", 1): {0}}
    assert _only_restart_retries(_rec("ok", 2, FULL), hit[("t", 0)])
    assert not _only_restart_retries(_rec("ok", 1, FULL), set())  # an unexplained retry
    assert _only_restart_retries(_rec("ok", 0, FULL), set())  # no restart, no retry: as before


def test_a_sandbox_leased_before_its_first_command_is_found_by_the_error_that_names_it() -> None:
    log = ("12:00:01 WARNING agentrl.runner: trajectory aaa (task t) infra error [sandbox_lost:engine_lost], "
           "attempt 0: SandboxDiedError: agent at /tmp/x/agentrl-docker-0/agentrl-0123456789ab/agent.sock is gone\n"
           "12:00:02 WARNING agentrl.runner: trajectory bbb (task t) infra error [engine], attempt 0: no sandbox\n")
    records = [{"id": "ccc", "error": "SandboxDiedError: agent at /tmp/x/agentrl-docker-0/agentrl-ba9876543210/a"},
               {"id": "ddd", "error": None}]
    named = named_sandboxes(log, records)
    assert named == {"aaa": "agentrl-0123456789ab", "ccc": "agentrl-ba9876543210"}
    restarts = [RestartRecord(t_s=1.0, affected=["mmm"], unmarked_leased=["agentrl-0123456789ab"]),
                RestartRecord(t_s=2.0, unmarked_leased=["agentrl-ba9876543210", "agentrl-ffffffffffff"])]
    affected, unmapped = in_flight_at_restarts(restarts, named)
    assert affected == {"mmm", "aaa", "ccc"} and unmapped == ["agentrl-ffffffffffff"]
