"""The agent's memory does not depend on the data it carries, on a real pod (issue 31 item 6; the local and docker
tiers run the same scenarios, agentrl/testing/agent_memory.py): a 200 MB file and a 200 MB tree cross the agent
byte-exact and repo_fix's editor edits and undoes a 40 MB file, while the agent's peak resident memory (VmHWM of its
process, read on the host: the dev cluster's pods are processes of this machine, in the cluster's own dockerd) grows
by less than PEAK_BOUND, and the agent answers afterwards. The agent's container has 256 MiB of its own; the old
agent held each file, its base64 and the undo copy in memory (about 5x the file)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.sandbox import Sandbox
from agentrl.testing.agent_memory import (
    PEAK_BOUND,
    agent_pid,
    docker_root_pid,
    edit_and_undo,
    file_round_trip,
    tree_round_trip,
)

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(600)]
CLUSTER_DOCKER = Path(os.environ.get("AGENTRL_K8S_DIR", Path.home() / ".cache/agentrl/k8s"), "docker/docker.sock")


@pytest.fixture
async def pod_sandbox(real_cluster: Any) -> AsyncIterator[tuple[Sandbox, int]]:
    if not CLUSTER_DOCKER.is_socket():
        pytest.skip(f"the agent's host pid is read through the dev cluster's dockerd ({CLUSTER_DOCKER}): "
                    "run on the dev cluster (k8s/dev-cluster/up.sh)")
    backend = real_cluster.backend()
    spec = real_cluster.spec.model_copy(update={"memory": "1g", "disk": "768m", "cpus": 0.5,
                                                "default_timeout_s": 120})
    handle = await backend.create(spec, {})
    sb = Sandbox(handle, spec)
    try:
        assert await sb.health() and sb.resources_separated, sb.agent_info
        pods = await real_cluster.pods()
        (pod,) = [p for p in pods if p["metadata"]["name"] == backend._pod_names.get(handle.id, handle.id)]
        (agent,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == "agentrl-agent"]
        container = agent["containerID"].removeprefix("docker://")
        yield sb, agent_pid(docker_root_pid(container, base_url=f"unix://{CLUSTER_DOCKER}"))
    finally:
        await sb.close()
        await backend.destroy(handle)


async def _answers(sb: Sandbox) -> None:
    assert await sb.health(), "the agent died"
    assert (await sb.exec(["true"])).exit_code == 0


async def test_200_mb_file_and_tree_cross_a_pods_agent_with_flat_memory(pod_sandbox: Any) -> None:
    sb, pid = pod_sandbox
    grew = await file_round_trip(sb, pid, 200 << 20)
    assert grew < PEAK_BOUND, f"the agent's peak memory grew by {grew >> 20} MiB for a 200 MB file"
    grew = await tree_round_trip(sb, pid, 200 << 20)
    assert grew < PEAK_BOUND, f"the agent's peak memory grew by {grew >> 20} MiB for a 200 MB tree"
    await _answers(sb)


async def test_the_editor_on_a_40_mb_file_leaves_a_pods_agent_flat(pod_sandbox: Any) -> None:
    from agentrl_repo_fix.tools import run_editor

    sb, pid = pod_sandbox
    grew = await edit_and_undo(sb, pid, run_editor, 40 << 20)
    assert grew < PEAK_BOUND, f"the agent's peak memory grew by {grew >> 20} MiB for an edit of a 40 MB file"
    await _answers(sb)
