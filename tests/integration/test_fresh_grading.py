"""The runner's fresh-grading hook (`Env.grading_sandbox = "fresh"`), end to end: the real scheduler, real bubblewrap
sandboxes from one pool, a toy env whose policy writes its answer and then tries to leave things behind for the
grader (a background process, files in /tmp, the workspace and a `.pth` in its home), a scripted model.

Checked: grading runs in a second sandbox, never the policy's, which is returned to the pool before the grading lease
(a pool of ONE sandbox must not deadlock); the grading sandbox is returned too; nothing the policy left exists where
grading runs; a failed or late grading lease is infra_error and retried (never scored 0); a policy whose work cannot
be collected is scored 0 (policy_error) and no grading sandbox is leased for it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from contextlib import asynccontextmanager
from typing import Any

import pytest

from agentrl.envs import Env, Submission, Task
from agentrl.errors import SandboxStartError
from agentrl.runner import Budgets, Rollout, Scheduler, SchedulerConfig
from agentrl.sandbox import SandboxPool, SandboxSpec
from agentrl.testing.scripted import ScriptedEngine
from agentrl.tools.render import ChatRenderer
from agentrl.types import SamplingParams, Status, ToolCall, ToolResult, ToolSpec
from agentrl.types import TestOutcome as Outcome
from agentrl.types import TestReport as Report

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")

# what a policy leaves behind for a grader that would run where it ran
LEAVE_BEHIND = ("echo 42 > answer.txt; setsid sleep 1000 </dev/null >/dev/null 2>&1 & "
                "echo forged > /tmp/verdict; echo forged > /workspace/verdict; "
                "mkdir -p .local/lib/python3/site-packages && echo 'import os' > .local/lib/python3/site-packages/x.pth")
# the grader's probe: every leftover it can see (files, processes of anyone but itself)
PROBE = ("for f in /tmp/verdict /workspace/verdict /workspace/.local; do [ -e $f ] && echo FILE:$f; done; "
         "s=sle; s=${s}ep; for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null); "
         "case \"$c\" in \"$s 1000\"*) echo PROC:$c;; esac; done; true")  # ($s: the probe must not match itself)


class FreshToyEnv(Env):
    """Answer 42 in answer.txt. collect() reads it as data; grade() checks it in a fresh sandbox and probes for
    anything the policy left (records which sandboxes did what)."""

    name = "fresh_toy"
    action_format = "hermes"
    grading_sandbox = "fresh"
    tools = [ToolSpec(name="sh", description="run a shell command",
                      parameters={"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]})]

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.policy_sandboxes: list[str] = []
        self.collected_in: list[str] = []
        self.graded_in: list[str] = []
        self.probes: list[str] = []
        self.alive_policy_at_grading: list[bool] = []
        self.backend: Any = None

    def tasks(self) -> list[Task]:
        return [Task(id="t0", prompt="write 42 to answer.txt")]

    async def call_tool(self, sandbox: Any, call: ToolCall, *, task: Task) -> ToolResult:
        self.policy_sandboxes.append(sandbox.id)
        res = await sandbox.exec(["sh", "-c", str(call.arguments.get("cmd", ""))], timeout=20)
        return ToolResult(call_id=call.id, name=call.name, output=res.stdout + res.stderr, exit_code=res.exit_code)

    async def collect(self, sandbox: Any, task: Task) -> Submission:
        self.collected_in.append(sandbox.id)
        data = await sandbox.read_bytes("answer.txt")  # FileNotFoundError when the policy wrote none: its fault
        return Submission(payload=data, solution=data.decode())

    async def grade(self, sandbox: Any, task: Task, submission: Submission) -> Report:
        self.graded_in.append(sandbox.id)
        if self.backend is not None:  # the policy's sandbox is gone before grading starts
            live = [sid for sid in self.backend._live if sid in self.policy_sandboxes]
            self.alive_policy_at_grading.append(bool(live))
        await sandbox.write_file("answer.txt", submission.payload)
        check = await sandbox.exec(["sh", "-c", "test \"$(cat answer.txt)\" = 42"], timeout=10)
        probe = await sandbox.exec(["sh", "-c", PROBE], timeout=10)
        self.probes.append(probe.stdout)
        ok = check.exit_code == 0
        return Report(passed=int(ok), total=1, outcomes=[Outcome(name="answer", passed=ok)])


def _call(cmd: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'sh', 'arguments': {'cmd': cmd}})}\n</tool_call>"


def _scheduler(env: Env, tok: Any, pool: Any, replies: list[str], **cfg: Any) -> tuple[Scheduler, ScriptedEngine]:
    engine = ScriptedEngine(tok, replies)
    rollout = Rollout(env=env, engine=engine, renderer=ChatRenderer(tok),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=256, stop_token_ids=[tok.eos_token_id]),
                      budgets=Budgets(max_turns=3, max_completion_tokens=2048, context_window=8192,
                                      tool_timeout_s=30))
    return Scheduler(rollout, pool, SchedulerConfig(group_size=1, **cfg)), engine


def _pool(n: int = 1) -> SandboxPool:
    return SandboxPool(backend="local", spec=SandboxSpec(default_timeout_s=20), warm=0, max_sandboxes=n,
                       run_id=uuid.uuid4().hex[:8])


class FlakyPool:
    """A real pool whose leases number `fail` raise (or, with hang=True, never come)."""

    def __init__(self, pool: SandboxPool, fail: set[int], *, hang: bool = False) -> None:
        self.pool, self.fail, self.hang, self.leases = pool, fail, hang, 0

    def lease(self) -> Any:
        self.leases += 1
        return self._broken() if self.leases in self.fail else self.pool.lease()

    @asynccontextmanager
    async def _broken(self) -> Any:
        if self.hang:
            await asyncio.sleep(3600)
        raise SandboxStartError("injected: the grading sandbox did not start")
        yield  # pragma: no cover

    async def death_cause(self, sb: Any) -> str | None:
        return await self.pool.death_cause(sb)


async def test_grading_runs_in_a_second_sandbox_where_nothing_of_the_policy_exists(smollm2_tokenizer: Any) -> None:
    env = FreshToyEnv()
    replies = [_call(LEAVE_BEHIND), "done"]
    async with _pool(n=1) as pool:  # ONE sandbox: the policy's lease must be returned before grading leases
        env.backend = pool.backend
        sched, _ = _scheduler(env, smollm2_tokenizer, pool, replies, lease_timeout_s=60)
        traj = await sched.run_one(env.tasks()[0], group_id="g", sample_index=0)
        stats = pool.stats()
    assert traj.status is Status.ok and traj.reward == 1.0, (traj.status, traj.error_kind, traj.error)
    assert traj.solution == "42\n", "the stored solution is what collect() read"
    (policy,), (graded,) = set(env.policy_sandboxes), env.graded_in
    assert env.collected_in == [policy], "collect() runs in the policy's sandbox"
    assert graded != policy, "grading never runs in the policy's sandbox"
    assert env.alive_policy_at_grading == [False], "the policy's sandbox was destroyed before grading"
    assert env.probes == [""], f"the policy's leftovers reached the grading sandbox: {env.probes}"
    assert stats["leases"] == 2 and stats["destroyed"] == 2 and stats["active"] == 0, stats


async def test_the_same_leftovers_are_visible_without_a_fresh_sandbox(smollm2_tokenizer: Any) -> None:
    """The control: the probe does see what the policy leaves when it runs in the policy's own sandbox (so the
    test above can fail)."""
    async with _pool() as pool, pool.lease() as sb:
        await sb.exec(["sh", "-c", LEAVE_BEHIND], timeout=20)
        probe = await sb.exec(["sh", "-c", PROBE], timeout=10)
    assert "FILE:/tmp/verdict" in probe.stdout and "FILE:/workspace/.local" in probe.stdout, probe.stdout
    assert "PROC:sleep 1000" in probe.stdout, probe.stdout


@pytest.mark.parametrize("hang", [False, True], ids=["lease_fails", "lease_late"])
async def test_a_failed_grading_lease_is_infra_and_retried(smollm2_tokenizer: Any, hang: bool) -> None:
    env = FreshToyEnv()
    async with _pool(n=1) as real:
        pool = FlakyPool(real, {2}, hang=hang)  # lease 1: the policy's; lease 2: the grading one, broken
        sched, engine = _scheduler(env, smollm2_tokenizer, pool, [_call("echo 42 > answer.txt"), "done"],
                                   infra_retries=1, lease_timeout_s=2 if hang else 60)
        retried = await sched.run_one(env.tasks()[0], group_id="g", sample_index=0)
    assert retried.status is Status.ok and retried.attempt == 1 and retried.reward == 1.0, retried
    assert pool.leases == 4 and len(env.graded_in) == 1 and len(env.collected_in) == 2
    assert len({s for s, _ in engine.calls}) == 2, "the policy ran again in the retry"
    # without a retry left, the failure is recorded as infra: unscored, never 0
    env2 = FreshToyEnv()
    async with _pool(n=1) as real:
        pool = FlakyPool(real, {2}, hang=hang)
        sched, _ = _scheduler(env2, smollm2_tokenizer, pool, [_call("echo 42 > answer.txt"), "done"],
                              infra_retries=0, lease_timeout_s=2 if hang else 60)
        traj = await sched.run_one(env2.tasks()[0], group_id="g", sample_index=0)
    assert traj.status is Status.infra_error and traj.reward is None and traj.tests is None, traj
    assert traj.error_kind == ("grade_lease_timeout" if hang else "grade_sandbox_start"), traj.error_kind


async def test_work_that_cannot_be_collected_is_the_policys_and_takes_no_grading_sandbox(
        smollm2_tokenizer: Any) -> None:
    env = FreshToyEnv()
    async with _pool(n=1) as pool:
        sched, _ = _scheduler(env, smollm2_tokenizer, pool, [_call("mkdir answer.txt"), "done"], infra_retries=2)
        traj = await sched.run_one(env.tasks()[0], group_id="g", sample_index=0)
        leases = pool.stats()["leases"]
    assert traj.status is Status.policy_error and traj.error_kind == "finalize_failed", (traj.status, traj.error)
    assert traj.reward == 0.0 and traj.attempt == 0
    assert env.graded_in == [] and leases == 1
