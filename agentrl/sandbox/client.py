"""The data plane: `AgentClient` talks HTTP/1.1 to one in-sandbox agent; `Sandbox` is the handle a trajectory holds.

Owns: the host's side of the agent's wire protocol (its constants are `agent/protocol.py`'s, shared with the agent:
a hand-rolled, minimal asyncio HTTP/1.1 client: keep-alive connections reused per sandbox, TCP_NODELAY, bearer token
for tcp), per-request deadlines, and mapping failures to exceptions.
Does not own: creating or destroying sandboxes (backends), leasing them (pool).

Exceptions raised by `Sandbox` methods:

    SandboxDiedError (agentrl.errors, infra)   connection refused/reset, socket gone, no answer within the deadline
                                               (agentrl.deadline: a stall of the runner's own loop is not counted);
                                               `.in_flight` says whether a request had been sent when it broke
    SandboxError     (agentrl.errors, infra)   the agent answered 5xx, rejected our token or has no such route (an
                                               agent of another protocol version): a bug or misconfig
    SandboxPathError (PermissionError)         403: the path resolves outside the workspace, or the sandbox user may
                                               not access it; 400 kind "bad_path": it cannot be resolved (more than
                                               40 symlinks, a loop, NUL, too long) -> a tool error / the policy's
                                               doing, never infra
    SandboxFileError (ValueError)              the path is not a regular file (directory, FIFO, socket, device,
                                               symlink), is larger than the reader's limit (413, kind "too_large";
                                               read_bytes(limit=), READ_LIMIT by default), or changed size while it
                                               was read (kind "changed_while_read"): the policy's doing, never infra
    FileNotFoundError                          404 from GET /file

Files move as raw bytes (PUT / GET /file, see agent/protocol.py), FILE_CHUNK at a time on both sides: the agent
never holds a file, and the host holds only the bytes the caller passed in or gets back (no base64 or JSON copies
of them).
    SandboxSurvivorsError (agentrl.errors      409 kind "survivors": processes of the sandbox user survived SIGKILL
      .PolicyError)                            (/kill_all, kill_leftovers): the policy's doing, scored
    ValueError                                 400: bad arguments

Idle keep-alive connections are reused for at most IDLE_REUSE_S (the agent closes them after 300 s of silence;
never sending on one it may be closing at that moment keeps a request from being lost on it).
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import time
from typing import Any

from agentrl.deadline import Deadline
from agentrl.errors import PolicyError, SandboxDiedError, SandboxError
from agentrl.sandbox.agent.protocol import (
    EXEC,
    FILE,
    FILE_CHUNK,
    FILE_DONE,
    HEALTH,
    KILL_ALL,
    KIND_BAD_PATH,
    KIND_NO_ROUTE,
    KIND_NOT_REGULAR,
    KIND_SURVIVORS,
    KIND_TOO_LARGE,
)
from agentrl.sandbox.base import AgentEndpoint, ExecResult, SandboxHandle, SandboxSpec

EXEC_GRACE_S = 10.0  # client-side deadline of an exec = its timeout + this (a hung agent never hangs the caller)
IO_TIMEOUT_S = 60.0  # deadline of a file transfer, plus its size at IO_MIN_RATE
IO_MIN_RATE = 16 * 1024 * 1024  # bytes/s a live agent moves a file at least (a slower one is taken for hung)
READ_LIMIT = 256 * 1024 * 1024  # read_bytes' default limit: a larger file is refused (413) before it is sent
HEALTH_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 4  # per sandbox: concurrent requests beyond this wait
IDLE_REUSE_S = 60.0  # an idle keep-alive connection older than this is closed, not reused (agent: 300 s)


class SandboxPathError(PermissionError):
    """The agent refused a path outside the workspace (HTTP 403). A task-level failure: report it to the model."""


class SandboxSurvivorsError(PolicyError):
    """The agent could not kill the sandbox user's processes (HTTP 409, kind "survivors"): they survived SIGKILL for
    seconds. Only the policy's commands run as that user: the policy's doing, scored, never infra."""

    kind = "processes_survived_kill"


class SandboxFileError(ValueError):
    """The file cannot be read or written as one: not a regular file (kind "not_regular") or over the read cap
    (kind "too_large", HTTP 413). What is in the workspace is the policy's doing: a task-level failure, not infra."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Connection:
    """One keep-alive HTTP/1.1 connection to the agent."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.reusable = True
        self.sent = False  # the current request was handed to the transport (the agent may be acting on it)
        self.idle_since = time.monotonic()

    def stale(self) -> bool:
        """The agent closed this idle connection (it exited, or dropped it): do not send on it. Asks the kernel
        (one poll): the event loop may not have seen the EOF yet. An idle connection is never readable (the agent
        never speaks unasked), so readable means EOF or reset."""
        if self.reader.at_eof() or self.writer.is_closing():
            return True
        sock = self.writer.get_extra_info("socket")
        if sock is None:
            return False
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN | select.POLLRDHUP)
        return bool(poller.poll(0))

    async def roundtrip(self, head: bytes, body: bytes | bytearray | memoryview) -> tuple[int, bytes | bytearray]:
        """Send `head` and `body` (FILE_CHUNK at a time, waiting for the transport to take each) and return the
        answer's status and body. A 200 octet-stream body is read into one buffer of its announced size, FILE_CHUNK
        at a time (the StreamReader never holds more than its own small limit)."""
        self.sent = False
        view = memoryview(body)
        if len(view) <= FILE_CHUNK:
            self.writer.write(head + body)
            self.sent = True
        else:
            self.writer.write(head)
            self.sent = True
            for i in range(0, len(view), FILE_CHUNK):
                self.writer.write(view[i:i + FILE_CHUNK])
                await self.writer.drain()
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length, raw_body = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and value.strip().lower() == "close":
                self.reusable = False
            elif name == "content-type" and value.strip().lower() == "application/octet-stream":
                raw_body = True
        if not length:
            return status, b""
        if not raw_body:
            return status, await self.reader.readexactly(length)
        payload = bytearray(length)
        got = 0
        while got < length:
            chunk = await self.reader.read(min(FILE_CHUNK, length - got))
            if not chunk:
                raise asyncio.IncompleteReadError(b"", length - got)
            payload[got:got + len(chunk)] = chunk
            got += len(chunk)
        return status, payload

    def close(self) -> None:
        self.reusable = False
        self.writer.close()


class AgentClient:
    """Requests to one agent over a small pool of keep-alive connections (at most `max_connections`)."""

    def __init__(self, endpoint: AgentEndpoint, *, max_connections: int = MAX_CONNECTIONS,
                 connect_timeout_s: float = 5.0) -> None:
        if endpoint.kind == "tcp" and not endpoint.token:
            raise ValueError(f"tcp endpoint {endpoint.address} needs a bearer token (AgentEndpoint.token)")
        self.endpoint = endpoint
        self._connect_timeout_s = connect_timeout_s
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        auth = f"Authorization: Bearer {endpoint.token}\r\n" if endpoint.token else ""
        self._head_tail = f"Host: agent\r\n{auth}Content-Type: application/json\r\n"
        self._closed = False

    async def request(self, method: str, path: str, payload: dict[str, Any] | None, *,
                      timeout: float) -> tuple[int, dict[str, Any]]:
        """One request; returns (status, decoded JSON). Transport failures raise SandboxDiedError, with
        `in_flight=True` when the request had been sent (the agent died or hung while handling it)."""
        body = json.dumps(payload).encode() if payload is not None else b""
        status, raw = await self.exchange(method, path, body, timeout=timeout)
        if isinstance(raw, bytearray):
            raise SandboxError(f"agent at {self.endpoint.address} answered {method} {path} with raw bytes")
        return status, _decode(raw, status)

    async def exchange(self, method: str, path: str, body: bytes | bytearray | memoryview, *, timeout: float,
                       content_type: str = "application/json") -> tuple[int, bytes | bytearray]:
        """One request with a body of raw bytes; returns (status, body): a bytearray for a 200 octet-stream
        answer (GET /file), else the answer's bytes (JSON). Failures as request()."""
        if self._closed:
            raise SandboxDiedError(f"client for agent {self.endpoint.address} is closed")
        tail = self._head_tail.replace("application/json", content_type)
        head = f"{method} {path} HTTP/1.1\r\n{tail}Content-Length: {len(body)}\r\n\r\n".encode()
        async with self._slots:
            conn = None
            try:
                async with Deadline(timeout):  # a stall of our own loop is not the agent's lateness
                    conn = self._take_idle() or await self._connect()
                    status, raw = await conn.roundtrip(head, body)
            except TimeoutError:
                self._discard(conn)
                raise SandboxDiedError(
                    f"agent at {self.endpoint.address} did not answer {method} {path} within {timeout:.1f}s",
                    in_flight=conn is not None and conn.sent, request=f"{method} {path}") from None
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
                self._discard(conn)
                sent = conn is not None and conn.sent
                raise SandboxDiedError(
                    f"agent at {self.endpoint.address} is gone ({type(e).__name__}: {e}) "
                    f"{'during' if sent else 'before'} {method} {path}", in_flight=sent,
                    request=f"{method} {path}") from e
            except BaseException:  # cancelled mid-request: the connection's state is unknown
                self._discard(conn)
                raise
            self._release(conn)
        return status, raw

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since < IDLE_REUSE_S and not conn.stale():
                return conn
            conn.close()
        return None

    async def _connect(self) -> _Connection:
        ep = self.endpoint
        async with Deadline(self._connect_timeout_s):
            if ep.kind == "unix":
                reader, writer = await asyncio.open_unix_connection(ep.address)
            else:
                host, _, port = ep.address.rpartition(":")
                reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
                writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Connection(reader, writer)

    def _release(self, conn: _Connection) -> None:
        if conn.reusable and not self._closed:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()

    @staticmethod
    def _discard(conn: _Connection | None) -> None:
        if conn is not None:
            conn.close()

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _decode(raw: bytes, status: int) -> dict[str, Any]:
    try:
        obj = json.loads(raw) if raw else {}
    except ValueError:
        obj = {"error": raw[:500].decode("utf-8", "replace")}
    if not isinstance(obj, dict):
        obj = {"error": f"unexpected response {obj!r:.200}"}
    if status == 200:
        return obj
    return {"error": obj.get("error", f"HTTP {status}"), "kind": obj.get("kind")}


def _quote(path: str) -> str:
    from urllib.parse import quote

    return quote(path, safe="/", errors="surrogatepass")  # a lone surrogate arrives undecodable: bad_path


def _raise_for(status: int, obj: dict[str, Any], what: str) -> None:
    if status == 200:
        return
    msg = f"{what}: {obj.get('error')}"
    kind = obj.get("kind")
    if status == 403 or (status == 400 and kind == KIND_BAD_PATH):
        raise SandboxPathError(msg)
    if status == 409 and kind == KIND_SURVIVORS:
        raise SandboxSurvivorsError(msg)
    if status == 413 or (status == 400 and kind == KIND_NOT_REGULAR):
        raise SandboxFileError(msg, kind or KIND_TOO_LARGE)
    if status in (404, 405) and (kind == KIND_NO_ROUTE or str(obj.get("error", "")).startswith("no route")):
        # an agent of another protocol version (protocol.VERSION; before 2 it had no /file): a setup fault, infra
        raise SandboxError(f"{msg} (the sandbox's agent does not speak this client's protocol: another version)")
    if status == 404:
        raise FileNotFoundError(msg)
    if status in (400, 413):
        raise ValueError(msg)
    raise SandboxError(f"{msg} (HTTP {status} from the agent)")


class Sandbox:
    """The handle one trajectory holds for its lease. State (files, background processes) persists across calls."""

    def __init__(self, handle: SandboxHandle, spec: SandboxSpec, *, client: AgentClient | None = None) -> None:
        self.handle = handle
        self.spec = spec
        self.client = client or AgentClient(handle.endpoint)
        self.agent_info: dict[str, Any] = {}  # the last /health answer (the pool checks health before every lease)
        self._observed: list[ExecResult] = []  # what the agent counted (probes, resources), until take_observed()

    @property
    def uid_separated(self) -> bool:
        """Commands run under a uid other than the agent's (they cannot signal, trace or read it). False until a
        health check said so; the pool health-checks every sandbox before handing it out."""
        return self.agent_info.get("uid_separated") is True

    @property
    def resources_separated(self) -> bool:
        """The commands' memory / pids / CPU limits are theirs alone: the agent (and the backend's supervisors) run
        outside them, so a command exhausting them cannot kill or starve the agent. False until a health check said
        so, and on backends that cannot separate them (then the policy answers for every death of its sandbox)."""
        return self.agent_info.get("resources_separated") is True

    @property
    def judge_python(self) -> str | None:
        """An interpreter for graders (judges, clients holding a secret) that is non-dumpable from its execve: an
        execute-only copy of the sandbox's python3 the command user cannot read, so the kernel refuses a same-uid
        process its /proc/<pid>/mem, fds and ptrace from the first instruction. None (use "python3" and turn
        non-dumpable first thing) until a health check reported one: user images, non-root hosts."""
        return self.agent_info.get("judge_python")

    @property
    def grader_python(self) -> str:
        """What graders run on: `judge_python`, else "python3" (which then turns non-dumpable first thing)."""
        return self.judge_python or "python3"

    @property
    def command_uid(self) -> int | None:
        return self.agent_info.get("command_uid")

    @property
    def id(self) -> str:
        return self.handle.id

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, backend={self.handle.backend!r})"

    async def exec(self, cmd: str | list[str], *, timeout: float | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, stdin: str | None = None,
                   kill_leftovers: bool = False) -> ExecResult:
        """Run `cmd` (a string goes through /bin/sh -c) in the workspace. A timeout is data (timed_out=True).
        `kill_leftovers`: afterwards kill every process the sandbox user still has (as `kill_all()`), so nothing the
        command started in the background outlives the call."""
        limit = timeout if timeout is not None else self.spec.default_timeout_s
        payload: dict[str, Any] = {"cmd": cmd, "timeout": limit, "output_limit": self.spec.output_limit}
        for key, value in (("cwd", cwd), ("env", env), ("stdin", stdin)):
            if value is not None:
                payload[key] = value
        if kill_leftovers:
            payload["kill_leftovers"] = True
        status, obj = await self.client.request("POST", EXEC, payload, timeout=limit + EXEC_GRACE_S)
        _raise_for(status, obj, f"exec in sandbox {self.id}")
        result = ExecResult(**obj)
        if result.probes or result.resources:
            self._observed.append(result)
        return result

    async def kill_all(self) -> int:
        """SIGKILL every process of the sandbox user (every process commands started, daemons included; with uid
        separation nothing of the agent) until none is left. Returns how many were killed. Call it before grading."""
        status, obj = await self.client.request("POST", KILL_ALL, {}, timeout=IO_TIMEOUT_S)
        _raise_for(status, obj, f"kill_all in sandbox {self.id}")
        if obj.get("probes"):  # refusals of processes that outlived their command, counted until now
            self._observed.append(ExecResult(exit_code=0, stdout="", stderr="", probes=obj["probes"]))
        return int(obj["killed"])

    def take_observed(self) -> list[ExecResult]:
        """The exec results (and kill_all reports) whose agent counts moved since the last take: the syscall
        policy's refusals (`probes`) and the commands' resource counters (`resources`). The runner turns them into
        integrity signals at the turn it takes them (runner/integrity.py, `from_sandbox`)."""
        out, self._observed = self._observed, []
        return out

    async def write_file(self, path: str, content: str | bytes | bytearray | memoryview, mode: int = 0o644) -> None:
        """Write `content` to `path` (created with its parents; `mode` applied). The bytes go to the agent as they
        are, FILE_CHUNK at a time (a str is encoded once); the agent writes them as they arrive."""
        if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:
            raise ValueError(f"mode must be a permission number such as 0o644, got {mode!r}")
        data = content.encode() if isinstance(content, str) else content
        size = memoryview(data).nbytes
        status, raw = await self.client.exchange(
            "PUT", f"{FILE}?path={_quote(path)}&mode={mode}", data, content_type="application/octet-stream",
            timeout=IO_TIMEOUT_S + size / IO_MIN_RATE)
        _raise_for(status, _decode(bytes(raw), status), f"write {path!r} in sandbox {self.id}")

    async def read_bytes(self, path: str, *, limit: int = READ_LIMIT) -> bytes:
        """The content of `path` (a bytearray: one buffer of the file's size, nothing copied after it arrived).
        A file larger than `limit` bytes is refused (SandboxFileError kind "too_large") before it is sent; one that
        changed size while read raises SandboxFileError kind "changed_while_read" (never a short or padded file)."""
        status, raw = await self.client.exchange("GET", f"{FILE}?path={_quote(path)}&max={int(limit)}", b"",
                                                 timeout=IO_TIMEOUT_S + limit / IO_MIN_RATE)
        what = f"read {path!r} in sandbox {self.id}"
        _raise_for(status, _decode(bytes(raw), status) if status != 200 else {}, what)
        if not isinstance(raw, bytearray) or not raw:
            raise SandboxError(f"{what}: the agent's answer is not a file's bytes (an agent of another version?)")
        if raw[-1:] != FILE_DONE:
            raise SandboxFileError(f"{what}: the file changed size while it was read", "changed_while_read")
        del raw[-1:]  # the status byte (shrinking a bytearray at its end copies nothing)
        return raw  # type: ignore[return-value]  # a bytearray: bytes' methods, no copy of a file of any size

    async def read_file(self, path: str, *, limit: int = READ_LIMIT) -> str:
        return (await self.read_bytes(path, limit=limit)).decode("utf-8", "replace")

    async def health(self) -> bool:
        """True when the agent answers; never raises for a dead agent."""
        try:
            status, obj = await self.client.request("GET", HEALTH, None, timeout=HEALTH_TIMEOUT_S)
        except SandboxDiedError:
            return False
        if status == 200:
            self.agent_info = obj
        return status == 200 and obj.get("ok") is True

    async def close(self) -> None:
        """Close the connections (the pool does this before the backend destroys the sandbox)."""
        await self.client.close()


async def probe_health(endpoint: AgentEndpoint, *, timeout_s: float = 5.0) -> bool:
    """One-shot health check of an agent on a fresh connection (used while a sandbox starts)."""
    client = AgentClient(endpoint, max_connections=1, connect_timeout_s=2.0)
    try:
        status, obj = await client.request("GET", HEALTH, None, timeout=timeout_s)
        return status == 200 and obj.get("ok") is True
    except SandboxDiedError:
        return False
    finally:
        await client.close()
