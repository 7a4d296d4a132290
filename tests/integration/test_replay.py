"""Replay / re-execute / re-score against real sandboxes (local backend: bubblewrap) and the real code_tests env.

A code_tests trajectory is produced by the real runner (scripted model replies, real sandbox, real chat template)
and stored; re-executing it must find every tool call identical. A test env whose tool prints the current time
must make `--reexecute` report exactly that call and exit non-zero. `rescore --rerun-tests` re-runs the env's
hidden tests on the stored solution and reports a tampered stored reward.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from agentrl import replay
from agentrl.cli.debug import add_replay_commands
from agentrl.envs import Env, Task, get_env, register_env
from agentrl.runner import Budgets, Rollout, Scheduler, SchedulerConfig
from agentrl.sandbox import SandboxPool, SandboxSpec
from agentrl.sandbox.client import Sandbox
from agentrl.store import TrajectoryStore, read_trajectories
from agentrl.testing.scripted import ScriptedEngine
from agentrl.tools.render import ChatRenderer
from agentrl.types import SamplingParams, Status, ToolCall, ToolResult, ToolSpec, Trajectory, Turn
from agentrl.types import TestReport as Report  # aliased: pytest would try to collect Test*

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


@register_env("test_time")
class TimeEnv(Env):
    """Two tools: `echo` (deterministic) and `now` (prints the current time in ns: never the same twice)."""

    tools = [ToolSpec(name="echo", description="print text", parameters={
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
        ToolSpec(name="now", description="print the current time")]

    def tasks(self) -> list[Task]:
        return [Task(id="clock", prompt="What time is it?")]

    async def call_tool(self, sandbox: Sandbox, call: ToolCall, *, task: Task) -> ToolResult:
        code = ("import time; print(time.time_ns())" if call.name == "now"
                else f"print({call.arguments.get('text', '')!r})")
        res = await sandbox.exec(["python3", "-c", code], timeout=10)
        return ToolResult(call_id=call.id, name=call.name, output=res.stdout, exit_code=res.exit_code,
                          stdout=res.stdout, stderr=res.stderr, duration_s=res.duration_s)

    async def finalize(self, sandbox: Sandbox, task: Task) -> Report:
        return Report(passed=1, total=1)


def _pool(spec: SandboxSpec) -> SandboxPool:
    return SandboxPool(backend="local", spec=spec, warm=0, max_sandboxes=1, run_id=uuid.uuid4().hex[:8])


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agentrl")
    add_replay_commands(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def _code(src: str) -> str:
    return f"Let me run this.\n```python\n{src}\n```"


@pytest.fixture(scope="module")
def code_env() -> Any:
    return get_env("code_tests", source="easy")


@pytest.fixture
async def code_traj(code_env: Any, smollm2_tokenizer: Any, tmp_path: Path) -> tuple[Path, Trajectory]:
    """A real two-tool-call code_tests trajectory (a wrong attempt that prints, then the reference), stored."""
    task = next(iter(code_env.tasks()))
    entry = task.data["entry_point"]
    replies = [_code(f"def {entry}(*args):\n    return None\nprint('first try', 6 * 7)"),
               _code(code_env.reference_solution(task)), "Done."]
    rollout = Rollout(env=code_env, engine=ScriptedEngine(smollm2_tokenizer, replies),
                      renderer=ChatRenderer(smollm2_tokenizer),
                      sampling=SamplingParams(max_new_tokens=256, stop_token_ids=[smollm2_tokenizer.eos_token_id]),
                      budgets=Budgets(max_turns=3, max_completion_tokens=2048, context_window=4096))
    async with _pool(SandboxSpec(default_timeout_s=10)) as pool:
        sched = Scheduler(rollout, pool, SchedulerConfig(group_size=1), meta={"env_options": {"source": "easy"}})
        traj = await sched.run_one(task, group_id="g0", sample_index=0)
    assert traj.status is Status.ok and traj.num_tool_calls == 2 and traj.reward == 1.0, traj.error
    path = tmp_path / "code.jsonl"
    with TrajectoryStore(path) as store:
        store.append_group([traj])
    return path, traj


async def test_reexecute_code_tests_trajectory_is_identical(code_traj: tuple[Path, Trajectory]) -> None:
    path, traj = code_traj
    [stored] = read_trajectories(path)
    reports = await replay.reexecute_many([stored], _pool)
    [report] = reports
    assert report.error is None
    assert [c.call.id for c in report.checks] == [c.id for t in traj.turns for c in t.tool_calls]
    assert all(c.matches for c in report.checks), [(c.call.id, c.differs) for c in report.checks]
    assert "first try 42" in report.checks[0].replayed.output  # the calls really ran again
    assert report.all_match


def test_reexecute_cli_exit_code_zero_when_identical(code_traj: tuple[Path, Trajectory],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path, traj = code_traj
    assert _cli(["replay", str(path), "--id", traj.id[:6], "--reexecute"]) == 0
    out = capsys.readouterr().out
    assert "2 tool calls, all calls identical" in out


def _time_trajectory(results: list[ToolResult], calls: list[ToolCall]) -> Trajectory:
    turns = [Turn(index=i, start=i * 3, model_len=2, env_len=1, text=f"<call {c.name}>", tool_calls=[c],
                  tool_results=[r], observation=r.output) for i, (c, r) in enumerate(zip(calls, results))]
    n = 3 * len(turns)
    return Trajectory(id="time-0", group_id="g", task_id="clock", env="test_time", status=Status.ok, prompt_ids=[1],
                      completion_ids=list(range(n)), logprobs=[0.0] * n, env_mask=[1, 1, 0] * len(turns),
                      turns=turns, tests=Report(passed=1, total=1), reward=1.0)


async def _record(env: Env, calls: list[ToolCall]) -> list[ToolResult]:
    task = env.tasks()[0]
    async with _pool(env.sandbox_spec) as pool, pool.lease() as sb:
        await env.setup(sb, task)
        return [await env.call_tool(sb, c, task=task) for c in calls]


# The CLI tests are sync: the commands run their own event loop and install signal handlers (main thread only).
def test_reexecute_reports_nondeterministic_calls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = get_env("test_time")
    calls = [ToolCall(id="call_0_0", name="echo", arguments={"text": "hello"}),
             ToolCall(id="call_1_0", name="now", arguments={}),
             ToolCall(id="call_2_0", name="echo", arguments={"text": "bye"})]
    path = tmp_path / "time.jsonl"
    with TrajectoryStore(path) as store:  # recorded for real: the stored outputs come from a sandbox
        store.append_group([_time_trajectory(asyncio.run(_record(env, calls)), calls)])

    [report] = asyncio.run(replay.reexecute_many(read_trajectories(path), _pool))
    assert [c.matches for c in report.checks] == [True, False, True]
    assert report.checks[1].differs == ("output", "stdout")
    assert report.checks[0].replayed.output == "hello\n"
    assert not report.all_match

    assert _cli(["replay", str(path), "--reexecute"]) == 1
    out = capsys.readouterr().out
    assert "DIFFERS  turn 1 call_1_0 now: output, stdout" in out
    assert "1 of 3 calls differ" in out


def test_rescore_rerun_tests_finds_a_tampered_reward(code_traj: tuple[Path, Trajectory], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path, traj = code_traj
    assert traj.tests is not None
    wrong = traj.model_copy(update={"tests": traj.tests.model_copy(update={"passed": 0}), "reward": 0.0,
                                    "reward_components": {"unit_tests": 0.0}})
    tampered = tmp_path / "tampered.jsonl"
    with TrajectoryStore(tampered) as store:
        store.append_group([wrong])

    [row] = asyncio.run(replay.rescore_rerun(read_trajectories(tampered), _pool))
    assert row.note == "tests re-run" and row.differs
    assert row.rescored.reward == 1.0 and row.rescored.tests == traj.tests

    [pure] = replay.rescore_pure(read_trajectories(tampered))
    assert not pure.differs  # the stored (tampered) report agrees with the stored reward: only re-running shows it

    out_file = tmp_path / "rescored.jsonl"
    rc = _cli(["rescore", str(tampered), "--env", "code_tests", "--rerun-tests", "--out", str(out_file)])
    assert rc == 1
    assert "1 rewards differ" in capsys.readouterr().out
    assert [t.reward for t in read_trajectories(out_file)] == [1.0]


def test_what_cannot_be_replayed_is_reported_per_trajectory(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    call = ToolCall(id="call_0_0", name="echo", arguments={"text": "hi"})
    result = ToolResult(call_id=call.id, name="echo", output="hi\n", exit_code=0, stdout="hi\n")
    base = _time_trajectory([result], [call])
    trajs = [base.model_copy(update={"id": "no-env", "env": "no_such_env", "solution": "x"}),
             base.model_copy(update={"id": "no-task", "task_id": "gone", "solution": "x"}),
             base.model_copy(update={"id": "fine"})]
    path = tmp_path / "mixed.jsonl"
    replay.write_trajectories(path, trajs)

    reports = asyncio.run(replay.reexecute_many(read_trajectories(path), _pool))
    assert "'no_such_env' is not registered" in (reports[0].error or "")
    assert "'gone' is not among env 'test_time'" in (reports[1].error or "")
    assert reports[2].all_match and len(reports[2].checks) == 1
    assert _cli(["replay", str(path), "--reexecute"]) == 1
    out = capsys.readouterr().out
    assert "1 tool calls: all identical; 2 trajectories could not be replayed to the end" in out

    assert _cli(["rescore", str(path), "--rerun-tests"]) == 1
    assert "0 rewards differ, 2 could not be re-run" in capsys.readouterr().out
