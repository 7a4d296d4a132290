"""The agent's side of the command spawner (`Spawner`; the spawner's own program is seccomp.py + spawner_program.py,
run as `python -I -S -c SPAWNER_PROGRAM ...`): starting it (as the agent's child, or through the relay in the
commands' container), its requests and answers (`Link`), the commands it started (`process.Proc` handles) and
what is left when the policy kills it."""

from __future__ import annotations

import array
import errno
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from .cgroups import CommandCgroup
from .identity import Identity
from .kill import kill_pidfd
from .process import Proc
from .procfs import boot_ticks, close_fds, open_pidfd, proc_fields
from .relay import RELAY_TIMEOUT_S, connect_relay

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the agent's start-up time)
if TYPE_CHECKING:
    from .process import ExecRun
    from .reaper import Reaper
    from .watch import SeccompWatch


def program_text(*names: str) -> str:
    """The text of this package's modules `names`, concatenated: read through the package's loader, so from the
    directory as from inside the zip artifact."""
    base = os.path.dirname(os.path.abspath(__file__))
    return "".join(__spec__.loader.get_data(os.path.join(base, n)).decode() for n in names)  # type: ignore[union-attr]


# the spawner's program: the syscall policy's module, then the spawner's, whose last lines start it (__main__)
SPAWNER_PROGRAM = program_text("seccomp.py", "spawner_program.py")
SECCOMP_POLICY = "notify"  # the spawner's syscall policy: notify (refusals counted by the agent), errno, off

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


class GoneBefore(SpawnerLost):
    """The spawner was gone before the request left: nothing was started, the request can go to a fresh one."""

    def __init__(self) -> None:
        super().__init__("the command spawner was killed before the request (by the sandbox's own processes or the "
                         "commands' memory limit), and again after a restart")


class Link:
    """The agent's link to one spawner process and what the agent learnt from it: the answer to the request in
    flight, the exit codes of its commands, and whether it is gone (`lost`: EOF on its socket). A reader thread fills
    it."""

    def __init__(self, sock: socket.socket, proc: Proc, cond: threading.Condition) -> None:
        self.sock, self.proc, self.cond = sock, proc, cond
        self.tx = sock.dup()  # requests go out with a timeout (which makes the shared file non-blocking)
        self.pidfd = open_pidfd(proc.pid)
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
            with self.cond:  # lost before closed, both under the condition: `alive` never polls a closed socket
                self.lost = True
                self.sock.close()
                self.cond.notify_all()

    def alive(self) -> bool:
        """Not lost and its peer still there (the spawner may have exited before the reader saw the EOF)."""
        with self.cond:
            return not self.lost and not _hung_up(self.sock)

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
            kill_pidfd(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = None
        self.proc.ended(-signal.SIGKILL)  # the reaper reaps it; its Popen must never waitpid this pid again


class Spawner:
    """A persistent fork server (SPAWNER_PROGRAM) that already runs as the command user and in the `commands` cgroup,
    so a command costs one vfork + exec instead of setpriv's fork + extra exec (and, under cgroup v2, /bin/sh's).
    It is the commands' parent and reports their exit codes; their orphans still go to the agent (the subreaper).
    It is a process of the command user, so the policy can kill or stop it (its own loss: the exec waiting on it
    fails or loses its exit code as the policy's doing, the next one starts a fresh spawner) but cannot ptrace it
    or read its memory (non-dumpable) nor reach its socket (a socketpair only the agent holds; every other fd
    closed). /kill_all kills it with the rest."""

    def __init__(self, identity: Identity, cgroup: CommandCgroup, reaper: Reaper, relay: str | None = None,
                 watch: SeccompWatch | None = None) -> None:
        self._ids = (identity.uid, identity.gid) if identity.separated else (-1, -1)
        self._identity, self._cgroup, self._reaper = identity, cgroup, reaper
        self._relay = relay  # started by the relay in the commands' container, not as our child
        self._lock = threading.Lock()  # one request at a time; guards _link
        self._cond = threading.Condition()  # what the reader threads learn
        self._link: Link | None = None
        self.unusable = False  # its setup failed here: commands start through setpriv
        self._watch = watch  # gets the syscall policy's listener of every spawner started
        self.seccomp = "none: no spawner started yet"  # the last spawner's policy mode (seccomp.install's)
        self.on_counter_files: Callable[[dict[str, int]], None] | None = None  # relayed: gets the commands' cgroup

    @property
    def pid(self) -> int | None:
        link = self._link
        return link.proc.pid if link is not None else None

    def ensure(self, deadline: float) -> None:
        """A live, ready spawner: the current one, or a fresh one when it is gone (killed by /kill_all, the policy
        or the memory limit). Raises SpawnerUnusable when it cannot work here, SpawnerLost when it did not start."""
        with self._lock:
            if self._link is not None and self._link.alive():
                return
            if self._link is not None:
                self._link.discard()
                self._link = None
            a, proc = self._start_relayed(self._relay, deadline) if self._relay else self._start_child()
            link = Link(a, proc, self._cond)
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
                close_fds(tuple(listeners))
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
        close_fds(tuple(fds[len(files):]))
        if self.on_counter_files is not None and files:
            self.on_counter_files(files)
        else:
            close_fds(tuple(files.values()))

    def _start_child(self) -> tuple[socket.socket, Proc]:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = self._cgroup.wrap([sys.executable, "-I", "-S", "-c", SPAWNER_PROGRAM, str(b.fileno()),
                                  *map(str, self._ids), SECCOMP_POLICY])
        try:
            return a, Proc.of_popen(self._cgroup.start(lambda: subprocess.Popen(
                argv, pass_fds=(b.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True)))
        except OSError as e:
            a.close()
            if e.errno in (errno.EAGAIN, errno.ENOMEM):  # the commands' pids or memory are full: this exec's
                raise                                      # failure (as Popen's would be), not the spawner's
            raise SpawnerUnusable(f"cannot start {sys.executable!r}: {e}") from None
        finally:
            b.close()

    def _start_relayed(self, relay: str, deadline: float) -> tuple[socket.socket, Proc]:
        """Ask the relay (relay_program.py, the sandbox container's main process) to start a spawner there: in that
        container's cgroup, under the sandbox's limits, as its child. The relay must be of our uid (SO_PEERCRED): a
        command that bound the name after the relay died is not. Raises OSError (EAGAIN: the commands' pids are
        full) or SpawnerLost (the relay is gone: the sandbox container died, e.g. by the commands' memory limit)."""
        argv = ["python3", "-I", "-S", "-c", SPAWNER_PROGRAM, "3", *map(str, self._ids), SECCOMP_POLICY, "counters"]
        data = b"\0".join(os.fsencode(x) for x in argv)
        fds: list[int] = []
        try:
            conn = connect_relay(relay, max(min(deadline - time.monotonic(), RELAY_TIMEOUT_S), 0.001))
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
            close_fds(tuple(fds))
            raise SpawnerLost(f"the relay in the sandbox container does not answer ({e}): the container is gone "
                              "(killed by the commands' memory limit, or its main process by the commands)") from None
        pid = int.from_bytes(msg, "little", signed=True) if len(msg) == 8 else 0
        if pid < 0:
            close_fds(tuple(fds))
            raise OSError(-pid, os.strerror(-pid))
        if pid == 0 or not fds:
            close_fds(tuple(fds))
            raise SpawnerLost("the relay in the sandbox container closed the connection without starting a spawner")
        close_fds(tuple(fds[1:]))
        return socket.socket(fileno=fds[0]), Proc(pid)  # the relay's child, not ours

    def spawn(self, run: ExecRun, deadline: float) -> Proc:
        """Start `run`'s command through the spawner: its pid and pidfd, the agent's pipe ends and how its end is
        learnt (its spawner's report; an orphan: its pidfd in the commands' container, else the reaper). Raises
        OSError like Popen when the command cannot be executed, SpawnerLost when the spawner is gone or stopped."""
        record = _spawn_record(run)
        stdin_r, stdin_w = os.pipe() if run.stdin is not None else (os.open(os.devnull, os.O_RDONLY), None)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ours = (stdin_w, out_r, err_r)
        link: Link | None
        try:
            since = boot_ticks() - 1
            try:
                link, (pid, err, pidfd) = self._request(record, (stdin_r, out_w, err_w), deadline)
            except SpawnerLost as e:
                orphan = self._orphan(out_r, since) if e.killed_in_flight else None
                if orphan is None:
                    raise
                pid, link, err, pidfd = orphan, None, 0, open_pidfd(orphan)
        except BaseException:
            close_fds(ours)
            raise
        finally:
            close_fds((stdin_r, out_w, err_w))
        if err:
            close_fds(ours)
            raise OSError(err, os.strerror(err))
        if link is not None:
            exited = _exited_by(link.exited, pid)
        elif self._relay and pidfd is not None:  # an orphan elsewhere: its pidfd says when it ended
            exited = _exited_by(_readable, pidfd)
        else:  # an orphan of the agent
            exited = _exited_by(self._reaper.exited, pid)
        stdin_w, out_r, err_r = ours
        return Proc(pid, pidfd=pidfd, stdin=stdin_w, stdout=out_r, stderr=err_r, link=link, exited=exited,
                    by_spawner=True)

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
                fields = proc_fields(name) if name.isdigit() else None
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
                 deadline: float) -> tuple[Link, tuple[int, int, int | None]]:
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
                raise GoneBefore() from None
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

    def wait(self, proc: Proc) -> int | None:
        """The exit code of `proc` (which exited, or was just killed) as its spawner reports it; None when that
        spawner died, or did not report it within STATUS_GRACE_S (stopped by the policy): it is then discarded
        (SIGKILL), so its children, `proc` included, go to the agent's reaper."""
        link = proc.link  # typed `object` in process.py, which must not import this module (a spawner's Link)
        if not isinstance(link, Link):  # None: found as an orphan, the reaper has its exit code
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


def _exited_by(check: Callable[[int], bool], arg: int) -> Callable[[], bool]:
    return lambda: check(arg)


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def _hung_up(sock: socket.socket) -> bool:
    """The peer closed its end (the spawner exited), whether or not the reader thread has seen the EOF yet."""
    poller = select.poll()
    poller.register(sock, select.POLLRDHUP | select.POLLHUP)
    return any(ev & (select.POLLRDHUP | select.POLLHUP) for _, ev in poller.poll(0))


def _spawn_record(run: ExecRun) -> bytes:
    """The spawner's request for `run`: what Popen would check and pass (embedded NULs and '=' in names refused
    with the same ValueError, executable candidates from the command's own PATH)."""
    argv = [os.fsencode(a) for a in run.argv]
    env = []
    for name, value in run.env.items():
        k, v = os.fsencode(name), os.fsencode(value)
        if b"=" in k:
            raise ValueError("illegal environment variable name")
        env.append(k + b"=" + v)
    exe = argv[0]
    candidates = [exe] if os.path.dirname(exe) else [os.path.join(os.fsencode(d), exe)
                                                        for d in os.get_exec_path(run.env)]
    fields: list[bytes] = [os.fsencode(run.cwd), str(len(argv)).encode(), *argv, str(len(candidates)).encode(),
                           *candidates, *env]
    if any(b"\0" in f for f in fields):
        raise ValueError("embedded null byte")
    return b"\0".join(fields)
