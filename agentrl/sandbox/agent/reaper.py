"""`Reaper`: reaps every child of the agent (a child subreaper, pid 1 in a Kubernetes container) the moment it
exits, keeping the exit codes of the children a request waits for."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from .procfs import leader_start

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the agent's start-up time)
if TYPE_CHECKING:
    import subprocess
    from typing import TypeVar

    _Child = TypeVar("_Child", int, subprocess.Popen[bytes])


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

    def spawn(self, start: Callable[[], _Child]) -> _Child:
        """Call `start()` (which forks) and track the child it returns (a Popen or a pid), atomically with respect
        to reaping."""
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
                found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:  # no children at all: sleep until the next spawn, or (orphans arrive unasked)
                with self._cond:  # a moment while an adopted command or an orphan is awaited
                    self._cond.wait(0.005 if self._tracked or time.monotonic() < self._eager_until else 1.0)
                continue
            except InterruptedError:  # pragma: no cover - PEP 475 retries; defensive
                continue
            assert found is not None  # None only with WNOHANG
            pid = found.si_pid
            with self._cond:
                start = None if pid in self._tracked else leader_start(pid)
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
