"""HTTP transport of the HTTP engine clients (SGLang, vLLM): one aiohttp session with explicit limits, and the
error classification.

Owns: the connection pool (`max_connections` total and per host, TCP_NODELAY set on every socket, keep-alive),
split timeouts (connect vs whole request), turning every failure into one of two exceptions, and extracting the
server's own error message from an error body. Does not own retries (the engine decides, it knows the routing) or
what the endpoints mean.

    EngineError (agentrl.errors)
    ├── ServerHTTPError        a definitive answer: 4xx other than 408/429 (bad request, unknown field, context
    │                          overflow, 404 from a router for a control endpoint). Retrying cannot help.
    └── EngineUnavailableError
        └── TransientError     connection refused / reset / dropped mid-response, timeout, 408/429/5xx.
                               The engine retries these (another worker when it routes itself), then gives up.

Each client raises its own subclasses (`SGLangHTTPError`, `VLLMHTTPError`, ...: `server` names the server in the
message); the Transport is given them (`Errors`).

The session binds to the event loop that first uses it; `close()` must run on that loop (or after it stopped).
JSON goes through `orjson` when it is installed (the `sglang-client` extra): encoding a multi-thousand-token
`input_ids` list is most of a request's client-side CPU, and orjson does it ~10x faster than the standard library.
"""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass
from typing import Any

import aiohttp

from agentrl.errors import EngineError, EngineUnavailableError

try:
    import orjson
except ImportError:  # optional: the standard library does the same, slower
    orjson = None

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_MAX_MESSAGE = 2000


class ServerHTTPError(EngineError):
    """The server answered and refused: `status`, the URL, and the server's own message. Retrying cannot help."""

    server = "server"  # the client's subclass names the server in the message

    def __init__(self, url: str, status: int, message: str) -> None:
        self.url, self.status, self.message = url, status, message
        super().__init__(f"{self.server} {url} answered HTTP {status}: {message}")


class TransientError(EngineUnavailableError):
    """The request may succeed if repeated (possibly on another worker)."""

    server = "server"

    def __init__(self, url: str, reason: str, status: int | None = None) -> None:
        self.url, self.reason, self.status = url, reason, status
        super().__init__(f"{self.server} {url}: {reason}")


@dataclass(frozen=True)
class Errors:
    """The exception classes one client's Transport raises."""

    refused: type[ServerHTTPError] = ServerHTTPError
    transient: type[TransientError] = TransientError


@dataclass(frozen=True)
class Limits:
    max_connections: int = 256
    connect_timeout_s: float = 10.0
    request_timeout_s: float = 600.0  # the session default; a call may pass its own
    keepalive_s: float = 60.0


def nodelay_socket(addr_info: Any) -> socket.socket:
    """aiohttp socket factory: a plain TCP socket with TCP_NODELAY (no Nagle delay on small JSON requests)."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class Transport:
    """JSON over HTTP with one pooled aiohttp session, created lazily on the caller's loop."""

    def __init__(self, limits: Limits, errors: Errors = Errors()) -> None:
        self.limits = limits
        self.errors = errors
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.limits.max_connections, limit_per_host=self.limits.max_connections,
                keepalive_timeout=self.limits.keepalive_s, socket_factory=nodelay_socket,
            )
            timeout = aiohttp.ClientTimeout(total=self.limits.request_timeout_s,
                                            sock_connect=self.limits.connect_timeout_s)
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, raise_for_status=False,
                                                  json_serialize=_dumps)
            self._loop = asyncio.get_running_loop()
        return self._session

    async def request(self, method: str, url: str, *, body: Any = None, headers: dict[str, str] | None = None,
                      timeout_s: float | None = None) -> Any:
        """Send, read the whole answer, return its JSON (or text for non-JSON 200s). Raises the errors above.
        `timeout_s` None: the session's request timeout (no per-call timer objects on the hot path)."""
        timeout_s = self.limits.request_timeout_s if timeout_s is None else timeout_s
        kwargs: dict[str, Any] = {"headers": headers}
        if timeout_s != self.limits.request_timeout_s:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout_s, sock_connect=self.limits.connect_timeout_s)
        if body is not None:
            kwargs["json"] = body
        try:
            async with self.session().request(method, url, **kwargs) as resp:
                raw = await resp.read()
                status = resp.status
        except TimeoutError:
            raise self.errors.transient(url, f"no complete answer within {timeout_s:g}s (request_timeout_s)") \
                from None
        except aiohttp.ClientConnectorError as exc:
            raise self.errors.transient(url, f"unreachable ({exc.os_error or exc}); is the server running?") \
                from None
        except aiohttp.ClientError as exc:  # reset, dropped mid-response, malformed HTTP
            raise self.errors.transient(url, f"connection failed: {type(exc).__name__}: {exc}") from None
        return _decode(url, status, raw, self.errors)

    async def close(self) -> None:
        session, loop = self._session, self._loop
        self._session = None
        if session is None or session.closed:
            return
        if loop is None or loop is asyncio.get_running_loop() or loop.is_closed():
            await session.close()
        elif loop.is_running():  # used from a background loop (the trainer's): close it there
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(session.close(), loop))


def _dumps(value: Any) -> str:
    if orjson is not None:
        return orjson.dumps(value).decode()
    return json.dumps(value, separators=(",", ":"))


def _loads(raw: bytes) -> Any:
    return orjson.loads(raw) if orjson is not None else json.loads(raw)


def _decode(url: str, status: int, raw: bytes, errors: Errors) -> Any:
    if status >= 400:
        message = error_message(raw.decode("utf-8", errors="replace"))
        if status in RETRYABLE_STATUS:
            raise errors.transient(url, f"HTTP {status}: {message}", status=status)
        raise errors.refused(url, status, message)
    if not raw:
        return None
    try:
        return _loads(raw)
    except ValueError:  # json.JSONDecodeError and orjson.JSONDecodeError both are ValueErrors
        return raw.decode("utf-8", errors="replace")


def error_message(text: str) -> str:
    """The server's message from an error body: {"error": "..."}, {"error": {"message": ...}}, {"message": ...},
    text."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        return text.strip()[:_MAX_MESSAGE] or "(empty body)"
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:_MAX_MESSAGE]
        if isinstance(err, str):
            return err[:_MAX_MESSAGE]
        for key in ("message", "detail"):
            if body.get(key):
                return str(body[key])[:_MAX_MESSAGE]
    return text.strip()[:_MAX_MESSAGE]
