"""Who commands and file requests run as (`Identity`: the command user's uid/gid, fsuid switching per thread), the
agent's own process settings (no_new_privs, child subreaper), one thread's raw uid switch (`thread_uid_switch`,
used to signal or clean up as the command user without a fork), and the SysV IPC clean-up of /kill_all."""

from __future__ import annotations

import ctypes
import os
import stat
import sys
from collections.abc import Callable

PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 36, 38


class Identity:
    """Who commands and file requests run as: `run_as` (uid, gid) when uid-separated, else the agent's own ids.

    Separated, the agent must be uid 0: commands get uid/gid via Popen (no supplementary groups), and file requests
    run with the serving thread's fsuid/fsgid switched to uid/gid (`with identity.files():`), which also drops the
    thread's filesystem capabilities. fsuid is per thread on Linux, so concurrent requests do not interfere."""

    def __init__(self, run_as: tuple[int, int] | None) -> None:
        self.separated = run_as is not None
        self.uid, self.gid = run_as if run_as is not None else (os.getuid(), os.getgid())
        self._setfsuid: Callable[[int], int] | None = None  # libc's, once setup() checked them (separated only)
        self._setfsgid: Callable[[int], int] | None = None
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
        setfsuid = libc.setfsuid
        self._setfsuid, self._setfsgid = setfsuid, libc.setfsgid
        setfsuid(self.uid)
        if setfsuid(0) != self.uid:
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

    def files(self) -> _AsCommandUser:
        """Context manager: this thread's file accesses are the command user's until it exits."""
        return _AsCommandUser(self)


class _AsCommandUser:
    def __init__(self, identity: Identity) -> None:
        self.identity = identity

    def __enter__(self) -> None:
        i = self.identity
        if i.separated:
            assert i._setfsuid is not None and i._setfsgid is not None, "Identity.setup() was not called"
            i._setfsgid(i.gid)
            i._setfsuid(i.uid)

    def __exit__(self, *exc: object) -> None:
        i = self.identity
        if i.separated:
            assert i._setfsuid is not None and i._setfsgid is not None, "Identity.setup() was not called"
            i._setfsuid(0)
            i._setfsgid(0)


def prctl_setup() -> ctypes.CDLL:
    """no_new_privs (no setuid binary or file capability can raise a command's privileges) and child subreaper
    (orphans of commands are re-parented to the agent, so they stay findable and get reaped). Best effort."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    return libc


# ---------------------------------------------------------------- resource separation


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
    if switch and not thread_uid_switch(libc, -1, uid):  # euid only
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
            thread_uid_back(libc)
    return removed


def thread_uid_switch(libc: ctypes.CDLL, ruid: int, euid: int) -> bool:
    """This thread alone (raw setresuid: glibc's switches every thread) takes real uid `ruid` (-1: unchanged) and
    effective uid `euid`, keeping saved uid 0 to come back with thread_uid_back(). False when it cannot."""
    nr = _SYS_SETRESUID.get(os.uname().machine)
    return nr is not None and libc.syscall(nr, ruid, euid, -1) == 0


def thread_uid_back(libc: ctypes.CDLL) -> None:
    if libc.syscall(_SYS_SETRESUID[os.uname().machine], 0, 0, -1) != 0:  # pragma: no cover - 0 is the saved uid
        os._exit(70)  # a thread stuck as the command user must not serve another request
