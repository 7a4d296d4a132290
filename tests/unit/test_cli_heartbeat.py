"""The rollout's progress is never silent in a log: a heartbeat line every `every_s` seconds whether or not a
trajectory finished, counting the in-flight trajectories' turns, tokens and tool calls (`ProgressDisplay`, fed by
the scheduler's `Progress`). Slow scripted model, simulated sandboxes, the real runner and scheduler."""

from __future__ import annotations

import asyncio
import io
import re
from typing import Any

import pytest
from rich.console import Console

from agentrl.cli.display import ProgressDisplay
from agentrl.runner import Budgets, Rollout, Scheduler, SchedulerConfig
from agentrl.testing.models import load_embedded_tokenizer
from agentrl.testing.scripted import ScriptedEngine
from agentrl.testing.simulated import SimulatedEnv, SimulatedPool
from agentrl.tools.render import ChatRenderer
from agentrl.types import Generation, SamplingParams

LINE = re.compile(r"trajectories (\d+)/(\d+) \((\d+) in flight\)  turns (\d+)  tool calls (\d+)  tokens (\d+)")


class SlowEngine(ScriptedEngine):
    """A model that takes `delay_s` per turn: two code blocks, then a plain answer that ends the episode."""

    def __init__(self, tokenizer: Any, delay_s: float) -> None:
        super().__init__(tokenizer, ["```python\nprint(1)\n```", "```python\nprint(2)\n```", "Done."])
        self.delay_s = delay_s

    async def generate(self, input_ids: list[int], sampling: SamplingParams, *, session_id: str) -> Generation:
        await asyncio.sleep(self.delay_s)
        return await super().generate(input_ids, sampling, session_id=session_id)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_embedded_tokenizer()


async def test_heartbeat_reports_in_flight_work_before_anything_finishes(tokenizer: Any) -> None:
    env = SimulatedEnv(tasks=2)
    rollout = Rollout(env=env, engine=SlowEngine(tokenizer, delay_s=0.25), renderer=ChatRenderer(tokenizer),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=64),
                      budgets=Budgets(max_turns=4, max_completion_tokens=4096, context_window=8192))
    sched = Scheduler(rollout, SimulatedPool(exec_p50_s=0.001), SchedulerConfig(group_size=2, max_trajectories=4))
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=400)
    before_first_group: list[str] = []
    groups = 0
    async with sched.pool:
        with ProgressDisplay(sched.progress, console, every_s=0.05) as display:
            async for _group in sched.run(env.tasks()):
                if not groups:
                    before_first_group = out.getvalue().splitlines()
                groups += 1
                display.tick()
    assert groups == 2
    beats = [tuple(map(int, m.groups())) for line in before_first_group if (m := LINE.search(line))]
    # 3 turns x 0.25 s before any trajectory can finish: many beats, all with nothing done yet
    assert len(beats) >= 5, out.getvalue()
    assert all(done == 0 and total == 4 for done, total, *_ in beats[:-1])
    assert max(b[2] for b in beats) == 4  # all four trajectories in flight
    # the counters move while nothing has finished: turns, tool calls and tokens of in-flight trajectories
    unfinished = [b for b in beats if b[0] == 0]
    turns, tool_calls, tokens = (max(b[i] for b in unfinished) for i in (3, 4, 5))
    assert turns >= 4 and tool_calls >= 4 and tokens > 0
    assert [b[3] for b in unfinished] == sorted(b[3] for b in unfinished)  # monotone while in flight
    final = LINE.search(out.getvalue().splitlines()[-1])
    assert final is not None and final.groups()[:4] == ("4", "4", "0", "12")  # 4 trajectories x 3 turns, none left


# -- every long command beats: envs check, eval, replay --reexecute ------------------------------------------------

CHECK_LINE = re.compile(r"envs check \S+: scoring solutions, checked (\d+)/(\d+) tasks \((\d+) in flight\)")

SLOW_ENV = '''
import asyncio
from agentrl.testing.simulated import SimulatedEnv
from agentrl.types import TestReport

class SlowToScore(SimulatedEnv):
    """Reference solutions whose tests take 0.6 s to run."""

    def reference_solution(self, task):
        return str(task.data["number"])

    async def score_solution(self, sandbox, task, solution):
        await asyncio.sleep(0.6)
        return TestReport(passed=1, total=1)
'''


def test_envs_check_beats_while_solutions_are_scored(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import agentrl.cli.display as display
    import agentrl.cli.wiring as wiring
    from agentrl.cli import main

    env_file = tmp_path / "slow_env.py"
    env_file.write_text(SLOW_ENV)
    monkeypatch.setattr(display, "HEARTBEAT_S", 0.05, raising=False)
    monkeypatch.setattr(wiring, "make_pool", lambda *a, **k: SimulatedPool(exec_p50_s=0.001))
    assert main(["envs", "check", f"{env_file}:SlowToScore", "--env-option", "tasks=2", "--concurrency", "2"]) == 0
    out = capsys.readouterr()
    assert "total: 2/2 tasks pass all tests" in out.out
    beats = [tuple(map(int, m.groups())) for line in out.err.splitlines() if (m := CHECK_LINE.search(line))]
    # 0.6 s of scoring with nothing finished yet: several beats that say both tasks are in flight
    assert sum(b == (0, 2, 2) for b in beats) >= 3, out.err


def _eval_parts(tokenizer: Any, pool: Any, env: Any) -> Any:
    """What `eval_parts` returns (agentrl.compose.RunParts' fields used by eval) over a slow scripted model."""
    from types import SimpleNamespace

    from agentrl.reward import Scorer

    sampling = SamplingParams(temperature=1.0, max_new_tokens=64)

    def scheduler(*, sampling: SamplingParams = sampling, group_size: int = 2, namespace: str = "",
                  meta: Any = None, shares_slots_with: Any = None) -> Scheduler:
        rollout = Rollout(env=env, engine=SlowEngine(tokenizer, delay_s=0.25), renderer=ChatRenderer(tokenizer),
                          sampling=sampling,
                          budgets=Budgets(max_turns=4, max_completion_tokens=4096, context_window=8192))
        return Scheduler(rollout, pool, SchedulerConfig(group_size=group_size, max_trajectories=8,
                                                        namespace=namespace), meta=meta)

    async def aclose() -> None:
        return None

    return SimpleNamespace(env=env, tasks=env.tasks(), pool=pool, sampling=sampling, meta={}, scorer=Scorer(),
                           scheduler=scheduler, aclose=aclose)


async def test_eval_beats_with_every_modes_in_flight_work(tokenizer: Any, tmp_path: Any,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from types import SimpleNamespace

    import agentrl.cli.display as display
    import agentrl.cli.train as train_cli

    env = SimulatedEnv(tasks=2)
    parts = _eval_parts(tokenizer, SimulatedPool(exec_p50_s=0.001), env)

    async def eval_parts(*args: Any, **kwargs: Any) -> Any:
        return parts

    monkeypatch.setattr(display, "HEARTBEAT_S", 0.05, raising=False)
    monkeypatch.setattr(train_cli, "eval_parts", eval_parts)
    cfg = SimpleNamespace(eval=SimpleNamespace(samples=2, greedy=True), gc_tune=False, max_unscored_frac=0.1)
    assert await train_cli.run_eval(cfg, tmp_path / "ckpt", None, tmp_path / "report") == 0
    err = capsys.readouterr().err  # the heartbeat's default console: stderr
    lines = [line for line in err.splitlines() if line.startswith("eval candidate: ")]
    beats = [tuple(map(int, m.groups())) for line in lines if (m := LINE.search(line))]
    # 2 tasks x (2 sampled + 1 greedy) = 6 trajectories of 3 turns x 0.25 s: beats before any finished, with the
    # sampled and the greedy mode's trajectories all in flight
    assert sum(done == 0 and in_flight == 6 for done, total, in_flight, *_ in beats) >= 3, err
    assert beats[-1][:4] == (6, 6, 0, 18)  # the final line: 6 trajectories x 3 turns, none left


SLOW_TOOL_ENV = '''
import asyncio
from agentrl.testing.simulated import SimulatedEnv

class SlowTool(SimulatedEnv):
    """SimulatedEnv whose tool takes 0.3 s (a replayed command that runs for a while)."""

    async def call_tool(self, sandbox, call, *, task):
        await asyncio.sleep(0.3)
        return await super().call_tool(sandbox, call, task=task)
'''

REPLAY_LINE = re.compile(r"replay --reexecute: (\d+)/(\d+) trajectories re-executed \((\d+) tool calls\)")


async def _two_stored_trajectories(tokenizer: Any, path: Any, env_ref: str) -> None:
    from agentrl.store import TrajectoryStore

    env = SimulatedEnv(tasks=1)
    rollout = Rollout(env=env, engine=SlowEngine(tokenizer, delay_s=0.0), renderer=ChatRenderer(tokenizer),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=64),
                      budgets=Budgets(max_turns=4, max_completion_tokens=4096, context_window=8192))
    sched = Scheduler(rollout, SimulatedPool(exec_p50_s=0.001), SchedulerConfig(group_size=2, max_trajectories=2))
    async with sched.pool:
        with TrajectoryStore(path) as store:
            async for group in sched.run(env.tasks()):
                store.append_group([t.model_copy(update={"env": env_ref}) for t in group])


def test_replay_reexecute_beats_while_tool_calls_replay(tokenizer: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import agentrl.cli.display as display
    import agentrl.compose as compose
    from agentrl.cli import main

    env_file = tmp_path / "slow_tool.py"
    env_file.write_text(SLOW_TOOL_ENV)
    stored = tmp_path / "run.jsonl"
    asyncio.run(_two_stored_trajectories(tokenizer, stored, f"{env_file}:SlowTool"))
    monkeypatch.setattr(display, "HEARTBEAT_S", 0.05, raising=False)
    monkeypatch.setattr(compose, "make_pool", lambda *a, **k: SimulatedPool(exec_p50_s=0.001))
    main(["replay", str(stored), "--reexecute"])  # exit code: whether the replayed results matched (not checked)
    err = capsys.readouterr().err
    beats = [tuple(map(int, m.groups())) for line in err.splitlines() if (m := REPLAY_LINE.search(line))]
    # 2 trajectories x 2 tool calls x 0.3 s, one after another: beats before the first one is done, then after it
    assert sum(b[:2] == (0, 2) for b in beats) >= 3, err
    assert any(b[:2] == (1, 2) for b in beats) and beats[-1] == (2, 2, 4), err
