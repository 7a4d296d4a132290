"""A fake of the Kubernetes API server's REST edge, for tests and benchmarks of the `kubernetes` sandbox backend.

An aiohttp server on 127.0.0.1 that the real `kubernetes` client talks to. It keeps namespaced objects of any
resource (pods, secrets, configmaps, custom resources) and implements what the backend relies on, with the real
server's semantics: create (409 AlreadyExists, generateName), get, list (paged with limit + continue; a continue token from before a compaction is 410 Expired; pages
are read from the current state, where the real server reads them from the first page's snapshot) and watch with
label and field selectors (watch from a resourceVersion, 410 Expired when it is too old, selector transitions reported as ADDED/DELETED),
JSON merge / strategic merge (as merge) / JSON patches and PUT with optimistic concurrency (a stale
`metadata.resourceVersion` is a 409 Conflict), delete with preconditions (uid, resourceVersion) and graceful pod
deletion, pod update validation (only `activeDeadlineSeconds`, decreasing, and images may change), immutable
ConfigMaps/Secrets, and owner-reference garbage collection (also of dependents whose owner does not exist).

Test hooks (no API call is counted for them): `calls` (Counter of "verb resource", e.g. "patch pods",
"create pods/exec"), `inject()` scripted failures (e.g. 429 with Retry-After), `latency_s` per request,
`objects()`/`get()` and `mutate()` for direct reads and status writes, and `listeners` for the fake kubelet and
controllers (`fake_kubelet.py`). Not faked: authentication, admission, quota, server-side apply, table output.

    async with FakeKubernetes() as fake:
        cfg = kubernetes.client.Configuration(); cfg.host = fake.url
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import math
import re
import secrets
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from aiohttp import web

Obj = dict[str, Any]
Listener = Callable[[str, str, Obj], None]  # (resource, event type, object)
MUTABLE_POD_SPEC = ("activeDeadlineSeconds",)


def now_rfc3339(offset_s: float = 0.0) -> str:
    return datetime.fromtimestamp(time.time() + offset_s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    return web.json_response(body, status=code)


class Reject(Exception):
    def __init__(self, code: int, reason: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.headers = code, reason, message, headers or {}


# ------------------------------------------------------------------ selectors and patches

_REQ = re.compile(r"^\s*(!?)([\w./-]+)\s*(?:(==|=|!=)\s*([\w.-]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*$")


def parse_selector(text: str | None) -> list[tuple[str, str, set[str]]]:
    """Label selector -> [(op, key, values)]; ops: =, !=, in, notin, exists, !exists."""
    reqs: list[tuple[str, str, set[str]]] = []
    for part in re.split(r",(?![^(]*\))", text or ""):
        if not part.strip():
            continue
        m = _REQ.match(part)
        if not m:
            raise Reject(400, "BadRequest", f"unable to parse requirement: {part!r}")
        neg, key, op, value, setop, values = m.groups()
        if op:
            reqs.append(("!=" if op == "!=" else "=", key, {value}))
        elif setop:
            reqs.append((setop, key, {v.strip() for v in values.split(",") if v.strip()}))
        else:
            reqs.append(("!exists" if neg else "exists", key, set()))
    return reqs


def labels_match(reqs: list[tuple[str, str, set[str]]], labels: dict[str, str]) -> bool:
    for op, key, values in reqs:
        have = labels.get(key)
        ok = {"=": have in values, "!=": have not in values, "in": have in values, "notin": have not in values,
              "exists": have is not None, "!exists": have is None}[op]
        if not ok:
            return False
    return True


def field_match(text: str | None, obj: Obj) -> bool:
    for part in (text or "").split(","):
        if not part.strip():
            continue
        neg = "!=" in part
        path, _, value = part.partition("!=" if neg else "=")
        have: Any = obj
        for key in path.strip().lstrip("=").split("."):
            have = have.get(key) if isinstance(have, dict) else None
        if (str(have) == value.strip().lstrip("=")) == neg:
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def json_patch(target: Obj, ops: list[Obj]) -> Obj:
    """RFC 6902 subset: add, replace, remove, test."""
    doc = copy.deepcopy(target)
    for op in ops:
        keys = [k.replace("~1", "/").replace("~0", "~") for k in op["path"].split("/")[1:]]
        parent: Any = doc
        for k in keys[:-1]:
            parent = parent[int(k)] if isinstance(parent, list) else parent.setdefault(k, {})
        last = keys[-1]
        if op["op"] == "test":
            have = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if have != op.get("value"):
                raise Reject(422, "Invalid", f"test operation failed at {op['path']}")
        elif op["op"] in ("add", "replace"):
            parent[last] = op["value"]
        elif op["op"] == "remove":
            parent.pop(last, None)
        else:
            raise Reject(415, "UnsupportedMediaType", f"json patch op {op['op']!r} is not supported by the fake")
    return doc


# ------------------------------------------------------------------ the server


@dataclass
class Fault:
    verb: str
    resource: str
    code: int
    times: int
    retry_after: float | None = None
    after: bool = False  # apply the request, then answer with the error (a response lost on the way back)


@dataclass
class Route:
    resource: str  # "pods", "sandboxclaims.extensions.agents.x-k8s.io"
    api_version: str
    namespace: str
    name: str | None
    sub: str | None


def parse_path(path: str) -> Route:
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise Reject(404, "NotFound", f"the fake serves /api/v1 and /apis/GROUP/VERSION, not {path}")
    if len(rest) < 3 or rest[0] != "namespaces":
        raise Reject(404, "NotFound", f"the fake serves namespaced resources only, not {path}")
    plural = rest[2]
    return Route(resource=f"{plural}.{group}" if group else plural,
                 api_version=f"{group}/{version}" if group else version, namespace=rest[1],
                 name=rest[3] if len(rest) > 3 else None, sub="/".join(rest[4:]) or None)


class FakeKubernetes:
    """See the module docstring. `history` events are kept for watches resuming from a resourceVersion."""

    def __init__(self, *, latency_s: float = 0.0, history: int = 5000, gc: bool = True) -> None:
        self.latency_s = latency_s
        self.gc = gc
        self.calls: Counter[str] = Counter()
        self.faults: list[Fault] = []
        self.listeners: list[Listener] = []
        self.graceful_pods = False  # set by a kubelet that finishes pod deletions (fake_kubelet.FakeKubelet)
        self._store: dict[tuple[str, str, str], Obj] = {}
        self._rv = 0
        self._history: deque[tuple[int, str, str, Obj | None, Obj | None]] = deque(maxlen=history)
        self._compacted = 0  # watches from before this resourceVersion get 410 Expired
        self._watchers: set[asyncio.Queue[Any]] = set()
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -------------------------------------------------------------- lifecycle

    async def start(self) -> "FakeKubernetes":
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self) -> None:
        for q in list(self._watchers):
            q.put_nowait(None)
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> "FakeKubernetes":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -------------------------------------------------------------- test hooks

    def inject(self, verb: str, resource: str, code: int, *, times: int = 1, retry_after: float | None = None,
               after: bool = False) -> None:
        """The next `times` requests `verb resource` (e.g. "create", "pods") fail with HTTP `code`; with `after`,
        each is carried out first (its answer is what gets lost)."""
        self.faults.append(Fault(verb, resource, code, times, retry_after, after))

    def compact(self) -> None:
        """Forget the event history (like etcd compaction): a watch resuming from an older version gets 410."""
        self._history.clear()
        self._compacted = self._rv

    def _oldest(self) -> int:
        """Watches may resume from this resourceVersion or later."""
        if self._history and len(self._history) == self._history.maxlen:
            return self._history[0][0] - 1
        return self._compacted

    def drop_watches(self) -> None:
        """End every open watch stream (as an API server restart or a load balancer would)."""
        for q in list(self._watchers):
            q.put_nowait(None)

    def objects(self, resource: str, namespace: str | None = None, selector: str | None = None) -> list[Obj]:
        reqs = parse_selector(selector)
        return [copy.deepcopy(o) for (r, ns, _), o in self._store.items()
                if r == resource and namespace in (None, ns) and labels_match(reqs, _labels(o))]

    def get(self, resource: str, namespace: str, name: str) -> Obj | None:
        obj = self._store.get((resource, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def mutate(self, resource: str, namespace: str, name: str, fn: Callable[[Obj], None]) -> Obj | None:
        """Change a stored object in place (a kubelet/controller status write): bumps its resourceVersion and
        notifies watchers. None when it does not exist."""
        old = self._store.get((resource, namespace, name))
        if old is None:
            return None
        new = copy.deepcopy(old)
        fn(new)
        self._write(resource, namespace, name, old, new)
        return new

    def create_object(self, resource: str, namespace: str, obj: Obj) -> Obj:
        """Create as a controller would (uncounted)."""
        return self._create(resource, namespace, obj)

    def remove(self, resource: str, namespace: str, name: str) -> None:
        """Remove an object now (the end of a graceful pod deletion), then collect its dependents."""
        old = self._store.get((resource, namespace, name))
        if old is not None:
            self._write(resource, namespace, name, old, None)
            self._collect(namespace, old["metadata"]["uid"])

    # -------------------------------------------------------------- store

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _write(self, resource: str, ns: str, name: str, old: Obj | None, new: Obj | None) -> None:
        rv = self._next_rv()
        if new is not None:
            new["metadata"]["resourceVersion"] = rv
            self._store[(resource, ns, name)] = new
        else:
            self._store.pop((resource, ns, name), None)
            old = copy.deepcopy(old)
            old["metadata"]["resourceVersion"] = rv  # type: ignore[index]
        self._history.append((int(rv), resource, ns, old, new))
        for q in list(self._watchers):
            q.put_nowait((int(rv), resource, ns, old, new))
        kind = "DELETED" if new is None else ("ADDED" if old is None else "MODIFIED")
        for listener in list(self.listeners):
            listener(resource, kind, copy.deepcopy(new if new is not None else old))

    def _create(self, resource: str, ns: str, body: Obj) -> Obj:
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        name = meta.get("name")
        if not name or not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", name):
            raise Reject(422, "Invalid", f"metadata.name {name!r}: must be a lowercase RFC 1123 subdomain")
        if (resource, ns, name) in self._store:
            raise Reject(409, "AlreadyExists", f'{resource} "{name}" already exists')
        meta.update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
        meta.pop("resourceVersion", None)
        if resource == "pods":
            body["status"] = {"phase": "Pending", "qosClass": "Guaranteed"}
        self._write(resource, ns, name, None, body)
        self._collect_dangling(ns, body)
        return body

    def _collect_dangling(self, ns: str, obj: Obj) -> None:
        """Like the real garbage collector: a dependent whose owner (same namespace, by uid) does not exist
        is deleted (this is what happens to cross-namespace owner references)."""
        refs = obj["metadata"].get("ownerReferences") or []
        live = {o["metadata"]["uid"] for (_, n, _), o in self._store.items() if n == ns}
        if self.gc and refs and not any(r.get("uid") in live for r in refs):
            asyncio.get_running_loop().call_soon(self._gc_delete, _resource_of(obj), ns, obj["metadata"]["name"])

    def _collect(self, ns: str, owner_uid: str) -> None:
        if not self.gc:
            return
        for (resource, n, name), o in list(self._store.items()):
            refs = o["metadata"].get("ownerReferences") or []
            if n == ns and any(r.get("uid") == owner_uid for r in refs):
                self._gc_delete(resource, ns, name)

    def _gc_delete(self, resource: str, ns: str, name: str) -> None:
        obj = self._store.get((resource, ns, name))
        if obj is not None:
            self._begin_delete(resource, ns, obj, grace=None)

    def _begin_delete(self, resource: str, ns: str, obj: Obj, grace: int | None) -> Obj:
        """Pods on a node terminate gracefully (deletionTimestamp, then the kubelet removes them); the rest go now."""
        name = obj["metadata"]["name"]
        running = resource == "pods" and obj.get("status", {}).get("podIP")
        if running and grace != 0 and self.graceful_pods:
            if obj["metadata"].get("deletionTimestamp"):
                return obj
            period = int(obj.get("spec", {}).get("terminationGracePeriodSeconds", 30) if grace is None else grace)

            def mark(o: Obj) -> None:
                o["metadata"]["deletionTimestamp"] = now_rfc3339(period)
                o["metadata"]["deletionGracePeriodSeconds"] = period

            return self.mutate(resource, ns, name, mark) or obj
        self.remove(resource, ns, name)
        return obj

    # -------------------------------------------------------------- HTTP

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            route = parse_path(request.path)
            verb = self._verb(request, route)
            self.calls[f"{verb} {route.resource}{'/' + route.sub if route.sub else ''}"] += 1
            if verb != "watch" and self.latency_s:
                await asyncio.sleep(self.latency_s)
            fault = self._fault(verb, route.resource)
            if fault is not None and not fault.after:
                raise self._reject(fault, verb, route.resource)
            if route.sub and route.sub != "status":
                raise Reject(403, "Forbidden", f"{route.sub} is not available in the fake (agentrl never needs it)")
            if verb == "watch":
                return await self._watch(request, route)
            body = await request.read()
            result = self._dispatch(verb, route, request, body)
            if fault is not None:
                raise self._reject(fault, verb, route.resource)
            return web.json_response(result)
        except Reject as e:
            resp = status(e.code, e.reason, e.message)
            resp.headers.update(e.headers)
            return resp

    @staticmethod
    def _verb(request: web.Request, route: Route) -> str:
        m = request.method
        if m == "GET":
            if request.query.get("watch") in ("true", "1"):
                return "watch"
            return "get" if route.name else "list"
        return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(m, m.lower())

    def _fault(self, verb: str, resource: str) -> Fault | None:
        for f in self.faults:
            if f.times > 0 and f.verb == verb and f.resource == resource:
                f.times -= 1
                return f
        return None

    @staticmethod
    def _reject(f: Fault, verb: str, resource: str) -> Reject:
        # whole seconds, as the real server sends (urllib3 rejects fractional Retry-After values)
        headers = {"Retry-After": str(math.ceil(f.retry_after))} if f.retry_after is not None else {}
        reason = {429: "TooManyRequests", 409: "Conflict", 503: "ServiceUnavailable"}.get(f.code, "InternalError")
        return Reject(f.code, reason, f"injected fault {f.code} for {verb} {resource}", headers)

    def _dispatch(self, verb: str, route: Route, request: web.Request, raw: bytes) -> Obj:
        body = json.loads(raw) if raw else None
        key = (route.resource, route.namespace, route.name or "")
        if verb == "create":
            body.setdefault("apiVersion", route.api_version)
            return self._create(route.resource, route.namespace, body)
        if verb == "list":
            reqs = parse_selector(request.query.get("labelSelector"))
            rv, after = self._continue_from(request.query.get("continue"))
            items = [o for (r, ns, name), o in sorted(self._store.items()) if r == route.resource
                     and ns == route.namespace and name > after and labels_match(reqs, _labels(o))
                     and field_match(request.query.get("fieldSelector"), o)]
            meta: Obj = {"resourceVersion": str(rv)}
            limit = int(request.query.get("limit") or 0)
            if 0 < limit < len(items):
                items = items[:limit]
                last = items[-1]["metadata"]["name"]
                meta["continue"] = base64.urlsafe_b64encode(json.dumps([rv, last]).encode()).decode()
            return {"kind": "List", "apiVersion": route.api_version, "items": items, "metadata": meta}
        current = self._store.get(key)
        if current is None:
            raise Reject(404, "NotFound", f'{route.resource} "{route.name}" not found')
        if verb == "get":
            return current
        if verb == "delete":
            return self._delete(route, current, body or {})
        new = self._patched(current, body, request.content_type) if verb == "patch" else body
        return self._update(route, current, new)

    def _continue_from(self, token: str | None) -> tuple[int, str]:
        """(resourceVersion of the list's first page, last name served) of a continue token; ("", now) for none."""
        if not token:
            return self._rv, ""
        try:
            rv, after = json.loads(base64.urlsafe_b64decode(token.encode()))
        except ValueError as e:
            raise Reject(400, "BadRequest", f"invalid continue token: {e}") from e
        if int(rv) < self._oldest():
            raise Reject(410, "Expired", "The provided continue parameter is too old to display a consistent list "
                                         "result. You can start a new list without the continue parameter.")
        return int(rv), str(after)

    def _patched(self, current: Obj, body: Any, content_type: str) -> Obj:
        if content_type == "application/json-patch+json":
            return json_patch(current, body)
        if content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            return merge_patch(current, body)
        raise Reject(415, "UnsupportedMediaType", f"patch content type {content_type!r} is not supported")

    def _update(self, route: Route, current: Obj, new: Obj) -> Obj:
        meta, cur_meta = new.setdefault("metadata", {}), current["metadata"]
        if meta.get("resourceVersion") not in (None, cur_meta["resourceVersion"]):
            raise Reject(409, "Conflict", f'Operation cannot be fulfilled on {route.resource} "{route.name}": the '
                                          "object has been modified; please apply your changes to the latest "
                                          "version and try again")
        for field in ("uid", "name", "namespace", "creationTimestamp"):
            meta[field] = cur_meta[field]
        if route.resource == "pods":
            _check_pod_update(current, new)
        if current.get("immutable") and (new.get("data") != current.get("data") or not new.get("immutable")
                                         or new.get("binaryData") != current.get("binaryData")):
            raise Reject(422, "Invalid", f'{route.resource} "{route.name}" is immutable: data cannot change')
        if route.sub != "status" and "status" in current:
            new["status"] = current["status"]
        self._write(route.resource, route.namespace, route.name or "", current, new)
        return new

    def _delete(self, route: Route, current: Obj, options: Obj) -> Obj:
        pre = options.get("preconditions") or {}
        meta = current["metadata"]
        if pre.get("uid") not in (None, meta["uid"]) or pre.get("resourceVersion") not in (None,
                                                                                          meta["resourceVersion"]):
            raise Reject(409, "Conflict", f'Operation cannot be fulfilled on {route.resource} "{route.name}": '
                                          "Precondition failed")
        grace = options.get("gracePeriodSeconds")
        return self._begin_delete(route.resource, route.namespace, current, grace)

    async def _watch(self, request: web.Request, route: Route) -> web.StreamResponse:
        reqs = parse_selector(request.query.get("labelSelector"))
        since = int(request.query.get("resourceVersion") or 0)
        timeout = float(request.query.get("timeoutSeconds") or 1800)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._watchers.add(queue)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        try:
            if since and since < self._oldest():
                err = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410, "reason": "Expired",
                       "message": f"too old resource version: {since} ({self._oldest()})"}
                await resp.write(json.dumps({"type": "ERROR", "object": err}).encode() + b"\n")
                return resp
            backlog = [h for h in self._history if h[0] > since] if since else \
                [(int(o["metadata"]["resourceVersion"]), r, ns, None, o) for (r, ns, _), o in self._store.items()]
            for item in backlog:
                queue.put_nowait(item)
            async with asyncio.timeout(timeout):
                while (item := await queue.get()) is not None:
                    line = self._watch_line(item, route, reqs)
                    if line is not None:
                        await resp.write(line)
        except (TimeoutError, ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self._watchers.discard(queue)
        return resp

    @staticmethod
    def _watch_line(item: tuple[int, str, str, Obj | None, Obj | None], route: Route,
                    reqs: list[tuple[str, str, set[str]]]) -> bytes | None:
        _, resource, ns, old, new = item
        if resource != route.resource or ns != route.namespace:
            return None
        was = old is not None and labels_match(reqs, _labels(old))
        now = new is not None and labels_match(reqs, _labels(new))
        if new is None:
            kind, obj = ("DELETED", old) if was else (None, None)
        elif now:
            kind, obj = ("MODIFIED" if was else "ADDED"), new
        else:
            kind, obj = ("DELETED", new) if was else (None, None)
        if kind is None:
            return None
        return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


def _labels(obj: Obj) -> dict[str, str]:
    return obj.get("metadata", {}).get("labels") or {}


def _resource_of(obj: Obj) -> str:
    group = obj.get("apiVersion", "v1").rpartition("/")[0]
    kind = obj.get("kind", "").lower()
    plural = kind + ("es" if kind.endswith(("s", "x", "ch", "sh")) else "s")
    return f"{plural}.{group}" if group else plural


def _check_pod_update(current: Obj, new: Obj) -> None:
    """The API server's pod update rule, as far as the backend can run into it."""
    old_spec, new_spec = current.get("spec") or {}, new.get("spec") or {}
    strip = lambda s: {k: v for k, v in s.items() if k not in MUTABLE_POD_SPEC and k != "nodeName"}  # noqa: E731
    if _without_images(strip(old_spec)) != _without_images(strip(new_spec)):
        raise Reject(422, "Invalid", "Pod is invalid: spec: Forbidden: pod updates may not change fields other than "
                                     "`spec.containers[*].image`, `spec.activeDeadlineSeconds`, ...")
    old_d, new_d = old_spec.get("activeDeadlineSeconds"), new_spec.get("activeDeadlineSeconds")
    if old_d is not None and (new_d is None or new_d > old_d):
        raise Reject(422, "Invalid", "Pod is invalid: spec.activeDeadlineSeconds: Invalid value: must be less than "
                                     "or equal to the previous value")


def _without_images(spec: Obj) -> Obj:
    spec = copy.deepcopy(spec)
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        c.pop("image", None)
    return spec
