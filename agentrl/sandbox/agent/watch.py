"""What the syscall policy observes, answered and counted by the agent: the policy's refusals (`SeccompWatch`, the
seccomp user-notification supervisor), signals to processes outside the policy's own (`SignalTargets`) and attempts
to reach a network the sandbox does not have (`NetAttempts`)."""

from __future__ import annotations

import ctypes
import errno
import os
import select
import threading

from . import seccomp
from .identity import Identity
from .procfs import close_fds, stat_int

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

    def __init__(self, identity: Identity) -> None:
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
            parent = stat_int(pid, 1)  # ppid
            if parent is None:
                return False
            pid = parent
        return False

    @staticmethod
    def _pgid(pid: int) -> int:
        return stat_int(pid, 2) or 0  # pgrp

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
            close_fds(tuple(self._fds))

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

    def __init__(self, targets: SignalTargets | None = None) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._targets = targets
        self._names, self._probes, self._clone, self._socket, self._signals = {}, {}, {}, {}, {}
        for machine, (audit, column) in seccomp.ARCHES.items():
            self._names[audit] = seccomp.names(machine)
            self._signals[audit] = seccomp.signals(machine) | {
                seccomp.table(seccomp.ALLOWED["files"], column)[name] for name in seccomp.OWNER_CMDS}
            self._probes[audit] = seccomp.numbers(machine)[1]
            self._clone[audit] = seccomp.table(seccomp.ALLOWED["processes"], column)["clone"]
            self._socket[audit] = seccomp.table(seccomp.ALLOWED["network"], column)["socket"]
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
        if nr >= seccomp.X32_BIT:
            return "x32", errno.EPERM
        if nr == self._clone[arch]:
            return "clone_namespace", errno.EPERM
        if nr == self._socket[arch]:
            return "socket_vsock", errno.EPERM
        if nr in self._probes[arch]:
            return self._names[arch][nr], errno.EPERM
        return f"enosys:{self._names[arch].get(nr, nr)}", errno.ENOSYS
