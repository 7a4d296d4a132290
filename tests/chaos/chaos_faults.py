"""The chaos soak's host-side faults: a trajectory's sandbox deleted, killed or its agent SIGKILLed, from the host.

Owns finding a trajectory's sandbox from the host (the agent whose workspace holds the trajectory's marker, read
through /proc/<agent pid>/root: only sandboxes of this run are ever touched) and applying one fault to it:

    local    sandbox_delete (what a sweep does: its state dir removed, then its process group killed),
             bwrap_kill (bubblewrap SIGKILLed), agent_kill (the agent SIGKILLed)
    docker   container_rm (`docker rm -f`), container_kill (`docker kill`), agent_kill

`@between` hits while the model generates the trajectory's next turn; `@in_command` once the policy's command runs
(the BUSY file it writes). Each fault is recorded (`FaultRecord`) with whether it was delivered. Needs root.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos_plan import BUSY, MARKER, Slot

@dataclass
class FaultRecord:
    traj_id: str
    task_id: str
    sample: int
    kind: str
    t_s: float  # seconds since the run started
    target: str = ""
    delivered: bool = False
    note: str = ""


def _agents() -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # the agent itself: an interpreter running agent.pyz (not docker-init or the alarm wrapper around it)
        if (b"--workspace" in argv and b"-c" not in argv and Path(argv[0].decode(errors="replace")).name.startswith(
                "python") and any(a.endswith(b"/agent.pyz") for a in argv)):
            out.append(int(pid))
    return out


def find_agent(traj_id: str) -> int | None:
    """The host pid of the agent whose workspace holds `traj_id`'s marker (read through /proc/<pid>/root)."""
    for pid in _agents():
        try:
            if Path(f"/proc/{pid}/root{MARKER}").read_text() == traj_id:
                return pid
        except OSError:
            continue
    return None


def _markers() -> dict[int, str]:
    """What each agent's marker says (or why it cannot be read): the diagnosis of a sandbox not found."""
    out = {}
    for pid in _agents():
        try:
            out[pid] = Path(f"/proc/{pid}/root{MARKER}").read_text()[:32]
        except OSError as exc:
            out[pid] = type(exc).__name__
    return out


def _ppid(pid: int) -> int | None:
    try:
        for row in Path(f"/proc/{pid}/status").read_text().splitlines():
            if row.startswith("PPid:"):
                return int(row.split()[1])
    except OSError:
        return None
    return None


def local_sandbox_of(agent: int, state_root: Path) -> tuple[int, Path] | None:
    """(the pid the runner spawned for the sandbox, its state dir): the ancestor of `agent` a state.json names."""
    owners = {}
    for d in state_root.iterdir() if state_root.is_dir() else ():
        try:
            owners[json.loads((d / "state.json").read_text()).get("pid")] = d
        except (OSError, ValueError):
            continue
    pid: int | None = agent
    while pid and pid > 1:
        if pid in owners:
            return pid, owners[pid]
        pid = _ppid(pid)
    return None


def container_of(agent: int) -> str | None:
    try:
        text = Path(f"/proc/{agent}/cgroup").read_text()
    except OSError:
        return None
    found = re.search(r"([0-9a-f]{64})", text)
    return found.group(1) if found else None


class Injector:
    """Applies a fault to the sandbox of one trajectory, from the host; keeps a record of each."""

    def __init__(self, backend: str, state_root: Path, t0: float, docker_host: str | None = None) -> None:
        self.backend, self.state_root, self.t0 = backend, state_root, t0
        self.docker = ["docker", "-H", docker_host] if docker_host else ["docker"]
        self.records: list[FaultRecord] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def later(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def locate(self, traj_id: str, slot: Slot) -> tuple[FaultRecord, int | None]:
        """Find the trajectory's sandbox (its agent's pid) while the model generates its next turn: the trajectory
        waits for this, so it cannot run ahead of the fault."""
        rec = FaultRecord(traj_id, slot.task_id, slot.sample, slot.name, time.perf_counter() - self.t0)
        self.records.append(rec)
        agent = await self._find(traj_id)
        if agent is None:
            rec.note = f"sandbox not found: no agent on this host has the marker ({_markers()})"
        return rec, agent

    async def hit(self, rec: FaultRecord, agent: int) -> None:
        """Apply the fault to the sandbox of `agent`; `@in_command`: once the policy's command runs there."""
        kind, _, timing = rec.kind.partition("@")
        if timing == "in_command" and not await self._busy(agent):
            rec.note = "the command was not seen running; hit anyway"
        rec.t_s = time.perf_counter() - self.t0
        try:
            rec.target = await self._apply(kind, agent)
            rec.delivered = True
        except Exception as exc:  # noqa: BLE001 - recorded: the fault did not happen
            rec.note = f"{type(exc).__name__}: {exc}"

    async def _find(self, traj_id: str) -> int | None:
        for _ in range(50):
            agent = await asyncio.to_thread(find_agent, traj_id)
            if agent is not None:
                return agent
            await asyncio.sleep(0.1)
        return None

    @staticmethod
    async def _busy(agent: int, timeout_s: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if await asyncio.to_thread(os.path.exists, f"/proc/{agent}/root{BUSY}"):
                await asyncio.sleep(0.2)  # well inside the command's sleep
                return True
            await asyncio.sleep(0.02)
        return False

    async def _apply(self, kind: str, agent: int) -> str:
        if kind == "agent_kill":
            os.kill(agent, signal.SIGKILL)
            return f"agent pid {agent}"
        if self.backend == "local":
            found = await asyncio.to_thread(local_sandbox_of, agent, self.state_root)
            if found is None:
                raise RuntimeError(f"no state dir owns agent pid {agent}")
            pid, path = found
            if kind == "sandbox_delete":  # what a sweep does: the state dir goes, then the process group
                await asyncio.to_thread(shutil.rmtree, path, True)
                os.killpg(pid, signal.SIGKILL)
            elif kind == "bwrap_kill":
                os.kill(pid, signal.SIGKILL)
            return f"{path.name} (pid {pid})"
        container = container_of(agent)
        if container is None:
            raise RuntimeError(f"agent pid {agent} is in no container")
        verb = {"container_rm": ["rm", "-f"], "container_kill": ["kill"]}[kind]
        proc = await asyncio.create_subprocess_exec(*self.docker, *verb, container, stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.PIPE)
        _, err = await proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"docker {' '.join(verb)}: {err.decode()[-300:]}")
        return container[:12]


