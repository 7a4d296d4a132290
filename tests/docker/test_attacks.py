"""A hostile policy against a docker sandbox's control plane (uid separation when the host side is root): the same
attacks as the local tier (agentrl.testing.sandbox_attacks), plus what the backend proves about a dead container."""

from __future__ import annotations

import asyncio
import os
import subprocess

import pytest

from agentrl.errors import SandboxDiedError
from agentrl.testing import sandbox_attacks

pytestmark = pytest.mark.docker


@pytest.mark.skipif(os.geteuid() != 0, reason="docker sandboxes are uid-separated only when the host side is root")
@pytest.mark.parametrize("attack", sandbox_attacks.ALL, ids=lambda f: f.__name__)
async def test_attack_fails_and_the_sandbox_serves_on(make_sandbox, attack) -> None:
    async with make_sandbox() as sb:
        assert sb.uid_separated and sb.command_uid == 1000
        await attack(sb)


async def test_container_removed_from_outside_is_deleted(make_sandbox, backend) -> None:
    async with make_sandbox() as sb:
        assert await backend.death_cause(sb.handle) is None
        running = asyncio.create_task(sb.exec("sleep 30"))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(subprocess.run, ["docker", "rm", "-f", sb.id], check=True, capture_output=True)
        with pytest.raises(SandboxDiedError) as info:
            await running
        assert info.value.in_flight is True
        assert await backend.death_cause(sb.handle) == "deleted"


@pytest.mark.skipif(os.geteuid() != 0, reason="docker sandboxes are uid-separated only when the host side is root")
async def test_sysv_shared_memory_is_removed_by_kill_all(make_sandbox) -> None:
    """The container's IPC namespace is its own and kill_all() removes the command user's SysV objects. The
    container's limits still cover the agent, and the sandbox says so (`resources_separated` false)."""
    async with make_sandbox(memory="256m") as sb:
        assert sb.resources_separated is False
        await sandbox_attacks.attack_sysv_shm_outlives_every_process(sb)
