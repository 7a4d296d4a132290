"""A hostile policy against the local sandbox's control plane (bubblewrap, host root: uid separation): killing
everything, signalling / reading / tracing the agent, its socket directory, daemons that outlive the call; plus what
the host side learns when a sandbox dies (SandboxDiedError.in_flight, death_cause) and the /read hardening.

The attacks need root on the host (uid separation); as another user they skip with the reason. The same attacks
run against docker in tests/docker/test_attacks.py."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from local_sandbox_support import root_bwrap_problem, state_dir  # noqa: F401 (a fixture)

from agentrl.errors import SandboxDiedError, SandboxError
from agentrl.runner.attribution import Stage, classify
from agentrl.sandbox import SandboxFileError, SandboxPathError, SandboxPool, SandboxSpec
from agentrl.sandbox.local import LocalBackend
from agentrl.testing import sandbox_attacks


pytestmark = pytest.mark.skipif(root_bwrap_problem() is not None, reason=root_bwrap_problem() or "")
SPEC = SandboxSpec(memory="256m", pids=128, disk="128m", default_timeout_s=20)


@pytest.fixture
async def pool(state_dir: Path) -> AsyncIterator[SandboxPool]:
    async with SandboxPool(LocalBackend(state_dir=state_dir), SPEC, max_sandboxes=2) as p:
        yield p


@pytest.mark.parametrize("attack", sandbox_attacks.ALL, ids=lambda f: f.__name__)
async def test_attack_fails_and_the_sandbox_serves_on(pool: SandboxPool, attack) -> None:
    async with pool.lease() as sb:
        assert sb.uid_separated and sb.command_uid == 1000
        await attack(sb)


@pytest.mark.parametrize("attack", sandbox_attacks.RESOURCE_ATTACKS, ids=lambda f: f.__name__)
async def test_commands_cannot_exhaust_the_agents_resources(pool: SandboxPool, attack) -> None:
    """Memory (shared memory no process holds, after lowering oom_score_adj), pids filled by a daemon: the agent
    and bubblewrap are outside the commands' limits, kill_all() needs no fork and removes the SysV objects."""
    async with pool.lease() as sb:
        assert sb.resources_separated
        await attack(sb)


async def test_busy_loops_do_not_throttle_the_agent(state_dir: Path) -> None:
    spec = SandboxSpec(memory="256m", pids=128, disk="128m", cpus=0.05, default_timeout_s=20)
    async with SandboxPool(LocalBackend(state_dir=state_dir), spec, max_sandboxes=1) as pool:
        async with pool.lease() as sb:
            assert sb.resources_separated
            await sandbox_attacks.attack_busy_loops_in_the_cpu_quota(sb)


async def test_commands_run_in_their_own_cgroup_and_the_agent_outside(pool: SandboxPool, state_dir: Path) -> None:
    """The layout behind the attacks above: the agent (host pid) in `agent`, every command in `commands`, which holds
    the spec's limits."""
    async with pool.lease() as sb:
        state = json.loads((state_dir / sb.id / "state.json").read_text())
        agent = _agent_host_pid(state_dir, sb.id)
        r = await sb.exec("sleep 30 > /dev/null 2>&1 & echo $!")
        assert r.exit_code == 0
        for cg in state["cgroups"]:
            assert str(agent) in Path(cg, "agent", "cgroup.procs").read_text().split()
            commands = Path(cg, "commands", "cgroup.procs").read_text().split()
            assert commands and str(agent) not in commands
        pids_dir = next(cg for cg in state["cgroups"] if "/pids" in cg or "memory.max" in os.listdir(cg))
        assert Path(pids_dir, "commands", "pids.max").read_text().strip() == str(SPEC.pids)
        assert await sb.kill_all() == 1


async def test_commands_hold_no_capability_and_no_new_privs(pool: SandboxPool) -> None:
    async with pool.lease() as sb:
        r = await sb.exec("id -u; id -G; grep -E '^(CapEff|CapPrm|CapAmb|NoNewPrivs):' /proc/self/status")
        lines = r.stdout.split()
        assert lines[:2] == ["1000", "1000"], r  # no supplementary group of the agent's
        assert dict(zip(lines[2::2], lines[3::2])) == {"CapPrm:": "0000000000000000", "CapEff:": "0000000000000000",
                                                       "CapAmb:": "0000000000000000", "NoNewPrivs:": "1"}


async def test_files_written_by_the_host_belong_to_the_sandbox_user(pool: SandboxPool) -> None:
    async with pool.lease() as sb:
        await sb.write_file("pkg/mod.py", "x = 1\n")
        r = await sb.exec("stat -c '%u:%g' . pkg pkg/mod.py && echo y >> pkg/mod.py && rm -r pkg")
        assert r.stdout.split() == ["1000:1000"] * 3 and r.exit_code == 0, r


# ---------------------------------------------------------------- /read of what the policy planted


PLANTED_LIMIT = 64 << 20  # the reader's limit here (a sandbox's file size limit is its disk, 256 MiB by default)


@pytest.mark.parametrize("plant, error", [
    ("mkdir solution.py", SandboxFileError),
    ("mkfifo solution.py", SandboxFileError),
    ("python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('solution.py')\"", SandboxFileError),
    ("ln -s /etc/passwd solution.py", SandboxPathError),
    ("ln -s /.agentrl/run/agent.sock solution.py", SandboxPathError),
    ("echo x > solution.py && chmod 000 solution.py", SandboxPathError),
    (f"truncate -s {PLANTED_LIMIT + 1} solution.py", SandboxFileError),
])
async def test_reading_a_planted_solution_file_is_a_policy_error_not_infra(pool: SandboxPool, plant: str,
                                                                           error: type) -> None:
    async with pool.lease() as sb:
        assert (await sb.exec(plant)).exit_code == 0
        async with asyncio.timeout(10):  # never a hang
            with pytest.raises(error) as info:
                await sb.read_file("solution.py", limit=PLANTED_LIMIT)
        assert not isinstance(info.value, SandboxDiedError)
        await sandbox_attacks.still_serves(sb)


# ---------------------------------------------------------------- a symlink chain where the env reads (issue 22)

CHAIN = """
import os, sys
path, n = sys.argv[1], int(sys.argv[2])
os.makedirs('links', exist_ok=True)
os.symlink('../target.txt', 'links/0')
for i in range(1, n):
    os.symlink(str(i - 1), f'links/{i}')
if os.path.lexists(path):
    os.remove(path)
os.symlink(f'links/{n - 1}', path)
open('target.txt', 'w').write('x = 1')
"""


@pytest.mark.parametrize("path", ["solution.py", "main.py", "report.xml"])
async def test_a_symlink_chain_where_the_env_reads_is_a_policy_error_not_infra(pool: SandboxPool, path: str) -> None:
    """1,200 links at a path the runner or an env reads: the agent used to recurse (RecursionError, 500, infra: a
    dodge on demand). Now a path error, which failure attribution charges to the policy."""
    async with pool.lease() as sb:
        assert (await sb.exec(["python3", "-c", CHAIN, path, "1200"])).exit_code == 0
        async with asyncio.timeout(10):
            with pytest.raises(SandboxPathError, match="symbolic links") as info:
                await sb.read_file(path)
            with pytest.raises(SandboxPathError):
                await sb.write_file(path, "overwritten")
        assert not isinstance(info.value, SandboxError)
        verdict = classify(info.value, Stage.finalize)
        assert not verdict.infra and verdict.kind == "finalize_failed", verdict
        await sandbox_attacks.still_serves(sb)


async def test_a_symlink_chain_at_solution_py_is_scored_zero_by_code_tests(pool: SandboxPool) -> None:
    """Through the env that reads solution.py: a correct solution replaced by a chain is a scored 0 with the
    reason, not an exception (which would end the trajectory unscored)."""
    from agentrl_code_tests import CodeTestsEnv

    from agentrl.types import ToolCall

    env = CodeTestsEnv(source="easy")
    task = next(t for t in env.tasks() if t.id == "easy/add")
    async with pool.lease() as sb:
        await env.setup(sb, task)
        await env.call_tool(sb, ToolCall(id="c0", name="run_python", arguments={
            "code": "def add(a, b):\n    return a + b\n"}), task=task)
        assert (await sb.exec(["python3", "-c", CHAIN, "solution.py", "1200"])).exit_code == 0
        async with asyncio.timeout(30):
            report = await env.finalize(sb, task)
    assert report.error is None and report.passed == 0 and report.total == 5, report
    assert all("could not be read" in o.message and "symbolic links" in o.message for o in report.outcomes)


# ---------------------------------------------------------------- facts for failure attribution


def _agent_host_pid(state_dir: Path, sid: str) -> int:
    """The agent's pid on the host: the child of bwrap's pid-1 (bwrap -> bwrap init -> agent)."""
    bwrap = json.loads((state_dir / sid / "state.json").read_text())["pid"]
    for pid in Path(f"/proc/{bwrap}/task/{bwrap}/children").read_text().split():
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if kids:
            return int(kids[0])
    raise AssertionError("agent process not found")


async def test_agent_killed_during_a_command_is_in_flight_with_its_signal(pool: SandboxPool, state_dir: Path) -> None:
    async with pool.lease() as sb:
        running = asyncio.create_task(sb.exec("sleep 30"))
        await asyncio.sleep(0.3)
        os.kill(_agent_host_pid(state_dir, sb.id), signal.SIGKILL)
        with pytest.raises(SandboxDiedError) as info:
            await running
        assert info.value.in_flight is True
        assert await pool.death_cause(sb) == "signal:9"


async def test_agent_dead_before_the_request_is_not_in_flight(pool: SandboxPool, state_dir: Path) -> None:
    async with pool.lease() as sb:
        os.kill(_agent_host_pid(state_dir, sb.id), signal.SIGKILL)
        await asyncio.sleep(0.2)
        with pytest.raises(SandboxDiedError) as info:
            await sb.exec("true")
        assert info.value.in_flight is False


async def test_sandbox_removed_from_outside_is_deleted(pool: SandboxPool, state_dir: Path) -> None:
    async with pool.lease() as sb:
        assert await pool.death_cause(sb) is None  # alive: no cause
        subprocess.run(["python3", "-c", "import shutil, sys; shutil.rmtree(sys.argv[1])", str(state_dir / sb.id)],
                       check=True)
        assert await pool.death_cause(sb) == "deleted"
