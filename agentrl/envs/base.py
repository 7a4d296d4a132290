"""The Env base class: what an environment must provide. The runner owns the loop; envs never loop.

An env is a small class registered by name (`@register_env`, or the `agentrl.envs` entry-point group):

    tasks()                         -> frozen Task records
    system_prompt, tools            -> what the model is told (tools as JSON-schema ToolSpecs)
    action_format                   -> "hermes" (<tool_call>{json}</tool_call>) or "codeblock" (```python fences)
    async setup(sandbox, task)      -> prepare the sandbox for one trajectory
    async call_tool(sandbox, call, task=...) -> ToolResult (task-level failures are data, not exceptions)
    async finalize(sandbox, task)   -> TestReport: hidden tests, run in the same sandbox
    grading_sandbox = "fresh"       -> opt-in: grade in a second, fresh sandbox instead (then the runner calls
                                       collect() in the policy's sandbox and grade() in the fresh one, not finalize)
    async collect(sandbox, task)    -> Submission: what grading needs, read from the policy's sandbox as host data
    async grade(sandbox, task, submission) -> TestReport: the hidden tests in a fresh sandbox the policy never used
    failed_report(task, reason)     -> TestReport of an episode the policy broke (all tests failed)
    time_needs()                    -> seconds a call_tool / finalize may take (checked against the budgets)
    sandbox_image(task)             -> the image a task's sandbox needs (docker/kubernetes), None: the run's spec
    async solution(sandbox, task)   -> the final answer stored with the trajectory (optional)
    reference_solution(task)        -> used by `agentrl envs check`
    async score_solution(sandbox, task, solution) -> TestReport for a given solution (`envs check --solutions`)
    prepare(say)                    -> optional: fetch / build what the tasks need on this machine (blocking; `envs
                                       check` calls it first, off the loop; e.g. repo_fix's sdists and test venvs)

Fresh-sandbox grading (`grading_sandbox = "fresh"`): after the turns the runner kills every process of the policy's
sandbox, calls `collect` there, and returns that sandbox to the pool; then it leases a second sandbox from the same
pool (its own `lease_timeout_s`; a failed or late lease is infra_error, retried) and calls `grade` in it under what is
left of `finalize_timeout_s`, then returns it. Nothing the policy left (files outside what `collect` reads, processes,
a `.pth` in its home) exists where grading runs. `collect` must read the sandbox as data only (never run what the
policy wrote); an exception out of it is the policy's (`finalize_failed`, scored 0), like one out of `finalize`.

`call_tool` takes the task as a keyword: envs are shared across trajectories and hold no per-trajectory state,
so the task must be passed in. The contracts and how to add an env: docs/architecture.md and docs/envs.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Literal

from agentrl.sandbox.base import SandboxSpec
from agentrl.sandbox.client import Sandbox
from agentrl.types import Message, TestOutcome, TestReport, ToolCall, ToolResult, ToolSpec


@dataclass(frozen=True)
class Task:
    """One task. `data` is read-only env-specific payload (tests, entry point, reference solution...)."""

    id: str
    prompt: str
    data: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", MappingProxyType(dict(self.data)))


def spec_for_env(spec: SandboxSpec, env: Env) -> SandboxSpec:
    """`spec` (a run's sandbox resources, from its config) plus what `env` cannot run without whatever the config
    says: the writable directories of its `sandbox_spec` (e.g. repo_fix's /repo)."""
    need = tuple(d for d in env.sandbox_spec.writable_dirs if d not in spec.writable_dirs)
    if not need:
        return spec
    return SandboxSpec.model_validate({**spec.model_dump(), "writable_dirs": spec.writable_dirs + need})


@dataclass(frozen=True)
class Submission:
    """What a fresh-grading env's `collect` read from the policy's sandbox: host-side data only (never a handle into
    that sandbox, which is destroyed before `grade` runs). `solution` is stored with the trajectory (what `solution()`
    gives for a same-sandbox env), so the policy's work is read once."""

    payload: Any = None
    solution: str | None = None


class Env:
    name: ClassVar[str] = ""
    action_format: ClassVar[Literal["hermes", "codeblock"]] = "hermes"
    system_prompt: ClassVar[str] = ""
    tools: ClassVar[list[ToolSpec]] = []
    sandbox_spec: ClassVar[SandboxSpec] = SandboxSpec()
    grading_sandbox: ClassVar[Literal["same", "fresh"]] = "same"  # "fresh": collect() + grade(), see above

    def __init__(self, **options: Any) -> None:
        self.options = options

    def tasks(self) -> Iterable[Task]:
        raise NotImplementedError

    def messages(self, task: Task) -> list[Message]:
        """The opening chat of a trajectory. Override for few-shot prompts."""
        msgs = [Message(role="system", content=self.system_prompt)] if self.system_prompt else []
        return msgs + [Message(role="user", content=task.prompt)]

    async def setup(self, sandbox: Sandbox, task: Task) -> None:
        return None

    async def call_tool(self, sandbox: Sandbox, call: ToolCall, *, task: Task) -> ToolResult:
        raise NotImplementedError

    async def finalize(self, sandbox: Sandbox, task: Task) -> TestReport:
        raise NotImplementedError

    async def solution(self, sandbox: Sandbox, task: Task) -> str | None:
        return None

    async def collect(self, sandbox: Sandbox, task: Task) -> Submission:
        """Fresh grading, step 1, in the policy's sandbox after its processes were killed: read what grading needs
        as data. Required when `grading_sandbox = "fresh"`."""
        raise NotImplementedError(f"env {self.name!r} sets grading_sandbox={self.grading_sandbox!r} "
                                  "but has no collect()")

    async def grade(self, sandbox: Sandbox, task: Task, submission: Submission) -> TestReport:
        """Fresh grading, step 2, in a fresh sandbox of the same pool (the policy never ran in it): the hidden tests
        over `submission`. Required when `grading_sandbox = "fresh"`."""
        raise NotImplementedError(f"env {self.name!r} sets grading_sandbox={self.grading_sandbox!r} but has no grade()")

    def reference_solution(self, task: Task) -> str | None:
        return None

    async def score_solution(self, sandbox: Sandbox, task: Task, solution: str) -> TestReport:
        raise NotImplementedError(f"env {self.name!r} cannot score given solutions")

    def failed_report(self, task: Task, reason: str) -> TestReport:
        """The report of an episode the policy broke (its sandbox died, the grader could not run on what it left):
        every test failed with `reason`. Override to list the task's tests by name."""
        return TestReport(passed=0, total=1, outcomes=[TestOutcome(name="episode", passed=False, message=reason)],
                          error=reason)

    def time_needs(self) -> dict[str, float]:
        """Seconds this env may legitimately need, checked at start-up against the run's budgets so that a
        deadline never cuts an honest call short: {"tool_call": one call_tool, "finalize": finalize + solution}."""
        return {}

    def sandbox_image(self, task: Task) -> str | None:
        """The sandbox image `task` needs instead of the run's (e.g. one image per repository), or None. Container
        backends start that image (the pool keeps warm sandboxes per image); the local backend has no images and
        ignores it."""
        return None

    def tool(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)


def lease_sandbox(pool: Any, env: Env, task: Task) -> Any:
    """`pool.lease()` for one of `env`'s tasks: with the task's own image when the env names one."""
    image = env.sandbox_image(task)
    return pool.lease(image=image) if image else pool.lease()
