"""Failure attribution: who is to blame when a trajectory does not end normally — the system or the policy.

A policy under RL pressure will use any failure that is not charged to it to dodge a score it does not like, so
`infra_error` (unscored, retried) is reserved for causes the system can prove are not the policy's. Everything else
that breaks an episode after the policy has acted is `policy_error`: scored (the env's `failed_report`, 0), with
the reason stored on the trajectory.

    stage      exception                                   verdict
    ---------  ------------------------------------------  ------------------------------------------------------
    any        EngineError                                 infra   engine
    lease      SandboxStartError / any / deadline          infra   sandbox_start / lease_timeout
    grade_     SandboxStartError / any / deadline          infra   grade_sandbox_start / grade_lease_failed /
      lease                                                        grade_lease_timeout (fresh grading: the second
                                                                   sandbox; the policy never ran in it)
    setup      any / deadline                              infra   setup_failed / setup_timeout   (before the policy)
    turns,     SandboxDiedError, backend proves an         infra   sandbox_lost:<cause>  (deleted / evicted from
    finalize     outside cause                                     outside, the sandbox process killed on the host)
               SandboxDiedError, agent killed by a signal,  infra   sandbox_died:signal:<n> (commands cannot signal
                 not the OOM killer, uid-separated sandbox         the agent: the host did)
               SandboxDiedError during a command           policy  sandbox_died_in_command[:<cause>] (incl. oom)
               SandboxDiedError between requests, the      infra   sandbox_died[:<cause>]  (commands cannot signal
                 agent is out of the commands' reach               the agent: uid separation)
               SandboxDiedError between requests, single   policy  sandbox_died_single_uid (its leftover processes
                 uid sandbox                                       could have killed the agent)
               other SandboxError                          infra   sandbox_error (the agent answered an error)
    turns,     PolicyError (e.g. SandboxSurvivorsError:    policy  <its kind> (policy_broke_episode when it has none)
      finalize   the policy's processes survived SIGKILL)
    finalize   deadline                                    policy  finalize_timeout (the env's own budget fits in it,
                                                                   checked at start-up)
               any other exception                         policy  finalize_failed (e.g. what the policy left in the
                                                                   workspace cannot be read)
    (fresh grading: `finalize` covers collect() in the policy's sandbox and grade() in the fresh one; a death of
    the fresh sandbox follows the rows above with that sandbox's facts: the policy's kept code runs only in its
    commands, so a death during a command is the policy's, one between commands of a uid-separated sandbox is not)
    turns      any other exception                         infra   internal_error (our bug; the policy's tool-call
                                                                   failures never get here, they are observations)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from agentrl.errors import EngineError, InfraError, PolicyError, SandboxDiedError, SandboxStartError
from agentrl.types import Status

EXTERNAL_CAUSES = ("deleted", "evicted", "killed", "node_lost", "preempted")  # provably from outside the sandbox


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
    """What the sandbox layer can prove about a sandbox that stopped answering."""

    in_flight: bool  # the connection broke while a command (POST /exec: the policy's code) was running
    uid_separated: bool  # commands run under another uid than the agent: they cannot signal it
    cause: str | None  # the backend's proven cause ("deleted", "evicted", "oom", "signal:9", ...) or None


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
        return _sandbox_death(exc, death or DeathFacts(in_flight=False, uid_separated=False, cause=None))
    if isinstance(exc, InfraError):
        return _infra("sandbox_error", exc)
    if isinstance(exc, PolicyError):
        return _policy(getattr(exc, "kind", None) or "policy_broke_episode", exc)
    if stage is Stage.finalize:
        if deadline_expired:
            return _policy("finalize_timeout", f"grading did not finish within finalize_timeout_s: {_text(exc)}")
        return _policy("finalize_failed", f"grading failed on what the policy left behind: {_text(exc)}")
    return _infra("internal_error", exc)


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
    if facts.cause is not None and facts.cause.split(":")[0] in EXTERNAL_CAUSES:
        return _infra(_with_cause("sandbox_lost", facts.cause), exc)
    if facts.uid_separated and facts.cause is not None and facts.cause.startswith("signal:"):
        # the agent died of a signal the policy cannot send (its commands run under another uid) and the kernel's
        # OOM killer is excluded (that cause is "oom"): the host or an admin killed it
        return _infra(_with_cause("sandbox_died", facts.cause), exc)
    if facts.in_flight:
        return _policy(_with_cause("sandbox_died_in_command", facts.cause),
                       f"the sandbox died while running the policy's command: {_text(exc)}")
    if facts.uid_separated:
        return _infra(_with_cause("sandbox_died", facts.cause), exc)
    return _policy("sandbox_died_single_uid",
                   f"the sandbox died between commands and its commands share the agent's uid: {_text(exc)}")
