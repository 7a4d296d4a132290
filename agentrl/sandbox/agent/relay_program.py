# agentrl relay
"""The relay's program (the agent in a container of its own, `--relay NAME`: kubernetes, docker), run as `python3 -I -S
-c TEXT NAME` (TEXT: this file's, artifact.relay_source()): the main process of the sandbox container, uid 0
with only CAP_SETUID and CAP_SETGID (what the spawner needs to become the command user), in that container's cgroup,
i.e. under the sandbox's limits. It listens on the abstract unix socket NAME (scoped to the pod's network namespace)
and serves only peers of its own uid (SO_PEERCRED: the agent; commands run as another uid and are refused). A
request: 4 bytes of length, then a NUL-separated argv. It forks, puts one end of a fresh socketpair at fd 3 of the
child (stdin and stdout /dev/null) and execs argv there; the answer is 8 bytes, the child's pid (or -errno when the
fork failed: the commands' pids are full), with the other end of the socketpair attached (SCM_RIGHTS). Its children
are reaped by the kernel (SIGCHLD ignored); their orphans go to the pod's pause process. Builtins only, no `from
__future__`."""

import _signal
import _socket
import os
import sys


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
    if int.from_bytes(cred[4:8], sys.byteorder) != os.getuid():
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


def main():
    _signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)
    srv = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    srv.bind("\0" + sys.argv[1])
    srv.listen(16)
    while True:
        fd, _ = srv._accept()
        conn = _socket.socket(fileno=fd)
        try:
            serve(conn)
        except (OSError, EOFError):
            pass
        finally:
            conn.close()


if __name__ == "__main__":  # run as the relay (`python3 -I -S -c TEXT NAME`)
    main()
