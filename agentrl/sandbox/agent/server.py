"""The agent's HTTP/1.1 server: one `Acceptor` thread holds every new connection until its first request head is
complete and checks the bearer token, then an authorized connection gets a worker thread (`serve_connection`:
keep-alive, JSON bodies, PUT /file's body streamed in and GET /file's streamed out (bodies.py))."""

from __future__ import annotations

import errno
import json
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable

from .bodies import BodyStream, FileBody, Reader
from .protocol import MAX_BODY, HTTPError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the agent's start-up time)
if TYPE_CHECKING:
    from .handlers import Agent

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 409: "Conflict", 413: "Payload Too Large",
            431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}
STOPPING = threading.Event()  # set by SIGTERM before the commands are killed: no answer leaves after it

MAX_REQUEST_LINE = 8192
MAX_HEAD = 16 * 1024  # request line + headers
MAX_HEADERS = 64
MAX_PENDING = 128  # connections still sending their first request head; beyond it the oldest is dropped
MAX_WORKERS = 32  # authorized connections served at once, one thread each; beyond it new ones get 503
PARKED_WORKERS = 4  # worker threads started up front and kept between connections: served even when no thread can
#                    start (a pod's pids limit, which the agent shares with the commands, is full)
HANDSHAKE_TIMEOUT_S = 10.0  # a new connection must send a complete first request head within this
IDLE_TIMEOUT_S = 300.0  # an authorized keep-alive connection silent this long is closed (the client reuses < 60 s)
ACCEPTS_PER_ROUND = 64


class _Head:
    """A parsed request line and headers."""

    def __init__(self, method: str, target: str, headers: dict[str, str], length: int) -> None:
        self.method, self.target, self.headers, self.length = method, target, headers, length

    @property
    def keep_alive(self) -> bool:
        return self.headers.get("connection", "").lower() != "close"


def _read_head(reader: Reader) -> _Head | None:
    """The next request head, None at EOF before it; HTTPError(400/431) for a malformed or oversized one."""
    line = reader.readline(MAX_REQUEST_LINE + 1)
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not line.endswith(b"\n"):
        raise HTTPError(400, f"bad request line {line[:100]!r}")
    headers: dict[str, str] = {}
    size = len(line)
    while True:
        h = reader.readline(MAX_HEAD + 1)
        size += len(h)
        if size > MAX_HEAD or len(headers) >= MAX_HEADERS:
            raise HTTPError(431, f"request head larger than {MAX_HEAD} bytes or {MAX_HEADERS} headers")
        if h in (b"\r\n", b"\n"):
            break
        if not h.endswith(b"\n"):
            raise HTTPError(400, "connection closed inside the request head")
        name, _, value = h.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = headers.get("content-length", "0").strip() or "0"
    if not length.isdigit():  # digits only: a negative length must not read to EOF
        raise HTTPError(400, f"bad Content-Length {length[:40]!r}")
    return _Head(parts[0], parts[1], headers, int(length))


def _head_complete(buf: bytearray) -> bool:
    return b"\r\n\r\n" in buf or b"\n\n" in buf


def _answer(conn: socket.socket, status: int, obj: dict | FileBody, keep: bool) -> None:
    if STOPPING.is_set():  # SIGTERM: the shutdown kills the commands, and an answer now would report that death (a
        if isinstance(obj, FileBody):
            obj.close()
        conn.shutdown(socket.SHUT_RDWR)  # command "killed:9") as the command's own outcome; the host must see the
        raise ConnectionAbortedError("the agent is stopping")  # connection drop, the sandbox's death, instead
    tail = "" if keep else "Connection: close\r\n"
    if isinstance(obj, FileBody):
        obj.send(conn, (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: "
                        f"application/octet-stream\r\nContent-Length: {len(obj)}\r\n{tail}\r\n").encode())
        return
    payload = json.dumps(obj).encode()
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n{tail}\r\n")
    conn.sendall(head.encode() + payload)


def _error_body(e: HTTPError) -> dict:
    return {"error": e.message, **({"kind": e.kind} if e.kind else {})}


def _refuse(conn: socket.socket, e: HTTPError) -> None:
    """Best-effort answer on a connection about to be closed by the acceptor (never blocks it)."""
    payload = json.dumps(_error_body(e)).encode()
    try:
        conn.send(f"HTTP/1.1 {e.status} {_REASONS.get(e.status, 'Error')}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
    except OSError:
        pass
    conn.close()


def serve_connection(conn: socket.socket, agent: Agent, token: str | None, reader: Reader,
                     head: _Head | None = None, release: Callable[[], bool] | None = None) -> None:
    """Keep-alive loop for one authorized connection: read a request, check its token before reading its body,
    dispatch, answer, repeat until EOF, close, a malformed request or IDLE_TIMEOUT_S of silence. `release()` true
    after a request: answer it with Connection: close and end (another connection waits for this thread)."""
    try:
        while True:
            try:
                head = head or _read_head(reader)
            except HTTPError as e:
                _answer(conn, e.status, _error_body(e), False)
                return
            if head is None:
                return
            if token is not None and not _authorized(head.headers, token):
                _answer(conn, 401, {"error": "missing or wrong bearer token (header 'Authorization: Bearer "
                                             "<token>')"}, False)
                return
            streamed = head.method == "PUT"  # a file's body: read as it is written (BodyStream), no cap
            if head.length > MAX_BODY and not streamed:
                _answer(conn, 413, {"error": f"request body larger than {MAX_BODY} bytes"}, False)
                return
            body: bytes | bytearray | BodyStream
            if streamed:
                body = BodyStream(reader, head.length)
            else:
                raw = reader.read(head.length) if head.length else b""
                if len(raw) != head.length:
                    return
                body = raw
            status, obj = _handle(agent, head.method, head.target, body)
            if isinstance(body, BodyStream) and not body.drain():  # the rest of a body the handler did not use
                if isinstance(obj, FileBody):
                    obj.close()
                return
            keep = head.keep_alive and not (release is not None and release())
            _answer(conn, status, obj, keep)
            if not keep:
                return
            head = None
    except (OSError, ValueError):  # peer gone, idle timeout: drop the connection
        return
    finally:
        conn.close()


def _handle(agent: Agent, method: str, target: str,
            body: bytes | bytearray | BodyStream) -> tuple[int, dict | FileBody]:
    try:
        return 200, agent.dispatch(method, target, body)
    except HTTPError as e:
        return e.status, _error_body(e)
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


def _from_inside(conn: socket.socket) -> bool:
    """A tcp connection whose peer address is the agent's own: it comes from inside the sandbox (pod), never from
    the host side. Unix sockets: False (only the host side can reach the socket under uid separation)."""
    if conn.family == socket.AF_UNIX:
        return False
    try:
        return conn.getpeername()[0] == conn.getsockname()[0]
    except OSError:
        return True


class Acceptor:
    """Accepts connections and holds each, in this one thread, until its first request head is complete: at most
    MAX_PENDING at once, each for at most `handshake_timeout_s`, at most MAX_HEAD bytes. Only then is the bearer
    token checked; an authorized connection gets a worker thread (at most MAX_WORKERS), a wrong token 401 and close.
    A flood of idle or unauthenticated connections from inside the sandbox therefore costs the agent no thread and
    a bounded number of file descriptors. When full, a new connection pushes out the oldest pending one that came
    from the sandbox itself (tcp: its peer address is the agent's own), so a flood from inside cannot push out the
    host's connection while its request is on the way; only without such a one the oldest of all."""

    def __init__(self, sock: socket.socket, agent: Agent, token: str | None, *,
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S) -> None:
        self.sock, self.agent, self.token = sock, agent, token
        self.handshake_timeout_s = handshake_timeout_s
        self.sel = selectors.DefaultSelector()
        self.pending: dict[socket.socket, tuple[bytearray, float, bool]] = {}  # in accept order; bool: local
        self.workers = 0
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[socket.socket, Reader, _Head]] = queue.SimpleQueue()
        self.parked = 0  # kept worker threads waiting for a connection (_jobs), less the connections waiting for one
        for _ in range(PARKED_WORKERS):
            threading.Thread(target=self._parked, name="agent-worker", daemon=True).start()
            self.parked += 1

    def serve_forever(self) -> None:
        self.sock.setblocking(False)
        self.sel.register(self.sock, selectors.EVENT_READ)
        while True:
            ready = self.sel.select(self._wait())
            accept = False
            for key, _ in ready:
                if key.fileobj is self.sock:
                    accept = True
                elif key.fileobj in self.pending:
                    self._receive(key.fileobj)
            if accept:
                self._accept()
            self._expire()

    def _wait(self) -> float | None:
        if not self.pending:
            return None
        return max(0.0, next(iter(self.pending.values()))[1] - time.monotonic())

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_ROUND):
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return
            except OSError as e:  # EMFILE/ENFILE/ENOBUFS: shed the oldest pending connection, else back off
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if self.pending:
                        self._drop(self._victim())
                    else:
                        time.sleep(0.01)
                return
            conn.setblocking(False)
            if conn.family != socket.AF_UNIX:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while len(self.pending) >= MAX_PENDING:
                self._drop(self._victim())
            self.pending[conn] = (bytearray(), time.monotonic() + self.handshake_timeout_s, _from_inside(conn))
            self.sel.register(conn, selectors.EVENT_READ)
            self._receive(conn)  # the client usually sent its request with the connect

    def _victim(self) -> socket.socket:
        """The pending connection to push out: the oldest from inside the sandbox, else the oldest."""
        return next((c for c, (_, _, inside) in self.pending.items() if inside), next(iter(self.pending)))

    def _receive(self, conn: socket.socket) -> None:
        buf = self.pending[conn][0]
        try:
            data = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        buf += data
        if _head_complete(buf):
            self._admit(conn, buf)
        elif len(buf) > MAX_HEAD:
            self._forget(conn)
            _refuse(conn, HTTPError(431, f"request head larger than {MAX_HEAD} bytes"))

    def _admit(self, conn: socket.socket, buf: bytearray) -> None:
        self._forget(conn)
        reader = Reader(conn, bytes(buf))
        try:
            head = _read_head(reader)  # complete in the buffer: no recv on the non-blocking socket
        except (HTTPError, OSError) as e:
            _refuse(conn, e if isinstance(e, HTTPError) else HTTPError(400, "malformed request head"))
            return
        if head is None:
            conn.close()
            return
        if self.token is not None and not _authorized(head.headers, self.token):
            _refuse(conn, HTTPError(401, "missing or wrong bearer token (header 'Authorization: Bearer <token>')"))
            return
        with self._lock:
            full = self.workers >= MAX_WORKERS
            parked = not full and self.parked > 0
            if not full:
                self.workers += 1
            if parked:
                self.parked -= 1
        if full:
            _refuse(conn, HTTPError(503, f"the agent serves {MAX_WORKERS} connections already"))
            return
        conn.setblocking(True)
        conn.settimeout(IDLE_TIMEOUT_S)
        if parked:
            self._jobs.put((conn, reader, head))
            return
        try:
            threading.Thread(target=self._work, args=(conn, reader, head), daemon=True).start()
        except RuntimeError:  # no thread can be started (pids limit): the next kept worker that is free serves it
            with self._lock:
                self.parked -= 1  # parked = idle kept workers - connections waiting for one
            self._jobs.put((conn, reader, head))

    def _work(self, conn: socket.socket, reader: Reader, head: _Head) -> None:
        try:
            serve_connection(conn, self.agent, self.token, reader, head)
        finally:
            self._done()

    def _parked(self) -> None:
        """A worker kept for the agent's life: serves one connection after another (handed over by _admit)."""
        while True:
            conn, reader, head = self._jobs.get()
            try:
                serve_connection(conn, self.agent, self.token, reader, head, release=lambda: self.parked < 0)
            except Exception:  # serve_connection answers errors itself; never lose this thread
                pass
            finally:
                with self._lock:
                    self.workers -= 1
                    self.parked += 1

    def _done(self) -> None:
        with self._lock:
            self.workers -= 1

    def _expire(self) -> None:
        now = time.monotonic()
        while self.pending:
            conn, (_, deadline, _) = next(iter(self.pending.items()))
            if deadline > now:
                return
            self._drop(conn)

    def _forget(self, conn: socket.socket) -> None:
        del self.pending[conn]
        self.sel.unregister(conn)

    def _drop(self, conn: socket.socket) -> None:
        self._forget(conn)
        conn.close()
