"""The simulated sandbox pool (agentrl.testing, behind bench_scale and the scale tests) checked against a real one.

A sandbox that dies during a command must give the scheduler the same facts from both: the exception, whether a
request was in flight and which, the backend's cause, and so the same verdict from failure attribution (an external
death: infra_error, retried, never the policy's 0). The real death is what an operator's sweep does to a local
(bubblewrap) sandbox while its command runs: its state directory removed and its agent killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
from local_sandbox_support import root_bwrap_problem, state_dir  # noqa: F401 (a fixture)

from agentrl.errors import SandboxDiedError
from agentrl.runner.attribution import DeathFacts, Stage, classify
from agentrl.sandbox import SandboxPool, SandboxSpec
from agentrl.sandbox.local import LocalBackend
from agentrl.testing.simulated import SimulatedPool
from agentrl.types import Status


pytestmark = pytest.mark.skipif(root_bwrap_problem() is not None, reason=root_bwrap_problem() or "")


def _sweep(state_dir: Path, sid: str) -> None:
    """What a sweep of a run's sandboxes does from the host: remove the state directory, kill the sandbox."""
    bwrap = json.loads((state_dir / sid / "state.json").read_text())["pid"]
    shutil.rmtree(state_dir / sid, ignore_errors=True)
    os.kill(bwrap, signal.SIGKILL)


async def _facts(pool: Any, sb: Any, command: Any, then_exec: bool = True) -> tuple[Any, ...]:
    """The facts the scheduler gathers (Scheduler._death_facts) and the verdict they give."""
    with pytest.raises(SandboxDiedError) as info:
        await command
    exc = info.value
    cause = await pool.death_cause(sb)
    facts = DeathFacts(in_flight=exc.in_flight and exc.request.endswith("/exec"), uid_separated=bool(sb.uid_separated),
                       cause=cause)
    verdict = classify(exc, Stage.turns, death=facts)
    again = None
    if then_exec:  # the next request to the dead sandbox: refused before anything is in flight
        with pytest.raises(SandboxDiedError) as second:
            await sb.exec("true")
        again = (second.value.in_flight, second.value.request)
    return facts, verdict.status, verdict.kind, again


async def test_a_death_during_a_command_gives_the_same_facts_and_verdict(state_dir: Path) -> None:
    spec = SandboxSpec(memory="256m", pids=128, disk="128m", default_timeout_s=20)
    async with SandboxPool(LocalBackend(state_dir=state_dir), spec, max_sandboxes=1) as pool:
        async with pool.lease() as sb:
            running = asyncio.create_task(sb.exec("sleep 30"))
            await asyncio.sleep(0.5)
            _sweep(state_dir, sb.id)
            real = await _facts(pool, sb, running)
    async with SimulatedPool(exec_p50_s=0.01, death_p=1.0) as sim:
        async with sim.lease() as sb:
            simulated = await _facts(sim, sb, sb.exec("sleep 30"))
    assert real == simulated
    facts, status, kind, again = real
    assert facts.cause == "deleted" and facts.in_flight  # external, during the policy's command
    assert status is Status.infra_error and kind == "sandbox_lost:deleted"  # not the policy's: retried, never a 0
    assert again == (False, "POST /exec")
