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
