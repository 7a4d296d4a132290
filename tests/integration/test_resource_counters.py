"""The agent reports what the kernel counted against the commands (`ExecResult.resources`), through real local
sandboxes with their own `commands` cgroup: an OOM kill under a main process that exits 0, a fork refused by
pids.max, a full workspace. The runner raises `resource_exhaustion` from these counts (runner/integrity.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agentrl.runner.integrity import from_sandbox
from agentrl.sandbox import SandboxPool, SandboxSpec
from tests.integration.test_sandbox_local import needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.skipif(os.geteuid() != 0, reason="resource separation needs a root host user")]
SPEC = SandboxSpec(memory="128m", pids=64, disk="16m", default_timeout_s=30)
OOM_CHILD = ("import subprocess, sys\n"
             "r = subprocess.run([sys.executable, '-c', 'b = []\\nwhile True: b.append(bytearray(16 << 20))'])\n"
             "print('child', r.returncode)\n")
FORK_FLOOD = ("import os, time\nkids = []\n"
              "for _ in range(200):\n"
              "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
              "    if pid == 0:\n        time.sleep(5)\n        os._exit(0)\n    kids.append(pid)\n"
              "for pid in kids:\n    os.kill(pid, 9)\n    os.waitpid(pid, 0)\nprint('forked', len(kids))\n")


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="agrl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def pool(state_dir: Path) -> AsyncIterator[SandboxPool]:
    async with SandboxPool("local", SPEC, warm=0, max_sandboxes=1, state_dir=state_dir) as p:
        yield p


async def test_counters_see_what_exit_codes_hide(pool: SandboxPool) -> None:
    async with pool.lease() as sb:
        if not sb.resources_separated:
            pytest.skip("no commands cgroup here (host cgroups not writable)")
        quiet = await sb.exec("true")
        oom = await sb.exec(["python3", "-c", OOM_CHILD])
        pids = await sb.exec(["python3", "-c", FORK_FLOOD])
        full = await sb.exec("cat /dev/zero > big 2>/dev/null; rm -f big; head -c 100 /dev/zero > big; echo done")
    assert quiet.resources == {}, quiet
    assert oom.exit_code == 0 and oom.stdout == "child -9\n" and oom.resources.get("oom_kills", 0) >= 1, oom
    assert pids.exit_code == 0 and pids.resources.get("pids_max", 0) >= 1, pids
    assert full.exit_code == 0 and full.resources.get("disk_full") is None, full  # emptied again: not full after
    assert [s.name for s in from_sandbox([oom])] == ["resource_exhaustion"]
    assert [s.name for s in from_sandbox([pids])] == ["resource_exhaustion"]
    assert from_sandbox([quiet]) == []


async def test_a_full_workspace_is_counted(pool: SandboxPool) -> None:
    async with pool.lease() as sb:
        r = await sb.exec("cat /dev/zero > /workspace/big 2>/dev/null; echo $?")
    assert r.exit_code == 0 and r.resources.get("disk_full") == 1, r
    assert "disk_full=1" in from_sandbox([r])[0].detail
