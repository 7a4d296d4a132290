"""The agent's processes: one handle for every kind (`Proc`: a command started by the spawner or through Popen, and
the spawner itself, the agent's child or the relay's) and running a command (`ExecRun`: its pipes, deadline and
output cap). Killing is kill.py's."""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Callable

from .identity import Identity
from .kill import kill_group
from .procfs import open_pidfd

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the agent's start-up time)
if TYPE_CHECKING:
    from typing import IO

    from .cgroups import CommandCgroup

EXIT_GRACE_S = 0.1  # after the main process exits, how long pipes held by background processes may stay open
DRAIN_AFTER_KILL_S = 0.5  # after SIGKILL of the group, how long to keep collecting output
CHUNK = 1 << 16


class Proc:
    """The agent's handle of one process it started, whatever started it: `pid` (a command's process group id too: it
    leads a session of its own), `pidfd` (when the kernel has them and its starter opened one), the agent's ends of
    its pipes (commands), `link` (the spawner that started it and reports its exit code; None: Popen, or a command
    whose spawner died), `returncode` once known, and `exited()`: whether it ended, as its starter knows it (its
    spawner, the reaper, its pidfd). It never waits for the process itself (the reaper, or the spawner, reaps); a
    Popen behind it gets the same returncode (`ended`) so that it never waits for the pid either."""

    def __init__(self, pid: int, *, pidfd: int | None = None, stdin: int | None = None, stdout: int | None = None,
                 stderr: int | None = None, link: object = None, exited: Callable[[], bool] | None = None,
                 by_spawner: bool = False) -> None:
        self.pid, self.pidfd, self.link = pid, pidfd, link
        self.by_spawner = by_spawner  # a command the spawner started: its exit code comes from there (or the reaper)
        self.stdin: IO[bytes] | None = open(stdin, "wb", buffering=0) if stdin is not None else None
        self.stdout: IO[bytes] | None = open(stdout, "rb", buffering=0) if stdout is not None else None
        self.stderr: IO[bytes] | None = open(stderr, "rb", buffering=0) if stderr is not None else None
        self.returncode: int | None = None
        self._exited = exited
        self._popen: subprocess.Popen | None = None

    @classmethod
    def of_popen(cls, popen: subprocess.Popen, exited: Callable[[], bool] | None = None) -> Proc:
        """The handle of a process Popen started (its pipes, none with DEVNULL)."""
        proc = cls(popen.pid, exited=exited)
        proc.stdin, proc.stdout, proc.stderr, proc._popen = popen.stdin, popen.stdout, popen.stderr, popen
        return proc

    def exited(self) -> bool:
        return self._exited is not None and self._exited()

    def outputs(self) -> tuple[IO[bytes], IO[bytes]]:
        """The agent's ends of a command's stdout and stderr pipes (every command has both)."""
        assert self.stdout is not None and self.stderr is not None, "not a command: it has no output pipes"
        return self.stdout, self.stderr

    def ended(self, code: int | None) -> None:
        """Record its exit code (negative: the signal that killed it) and close the agent's ends of its pipes."""
        self.returncode = code
        if self._popen is not None:
            self._popen.returncode = code
        for stream in (self.stdout, self.stderr, self.stdin):
            if stream is not None:
                stream.close()

    def kill_group(self) -> None:
        kill_group(self.pid)

    def close_pidfd(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


class ExecRun:
    """One command: spawn in a new session, pump stdin/stdout/stderr, enforce the deadline and the output cap."""

    def __init__(self, argv: list[str], cwd: str, env: dict[str, str], stdin: bytes | None, limit: int,
                 identity: Identity, cgroup: CommandCgroup | None = None) -> None:
        self.argv, self.cwd, self.env, self.stdin, self.limit = argv, cwd, env, stdin, limit
        self.identity = identity
        self.cgroup = cgroup  # None: commands share the agent's cgroup
        self.out = bytearray()
        self.err = bytearray()
        self.truncated = False
        self.timed_out = False

    def start(self) -> subprocess.Popen:  # the Popen fallback (no spawner); the caller wraps it in a Proc
        proc = subprocess.Popen(
            self._argv(), cwd=self.cwd, env=self.env, start_new_session=True,
            close_fds=True,
            stdin=subprocess.PIPE if self.stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **self.identity.popen_kwargs(),
        )
        return proc

    def _argv(self) -> list[str]:
        argv = self.identity.wrap(self.argv)
        return self.cgroup.wrap(argv) if self.cgroup is not None else argv

    def _append(self, buf: bytearray, data: bytes) -> None:
        room = self.limit - len(buf)
        if len(data) > room:
            self.truncated = True
            data = data[: max(room, 0)]
        buf += data

    def pump(self, proc: Proc, deadline: float, grace: float = EXIT_GRACE_S) -> bool:
        """Read both pipes until they close and the main process exits. Stops at the deadline (sets timed_out),
        or `grace` seconds after the main process exited while background processes still hold the pipes (a
        command that leaves nothing holding them returns when its pipes close, never waiting for the grace).
        Returns True when the pipes closed and the main process exited (no kill needed). `proc.exited()` says whether
        the main process exited (used only without pidfd; never Popen.poll, which would reap it behind the reaper)."""
        sel = selectors.DefaultSelector()
        stdout, stderr = proc.outputs()
        bufs = {stdout.fileno(): self.out, stderr.fileno(): self.err}
        for fd in bufs:
            sel.register(fd, selectors.EVENT_READ)
        pending = memoryview(self.stdin or b"")
        stdin = proc.stdin
        stdin_fd = stdin.fileno() if stdin is not None else -1
        if stdin_fd >= 0:
            os.set_blocking(stdin_fd, False)
            sel.register(stdin_fd, selectors.EVENT_WRITE)
        own = proc.pidfd  # the spawner's, opened before anything could reap the command
        pidfd = os.dup(own) if own is not None else open_pidfd(proc.pid)
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ)
        exited_at = None
        try:
            while True:
                now = time.monotonic()
                if exited_at is None and pidfd is None and proc.exited():
                    exited_at = now
                # done, checked after the exit poll: else, when the pipes closed before the exit was seen, a select
                # with nothing left to read would wait out the whole grace
                if exited_at is not None and not bufs:
                    return True
                if now >= deadline:
                    self.timed_out = exited_at is None
                    return False
                wait = deadline - now
                if exited_at is not None:
                    wait = min(wait, exited_at + grace - now)
                    if wait <= 0:
                        return False  # background processes hold the pipes: the caller kills the group
                elif pidfd is None:
                    wait = min(wait, 0.01)  # no pidfd (old kernel, or reaped already): poll for the exit
                for key, _ in sel.select(wait):
                    if key.fd == pidfd:
                        sel.unregister(pidfd)
                        exited_at = time.monotonic()
                    elif stdin is not None and key.fd == stdin_fd:
                        pending = self._feed(sel, stdin, pending)
                    else:
                        self._read(sel, key.fd, bufs)
        finally:
            sel.close()
            if pidfd is not None:
                os.close(pidfd)

    def _feed(self, sel: selectors.BaseSelector, stdin: IO[bytes], pending: memoryview) -> memoryview:
        try:
            pending = pending[os.write(stdin.fileno(), pending[:CHUNK]):]
        except BlockingIOError:
            return pending
        except BrokenPipeError:
            pending = pending[:0]  # the command stopped reading: drop the rest of its stdin
        if not pending:
            sel.unregister(stdin.fileno())
            stdin.close()
        return pending

    def _read(self, sel: selectors.BaseSelector, fd: int, bufs: dict[int, bytearray]) -> None:
        data = os.read(fd, CHUNK)
        if data:
            self._append(bufs[fd], data)
        else:
            sel.unregister(fd)
            del bufs[fd]

    def drain(self, proc: Proc, seconds: float) -> None:
        """Collect what is left in the pipes for at most `seconds` (after a kill)."""
        stdout, stderr = proc.outputs()
        for stream, buf in ((stdout, self.out), (stderr, self.err)):
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


def prefer_oom_kill(pid: int) -> bool:
    """Make the command (and what it forks from now on) the OOM killer's first choice, so that a memory hog
    dies rather than the agent. Raising oom_score_adj needs no privilege; best effort. Call it as the command user
    (`identity.files()`): after its exec, the command's /proc files belong to that user."""
    try:
        with open(f"/proc/{pid}/oom_score_adj", "w") as f:
            f.write("1000")
        return True
    except OSError:
        return False
