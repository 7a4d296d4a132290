# agentrl command spawner (this line marks its command line: tests find the spawner by it)
"""The spawner's program, run as `python -I -S -c SPAWNER_PROGRAM SOCK_FD UID GID POLICY` (UID -1: keep the agent's
ids; POLICY notify|errno|off: the syscall policy, seccomp.py, which it installs on itself last). It
imports only builtin modules (and ctypes), so it starts in a few ms of CPU. Started as the agent's uid (root when
uid-separated), it makes itself non-dumpable, becomes UID:GID with no groups and no capabilities (inheritable
included), checks that, installs the syscall policy, answers b"R" and the policy's mode (with the policy's listener
attached, SCM_RIGHTS, in notify mode) or b"F" and why, and then serves the socket until EOF.
Requests: 8 bytes of length, then a NUL-separated record (cwd, argc, argv..., n, executable candidates...,
NAME=VALUE...), with the command's stdin, stdout and stderr attached to the length (SCM_RIGHTS). Messages back,
24 bytes each (kind, pid, value; little-endian): kind 1 answers a request (value: errno, 0 when started; a pidfd
of the command attached when the kernel has them), kind 2 reports that a command exited (value: its exit code as
os.waitstatus_to_exitcode gives it). Commands start with posix_spawn (vfork: no copy of the spawner's memory)
in a new session, in the spawner's cwd (set to the request's cwd first) and with the request's environment.

A program module like seccomp.py (builtins and ctypes only, no `from __future__`)."""

import _signal
import _socket
import ctypes
import errno
import os
import select
import sys

if __package__:  # imported as a module (tests, linters); run as the spawner, seccomp.py's text comes first
    from .seccomp import install

PR_GET_DUMPABLE, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_GET_NO_NEW_PRIVS = 3, 4, 38, 39
libc = sock = None  # main() sets them, the socket's fd and the command user's ids (-1: keep the agent's)
fd = uid = gid = -1


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


def main():
    """The spawner: argv SOCK_FD UID GID [POLICY [counters]] (counters: relayed, open this container's cgroup counters
    for the agent)."""
    global libc, sock, fd, uid, gid
    libc = ctypes.CDLL(None, use_errno=True)
    fd, uid, gid = (int(a) for a in sys.argv[1:4])
    policy = sys.argv[4] if len(sys.argv) > 4 else "notify"
    counters = sys.argv[5:6] == ["counters"]
    sock = _socket.socket(fileno=fd)
    setup()
    files = cgroup_files() if counters else []
    listener, mode = install(libc, policy == "notify") if policy != "off" else (-1, "none: off")
    fds = ([listener] if listener >= 0 else []) + [f for _, f in files]
    head = (b"R" + mode.encode() + b"\0" + str(int(listener >= 0)).encode() + b"\0"
            + ",".join(n for n, _ in files).encode())
    sock.sendmsg([head], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS,
                           b"".join(f.to_bytes(4, sys.byteorder) for f in fds))] if fds else [])
    for f in fds:
        os.close(f)
    serve()


if __name__ == "__main__":  # run as the spawner (`python -I -S -c SPAWNER_PROGRAM ...`)
    main()
