"""A hostile policy against a docker sandbox's control plane (uid separation when the host side is root): the same
attacks as the local tier (agentrl.testing.sandbox_attacks), plus what the backend proves about a dead container."""

from __future__ import annotations

import asyncio
import os
import subprocess
from typing import Any

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


ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="docker sandboxes are separated only when the host side is root")


@ROOT
@pytest.mark.parametrize("attack", sandbox_attacks.RESOURCE_ATTACKS, ids=lambda f: f.__name__)
async def test_commands_cannot_exhaust_the_agents_resources(make_sandbox, attack) -> None:
    """As on the local tier: the container is the agent's cgroup, every command runs in the sandbox's `commands`
    cgroup with the spec's limits, so SysV memory no process holds, a memory fill after lowering oom_score_adj and
    a daemon holding every pid hit the commands only; kill_all() ends them through the cgroup."""
    async with make_sandbox(memory="256m", pids=128) as sb:
        assert sb.resources_separated, sb.agent_info
        await attack(sb)


@ROOT
async def test_busy_loops_do_not_throttle_the_agent(make_sandbox) -> None:
    async with make_sandbox(memory="256m", pids=128, cpus=0.05) as sb:
        assert sb.resources_separated
        await sandbox_attacks.attack_busy_loops_in_the_cpu_quota(sb)


@ROOT
async def test_commands_run_in_the_sandboxs_commands_cgroup_with_its_limits(make_sandbox, backend) -> None:
    """The layout behind the attacks above, read on the host: the container (docker-init, the agent) under the
    sandbox's `agent` cgroup, a command's process in `commands`, which holds the spec's limits; the host cgroups
    are gone after destroy()."""
    async with make_sandbox(memory="192m", pids=96) as sb:
        dirs = sb.handle.labels["agentrl.cgroups"].split(":")
        r = await sb.exec("sleep 30 > /dev/null 2>&1 & echo $!")
        assert r.exit_code == 0, r
        info = await backend._call((await backend.api()).inspect_container, sb.id)
        init_pid = info["State"]["Pid"]
        for cg in dirs:
            own = os.path.basename(cg)
            assert f"/{own}/agent/" in open(f"/proc/{init_pid}/cgroup").read()
            commands = open(f"{cg}/commands/cgroup.procs").read().split()
            assert commands and str(init_pid) not in commands, commands  # the command and the agent's spawner
        pids_dir = next(cg for cg in dirs if "/pids/" in cg)
        mem_dir = next(cg for cg in dirs if "/memory/" in cg)
        assert open(f"{pids_dir}/commands/pids.max").read().strip() == "96"
        assert int(open(f"{mem_dir}/commands/memory.limit_in_bytes").read()) == 192 << 20
        assert await sb.kill_all() == 1
    assert not any(os.path.exists(cg) for cg in dirs)


@ROOT
async def test_separation_off_keeps_one_budget(make_sandbox) -> None:
    """separate_resources=False: the container's limits cover the agent and its commands, and the agent says so."""
    from agentrl.sandbox import Sandbox, SandboxSpec
    from agentrl.sandbox.docker import DockerBackend
    from dockertier import IMAGE

    b = DockerBackend(separate_resources=False)
    try:
        spec = SandboxSpec(image=IMAGE, memory="256m")
        h = await b.create(spec, {})
        sb = Sandbox(h, spec)
        assert await sb.health() and sb.resources_separated is False and "agentrl.cgroups" not in h.labels
        await sandbox_attacks.attack_sysv_shm_outlives_every_process(sb)
        await sb.close()
    finally:
        await b.close()


@ROOT
async def test_a_grader_is_out_of_reach_from_its_first_instruction(make_sandbox) -> None:
    """Container root copies the image's own python3 to /agentrl/judge-python (0111) before the agent starts: the
    command user runs it with the same sys.path, cannot read it, and a daemon waiting for a grader started from it
    cannot open its memory even before its first statement (on plain python3, the control, it can)."""
    async with make_sandbox() as sb:
        assert sb.judge_python == "/agentrl/judge-python", sb.agent_info
        show = "import sys; print(sys.version, sys.prefix, sys.path)"
        copy, plain = [(await sb.exec([py, "-I", "-c", show])).stdout for py in (sb.judge_python, "python3")]
        assert copy == plain != ""
        assert "Permission denied" in (await sb.exec(["cat", sb.judge_python])).stderr
        await sandbox_attacks.attack_open_a_grader_at_its_start(sb)


# ---------------------------------------------------------------- two containers (hosts without host cgroups)


@pytest.fixture
async def two_containers() -> Any:
    """separation="containers": the agent in a container of its own, the commands in a second one with the spec's
    limits (what `auto` picks where the engine gives no host cgroups: cgroup v2, the systemd driver)."""
    from agentrl.sandbox.docker import DockerBackend

    b = DockerBackend(separation="containers")
    try:
        yield b
    finally:
        await b.close()


async def _two(backend: Any, **spec_fields: Any) -> Any:
    from agentrl.sandbox import Sandbox, SandboxSpec
    from dockertier import IMAGE, RUN_ID

    spec = SandboxSpec(image=IMAGE, **spec_fields)
    handle = await backend.create(spec, {"agentrl.run_id": RUN_ID})
    return Sandbox(handle, spec)


@ROOT
@pytest.mark.parametrize("attack", (*sandbox_attacks.RESOURCE_ATTACKS,
                                    sandbox_attacks.attack_busy_loops_in_the_cpu_quota, *sandbox_attacks.ALL),
                         ids=lambda f: f.__name__)
async def test_two_containers_keep_the_agents_resources_and_uid(two_containers: Any, attack: Any) -> None:
    """The same resource attacks and control-plane attacks with the agent in a container of its own: its memory,
    pids and CPU are not the commands' (the commands' container holds the spec's limits; pid, ipc and network
    namespaces are shared so the agent kills them and removes their SysV objects)."""
    cpus = 0.05 if attack is sandbox_attacks.attack_busy_loops_in_the_cpu_quota else 1.0
    sb = await _two(two_containers, memory="256m", pids=128, cpus=cpus)
    try:
        assert await sb.health() and sb.resources_separated and sb.uid_separated, sb.agent_info
        assert await sandbox_attacks.shm_rmid_forced(sb), "the pod's IPC namespace keeps detached SysV segments"
        await attack(sb)
    finally:
        await sb.close()
        await two_containers.destroy(sb.handle)


@ROOT
async def test_two_containers_layout_and_cleanup(two_containers: Any) -> None:
    """A command runs in the commands' container (its limits: pids 96, 192 MiB), the agent in its own; the agent's
    container dying by a signal from outside is `killed:9` (infra); destroy() leaves no container or volume."""
    sb = await _two(two_containers, memory="192m", pids=96)
    api = await two_containers.api()
    name, commands = sb.id, sb.id + "-cmd"
    try:
        r = await sb.exec("cat /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/memory/memory.limit_in_bytes; id -u")
        assert r.stdout.split() == ["96", str(192 << 20), "1000"], r
        info = await two_containers._call(api.inspect_container, commands)
        agent = await two_containers._call(api.inspect_container, name)
        assert info["HostConfig"]["PidMode"] == f"container:{agent['Id']}" and info["State"]["Running"]
        assert agent["HostConfig"]["PidsLimit"] != 96 and agent["HostConfig"]["Memory"] != 192 << 20
        await asyncio.to_thread(subprocess.run, ["docker", "kill", name], check=True, capture_output=True)
        assert await two_containers.death_cause(sb.handle) == "killed:9"
    finally:
        await sb.close()
        await two_containers.destroy(sb.handle)
    names = {c["Names"][0].lstrip("/") for c in await two_containers._call(api.containers, all=True)}
    volumes = (await two_containers._call(api.volumes) or {}).get("Volumes") or []
    assert name not in names and commands not in names
    assert not [v["Name"] for v in volumes if v["Name"].startswith(name)]
