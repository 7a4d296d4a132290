"""The `commands` cgroup of a resource-separated sandbox (`CommandCgroup`: start commands in it, kill through it) and
the kernel's counters of what the commands used (`ResourceCounters`, /exec's `resources`)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Set

from .kill import kill_pids, kill_until_gone
from .procfs import close_fds

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the agent's start-up time)
if TYPE_CHECKING:
    from typing import TypeVar

    _T = TypeVar("_T")


def _write_file(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class CommandCgroup:
    """The `commands` cgroup of a resource-separated sandbox (`--cgroups`, module docstring): starts commands in it,
    kills everything in it. Disabled (`enabled` False) without --cgroups: commands share the agent's cgroup."""

    def __init__(self, spec: str | None) -> None:
        self.version, self.dirs = "", []
        if not spec:
            return
        version, _, rest = spec.partition(":")
        dirs = [d for d in rest.split(":") if d]
        if version not in ("v1", "v2") or not dirs or (version == "v2" and len(dirs) != 1):
            sys.exit(f"agent: --cgroups {spec!r}: use v1:DIR[:DIR...] or v2:DIR, each DIR holding agent/ and commands/")
        for d in dirs:
            if not (os.path.isdir(f"{d}/agent") and os.path.isdir(f"{d}/commands")):
                sys.exit(f"agent: --cgroups: {d} has no agent/ and commands/ children")
        self.version, self.dirs = version, dirs

    @property
    def enabled(self) -> bool:
        return bool(self.dirs)

    def start(self, start: Callable[[], _T]) -> _T:
        """Call `start()` (which forks) so that the child is born in `commands`. v1: this thread joins `commands`
        in every hierarchy for the fork and returns to `agent` right after (its CPU time, memory charges and pids
        count stay the agent's); v2 joins in the child (`wrap`)."""
        if self.version != "v1":
            return start()
        try:  # "0": the writing thread itself, which the kernel moves without its global threadgroup lock
            for d in self.dirs:
                _write_file(f"{d}/commands/tasks", "0")
            return start()
        finally:
            for d in self.dirs:
                _write_file(f"{d}/agent/tasks", "0")

    def wrap(self, argv: list[str]) -> list[str]:
        """v2: `argv` behind a shell that moves itself into `commands` first (as uid 0, before setpriv)."""
        if self.version != "v2":
            return argv
        return ["/bin/sh", "-c", 'echo 0 > "$0" || exit 125; exec "$@"', f"{self.dirs[0]}/commands/cgroup.procs",
                *argv]

    def pids(self) -> set[int]:
        """Processes in `commands` (the first directory: the pids hierarchy under v1). Never the agent itself: under
        v1 its pid is listed while one of its threads is in there to spawn."""
        with open(f"{self.dirs[0]}/commands/cgroup.procs") as f:
            return {int(p) for p in f.read().split()} - {os.getpid()}

    def _charged(self) -> int:
        """pids.current of `commands`: killed processes not yet reaped by the agent still hold their pid."""
        try:
            with open(f"{self.dirs[0]}/commands/pids.current") as f:
                return int(f.read())
        except (OSError, ValueError):
            return 0

    def kill(self, deadline_s: float, uncounted: Set[int] = frozenset()) -> int:
        """SIGKILL everything in `commands` until it is empty and its pids are released (the reaper reaped them; not
        waited for past the deadline), cgroup.kill first where the kernel has it; returns how many distinct processes
        were killed, `uncounted` (the spawner) aside. No fork: a full pids.max cannot stop it."""
        if self.version == "v2" and os.path.exists(f"{self.dirs[0]}/commands/cgroup.kill"):
            _write_file(f"{self.dirs[0]}/commands/cgroup.kill", "1")
        return kill_until_gone(self.pids, kill_pids, deadline_s, set(uncounted),
                               "in the commands cgroup", settled=lambda: self._charged() == 0)


class ResourceCounters:
    """What the kernel counted against the commands during one command (`--cgroups`: the `commands` cgroup's event
    counters; every layout: the filesystems they write), reported in /exec's `resources` so that the runner can
    raise `resource_exhaustion` from the backend's own counts, not from an exit code the policy shapes or that was
    lost. Keys (only those that moved): oom_kills (memory.events / v1 memory.oom_control oom_kill), pids_max
    (pids.events max: a fork refused by pids.max), cpu_throttled_periods and cpu_throttled_us (cpu.stat), disk_full
    (1: the workspace or an extra writable directory has no free block or inode left after the command),
    shm_bytes (what /dev/shm holds after the command, when it holds anything)."""

    COUNTERS = (("memory.events", "oom_kill", "oom_kills"), ("memory.oom_control", "oom_kill", "oom_kills"),
                ("pids.events", "max", "pids_max"), ("cpu.stat", "nr_throttled", "cpu_throttled_periods"),
                ("cpu.stat", "throttled_usec", "cpu_throttled_us"), ("cpu.stat", "throttled_time", "cpu_throttled_ns"))

    def __init__(self, cgroup: CommandCgroup, roots: tuple[str, ...]) -> None:
        self.roots = roots
        self._own: list[tuple[str, int]] = []  # `commands`' counter files, opened once (pread per read)
        for d in cgroup.dirs:
            for name in dict.fromkeys(c[0] for c in self.COUNTERS):
                try:
                    self._own.append((name, os.open(f"{d}/commands/{name}", os.O_RDONLY)))
                except OSError:
                    continue
        self._files: dict[str, int] = {}  # relayed: the commands' container's counter files, opened by its spawner
        self._lock = threading.Lock()

    def use_files(self, files: dict[str, int]) -> None:
        """Read these descriptors (name -> fd, from a spawner in the commands' container) from now on."""
        with self._lock:
            old, self._files = self._files, dict(files)
        close_fds(tuple(old.values()))

    def read(self) -> dict[str, int]:
        out: dict[str, int] = {}
        texts = []
        with self._lock:
            for name, fd in [*self._own, *self._files.items()]:
                try:
                    texts.append((name, os.pread(fd, 1 << 16, 0).decode()))
                except OSError:
                    continue
        for name, text in texts:
            values = dict(line.split(None, 1) for line in text.splitlines() if " " in line)
            for file, key, ours in self.COUNTERS:
                if file == name and key in values:
                    out[ours] = out.get(ours, 0) + int(values[key])
        return out

    def delta(self, before: dict[str, int]) -> dict[str, int]:
        after = self.read()
        out = {k: v - before.get(k, 0) for k, v in after.items() if v > before.get(k, 0)}
        if "cpu_throttled_ns" in out:  # cgroup v1 counts nanoseconds
            out["cpu_throttled_us"] = out.get("cpu_throttled_us", 0) + out.pop("cpu_throttled_ns") // 1000
        for root in self.roots:
            try:
                st = os.statvfs(root)
            except OSError:
                continue
            if st.f_blocks and (st.f_bavail == 0 or (st.f_files and st.f_favail == 0)):
                out["disk_full"] = 1
        try:
            st = os.statvfs("/dev/shm")
            used = (st.f_blocks - st.f_bfree) * st.f_frsize
            if used:
                out["shm_bytes"] = used
        except OSError:
            pass
        return out
