#!/usr/bin/env python3
"""The in-sandbox agent: a single-file, stdlib-only HTTP/1.1 server that runs INSIDE a sandbox.

It is copied verbatim into bubblewrap sandboxes, Docker containers and Kubernetes pods, so it imports nothing
outside the Python 3.11 standard library and nothing of agentrl. It owns: executing commands (process groups,
deadlines, output caps), reading/writing files confined to the workspace, and answering health checks.
It does not own isolation or limits: the backend that started it applies those around it.

    agent.py --unix PATH --workspace DIR                       (local / docker: unix socket, no auth)
    agent.py --tcp HOST:PORT --token-file F --workspace DIR    (kubernetes: bearer token required)

Protocol (JSON bodies, HTTP/1.1 keep-alive with Content-Length, one thread per connection):

    GET  /health -> {ok, pid, version}
    POST /exec   {cmd: str|list, timeout, cwd, env, stdin, output_limit}
                 -> {exit_code, stdout, stderr, timed_out, truncated, duration_s}
    POST /write  {path, content_b64, mode} -> {ok, bytes}
    POST /read   {path} -> {content_b64}
    errors       -> {error: msg} with 400 (bad request), 401 (token), 403 (path outside workspace), 404, 413, 500

After binding, the agent prints READY_LINE on stdout so the starter needs no polling.
"""

from __future__ import annotations

import base64
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
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 413: "Payload Too Large", 500: "Internal Server Error"}


class HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# ---------------------------------------------------------------- paths


def resolve_in_workspace(root: str, path: object) -> str:
    """The real path of `path` (relative to `root`, or absolute inside it); 403 when it resolves outside."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise HTTPError(400, "field 'path' must be a non-empty string")
    real = os.path.realpath(os.path.join(root, path))
    if real != root and not real.startswith(root + os.sep):
        raise HTTPError(403, f"path {path!r} resolves outside the workspace {root} (to {real}); use a path inside it")
    return real


# ---------------------------------------------------------------- exec


class ExecRun:
    """One command: spawn in a new session, pump stdin/stdout/stderr, enforce the deadline and the output cap."""

    def __init__(self, argv: list[str], cwd: str, env: dict[str, str], stdin: bytes | None, limit: int) -> None:
        self.argv, self.cwd, self.env, self.stdin, self.limit = argv, cwd, env, stdin, limit
        self.out = bytearray()
        self.err = bytearray()
        self.truncated = False
        self.timed_out = False

    def start(self) -> subprocess.Popen:
        proc = subprocess.Popen(
            self.argv, cwd=self.cwd, env=self.env, start_new_session=True, close_fds=True,
            stdin=subprocess.PIPE if self.stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        _prefer_oom_kill(proc.pid)
        return proc

    def _append(self, buf: bytearray, data: bytes) -> None:
        room = self.limit - len(buf)
        if len(data) > room:
            self.truncated = True
            data = data[: max(room, 0)]
        buf += data

    def pump(self, proc: subprocess.Popen, deadline: float) -> bool:
        """Read both pipes until they close and the main process exits. Stops at the deadline (sets timed_out),
        or EXIT_GRACE_S after the main process exited while background processes still hold the pipes.
        Returns True when the pipes closed and the main process exited (no kill needed)."""
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
                if exited_at is None and pidfd is None and proc.poll() is not None:
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


def _prefer_oom_kill(pid: int) -> None:
    """Make the command (and what it forks from now on) the OOM killer's first choice, so that a memory hog
    dies rather than the agent. Raising oom_score_adj needs no privilege; best effort."""
    try:
        with open(f"/proc/{pid}/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


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


class Agent:
    """Request handlers. Tracks the process groups it started so shutdown can kill them."""

    def __init__(self, workspace: str) -> None:
        self.workspace = os.path.realpath(workspace)
        self._groups: set[int] = set()
        self._lock = threading.Lock()

    def dispatch(self, method: str, path: str, body: bytes) -> dict:
        routes = {("GET", "/health"): self.health, ("POST", "/exec"): self.exec,
                  ("POST", "/write"): self.write, ("POST", "/read"): self.read}
        handler = routes.get((method, path.split("?", 1)[0]))
        if handler is None:
            raise HTTPError(404 if method in ("GET", "POST") else 405, f"no route {method} {path}")
        req = _json_body(body) if method == "POST" else {}
        return handler(req)

    def health(self, req: dict) -> dict:
        return {"ok": True, "pid": os.getpid(), "version": VERSION, "workspace": self.workspace}

    def exec(self, req: dict) -> dict:
        argv = _argv(req.get("cmd"))
        timeout = _number(req, "timeout", 30.0)
        limit = int(_number(req, "output_limit", DEFAULT_OUTPUT_LIMIT))
        env = dict(os.environ)
        env.update(_str_map(req.get("env"), "env"))
        cwd = os.path.join(self.workspace, req.get("cwd") or ".")
        if not os.path.isdir(cwd):
            return _result(1, b"", f"agent: cwd {req.get('cwd')!r} is not a directory\n".encode(), False, False,
                           time.monotonic())
        stdin = req.get("stdin")
        if stdin is not None and not isinstance(stdin, str):
            raise HTTPError(400, "field 'stdin' must be a string")
        run = ExecRun(argv, cwd, env, None if stdin is None else stdin.encode(), limit)
        start = time.monotonic()
        try:
            proc = run.start()
        except OSError as e:
            code = 127 if isinstance(e, FileNotFoundError) else 126
            return _result(code, b"", f"{argv[0]}: {e.strerror or e}\n".encode(), False, False, start)
        with self._lock:
            self._groups.add(proc.pid)
        try:
            return self._finish(run, proc, start + timeout, start)
        finally:
            with self._lock:
                self._groups.discard(proc.pid)

    def _finish(self, run: ExecRun, proc: subprocess.Popen, deadline: float, start: float) -> dict:
        try:
            closed = run.pump(proc, deadline)
        except BaseException:
            _killpg(proc.pid)
            raise
        if not closed:
            _killpg(proc.pid)  # pgid == pid of the main process (start_new_session); also kills SIGTERM-ignorers
            run.drain(proc, DRAIN_AFTER_KILL_S)
        code = proc.wait()
        for stream in (proc.stdout, proc.stderr, proc.stdin):
            if stream is not None:
                stream.close()
        return _result(None if run.timed_out else code, run.out, run.err, run.timed_out, run.truncated, start)

    def write(self, req: dict) -> dict:
        target = resolve_in_workspace(self.workspace, req.get("path"))
        try:
            data = base64.b64decode(req.get("content_b64") or "", validate=True)
        except ValueError as e:
            raise HTTPError(400, f"field 'content_b64' is not valid base64: {e}") from None
        mode = int(req.get("mode", 0o644))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        resolve_in_workspace(self.workspace, target)  # a parent may have been a symlink created meanwhile
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
        target = resolve_in_workspace(self.workspace, req.get("path"))
        fd = _open_regular(target, os.O_RDONLY, 0, req["path"])
        with open(fd, "rb") as f:
            if os.fstat(fd).st_size > MAX_READ:
                raise HTTPError(413, f"file {req['path']!r} is larger than {MAX_READ} bytes; read it in parts via exec")
            return {"content_b64": base64.b64encode(f.read()).decode("ascii")}

    def kill_all(self) -> None:
        with self._lock:
            groups = list(self._groups)
        for pgid in groups:
            _killpg(pgid)


def _open_regular(path: str, flags: int, mode: int, shown: str) -> int:
    """os.open that never blocks on a FIFO or device (O_NONBLOCK) and refuses anything but a regular file."""
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW, mode)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise HTTPError(400, f"path {shown!r} is not a regular file (a directory, FIFO or device)")
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
        return e.status, {"error": e.message}
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
    token = os.environ.get("AGENTRL_AGENT_TOKEN", "")
    if "--token-file" in opts:
        with open(opts["--token-file"], encoding="utf-8") as f:
            token = f.read().strip()
    if not token:
        sys.exit("agent: --tcp needs a bearer token: pass --token-file FILE or set AGENTRL_AGENT_TOKEN")
    return token


USAGE = "usage: agent.py (--unix PATH | --tcp HOST:PORT [--token-file FILE]) --workspace DIR"


def _parse(argv: list[str] | None) -> dict[str, str]:
    """--unix | --tcp, --token-file, --workspace (hand-parsed: argparse costs ~10 ms of start-up)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) % 2 or any(k not in ("--unix", "--tcp", "--token-file", "--workspace") for k in args[::2]):
        sys.exit(USAGE)
    opts = dict(zip(args[::2], args[1::2]))
    if ("--unix" in opts) == ("--tcp" in opts) or "--workspace" not in opts:
        sys.exit(USAGE)
    return opts


def _on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    opts = _parse(argv)
    token = _token(opts)
    os.makedirs(opts["--workspace"], exist_ok=True)
    agent = Agent(opts["--workspace"])
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
        agent.kill_all()
        sock.close()
        if "--unix" in opts:
            try:
                os.unlink(opts["--unix"])
            except OSError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
