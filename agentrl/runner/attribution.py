"""Failure attribution: who is to blame when a trajectory does not end normally — the system or the policy.

Attribution is an allow-list of proofs. A policy under RL pressure will use any failure that is not charged to it to
dodge a score it does not like, so `infra_error` (unscored, retried) needs evidence of a cause outside the policy's
reach: the engine, a lease or setup failure before the policy's first action, a sandbox deleted / evicted / killed
from outside (the backend proves it), an agent killed by a signal the policy can neither send nor provoke, a TTL
kill while the budgets allowed the episode to still run (the reward service's own 5xx / timeout is handled by the
scheduler's `_score`, not a stage here).
Everything else from the policy's first action on is `policy_error`: scored (the env's `failed_report`, 0), with
the reason stored on the trajectory. That includes any exception raised while handling what the policy produced
(parsing, path resolution, reading its files, rendering its output), an OOM or pids exhaustion inside the sandbox,
and a missed deadline on a sandbox that still answers.

    stage      exception                                   verdict
    ---------  ------------------------------------------  ------------------------------------------------------
    any        EngineError                                 infra   engine
    start      any                                         infra   prompt_failed (before the policy)
    lease      SandboxStartError / any / deadline          infra   sandbox_start / lease_failed / lease_timeout
    grade_     SandboxStartError / any / deadline          infra   grade_sandbox_start / grade_lease_failed /
      lease                                                        grade_lease_timeout (fresh grading: the second
                                                                   sandbox; the policy never ran in it)
    setup      any / deadline                              infra   setup_failed / setup_timeout   (before the policy)
    turns,     SandboxDiedError, TTL kill ("deadline", or  infra   sandbox_lost:<cause> when the budgets allowed the
    finalize     SIGALRM of a uid-separated agent)                 episode to still be running (the sandbox's TTL
                                                                   covers them); else policy sandbox_ttl_below_budgets
               SandboxDiedError, backend proves an         infra   sandbox_lost:<cause>  (deleted / evicted from
                 outside cause                                     outside, the sandbox process killed on the host)
               SandboxDiedError, the sandbox still         policy  sandbox_answers (a request missed its deadline
                 answers a health probe                            while the agent was busy with the policy's work)
               SandboxDiedError, agent killed by a signal,  infra   sandbox_died:signal:<n> (commands can neither
                 not the OOM killer, uid-separated sandbox         signal the agent nor exhaust its memory / pids:
                 whose control plane is resource-separated         the host did)
               SandboxDiedError during a command           policy  sandbox_died_in_command[:<cause>] (incl. oom)
               SandboxDiedError, single-uid sandbox        policy  sandbox_died_single_uid (its leftover processes
                                                                   could have killed the agent)
               SandboxDiedError, control plane shares the  policy  sandbox_died_shared_resources[:<cause>] (the
                 commands' memory / pids                           commands could have starved the agent)
               SandboxDiedError, any other                 policy  sandbox_died_unproven[:<cause>] (no proof of an
                                                                   outside cause)
               other SandboxError (the agent answered an   policy  sandbox_error (a request about the policy's data
                 error)                                            failed)
    turns,     PolicyError (e.g. SandboxSurvivorsError:    policy  <its kind> (policy_broke_episode when it has none)
      finalize   the policy's processes survived SIGKILL)
    finalize   deadline                                    policy  finalize_timeout (the env's own budget fits in it,
                                                                   checked at start-up)
               any other exception                         policy  finalize_failed (e.g. what the policy left in the
                                                                   workspace cannot be read)
    turns      any other exception                         policy  turn_failed (handling the policy's output raised:
                                                                   parsing, paths, its files, rendering)
    (fresh grading: `finalize` covers collect() in the policy's sandbox and grade() in the fresh one; a death of
    the fresh sandbox follows the rows above with that sandbox's facts)

A SIGKILL is an outside cause ("killed:9", "signal:9") only when the backend holds a positive record that the OOM
killer did not send it (the kernel's OOM counter of the agent's cgroup, the engine's own kill event); with none it
reports "sigkill_unproven". That is infra only where the policy can neither send nor provoke it (uid-separated, the
agent's memory and pids its own: the "agent killed by a signal" row), and the policy's everywhere else. No verdict
depends on an OOM flag a runtime may lack (docs/reward-integrity.md, "How each backend proves an agent's death").
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from agentrl.errors import EngineError, PolicyError, SandboxDiedError, SandboxError, SandboxStartError
from agentrl.sandbox.base import SIGKILL_UNPROVEN
from agentrl.types import Status

# provably from outside the sandbox; "engine_lost": the container engine itself stopped answering as the sandbox died
# (dockerd stopped or restarted: nothing inside a container reaches the engine's socket)
EXTERNAL_CAUSES = ("deleted", "evicted", "killed", "node_lost", "preempted", "engine_lost")
TTL_CAUSES = ("deadline",)  # the backend's TTL ended the sandbox (Kubernetes activeDeadlineSeconds)
TTL_ALARM = "signal:14"  # docker's TTL: SIGALRM to the agent (only the host can send it to a uid-separated agent)


class Stage(str, Enum):
    start = "start"  # rendering the prompt (env.messages, the chat template)
    lease = "lease"
    grade_lease = "grade_lease"  # fresh grading: leasing the second sandbox (after the policy's was returned)
    setup = "setup"
    turns = "turns"
    finalize = "finalize"


@dataclass(frozen=True)
class Verdict:
    status: Status  # infra_error or policy_error
    kind: str  # short machine-readable cause, stored as `error_kind`
    message: str

    @property
    def infra(self) -> bool:
        return self.status is Status.infra_error


@dataclass(frozen=True)
class DeathFacts:
    """What the sandbox layer can prove about a sandbox that stopped answering (unset facts prove nothing: every
    death is then the policy's)."""

    in_flight: bool = False  # the connection broke while a command (POST /exec: the policy's code) was running
    uid_separated: bool = False  # commands run under another uid than the agent: they cannot signal it
    cause: str | None = None  # the backend's proven cause ("deleted", "evicted", "oom", "signal:9", ...) or None
    # the agent's memory / pids / CPU are not the commands' (its own cgroup share): the commands cannot starve it
    control_plane_separated: bool = False
    answers: bool = False  # a health probe after the failure got an answer: the sandbox is alive
    # the sandbox's TTL covers the episode's budgets (lease + setup + trajectory + finalize + teardown): the stage
    # deadlines end every episode before the TTL, so a TTL kill came while the budgets allowed it to still run
    within_budgets: bool = False


def _infra(kind: str, exc: BaseException | str) -> Verdict:
    return Verdict(Status.infra_error, kind, _text(exc))


def _policy(kind: str, exc: BaseException | str) -> Verdict:
    return Verdict(Status.policy_error, kind, _text(exc))


def _text(exc: BaseException | str) -> str:
    return exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"


def _with_cause(kind: str, cause: str | None) -> str:
    return f"{kind}:{cause}" if cause else kind


def classify(exc: BaseException, stage: Stage, *, deadline_expired: bool = False,
             death: DeathFacts | None = None) -> Verdict:
    """The verdict for `exc` raised in `stage`. `deadline_expired`: the stage's own deadline fired."""
    if isinstance(exc, EngineError):
        return _infra("engine", exc)
    if stage in (Stage.start, Stage.lease, Stage.setup):
        return _before_policy(exc, stage, deadline_expired)
    if stage is Stage.grade_lease:
        return _grade_lease(exc, deadline_expired)
    if isinstance(exc, SandboxDiedError):
        return _sandbox_death(exc, death or DeathFacts())
    if isinstance(exc, PolicyError):
        return _policy(getattr(exc, "kind", None) or "policy_broke_episode", exc)
    if isinstance(exc, SandboxError):
        return _policy("sandbox_error", f"the sandbox's agent refused a request on the policy's data: {_text(exc)}")
    if stage is Stage.finalize:
        if deadline_expired:
            return _policy("finalize_timeout", f"grading did not finish within finalize_timeout_s: {_text(exc)}")
        return _policy("finalize_failed", f"grading failed on what the policy left behind: {_text(exc)}")
    return _policy("turn_failed", f"handling the policy's output failed: {_text(exc)}")


def _before_policy(exc: BaseException, stage: Stage, deadline_expired: bool) -> Verdict:
    if stage is Stage.start:
        return _infra("prompt_failed", exc)
    if stage is Stage.lease:
        if deadline_expired:
            return _infra("lease_timeout", f"no sandbox within lease_timeout_s ({_text(exc)})")
        return _infra("sandbox_start" if isinstance(exc, SandboxStartError) else "lease_failed", exc)
    if deadline_expired:
        return _infra("setup_timeout", f"env setup did not finish within setup_timeout_s ({_text(exc)})")
    return _infra("setup_failed", exc)


def _grade_lease(exc: BaseException, deadline_expired: bool) -> Verdict:
    """Leasing the fresh grading sandbox: the policy has no part in it (nothing of it runs there yet)."""
    if deadline_expired:
        return _infra("grade_lease_timeout", f"no grading sandbox within lease_timeout_s ({_text(exc)})")
    return _infra("grade_sandbox_start" if isinstance(exc, SandboxStartError) else "grade_lease_failed", exc)


def _sandbox_death(exc: SandboxDiedError, facts: DeathFacts) -> Verdict:
    """The rows of the table for a SandboxDiedError after the policy's first action, in order: proofs first."""
    cause = facts.cause
    if cause in TTL_CAUSES or (cause == TTL_ALARM and facts.uid_separated):
        return _ttl_kill(exc, facts)
    if cause is not None and cause.split(":")[0] in EXTERNAL_CAUSES:
        return _infra(_with_cause("sandbox_lost", cause), exc)
    if facts.answers:
        return _policy("sandbox_answers", f"a request missed its deadline while the sandbox still answers (busy with "
                                          f"the policy's work): {_text(exc)}")
    if facts.uid_separated and facts.control_plane_separated and cause is not None and (
            cause.startswith("signal:") or cause == SIGKILL_UNPROVEN):
        # a signal the policy cannot send (its commands run under another uid) nor provoke (the agent's memory and
        # pids are its own, and its memory does not grow with the data it carries for the policy): the host, an
        # admin, or the OOM killer of the agent's own cgroup (its own limit, not the policy's doing) -- which of
        # them does not matter here, so no OOM flag is needed; a proven "oom" is told apart before this
        return _infra(_with_cause("sandbox_died", cause), exc)
    if facts.in_flight:
        return _policy(_with_cause("sandbox_died_in_command", cause),
                       f"the sandbox died while running the policy's command: {_text(exc)}")
    if not facts.uid_separated:
        return _policy("sandbox_died_single_uid",
                       f"the sandbox died and its commands share the agent's uid: {_text(exc)}")
    if not facts.control_plane_separated:
        return _policy(_with_cause("sandbox_died_shared_resources", cause),
                       f"the sandbox died and its agent shares memory / pids with the policy's commands: {_text(exc)}")
    return _policy(_with_cause("sandbox_died_unproven", cause),
                   f"the sandbox died with no proof of an outside cause: {_text(exc)}")


def _ttl_kill(exc: SandboxDiedError, facts: DeathFacts) -> Verdict:
    """The sandbox's TTL ended it. The system's when the budgets allowed the episode to still be running (the TTL
    covers them, so it counted time that was not the episode's); otherwise nothing proves the policy did not stretch
    its episode into a TTL shorter than its budgets (a config the start-up check refuses)."""
    if facts.within_budgets:
        return _infra(_with_cause("sandbox_lost", facts.cause), exc)
    return _policy("sandbox_ttl_below_budgets",
                   f"the sandbox's TTL (sandbox.spec.ttl_s) ended the episode before its budgets did; raise ttl_s "
                   f"to cover lease + setup + trajectory + finalize + teardown: {_text(exc)}")
