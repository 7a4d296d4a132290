"""One root error, one type per failure point, and the infra-vs-policy split. Imports nothing of ours.

    AgentRLError
    ├── ConfigError                  bad user input: names the field/file and the fix
    ├── MissingDependencyError       a package/binary/model is not installed: names the install command
    ├── StoreError                   unreadable/corrupt trajectory file, schema from the future
    ├── InfraError                   infrastructure failed: the trajectory is marked infra_error and retried,
    │   │                            never scored as reward 0
    │   ├── SandboxError             (a plain one, raised when the agent answers an error, is recorded as the
    │   │   │                        policy's `sandbox_error` once the policy has acted: the request was about
    │   │   │                        its data; before that, infra)
    │   │   ├── SandboxStartError    could not create / start / reach the agent of a sandbox
    │   │   └── SandboxDiedError     a running sandbox vanished or its agent stopped answering
    │   └── EngineError
    │       └── EngineUnavailableError
    ├── PolicyError                  the model's own failure that ends an episode (recorded, scored; its `kind` is
    │                                the recorded cause), e.g. SandboxSurvivorsError (processes_survived_kill) and
    │                                repo_fix's GraderNotStarted (finalize_failed)
    └── UnscoredLimitError           too many trajectories of a run/step could not be scored: the run stops

Task-level failures (a failing test, a tool timeout, a malformed tool call) are not exceptions at all: they are
data in the trajectory.
"""

from __future__ import annotations


class AgentRLError(Exception):
    """Root of every error agentrl raises on purpose."""


class ConfigError(AgentRLError):
    """Invalid configuration or input. The message names the field or file and how to fix it."""


class MissingDependencyError(AgentRLError):
    """Something needed is not installed. The message says which command installs it."""


class StoreError(AgentRLError):
    """A trajectory file cannot be read or written as asked."""


class InfraError(AgentRLError):
    """Infrastructure failed; never the policy's fault, never scored."""


class SandboxError(InfraError):
    pass


class SandboxStartError(SandboxError):
    pass


class SandboxEngineUnreachable(SandboxStartError):
    """The backend's container engine does not answer at all (dockerd stopped or restarting: its socket refuses or
    is gone). Not a failed start: the pool waits for the engine to come back (`SandboxPool.engine_wait_s`)."""


class SandboxDiedError(SandboxError):
    """The agent stopped answering. `in_flight` is a fact for failure attribution: True when the connection broke
    (or the deadline passed) after a request had been sent, i.e. the agent died or hung DURING that request (e.g.
    a command); False when it was unreachable before anything was sent (dead at connect time). `request` is the
    request it died on ("POST /exec"): only a command runs the policy's code."""

    def __init__(self, message: str, *, in_flight: bool = False, request: str = "") -> None:
        super().__init__(message)
        self.in_flight = in_flight
        self.request = request


class EngineError(InfraError):
    pass


class EngineUnavailableError(EngineError):
    pass


class PolicyError(AgentRLError):
    """The model broke the episode in a way the env cannot continue from."""


class UnscoredLimitError(AgentRLError):
    """More than the allowed fraction of trajectories ended as infra_error: training on the survivors would be
    silently biased, so the run stops. The message names the most common cause."""


def is_infra(exc: BaseException) -> bool:
    """True when `exc` is an infrastructure failure (retry; do not score)."""
    return isinstance(exc, InfraError)
