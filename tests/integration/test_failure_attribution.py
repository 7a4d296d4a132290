"""Failure attribution and totality of the scheduler, end to end: the real runner, real bubblewrap sandboxes, the real
code_tests env, a scripted model that emits the attack. A policy must not be able to make its episode unscored
(infra_error) by breaking its sandbox or its grader; a fault of the system must stay infra_error and be retried; no
failure anywhere may hang `run()`."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from agentrl.envs import get_env
from agentrl.errors import ConfigError, EngineUnavailableError, SandboxDiedError, UnscoredLimitError
from agentrl.reward import Scorer, parse_reward_list
from agentrl.reward.server import RewardServer
from agentrl.runner import Budgets, Rollout, Scheduler, SchedulerConfig
from agentrl.sandbox import SandboxPool, SandboxSpec
from agentrl.sandbox.client import Sandbox
from agentrl.testing.scripted import ScriptedEngine
from agentrl.tools.render import ChatRenderer
from agentrl.types import SamplingParams, Status, ToolResult


def _pool(**kw: Any) -> SandboxPool:
    return SandboxPool(backend="local", spec=SandboxSpec(default_timeout_s=10), warm=kw.pop("warm", 0),
                       max_sandboxes=kw.pop("max_sandboxes", 4), run_id=uuid.uuid4().hex[:8], **kw)


def _scheduler(env: Any, engine: Any, tok: Any, pool: Any, *, max_turns: int = 2, tool_timeout_s: float = 60.0,
               **cfg: Any) -> Scheduler:
    rollout = Rollout(env=env, engine=engine, renderer=ChatRenderer(tok),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=512, stop_token_ids=[tok.eos_token_id]),
                      budgets=Budgets(max_turns=max_turns, max_completion_tokens=4096, context_window=8192,
                                      tool_timeout_s=tool_timeout_s))
    return Scheduler(rollout, pool, SchedulerConfig(group_size=cfg.pop("group_size", 1), **cfg))


def _code(src: str) -> str:
    return f"Here is my solution.\n```python\n{src}\n```"


@pytest.fixture(scope="module")
def env() -> Any:
    return get_env("code_tests", source="easy")


@pytest.fixture(scope="module")
def task(env: Any) -> Any:
    return next(iter(env.tasks()))


def _wrong_answer(task: Any) -> str:
    """A definition of the entry point that fails every hidden test (returns an object no test expects)."""
    return f"def {task.data['entry_point']}(*args, **kwargs):\n    return object()"


ATTACKS = {
    "kill_every_process": "import os\nos.kill(-1, 9)",
    "kill_the_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
    "kill_every_pid": "import os\nfor p in range(1, 400):\n    try:\n        os.kill(p, 9)\n    except OSError:\n"
                      "        pass",
    "invalid_utf8_solution": "open('solution.py', 'wb').write(b'\\xff\\xfe\\x00 def broken')",
    "solution_is_a_directory": "import os\nos.remove('solution.py')\nos.mkdir('solution.py')",
    "solution_is_a_symlink": "import os\nos.remove('solution.py')\nos.symlink('/etc/passwd', 'solution.py')",
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
async def test_a_policy_cannot_make_its_episode_unscored(env: Any, task: Any, smollm2_tokenizer: Any,
                                                          attack: str) -> None:
    """The policy first writes a wrong answer, then attacks its sandbox / grader: whatever happens, the episode is
    scored (0: the wrong answer and the attack earn nothing) and never retried."""
    replies = [_code(_wrong_answer(task)), _code(ATTACKS[attack])]
    engine = ScriptedEngine(smollm2_tokenizer, replies)
    async with _pool() as pool:
        traj = await _scheduler(env, engine, smollm2_tokenizer, pool, infra_retries=2,
                                finalize_timeout_s=60).run_one(task, group_id="g", sample_index=0)
    assert traj.status is not Status.infra_error, f"{attack}: {traj.error_kind} {traj.error}"
    assert traj.attempt == 0, "a policy outcome is never retried"
    assert traj.reward == 0.0 and traj.tests is not None and traj.tests.total >= 1
    if traj.status is Status.policy_error:
        assert traj.error and traj.error_kind, "the reason is recorded on the trajectory"


# the control plane's own resources: a daemon holding every pid of the sandbox's limit (the memory attacks are in
# test_sandbox_attacks.py: there the old layout lost its agent, here the OOM killer happened to pick the filler)
RESOURCE_ATTACKS = {
    "daemon_fills_the_pids_limit": "import subprocess, time\nsubprocess.Popen(['setsid', 'python3', '-c', "
                                   "'import os, time\\nwhile True:\\n try:\\n  os.fork() or time.sleep(1000)\\n "
                                   "except OSError:\\n  time.sleep(0.005)'])\ntime.sleep(1)",
}


@pytest.mark.parametrize("attack", sorted(RESOURCE_ATTACKS))
async def test_a_policy_exhausting_its_sandbox_is_still_graded_on_its_answer(env: Any, task: Any,
                                                                             smollm2_tokenizer: Any,
                                                                             attack: str) -> None:
    """The policy writes the right answer, then exhausts its sandbox's pids from a daemon: the agent is outside that
    limit, so kill_all() ends the daemon without a fork of its own (the old one failed with EAGAIN: finalize_failed)
    and the grader has the sandbox's whole budget: the answer scores 1, the episode is neither infra nor policy
    error."""
    replies = [_code(task.data["reference"]), _code(RESOURCE_ATTACKS[attack])]
    engine = ScriptedEngine(smollm2_tokenizer, replies)
    async with _pool() as pool:
        traj = await _scheduler(env, engine, smollm2_tokenizer, pool, infra_retries=2,
                                finalize_timeout_s=60).run_one(task, group_id="g", sample_index=0)
    assert traj.status not in (Status.infra_error, Status.policy_error), f"{attack}: {traj.error_kind} {traj.error}"
    assert traj.attempt == 0
    assert traj.tests is not None and traj.tests.passed == traj.tests.total >= 1, traj.tests
    assert traj.reward == 1.0


async def test_sandbox_killed_from_the_host_between_commands_is_infra_and_retried(
        env: Any, task: Any, smollm2_tokenizer: Any) -> None:
    """A fault of the system (the sandbox's process tree killed from outside while the model is generating) is
    infra_error and retried: the policy did not do it (its commands cannot reach the agent)."""
    pool = _pool()
    killed: list[str] = []

    def reply(session: str, turn: int, _ids: list[int]) -> str:
        if turn == 1:
            for live in list(pool.backend._live.values()):  # the fault: the whole sandbox dies from outside
                live.proc.kill()
                killed.append(session)
        return _code("print('hello')")

    engine = ScriptedEngine(smollm2_tokenizer, reply)
    async with pool:
        traj = await _scheduler(env, engine, smollm2_tokenizer, pool, infra_retries=1).run_one(
            task, group_id="g", sample_index=0)
    assert killed, "the fault was injected"
    assert traj.status is Status.infra_error and traj.attempt == 1, (traj.status, traj.error_kind, traj.error)
    assert traj.reward is None and traj.tests is None, "an infra failure is never scored as 0"
    # the backend proves the sandbox process was killed from outside (or, if it cannot tell yet, the agent of a
    # uid-separated sandbox died between commands): infra either way, even when a command was running
    assert traj.error_kind and traj.error_kind.startswith(("sandbox_lost:killed", "sandbox_died"))


async def test_tool_call_over_its_budget_is_an_observation(env: Any, task: Any, smollm2_tokenizer: Any,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    slow_env = get_env("code_tests", source="easy")

    async def slow_call(sandbox: Any, call: Any, *, task: Any) -> ToolResult:
        await asyncio.sleep(30)
        raise AssertionError("not reached")

    monkeypatch.setattr(slow_env, "call_tool", slow_call)
    engine = ScriptedEngine(smollm2_tokenizer, [_code("print(1)"), "done"])
    async with _pool() as pool:
        traj = await _scheduler(slow_env, engine, smollm2_tokenizer, pool, tool_timeout_s=0.5).run_one(
            task, group_id="g", sample_index=0)
    result = traj.turns[0].tool_results[0]
    assert result.error == "tool_timeout" and result.timed_out
    assert "0.5s" in traj.turns[0].observation
    assert traj.status is Status.ok and traj.reward is not None


class _BrokenPromptEnv:
    """An env whose prompt rendering raises (an env bug): recorded as infra_error with its cause, never a hang."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, item: str) -> Any:
        return getattr(self._inner, item)

    def messages(self, task: Any) -> Any:
        raise KeyError("prompt field missing")


async def test_env_bug_in_messages_is_recorded_not_hung(env: Any, task: Any, smollm2_tokenizer: Any) -> None:
    engine = ScriptedEngine(smollm2_tokenizer, ["no code"])
    async with _pool() as pool:
        sched = _scheduler(_BrokenPromptEnv(env), engine, smollm2_tokenizer, pool, infra_retries=0, group_size=2,
                           max_unscored_frac=1.0)
        groups = await asyncio.wait_for(_collect(sched.run([task])), 60)
    (group,) = groups
    assert [t.status for t in group] == [Status.infra_error] * 2
    assert {t.error_kind for t in group} == {"prompt_failed"}


class _ExplodingScorer:
    async def score(self, traj: Any) -> Any:
        raise RuntimeError("scoring exploded")


async def test_scoring_bug_is_unscored_not_zero_and_not_hung(env: Any, task: Any, smollm2_tokenizer: Any) -> None:
    engine = ScriptedEngine(smollm2_tokenizer, ["no code"])
    async with _pool() as pool:
        sched = _scheduler(env, engine, smollm2_tokenizer, pool, infra_retries=0, max_unscored_frac=1.0)
        sched.scorer = _ExplodingScorer()
        (group,) = await asyncio.wait_for(_collect(sched.run([task])), 60)
    assert group[0].status is Status.infra_error and group[0].error_kind == "reward_failed"
    assert group[0].reward is None and "scoring exploded" in (group[0].error or "")


async def test_a_failing_reward_service_leaves_the_episode_unscored_and_never_samples_it_again(
        env: Any, task: Any, smollm2_tokenizer: Any) -> None:
    """The reward service answers 503 to every request (its own retries included): the trajectory is unscored
    (reward_failed), and the episode is not sampled again (that would select for what the service accepts)."""
    service = RewardServer(fail_first=1000)
    url = await service.start()
    engine = ScriptedEngine(smollm2_tokenizer, ["no code"])
    try:
        async with _pool() as pool, _http_scorer(url) as scorer:
            sched = _scheduler(env, engine, smollm2_tokenizer, pool, infra_retries=2, max_unscored_frac=1.0)
            sched.scorer = scorer
            traj = await sched.run_one(task, group_id="g", sample_index=0)
    finally:
        await service.stop()
    assert (traj.status, traj.error_kind, traj.reward) == (Status.infra_error, "reward_failed", None)
    assert traj.attempt == 0 and len(engine.calls) == 1, "the scoring was retried, never the episode"
    assert service.received == 3 and "HTTP 503" in (traj.error or "")


async def test_a_reward_service_that_rejects_every_request_stops_the_run(
        env: Any, task: Any, smollm2_tokenizer: Any) -> None:
    service = RewardServer()
    url = await service.start()
    engine = ScriptedEngine(smollm2_tokenizer, ["no code"] * 4)
    try:
        async with _pool() as pool, _http_scorer(url.replace("/score", "/nope")) as scorer:
            sched = _scheduler(env, engine, smollm2_tokenizer, pool, group_size=2, max_unscored_frac=1.0)
            sched.scorer = scorer
            with pytest.raises(ConfigError, match="HTTP 404.*fix reward http.url"):
                await asyncio.wait_for(_collect(sched.run([task])), 60)
    finally:
        await service.stop()


def _http_scorer(url: str) -> Scorer:
    spec = {"http": {"url": url, "retries": 2, "backoff_s": 0.01, "timeout_s": 5}}
    return Scorer(parse_reward_list([spec], "t"))


async def test_record_bug_is_recorded_not_hung(env: Any, task: Any, smollm2_tokenizer: Any,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    engine = ScriptedEngine(smollm2_tokenizer, ["no code"])
    async with _pool() as pool:
        sched = _scheduler(env, engine, smollm2_tokenizer, pool, infra_retries=0, max_unscored_frac=1.0)
        real_record, calls = sched._record, {"n": 0}

        def flaky_record(*args: Any, **kwargs: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 1:
                raise ValueError("record exploded")
            return real_record(*args, **kwargs)

        monkeypatch.setattr(sched, "_record", flaky_record)
        (group,) = await asyncio.wait_for(_collect(sched.run([task])), 60)
    assert group[0].status is Status.infra_error and group[0].error_kind == "record_failed"
    assert "record exploded" in (group[0].error or "")


async def test_an_unexpected_error_is_raised_to_the_caller_not_hung(env: Any, task: Any, smollm2_tokenizer: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken_attempt(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bug in the scheduler itself")

    engine = ScriptedEngine(smollm2_tokenizer, ["no code"])
    async with _pool() as pool:
        sched = _scheduler(env, engine, smollm2_tokenizer, pool, group_size=2)
        monkeypatch.setattr(sched, "_attempt", broken_attempt)
        with pytest.raises(RuntimeError, match="bug in the scheduler itself"):
            await asyncio.wait_for(_collect(sched.run([task])), 60)


class _DownEngine(ScriptedEngine):
    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        raise EngineUnavailableError("connection refused")


async def test_run_stops_when_too_much_is_unscored(env: Any, smollm2_tokenizer: Any) -> None:
    tasks = list(env.tasks())[:4]
    engine = _DownEngine(smollm2_tokenizer, ["x"])
    async with _pool() as pool:
        sched = _scheduler(env, engine, smollm2_tokenizer, pool, infra_retries=0, group_size=2,
                           max_unscored_frac=0.10, unscored_min_trajectories=3)
        with pytest.raises(UnscoredLimitError, match=r"most common cause: engine"):
            await asyncio.wait_for(_collect(sched.run(tasks)), 120)


async def _collect(gen: Any) -> list[Any]:
    return [g async for g in gen]


class _GradingWatcher:
    """Wraps the env: at the start of finalize (grading) it checks whether anything the policy started is still
    running (a heartbeat file that keeps growing)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.alive_during_grading: bool | None = None

    def __getattr__(self, item: str) -> Any:
        return getattr(self._inner, item)

    async def finalize(self, sandbox: Any, task: Any) -> Any:
        probe = "import os, time\na = os.path.getsize('beat')\ntime.sleep(0.3)\nprint(os.path.getsize('beat') - a)"
        res = await sandbox.exec(["python3", "-c", probe], timeout=10)
        self.alive_during_grading = int(res.stdout.strip() or 0) > 0
        return await self._inner.finalize(sandbox, task)


async def test_processes_the_policy_left_running_are_dead_before_grading(env: Any, task: Any,
                                                                         smollm2_tokenizer: Any) -> None:
    daemon = ("import subprocess\nsubprocess.Popen(['setsid', 'sh', '-c', 'while true; do echo x >> beat; "
              "sleep 0.01; done'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
              "import time, os\ntime.sleep(0.3)\nprint('beat', os.path.getsize('beat') > 0)")
    watcher = _GradingWatcher(env)
    engine = ScriptedEngine(smollm2_tokenizer, [_code(daemon), "done"])
    async with _pool() as pool:
        traj = await _scheduler(watcher, engine, smollm2_tokenizer, pool).run_one(task, group_id="g",
                                                                                sample_index=0)
    assert "beat True" in traj.turns[0].observation, "the daemon ran and outlived its call"
    assert watcher.alive_during_grading is False, "a policy process was still running when grading started"
    assert traj.status is not Status.infra_error


def _has_children(pid: int) -> bool:
    """Any thread of `pid` has a child (the agent starts commands from its request threads)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "children").read_text().split():
                return True
        except OSError:  # the thread ended meanwhile
            continue
    return False


def _agent_pids(pool: Any) -> list[int]:
    """Host pids of the in-sandbox agents (bwrap -> its pid-1 child -> the agent)."""
    out = []
    for live in list(pool.backend._live.values()):
        bwrap = live.proc.pid
        for pid in Path(f"/proc/{bwrap}/task/{bwrap}/children").read_text().split():
            out += [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[:1]]
    return out


@pytest.mark.parametrize("resources_separated", [True, False])
async def test_agent_killed_by_sigkill_during_a_command_is_infra_only_with_proof(
        env: Any, task: Any, smollm2_tokenizer: Any, monkeypatch: pytest.MonkeyPatch,
        resources_separated: bool) -> None:
    """The agent of a uid-separated sandbox dies of SIGKILL while the policy's command runs. When its health says
    the agent's resources are its own, the policy can neither send that signal nor provoke it (the OOM killer is
    excluded): the host did it, infra_error. Without that proof the commands could have starved the agent into
    the kill: the policy's (scored)."""
    real_health = Sandbox.health

    async def health(self: Sandbox) -> bool:
        ok = await real_health(self)
        # what a resource-separated agent's /health says, or one of a backend that could not separate them
        self.agent_info["resources_separated"] = resources_separated
        return ok

    monkeypatch.setattr(Sandbox, "health", health)
    pool = _pool()
    engine = ScriptedEngine(smollm2_tokenizer, [_code("import time\ntime.sleep(20)")])
    killed: list[int] = []

    async def killer() -> None:
        while not killed:
            await asyncio.sleep(0.2)
            for pid in _agent_pids(pool):
                if _has_children(pid):  # only once the command runs
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)

    async with pool:
        task_killer = asyncio.create_task(killer())
        traj = await _scheduler(env, engine, smollm2_tokenizer, pool, infra_retries=0).run_one(
            task, group_id="g", sample_index=0)
        task_killer.cancel()
    assert killed, "the fault was injected"
    if resources_separated:
        assert traj.status is Status.infra_error, (traj.status, traj.error_kind, traj.error)
        assert traj.error_kind == "sandbox_died:signal:9" and traj.reward is None
    else:
        assert traj.status is Status.policy_error, (traj.status, traj.error_kind, traj.error)
        assert traj.error_kind == "sandbox_died_in_command:signal:9" and traj.reward == 0.0


class _StallingReadEnv:
    """code_tests, except that its solution read stalls like a read of a FIFO the policy planted and then, as an
    env may, raises SandboxDiedError itself (the agent is still alive and answering)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def finalize(self, sandbox: Any, task: Any) -> Any:
        raise SandboxDiedError(f"sandbox {sandbox.id}: reading solution.py timed out", in_flight=True,
                               request="POST /read")


async def test_a_missed_deadline_on_a_sandbox_that_still_answers_is_the_policys(
        env: Any, task: Any, smollm2_tokenizer: Any) -> None:
    engine = ScriptedEngine(smollm2_tokenizer, [_code(_wrong_answer(task)), "done"])
    async with _pool() as pool:
        traj = await _scheduler(_StallingReadEnv(env), engine, smollm2_tokenizer, pool, infra_retries=1).run_one(
            task, group_id="g", sample_index=0)
    assert (traj.status, traj.error_kind) == (Status.policy_error, "sandbox_answers"), traj.error
    assert traj.attempt == 0 and traj.reward == 0.0


async def test_a_stall_of_the_runners_own_loop_during_grading_is_not_charged_to_the_policy(
        env: Any, task: Any, smollm2_tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's event loop stalls for 5 s (CPU starvation, a long callback) while the right answer is being
    graded under finalize_timeout_s=3: the grading finished in the sandbox meanwhile. With asyncio.timeout the late
    deadline fired before its answers were read and the episode was a policy_error (finalize_timeout): the
    runner's own stall charged to the policy. Now the deadline is extended by its timer's lateness and the answer
    scores 1."""
    graded = env.finalize

    async def stalled_finalize(sandbox: Any, t: Any) -> Any:
        asyncio.get_running_loop().call_later(0.02, time.sleep, 5.0)  # blocks the loop itself, as starvation does
        return await graded(sandbox, t)

    monkeypatch.setattr(env, "finalize", stalled_finalize)
    engine = ScriptedEngine(smollm2_tokenizer, [_code(task.data["reference"])])
    async with _pool() as pool:
        traj = await _scheduler(env, engine, smollm2_tokenizer, pool, max_turns=1,
                                finalize_timeout_s=3).run_one(task, group_id="g", sample_index=0)
    assert traj.status not in (Status.infra_error, Status.policy_error), f"{traj.error_kind} {traj.error}"
    assert traj.reward == 1.0 and traj.tests is not None and traj.tests.passed == traj.tests.total >= 1
