"""Sandbox records and the backend protocol. Imports only types/errors.

Control plane vs data plane: a `SandboxBackend` only creates, watches and deletes sandboxes and returns an
`AgentEndpoint` for each; every command goes to the in-sandbox agent (`agent/`) through `AgentClient`
(`client.py`). A `Sandbox` is the handle a trajectory holds for its lease.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

_MEM_RE = re.compile(r"^(\d+)([kmgKMG]?)$")
# where a writable dir may not go: the system, the backends' own mounts (workspace, /tmp, the agent's directory)
RESERVED_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc", "/dev", "/sys",
                 "/run", "/var", "/tmp", "/workspace", "/.agentrl", "/agentrl", "/agentrl-src", "/agentrl-key")


def parse_memory(value: str) -> int:
    """'512m' -> bytes. Raises ValueError naming the accepted forms."""
    m = _MEM_RE.match(value.strip())
    if not m:
        raise ValueError(f"memory {value!r}: use a number with optional k/m/g suffix, e.g. '512m' or '1g'")
    mult = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[m.group(2).lower()]
    return int(m.group(1)) * mult


class SandboxSpec(BaseModel):
    """What one sandbox gets. The same spec works for every backend (backends ignore what they cannot apply
    and log it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str = "agentrl/python:latest"  # docker / kubernetes only
    cpus: float = Field(default=1.0, gt=0)
    memory: str = "1g"
    pids: int = Field(default=256, ge=16)
    disk: str = "256m"  # workspace size limit
    output_limit: int = Field(default=64 * 1024, ge=1024)  # bytes kept per stream per exec
    default_timeout_s: float = Field(default=30.0, gt=0)
    network: bool = False
    ttl_s: int = Field(default=7200, ge=10)  # covers the default budgets (agentrl.config.check_ttl_covers_budgets)
    # extra empty writable directories outside the workspace (e.g. ("/repo",) for an SWE-style repository), each
    # owned by the sandbox user, size-limited like the workspace (`disk` each) and usable by the file API
    writable_dirs: tuple[str, ...] = ()

    @field_validator("memory", "disk")
    @classmethod
    def _mem(cls, v: str) -> str:
        parse_memory(v)
        return v

    @field_validator("writable_dirs")
    @classmethod
    def _writable(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for d in v:
            if not d.startswith("/") or posixpath.normpath(d) != d or d == "/" or ":" in d:
                raise ValueError(f"writable_dirs: {d!r} must be a normalized absolute path other than / (no ':'), "
                                 "e.g. '/repo'")
            if any(d == r or d.startswith(r + "/") or r.startswith(d + "/") for r in RESERVED_DIRS):
                raise ValueError(f"writable_dirs: {d!r} overlaps a directory the sandbox owns "
                                 f"({', '.join(RESERVED_DIRS)}): pick another, e.g. '/repo'")
        if len(set(v)) != len(v) or any(a != b and a.startswith(b + "/") for a in v for b in v):
            raise ValueError(f"writable_dirs: {list(v)} repeat or nest: list each directory once, none inside another")
        return v

    @property
    def memory_bytes(self) -> int:
        return parse_memory(self.memory)

    @property
    def disk_bytes(self) -> int:
        return parse_memory(self.disk)


class ExecResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    exit_code: int | None  # None when killed by timeout
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0
    # the syscall policy's refusals the agent counted since its previous report (this command's and any background
    # process's): PROBES by name, "clone_namespace", "x32", "enosys:NAME" (see agent.SeccompWatch)
    probes: dict[str, int] = Field(default_factory=dict)
    # the commands' cgroup counters that moved during the command (agent.ResourceCounters): oom_kills, pids_max,
    # cpu_throttled_us, disk_full, shm_bytes
    resources: dict[str, int] = Field(default_factory=dict)


@dataclass(frozen=True)
class AgentEndpoint:
    """How to reach a sandbox's agent: a unix socket path, or host:port with a bearer token."""

    kind: Literal["unix", "tcp"]
    address: str  # socket path, or "host:port"
    token: str | None = field(default=None, repr=False)  # a bearer token is never shown in reprs or logs


@dataclass
class SandboxHandle:
    """What a backend returns for one created sandbox (control-plane view)."""

    id: str
    backend: str
    endpoint: AgentEndpoint
    labels: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # create_s, start_s, agent_ready_s


# a death cause: SIGKILL, whether the OOM killer's unknown; attribution judges it by what the policy can reach (infra
# where the agent is uid- and resource-separated, the policy's otherwise: runner/attribution.py)
SIGKILL_UNPROVEN = "sigkill_unproven"


class SandboxBackend(Protocol):
    name: str

    async def create(self, spec: SandboxSpec, labels: dict[str, str]) -> SandboxHandle:
        """Create and start one sandbox; return when its agent answers health checks."""
        ...

    async def destroy(self, handle: SandboxHandle) -> None:
        """Remove the sandbox and everything it owns. Idempotent."""
        ...

    async def alive(self, handle: SandboxHandle) -> bool: ...

    async def death_cause(self, handle: SandboxHandle) -> str | None:
        """Why a sandbox whose agent stopped answering is gone, as far as the backend can prove it (a fact for
        failure attribution, not a verdict): "deleted" (removed from outside), "evicted", "oom" (the kernel OOM-
        killed the agent/container), "exited:<code>" / "signal:<n>" (how the agent process ended), SIGKILL_UNPROVEN
        (the agent died of SIGKILL and the backend cannot tell the OOM killer from an outside kill: the signal that
        would tell them apart is missing); None when unknown or still running. Call it before the lease ends (the
        pool destroys the sandbox then). A SIGKILL counts as from outside ("killed:9", or "signal:9" for a resource-
        separated agent) only when the backend has a positive record that it was not the OOM killer, never from the
        mere absence of an OOM flag (docs/reward-integrity.md, "How each backend proves an agent's death")."""
        ...

    async def sweep(self, *, run_id: str | None = None, all_runs: bool = False) -> int:
        """Remove orphans: sandboxes whose owning run is dead or whose TTL passed. Returns how many."""
        ...

    async def close(self) -> None: ...
