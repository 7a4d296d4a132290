"""Probing observed, not only blocked (agent.SignalTargets, agent.NetAttempts): the attacks themselves
(agentrl.testing.policy_attacks.PROBE_ATTACKS) run on every tier through sandbox_attacks.ALL
(tests/integration/test_sandbox_attacks.py, tests/docker/test_attacks.py, the k8s tier); here what only the local
tier can set up: a sandbox whose spec allows network counts no network attempt."""

from __future__ import annotations

from pathlib import Path

import pytest
from local_sandbox_support import root_bwrap_problem, state_dir  # noqa: F401 (a fixture)

from agentrl.sandbox import SandboxPool, SandboxSpec

pytestmark = pytest.mark.skipif(root_bwrap_problem() is not None, reason=root_bwrap_problem() or "")
SPEC = SandboxSpec(memory="256m", pids=128, disk="64m", default_timeout_s=20)


async def test_network_by_spec_is_not_counted(state_dir: Path) -> None:
    spec = SPEC.model_copy(update={"network": True})
    reach = "import socket\ntry:\n socket.create_connection(('192.0.2.1', 80), 0.5)\nexcept OSError:\n pass"
    async with SandboxPool("local", spec, warm=0, max_sandboxes=1, state_dir=state_dir) as pool, pool.lease() as sb:
        r = await sb.exec(["python3", "-c", reach])
    assert "network_attempt" not in r.probes, r
