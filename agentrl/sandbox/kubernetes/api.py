"""The Kubernetes API edge of the `kubernetes` sandbox backend: REST calls and watches, nothing else.

Owns: talking to the API server through the official `kubernetes` client (its kubeconfig / in-cluster loading, auth
refresh, TLS and connection pool), as plain JSON dicts (no model classes: a pod is the dict the server sent); every
blocking call on this edge's own thread pool, never on the event loop; a client-side gate (QPS + burst, like
client-go, and the threads as its concurrency; fair, with an urgent lane for the calls a trajectory waits on:
`ratelimit.py`); retries with backoff for throttling and server errors; and `Informer`, one list+watch of a
collection kept as a local cache that waiters are woken from (readiness is watched, never polled). Does not own what
the objects mean (`pods.py`) or what to do with them (`pool.py`, `claims.py`).

Errors:

    ApiError(status, reason, message, retry_after)   any non-2xx answer; status 0 = no answer (connection failed)
        .retryable  429, 500, 502, 503, 504 and 0: `retrying()` backs off and tries again
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from agentrl.errors import ConfigError, MissingDependencyError
from agentrl.sandbox.kubernetes.ratelimit import RequestGate

log = logging.getLogger("agentrl.sandbox")
T = TypeVar("T")
RETRYABLE = frozenset({0, 429, 500, 502, 503, 504})
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
WATCH_TIMEOUT_S = 240  # server-side end of one watch request; the informer reconnects from its resourceVersion
LIST_PAGE = 500  # objects per page of a list (limit + continue), as kubectl and client-go's pager ask for
LIST_RESTARTS = 3  # a list whose continue token expired (410) starts again from its first page, at most this often


class ApiError(Exception):
    """A non-2xx answer from the API server (status 0: none at all)."""

    def __init__(self, status: int, reason: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}" if status else f"API server unreachable: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        return self.status in RETRYABLE


def _retry_after(headers: Any) -> float | None:
    try:
        value = headers.get("Retry-After") if headers is not None else None
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _error(status: int, data: bytes, headers: Any) -> ApiError:
    try:
        obj = json.loads(data)
        reason, message = str(obj.get("reason") or ""), str(obj.get("message") or "")
    except (ValueError, AttributeError):
        reason, message = "", data[:300].decode("utf-8", "replace")
    return ApiError(status, reason, message, _retry_after(headers))


def load_client_configuration(kubeconfig: str | None, context: str | None, host: str | None = None) -> Any:
    """The official client's Configuration: `host` (a plain http URL, e.g. the fake API), else in-cluster when
    running in a pod and no kubeconfig is named, else the kubeconfig file ($KUBECONFIG / ~/.kube/config). Blocking."""
    try:
        from kubernetes import client, config
    except ImportError as e:
        raise MissingDependencyError("the kubernetes sandbox backend needs the kubernetes client: "
                                     "pip install 'agentrl[k8s]'") from e
    cfg = client.Configuration()
    if host is not None:
        cfg.host = host
        return cfg
    import os

    try:
        if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
        else:
            config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    except (config.ConfigException, OSError) as e:
        raise ConfigError(f"sandbox.backend: cannot load Kubernetes credentials ({e}); set `kubeconfig` / `context` "
                          "(or KUBECONFIG), or run inside the cluster with a service account") from e
    return cfg


class KubeApi:
    """Raw REST access to one API server. `request()` is async (a thread does the I/O); `open_watch()` and
    `request_sync()` are blocking and only used from the informer's own thread."""

    def __init__(self, configuration: Any, *, threads: int = 16, qps: float = 50.0, burst: int = 100,
                 timeout_s: float = 30.0, page: int = LIST_PAGE) -> None:
        from kubernetes import client

        configuration.connection_pool_maxsize = threads + 4  # + watches
        self._client = client.ApiClient(configuration)
        self._threads = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="agentrl-k8s")
        self._gate = RequestGate(qps, burst, concurrency=threads)
        self.timeout_s = timeout_s
        self.page = page
        self.calls: Counter[str] = Counter()  # "VERB resource" -> count, for stats and benchmarks
        self.statuses: Counter[str] = Counter()  # non-2xx answers by HTTP status ("0": no answer): 429s, conflicts

    def _count(self, method: str, path: str, query: dict[str, Any] | None) -> None:
        parts = [p for p in path.split("?")[0].split("/") if p]
        rest = parts[parts.index("namespaces") + 2:] if "namespaces" in parts else parts[-1:]
        resource = "/".join(rest[:1] + rest[2:])
        verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(method)
        if verb is None:
            verb = "watch" if (query or {}).get("watch") else ("get" if len(rest) >= 2 else "list")
        self.calls[f"{verb} {resource}"] += 1

    def request_sync(self, method: str, path: str, *, query: dict[str, Any] | None = None, body: Any = None,
                     content_type: str = "application/json", stream: bool = False,
                     timeout: float | None = None) -> Any:
        """One blocking REST call. Returns the decoded JSON (or, with `stream`, the open urllib3 response)."""
        import urllib3

        self._count(method, path, query)
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            m, url, hdrs, payload, _ = self._client.param_serialize(
                method=method, resource_path=path, query_params=list((query or {}).items()), header_params=headers,
                body=body, auth_settings=["BearerToken"])
            resp = self._client.call_api(m, url, header_params=hdrs, body=payload,
                                         _request_timeout=timeout or self.timeout_s)
        except urllib3.exceptions.HTTPError as e:
            self.statuses["0"] += 1
            raise ApiError(0, "", f"{type(e).__name__}: {e}") from e
        if not 200 <= resp.status <= 299:
            self.statuses[str(resp.status)] += 1
            raise _error(resp.status, resp.read() or b"", resp.headers)
        if stream:
            return resp.response
        data = resp.read()
        return json.loads(data) if data else {}

    async def request(self, method: str, path: str, *, urgent: bool = False, **kwargs: Any) -> Any:
        """`request_sync` on the thread pool, after the rate limit (`urgent`: a call a trajectory waits on, which goes
        ahead of queued housekeeping; see ratelimit.py). A cancelled caller still waits for the call to finish
        (bounded by the request timeout) so a create cannot land after the cleanup that undoes it."""
        async with self._gate.slot(urgent):  # a token and a free thread: no call waits in the pool's own queue
            fut = asyncio.get_running_loop().run_in_executor(
                self._threads, functools.partial(self.request_sync, method, path, **kwargs))
            try:
                return await asyncio.shield(fut)
            except asyncio.CancelledError:
                await asyncio.wait([fut])
                if not fut.cancelled():
                    fut.exception()
                raise

    async def list(self, path: str, selector: str) -> dict[str, Any]:
        """Every object of `path` matching `selector`, read in pages of `self.page` (each page passes the rate limit).
        Unpaged, a list of 2,000 pods is one answer holding every full object, which the server builds in memory at
        once, and a list that times out is lost whole; paged, it is bounded pieces of one snapshot (the
        resourceVersion of the first page)."""
        pages = _Pages(selector, self.page)
        while (query := pages.next_query()) is not None:
            try:
                pages.add(await self.request("GET", path, query=query))
            except ApiError as e:
                pages.failed(e)
        return pages.listing()

    def list_sync(self, path: str, selector: str) -> dict[str, Any]:
        """`list` from the informer's own thread (blocking, no rate limit, as the watch)."""
        pages = _Pages(selector, self.page)
        while (query := pages.next_query()) is not None:
            try:
                pages.add(self.request_sync("GET", path, query=query))
            except ApiError as e:
                pages.failed(e)
        return pages.listing()

    def open_watch(self, path: str, query: dict[str, Any]) -> Any:
        """A watch request (blocking); iterate it with `watch_events`."""
        q = {**query, "watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": str(WATCH_TIMEOUT_S)}
        return self.request_sync("GET", path, query=q, stream=True, timeout=WATCH_TIMEOUT_S + 30)

    async def close(self) -> None:
        await asyncio.to_thread(self._threads.shutdown, wait=True)
        await asyncio.to_thread(self._client.close)


class _Pages:
    """One paged list in progress: the next page's query, the items so far, and a restart from the first page when
    the continue token expired (410 Gone: the server compacted the snapshot the pages were read from)."""

    def __init__(self, selector: str, page: int) -> None:
        self.selector, self.page = selector, max(1, int(page))
        self.items: list[dict[str, Any]] = []
        self.token: str | None = None
        self.rv = ""
        self.restarts = 0
        self.done = False

    def next_query(self) -> dict[str, Any] | None:
        if self.done:
            return None
        query = {"labelSelector": self.selector, "limit": str(self.page)}
        if self.token:
            query["continue"] = self.token
        return query

    def add(self, got: dict[str, Any]) -> None:
        meta = got.get("metadata") or {}
        if self.token is None:
            self.rv = meta.get("resourceVersion", "")
        self.items += got.get("items") or []
        self.token = meta.get("continue") or None
        self.done = self.token is None

    def failed(self, e: ApiError) -> None:
        if e.status != 410 or self.token is None or self.restarts >= LIST_RESTARTS:
            raise e
        self.restarts += 1
        self.items, self.token = [], None

    def listing(self) -> dict[str, Any]:
        return {"items": self.items, "metadata": {"resourceVersion": self.rv}}


def watch_events(resp: Any) -> Iterator[dict[str, Any]]:
    """The JSON events of a watch response, one per line, as they arrive."""
    buf = b""
    for chunk in resp.stream(65536, decode_content=True):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)


async def retrying(call: Callable[[], Awaitable[T]], *, attempts: int, base_s: float, cap_s: float,
                   what: str, on_retry: Callable[[ApiError], None] | None = None) -> T:
    """`call()` until it succeeds or fails with a non-retryable ApiError; retryable ones (429 honouring
    Retry-After, 5xx, no answer) back off exponentially with full jitter, at most `attempts` tries in all."""
    for attempt in range(1, attempts + 1):
        try:
            return await call()
        except ApiError as e:
            if not e.retryable or attempt == attempts:
                raise
            delay = random.uniform(0, min(cap_s, base_s * 2 ** (attempt - 1)))
            if e.retry_after is not None:
                delay = max(delay, min(e.retry_after, cap_s))
            if on_retry is not None:
                on_retry(e)
            log.info("%s: %s; retry %d/%d in %.2fs", what, e, attempt, attempts - 1, delay)
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")


async def gather_bounded(aws: list[Awaitable[T]], limit: int) -> list[T]:
    """Await all of `aws`, at most `limit` at a time (each call still passes the client's rate limit), and return
    their results in order; when some raised, the first of those is raised once all have finished. A sweep of
    thousands of orphans one call at a time waited one round trip per object; all at once they would all hold the
    API threads."""
    sem = asyncio.Semaphore(limit)

    async def one(aw: Awaitable[T]) -> T:
        async with sem:
            return await aw

    results = await asyncio.gather(*(one(aw) for aw in aws), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]  # no exception among them


def name_of(obj: dict[str, Any]) -> str:
    return obj["metadata"]["name"]


class Informer:
    """A list+watch of the objects under `path` matching `selector`, kept in `objects` (name -> object).
    The watch runs on its own thread and hands events to the loop; `wait()` wakes on changes of one object,
    `changed()` on any. A watch that expires (410) relists; a broken one reconnects with backoff."""

    def __init__(self, api: KubeApi, path: str, selector: str) -> None:
        self.api = api
        self.path = path
        self.selector = selector
        self.objects: dict[str, dict[str, Any]] = {}
        self.deleted: dict[str, dict[str, Any]] = {}  # name -> last state, for objects seen and then deleted
        self._rv = ""
        self._signals: dict[str, asyncio.Event] = {}
        self._any = asyncio.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listeners: list[Callable[[str, dict[str, Any] | None], None]] = []
        self.events = 0

    def listen(self, fn: Callable[[str, dict[str, Any] | None], None]) -> None:
        """Call `fn(name, object)` on the loop for every change as it is applied (object None: gone), so a user can
        keep what it derives from an object up to date once per event instead of rescanning every object."""
        self._listeners.append(fn)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._replace(await self.api.list(self.path, self.selector))
        self._thread = threading.Thread(target=self._run, name=f"agentrl-k8s-watch{self.path}", daemon=True)
        self._thread.start()

    def _replace(self, listing: dict[str, Any]) -> None:
        fresh = {name_of(o): o for o in listing.get("items") or []}
        for name in set(self.objects) - set(fresh):
            self.deleted[name] = self.objects[name]
            for fn in self._listeners:
                fn(name, None)
        self.objects = fresh
        for name, obj in fresh.items():
            for fn in self._listeners:
                fn(name, obj)
        self._rv = listing.get("metadata", {}).get("resourceVersion", "")
        for name in list(self._signals):
            self._signal(name)
        self._signal(None)

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        self.events += 1
        name = name_of(obj)
        if kind == "DELETED":
            self.objects.pop(name, None)
            self.deleted[name] = obj
            if len(self.deleted) > 10_000:
                self.deleted.pop(next(iter(self.deleted)))
        else:
            self.objects[name] = obj
        for fn in self._listeners:
            fn(name, None if kind == "DELETED" else obj)
        self._signal(name)
        self._signal(None)

    def _signal(self, name: str | None) -> None:
        if name is None:
            event, self._any = self._any, asyncio.Event()
            event.set()
        elif name in self._signals:
            self._signals.pop(name).set()

    def changed(self) -> asyncio.Event:
        """An event set at the next change of any object."""
        return self._any

    async def wait(self, name: str, check: Callable[[dict[str, Any] | None, bool], T | None]) -> T:
        """Until `check(obj, deleted)` returns something other than None (callers bound it with a timeout)."""
        while True:
            result = check(self.objects.get(name), name in self.deleted and name not in self.objects)
            if result is not None:
                return result
            event = self._signals.setdefault(name, asyncio.Event())
            await event.wait()

    # ------------------------------------------------------------ the watch thread

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop closed meanwhile
                pass

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                self._watch_once()
                backoff = 0.2
            except ApiError as e:
                if self._stop.is_set():
                    return
                if e.status == 410:
                    self._relist()
                    continue
                log.warning("watch %s: %s; reconnecting in %.1fs", self.path, e, backoff)
            except Exception as e:  # noqa: BLE001 - a broken stream: reconnect from the last resourceVersion
                if self._stop.is_set():
                    return
                log.warning("watch %s broke (%s: %s); reconnecting in %.1fs", self.path, type(e).__name__, e, backoff)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, 5.0)

    def _watch_once(self) -> None:
        query = {"labelSelector": self.selector, "resourceVersion": self._rv}
        self._resp = resp = self.api.open_watch(self.path, query)
        try:
            for ev in watch_events(resp):
                if self._stop.is_set():
                    return
                kind, obj = ev.get("type"), ev.get("object") or {}
                if kind == "ERROR":
                    raise ApiError(int(obj.get("code") or 500), str(obj.get("reason") or ""),
                                   str(obj.get("message") or ""))
                self._rv = obj.get("metadata", {}).get("resourceVersion", self._rv)
                if kind != "BOOKMARK":
                    self._post(self._apply, kind, obj)
        finally:
            self._resp = None
            resp.release_conn()

    def _relist(self) -> None:
        listing = self.api.list_sync(self.path, self.selector)
        self._rv = listing.get("metadata", {}).get("resourceVersion", "")
        self._post(self._replace, listing)

    async def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            try:
                resp.shutdown()  # unblocks the thread's read
            except Exception:  # noqa: BLE001 - best effort: the server-side timeout ends it anyway
                pass
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)
