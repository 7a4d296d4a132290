"""Probing observed, not only blocked (agent.SignalTargets, agent.NetAttempts) through real local sandboxes: signals
to processes the command did not start and attempts to reach a network the sandbox does not have are counted by
the agent from the kernel (seccomp notifications, the network namespace's counters), for the whole episode, while
what honest commands do with signals and localhost sockets counts nothing. Docker's tier runs the same checks in
tests/docker/test_attacks.py."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agentrl.sandbox import SandboxPool, SandboxSpec
from agentrl.testing import policy_attacks
from tests.integration.test_sandbox_local import needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.skipif(os.geteuid() != 0, reason="uid separation needs a root host user")]
SPEC = SandboxSpec(memory="256m", pids=128, disk="64m", default_timeout_s=20)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="agrl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def pool(state_dir: Path) -> AsyncIterator[SandboxPool]:
    async with SandboxPool("local", SPEC, warm=0, max_sandboxes=1, state_dir=state_dir) as p:
        yield p


@pytest.mark.parametrize("attack", policy_attacks.PROBE_ATTACKS, ids=lambda f: f.__name__)
async def test_probe_is_counted(pool: SandboxPool, attack) -> None:
    async with pool.lease() as sb:
        await attack(sb)


async def test_honest_signals_and_localhost_sockets_count_nothing(pool: SandboxPool) -> None:
    async with pool.lease() as sb:
        await policy_attacks.honest_signals_and_sockets_raise_nothing(sb)


async def test_network_by_spec_is_not_counted(state_dir: Path) -> None:
    spec = SPEC.model_copy(update={"network": True})
    async with SandboxPool("local", spec, warm=0, max_sandboxes=1, state_dir=state_dir) as pool:
        async with pool.lease() as sb:
            r = await sb.exec(["python3", "-c", "import socket\ntry:\n socket.create_connection(('192.0.2.1', 80), "
                                                "0.5)\nexcept OSError:\n pass"])
    assert "network_attempt" not in r.probes, r
