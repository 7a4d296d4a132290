"""The agent's memory does not depend on the data it carries (issue 31 item 6), through real docker sandboxes in both
layouts: the one `auto` picks (host cgroups on a cgroup-v1 cgroupfs engine, else two containers) and two containers
(the agent in a container of its own, 256 MiB for its working set). A 200 MB file and repo_fix's editor on a 40 MB
file (edit, undo) cross the agent byte-exact, its peak resident memory (VmHWM, read on the host) grows by less than
PEAK_BOUND, and in the two-container layout it survives with its container never near the limit. The old agent
died in its container of the 40 MB edit (the file, its base64 and its undo copy in memory at once)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agentrl_repo_fix.tools import run_editor
from dockertier import IMAGE, RUN_ID

from agentrl.sandbox import Sandbox, SandboxSpec
from agentrl.testing.agent_memory import (
    PEAK_BOUND,
    agent_pid,
    docker_root_pid,
    edit_and_undo,
    file_round_trip,
    tree_round_trip,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the agent is separated only when the host side is root")


@pytest.fixture(params=["auto", "containers"])
async def docker_sandbox(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Sandbox, int, Any]]:
    from agentrl.sandbox.docker import DockerBackend

    backend = DockerBackend(separation=request.param)
    spec = SandboxSpec(image=IMAGE, memory="1g", disk="768m")
    handle = await backend.create(spec, {"agentrl.run_id": RUN_ID})
    sb = Sandbox(handle, spec)
    try:
        assert await sb.health() and sb.resources_separated, sb.agent_info
        yield sb, agent_pid(docker_root_pid(handle.id)), backend
    finally:
        await sb.close()
        await backend.destroy(handle)
        await backend.close()


async def _alive(sb: Sandbox, backend: Any) -> None:
    assert await sb.health(), await backend.death_cause(sb.handle)
    assert (await sb.exec(["true"])).exit_code == 0


async def test_a_200_mb_file_crosses_the_agent_byte_exact_with_flat_memory(docker_sandbox: Any) -> None:
    sb, pid, backend = docker_sandbox
    grew = await file_round_trip(sb, pid, 200 << 20)
    assert grew < PEAK_BOUND, f"the agent's peak memory grew by {grew >> 20} MiB for a 200 MB file"
    await _alive(sb, backend)


async def test_a_200_mb_tree_crosses_the_agent_as_grading_ships_it(docker_sandbox: Any) -> None:
    """Fresh grading writes the graded tree as one tar through the agent (the old agent died in its container of a
    63 MB one); collect packs the policy's tree and reads it back."""
    sb, pid, backend = docker_sandbox
    grew = await tree_round_trip(sb, pid, 200 << 20)
    assert grew < PEAK_BOUND, f"the agent's peak memory grew by {grew >> 20} MiB for a 200 MB tree"
    await _alive(sb, backend)


async def test_the_agent_survives_the_editor_on_a_40_mb_file(docker_sandbox: Any) -> None:
    sb, pid, backend = docker_sandbox
    grew = await edit_and_undo(sb, pid, run_editor, 40 << 20)
    assert grew < PEAK_BOUND, f"the agent's peak memory grew by {grew >> 20} MiB for an edit of a 40 MB file"
    await _alive(sb, backend)


async def test_a_sigkill_without_any_record_is_unproven_and_judged_by_separation(docker_sandbox: Any) -> None:
    """The agent SIGKILLed with no OOMKilled flag and no kill event of the engine (here: from the host, as the OOM
    killer would look on a runtime that never flags it) is SIGKILL_UNPROVEN, not `killed:9`: no record says who
    sent it. Attribution then needs no flag: this agent is uid-separated and on memory and pids of its own, which
    the data it carries does not grow, so the policy could neither send nor provoke the kill (infra); were the
    resources shared, the same cause would be the policy's. `docker kill` (the engine's record) stays `killed:9`
    (test_attacks)."""
    import signal

    from agentrl.errors import SandboxDiedError
    from agentrl.runner.attribution import DeathFacts, Stage, classify
    from agentrl.types import Status

    sb, pid, backend = docker_sandbox
    os.kill(pid, signal.SIGKILL)
    cause = await backend.death_cause(sb.handle)
    assert cause == "sigkill_unproven", cause
    verdict = classify(SandboxDiedError("gone", in_flight=False), Stage.turns,
                       death=DeathFacts(uid_separated=True, control_plane_separated=sb.resources_separated,
                                        cause=cause))
    assert sb.resources_separated and verdict.status is Status.infra_error, verdict
    shared = classify(SandboxDiedError("gone", in_flight=False), Stage.turns,
                      death=DeathFacts(uid_separated=True, control_plane_separated=False, cause=cause))
    assert shared.status is Status.policy_error, shared
