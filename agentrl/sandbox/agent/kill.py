"""The one killer: every signal the agent sends to another process goes through here. Always SIGKILL, and a target
that is gone already (ESRCH) or, for a pid or a group, no longer the agent's to signal (EPERM: a pid reused by another
user's process) is fine. `kill_pid` (one process), `kill_pids` (each of a set), `kill_group` (a command's process
group), `kill_pidfd` (the spawner, by its pidfd), `kill_all_as` (every process of the command user, from this thread
alone), `fork_kill_all_as` (the same from a forked child, where that cannot be done), and `kill_until_gone`: the
rounds of /kill_all (through the cgroup or by owner) until nothing is left or KILL_ALL_DEADLINE_S has passed."""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable, Iterable

from .identity import thread_uid_back, thread_uid_switch
from .protocol import KIND_SURVIVORS, HTTPError

KILL_ALL_DEADLINE_S = 5.0  # /kill_all gives up (409) when processes survive SIGKILL this long (stuck in the kernel)


def kill_group(pgid: int) -> None:
    """SIGKILL the process group `pgid` (a command's: it leads a session of its own)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_pids(pids: Iterable[int]) -> None:
    """SIGKILL each of `pids` (one round of `kill_until_gone`)."""
    for pid in pids:
        kill_pid(pid)


def kill_pidfd(pidfd: int) -> None:
    """SIGKILL the process `pidfd` refers to (it may be stopped; gone already is fine)."""
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass


def kill_all_as(libc: ctypes.CDLL, uid: int) -> bool:
    """kill(-1, SIGKILL) from this thread alone as `uid`: real and effective uid `uid` (the effective capabilities,
    CAP_KILL included, drop with euid 0), saved uid 0 to come back. kill(-1) then reaches every process whose real
    or saved uid is `uid` (never the agent: the caller's own thread group is spared) in one pass of the kernel. False
    when this cannot be done here (not root, unknown syscall)."""
    if os.geteuid() != 0 or uid == 0 or not thread_uid_switch(libc, uid, uid):
        return False
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:  # ESRCH: no process of that uid is left
        pass
    finally:
        thread_uid_back(libc)
    return True


def fork_kill_all_as(uid: int, gid: int) -> int:
    """kill(-1, SIGKILL) from a forked child that becomes `uid`:`gid` (no groups) first; returns the child's pid (the
    caller reaps it: call it through `Reaper.spawn`). Its exit code: 0 when kill(-1) succeeded, else 1."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
            code = 0
        except BaseException:
            pass
        os._exit(code)
    return pid


def kill_until_gone(live: Callable[[], set[int]], kill: Callable[[set[int]], None], deadline_s: float,
                    uncounted: set[int], where: str, settled: Callable[[], bool] = lambda: True) -> int:
    """SIGKILL round after round (`kill(pids)` with the processes `live()` lists) until none is left and `settled()`
    (the cgroup's pids released; not waited for past the deadline); returns how many distinct processes were
    killed, `uncounted` (the spawner) aside. 409 (kind "survivors") when some survive for `deadline_s`: `where`
    names their place in the message. No fork: a full pids limit cannot stop it."""
    seen: set[int] = set()
    end = time.monotonic() + deadline_s
    while True:
        pids = live()
        if not pids and (settled() or time.monotonic() > end):
            return len(seen - uncounted)
        seen |= pids
        if time.monotonic() > end:
            raise HTTPError(409, f"policy processes survived kill: {len(pids)} process(es) {where} survived SIGKILL "
                                 f"for {deadline_s:g}s: {sorted(pids)[:10]}", KIND_SURVIVORS)
        if pids:
            kill(pids)
        time.sleep(0.001)  # let the kernel finish the killed processes before looking again
