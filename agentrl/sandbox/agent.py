#!/usr/bin/env python3
"""The in-sandbox agent: a single-file, stdlib-only HTTP/1.1 server that runs INSIDE a sandbox.

It is copied verbatim into bubblewrap sandboxes, Docker containers and Kubernetes pods, so it imports nothing
outside the Python 3.11 standard library and nothing of agentrl. It owns: executing commands (process groups,
deadlines, output caps), reading/writing files confined to the workspace (and the backend's extra writable
directories, `--writable DIR[:DIR...]`, e.g. /repo), killing what commands leave behind, and
answering health checks. It does not own isolation or limits: the backend that started it applies those around it.

    agent.py --unix PATH --workspace DIR [--run-as UID:GID] [--writable D1:D2] [--cgroups v1|v2:D1[:D2...]]
                                                                               (local / docker: unix socket)
    agent.py --tcp HOST:PORT --token-file F --workspace DIR [--run-as U:G]     (kubernetes: bearer token required)

uid separation (`--run-as UID:GID`, the agent itself runs as uid 0 with only CAP_SETUID, CAP_SETGID, CAP_KILL and,
where the backend's workspace is not pre-owned, CAP_CHOWN): every command runs as UID:GID with no supplementary
groups and no_new_privs, so it can neither signal, ptrace nor read the agent (its /proc entries, environ, fds), its
token or its socket directory; file requests are served with the thread's fsuid/fsgid set to UID:GID, so they get
exactly the command user's access (a symlink swapped in by a command cannot make the agent read a root-only file),
and what they create is owned by UID:GID. Without --run-as, commands run as the agent's own uid: nothing separates
them from it (`uid_separated: false` in /health). The agent is a child subreaper: orphans of commands are re-parented
to it (and reaped by it), so "every process a command left behind" is well defined in both modes.

Resource separation (`--cgroups v1:D1:D2...` or `--cgroups v2:D`, each D a sandbox cgroup directory with `agent` and
`commands` children, the agent in `agent`): every command starts in `commands`, which carries the sandbox's memory,
pids and CPU limits, so a command filling them cannot take the agent's (`resources_separated` in /health). cgroup
v1: the spawning thread joins `commands` (its `tasks` files) for the fork and returns to `agent`, so no extra
process is started; v2 (no per-thread membership): the command is started through `/bin/sh -c` which joins
`commands` before it execs the command. Killing is then done through the cgroup: `cgroup.kill` (v2) or SIGKILL of
every process in `commands`' cgroup.procs, round after round, no fork needed; and /kill_all removes the sandbox's
SysV IPC objects (shared memory charged to the commands would otherwise outlive every process).

Protocol (JSON bodies, HTTP/1.1 keep-alive with Content-Length, one thread per connection):

    GET  /health   -> {ok, pid, version, workspace, writable, uid_separated, command_uid, resources_separated}
    POST /exec     {cmd: str|list, timeout, cwd, env, stdin, output_limit, kill_leftovers}
                   -> {exit_code, stdout, stderr, timed_out, truncated, duration_s}
                   kill_leftovers: after the command, kill every process of the command user (as /kill_all)
    POST /kill_all {} -> {killed: n}   every process in `commands` (resource-separated), else every process of the
                   command user (uid-separated) or every descendant of the agent (single uid), until none is left;
                   also those of concurrent execs; then the SysV IPC objects of the command user
    POST /write    {path, content_b64, mode} -> {ok, bytes}
    POST /read     {path} -> {content_b64}
    errors         -> {error: msg[, kind]} with 400 (bad request; kind "not_regular" for a directory, FIFO, socket,
                   device or symlink), 401 (token), 403 (path outside workspace, or not accessible to the command
                   user), 404, 413 (kind "too_large"), 500

After binding, the agent prints READY_LINE on stdout so the starter needs no polling.
"""

from __future__ import annotations

import base64
import ctypes
import errno
import json
import os
import selectors
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

VERSION = 1
READY_LINE = "AGENTRL-AGENT-READY"
MAX_BODY = 256 * 1024 * 1024  # request bodies (file writes) above this are refused with 413
MAX_READ = 64 * 1024 * 1024  # files above this are refused by /read with 413
DEFAULT_OUTPUT_LIMIT = 64 * 1024
EXIT_GRACE_S = 0.1  # after the main process exits, how long pipes held by background processes may stay open
DRAIN_AFTER_KILL_S = 0.5  # after SIGKILL of the group, how long to keep collecting output
CHUNK = 1 << 16
KILL_ALL_DEADLINE_S = 5.0  # /kill_all gives up (500) when processes survive SIGKILL this long (stuck in the kernel)
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 36, 38
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 413: "Payload Too Large", 500: "Internal Server Error"}


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

    def kill(self, deadline_s: float) -> int:
        """SIGKILL everything in `commands` until it is empty (cgroup.kill first where the kernel has it); returns
        how many distinct processes were killed. No fork: a full pids.max cannot stop it."""
        seen: set[int] = set()
        end = time.monotonic() + deadline_s
        if self.version == "v2" and os.path.exists(f"{self.dirs[0]}/commands/cgroup.kill"):
            _write_file(f"{self.dirs[0]}/commands/cgroup.kill", "1")
        while True:
            live = self.pids()
            if not live:
                return len(seen)
            seen |= live
            if time.monotonic() > end:
                raise HTTPError(500, f"{len(live)} process(es) in the commands cgroup survived SIGKILL for "
                                     f"{deadline_s:.0f}s: {sorted(live)[:10]}")
            for pid in live:
                _kill(pid)
            time.sleep(0.001)


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
    nr = _SYS_SETRESUID.get(os.uname().machine)
    switch = uid != os.geteuid()
    if switch and (nr is None or libc.syscall(nr, -1, uid, -1) != 0):
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
        if switch and libc.syscall(nr, -1, 0, -1) != 0:  # pragma: no cover - euid 0 is the thread's saved uid
            os._exit(70)  # a thread stuck as the command user must not serve another request
    return removed


# ---------------------------------------------------------------- paths


def resolve_in_workspace(root: str, path: object, extra: tuple[str, ...] = ()) -> str:
    """The real path of `path` (relative to `root`, or absolute inside it or inside one of the `extra` writable
    directories); 403 when it resolves outside all of them."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise HTTPError(400, "field 'path' must be a non-empty string")
    real = os.path.realpath(os.path.join(root, path))
    if not any(real == r or real.startswith(r + os.sep) for r in (root, *extra)):
        where = " or ".join((root, *extra))
        raise HTTPError(403, f"path {path!r} resolves outside the workspace {where} (to {real}); use a path inside it")
    return real


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

    def pump(self, proc: subprocess.Popen, deadline: float, exited) -> bool:
        """Read both pipes until they close and the main process exits. Stops at the deadline (sets timed_out),
        or EXIT_GRACE_S after the main process exited while background processes still hold the pipes.
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
        pidfd = _pidfd(proc.pid)
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
                    wait = min(wait, exited_at + EXIT_GRACE_S - now)
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


# ---------------------------------------------------------------- the agent


class Reaper:
    """Reaps every child of the agent the moment it exits, like an init: the agent is a child subreaper (pid 1 in a
    Kubernetes container), so orphans of commands become its children. Keeps the exit status of the children a
    request waits for (`spawn` registers them under the lock the reaper takes before deciding), drops the rest."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._tracked: set[int] = set()
        self._status: dict[int, int] = {}
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

    def wait(self, pid: int) -> int:
        """The exit code of a tracked child (negative: killed by that signal), once it exited."""
        with self._cond:
            while pid not in self._status:
                self._cond.wait()
            self._tracked.discard(pid)
            return self._status.pop(pid)

    def _run(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:  # no children at all: sleep until the next spawn
                with self._cond:
                    self._cond.wait(1.0)
                continue
            except InterruptedError:  # pragma: no cover - PEP 475 retries; defensive
                continue
            with self._cond:
                if pid in self._tracked:
                    self._status[pid] = os.waitstatus_to_exitcode(status)
                    self._cond.notify_all()


class Agent:
    """Request handlers. Tracks the process groups it started (for timeouts and shutdown) and reaps every child
    (`Reaper`)."""

    def __init__(self, workspace: str, identity: Identity | None = None, writable: tuple[str, ...] = (),
                 cgroup: CommandCgroup | None = None, libc: ctypes.CDLL | None = None) -> None:
        self.workspace = os.path.realpath(workspace)
        self.writable = tuple(os.path.realpath(d) for d in writable)
        self.identity = identity or Identity(None)
        self.cgroup = cgroup or CommandCgroup(None)
        self._libc = libc
        self._groups: set[int] = set()
        self._lock = threading.Lock()
        self._reaper = Reaper()
        self._kill_lock = threading.Lock()

    def dispatch(self, method: str, path: str, body: bytes) -> dict:
        routes = {("GET", "/health"): self.health, ("POST", "/exec"): self.exec, ("POST", "/write"): self.write,
                  ("POST", "/read"): self.read, ("POST", "/kill_all"): self.kill_all}
        handler = routes.get((method, path.split("?", 1)[0]))
        if handler is None:
            raise HTTPError(404 if method in ("GET", "POST") else 405, f"no route {method} {path}")
        req = _json_body(body) if method == "POST" else {}
        return handler(req)

    def health(self, req: dict) -> dict:
        return {"ok": True, "pid": os.getpid(), "version": VERSION, "workspace": self.workspace,
                "writable": list(self.writable),
                "uid_separated": self.identity.separated, "command_uid": self.identity.uid,
                "resources_separated": self.cgroup.enabled}

    def exec(self, req: dict) -> dict:
        argv = _argv(req.get("cmd"))
        timeout = _number(req, "timeout", 30.0)
        limit = int(_number(req, "output_limit", DEFAULT_OUTPUT_LIMIT))
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
        start = time.monotonic()
        try:
            proc = self.cgroup.start(lambda: self._reaper.spawn(run.start))
        except OSError as e:
            code = 127 if isinstance(e, FileNotFoundError) else 126
            return _result(code, b"", f"{argv[0]}: {e.strerror or e}\n".encode(), False, False, start)
        if not _prefer_oom_kill(proc.pid):  # setpriv has not switched uid yet: the file is still root's, or
            with self.identity.files():  # it has (or Popen did): the file is the command user's
                _prefer_oom_kill(proc.pid)
        with self._lock:
            self._groups.add(proc.pid)
        try:
            result = self._finish(run, proc, start + timeout, start)
        finally:
            with self._lock:
                self._groups.discard(proc.pid)
        if kill_leftovers:
            self._kill_leftovers()
        return result

    def _finish(self, run: ExecRun, proc: subprocess.Popen, deadline: float, start: float) -> dict:
        try:
            closed = run.pump(proc, deadline, lambda: self._reaper.exited(proc.pid))
        except BaseException:
            _killpg(proc.pid)
            raise
        if not closed:
            _killpg(proc.pid)  # pgid == pid of the main process (start_new_session); also kills SIGTERM-ignorers
            run.drain(proc, DRAIN_AFTER_KILL_S)
        code = proc.returncode = self._reaper.wait(proc.pid)  # the reaper collected it (never Popen.wait)
        for stream in (proc.stdout, proc.stderr, proc.stdin):
            if stream is not None:
                stream.close()
        return _result(None if run.timed_out else code, run.out, run.err, run.timed_out, run.truncated, start)

    def write(self, req: dict) -> dict:
        try:
            data = base64.b64decode(req.get("content_b64") or "", validate=True)
        except ValueError as e:
            raise HTTPError(400, f"field 'content_b64' is not valid base64: {e}") from None
        mode = int(req.get("mode", 0o644))
        with self.identity.files(), _Denied403(req.get("path")):
            target = resolve_in_workspace(self.workspace, req.get("path"), self.writable)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            resolve_in_workspace(self.workspace, target, self.writable)  # a parent may be a symlink made meanwhile
            fd = _open_regular(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode, req["path"])
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
        return {"ok": True, "bytes": len(data)}

    def read(self, req: dict) -> dict:
        with self.identity.files(), _Denied403(req.get("path")):
            target = resolve_in_workspace(self.workspace, req.get("path"), self.writable)
            fd = _open_regular(target, os.O_RDONLY, 0, req["path"])
        with open(fd, "rb") as f:
            too_big = HTTPError(413, f"file {req['path']!r} is larger than {MAX_READ} bytes; read it in parts via "
                                     "exec", "too_large")
            if os.fstat(fd).st_size > MAX_READ:
                raise too_big
            data = f.read(MAX_READ + 1)  # bounded: the file may grow while it is read
            if len(data) > MAX_READ:
                raise too_big
            return {"content_b64": base64.b64encode(data).decode("ascii")}

    # ------------------------------------------------------------ leftovers

    def kill_all(self, req: dict) -> dict:
        return {"killed": self._kill_leftovers()}

    def _kill_leftovers(self) -> int:
        """Kill every process the commands left (through their cgroup when resource-separated, else by uid or
        descent), then remove the command user's SysV IPC objects (uid-separated: the IPC namespace is the
        sandbox's own); returns how many distinct processes were killed."""
        if self.cgroup.enabled:
            killed = self.cgroup.kill(KILL_ALL_DEADLINE_S)
        else:
            killed = self._kill_by_owner()
        if self.identity.separated and self._libc is not None:
            remove_sysv_ipc(self._libc, self.identity.uid)
        return killed

    def _kill_by_owner(self) -> int:
        """SIGKILL every process of the command user (separated) or every descendant of the agent (single uid),
        round after round, until none is left alive; returns how many distinct processes were killed."""
        seen: set[int] = set()
        end = time.monotonic() + KILL_ALL_DEADLINE_S
        with self._kill_lock:
            while True:
                live = _command_user_pids(self.identity.uid) if self.identity.separated else _descendants()
                if not live:
                    return len(seen)
                seen |= live
                if time.monotonic() > end:
                    raise HTTPError(500, f"{len(live)} process(es) of the command user survived SIGKILL for "
                                         f"{KILL_ALL_DEADLINE_S:.0f}s: {sorted(live)[:10]}")
                if self.identity.separated:
                    self._signal_all_as_command_user()
                else:
                    for pid in live:
                        _kill(pid)
                time.sleep(0.001)  # let the kernel finish the killed processes before looking again

    def _signal_all_as_command_user(self) -> None:
        """kill(-1, SIGKILL) from a child that became the command user: it reaches every process of that uid in
        this pid namespace at once (so a process forking in a loop cannot outrun it) and nothing else."""
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
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read().rpartition(b")")[2].split()
    except OSError:
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


def _open_regular(path: str, flags: int, mode: int, shown: str) -> int:
    """os.open that never blocks on a FIFO or device (O_NONBLOCK), never follows a symlink swapped in after the path
    was resolved (O_NOFOLLOW), and refuses anything but a regular file (400, kind "not_regular")."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW, mode)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise HTTPError(400, f"path {shown!r} is not a regular file ({e.strerror})", "not_regular") from None
        raise
    kind = stat.S_IFMT(os.fstat(fd).st_mode)
    if kind != stat.S_IFREG:
        os.close(fd)
        what = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
                stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}.get(kind, "not a regular file")
        raise HTTPError(400, f"path {shown!r} is not a regular file ({what})", "not_regular")
    os.set_blocking(fd, True)
    return fd


def _result(code: int | None, out: bytes, err: bytes, timed_out: bool, truncated: bool, start: float) -> dict:
    return {"exit_code": code, "stdout": bytes(out).decode("utf-8", "replace"),
            "stderr": bytes(err).decode("utf-8", "replace"), "timed_out": timed_out, "truncated": truncated,
            "duration_s": round(time.monotonic() - start, 6)}


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


def serve_connection(conn: socket.socket, agent: Agent, token: str | None) -> None:
    """Keep-alive loop for one connection: parse a request, dispatch, answer, repeat until EOF or close."""
    rfile = conn.makefile("rb", buffering=CHUNK)
    try:
        while True:
            request = _read_request(rfile)
            if request is None:
                return
            method, target, headers, body = request
            status, obj = _handle(agent, token, method, target, headers, body)
            keep = headers.get("connection", "").lower() != "close"
            payload = json.dumps(obj).encode()
            head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(payload)}\r\n{'' if keep else 'Connection: close' + chr(13) + chr(10)}\r\n")
            conn.sendall(head.encode() + payload)
            if not keep:
                return
    except (OSError, ValueError):  # peer gone, or a request we cannot parse: drop the connection
        return
    finally:
        rfile.close()
        conn.close()


def _handle(agent: Agent, token: str | None, method: str, target: str, headers: dict, body: bytes | None):
    try:
        if token is not None and not _authorized(headers, token):
            raise HTTPError(401, "missing or wrong bearer token (header 'Authorization: Bearer <token>')")
        if body is None:
            raise HTTPError(413, f"request body larger than {MAX_BODY} bytes")
        return 200, agent.dispatch(method, target, body)
    except HTTPError as e:
        return e.status, {"error": e.message, **({"kind": e.kind} if e.kind else {})}
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


def _read_request(rfile) -> tuple[str, str, dict, bytes | None] | None:
    line = rfile.readline(65537)
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3:
        raise ConnectionError(f"bad request line {line!r}")
    headers: dict[str, str] = {}
    while True:
        h = rfile.readline(65537)
        if h in (b"\r\n", b"\n", b""):
            break
        name, _, value = h.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    if length > MAX_BODY:
        return parts[0], parts[1], {**headers, "connection": "close"}, None
    body = rfile.read(length) if length else b""
    if len(body) != length:
        return None
    return parts[0], parts[1], headers, body


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
         "[--writable DIR[:DIR...]] [--cgroups v1:DIR[:DIR...] | v2:DIR]")
OPTIONS = ("--unix", "--tcp", "--token-file", "--workspace", "--run-as", "--writable", "--cgroups")


def _parse(argv: list[str] | None) -> dict[str, str]:
    """--unix | --tcp, --token-file, --workspace, --run-as, --writable (hand-parsed: argparse costs ~10 ms)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) % 2 or any(k not in OPTIONS for k in args[::2]):
        sys.exit(USAGE)
    opts = dict(zip(args[::2], args[1::2]))
    if ("--unix" in opts) == ("--tcp" in opts) or "--workspace" not in opts:
        sys.exit(USAGE)
    return opts


def _run_as(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    uid, sep, gid = value.partition(":")
    if not (sep and uid.isdigit() and gid.isdigit()) or int(uid) == 0 or int(gid) == 0:
        sys.exit(f"agent: --run-as {value!r}: use UID:GID with both non-zero, e.g. --run-as 1000:1000")
    return int(uid), int(gid)


def _on_sigterm(signum: int, frame: object) -> None:
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
    agent = Agent(opts["--workspace"], identity, writable, CommandCgroup(opts.get("--cgroups")), libc)
    sock = _listen(opts)
    signal.signal(signal.SIGTERM, _on_sigterm)
    print(READY_LINE, flush=True)
    try:
        while True:
            conn, _ = sock.accept()
            if conn.family != socket.AF_UNIX:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=serve_connection, args=(conn, agent, token), daemon=True).start()
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
