"""The warm pool on real containers: creation admission (cap on starting sandboxes), the cold-start grace, warm
sandboxes that die while waiting, and phase timings."""

from __future__ import annotations

import asyncio
import os
import subprocess
from typing import Any

import pytest
from dockertier import IMAGE, RUN_ID, containers_owned_by

from agentrl.sandbox import SandboxPool, SandboxSpec
from agentrl.sandbox.docker import DockerBackend

pytestmark = pytest.mark.docker

SPEC = SandboxSpec(image=IMAGE)


class CountingBackend(DockerBackend):
    """The real docker backend, counting how many creates run at once."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.now = self.peak = self.calls = 0

    async def create(self, spec: SandboxSpec, labels: dict[str, str]) -> Any:
        self.now += 1
        self.calls += 1
        self.peak = max(self.peak, self.now)
        try:
            return await super().create(spec, labels)
        finally:
            self.now -= 1


async def test_max_starting_caps_concurrent_creates() -> None:
    backend = CountingBackend()
    try:
        async with SandboxPool(backend, SPEC, warm=0, max_sandboxes=6, max_starting=2, run_id=RUN_ID) as pool:
            async def one() -> str:
                async with pool.lease() as sb:
                    return (await sb.exec("echo ok")).stdout

            assert await asyncio.gather(*(one() for _ in range(6))) == ["ok\n"] * 6
        assert backend.calls == 6 and backend.peak == 2
    finally:
        await backend.close()


@pytest.mark.parametrize("grace", [0.0, 10.0])
async def test_cold_start_grace_waits_for_a_refill_in_flight(grace: float) -> None:
    async with SandboxPool("docker", SPEC, warm=1, max_sandboxes=3, run_id=RUN_ID, cold_start_grace_s=grace) as pool:
        await pool.fill(timeout_s=60)
        async with pool.lease():
            await asyncio.sleep(0.05)  # the refiller has started replacing the sandbox just taken
            assert pool.stats()["starting"] == 1
            async with pool.lease() as second:
                assert (await second.exec("echo ok")).stdout == "ok\n"
        stats = pool.stats()
    if grace:
        assert (stats["warm_hits"], stats["cold_starts"]) == (2, 0)  # waited for the refill instead
    else:
        assert (stats["warm_hits"], stats["cold_starts"]) == (1, 1)


async def test_a_warm_sandbox_killed_while_waiting_is_replaced_not_handed_out() -> None:
    async with SandboxPool("docker", SPEC, warm=2, max_sandboxes=2, run_id=RUN_ID) as pool:
        await pool.fill(timeout_s=60)
        victims = await asyncio.to_thread(containers_owned_by, os.getpid())  # just the two warm ones
        assert len(victims) == 2
        await asyncio.to_thread(subprocess.run, ["docker", "kill", *victims], check=True, capture_output=True)
        async with pool.lease() as sb:
            assert sb.id not in victims
            assert (await sb.exec("echo ok")).stdout == "ok\n"
        assert pool.stats()["replaced"] == 2


async def test_phase_timings_are_recorded(backend) -> None:
    handle = await backend.create(SPEC, {"agentrl.run_id": RUN_ID})
    try:
        assert set(handle.timings) == {"create_s", "start_s", "agent_ready_s"}
        assert all(v > 0 for v in handle.timings.values())
    finally:
        await backend.destroy(handle)
