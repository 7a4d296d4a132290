#!/usr/bin/env python3
"""The in-sandbox agent: a single-file, stdlib-only HTTP/1.1 server that runs INSIDE a sandbox.

It is copied verbatim into bubblewrap sandboxes, Docker containers and Kubernetes pods, so it imports nothing
outside the Python 3.11 standard library and nothing of agentrl. It owns: executing commands (process groups,
deadlines, output caps), reading/writing files confined to the workspace (and the backend's extra writable
directories, `--writable DIR[:DIR...]`, e.g. /repo), killing what commands leave behind, and
answering health checks. It does not own isolation or limits: the backend that started it applies those around it.

    agent.py --unix PATH --workspace DIR [--run-as UID:GID] [--writable D1:D2] [--cgroups v1|v2:D1[:D2...]]
                                                                               (local / docker: unix socket)
    agent.py --tcp HOST:PORT --token-file F --workspace DIR [--run-as U:G] [--relay NAME]
                                                                    (kubernetes: bearer token required)
    [--exit-grace S]: how long pipes held by a command's leftovers may delay its answer after it exits (0.1 s)
    [--handshake-timeout S]: how long a new connection may take to send its first request head (10 s)

uid separation (`--run-as UID:GID`, the agent itself runs as uid 0 with only CAP_SETUID, CAP_SETGID, CAP_KILL and,
where the backend's workspace is not pre-owned, CAP_CHOWN): every command runs as UID:GID with no supplementary
groups and no_new_privs, so it can neither signal, ptrace nor read the agent (its /proc entries, environ, fds), its
token or its socket directory; file requests are served with the thread's fsuid/fsgid set to UID:GID, so they get
exactly the command user's access (a symlink swapped in by a command cannot make the agent read a root-only file),
and what they create is owned by UID:GID. Without --run-as, commands run as the agent's own uid: nothing separates
them from it (`uid_separated: false` in /health). The agent is a child subreaper: orphans of commands are re-parented
to it (and reaped by it), so "every process a command left behind" is well defined in both modes.

The command spawner (separated by uid or by cgroup): commands are started by a persistent fork server per sandbox
(`Spawner`, SPAWNER_SOURCE), started once by the agent, that already is UID:GID (no groups, no capabilities,
no_new_privs) and in `commands`, and is non-dumpable (a command cannot ptrace it or read its memory); it
posix_spawns (vfork) each command, so a command costs no setpriv (or cgroup shell) exec of its own. It talks only to
the agent (a socketpair; the command's pipes travel with SCM_RIGHTS), reports each command's pid, pidfd and exit
code, and is restarted for the next exec when /kill_all or the policy killed it. Where it cannot start, commands
start through setpriv as before.

The syscall policy (SECCOMP_SOURCE): the spawner installs one allow-list seccomp filter on itself before it serves,
so every command on every backend runs under it; its refusals go to the agent (seccomp user notification, the
listener passed with the spawner's ready answer), which answers them and counts them (`SeccompWatch`). The calls
that can signal another process go to the agent too and are let through; it counts those whose target is outside
the policy's own processes (`SignalTargets`). Attempts to reach a network the sandbox does not have are counted from
the network namespace's own counters (`NetAttempts`).

Resource separation (`--cgroups v1:D1:D2...` or `--cgroups v2:D`, each D a sandbox cgroup directory with `agent` and
`commands` children, the agent in `agent`): every command starts in `commands`, which carries the sandbox's memory,
pids and CPU limits, so a command filling them cannot take the agent's (`resources_separated` in /health). The
spawner is started in `commands` (cgroup v1: the spawning thread joins `commands`, its `tasks` files, for the fork
and returns to `agent`; v2, no per-thread membership: through `/bin/sh -c` which joins `commands` before it execs),
and so is every command it starts; without the spawner each command is started that way. Killing is then done
through the cgroup: `cgroup.kill` (v2) or SIGKILL of every process in `commands`' cgroup.procs, round after round, no
fork needed, until the reaper has released their pids; and /kill_all removes the sandbox's SysV IPC objects (shared
memory charged to the commands would otherwise outlive every process).

Commands in another container (`--relay NAME`, kubernetes, and docker without host cgroups): the agent runs in a
container of its own and every command runs in the commands' container (a pod's `sandbox`, docker's
`<name>-cmd`), under that container's limits
(`resources_separated`). The spawner is started there by the relay (RELAY_SOURCE, that container's main process, uid
0 with only CAP_SETUID / CAP_SETGID) on the agent's request over the abstract unix socket NAME; each side checks the
other's uid (SO_PEERCRED), so a command can neither ask the relay for a process nor pose as a relay. The pod shares
one pid namespace, so /kill_all reaches the commands; pids are counted per pod, so the agent keeps PARKED_WORKERS
threads from start-up and /kill_all signals the command user from its own thread (kill_all_as: raw per-thread
setresuid, kill(-1)): neither needs a new thread or process when the commands hold every pid. There is no fallback
to starting commands itself. The commands' orphans go to that pid namespace's init, not to the agent: a command that
kills or stops its own spawner (`kill -9 -1`) keeps its output, but its exit code is lost (126 and a note: the
policy's doing).

Protocol (JSON bodies, /file's raw bytes; HTTP/1.1 keep-alive with Content-Length). One acceptor thread holds every
new connection until its first request head is complete (bounded count, size and time) and checks the bearer token;
only an authorized connection gets a worker thread (at most MAX_WORKERS), so a connection flood from inside the
sandbox costs no thread:

    GET  /health   -> {ok, pid, version, workspace, writable, uid_separated, command_uid, resources_separated,
                       commands_apart, judge_python, seccomp}   seccomp: the syscall policy's mode (notify, errno,
                       "none: why"; see SECCOMP_SOURCE); commands_apart: --relay, commands run in another container;
                       judge_python: the path of `judge-python` next to this file when the backend
                       put an execute-only interpreter copy there (root's, no read bit: a process the command user
                       starts from it is non-dumpable from its execve on, the kernel's rule for unreadable
                       binaries), else null
    POST /exec     {cmd: str|list, timeout, cwd, env, stdin, output_limit, kill_leftovers}
                   -> {exit_code, stdout, stderr, timed_out, truncated, duration_s, probes, resources}
                   kill_leftovers: after the command, kill every process of the command user (as /kill_all)
                   probes: what was observed since the last report, by name: the syscall policy's refusals
                   (SeccompWatch), signal_foreign / sigio_foreign / signal_unresolved (SignalTargets) and
                   network_attempt (NetAttempts), background processes' included;
                   resources: the commands' counters that moved during the command (ResourceCounters)
    POST /kill_all {} -> {killed: n, probes}   every process in `commands` (resource-separated), else every
                   process of the command user (uid-separated) or every descendant of the agent (single uid), until
                   none is left;
                   also those of concurrent execs; then the SysV IPC objects of the command user; 409 (kind
                   "survivors", "policy processes survived kill") when some survive SIGKILL for 5 s
    PUT  /file?path=P&mode=M   raw body (Content-Length: the file's size) -> {ok, bytes}   P percent-encoded
                   (UTF-8), M decimal (default 420 = 0o644); the body is written FILE_CHUNK bytes at a time as it
                   arrives (the agent never holds the file); an error met on the way (path refused, disk full) is
                   answered after the rest of the body was read and dropped; a body cut short leaves the file
                   with what arrived (the connection is gone: the host knows the write failed)
    GET  /file?path=P&max=N    -> 200 application/octet-stream, Content-Length: S + 1, where S is the file's size
                   by fstat once opened; the body is S bytes of the file, streamed FILE_CHUNK at a time, then one
                   status byte: b"." the file still had exactly S bytes at the end, b"!" it changed size while
                   read (or a read failed): the bytes before it are not the file (zero-padded to S when it shrank,
                   so the answer is never cut short and the host never waits). N (optional): a file larger than N
                   bytes is refused with 413 kind "too_large" naming N, before anything is sent. No limit of the
                   agent's own: its memory for a transfer is FILE_CHUNK whatever the size.
    errors         -> {error: msg[, kind]} with 400 (bad request; kind "not_regular" for a directory, FIFO, socket,
                   device or symlink; kind "bad_path" for a path that cannot be resolved: more than 40 symlinks,
                   too long, NUL, not encodable), 401 (token), 403 (path outside workspace, or not accessible to the
                   command user), 404 (no such file; kind "no_route": no such route), 409 (kind "survivors"),
                   413 (kind "too_large"), 431 (request head too large), 500 (a bug in the agent), 503
                   (MAX_WORKERS connections busy)

Paths are resolved without recursion (at most 40 symlinks, like the kernel) and opened with openat2
RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS below the workspace root where the kernel has it; files are opened
O_NONBLOCK and checked to be regular with fstat (so a FIFO cannot block a read).

After binding, the agent prints READY_LINE on stdout so the starter needs no polling.
"""

from __future__ import annotations

import array
import ctypes
import errno
import json
import os
import queue
import select
import selectors
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

VERSION = 2  # 2: files move as raw bytes (PUT / GET /file); 1 had the JSON /write and /read
READY_LINE = "AGENTRL-AGENT-READY"
MAX_BODY = 256 * 1024 * 1024  # JSON request bodies above this are refused with 413 (file bodies stream: no cap)
MAX_OUTPUT = 64 * 1024 * 1024  # an exec's output_limit (bytes kept per stream) is capped at this
FILE_CHUNK = 1 << 20  # PUT/GET /file move a file this many bytes at a time: the agent's memory for a transfer
DEFAULT_OUTPUT_LIMIT = 64 * 1024
EXIT_GRACE_S = 0.1  # after the main process exits, how long pipes held by background processes may stay open
DRAIN_AFTER_KILL_S = 0.5  # after SIGKILL of the group, how long to keep collecting output
CHUNK = 1 << 16
KILL_ALL_DEADLINE_S = 5.0  # /kill_all gives up (409) when processes survive SIGKILL this long (stuck in the kernel)
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 36, 38
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 409: "Conflict", 413: "Payload Too Large",
            431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}


class HTTPError(Exception):
    """An answer other than 200. `kind` (optional) is a machine-readable class the client maps to an exception."""

    def __init__(self, status: int, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


# ---------------------------------------------------------------- identity


class Identity:
    """Who commands and file requests run as: `run_as` (uid, gid) when uid-separated, else the agent's own ids.

    Separated, the agent must be uid 0: commands get uid/gid via Popen (no supplementary groups), and file requests
    run with the serving thread's fsuid/fsgid switched to uid/gid (`with identity.files():`), which also drops the
    thread's filesystem capabilities. fsuid is per thread on Linux, so concurrent requests do not interfere."""

    def __init__(self, run_as: tuple[int, int] | None) -> None:
        self.separated = run_as is not None
        self.uid, self.gid = run_as if run_as is not None else (os.getuid(), os.getgid())
        self._setfsuid = self._setfsgid = None
        self._setpriv: list[str] = []

    def setup(self, libc: ctypes.CDLL, workspace: str, writable: tuple[str, ...] = ()) -> None:
        """Drop supplementary groups, check fsuid switching works, and give the workspace root (and the extra
        writable directories) to the command user."""
        if not self.separated:
            return
        if os.geteuid() != 0:
            sys.exit(f"agent: --run-as {self.uid}:{self.gid} needs the agent to run as uid 0 (with CAP_SETUID and "
                     f"CAP_SETGID); it runs as uid {os.geteuid()}: drop --run-as or start it as root")
        os.setgroups([])
        # util-linux setpriv switches uid in the exec'd child, so Popen keeps using vfork: Popen(user=...) must
        # fork, which copies the agent's page tables (5-10 ms per command on a VM instead of ~1 ms)
        for d in ("/usr/bin", "/bin", "/usr/sbin", "/sbin"):
            if os.access(f"{d}/setpriv", os.X_OK):
                self._setpriv = [f"{d}/setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                                 "--inh-caps=-all", "--no-new-privs", "--"]
                break
        self._setfsuid, self._setfsgid = libc.setfsuid, libc.setfsgid
        self._setfsuid(self.uid)
        if self._setfsuid(0) != self.uid:
            sys.exit("agent: setfsuid() does not work here (CAP_SETUID missing?); cannot separate file access")
        for root in (workspace, *writable):
            self._own(root)

    def _own(self, root: str) -> None:
        st = os.stat(root)
        if (st.st_uid, st.st_gid) != (self.uid, self.gid):
            try:
                os.chown(root, self.uid, self.gid)
            except PermissionError:
                if not st.st_mode & stat.S_IWOTH:
                    sys.exit(f"agent: {root} is owned by {st.st_uid}:{st.st_gid}, not writable by "
                             f"uid {self.uid}, and chown needs CAP_CHOWN: pre-own it or grant CAP_CHOWN")

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` as the command user: through setpriv when there is one (else `popen_kwargs` does it)."""
        return [*self._setpriv, *argv] if self._setpriv else argv

    def popen_kwargs(self) -> dict:
        if not self.separated or self._setpriv:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def files(self) -> "_AsCommandUser":
        """Context manager: this thread's file accesses are the command user's until it exits."""
        return _AsCommandUser(self)


class _AsCommandUser:
    def __init__(self, identity: Identity) -> None:
        self.identity = identity

    def __enter__(self) -> None:
        i = self.identity
        if i.separated:
            i._setfsgid(i.gid)
            i._setfsuid(i.uid)

    def __exit__(self, *exc: object) -> None:
        i = self.identity
        if i.separated:
            i._setfsuid(0)
            i._setfsgid(0)


def _prctl_setup() -> ctypes.CDLL:
    """no_new_privs (no setuid binary or file capability can raise a command's privileges) and child subreaper
    (orphans of commands are re-parented to the agent, so they stay findable and get reaped). Best effort."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    return libc


# ---------------------------------------------------------------- resource separation


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

    def start(self, start):  # start: () -> Popen
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

    def kill(self, deadline_s: float, uncounted: set = frozenset()) -> int:
        """SIGKILL everything in `commands` until it is empty and its pids are released (the reaper reaped them; not
        waited for past the deadline), cgroup.kill first where the kernel has it; returns how many distinct processes
        were killed, `uncounted` (the spawner) aside. No fork: a full pids.max cannot stop it."""
        seen: set[int] = set()
        end = time.monotonic() + deadline_s
        if self.version == "v2" and os.path.exists(f"{self.dirs[0]}/commands/cgroup.kill"):
            _write_file(f"{self.dirs[0]}/commands/cgroup.kill", "1")
        while True:
            live = self.pids()
            if not live and (self._charged() == 0 or time.monotonic() > end):
                return len(seen - uncounted)
            seen |= live
            if time.monotonic() > end:
                raise HTTPError(409, f"policy processes survived kill: {len(live)} process(es) in the commands "
                                     f"cgroup survived SIGKILL for {deadline_s:g}s: {sorted(live)[:10]}", "survivors")
            for pid in live:
                _kill(pid)
            time.sleep(0.001)



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
        _close(tuple(old.values()))

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


IPC_RMID = 0
_SYS_SETRESUID = {"x86_64": 117, "aarch64": 147}  # raw syscall numbers: glibc's setresuid switches every thread


def remove_sysv_ipc(libc: ctypes.CDLL, uid: int) -> int:
    """Remove every SysV shared memory segment, semaphore set and message queue of this IPC namespace that `uid`
    (the command user) may remove; returns how many. A segment no process holds stays charged to the commands'
    memory until removed. The agent (uid 0 without CAP_SYS_ADMIN) may remove only objects it owns, so this thread
    alone (raw setresuid) takes euid `uid` for the calls and returns to 0."""
    ids: list[tuple[str, int]] = []
    for kind in ("shm", "sem", "msg"):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        ids += [(kind, int(row.split()[1])) for row in rows if row.split()]
    if not ids:
        return 0
    switch = uid != os.geteuid()
    if switch and not _thread_uid_switch(libc, -1, uid):  # euid only
        return 0
    removed = 0
    try:
        for kind, ident in ids:
            if kind == "shm":
                rc = libc.shmctl(ident, IPC_RMID, None)
            elif kind == "sem":
                rc = libc.semctl(ident, 0, IPC_RMID)
            else:
                rc = libc.msgctl(ident, IPC_RMID, None)
            removed += rc == 0
    finally:
        if switch:
            _thread_uid_back(libc)
    return removed


def kill_all_as(libc: ctypes.CDLL, uid: int) -> bool:
    """kill(-1, SIGKILL) from this thread alone as `uid`: real and effective uid `uid` (the effective capabilities,
    CAP_KILL included, drop with euid 0), saved uid 0 to come back. kill(-1) then reaches every process whose real
    or saved uid is `uid` (never the agent: the caller's own thread group is spared) in one pass of the kernel. False
    when this cannot be done here (not root, unknown syscall)."""
    if os.geteuid() != 0 or uid == 0 or not _thread_uid_switch(libc, uid, uid):
        return False
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:  # ESRCH: no process of that uid is left
        pass
    finally:
        _thread_uid_back(libc)
    return True


def _thread_uid_switch(libc: ctypes.CDLL, ruid: int, euid: int) -> bool:
    """This thread alone (raw setresuid: glibc's switches every thread) takes real uid `ruid` (-1: unchanged) and
    effective uid `euid`, keeping saved uid 0 to come back with _thread_uid_back(). False when it cannot."""
    nr = _SYS_SETRESUID.get(os.uname().machine)
    return nr is not None and libc.syscall(nr, ruid, euid, -1) == 0


def _thread_uid_back(libc: ctypes.CDLL) -> None:
    if libc.syscall(_SYS_SETRESUID[os.uname().machine], 0, 0, -1) != 0:  # pragma: no cover - 0 is the saved uid
        os._exit(70)  # a thread stuck as the command user must not serve another request


# ---------------------------------------------------------------- paths

MAX_PATH_CHARS = 4096  # a requested path longer than this is refused (the kernel's PATH_MAX)
MAX_SYMLINK_HOPS = 40  # symbolic links followed while resolving one path (the kernel's own limit, ELOOP)
MAX_PATH_STEPS = 4096  # path components looked at while resolving one path, symlink targets included
SYS_OPENAT2 = 437  # the same number on every architecture (Linux >= 5.6)
RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x02, 0x04, 0x08


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _Openat2:
    """openat2(2) through ctypes, probed once: unusable where the kernel or a seccomp filter lacks it."""

    _usable: bool | None = None
    _libc = None

    @classmethod
    def usable(cls) -> bool:
        if cls._usable is None:
            try:
                cls._libc = ctypes.CDLL(None, use_errno=True)
                fd = cls._call(-100, "/", os.O_PATH | os.O_CLOEXEC, 0, 0)  # AT_FDCWD
                os.close(fd)
                cls._usable = True
            except (OSError, AttributeError):
                cls._usable = False
        return cls._usable

    @classmethod
    def _call(cls, dirfd: int, path: str, flags: int, mode: int, resolve: int) -> int:
        how = _OpenHow(flags, mode, resolve)
        fd = cls._libc.syscall(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dirfd), ctypes.c_char_p(os.fsencode(path)),
                               ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
        return fd

    @classmethod
    def beneath(cls, root: str, rel: str, flags: int, mode: int) -> int:
        """Open `rel` under the directory `root` with no symlink followed and nothing outside `root` reached."""
        dirfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return cls._call(dirfd, rel, flags, mode, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
        finally:
            os.close(dirfd)


def _bad_path(shown: object, why: str) -> HTTPError:
    return HTTPError(400, f"path {shown!r} {why}", "bad_path")


def real_path(path: str, shown: object) -> str:
    """os.path.realpath of the absolute `path` (missing components taken literally), without recursion and bounded:
    at most MAX_SYMLINK_HOPS symbolic links and MAX_PATH_STEPS components; 400 (kind "bad_path") beyond that."""
    todo = [c for c in reversed(path.split("/")) if c]  # a stack: the next component is last
    parts: list[str] = []
    hops = steps = 0
    while todo:
        steps += 1
        if steps > MAX_PATH_STEPS:
            raise _bad_path(shown, f"has more than {MAX_PATH_STEPS} components to resolve (symlink targets included)")
        name = todo.pop()
        if name == ".":
            continue
        if name == "..":
            if parts:
                parts.pop()
            continue
        candidate = "/" + "/".join((*parts, name))
        try:
            st = os.lstat(candidate)
        except OSError:  # missing or not searchable: the rest is taken as written (open answers 404 / 403)
            parts.append(name)
            continue
        if not stat.S_ISLNK(st.st_mode):
            parts.append(name)
            continue
        hops += 1
        if hops > MAX_SYMLINK_HOPS:
            raise _bad_path(shown, f"goes through more than {MAX_SYMLINK_HOPS} symbolic links (a loop or a chain); "
                                   "replace the link by the file")
        target = os.readlink(candidate)
        if target.startswith("/"):
            parts = []
        todo.extend(c for c in reversed(target.split("/")) if c)
    return "/" + "/".join(parts)


def resolve_in_workspace(root: str, path: object, extra: tuple[str, ...] = ()) -> str:
    """The real path of `path` (relative to `root`, or absolute inside it or inside one of the `extra` writable
    directories); 403 when it resolves outside all of them, 400 (kind "bad_path") when it cannot be resolved."""
    if not isinstance(path, str) or not path:
        raise HTTPError(400, "field 'path' must be a non-empty string")
    if "\x00" in path or len(path) > MAX_PATH_CHARS:
        raise _bad_path(path[:200], f"contains a NUL byte or is longer than {MAX_PATH_CHARS} characters")
    try:
        os.fsencode(path)
    except UnicodeError:
        raise _bad_path(path, "is not encodable as a file name") from None
    real = real_path(os.path.join(root, path), path)
    if _root_of(real, (root, *extra)) is None:
        where = " or ".join((root, *extra))
        raise HTTPError(403, f"path {path!r} resolves outside the workspace {where} (to {real}); use a path inside it")
    return real


def _root_of(real: str, roots: tuple[str, ...]) -> str | None:
    inside = [r for r in roots if real == r or real.startswith(r.rstrip("/") + "/")]
    return max(inside, key=len) if inside else None


def open_regular(real: str, roots: tuple[str, ...], flags: int, mode: int, shown: str) -> int:
    """Open the resolved path `real` (inside one of `roots`) as a regular file: never blocks on a FIFO or device
    (O_NONBLOCK), follows no symlink on the way (one swapped in after resolution is refused, not followed: openat2
    RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS where the kernel has it, else O_NOFOLLOW on the last component), and
    refuses anything but a regular file (400, kind "not_regular")."""
    flags |= os.O_NONBLOCK | os.O_CLOEXEC
    root = _root_of(real, roots)
    try:
        if root is not None and _Openat2.usable():
            fd = _Openat2.beneath(root, real[len(root):].lstrip("/") or ".", flags, mode)
        else:
            fd = os.open(real, flags | os.O_NOFOLLOW, mode)
    except OSError as e:
        if e.errno in (errno.ENXIO, errno.EISDIR):
            raise HTTPError(400, f"path {shown!r} is not a regular file ({e.strerror})", "not_regular") from None
        if e.errno in (errno.ELOOP, errno.EXDEV, errno.EAGAIN):  # EAGAIN: openat2 saw a rename race
            raise _bad_path(shown, "changed into a symbolic link while it was opened; try again") from None
        raise
    kind = stat.S_IFMT(os.fstat(fd).st_mode)
    if kind != stat.S_IFREG:
        os.close(fd)
        what = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
                stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}.get(kind, "not a regular file")
        raise HTTPError(400, f"path {shown!r} is not a regular file ({what})", "not_regular")
    os.set_blocking(fd, True)
    return fd


# ---------------------------------------------------------------- exec


class ExecRun:
    """One command: spawn in a new session, pump stdin/stdout/stderr, enforce the deadline and the output cap."""

    def __init__(self, argv: list[str], cwd: str, env: dict[str, str], stdin: bytes | None, limit: int,
                 identity: Identity, cgroup: CommandCgroup | None = None) -> None:
        self.argv, self.cwd, self.env, self.stdin, self.limit = argv, cwd, env, stdin, limit
        self.identity = identity
        self.cgroup = cgroup or CommandCgroup(None)
        self.out = bytearray()
        self.err = bytearray()
        self.truncated = False
        self.timed_out = False

    def start(self) -> subprocess.Popen:
        proc = subprocess.Popen(
            self.cgroup.wrap(self.identity.wrap(self.argv)), cwd=self.cwd, env=self.env, start_new_session=True,
            close_fds=True,
            stdin=subprocess.PIPE if self.stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **self.identity.popen_kwargs(),
        )
        return proc

    def _append(self, buf: bytearray, data: bytes) -> None:
        room = self.limit - len(buf)
        if len(data) > room:
            self.truncated = True
            data = data[: max(room, 0)]
        buf += data

    def pump(self, proc: subprocess.Popen, deadline: float, exited, grace: float = EXIT_GRACE_S) -> bool:
        """Read both pipes until they close and the main process exits. Stops at the deadline (sets timed_out),
        or `grace` seconds after the main process exited while background processes still hold the pipes (a
        command that leaves nothing holding them returns when its pipes close, never waiting for the grace).
        Returns True when the pipes closed and the main process exited (no kill needed). `exited()` says whether
        the main process exited (used only without pidfd; never Popen.poll, which would reap it behind the reaper)."""
        sel = selectors.DefaultSelector()
        bufs = {proc.stdout.fileno(): self.out, proc.stderr.fileno(): self.err}
        for fd in bufs:
            sel.register(fd, selectors.EVENT_READ)
        pending = memoryview(self.stdin or b"")
        stdin_fd = proc.stdin.fileno() if proc.stdin is not None else -1
        if stdin_fd >= 0:
            os.set_blocking(stdin_fd, False)
            sel.register(stdin_fd, selectors.EVENT_WRITE)
        own = getattr(proc, "pidfd", None)  # the spawner's, opened before anything could reap the command
        pidfd = os.dup(own) if own is not None else _pidfd(proc.pid)
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ)
        exited_at = None
        try:
            while bufs or exited_at is None:
                now = time.monotonic()
                if exited_at is None and pidfd is None and exited():
                    exited_at = now
                if now >= deadline:
                    self.timed_out = exited_at is None
                    return False
                wait = deadline - now
                if exited_at is not None:
                    wait = min(wait, exited_at + grace - now)
                    if wait <= 0:
                        return False  # background processes hold the pipes: the caller kills the group
                elif pidfd is None:
                    wait = min(wait, 0.01)  # no pidfd (old kernel): poll for the exit
                for key, _ in sel.select(wait):
                    if key.fd == pidfd:
                        sel.unregister(pidfd)
                        exited_at = time.monotonic()
                    elif key.fd == stdin_fd:
                        pending = self._feed(sel, proc, pending)
                    else:
                        self._read(sel, key.fd, bufs)
            return True
        finally:
            sel.close()
            if pidfd is not None:
                os.close(pidfd)

    def _feed(self, sel: selectors.BaseSelector, proc: subprocess.Popen, pending: memoryview) -> memoryview:
        try:
            pending = pending[os.write(proc.stdin.fileno(), pending[:CHUNK]):]
        except BlockingIOError:
            return pending
        except BrokenPipeError:
            pending = pending[:0]  # the command stopped reading: drop the rest of its stdin
        if not pending:
            sel.unregister(proc.stdin.fileno())
            proc.stdin.close()
        return pending

    def _read(self, sel: selectors.BaseSelector, fd: int, bufs: dict[int, bytearray]) -> None:
        data = os.read(fd, CHUNK)
        if data:
            self._append(bufs[fd], data)
        else:
            sel.unregister(fd)
            del bufs[fd]

    def drain(self, proc: subprocess.Popen, seconds: float) -> None:
        """Collect what is left in the pipes for at most `seconds` (after a kill)."""
        for stream, buf in ((proc.stdout, self.out), (proc.stderr, self.err)):
            os.set_blocking(stream.fileno(), False)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                try:
                    data = os.read(stream.fileno(), CHUNK)
                except BlockingIOError:
                    break
                if not data:
                    break
                self._append(buf, data)


def _prefer_oom_kill(pid: int) -> bool:
    """Make the command (and what it forks from now on) the OOM killer's first choice, so that a memory hog
    dies rather than the agent. Raising oom_score_adj needs no privilege; best effort. Call it as the command user
    (`identity.files()`): after its exec, the command's /proc files belong to that user."""
    try:
        with open(f"/proc/{pid}/oom_score_adj", "w") as f:
            f.write("1000")
        return True
    except OSError:
        return False


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------- the syscall policy

# The syscall policy every command runs under, on every backend (docs/reward-integrity.md, "The syscall policy"): a
# classic-BPF seccomp filter that the command spawner installs on itself before it serves (so every command it
# starts inherits it; no per-command cost). Part of the spawner's program (SPAWNER_PROGRAM) and exec'd by the agent
# for the names of the calls it observes (`SeccompWatch`). Stdlib only (ctypes). An allow-list per architecture
# (x86_64, aarch64; any other architecture, and x32 numbers, are refused): ALLOWED's families are what a task's
# programs need; `clone` only without namespace flags, `socket` not for AF_VSOCK; `clone3` (whose flags the filter
# cannot read) answers ENOSYS
# so libc falls back to clone. Everything else is refused: the PROBES (a task never needs them: kernel keyrings,
# ptrace and reading other processes, mounts and namespaces, bpf, perf, userfaultfd, kexec and modules, io_uring)
# with EPERM, the rest (calls newer or rarer than this list) with ENOSYS, so programs that probe for them fall back.
# With `notify` the refusals go to a listener (SECCOMP_RET_USER_NOTIF) instead: the agent answers them with the same
# errno and counts them, so probing is seen as well as blocked; the SIGNALS (every call that can signal another
# process) go there as well on Linux >= 5.5 and are let through (SeccompWatch, SignalTargets). Each table entry is
# NAME:X86_64_NR:AARCH64_NR (-1: not on that architecture).
SECCOMP_SOURCE = r'''# agentrl syscall policy
import ctypes, os
ALLOWED = {}
ALLOWED["processes"] = """
    execve:59:221 execveat:322:281 exit:60:93 exit_group:231:94 fork:57:-1 vfork:58:-1 clone:56:220 wait4:61:260
    waitid:247:95 set_tid_address:218:96 set_robust_list:273:99 get_robust_list:274:100 rseq:334:293
    restart_syscall:219:128 arch_prctl:158:-1 prctl:157:167 getpid:39:172 getppid:110:173 gettid:186:178
    getpgid:121:155 setpgid:109:154 getpgrp:111:-1 getsid:124:156 setsid:112:157 capget:125:90 capset:126:91
    personality:135:92 seccomp:317:277 membarrier:324:283 sched_yield:24:124 sched_getaffinity:204:123
    sched_setaffinity:203:122 sched_getparam:143:121 sched_setparam:142:118 sched_getscheduler:145:120
    sched_setscheduler:144:119 sched_get_priority_max:146:125 sched_get_priority_min:147:126
    sched_rr_get_interval:148:127 sched_getattr:315:275 sched_setattr:314:274 getpriority:140:141
    setpriority:141:140 ioprio_get:252:31 ioprio_set:251:30 getrusage:98:165 getrlimit:97:163 setrlimit:160:164
    prlimit64:302:261 umask:95:166 uname:63:160 sysinfo:99:179 times:100:153 getcpu:309:168 getrandom:318:278
    landlock_create_ruleset:444:444 landlock_add_rule:445:445 landlock_restrict_self:446:446"""
ALLOWED["ids"] = """
    getuid:102:174 geteuid:107:175 getgid:104:176 getegid:108:177 getresuid:118:148 getresgid:120:150
    getgroups:115:158 setuid:105:146 setgid:106:144 setreuid:113:145 setregid:114:143 setresuid:117:147
    setresgid:119:149 setgroups:116:159 setfsuid:122:151 setfsgid:123:152"""
ALLOWED["memory"] = """
    brk:12:214 mmap:9:222 munmap:11:215 mprotect:10:226 mremap:25:216 madvise:28:233 mincore:27:232 msync:26:227
    mlock:149:228 mlock2:325:284 munlock:150:229 mlockall:151:230 munlockall:152:231 memfd_create:319:279
    pkey_alloc:330:289 pkey_free:331:290 pkey_mprotect:329:288 remap_file_pages:216:234 mbind:237:235
    get_mempolicy:239:236 set_mempolicy:238:237 mseal:462:462 map_shadow_stack:453:453"""
ALLOWED["files"] = """
    read:0:63 write:1:64 readv:19:65 writev:20:66 pread64:17:67 pwrite64:18:68 preadv:295:69 pwritev:296:70
    preadv2:327:286 pwritev2:328:287 open:2:-1 openat:257:56 openat2:437:437 creat:85:-1 close:3:57
    close_range:436:436 lseek:8:62 dup:32:23 dup2:33:-1 dup3:292:24 fcntl:72:25 flock:73:32 fsync:74:82
    fdatasync:75:83 syncfs:306:267 sync:162:81 sync_file_range:277:84 fallocate:285:47 fadvise64:221:223
    readahead:187:213 ftruncate:77:46 truncate:76:45 stat:4:-1 fstat:5:80 lstat:6:-1 newfstatat:262:79 statx:332:291
    statfs:137:43 fstatfs:138:44 access:21:-1 faccessat:269:48 faccessat2:439:439 getcwd:79:17 chdir:80:49
    fchdir:81:50 mkdir:83:-1 mkdirat:258:34 rmdir:84:-1 rename:82:-1 renameat:264:38 renameat2:316:276 link:86:-1
    linkat:265:37 symlink:88:-1 symlinkat:266:36 unlink:87:-1 unlinkat:263:35 readlink:89:-1 readlinkat:267:78
    chmod:90:-1 fchmod:91:52 fchmodat:268:53 fchmodat2:452:452 chown:92:-1 fchown:93:55 lchown:94:-1 fchownat:260:54
    utime:132:-1 utimes:235:-1 utimensat:280:88 futimesat:261:-1 getdents:78:-1 getdents64:217:61 mknod:133:-1
    mknodat:259:33 getxattr:191:8 lgetxattr:192:9 fgetxattr:193:10 setxattr:188:5 lsetxattr:189:6 fsetxattr:190:7
    listxattr:194:11 llistxattr:195:12 flistxattr:196:13 removexattr:197:14 lremovexattr:198:15 fremovexattr:199:16
    getxattrat:464:464 setxattrat:463:463 listxattrat:465:465 removexattrat:466:466 sendfile:40:71 splice:275:76
    tee:276:77 vmsplice:278:75 copy_file_range:326:285 ioctl:16:29 name_to_handle_at:303:-1 cachestat:451:451
    inotify_init:253:-1 inotify_init1:294:26 inotify_add_watch:254:27 inotify_rm_watch:255:28"""
ALLOWED["waiting"] = """
    pipe:22:-1 pipe2:293:59 poll:7:-1 ppoll:271:73 select:23:-1 pselect6:270:72 epoll_create:213:-1
    epoll_create1:291:20 epoll_ctl:233:21 epoll_wait:232:-1 epoll_pwait:281:22 epoll_pwait2:441:441 eventfd:284:-1
    eventfd2:290:19 signalfd:282:-1 signalfd4:289:74 timerfd_create:283:85 timerfd_settime:286:86
    timerfd_gettime:287:87 futex:202:98 futex_waitv:449:449 futex_wake:454:454 futex_wait:455:455
    futex_requeue:456:456 io_setup:206:0 io_destroy:207:1 io_submit:209:2 io_cancel:210:3 io_getevents:208:4
    io_pgetevents:333:292"""
ALLOWED["time"] = """
    nanosleep:35:101 clock_nanosleep:230:115 clock_gettime:228:113 clock_getres:229:114 gettimeofday:96:169
    time:201:-1 alarm:37:-1 getitimer:36:102 setitimer:38:103 timer_create:222:107 timer_settime:223:110
    timer_gettime:224:108 timer_getoverrun:225:109 timer_delete:226:111 pause:34:-1"""
ALLOWED["signals"] = """
    rt_sigaction:13:134 rt_sigprocmask:14:135 rt_sigreturn:15:139 rt_sigpending:127:136 rt_sigsuspend:130:133
    rt_sigtimedwait:128:137 sigaltstack:131:132 pidfd_open:434:434"""
# every call that can signal another process: allowed, but in notify mode (kernel >= 5.5) each goes to the listener
# first, which looks at the target and lets the kernel go on (SECCOMP_USER_NOTIF_FLAG_CONTINUE: the kernel's own
# permission check decides, the count grants nothing). pidfd_open is not among them: a pidfd signals nothing by
# itself (pidfd_send_signal is watched; pidfd_getfd, process_madvise and setns are refused), and the spawner opens
# one per command, which would cost every exec a round trip.
SIGNALS = """
    kill:62:129 tkill:200:130 tgkill:234:131 rt_sigqueueinfo:129:138 rt_tgsigqueueinfo:297:240
    pidfd_send_signal:424:424"""
# and the calls that name the process the kernel signals on a descriptor's I/O (SIGIO / F_SETSIG's): fcntl and ioctl
# go to the listener with these commands only (args[1]), every other fcntl and ioctl stays allowed
OWNER_CMDS = {"fcntl": (8, 15), "ioctl": (0x8901, 0x8902)}  # F_SETOWN, F_SETOWN_EX; FIOSETOWN, SIOCSPGRP
ALLOWED["ipc"] = """
    shmget:29:194 shmat:30:196 shmdt:67:197 shmctl:31:195 semget:64:190 semop:65:193 semtimedop:220:192
    semctl:66:191 msgget:68:186 msgsnd:69:189 msgrcv:70:188 msgctl:71:187 mq_open:240:180 mq_unlink:241:181
    mq_timedsend:242:182 mq_timedreceive:243:183 mq_notify:244:184 mq_getsetattr:245:185"""
ALLOWED["network"] = """
    socket:41:198 socketpair:53:199 bind:49:200 listen:50:201 accept:43:202 accept4:288:242 connect:42:203
    getsockname:51:204 getpeername:52:205 sendto:44:206 recvfrom:45:207 sendmsg:46:211 recvmsg:47:212
    sendmmsg:307:269 recvmmsg:299:243 shutdown:48:210 setsockopt:54:208 getsockopt:55:209"""
PROBES = """
    add_key:248:217 request_key:249:218 keyctl:250:219 ptrace:101:117 process_vm_readv:310:270
    process_vm_writev:311:271 pidfd_getfd:438:438 process_madvise:440:440 process_mrelease:448:448 kcmp:312:272
    mount:165:40 umount2:166:39 pivot_root:155:41 chroot:161:51 unshare:272:97 setns:308:268 open_tree:428:428
    open_tree_attr:467:467 move_mount:429:429 fsopen:430:430 fsconfig:431:431 fsmount:432:432 fspick:433:433
    mount_setattr:442:442 bpf:321:280 perf_event_open:298:241
    userfaultfd:323:282 kexec_load:246:104 kexec_file_load:320:294 init_module:175:105 finit_module:313:273
    delete_module:176:106 io_uring_setup:425:425 io_uring_enter:426:426 io_uring_register:427:427"""
ARCHES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}  # AUDIT_ARCH_*, the table's column
X32_BIT = 0x40000000
CLONE3 = {"x86_64": 435, "aarch64": 435}
SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}
CLONE_NAMESPACES = 0x7E020000  # NEWNS NEWCGROUP NEWUTS NEWIPC NEWUSER NEWPID NEWNET
AF_VSOCK = 40  # not in any network namespace: it would reach the host's (or the VM host's) vsock services
RET_ALLOW, RET_NOTIFY, RET_ERRNO = 0x7FFF0000, 0x7FC00000, 0x00050000
EPERM, ENOSYS = 1, 38


def table(text, column):
    return {f.split(":")[0]: int(f.split(":")[1 + column]) for f in text.split()}


def numbers(arch):
    """({allowed nr}, {probe nr}) of `arch`, x86_64 or aarch64."""
    col = ARCHES[arch][1]
    allowed = {nr for text in ALLOWED.values() for nr in table(text, col).values() if nr >= 0}
    return allowed, {nr for nr in table(PROBES, col).values() if nr >= 0}


def signals(arch):
    """{signalling call nr} of `arch` (SIGNALS)."""
    return {nr for nr in table(SIGNALS, ARCHES[arch][1]).values() if nr >= 0}


def names(arch):
    col = ARCHES[arch][1]
    out = {nr: name for text in (*ALLOWED.values(), SIGNALS) for name, nr in table(text, col).items() if nr >= 0}
    out.update({nr: name for name, nr in table(PROBES, col).items() if nr >= 0})
    return out


def _section(arch, probe, other, signal=RET_ALLOW):
    """One architecture's instructions (labels resolved by `program`): seccomp_data.nr checked for x32, clone,
    clone3, the probes and the SIGNALS (`signal`: watched or allowed), then against the allow-list (sorted ranges,
    two jumps each); the rest is refused."""
    allowed, probes = numbers(arch)
    clone = table(ALLOWED["processes"], ARCHES[arch][1])["clone"]
    sock = table(ALLOWED["network"], ARCHES[arch][1])["socket"]
    owners = {name: table(ALLOWED["files"], ARCHES[arch][1])[name] for name in OWNER_CMDS}
    allowed -= {clone, sock, *owners.values()}
    ranges, ins = [], [(0x20, None, None, 0)]  # ld nr
    for nr in sorted(allowed):
        if ranges and ranges[-1][1] == nr - 1:
            ranges[-1][1] = nr
        else:
            ranges.append([nr, nr])
    if arch == "x86_64":
        ins.append((0x35, "probe", None, X32_BIT))  # jge: an x32 call
    for name, nr in owners.items():  # nr: args[1] (low word) against each command; the others go on with nr
        ins += [(0x15, None, f"not_{name}", nr), (0x20, None, None, 24),
                *[(0x15, f"{name}_signal", None, c) for c in OWNER_CMDS[name]], (0x06, None, None, RET_ALLOW),
                (f"{name}_signal",), (0x06, None, None, signal), (f"not_{name}",)]
    ins += [(0x15, "clone", None, clone), (0x15, "socket", None, sock), (0x15, "enosys", None, CLONE3[arch])]
    ins += [(0x15, "probe", None, nr) for nr in sorted(probes)]
    ins += [(0x15, "signal", None, nr) for nr in sorted(signals(arch))]
    for lo, hi in ranges:
        ins += [(0x35, None, "other", lo), (0x25, None, "allow", hi)]  # jge lo / jgt hi
    ins += [("other",), (0x06, None, None, other), ("allow",), (0x06, None, None, RET_ALLOW), ("probe",),
            (0x06, None, None, probe), ("enosys",), (0x06, None, None, RET_ERRNO | ENOSYS), ("clone",),
            (0x20, None, None, 16), (0x45, None, "clone_ok", CLONE_NAMESPACES),  # ld args[0] (low word); jset
            (0x06, None, None, probe), ("clone_ok",), (0x06, None, None, RET_ALLOW), ("socket",),
            (0x20, None, None, 16), (0x15, None, "socket_ok", AF_VSOCK),  # ld args[0]; jeq
            (0x06, None, None, probe), ("socket_ok",), (0x06, None, None, RET_ALLOW), ("signal",),
            (0x06, None, None, signal)]
    return _resolve(ins)


def _resolve(ins):
    labels, out = {}, []
    for i in ins:
        if len(i) == 1:
            labels[i[0]] = len(out)
        else:
            out.append(i)
    code = []
    for at, (op, jt, jf, k) in enumerate(out):
        jt, jf = (0 if j is None else labels[j] - at - 1 for j in (jt, jf))
        assert 0 <= jt < 256 and 0 <= jf < 256, "a jump too far for classic BPF"
        code.append((op, jt, jf, k))
    return code


def program(notify, watch_signals=False):
    """The whole filter: the architecture check, then one section per known architecture. `watch_signals` (notify
    only): the SIGNALS go to the listener too (it answers them with SECCOMP_USER_NOTIF_FLAG_CONTINUE)."""
    probe = RET_NOTIFY if notify else RET_ERRNO | EPERM
    other = RET_NOTIFY if notify else RET_ERRNO | ENOSYS
    signal = RET_NOTIFY if notify and watch_signals else RET_ALLOW
    x86, arm = _section("x86_64", probe, other, signal), _section("aarch64", probe, other, signal)
    head = [(0x20, 0, 0, 4), (0x15, 2, 0, ARCHES["x86_64"][0]), (0x15, 1 + len(x86), 0, ARCHES["aarch64"][0]),
            (0x06, 0, 0, probe)]
    return b"".join(op.to_bytes(2, "little") + bytes((jt, jf)) + k.to_bytes(4, "little")
                    for op, jt, jf, k in head + x86 + arm)


def install(libc, notify=True):
    """Install the filter on this process (and so on everything it starts from now on; needs no_new_privs).
    Returns (listener fd or -1, mode): mode "notify" (refusals go to the listener), "errno" (refused silently:
    the kernel has no user notification or a listener is already set up above us) or "none: why"."""
    arch = os.uname().machine
    if arch not in ARCHES:
        return -1, f"none: no policy for {arch}"

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
    why = ""
    # SECCOMP_USER_NOTIF_FLAG_CONTINUE came with Linux 5.5: before it a watched signal could not be let through
    release = [int("0" + "".join(c for c in part if c.isdigit())) for part in os.uname().release.split(".")[:2]]
    watch_signals = release >= [5, 5]
    for listen in ((True, False) if notify else (False,)):
        code = program(listen, watch_signals)
        prog = Prog(len(code) // 8, code)
        fd = libc.syscall(ctypes.c_long(SYS_SECCOMP[arch]), ctypes.c_long(1), ctypes.c_long(8 if listen else 0),
                          ctypes.byref(prog))
        if fd >= 0:
            return (fd, "notify") if listen else (-1, "errno")
        why = os.strerror(ctypes.get_errno())
    return -1, f"none: seccomp: {why}"
'''


# ---------------------------------------------------------------- the command spawner

# The spawner's program, run as `python -I -S -c SPAWNER_PROGRAM SOCK_FD UID GID POLICY` (UID -1: keep the agent's
# ids; POLICY notify|errno|off: the syscall policy, SECCOMP_SOURCE, which it installs on itself last). It
# imports only builtin modules (and ctypes), so it starts in a few ms of CPU. Started as the agent's uid (root when
# uid-separated), it makes itself non-dumpable, becomes UID:GID with no groups and no capabilities (inheritable
# included), checks that, installs the syscall policy, answers b"R" and the policy's mode (with the policy's listener
# attached, SCM_RIGHTS, in notify mode) or b"F" and why, and then serves the socket until EOF.
# Requests: 8 bytes of length, then a NUL-separated record (cwd, argc, argv..., n, executable candidates...,
# NAME=VALUE...), with the command's stdin, stdout and stderr attached to the length (SCM_RIGHTS). Messages back,
# 24 bytes each (kind, pid, value; little-endian): kind 1 answers a request (value: errno, 0 when started; a pidfd
# of the command attached when the kernel has them), kind 2 reports that a command exited (value: its exit code as
# os.waitstatus_to_exitcode gives it). Commands start with posix_spawn (vfork: no copy of the spawner's memory)
# in a new session, in the spawner's cwd (set to the request's cwd first) and with the request's environment.
SPAWNER_SOURCE = r'''# agentrl command spawner
import ctypes, errno, os, select, sys, _signal, _socket
PR_GET_DUMPABLE, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_GET_NO_NEW_PRIVS = 3, 4, 38, 39
libc = ctypes.CDLL(None, use_errno=True)
fd, uid, gid = (int(a) for a in sys.argv[1:4])
policy = sys.argv[4] if len(sys.argv) > 4 else "notify"
counters = sys.argv[5:6] == ["counters"]  # relayed: open this container's cgroup counters for the agent
sock = _socket.socket(fileno=fd)


def fail(why):
    sock.sendall(b"F" + why.encode())
    sys.exit(70)


def setup():
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # first: from now on a same-uid process cannot ptrace or read it
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    for sig in (_signal.SIGPIPE, _signal.SIGXFSZ):  # python ignores them; commands get the default, as with Popen
        _signal.signal(sig, _signal.SIG_DFL)
    try:
        with open("/proc/self/oom_score_adj", "w") as f:  # the OOM killer's first choice, with every command
            f.write("1000")
    except OSError:
        pass
    if uid >= 0:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)  # clears the permitted, effective and ambient capabilities
        head, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
        if libc.capset(head, data) != 0:  # and the inheritable ones (setpriv --inh-caps=-all)
            fail(f"capset: {os.strerror(ctypes.get_errno())}")
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # a uid change resets it to fs.suid_dumpable
        with open("/proc/self/status") as f:
            caps = {k: v.strip() for k, _, v in (line.partition(":") for line in f) if k.startswith("Cap")}
        left = {k: v for k, v in caps.items() if k != "CapBnd" and int(v, 16)}
        if left or os.getresuid() != (uid,) * 3 or os.getresgid() != (gid,) * 3 or os.getgroups():
            fail(f"still privileged after the uid switch: {left} uid {os.getresuid()} gid {os.getresgid()}")
    if libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0 or libc.prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1:
        fail("cannot make itself non-dumpable with no_new_privs")
    if not hasattr(os, "posix_spawn"):
        fail("no os.posix_spawn")
    os.set_inheritable(fd, False)
    os.closerange(3, fd)
    os.closerange(fd + 1, os.sysconf("SC_OPEN_MAX"))


def recv_exactly(n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            sys.exit(0)
        buf += chunk
    return bytes(buf)


def send(kind, pid, value, fds=()):
    msg = kind.to_bytes(8, "little") + pid.to_bytes(8, "little", signed=True) + value.to_bytes(8, "little", signed=True)
    anc = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, b"".join(f.to_bytes(4, sys.byteorder) for f in fds))] if fds else []
    sent = sock.sendmsg([msg], anc)
    if sent < len(msg):
        sock.sendall(msg[sent:])


def spawn(record, fds):
    parts = record.split(b"\0")
    cwd, argc = parts[0], int(parts[1])
    argv, n = parts[2:2 + argc], int(parts[2 + argc])
    candidates = parts[3 + argc:3 + argc + n]
    env = dict(item.partition(b"=")[::2] for item in parts[3 + argc + n:])
    try:
        os.chdir(cwd)
    except OSError as e:
        return 0, e.errno
    first = 0
    for path in candidates:  # like Popen: every candidate in turn, the first error other than "not there" wins
        try:
            os.stat(path)  # a missing candidate costs a stat, not a spawn
            return os.posix_spawn(path, argv, env, setsid=True,
                                  file_actions=[(os.POSIX_SPAWN_DUP2, f, i) for i, f in enumerate(fds)]), 0
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTDIR) and not first:
                first = e.errno
    return 0, first or errno.ENOENT


def serve_one():
    head, anc, _, _ = sock.recvmsg(8, _socket.CMSG_SPACE(3 * 4), _socket.MSG_CMSG_CLOEXEC)
    if not head:
        sys.exit(0)
    fds = [int.from_bytes(data[i:i + 4], sys.byteorder) for level, kind, data in anc
           if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS for i in range(0, len(data) - 3, 4)]
    try:
        head += recv_exactly(8 - len(head))
        record = recv_exactly(int.from_bytes(head, "little"))
        pid, err = spawn(record, fds) if len(fds) == 3 else (0, errno.EBADF)
    finally:
        for f in fds:
            os.close(f)
    pidfd = []
    if pid:
        try:
            pidfd = [os.pidfd_open(pid)]  # before any waitpid: it is this very process
        except (AttributeError, OSError):
            pass
    send(1, pid, err, pidfd)
    for f in pidfd:
        os.close(f)


def reap():
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return
        send(2, pid, os.waitstatus_to_exitcode(status))


def serve():
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    _signal.set_wakeup_fd(w)
    _signal.signal(_signal.SIGCHLD, lambda signum, frame: None)
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    poller.register(r, select.POLLIN)
    while True:
        for ready, _ in poller.poll():
            if ready == r:
                try:
                    os.read(r, 4096)
                except BlockingIOError:
                    pass
                reap()
            else:
                serve_one()


def cgroup_files():
    """This process's cgroup counter files (memory.events or v1 memory.oom_control, pids.events, cpu.stat), opened
    read-only for the agent, which cannot see the cgroups of this container: [(name, fd)], at most one per name.
    Each is looked for in the cgroup's own directory, then at the mount's root (where a container on cgroup v1, or
    in a cgroup namespace, sees its own cgroup)."""
    try:
        with open("/proc/self/cgroup") as f:
            paths = {c: path.rstrip("/") for _, ctrls, path in (line.rstrip("\n").split(":", 2) for line in f)
                     for c in (ctrls.split(",") if ctrls else [""])}
    except (OSError, ValueError):
        return []
    out = {}
    for ctrl, mount, name in (("", "", "memory.events"), ("", "", "pids.events"), ("", "", "cpu.stat"),
                              ("memory", "/memory", "memory.oom_control"), ("pids", "/pids", "pids.events"),
                              ("cpu", "/cpu,cpuacct", "cpu.stat"), ("cpu", "/cpu", "cpu.stat")):
        mount = "/sys/fs/cgroup" + mount
        if ctrl not in paths or name in out:
            continue
        for path in (f"{mount}{paths[ctrl]}/{name}", f"{mount}/{name}"):
            try:
                out[name] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                break
            except OSError:
                continue
    return sorted(out.items())


setup()
files = cgroup_files() if counters else []
listener, mode = install(libc, policy == "notify") if policy != "off" else (-1, "none: off")
fds = ([listener] if listener >= 0 else []) + [f for _, f in files]
head = b"R" + mode.encode() + b"\0" + str(int(listener >= 0)).encode() + b"\0" + ",".join(n for n, _ in files).encode()
sock.sendmsg([head], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, b"".join(f.to_bytes(4, sys.byteorder) for f in fds))]
             if fds else [])
for f in fds:
    os.close(f)
serve()
'''
SPAWNER_PROGRAM = SECCOMP_SOURCE + SPAWNER_SOURCE
SECCOMP_POLICY = "notify"  # the spawner's syscall policy: notify (refusals counted by the agent), errno, off
_POLICY: dict = {}
exec(SECCOMP_SOURCE, _POLICY)  # its tables and functions (nothing is installed in the agent)
_NOTIF_RECV, _NOTIF_SEND = 0xC0502100, 0xC0182101  # SECCOMP_IOCTL_NOTIF_RECV / _SEND
_NOTIF_FLAG_CONTINUE = 1  # SECCOMP_USER_NOTIF_FLAG_CONTINUE: the call goes on as if the filter had allowed it


class _NotifData(ctypes.Structure):
    _fields_ = [("nr", ctypes.c_int), ("arch", ctypes.c_uint32), ("ip", ctypes.c_uint64),
                ("args", ctypes.c_uint64 * 6)]


class _Notif(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("data", _NotifData)]


class _NotifResp(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("val", ctypes.c_int64), ("error", ctypes.c_int32), ("flags", ctypes.c_uint32)]


class SignalTargets:
    """Whether a call of SIGNALS reaches a process outside the policy's own (SeccompWatch counts it then): the agent
    itself; a process of another euid (the owner of /proc/PID): the agent, the relay, the pid namespace's init (tini,
    the pod's pause); or a non-dumpable process of the command user (its /proc/PID/mem is root's) that does not
    descend from the caller: the spawner, a judge (a judge ending its own helpers is not counted). A command's own
    processes, its children, its process groups and itself are the command user's and dumpable: uncounted. Names:
    "signal_foreign" (a signal or a signal check, sig 0: kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo,
    pidfd_send_signal; kill(-1) always, it reaches the spawner; kill(-PGID) when a member of the group is foreign),
    "sigio_foreign" (a foreign process or group named as a descriptor's signal owner: `_owner`),
    and "signal_unresolved" (the target of a pidfd_send_signal descriptor cannot be read: the caller made itself
    non-dumpable, or it is not visible to the agent). Pids in the
    arguments are the caller's pid namespace's: every backend runs the commands in the agent's (bubblewrap: the agent
    is inside the sandbox's; docker and kubernetes: one shared pid namespace) and the policy refuses new ones
    (unshare, clone with namespace flags), so they are read as they are. Nothing is granted or refused here."""

    PIDFD_SIGNAL_PROCESS_GROUP = 4

    def __init__(self, identity: "Identity") -> None:
        self._identity = identity
        self._me = os.getpid()
        self.graders: set[int] = set()  # running execs whose program is the agent's judge_python (the host's graders)

    def judge(self, name: str, caller: int, args: list[int]) -> str | None:
        """The count's name for this call of `caller` (a thread id), None when it reaches only the policy's own
        processes or comes from a grader itself (an exec of judge_python: repo_fix's shell client ends every other
        process of the command user, the spawner included; a grader's descendants are not exempt)."""
        if self.graders and caller > 0 and self._tgid(caller) in self.graders:
            return None
        a = [ctypes.c_int32(x & 0xFFFFFFFF).value for x in args]  # pid_t and int arguments
        if name == "pidfd_send_signal":
            pid = self._pidfd_target(caller, a[0])
            if pid is None:
                return "signal_unresolved"
            targets = self._group(self._pgid(pid)) if args[3] & self.PIDFD_SIGNAL_PROCESS_GROUP else [pid]
        elif name == "kill":
            if a[0] == 0:  # the caller's own process group
                return None
            if a[0] == -1:  # every process the caller may signal but itself: the spawner among them
                return "signal_foreign"
            targets = [a[0]] if a[0] > 0 else self._group(-a[0])
        elif name in ("fcntl", "ioctl"):
            return self._owner(caller, a[1] & 0xFFFFFFFF, a[2], args[2])
        elif name in ("tgkill", "rt_tgsigqueueinfo"):
            targets = [a[0], a[1]]
        else:  # tkill, rt_sigqueueinfo
            targets = [a[0]]
        return "signal_foreign" if any(self._foreign(t, caller) for t in targets if t > 0) else None

    def _owner(self, caller: int, cmd: int, value: int, pointer: int) -> str | None:
        """fcntl F_SETOWN (value: a pid, or -PGID), F_SETOWN_EX (pointer: struct f_owner_ex {type, pid}), ioctl
        FIOSETOWN / SIOCSPGRP (pointer: an int like F_SETOWN's): "sigio_foreign" when the process the kernel would
        signal on the descriptor's I/O is foreign. The pointed-to value is read from the caller's memory
        (/proc/CALLER/mem with the command user's fsuid); unreadable: "signal_unresolved"."""
        if cmd == 8:
            owner, group = abs(value), value < 0
        else:
            raw = self._peek(caller, pointer, 8 if cmd == 15 else 4)
            if raw is None:
                return "signal_unresolved"
            if cmd == 15:
                kind, owner = int.from_bytes(raw[:4], "little", signed=True), int.from_bytes(raw[4:], "little",
                                                                                              signed=True)
                group = kind == 2  # F_OWNER_PGRP
            else:
                value = int.from_bytes(raw, "little", signed=True)
                owner, group = abs(value), value < 0
        if owner <= 0:
            return None
        targets = self._group(owner) if group else [owner]
        return "sigio_foreign" if any(self._foreign(t, caller) for t in targets) else None

    def _peek(self, caller: int, address: int, size: int) -> bytes | None:
        if caller <= 0:
            return None
        with self._identity.files():
            try:
                with open(f"/proc/{caller}/mem", "rb", buffering=0) as f:
                    f.seek(address)
                    raw = f.read(size)
            except (OSError, ValueError, OverflowError):
                return None
        return raw if len(raw) == size else None

    def _foreign(self, pid: int, caller: int) -> bool:
        if pid == self._me:
            return True
        try:
            if os.stat(f"/proc/{pid}").st_uid != self._identity.uid:  # the directory's owner: the euid
                return True
            if os.stat(f"/proc/{pid}/mem").st_uid == self._identity.uid:  # the files': root's when non-dumpable
                return False
        except OSError:  # no such process: the call fails with ESRCH and reaches nothing
            return False
        return not self._descends(pid, self._tgid(caller))  # a judge may end its own helpers

    @staticmethod
    def _tgid(tid: int) -> int:
        try:
            with open(f"/proc/{tid}/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("Tgid:"))
        except (OSError, ValueError, StopIteration):
            return 0

    @staticmethod
    def _descends(pid: int, ancestor: int) -> bool:
        for _ in range(256):
            if pid == ancestor:
                return True
            if pid <= 1:
                return False
            parent = _stat_int(pid, 1)  # ppid
            if parent is None:
                return False
            pid = parent
        return False

    @staticmethod
    def _pgid(pid: int) -> int:
        return _stat_int(pid, 2) or 0  # pgrp

    def _group(self, pgid: int) -> list[int]:
        if pgid <= 0:
            return []
        return [int(p) for p in os.listdir("/proc") if p.isdigit() and self._pgid(int(p)) == pgid]

    def _pidfd_target(self, caller: int, fd: int) -> int | None:
        """The pid a descriptor of `caller` refers to (a pidfd, or a /proc/PID directory), 0 when that process is
        gone, None when it cannot be read (read with the command user's fsuid: the agent holds no CAP_SYS_PTRACE)."""
        if caller <= 0 or fd < 0:
            return None
        with self._identity.files():
            try:
                with open(f"/proc/{caller}/fdinfo/{fd}") as f:
                    for line in f:
                        if line.startswith("Pid:"):
                            return max(int(line.split()[1]), 0)
                link = os.readlink(f"/proc/{caller}/fd/{fd}")
            except (OSError, ValueError, IndexError):
                return None
        head, _, tail = link.rpartition("/")
        return int(tail) if tail.isdigit() and head.endswith("/proc") else None


class NetAttempts:
    """Attempts to reach a network the sandbox does not have, counted from the kernel's own counters of the network
    namespace the agent shares with the commands (bubblewrap --unshare-net with the agent inside; docker "none",
    the commands' container in the agent's): Ip OutNoRoutes of /proc/net/snmp and Ip6OutNoRoutes of
    /proc/net/snmp6. With loopback as the only interface, every packet, connect or DNS query to an address that is
    not loopback's fails its route lookup and moves one of them, whatever the call, the socket type or the process
    (background ones included); loopback traffic (tests with localhost servers) moves neither. Enabled only where
    the namespace has no interface but `lo` (no network by spec); a namespace with one (network by spec, a
    Kubernetes pod's own interface that carries the agent's API) is not counted. `take()`: the attempts since the
    last take."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fds: list[int] = []
        self.enabled, self._last = False, 0
        try:
            with open("/proc/net/dev") as f:
                names = {line.partition(":")[0].strip() for line in f.readlines()[2:] if ":" in line}
            if names != {"lo"}:
                return
            self._fds.append(os.open("/proc/net/snmp", os.O_RDONLY | os.O_CLOEXEC))
            try:  # absent without IPv6
                self._fds.append(os.open("/proc/net/snmp6", os.O_RDONLY | os.O_CLOEXEC))
            except OSError:
                pass
            self._last = self._read()
            self.enabled = True
        except (OSError, ValueError):
            _close(tuple(self._fds))

    def _read(self) -> int:
        """The two counters, from the descriptors kept open (pread at 0 makes the kernel write the file anew)."""
        snmp = os.pread(self._fds[0], 1 << 16, 0)
        at = 0 if snmp.startswith(b"Ip: ") else snmp.index(b"\nIp: ") + 1  # the header line, then the values
        head, values = snmp[at:].split(b"\n", 2)[:2]
        total = int(values.split()[head.split().index(b"OutNoRoutes")])
        if len(self._fds) > 1:
            snmp6 = os.pread(self._fds[1], 1 << 16, 0)
            at = snmp6.find(b"Ip6OutNoRoutes")
            total += int(snmp6[at + 14:snmp6.index(b"\n", at)]) if at >= 0 else 0
        return total

    def take(self) -> int:
        if not self.enabled:
            return 0
        with self._lock:
            try:
                now = self._read()
            except (OSError, ValueError):
                return 0
            n, self._last = max(now - self._last, 0), now
        return n


class SeccompWatch:
    """The supervisor of the syscall policy's refusals (notify mode): one thread polls the listener of every
    spawner started (a spawner's commands keep its filter, and so its listener, after it died), answers each refused
    call with the errno the policy gives it (EPERM for the PROBES, a foreign architecture, x32 and clone with
    namespace flags, socket for AF_VSOCK; ENOSYS for the rest) and counts it by name: PROBES by their name,
    "clone_namespace", "socket_vsock", "x32", "arch:0x...", the rest "enosys:NAME" (or "enosys:NR"). The SIGNALS
    are not refused: each is let through (SECCOMP_USER_NOTIF_FLAG_CONTINUE, the kernel's permission check decides)
    and counted when its target is foreign (`SignalTargets`). `take()` hands out the counts seen since the last take:
    every refusal of the whole episode is reported once, background processes' included. The count is the kernel's
    (each notification is one call); nothing a command prints enters it."""

    def __init__(self, targets: "SignalTargets | None" = None) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._targets = targets
        self._names, self._probes, self._clone, self._socket, self._signals = {}, {}, {}, {}, {}
        for machine, (audit, column) in _POLICY["ARCHES"].items():
            self._names[audit] = _POLICY["names"](machine)
            self._signals[audit] = _POLICY["signals"](machine) | {
                _POLICY["table"](_POLICY["ALLOWED"]["files"], column)[name] for name in _POLICY["OWNER_CMDS"]}
            self._probes[audit] = _POLICY["numbers"](machine)[1]
            self._clone[audit] = _POLICY["table"](_POLICY["ALLOWED"]["processes"], column)["clone"]
            self._socket[audit] = _POLICY["table"](_POLICY["ALLOWED"]["network"], column)["socket"]
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._new: list[int] = []
        self._wake_r, self._wake_w = os.pipe()
        threading.Thread(target=self._run, name="seccomp-watch", daemon=True).start()

    def add(self, fd: int) -> None:
        with self._lock:
            self._new.append(fd)
        os.write(self._wake_w, b"x")

    def take(self) -> dict[str, int]:
        with self._lock:
            out, self._counts = self._counts, {}
        return out

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        while True:
            for fd, ev in poller.poll():
                if fd == self._wake_r:
                    os.read(self._wake_r, 4096)
                    with self._lock:
                        new, self._new = self._new, []
                    for f in new:
                        poller.register(f, select.POLLIN)
                elif ev & select.POLLIN:
                    self._answer(fd)
                else:  # every process under that filter is gone
                    poller.unregister(fd)
                    os.close(fd)

    def _answer(self, fd: int) -> None:
        notif = _Notif()
        if self._libc.ioctl(fd, ctypes.c_ulong(_NOTIF_RECV), ctypes.byref(notif)) != 0:
            return  # the caller died meanwhile
        if notif.data.nr in self._signals.get(notif.data.arch, ()):
            name = None
            try:
                name = self._targets.judge(self._names[notif.data.arch][notif.data.nr], notif.pid,
                                           list(notif.data.args)) if self._targets is not None else None
            except Exception:  # noqa: BLE001 - this thread answers every notification: it must not die of one
                name = "signal_unresolved"
            finally:  # the caller waits for this answer whatever the look at its target gave
                self._libc.ioctl(fd, ctypes.c_ulong(_NOTIF_SEND),
                                 ctypes.byref(_NotifResp(notif.id, 0, 0, _NOTIF_FLAG_CONTINUE)))
            if name is None:
                return
        else:
            name, err = self._name(notif.data.arch, notif.data.nr)
            self._libc.ioctl(fd, ctypes.c_ulong(_NOTIF_SEND), ctypes.byref(_NotifResp(notif.id, 0, -err, 0)))
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + 1

    def _name(self, arch: int, nr: int) -> tuple[str, int]:
        if arch not in self._names:
            return f"arch:{arch:#x}", errno.EPERM
        if nr >= _POLICY["X32_BIT"]:
            return "x32", errno.EPERM
        if nr == self._clone[arch]:
            return "clone_namespace", errno.EPERM
        if nr == self._socket[arch]:
            return "socket_vsock", errno.EPERM
        if nr in self._probes[arch]:
            return self._names[arch][nr], errno.EPERM
        return f"enosys:{self._names[arch].get(nr, nr)}", errno.ENOSYS
# The relay's program (the agent in a container of its own, `--relay NAME`: kubernetes, docker), run as
# `python3 -I -S -c RELAY_SOURCE NAME`: the main process of the sandbox container, uid 0 with only CAP_SETUID and
# CAP_SETGID (what the spawner needs to become the command user), in that container's cgroup, i.e. under the
# sandbox's limits. It listens on the abstract unix socket NAME (scoped to the pod's network namespace) and serves
# only peers of its own uid (SO_PEERCRED: the agent; commands run as another uid and are refused). A request:
# 4 bytes of length, then a NUL-separated argv. It forks, puts one end of a fresh socketpair at fd 3 of the child
# (stdin and stdout /dev/null) and execs argv there; the answer is 8 bytes, the child's pid (or -errno when the fork
# failed: the commands' pids are full), with the other end of the socketpair attached (SCM_RIGHTS). Its children
# are reaped by the kernel (SIGCHLD ignored); their orphans go to the pod's pause process.
RELAY_SOURCE = r"""# agentrl relay
import os, sys, _signal, _socket
name, me = sys.argv[1], os.getuid()
_signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)
srv = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
srv.bind("\0" + name)
srv.listen(16)


def recv_exactly(conn, n):
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def child(b, argv):
    try:
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
        if b != 3:
            os.dup2(b, 3)
        os.set_inheritable(3, True)
        null = os.open("/dev/null", os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.closerange(4, 1 << 16)
        os.execvp(argv[0], argv)
    finally:
        os._exit(127)


def serve(conn):
    cred = conn.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    if int.from_bytes(cred[4:8], sys.byteorder) != me:
        return
    conn.settimeout(5)
    n = int.from_bytes(recv_exactly(conn, 4), "little")
    if not 0 < n <= 1 << 20:
        return
    argv = [a.decode("utf-8", "surrogateescape") for a in recv_exactly(conn, n).split(b"\0")]
    a, b = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        try:
            pid = os.fork()
        except OSError as e:
            conn.sendall((-(e.errno or 11)).to_bytes(8, "little", signed=True))
            return
        if pid == 0:
            child(b.fileno(), argv)
        anc = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, a.fileno().to_bytes(4, sys.byteorder))]
        conn.sendmsg([pid.to_bytes(8, "little", signed=True)], anc)
    finally:
        a.close()
        b.close()


while True:
    fd, _ = srv._accept()
    conn = _socket.socket(fileno=fd)
    try:
        serve(conn)
    except (OSError, EOFError):
        pass
    finally:
        conn.close()
"""
RELAY_TIMEOUT_S = 10.0  # connecting to the relay and getting its answer
RELAY_WAIT_S = 300.0  # at start-up, how long the agent waits for the relay before it gives up (exit 1)


def _peer_uid(conn: socket.socket) -> int:
    return int.from_bytes(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)[4:8], sys.byteorder)


def connect_relay(name: str, timeout_s: float) -> socket.socket:
    """A connection to the relay on the abstract socket `name`, checked to be a process of our uid (a command that
    bound the name is not). Raises OSError (no relay: refused) or PermissionError (another uid holds the name)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(timeout_s)
        conn.connect("\0" + name)
        if _peer_uid(conn) != os.getuid():
            raise PermissionError(errno.EPERM, "the relay's socket is held by a process of another uid (the sandbox "
                                               "container's relay is gone and a command took its name)")
    except BaseException:
        conn.close()
        raise
    return conn


def wait_for_relay(name: str, timeout_s: float = RELAY_WAIT_S) -> None:
    """Block until the relay answers on `name` as a process of our uid (the sandbox container may start after the
    agent's, and a 0.05-CPU container takes a while to start python): the agent listens, so the pod turns ready,
    only after this, and a relay that stops answering later was ended by the commands. Exits when it never comes."""
    end = time.monotonic() + timeout_s
    why = "not started"
    while time.monotonic() < end:
        try:
            connect_relay(name, RELAY_TIMEOUT_S).close()
            return
        except OSError as e:
            why = str(e)
        time.sleep(0.05)
    sys.exit(f"agent: the relay {name!r} in the sandbox container did not answer within {timeout_s:g}s ({why}): "
             "is that container running `python3 -I -S -c RELAY_SOURCE NAME`?")
SPAWNER_START_TIMEOUT_S = 30.0  # a spawner not ready by then (or by the exec's deadline) is treated as gone
STATUS_GRACE_S = 1.0  # after a command exited, how long its exit code may take to come from the spawner
_SPAWNED, _EXITED = 1, 2


class SpawnerLost(Exception):
    """The spawner died (or stopped answering) before it answered a request: something of the command user (the
    policy's processes, the commands' memory limit) killed or stopped it, so the exec that needed it fails as the
    policy's doing. The next exec starts a fresh one. `killed_in_flight`: it died after the request left, so the
    command may have run (and may be what killed it: `kill -9 -1` can beat the spawner's answer)."""

    def __init__(self, message: str, killed_in_flight: bool = False) -> None:
        super().__init__(message)
        self.killed_in_flight = killed_in_flight


class SpawnerUnusable(Exception):
    """The spawner cannot work here at all (its setup failed): the agent falls back to setpriv per command."""


class _GoneBefore(SpawnerLost):
    """The spawner was gone before the request left: nothing was started, the request can go to a fresh one."""

    def __init__(self) -> None:
        super().__init__("the command spawner was killed before the request (by the sandbox's own processes or the "
                         "commands' memory limit), and again after a restart")


class _Link:
    """One spawner process and what the agent learnt from it: the answer to the request in flight, the exit codes
    of its commands, and whether it is gone (`lost`: EOF on its socket). A reader thread fills it."""

    def __init__(self, sock: socket.socket, proc: subprocess.Popen, cond: threading.Condition) -> None:
        self.sock, self.proc, self.cond = sock, proc, cond
        self.tx = sock.dup()  # requests go out with a timeout (which makes the shared file non-blocking)
        self.pidfd = _pidfd(proc.pid)
        self.answer: tuple[int, int, int | None] | None = None
        self.codes: dict[int, int] = {}
        self.lost = False

    def start_reader(self) -> None:
        threading.Thread(target=self._read, name="spawner-reader", daemon=True).start()

    def _read(self) -> None:
        buf, fds = b"", []
        poller = select.poll()  # the socket is non-blocking: `tx`, its dup, sends with a timeout
        poller.register(self.sock, select.POLLIN)
        try:
            while True:
                try:
                    data, anc, _, _ = self.sock.recvmsg(24 - len(buf), socket.CMSG_SPACE(4),
                                                        socket.MSG_CMSG_CLOEXEC)
                except BlockingIOError:
                    poller.poll()
                    continue
                if not data:
                    break
                fds += [fd for level, kind, raw in anc if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
                        for fd in array.array("i", raw[:len(raw) - len(raw) % 4])]
                buf += data
                if len(buf) < 24:
                    continue
                kind, pid, value = (int.from_bytes(buf[i:i + 8], "little", signed=True) for i in (0, 8, 16))
                buf = b""
                with self.cond:
                    if kind == _SPAWNED:
                        self.answer, fds = (pid, value, fds[0] if fds else None), fds[1:]
                    else:
                        self.codes[pid] = value
                    self.cond.notify_all()
        except OSError:
            pass
        finally:
            for fd in fds:
                os.close(fd)
            self.sock.close()
            with self.cond:
                self.lost = True
                self.cond.notify_all()

    def exited(self, pid: int) -> bool:
        with self.cond:
            return pid in self.codes or self.lost

    def discard(self) -> None:
        """Close its socket (it exits at EOF; the reader sees EOF) and SIGKILL it (it may be stopped)."""
        self.tx.close()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except OSError:
                pass
            os.close(self.pidfd)
            self.pidfd = None
        self.proc.returncode = -signal.SIGKILL  # the reaper reaps it; Popen must never waitpid this pid again


class _Remote:
    """The Popen-like face of a spawner the relay started in the sandbox container (not the agent's child)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None


class _Spawned:
    """The Popen-like face of a command started by the spawner: pid, a pidfd (when the kernel has them), the
    agent's ends of its pipes, and the spawner (`link`) that reports its exit code."""

    def __init__(self, link: _Link | None, pid: int, pidfd: int | None, stdin: int | None, stdout: int,
                 stderr: int) -> None:
        self.link, self.pid, self.pidfd = link, pid, pidfd
        self.stdin = open(stdin, "wb", buffering=0) if stdin is not None else None
        self.stdout = open(stdout, "rb", buffering=0)
        self.stderr = open(stderr, "rb", buffering=0)
        self.returncode: int | None = None


class Spawner:
    """A persistent fork server (SPAWNER_SOURCE) that already runs as the command user and in the `commands` cgroup,
    so a command costs one vfork + exec instead of setpriv's fork + extra exec (and, under cgroup v2, /bin/sh's).
    It is the commands' parent and reports their exit codes; their orphans still go to the agent (the subreaper).
    It is a process of the command user, so the policy can kill or stop it (its own loss: the exec waiting on it
    fails or loses its exit code as the policy's doing, the next one starts a fresh spawner) but cannot ptrace it
    or read its memory (non-dumpable) nor reach its socket (a socketpair only the agent holds; every other fd
    closed). /kill_all kills it with the rest."""

    def __init__(self, identity: Identity, cgroup: CommandCgroup, reaper: "Reaper", relay: str | None = None,
                 watch: "SeccompWatch | None" = None) -> None:
        self._ids = (identity.uid, identity.gid) if identity.separated else (-1, -1)
        self._identity, self._cgroup, self._reaper = identity, cgroup, reaper
        self._relay = relay  # started by the relay in the commands' container, not as our child
        self._lock = threading.Lock()  # one request at a time; guards _link
        self._cond = threading.Condition()  # what the reader threads learn
        self._link: _Link | None = None
        self.unusable = False  # its setup failed here: commands start through setpriv
        self._watch = watch  # gets the syscall policy's listener of every spawner started
        self.seccomp = "none: no spawner started yet"  # the last spawner's policy mode (SECCOMP_SOURCE's install)
        self.on_counter_files: "Callable[[dict[str, int]], None] | None" = None  # relayed: gets the commands' cgroup

    @property
    def pid(self) -> int | None:
        link = self._link
        return link.proc.pid if link is not None else None

    def ensure(self, deadline: float) -> None:
        """A live, ready spawner: the current one, or a fresh one when it is gone (killed by /kill_all, the policy
        or the memory limit). Raises SpawnerUnusable when it cannot work here, SpawnerLost when it did not start."""
        with self._lock:
            if self._link is not None and not self._link.lost and not _hung_up(self._link.sock):
                return
            if self._link is not None:
                self._link.discard()
                self._link = None
            a, proc = self._start_relayed(deadline) if self._relay else self._start_child()
            link = _Link(a, proc, self._cond)
            try:
                a.settimeout(max(min(deadline, time.monotonic() + SPAWNER_START_TIMEOUT_S) - time.monotonic(),
                                 0.001))
                ready, anc, _, _ = a.recvmsg(4096, socket.CMSG_SPACE(4 * 8), socket.MSG_CMSG_CLOEXEC)
                a.settimeout(None)
            except OSError:
                ready, anc = b"", []
            listeners = [fd for level, kind, raw in anc if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
                         for fd in array.array("i", raw[:len(raw) - len(raw) % 4])]
            if ready.startswith(b"R"):
                self._ready(ready, listeners)
            else:
                _close(tuple(listeners))
            if not ready.startswith(b"R"):
                link.discard()
                a.close()
                if ready.startswith(b"F"):
                    raise SpawnerUnusable(ready[1:].decode(errors="replace"))
                raise SpawnerLost("the command spawner did not start (killed, stopped or out of memory)")
            try:
                link.start_reader()
            except RuntimeError:  # no thread can start: the pids the agent shares with the commands are full
                link.discard()
                raise OSError(errno.EAGAIN, "cannot start a thread (the pod's pids are full)") from None
            self._link = link

    def _ready(self, ready: bytes, fds: list[int]) -> None:
        """The spawner's ready answer: b"R" MODE NUL LISTENER(0|1) NUL NAME,NAME... with the policy's listener (when
        1) and the named cgroup counter files (relayed) attached, in that order."""
        mode, _, rest = ready[1:].decode(errors="replace").partition("\0")
        has_listener, _, names = rest.partition("\0")
        self.seccomp = mode
        if has_listener == "1" and fds:
            listener, fds = fds[0], fds[1:]
            if self._watch is not None:
                self._watch.add(listener)
            else:
                os.close(listener)
        files = dict(zip(names.split(","), fds)) if names else {}
        _close(tuple(fds[len(files):]))
        if self.on_counter_files is not None and files:
            self.on_counter_files(files)
        else:
            _close(tuple(files.values()))

    def _start_child(self) -> "tuple[socket.socket, subprocess.Popen]":
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = self._cgroup.wrap([sys.executable, "-I", "-S", "-c", SPAWNER_PROGRAM, str(b.fileno()),
                                  *map(str, self._ids), SECCOMP_POLICY])
        try:
            return a, self._cgroup.start(lambda: subprocess.Popen(
                argv, pass_fds=(b.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True))
        except OSError as e:
            a.close()
            if e.errno in (errno.EAGAIN, errno.ENOMEM):  # the commands' pids or memory are full: this exec's
                raise                                      # failure (as Popen's would be), not the spawner's
            raise SpawnerUnusable(f"cannot start {sys.executable!r}: {e}") from None
        finally:
            b.close()

    def _start_relayed(self, deadline: float) -> "tuple[socket.socket, _Remote]":
        """Ask the relay (RELAY_SOURCE, the sandbox container's main process) to start a spawner there: in that
        container's cgroup, under the sandbox's limits, as its child. The relay must be of our uid (SO_PEERCRED): a
        command that bound the name after the relay died is not. Raises OSError (EAGAIN: the commands' pids are
        full) or SpawnerLost (the relay is gone: the sandbox container died, e.g. by the commands' memory limit)."""
        argv = ["python3", "-I", "-S", "-c", SPAWNER_PROGRAM, "3", *map(str, self._ids), SECCOMP_POLICY, "counters"]
        data = b"\0".join(os.fsencode(x) for x in argv)
        fds: list[int] = []
        try:
            conn = connect_relay(self._relay, max(min(deadline - time.monotonic(), RELAY_TIMEOUT_S), 0.001))
            try:
                conn.sendall(len(data).to_bytes(4, "little") + data)
                msg, anc, _, _ = conn.recvmsg(8, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC)
                fds = [fd for level, kind, raw in anc if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
                       for fd in array.array("i", raw[:len(raw) - len(raw) % 4])]
                while 0 < len(msg) < 8:
                    more = conn.recv(8 - len(msg))
                    if not more:
                        break
                    msg += more
            finally:
                conn.close()
        except PermissionError as e:  # a command holds the relay's name
            raise SpawnerLost(e.strerror or str(e)) from None
        except OSError as e:
            _close(tuple(fds))
            raise SpawnerLost(f"the relay in the sandbox container does not answer ({e}): the container is gone "
                              "(killed by the commands' memory limit, or its main process by the commands)") from None
        pid = int.from_bytes(msg, "little", signed=True) if len(msg) == 8 else 0
        if pid < 0:
            _close(tuple(fds))
            raise OSError(-pid, os.strerror(-pid))
        if pid == 0 or not fds:
            _close(tuple(fds))
            raise SpawnerLost("the relay in the sandbox container closed the connection without starting a spawner")
        _close(tuple(fds[1:]))
        return socket.socket(fileno=fds[0]), _Remote(pid)

    def spawn(self, run: "ExecRun", deadline: float) -> _Spawned:
        """Start `run`'s command through the spawner: its pid and pidfd and the agent's pipe ends. Raises OSError
        like Popen when the command cannot be executed, SpawnerLost when the spawner is gone or stopped."""
        record = _spawn_record(run)
        stdin_r, stdin_w = os.pipe() if run.stdin is not None else (os.open(os.devnull, os.O_RDONLY), None)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ours = (stdin_w, out_r, err_r)
        try:
            since = _boot_ticks() - 1
            try:
                link, (pid, err, pidfd) = self._request(record, (stdin_r, out_w, err_w), deadline)
            except SpawnerLost as e:
                pid = self._orphan(out_r, since) if e.killed_in_flight else None
                if pid is None:
                    raise
                link, err, pidfd = None, 0, _pidfd(pid)
        except BaseException:
            _close(ours)
            raise
        finally:
            _close((stdin_r, out_w, err_w))
        if err:
            _close(ours)
            raise OSError(err, os.strerror(err))
        return _Spawned(link, pid, pidfd, *ours)

    def _orphan(self, out_r: int, since_ticks: int) -> int | None:
        """The command a spawner killed in flight did start (`kill -9 -1` as a command's first act can beat the
        spawner's answer), adopted by the reaper: a child of the agent (where the kernel re-parents the dead
        spawner's children) that holds the write end of its stdout pipe, or, once it exited, the one session leader
        the reaper reaped that started since the request. None when neither shows up within STATUS_GRACE_S / 4."""
        end = time.monotonic() + STATUS_GRACE_S / 4
        elsewhere = bool(self._relay)  # its orphans go to that pid namespace's init, never to the agent: a live one
        if not elsewhere:              # is found by its stdout (output kept, exit code lost), an exited one is not
            self._reaper.expect_orphans(STATUS_GRACE_S / 4)
        while True:
            pid = self._live_orphan(out_r, any_parent=elsewhere)
            if pid is None and not elsewhere:
                pid = self._reaper.claim_leader(since_ticks)
            if pid is not None or time.monotonic() > end:
                return pid
            time.sleep(0.01)

    def _live_orphan(self, out_r: int, any_parent: bool = False) -> int | None:
        target, me = f"pipe:[{os.fstat(out_r).st_ino}]", os.getpid()
        with self._identity.files():  # /proc/PID/fd of the command user's processes: their fsuid may look
            for name in os.listdir("/proc"):
                fields = _proc_fields(name) if name.isdigit() else None
                if fields is None or (fields[1] != me and not any_parent):
                    continue
                try:
                    if os.readlink(f"/proc/{name}/fd/1") == target:
                        if not any_parent:
                            self._reaper.adopt(int(name))
                        return int(name)
                except OSError:
                    continue
        return None

    def _request(self, record: bytes, fds: tuple[int, int, int],
                 deadline: float) -> tuple[_Link, tuple[int, int, int | None]]:
        with self._lock:
            link = self._link
            if link is None or link.lost:
                raise SpawnerLost("the command spawner was killed before it started the command (by the sandbox's "
                                  "own processes or the commands' memory limit); the next exec starts a fresh one")
            with self._cond:
                link.answer = None
            try:
                link.tx.settimeout(max(deadline - time.monotonic(), 0.001))
                link.tx.sendmsg([len(record).to_bytes(8, "little")],
                                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
                link.tx.sendall(record)
            except (BrokenPipeError, ConnectionResetError):  # it was gone before this request: start a fresh one
                link.discard()
                self._link = None
                raise _GoneBefore() from None
            except OSError:
                pass  # stopped (no answer comes) or gone meanwhile (the reader sees EOF): told apart below
            with self._cond:
                self._cond.wait_for(lambda: link.answer is not None or link.lost,
                                    max(deadline - time.monotonic(), 0))
                answer = link.answer
            if answer is None:
                stopped = not link.lost
                if not stopped and link.pidfd is not None:  # until it has exited: its children are re-parented
                    select.select([link.pidfd], [], [], STATUS_GRACE_S)
                link.discard()
                self._link = None
                if stopped:
                    raise SpawnerLost("the command spawner stopped answering before it started the command (stopped "
                                      "by the sandbox's own processes); the next exec starts a fresh one")
                raise SpawnerLost("the command spawner was killed while it started the command (by the sandbox's "
                                  "own processes, maybe this command, or the commands' memory limit): exit code "
                                  "unknown; the next exec starts a fresh one", killed_in_flight=True)
            return link, answer

    def wait(self, proc: _Spawned) -> int | None:
        """The exit code of `proc` (which exited, or was just killed) as its spawner reports it; None when that
        spawner died, or did not report it within STATUS_GRACE_S (stopped by the policy): it is then discarded
        (SIGKILL), so its children, `proc` included, go to the agent's reaper."""
        link = proc.link
        if link is None:  # found as an orphan: the reaper has its exit code
            return None
        with self._cond:
            self._cond.wait_for(lambda: proc.pid in link.codes or link.lost, STATUS_GRACE_S)
            code = link.codes.pop(proc.pid, None)
        if code is None:
            with self._lock:
                link.discard()
                if self._link is link:
                    self._link = None
        return code

    def close(self) -> None:
        with self._lock:
            if self._link is not None:
                self._link.discard()
                self._link = None


def _hung_up(sock: socket.socket) -> bool:
    """The peer closed its end (the spawner exited), whether or not the reader thread has seen the EOF yet."""
    poller = select.poll()
    poller.register(sock, select.POLLRDHUP | select.POLLHUP)
    return any(ev & (select.POLLRDHUP | select.POLLHUP) for _, ev in poller.poll(0))


def _close(fds: "tuple[int | None, ...]") -> None:
    for fd in fds:
        if fd is not None:
            os.close(fd)


def _spawn_record(run: "ExecRun") -> bytes:
    """The spawner's request for `run`: what Popen would check and pass (embedded NULs and '=' in names refused
    with the same ValueError, executable candidates from the command's own PATH)."""
    argv = [os.fsencode(a) for a in run.argv]
    env = []
    for k, v in run.env.items():
        k, v = os.fsencode(k), os.fsencode(v)
        if b"=" in k:
            raise ValueError("illegal environment variable name")
        env.append(k + b"=" + v)
    exe = argv[0]
    candidates = [exe] if os.path.dirname(exe) else [os.path.join(os.fsencode(d), exe)
                                                        for d in os.get_exec_path(run.env)]
    fields = [os.fsencode(run.cwd), str(len(argv)).encode(), *argv, str(len(candidates)).encode(), *candidates, *env]
    if any(b"\0" in f for f in fields):
        raise ValueError("embedded null byte")
    return b"\0".join(fields)



# ---------------------------------------------------------------- the agent


class Reaper:
    """Reaps every child of the agent the moment it exits, like an init: the agent is a child subreaper (pid 1 in a
    Kubernetes container), so orphans of commands become its children. Keeps the exit status of the children a
    request waits for (`spawn` registers them under the lock the reaper takes before deciding), drops the rest."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._tracked: set[int] = set()
        self._status: dict[int, int] = {}
        self._leaders: dict[int, tuple[int, int]] = {}  # untracked session leaders reaped lately: (start, code)
        self._eager_until = 0.0  # until then, look for new children often (orphans arrive without a spawn)
        threading.Thread(target=self._run, name="reaper", daemon=True).start()

    def spawn(self, start):  # start: () -> a Popen or a pid
        """Call `start()` (which forks) and track the child it returns, atomically with respect to reaping."""
        with self._cond:
            child = start()
            self._tracked.add(child if isinstance(child, int) else child.pid)
            self._cond.notify_all()
        return child

    def exited(self, pid: int) -> bool:
        with self._cond:
            return pid in self._status

    def adopt(self, pid: int, since_ticks: int | None = None) -> None:
        """Keep `pid`'s exit code should it become the agent's child (a command whose spawner died: orphans are
        re-parented to the agent); `forget` it once its exit code is known. A command that was re-parented, exited
        and reaped before this call (its spawner killed right after answering) is among the leaders reaped lately:
        with `since_ticks` (when it was started, clock ticks since boot), its exit code is taken from there."""
        with self._cond:
            self._tracked.add(pid)
            if since_ticks is not None and pid in self._leaders and self._leaders[pid][0] >= since_ticks:
                self._status[pid] = self._leaders.pop(pid)[1]
            self._cond.notify_all()

    def forget(self, pid: int) -> None:
        with self._cond:
            self._tracked.discard(pid)
            self._status.pop(pid, None)

    def wait(self, pid: int, timeout: float | None = None) -> int | None:
        """The exit code of a tracked child (negative: killed by that signal), once it exited; None when it did not
        within `timeout` seconds."""
        with self._cond:
            if not self._cond.wait_for(lambda: pid in self._status, timeout):
                return None
            self._tracked.discard(pid)
            return self._status.pop(pid)

    def expect_orphans(self, seconds: float) -> None:
        with self._cond:
            self._eager_until = time.monotonic() + seconds
            self._cond.notify_all()

    def claim_leader(self, since_ticks: int) -> int | None:
        """The one untracked session leader that started at or after `since_ticks` (clock ticks since boot) and was
        reaped since: tracked from now on, its exit code ready for `wait`. None when there is not exactly one. (A
        command whose spawner was killed before it answered, and which exited before the agent could find it.)"""
        with self._cond:
            found = [pid for pid, (start, _) in self._leaders.items() if start >= since_ticks]
            if len(found) != 1:
                return None
            self._tracked.add(found[0])
            self._status[found[0]] = self._leaders.pop(found[0])[1]
            return found[0]

    def _run(self) -> None:
        while True:
            try:  # look before reaping: an untracked session leader's /proc entry says when it started
                pid = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT).si_pid
            except ChildProcessError:  # no children at all: sleep until the next spawn, or (orphans arrive unasked)
                with self._cond:  # a moment while an adopted command or an orphan is awaited
                    self._cond.wait(0.005 if self._tracked or time.monotonic() < self._eager_until else 1.0)
                continue
            except InterruptedError:  # pragma: no cover - PEP 475 retries; defensive
                continue
            with self._cond:
                start = None if pid in self._tracked else _leader_start(pid)
            try:
                _, status = os.waitpid(pid, 0)
            except ChildProcessError:  # pragma: no cover - nobody else waits
                continue
            with self._cond:
                if pid in self._tracked:
                    self._status[pid] = os.waitstatus_to_exitcode(status)
                    self._cond.notify_all()
                elif start is not None:
                    self._leaders[pid] = (start, os.waitstatus_to_exitcode(status))
                    if len(self._leaders) > 256:
                        self._leaders.pop(next(iter(self._leaders)))


def _stat_fields(pid: "int | str") -> "list[bytes] | None":
    """The fields of /proc/PID/stat after the command name (which may hold spaces and parentheses): [0] state,
    [1] ppid, [2] pgrp, [3] session, [19] start time in clock ticks since boot; None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()
    except OSError:
        return None


def _stat_int(pid: "int | str", index: int) -> "int | None":
    """Field `index` of _stat_fields as an int; None when the process is gone or the field unreadable."""
    rest = _stat_fields(pid)
    try:
        return int(rest[index]) if rest is not None else None
    except (ValueError, IndexError):
        return None


def _leader_start(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), if it leads its own session (as every command does)."""
    rest = _stat_fields(pid)
    try:
        return int(rest[19]) if rest is not None and int(rest[3]) == pid else None
    except (ValueError, IndexError):
        return None


def _boot_ticks() -> int:
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def judge_python(identity: "Identity") -> str | None:
    """`judge-python` next to this file when the command user can execute it but not read it (see /health)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "judge-python")
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not identity.separated or not stat.S_ISREG(st.st_mode) or st.st_uid != 0:
        return None
    with identity.files():  # the command user's view (fsuid; X_OK also fails on a noexec mount)
        usable = os.access(path, os.X_OK, effective_ids=True) and not os.access(path, os.R_OK, effective_ids=True)
    return path if usable else None


class Agent:
    """Request handlers. Tracks the process groups it started (for timeouts and shutdown) and reaps every child
    (`Reaper`)."""

    def __init__(self, workspace: str, identity: Identity | None = None, writable: tuple[str, ...] = (),
                 cgroup: CommandCgroup | None = None, libc: ctypes.CDLL | None = None, *,
                 exit_grace_s: float = EXIT_GRACE_S, relay: str | None = None) -> None:
        self.workspace = os.path.realpath(workspace)
        self.exit_grace_s = exit_grace_s
        self.writable = tuple(os.path.realpath(d) for d in writable)
        self.identity = identity or Identity(None)
        self.cgroup = cgroup or CommandCgroup(None)
        self._libc = libc
        self._groups: set[int] = set()
        self._lock = threading.Lock()
        self._reaper = Reaper()
        self._kill_lock = threading.Lock()
        self.relay = relay  # commands run in another container: only through the relay's spawner
        self.judge_python = judge_python(self.identity)  # the backend put it there before the agent started
        self.counters = ResourceCounters(self.cgroup, (self.workspace, *self.writable))
        # separated (by uid, by cgroup or by container): commands start through a fork server that is already where
        # they belong
        separated = self.identity.separated or self.cgroup.enabled or relay
        self._targets = SignalTargets(self.identity)
        self._watch = SeccompWatch(self._targets) if separated and SECCOMP_POLICY == "notify" else None
        self._net = NetAttempts()
        self._spawner = Spawner(self.identity, self.cgroup, self._reaper, relay, self._watch) if separated else None
        if self._spawner is not None and relay:
            self._spawner.on_counter_files = self.counters.use_files

    def dispatch(self, method: str, path: str, body: "bytes | bytearray | BodyStream") -> "dict | FileBody":
        route, _, query = path.partition("?")
        if route == "/file" and method in ("GET", "PUT"):
            req = _query(query)
            return self.read(req) if method == "GET" else self.write(req, body)
        routes = {("GET", "/health"): self.health, ("POST", "/exec"): self.exec,
                  ("POST", "/kill_all"): self.kill_all}
        handler = routes.get((method, route))
        if handler is None:
            raise HTTPError(404 if method in ("GET", "POST", "PUT") else 405, f"no route {method} {path[:200]}",
                            "no_route")
        req = _json_body(body) if method == "POST" and not isinstance(body, BodyStream) else {}
        return handler(req)

    def health(self, req: dict) -> dict:
        return {"ok": True, "pid": os.getpid(), "version": VERSION, "workspace": self.workspace,
                "writable": list(self.writable),
                "uid_separated": self.identity.separated, "command_uid": self.identity.uid,
                "resources_separated": self.cgroup.enabled or self.relay is not None,
                "commands_apart": self.relay is not None, "judge_python": self.judge_python,
                "seccomp": self._seccomp_mode()}

    def _seccomp_mode(self) -> str:
        """The syscall policy commands run under: notify (refusals counted), errno (refused, not counted), or
        "none: why" (no spawner: not separated, or it cannot start here, and commands start through setpriv)."""
        spawner = self._spawner
        if spawner is None:
            return "none: commands are not separated from the agent (no spawner)"
        return "none: the spawner cannot start here" if spawner.unusable else spawner.seccomp

    def probes(self) -> dict[str, int]:
        """What was observed since the last report: the syscall policy's refusals and signals to foreign processes
        (SeccompWatch.take, none without a watch) and "network_attempt" (NetAttempts.take)."""
        out = self._watch.take() if self._watch is not None else {}
        net = self._net.take()
        if net:
            out["network_attempt"] = out.get("network_attempt", 0) + net
        return out

    def exec(self, req: dict) -> dict:
        argv = _argv(req.get("cmd"))
        timeout = _number(req, "timeout", 30.0)
        limit = int(min(_number(req, "output_limit", DEFAULT_OUTPUT_LIMIT), MAX_OUTPUT))
        kill_leftovers = req.get("kill_leftovers", False)
        if not isinstance(kill_leftovers, bool):
            raise HTTPError(400, f"field 'kill_leftovers' must be true or false, got {kill_leftovers!r}")
        env = dict(os.environ)
        env.update(_str_map(req.get("env"), "env"))
        cwd = os.path.join(self.workspace, req.get("cwd") or ".")
        if not os.path.isdir(cwd):
            return _result(1, b"", f"agent: cwd {req.get('cwd')!r} is not a directory\n".encode(), False, False,
                           time.monotonic())
        stdin = req.get("stdin")
        if stdin is not None and not isinstance(stdin, str):
            raise HTTPError(400, "field 'stdin' must be a string")
        run = ExecRun(argv, cwd, env, None if stdin is None else stdin.encode(), limit, self.identity, self.cgroup)
        before = self.counters.read()
        start = time.monotonic()
        try:
            proc = self._start(run, start + timeout)
        except OSError as e:
            code = 127 if isinstance(e, FileNotFoundError) else 126
            return _result(code, b"", f"{argv[0]}: {e.strerror or e}\n".encode(), False, False, start)
        except SpawnerLost as e:  # the policy killed or stopped the spawner: its failure, a result like the above
            late = time.monotonic() >= start + timeout
            code = None if late else -signal.SIGKILL if e.killed_in_flight else 126
            return _result(code, b"", f"agent: {e}\n".encode(), late, False, start)
        grader = self.judge_python is not None and argv[0] == self.judge_python
        with self._lock:
            self._groups.add(proc.pid)
            if grader:
                self._targets.graders.add(proc.pid)
        try:
            result = self._finish(run, proc, start + timeout, start)
        finally:
            with self._lock:
                self._groups.discard(proc.pid)
                self._targets.graders.discard(proc.pid)
        if kill_leftovers:
            self._kill_leftovers()
        result["probes"] = self.probes()
        result["resources"] = self.counters.delta(before)
        return result

    def _start(self, run: ExecRun, deadline: float) -> "subprocess.Popen | _Spawned":
        """Start `run`'s command as the command user in `commands`: through the spawner (one clone + exec), or,
        without separation or where the spawner cannot work, with Popen (through setpriv / the cgroup shell)."""
        spawner = self._spawner
        if spawner is not None and not spawner.unusable:
            try:
                spawner.ensure(deadline)
                since = _boot_ticks()
                try:
                    proc = spawner.spawn(run, deadline)
                except _GoneBefore:
                    spawner.ensure(deadline)
                    proc = spawner.spawn(run, deadline)
                self._reaper.adopt(proc.pid, since)  # its exit code, should the policy kill the spawner meanwhile
                return proc
            except SpawnerUnusable as e:
                if self.relay:  # no fallback: a command started here would run in the agent's own container
                    raise HTTPError(500, f"the command spawner cannot start in the sandbox container: {e}") from None
                print(f"agent: the command spawner cannot work here ({e}); commands start through setpriv",
                      file=sys.stderr, flush=True)
                spawner.unusable = True
        proc = self.cgroup.start(lambda: self._reaper.spawn(run.start))
        if not _prefer_oom_kill(proc.pid):  # setpriv has not switched uid yet: the file is still root's, or
            with self.identity.files():  # it has (or Popen did): the file is the command user's
                _prefer_oom_kill(proc.pid)
        return proc

    def _finish(self, run: ExecRun, proc: "subprocess.Popen | _Spawned", deadline: float, start: float) -> dict:
        spawned = isinstance(proc, _Spawned)
        if spawned and proc.link is not None:
            exited = lambda: proc.link.exited(proc.pid)  # noqa: E731
        elif spawned and self.relay and proc.pidfd is not None:  # an orphan elsewhere: its pidfd says when it ended
            exited = lambda: bool(select.select([proc.pidfd], [], [], 0)[0])  # noqa: E731
        else:
            exited = lambda: self._reaper.exited(proc.pid)  # noqa: E731
        try:
            closed = run.pump(proc, deadline, exited, self.exit_grace_s)
        except BaseException:
            _killpg(proc.pid)
            raise
        if not closed:
            _killpg(proc.pid)  # pgid == pid of the main process (start_new_session); also kills SIGTERM-ignorers
            run.drain(proc, DRAIN_AFTER_KILL_S)
        if spawned:
            code = proc.returncode = self._spawner_wait(proc, deadline, run)
        else:
            code = proc.returncode = self._reaper.wait(proc.pid)  # the reaper collected it (never Popen.wait)
        for stream in (proc.stdout, proc.stderr, proc.stdin):
            if stream is not None:
                stream.close()
        return _result(None if run.timed_out else code, run.out, run.err, run.timed_out, run.truncated, start)

    def _spawner_wait(self, proc: _Spawned, deadline: float, run: ExecRun) -> int:
        """The command's exit code from its spawner or, when the policy killed (or stopped) the spawner meanwhile,
        from the reaper (the command was re-parented to the agent); 126 and a note when neither has it."""
        try:
            code = self._spawner.wait(proc)
            if code is None and not self.relay:  # with --relay no command is ever the agent's child
                code = self._reaper.wait(proc.pid, STATUS_GRACE_S)
        finally:
            self._reaper.forget(proc.pid)
            if proc.pidfd is not None:
                os.close(proc.pidfd)
        if code is None:  # lost between the spawner's answer and adopt(): the policy's doing
            run.err += b"\nagent: the command's exit code was lost: its spawner was killed or stopped (by the " \
                       b"sandbox's own processes or the commands' memory limit)\n"
            return 126
        return code

    def write(self, req: dict, body: "bytes | bytearray | BodyStream") -> dict:
        """PUT /file: the body written into the file as it arrives, FILE_CHUNK bytes at a time."""
        mode = req.get("mode", "420")
        if not mode.isdigit() or int(mode) > 0o7777:
            raise HTTPError(400, f"query field 'mode' must be a decimal permission number such as 420 (0o644), "
                                 f"got {mode[:40]!r}")
        mode_bits = int(mode)
        roots = (self.workspace, *self.writable)
        chunks = body.chunks() if isinstance(body, BodyStream) else iter((memoryview(body),) if body else ())
        written = 0
        with self.identity.files(), _Denied403(req.get("path")):
            target = resolve_in_workspace(self.workspace, req.get("path"), self.writable)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            target = resolve_in_workspace(self.workspace, target, self.writable)  # a parent may be a symlink now
            fd = open_regular(target, roots, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode_bits, req["path"])
            try:
                for view in chunks:
                    written += len(view)
                    while view:
                        view = view[os.write(fd, view):]
                os.fchmod(fd, mode_bits)
            finally:
                os.close(fd)
        return {"ok": True, "bytes": written}

    def read(self, req: dict) -> "FileBody":
        """GET /file: the file streamed from its descriptor (FileBody), refused before anything is sent when it
        is larger than the reader's `max`."""
        limit = req.get("max")
        if limit is not None and not limit.isdigit():
            raise HTTPError(400, f"query field 'max' must be a number of bytes, got {limit[:40]!r}")
        with self.identity.files(), _Denied403(req.get("path")):
            target = resolve_in_workspace(self.workspace, req.get("path"), self.writable)
            fd = open_regular(target, (self.workspace, *self.writable), os.O_RDONLY, 0, req["path"])
        try:
            size = os.fstat(fd).st_size
            if limit is not None and size > int(limit):
                raise HTTPError(413, f"file {req['path']!r} is larger than the reader's limit of {limit} bytes "
                                     f"(max; it has {size}); read it in parts via exec", "too_large")
        except BaseException:
            os.close(fd)
            raise
        return FileBody(fd, size)

    # ------------------------------------------------------------ leftovers

    def kill_all(self, req: dict) -> dict:
        return {"killed": self._kill_leftovers(), "probes": self.probes()}

    def _kill_leftovers(self) -> int:
        """Kill every process the commands left (through their cgroup when resource-separated, else by uid or
        descent), then remove the command user's SysV IPC objects (uid-separated: the IPC namespace is the
        sandbox's own); returns how many distinct processes were killed."""
        spawner = {self._spawner.pid} if self._spawner is not None else set()  # killed too, not counted
        if self.cgroup.enabled:
            killed = self.cgroup.kill(KILL_ALL_DEADLINE_S, spawner)
        else:
            killed = self._kill_by_owner(spawner)
        if self.identity.separated and self._libc is not None:
            remove_sysv_ipc(self._libc, self.identity.uid)
        return killed

    def _kill_by_owner(self, uncounted: set) -> int:
        """SIGKILL every process of the command user (separated) or every descendant of the agent (single uid),
        round after round, until none is left alive; returns how many distinct processes were killed."""
        seen: set[int] = set()
        end = time.monotonic() + KILL_ALL_DEADLINE_S
        with self._kill_lock:
            while True:
                live = _command_user_pids(self.identity.uid) if self.identity.separated else _descendants()
                if not live:
                    return len(seen - uncounted)
                seen |= live
                if time.monotonic() > end:
                    raise HTTPError(409, f"policy processes survived kill: {len(live)} process(es) of the command "
                                         f"user survived SIGKILL for {KILL_ALL_DEADLINE_S:g}s: {sorted(live)[:10]}",
                                    "survivors")
                if self.identity.separated:
                    self._signal_all_as_command_user()
                else:
                    for pid in live:
                        _kill(pid)
                time.sleep(0.001)  # let the kernel finish the killed processes before looking again

    def _signal_all_as_command_user(self) -> None:
        """kill(-1, SIGKILL) as the command user: it reaches every process of that uid in this pid namespace at once
        (so a process forking in a loop cannot outrun it) and nothing else. From this thread alone (raw setresuid),
        so no fork is needed (a pids limit the agent shares with the commands, a pod's, may be full); from a forked
        child where that cannot be done."""
        if self._libc is not None and kill_all_as(self._libc, self.identity.uid):
            return
        self._reaper.wait(self._reaper.spawn(self._fork_killer))

    def _fork_killer(self) -> int:
        i = self.identity
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                os.setgroups([])
                os.setgid(i.gid)
                os.setuid(i.uid)
                os.kill(-1, signal.SIGKILL)
                code = 0
            except BaseException:
                pass
            os._exit(code)
        return pid

    def kill_groups(self) -> None:
        if self._spawner is not None:
            self._spawner.close()
        with self._lock:
            groups = list(self._groups)
        for pgid in groups:
            _killpg(pgid)


class _Denied403:
    """Turns PermissionError (the command user may not access the path) into a 403 naming the path."""

    def __init__(self, path: object) -> None:
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        if exc_type is not None and issubclass(exc_type, PermissionError):
            raise HTTPError(403, f"path {self.path!r} is not accessible to the sandbox user: {exc}") from None


def _proc_fields(pid: str) -> tuple[str, int] | None:
    """(state, ppid) of a process from /proc/PID/stat; None when it is gone."""
    rest = _stat_fields(pid)
    if rest is None:
        return None
    return rest[0].decode(), int(rest[1])


def _command_user_pids(uid: int) -> set[int]:
    """Live (not zombie) processes whose real uid is `uid`."""
    out = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                text = f.read()
        except OSError:
            continue
        state = text.partition(b"\nState:")[2].split(None, 1)[:1]
        uids = text.partition(b"\nUid:")[2].split(None, 1)[:1]
        if uids and int(uids[0]) == uid and state and state[0] != b"Z":
            out.add(int(name))
    return out


def _descendants() -> set[int]:
    """Live (not zombie) descendants of this process (orphans included: the agent is their subreaper)."""
    children: dict[int, list[int]] = {}
    zombies = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _proc_fields(name)
        if fields is None:
            continue
        children.setdefault(fields[1], []).append(int(name))
        if fields[0] == "Z":
            zombies.add(int(name))
    out, todo = set(), [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out - zombies


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _result(code: int | None, out: bytes, err: bytes, timed_out: bool, truncated: bool, start: float) -> dict:
    return {"exit_code": code, "stdout": bytes(out).decode("utf-8", "replace"),
            "stderr": bytes(err).decode("utf-8", "replace"), "timed_out": timed_out, "truncated": truncated,
            "duration_s": round(time.monotonic() - start, 6)}


def _query(query: str) -> dict[str, str]:
    """The fields of a query string (percent-encoded UTF-8, the last of a repeated name wins); 400 when one cannot
    be decoded."""
    from urllib.parse import unquote  # only file transfers need it

    out: dict[str, str] = {}
    for part in query.split("&") if query else ():
        name, _, value = part.partition("=")
        try:
            out[unquote(name, errors="strict")] = unquote(value, errors="strict")
        except UnicodeDecodeError as e:
            raise HTTPError(400, f"query field {name[:40]!r} is not percent-encoded UTF-8: {e}", "bad_path") \
                from None
    return out


def _json_body(body: bytes) -> dict:
    try:
        req = json.loads(body or b"{}")
    except ValueError as e:
        raise HTTPError(400, f"body is not JSON: {e}") from None
    if not isinstance(req, dict):
        raise HTTPError(400, "body must be a JSON object")
    return req


def _argv(cmd: object) -> list[str]:
    if isinstance(cmd, str) and cmd:
        return ["/bin/sh", "-c", cmd]
    if isinstance(cmd, list) and cmd and all(isinstance(a, str) for a in cmd):
        return list(cmd)
    raise HTTPError(400, "field 'cmd' must be a non-empty string (run by /bin/sh -c) or a list of strings")


def _number(req: dict, key: str, default: float) -> float:
    value = req.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise HTTPError(400, f"field {key!r} must be a positive number, got {value!r}")
    return float(value)


def _str_map(value: object, key: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise HTTPError(400, f"field {key!r} must be an object of string to string")
    return value


# ---------------------------------------------------------------- HTTP/1.1

MAX_REQUEST_LINE = 8192
MAX_HEAD = 16 * 1024  # request line + headers
MAX_HEADERS = 64
MAX_PENDING = 128  # connections still sending their first request head; beyond it the oldest is dropped
MAX_WORKERS = 32  # authorized connections served at once, one thread each; beyond it new ones get 503
PARKED_WORKERS = 4  # worker threads started up front and kept between connections: served even when no thread can
#                    start (a pod's pids limit, which the agent shares with the commands, is full)
HANDSHAKE_TIMEOUT_S = 10.0  # a new connection must send a complete first request head within this
IDLE_TIMEOUT_S = 300.0  # an authorized keep-alive connection silent this long is closed (the client reuses < 60 s)
ACCEPTS_PER_ROUND = 64


class FileBody:
    """The answer of GET /file: `size` bytes (the file's size by fstat once opened) sent from the descriptor
    FILE_CHUNK bytes at a time through one reused buffer, then one status byte: b"." when the file still had
    exactly `size` bytes at the end, b"!" when it changed size while read or a read failed (zero-padded to `size`
    first, so the answer always has its announced length: the host is never left waiting, and never takes a
    short file for the whole one). Owns `fd` until send() returns (or close() when it is never sent)."""

    DONE, CHANGED = b".", b"!"

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size

    def __len__(self) -> int:
        return self.size + 1

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def send(self, conn: socket.socket, head: bytes) -> None:
        try:
            conn.sendall(head)
            buf = memoryview(bytearray(min(FILE_CHUNK, max(self.size, 1))))
            sent, status = 0, self.DONE
            while sent < self.size:
                want = min(len(buf), self.size - sent)
                try:
                    n = os.readv(self.fd, [buf[:want]]) if status == self.DONE else 0
                except OSError:
                    n = 0
                if n == 0:  # shrank (or unreadable): pad, so the answer keeps its announced length
                    status = self.CHANGED
                    buf[:want] = bytes(want)
                    n = want
                conn.sendall(buf[:n])
                sent += n
            if status == self.DONE:
                try:
                    grew = os.fstat(self.fd).st_size != self.size or os.pread(self.fd, 1, self.size) != b""
                except OSError:
                    grew = True
                status = self.CHANGED if grew else self.DONE
            conn.sendall(status)
        finally:
            self.close()


class BodyStream:
    """The body of a PUT /file request, read from the connection as it is used: chunks() yields it at most
    FILE_CHUNK bytes at a time through one reused buffer; drain() reads and drops what is left (an error answered
    before the whole body was used), so the connection stays in step for the next request."""

    def __init__(self, reader: "_Reader", length: int) -> None:
        self.reader, self.left = reader, length
        self._buf: memoryview | None = None

    def chunks(self) -> "Iterator[memoryview]":
        while self.left:
            if self.reader.buf:  # what arrived with the head comes first
                take = bytes(self.reader.buf[:self.left])
                del self.reader.buf[:len(take)]
                self.left -= len(take)
                yield memoryview(take)
                continue
            if self._buf is None:
                self._buf = memoryview(bytearray(min(FILE_CHUNK, self.left)))
            n = self.reader.conn.recv_into(self._buf, min(len(self._buf), self.left))
            if n == 0:
                raise ConnectionAbortedError(f"the request body ended {self.left} bytes early")
            self.left -= n
            yield self._buf[:n]

    def drain(self) -> bool:
        """Read and drop the rest of the body; False when the connection ended first."""
        try:
            for _ in self.chunks():
                pass
        except OSError:
            return False
        return True


class _Reader:
    """Buffered reads from a connection, starting with the bytes the acceptor already received."""

    def __init__(self, conn: socket.socket, initial: bytes = b"") -> None:
        self.conn = conn
        self.buf = bytearray(initial)

    def _fill(self) -> bool:
        data = self.conn.recv(CHUNK)
        self.buf += data
        return bool(data)

    def readline(self, limit: int) -> bytes:
        """Up to and including the next b"\\n"; fewer bytes at EOF; `limit` bytes when the line is longer."""
        scanned = 0
        while True:
            i = self.buf.find(b"\n", scanned, limit)
            if i >= 0:
                n = i + 1
                break
            if len(self.buf) >= limit:
                n = limit
                break
            scanned = len(self.buf)
            if not self._fill():
                n = len(self.buf)
                break
        line = bytes(self.buf[:n])
        del self.buf[:n]
        return line

    def read(self, n: int) -> bytes | bytearray:
        """Exactly `n` bytes, fewer only at EOF."""
        if len(self.buf) >= n:
            out = bytes(self.buf[:n])
            del self.buf[:n]
            return out
        out, self.buf = self.buf, bytearray()
        while len(out) < n:
            data = self.conn.recv(min(n - len(out), 1 << 20))
            if not data:
                break
            out += data
        return out


class _Head:
    """A parsed request line and headers."""

    def __init__(self, method: str, target: str, headers: dict[str, str], length: int) -> None:
        self.method, self.target, self.headers, self.length = method, target, headers, length

    @property
    def keep_alive(self) -> bool:
        return self.headers.get("connection", "").lower() != "close"


def _read_head(reader: _Reader) -> _Head | None:
    """The next request head, None at EOF before it; HTTPError(400/431) for a malformed or oversized one."""
    line = reader.readline(MAX_REQUEST_LINE + 1)
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not line.endswith(b"\n"):
        raise HTTPError(400, f"bad request line {line[:100]!r}")
    headers: dict[str, str] = {}
    size = len(line)
    while True:
        h = reader.readline(MAX_HEAD + 1)
        size += len(h)
        if size > MAX_HEAD or len(headers) >= MAX_HEADERS:
            raise HTTPError(431, f"request head larger than {MAX_HEAD} bytes or {MAX_HEADERS} headers")
        if h in (b"\r\n", b"\n"):
            break
        if not h.endswith(b"\n"):
            raise HTTPError(400, "connection closed inside the request head")
        name, _, value = h.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = headers.get("content-length", "0").strip() or "0"
    if not length.isdigit():  # digits only: a negative length must not read to EOF
        raise HTTPError(400, f"bad Content-Length {length[:40]!r}")
    return _Head(parts[0], parts[1], headers, int(length))


def _head_complete(buf: bytearray) -> bool:
    return b"\r\n\r\n" in buf or b"\n\n" in buf


def _answer(conn: socket.socket, status: int, obj: "dict | FileBody", keep: bool) -> None:
    if STOPPING.is_set():  # SIGTERM: the shutdown kills the commands, and an answer now would report that death (a
        if isinstance(obj, FileBody):
            obj.close()
        conn.shutdown(socket.SHUT_RDWR)  # command "killed:9") as the command's own outcome; the host must see the
        raise ConnectionAbortedError("the agent is stopping")  # connection drop, the sandbox's death, instead
    tail = "" if keep else "Connection: close\r\n"
    if isinstance(obj, FileBody):
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/octet-stream\r\n"
                f"Content-Length: {len(obj)}\r\n{tail}\r\n").encode()
        obj.send(conn, head)
        return
    payload = json.dumps(obj).encode()
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n{tail}\r\n")
    conn.sendall(head.encode() + payload)


def _error_body(e: HTTPError) -> dict:
    return {"error": e.message, **({"kind": e.kind} if e.kind else {})}


def _refuse(conn: socket.socket, e: HTTPError) -> None:
    """Best-effort answer on a connection about to be closed by the acceptor (never blocks it)."""
    payload = json.dumps(_error_body(e)).encode()
    try:
        conn.send(f"HTTP/1.1 {e.status} {_REASONS.get(e.status, 'Error')}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
    except OSError:
        pass
    conn.close()


def serve_connection(conn: socket.socket, agent: Agent, token: str | None, reader: _Reader,
                     head: _Head | None = None, release: "Callable[[], bool] | None" = None) -> None:
    """Keep-alive loop for one authorized connection: read a request, check its token before reading its body,
    dispatch, answer, repeat until EOF, close, a malformed request or IDLE_TIMEOUT_S of silence. `release()` true
    after a request: answer it with Connection: close and end (another connection waits for this thread)."""
    try:
        while True:
            try:
                head = head or _read_head(reader)
            except HTTPError as e:
                _answer(conn, e.status, _error_body(e), False)
                return
            if head is None:
                return
            if token is not None and not _authorized(head.headers, token):
                _answer(conn, 401, {"error": "missing or wrong bearer token (header 'Authorization: Bearer "
                                             "<token>')"}, False)
                return
            streamed = head.method == "PUT"  # a file's body: read as it is written (BodyStream), no cap
            if head.length > MAX_BODY and not streamed:
                _answer(conn, 413, {"error": f"request body larger than {MAX_BODY} bytes"}, False)
                return
            body: bytes | bytearray | BodyStream
            if streamed:
                body = BodyStream(reader, head.length)
            else:
                raw = reader.read(head.length) if head.length else b""
                if len(raw) != head.length:
                    return
                body = raw
            status, obj = _handle(agent, head.method, head.target, body)
            if isinstance(body, BodyStream) and not body.drain():  # the rest of a body the handler did not use
                if isinstance(obj, FileBody):
                    obj.close()
                return
            keep = head.keep_alive and not (release is not None and release())
            _answer(conn, status, obj, keep)
            if not keep:
                return
            head = None
    except (OSError, ValueError):  # peer gone, idle timeout: drop the connection
        return
    finally:
        conn.close()


def _handle(agent: Agent, method: str, target: str,
            body: "bytes | bytearray | BodyStream") -> tuple[int, "dict | FileBody"]:
    try:
        return 200, agent.dispatch(method, target, body)
    except HTTPError as e:
        return e.status, _error_body(e)
    except FileNotFoundError as e:
        return 404, {"error": f"not found: {e.filename or e}"}
    except (IsADirectoryError, NotADirectoryError) as e:
        return 400, {"error": f"{e.strerror}: {e.filename}"}
    except OSError as e:
        return 400, {"error": f"{type(e).__name__}: {e}"}
    except Exception as e:  # a bug in the agent: report it, keep serving
        return 500, {"error": f"agent error {type(e).__name__}: {e}"}


def _authorized(headers: dict, token: str) -> bool:
    import hmac  # only tcp agents need it (importing hashlib costs start-up time)

    value = headers.get("authorization", "")
    return value.startswith("Bearer ") and hmac.compare_digest(value[7:].encode(), token.encode())


def _from_inside(conn: socket.socket) -> bool:
    """A tcp connection whose peer address is the agent's own: it comes from inside the sandbox (pod), never from
    the host side. Unix sockets: False (only the host side can reach the socket under uid separation)."""
    if conn.family == socket.AF_UNIX:
        return False
    try:
        return conn.getpeername()[0] == conn.getsockname()[0]
    except OSError:
        return True


class Acceptor:
    """Accepts connections and holds each, in this one thread, until its first request head is complete: at most
    MAX_PENDING at once, each for at most `handshake_timeout_s`, at most MAX_HEAD bytes. Only then is the bearer
    token checked; an authorized connection gets a worker thread (at most MAX_WORKERS), a wrong token 401 and close.
    A flood of idle or unauthenticated connections from inside the sandbox therefore costs the agent no thread and
    a bounded number of file descriptors. When full, a new connection pushes out the oldest pending one that came
    from the sandbox itself (tcp: its peer address is the agent's own), so a flood from inside cannot push out the
    host's connection while its request is on the way; only without such a one the oldest of all."""

    def __init__(self, sock: socket.socket, agent: Agent, token: str | None, *,
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S) -> None:
        self.sock, self.agent, self.token = sock, agent, token
        self.handshake_timeout_s = handshake_timeout_s
        self.sel = selectors.DefaultSelector()
        self.pending: dict[socket.socket, tuple[bytearray, float, bool]] = {}  # in accept order; bool: local
        self.workers = 0
        self._lock = threading.Lock()
        self._jobs: "queue.SimpleQueue[tuple[socket.socket, _Reader, _Head]]" = queue.SimpleQueue()
        self.parked = 0  # kept worker threads waiting for a connection (_jobs), less the connections waiting for one
        for _ in range(PARKED_WORKERS):
            threading.Thread(target=self._parked, name="agent-worker", daemon=True).start()
            self.parked += 1

    def serve_forever(self) -> None:
        self.sock.setblocking(False)
        self.sel.register(self.sock, selectors.EVENT_READ)
        while True:
            ready = self.sel.select(self._wait())
            accept = False
            for key, _ in ready:
                if key.fileobj is self.sock:
                    accept = True
                elif key.fileobj in self.pending:
                    self._receive(key.fileobj)
            if accept:
                self._accept()
            self._expire()

    def _wait(self) -> float | None:
        if not self.pending:
            return None
        return max(0.0, next(iter(self.pending.values()))[1] - time.monotonic())

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_ROUND):
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return
            except OSError as e:  # EMFILE/ENFILE/ENOBUFS: shed the oldest pending connection, else back off
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if self.pending:
                        self._drop(self._victim())
                    else:
                        time.sleep(0.01)
                return
            conn.setblocking(False)
            if conn.family != socket.AF_UNIX:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while len(self.pending) >= MAX_PENDING:
                self._drop(self._victim())
            self.pending[conn] = (bytearray(), time.monotonic() + self.handshake_timeout_s, _from_inside(conn))
            self.sel.register(conn, selectors.EVENT_READ)
            self._receive(conn)  # the client usually sent its request with the connect

    def _victim(self) -> socket.socket:
        """The pending connection to push out: the oldest from inside the sandbox, else the oldest."""
        return next((c for c, (_, _, inside) in self.pending.items() if inside), next(iter(self.pending)))

    def _receive(self, conn: socket.socket) -> None:
        buf = self.pending[conn][0]
        try:
            data = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        buf += data
        if _head_complete(buf):
            self._admit(conn, buf)
        elif len(buf) > MAX_HEAD:
            self._forget(conn)
            _refuse(conn, HTTPError(431, f"request head larger than {MAX_HEAD} bytes"))

    def _admit(self, conn: socket.socket, buf: bytearray) -> None:
        self._forget(conn)
        reader = _Reader(conn, bytes(buf))
        try:
            head = _read_head(reader)  # complete in the buffer: no recv on the non-blocking socket
        except (HTTPError, OSError) as e:
            _refuse(conn, e if isinstance(e, HTTPError) else HTTPError(400, "malformed request head"))
            return
        if head is None:
            conn.close()
            return
        if self.token is not None and not _authorized(head.headers, self.token):
            _refuse(conn, HTTPError(401, "missing or wrong bearer token (header 'Authorization: Bearer <token>')"))
            return
        with self._lock:
            full = self.workers >= MAX_WORKERS
            parked = not full and self.parked > 0
            if not full:
                self.workers += 1
            if parked:
                self.parked -= 1
        if full:
            _refuse(conn, HTTPError(503, f"the agent serves {MAX_WORKERS} connections already"))
            return
        conn.setblocking(True)
        conn.settimeout(IDLE_TIMEOUT_S)
        if parked:
            self._jobs.put((conn, reader, head))
            return
        try:
            threading.Thread(target=self._work, args=(conn, reader, head), daemon=True).start()
        except RuntimeError:  # no thread can be started (pids limit): the next kept worker that is free serves it
            with self._lock:
                self.parked -= 1  # parked = idle kept workers - connections waiting for one
            self._jobs.put((conn, reader, head))

    def _work(self, conn: socket.socket, reader: _Reader, head: _Head) -> None:
        try:
            serve_connection(conn, self.agent, self.token, reader, head)
        finally:
            self._done()

    def _parked(self) -> None:
        """A worker kept for the agent's life: serves one connection after another (handed over by _admit)."""
        while True:
            conn, reader, head = self._jobs.get()
            try:
                serve_connection(conn, self.agent, self.token, reader, head, release=lambda: self.parked < 0)
            except Exception:  # serve_connection answers errors itself; never lose this thread
                pass
            finally:
                with self._lock:
                    self.workers -= 1
                    self.parked += 1

    def _done(self) -> None:
        with self._lock:
            self.workers -= 1

    def _expire(self) -> None:
        now = time.monotonic()
        while self.pending:
            conn, (_, deadline, _) = next(iter(self.pending.items()))
            if deadline > now:
                return
            self._drop(conn)

    def _forget(self, conn: socket.socket) -> None:
        del self.pending[conn]
        self.sel.unregister(conn)

    def _drop(self, conn: socket.socket) -> None:
        self._forget(conn)
        conn.close()


# ---------------------------------------------------------------- main


def _listen(opts: dict[str, str]) -> socket.socket:
    unix = opts.get("--unix")
    if unix:
        try:
            os.unlink(unix)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(unix)
        os.chmod(unix, 0o600)
    else:
        host, _, port = opts["--tcp"].rpartition(":")
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]") or "0.0.0.0", int(port)))
    sock.listen(128)
    return sock


def _token(opts: dict[str, str]) -> str | None:
    if "--unix" in opts:
        return None
    token = os.environ.pop("AGENTRL_AGENT_TOKEN", "")  # popped: commands inherit the agent's environment
    if "--token-file" in opts:
        with open(opts["--token-file"], encoding="utf-8") as f:
            token = f.read().strip()
    if not token:
        sys.exit("agent: --tcp needs a bearer token: pass --token-file FILE or set AGENTRL_AGENT_TOKEN")
    return token


USAGE = ("usage: agent.py (--unix PATH | --tcp HOST:PORT [--token-file FILE]) --workspace DIR [--run-as UID:GID] "
         "[--writable DIR[:DIR...]] [--cgroups v1:DIR[:DIR...] | v2:DIR | --relay NAME] [--exit-grace SECONDS] "
         "[--handshake-timeout SECONDS]")
OPTIONS = ("--unix", "--tcp", "--token-file", "--workspace", "--run-as", "--writable", "--cgroups", "--exit-grace",
           "--handshake-timeout", "--relay")


def _parse(argv: list[str] | None) -> dict[str, str]:
    """--unix | --tcp, --token-file, --workspace, --run-as, --writable, --exit-grace, --handshake-timeout
    (hand-parsed: argparse costs ~10 ms)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) % 2 or any(k not in OPTIONS for k in args[::2]):
        sys.exit(USAGE)
    opts = dict(zip(args[::2], args[1::2]))
    if ("--unix" in opts) == ("--tcp" in opts) or "--workspace" not in opts or ("--relay" in opts and (
            "--cgroups" in opts or not opts["--relay"])):
        sys.exit(USAGE)
    return opts


def _run_as(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    uid, sep, gid = value.partition(":")
    if not (sep and uid.isdigit() and gid.isdigit()) or int(uid) == 0 or int(gid) == 0:
        sys.exit(f"agent: --run-as {value!r}: use UID:GID with both non-zero, e.g. --run-as 1000:1000")
    return int(uid), int(gid)


def _seconds(opts: dict[str, str], name: str, default: float) -> float:
    value = opts.get(name)
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < 3600:
        sys.exit(f"agent: {name} {value!r}: use a number of seconds between 0 and 3600, e.g. {name} {default:g}")
    return seconds


STOPPING = threading.Event()  # set by SIGTERM before the commands are killed: no answer leaves after it


def _on_sigterm(signum: int, frame: object) -> None:
    STOPPING.set()
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    opts = _parse(argv)
    token = _token(opts)
    identity = Identity(_run_as(opts.get("--run-as")))
    writable = tuple(d for d in opts.get("--writable", "").split(":") if d)
    for d in (opts["--workspace"], *writable):
        os.makedirs(d, exist_ok=True)
    libc = _prctl_setup()
    identity.setup(libc, opts["--workspace"], writable)
    if "--relay" in opts:
        wait_for_relay(opts["--relay"])
    agent = Agent(opts["--workspace"], identity, writable, CommandCgroup(opts.get("--cgroups")), libc,
                  exit_grace_s=_seconds(opts, "--exit-grace", EXIT_GRACE_S), relay=opts.get("--relay"))
    sock = _listen(opts)
    acceptor = Acceptor(sock, agent, token,
                        handshake_timeout_s=_seconds(opts, "--handshake-timeout", HANDSHAKE_TIMEOUT_S))
    signal.signal(signal.SIGTERM, _on_sigterm)
    print(READY_LINE, flush=True)
    try:
        acceptor.serve_forever()
    finally:
        agent.kill_groups()
        sock.close()
        if "--unix" in opts:
            try:
                os.unlink(opts["--unix"])
            except OSError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
