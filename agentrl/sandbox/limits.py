"""Resource limits of local sandboxes: cgroup v2, cgroup v1, or rlimits, chosen once per backend.

Owns: detecting which mechanism works on this host, creating one cgroup per sandbox with its memory / pids / CPU
limits, the launch wrapper that puts the sandbox's first process into that cgroup and sets rlimits before it
execs bubblewrap, and killing + removing a sandbox's cgroup. Does not own: namespaces (bubblewrap.py, local.py) or
the agent.

Separated layout (`prepare(..., separate=True)`, cgroup modes only): the sandbox's cgroup gets two children,

    <sandbox>/agent      bubblewrap and the agent: no memory / CPU limit, its own pids.max (AGENT_PIDS)
    <sandbox>/commands   every command the agent starts: the spec's memory / pids / CPU limits

so the policy's commands can exhaust their memory, pids or CPU without touching the control plane's: a memory
cgroup's OOM killer only picks inside the cgroup that hit its limit, a full pids.max only fails forks counted in it,
and a CPU quota only throttles the threads in it. The agent moves commands into `commands` itself (agent/cgroups.py).

The launch wrapper is `/bin/sh -c JOIN sh <cgroup.procs files> -- prlimit --X=N ... -- <command>` rather than a
Python `preexec_fn`, so `subprocess` keeps using vfork (a fork of a process holding a model costs milliseconds
and blocks the event loop). All functions here do blocking file I/O: call them through `asyncio.to_thread`.

    mode       memory                      pids               cpu              disk
    cgroup2    memory.max, swap.max=0      pids.max           cpu.max          (tmpfs size, RLIMIT_FSIZE)
    cgroup1    memory.limit_in_bytes(+sw)  pids.max           cfs_quota_us     (tmpfs size, RLIMIT_FSIZE)
    rlimit     RLIMIT_AS per process       RLIMIT_NPROC (*)   RLIMIT_CPU (s)   (tmpfs size, RLIMIT_FSIZE)

(*) only for a non-root host user: the kernel does not enforce RLIMIT_NPROC for host uid 0 (the agent), and the
    commands of uid-separated sandboxes are host uid 1000 in every sandbox, so one count would span all sandboxes.
    `enforces_pids` is False when the sandboxes run as root on the host and only rlimits are available.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.sandbox.base import SandboxSpec

log = logging.getLogger("agentrl.sandbox")

CPU_PERIOD_US = 100_000
# Joins every cgroup.procs file given before "--" (writing 0 moves the writing process), then execs the rest.
_JOIN = 'while [ "$1" != "--" ]; do echo 0 > "$1" || exit 125; shift; done; shift; exec "$@"'
MODES = ("auto", "cgroup2", "cgroup1", "rlimit")
AGENT, COMMANDS = "agent", "commands"  # the children of a separated sandbox cgroup
AGENT_PIDS = 512  # the agent's own pids.max (threads: one per connection, the reaper): outside the commands' budget


@dataclass(frozen=True)
class LimitPlan:
    """The limits of one sandbox: the cgroups created for it and the rlimits its first process gets."""

    mode: str
    cgroups: tuple[str, ...] = ()  # the sandbox's directories, one per hierarchy (pids first); removed with children
    rlimits: tuple[tuple[str, int], ...] = ()  # (prlimit option name, value)
    prlimit: str | None = None
    separated: bool = False  # each directory has an `agent` and a `commands` child (module docstring)

    @property
    def launch_cgroups(self) -> tuple[str, ...]:
        """Where the sandbox's first process (bubblewrap) goes: the `agent` children when separated."""
        return tuple(f"{cg}/{AGENT}" for cg in self.cgroups) if self.separated else self.cgroups

    @property
    def command_cgroups(self) -> tuple[str, ...]:
        return tuple(f"{cg}/{COMMANDS}" for cg in self.cgroups) if self.separated else self.cgroups

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` prefixed with the cgroup-join shell and prlimit."""
        if self.rlimits and self.prlimit:
            argv = [self.prlimit, *(f"--{name}={value}" for name, value in self.rlimits), "--", *argv]
        if self.cgroups:
            argv = ["/bin/sh", "-c", _JOIN, "sh", *(f"{cg}/cgroup.procs" for cg in self.launch_cgroups), "--", *argv]
        return argv


@dataclass
class Limiter:
    """Creates per-sandbox limits with one mechanism. `parents` are the cgroup dirs sandboxes are created under."""

    mode: str
    parents: tuple[str, ...] = ()
    prlimit: str | None = field(default_factory=lambda: shutil.which("prlimit"))

    @property
    def enforces_pids(self) -> bool:
        return self.mode != "rlimit" or os.geteuid() != 0

    @property
    def can_separate(self) -> bool:
        """Whether `prepare(..., separate=True)` gives commands a cgroup of their own (cgroup modes)."""
        return self.mode != "rlimit"

    def prepare(self, sandbox_id: str, spec: SandboxSpec, *, separate: bool = False) -> LimitPlan:
        """Create the sandbox's cgroups (if any) with its limits; return how to launch into them. `separate`: the
        limits go on a `commands` child and the launch goes into an `agent` child (module docstring)."""
        rlimits = [("core", 0), ("fsize", spec.disk_bytes)]
        if self.mode == "rlimit":
            cpu_s = max(1, math.ceil(spec.ttl_s * spec.cpus))
            rlimits += [("as", spec.memory_bytes), ("cpu", cpu_s)]
            if os.geteuid() != 0:  # see (*) in the module docstring
                rlimits.append(("nproc", spec.pids))
            return LimitPlan(self.mode, (), tuple(rlimits), self.prlimit)
        dirs = []
        try:
            for parent in self.parents:
                path = os.path.join(parent, sandbox_id)
                os.mkdir(path)
                dirs.append(path)
                if separate:
                    _separate(self.mode, path, spec)
                else:
                    _apply(self.mode, path, spec)
        except OSError:
            remove_cgroups(dirs)
            raise
        # pids first: its cgroup.procs is the authoritative process list used by kill_cgroups
        dirs.sort(key=lambda d: 0 if "/pids" in d or self.mode == "cgroup2" else 1)
        return LimitPlan(self.mode, tuple(dirs), tuple(rlimits), self.prlimit, separate)


def _separate(mode: str, path: str, spec: SandboxSpec) -> None:
    """`agent` and `commands` children of the sandbox cgroup `path`; the spec's limits on `commands` only."""
    if mode == "cgroup2":  # controllers must be enabled in the sandbox cgroup for its children to get them
        enabled = Path(path, "cgroup.controllers").read_text().split()
        _write(f"{path}/cgroup.subtree_control", " ".join(f"+{c}" for c in ("memory", "pids", "cpu") if c in enabled))
    for child in (AGENT, COMMANDS):
        os.mkdir(f"{path}/{child}")
    _apply(mode, f"{path}/{COMMANDS}", spec)
    if Path(path, AGENT, "pids.max").exists():
        _write(f"{path}/{AGENT}/pids.max", str(AGENT_PIDS))


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _apply(mode: str, path: str, spec: SandboxSpec) -> None:
    p = Path(path)
    quota = max(1000, int(spec.cpus * CPU_PERIOD_US))
    if mode == "cgroup2":
        _write(f"{path}/memory.max", str(spec.memory_bytes))
        if (p / "memory.swap.max").exists():
            _write(f"{path}/memory.swap.max", "0")
        _write(f"{path}/pids.max", str(spec.pids))
        if (p / "cpu.max").exists():
            _write(f"{path}/cpu.max", f"{quota} {CPU_PERIOD_US}")
        return
    if (p / "memory.limit_in_bytes").exists():
        _write(f"{path}/memory.limit_in_bytes", str(spec.memory_bytes))
        try:  # memory+swap: exists only with swap accounting
            _write(f"{path}/memory.memsw.limit_in_bytes", str(spec.memory_bytes))
        except OSError:
            pass
    if (p / "pids.max").exists():
        _write(f"{path}/pids.max", str(spec.pids))
    if (p / "cpu.cfs_quota_us").exists():
        _write(f"{path}/cpu.cfs_period_us", str(CPU_PERIOD_US))
        _write(f"{path}/cpu.cfs_quota_us", str(quota))


# ---------------------------------------------------------------- detection


def detect(preference: str = "auto", cgroup_root: str = "/sys/fs/cgroup") -> Limiter:
    """The first mechanism in cgroup2, cgroup1, rlimit that works here (or exactly `preference`). Logs the choice."""
    if preference not in MODES:
        raise ValueError(f"limits={preference!r}: choose one of {', '.join(MODES)}")
    tried: list[str] = []
    for mode, probe in (("cgroup2", _probe_v2), ("cgroup1", _probe_v1)):
        if preference not in ("auto", mode):
            continue
        try:
            parents = probe(cgroup_root)
            log.info("sandbox limits: %s under %s", mode, ", ".join(parents))
            return Limiter(mode, parents)
        except (OSError, ValueError) as e:
            tried.append(f"{mode}: {e}")
    if preference not in ("auto", "rlimit"):
        raise ValueError(f"limits={preference!r} is not usable here ({'; '.join(tried)}); use limits='auto'")
    limiter = Limiter("rlimit")
    log.warning("sandbox limits: rlimits only (no writable cgroup with memory+pids: %s); memory is per process, "
                "CPU is a time budget not a rate%s", "; ".join(tried) or "skipped",
                "" if limiter.enforces_pids else ", and the pids limit is NOT enforced for host uid 0")
    if limiter.prlimit is None:
        log.warning("prlimit (util-linux) not found: sandboxes start without rlimits")
    return limiter


def _probe_v2(root: str) -> tuple[str, ...]:
    controllers = Path(root, "cgroup.controllers").read_text().split()
    missing = {"memory", "pids"} - set(controllers)
    if missing:
        raise ValueError(f"{root} lacks controllers {sorted(missing)}")
    wanted = " ".join(f"+{c}" for c in ("memory", "pids", "cpu") if c in controllers)
    parent = Path(root, "agentrl")
    parent.mkdir(exist_ok=True)
    enabled = Path(root, "cgroup.subtree_control").read_text().split()
    if not {"memory", "pids"} <= set(enabled):
        _write(f"{root}/cgroup.subtree_control", wanted)
    _write(f"{parent}/cgroup.subtree_control", wanted)
    _probe_child(str(parent), "pids.max")
    return (str(parent),)


def _own_v1_paths() -> dict[str, str]:
    own: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for ctrl in ctrls.split(","):
            own[ctrl] = path
    return own


def _probe_v1(root: str) -> tuple[str, ...]:
    own = _own_v1_paths()
    parents = []
    for ctrl, probe_file in (("memory", "memory.limit_in_bytes"), ("pids", "pids.max"), ("cpu", "cpu.cfs_quota_us")):
        hier = Path(root, ctrl)
        if not (hier / "cgroup.procs").exists() or (hier / "cgroup.controllers").exists():
            if ctrl == "cpu":
                continue  # CPU rate limiting is optional
            raise ValueError(f"no cgroup v1 {ctrl} hierarchy at {hier}")
        parent = Path(str(hier) + own.get(ctrl, "/").rstrip("/"), "agentrl")
        parent.mkdir(exist_ok=True)
        _probe_child(str(parent), probe_file)
        parents.append(str(parent))
    return tuple(parents)


def v1_at_root(name: str, cgroup_root: str = "/sys/fs/cgroup") -> Limiter:
    """A cgroup v1 limiter whose parents are `<hierarchy>/<name>` at the root of the memory, pids and (optional) cpu
    hierarchies, the same path in each: what a container engine's cgroupfs driver takes as a cgroup parent (the
    docker backend's resource separation). Raises ValueError when a hierarchy is missing or not writable."""
    parents = []
    for ctrl, probe_file in (("pids", "pids.max"), ("memory", "memory.limit_in_bytes"), ("cpu", "cpu.cfs_quota_us")):
        hier = Path(cgroup_root, ctrl)
        if not (hier / "cgroup.procs").exists() or (hier / "cgroup.controllers").exists():
            if ctrl == "cpu":
                continue
            raise ValueError(f"no cgroup v1 {ctrl} hierarchy at {hier}")
        parent = hier / name
        parent.mkdir(exist_ok=True)
        _probe_child(str(parent), probe_file)
        parents.append(str(parent))
    return Limiter("cgroup1", tuple(parents))


def _probe_child(parent: str, probe_file: str) -> None:
    child = Path(parent, f"probe-{os.getpid()}")
    child.mkdir(exist_ok=True)
    try:
        if not (child / probe_file).exists():
            raise ValueError(f"{child} has no {probe_file}")
    finally:
        child.rmdir()


# ---------------------------------------------------------------- teardown


def _pids(cgroup: str) -> list[int]:
    try:
        return [int(p) for p in Path(cgroup, "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _tree(cgroup: str) -> list[str]:
    """`cgroup` and its descendants, deepest first (the order rmdir needs)."""
    out: list[str] = []
    for parent, dirs, _ in os.walk(cgroup, topdown=False):
        out += [os.path.join(parent, d) for d in dirs]
    return out + [cgroup]


def oom_kills(cgroups: tuple[str, ...] | list[str]) -> int:
    """How many processes the kernel OOM-killed in these cgroups (cgroup v2 memory.events oom_kill; cgroup v1
    memory.oom_control oom_kill, kernels >= 4.13). 0 when unknown."""
    return oom_kills_known(cgroups) or 0


def oom_kills_known(cgroups: tuple[str, ...] | list[str]) -> int | None:
    """oom_kills, or None when no cgroup reports the counter (no memory controller, a kernel before 4.13, a cgroup
    already gone): then nothing says whether the OOM killer fired, and a SIGKILL proves nothing."""
    total, known = 0, False
    for cg in cgroups:
        for name in ("memory.events", "memory.oom_control"):
            try:
                text = Path(cg, name).read_text()
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    total += int(value)
                    known = True
    return total if known else None


def kill_cgroups(cgroups: tuple[str, ...] | list[str], *, deadline_s: float = 5.0) -> None:
    """SIGKILL every process in the sandbox's cgroups until they are empty (or the deadline passes)."""
    if not cgroups:
        return
    first = cgroups[0]
    if os.path.exists(f"{first}/cgroup.kill"):
        try:
            _write(f"{first}/cgroup.kill", "1")
        except OSError:
            pass
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        pids = [pid for cg in _tree(first) for pid in _pids(cg)]  # cgroup v1 lists only a cgroup's own processes
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.002)
    log.warning("processes still in cgroup %s after %.1fs", first, deadline_s)


def remove_cgroups(cgroups: tuple[str, ...] | list[str], *, deadline_s: float = 5.0) -> None:
    """Kill what is left and rmdir each cgroup, retrying while the kernel finishes tearing processes down."""
    kill_cgroups(cgroups, deadline_s=deadline_s)
    for cg in [d for top in cgroups for d in _tree(top)]:
        end = time.monotonic() + deadline_s
        while True:
            try:
                os.rmdir(cg)
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if time.monotonic() > end:
                    log.warning("could not remove cgroup %s: %s", cg, e)
                    break
                time.sleep(0.002)
