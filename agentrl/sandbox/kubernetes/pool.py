"""The `pods` control plane of the kubernetes backend: a warm pool of sandbox pods shared by many workers.

Owns: claiming a ready warm pod by a conditional update, creating pods (cold, or to refill the pool) with retries,
waiting for them through the watch, recycling warm pods that idled too long, deleting, and sweeping orphans.
Does not own: the pod manifest and state rules (`pods.py`), API I/O (`api.py`), agent tokens and health
(`backend.py`).

The pool is the set of pods labelled `agentrl.io/pool=<pool>, agentrl.io/state=warm` in the namespace, whoever
created them; every worker watches it (one list+watch) and:

    claim    pick a random Ready warm pod of the same spec (`agentrl.io/spec` hash) and JSON-merge-patch it with
             its current metadata.resourceVersion: state=claimed, owner labels and annotations, an ownerReference
             to the worker's own pod, and activeDeadlineSeconds lowered so the TTL counts from the claim. The API
             server applies only one patch per resourceVersion: a loser gets 409 Conflict and tries another pod
             (at most claim_attempts), then starts a pod itself (cold). Two workers never get the same pod.
    refill   keep `warm` unclaimed pods *created by this worker* in the pool (so N workers keep N x warm without
             coordinating), at most `max_pending` of them not ready yet, every create through the client QPS limit.
    recycle  delete warm pods (anyone's) older than warm_max_idle_s or dead, with a resourceVersion precondition
             so a pod claimed meanwhile is never deleted.

Warm pods carry activeDeadlineSeconds = ttl_s + warm_max_idle_s, so a pool whose workers all died still dies.

Scale: claims, refill and recycle read `PodFacts` (labels, readiness, death, start time of each pod), derived once per
watch event, never the pods themselves: with 2,000 pods a scan of the raw objects (timestamps parsed, statuses
walked) cost ~0.2 s of event-loop time, once per claim and once per watch event (benchmarks/bench_k8s_scale.py).
Refill passes are at least REFILL_GAP_S apart, however many events arrive.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.errors import SandboxStartError
from agentrl.sandbox.base import SandboxSpec
from agentrl.sandbox.kubernetes.api import JSON_PATCH, ApiError, Informer, KubeApi, gather_bounded, retrying
from agentrl.sandbox.kubernetes.nodes import NodeStrikes, avoid_nodes
from agentrl.sandbox.kubernetes.pods import (
    A_LABELS,
    A_NONCE,
    A_POD,
    CLAIMED,
    L_CREATOR,
    L_OWNER_UID,
    L_POOL,
    L_ROLE,
    L_RUN,
    L_SPEC,
    L_STATE,
    MANAGED,
    MANAGED_BY,
    ROLE,
    WARM,
    Obj,
    Owner,
    PodOptions,
    age_s,
    base_labels,
    death_reason,
    is_ready,
    is_running,
    pod_manifest,
    pod_spec,
    run_id_of,
    should_remove,
    spec_hash,
    started_at,
)

log = logging.getLogger("agentrl.sandbox")
RECYCLE_EVERY_S = 5.0
REFILL_GAP_S = 0.05  # refill passes at most this often (a burst of watch events is one pass)
SWEEP_CONCURRENCY = 16  # deletes of one sweep in flight at once


@dataclass(slots=True)
class PodFacts:
    """What claims, refill and recycle need of one pod (see the module docstring)."""

    state: str | None
    spec: str | None
    creator: str | None
    ready: bool
    dead: bool  # death_reason(pod, False): failed, being deleted, or a container that cannot start
    start: float  # started_at, or +inf when unknown (age -inf: never too old, as age_s's 0)
    rv: str
    deleting: bool
    node: str | None  # spec.nodeName (None until scheduled)

    @classmethod
    def of(cls, pod: Obj) -> PodFacts:
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        start = started_at(pod)
        return cls(state=labels.get(L_STATE), spec=labels.get(L_SPEC), creator=labels.get(L_CREATOR),
                   ready=is_ready(pod), dead=death_reason(pod, False) is not None,
                   start=math.inf if start is None else start, rv=meta.get("resourceVersion", ""),
                   deleting=bool(meta.get("deletionTimestamp")), node=pod.get("spec", {}).get("nodeName"))


@dataclass
class Acquired:
    """A pod that is this worker's now and runs (its agent may still be binding its port)."""

    name: str
    pod_name: str
    ip: str
    labels: dict[str, str]
    warm: bool
    acquired_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class PodPool:
    """See the module docstring. `counters` feed `KubernetesBackend.stats()`."""

    def __init__(self, api: KubeApi, cfg: Any, opts: PodOptions, owner: Owner) -> None:
        self.api = api
        self.cfg = cfg
        self.opts = opts
        self.owner = owner
        self.path = f"/api/v1/namespaces/{cfg.namespace}/pods"
        self.informer = Informer(api, self.path, f"{MANAGED_BY}={MANAGED},{L_POOL}={cfg.pool}")
        self.facts: dict[str, PodFacts] = {}  # name -> facts of every pod in the informer's cache
        self.informer.listen(self._observe)
        self.counters: Counter[str] = Counter()
        self._live: set[str] = set()  # claimed or created by this worker and not released
        self._claiming: set[str] = set()  # pods one of our own concurrent claims is patching right now
        self._lost: dict[str, str] = {}  # pod -> resourceVersion at which a claim of ours lost the race
        self._inflight: set[str] = set()  # warm pods created by us and not in the watch cache yet
        self._creating = 0
        self._failed_in_row = 0
        self._refill: asyncio.Task[None] | None = None
        self._ever_ready: set[str] = set()  # pods seen Ready at least once (a death before that strikes its node)
        self.nodes = NodeStrikes()
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        await self.informer.start()

    def _observe(self, name: str, pod: Obj | None) -> None:
        if pod is None:
            self.facts.pop(name, None)
            self._ever_ready.discard(name)
            self.nodes.placed(name)
        else:
            self.facts[name] = f = PodFacts.of(pod)
            if f.node:
                self.nodes.placed(name)
            if f.ready and name not in self._ever_ready:
                self._ever_ready.add(name)
                self.nodes.ready_on(f.node, time.time())

    async def _call(self, method: str, path: str, what: str, **kwargs: Any) -> Any:
        return await self._retried(lambda: self.api.request(method, path, **kwargs), what)

    async def _list(self, selector: str, what: str) -> list[Obj]:
        """Every pod of this namespace matching `selector`, in pages (KubeApi.list), the whole list retried."""
        listing = await self._retried(lambda: self.api.list(self.path, selector), what)
        return list(listing.get("items") or [])

    async def _retried(self, call: Callable[[], Awaitable[Any]], what: str) -> Any:
        c = self.cfg

        def retried(e: ApiError) -> None:
            self.counters["api_retries"] += 1

        return await retrying(call, attempts=c.api_attempts, base_s=c.backoff_base_s, cap_s=c.backoff_max_s,
                              what=what, on_retry=retried)

    # ------------------------------------------------------------------ acquire

    async def acquire(self, spec: SandboxSpec, labels: dict[str, str]) -> Acquired:
        if self.cfg.warm and self._refill is None:
            await self.warm_up(spec)
        t0 = time.monotonic()
        body = pod_spec(spec, self.opts, deadline_s=spec.ttl_s)
        shash = spec_hash(body)
        pod = await self._claim(shash, spec, labels)
        warm = pod is not None
        if pod is None:
            self.counters["cold_starts"] += 1
            manifest = self._manifest(spec, body, shash, labels, claimed=True)
            name = manifest["metadata"]["name"]  # chosen here: a cancel while the POST is in flight still knows it
            try:
                pod = await self._create(manifest, urgent=True)
                self._live.add(name)
                pod = await self._wait_running(name, t0 + self.cfg.start_timeout_s)
            except BaseException:
                await asyncio.shield(self._release_quietly(name))  # a 404 (never created) is fine
                raise
        else:
            self.counters["warm_hits"] += 1
        name = pod["metadata"]["name"]
        return Acquired(name=name, pod_name=name, ip=pod["status"]["podIP"], labels=dict(pod["metadata"]["labels"]),
                        warm=warm, acquired_s=time.monotonic() - t0)

    def _manifest(self, spec: SandboxSpec, body: Obj, shash: str, labels: dict[str, str], *, claimed: bool) -> Obj:
        name = f"{self.cfg.pool}-{secrets.token_hex(5)}"
        own = {**base_labels(self.cfg.pool, shash, spec), L_CREATOR: self.owner.session}
        ann = {A_NONCE: secrets.token_hex(8)}
        refs: list[Obj] = []
        if claimed:
            own.update({L_STATE: CLAIMED, L_RUN: run_id_of(labels), **self.owner.labels()})
            ann.update({**self.owner.annotations(), A_LABELS: json.dumps(labels, sort_keys=True)})
            refs = self.owner.owner_references(self.cfg.namespace)
        else:
            own[L_STATE] = WARM
        manifest = pod_manifest(name, body, labels=own, annotations=ann, owner_refs=refs,
                                namespace=self.cfg.namespace, template=self.opts.template)
        return avoid_nodes(manifest, self.nodes.avoid_for(name, time.time()))

    def _claimable(self, shash: str, now: float) -> list[str]:
        idle = self.cfg.warm_max_idle_s - 5
        return [name for name, f in self.facts.items()
                if f.state == WARM and f.spec == shash and f.ready and now - f.start < idle
                and name not in self._claiming and self._lost.get(name) != f.rv]

    async def _claim(self, shash: str, spec: SandboxSpec, labels: dict[str, str]) -> Obj | None:
        """A warm pod made ours by a conditional update, or None (none ready, or lost claim_attempts races)."""
        for _ in range(self.cfg.claim_attempts):
            ready = self._claimable(shash, time.time())
            if not ready and not await self._grace(shash):
                return None
            ready = ready or self._claimable(shash, time.time())
            if not ready:
                return None
            name = random.choice(ready)
            pod = self.informer.objects[name]
            self._claiming.add(name)
            self.counters["claims"] += 1
            try:
                claimed = await self._call("PATCH", f"{self.path}/{name}", f"claim pod {name}", urgent=True,
                                           body=self._claim_patch(pod, spec, labels), content_type=JSON_PATCH)
            except ApiError as e:
                if e.status not in (404, 409, 422):  # 422: the test op failed, someone else claimed it first
                    raise
                self.counters["claim_conflicts"] += 1
                self._lost[name] = pod["metadata"]["resourceVersion"]
                continue
            finally:
                self._claiming.discard(name)
            if claimed["metadata"].get("deletionTimestamp"):  # ours now, but already being deleted: take another
                self.counters["claim_conflicts"] += 1
                continue
            self._live.add(name)
            return claimed
        return None

    async def _grace(self, shash: str) -> bool:
        """claim_grace_s: when warm pods are still starting, wait that long for one to become ready."""
        starting = any(f.spec == shash and not f.ready and f.state == WARM for f in self.facts.values())
        if self.cfg.claim_grace_s <= 0 or not starting:
            return False
        try:
            async with asyncio.timeout(self.cfg.claim_grace_s):
                await self.informer.changed().wait()
        except TimeoutError:
            return False
        return True

    def _claim_patch(self, pod: Obj, spec: SandboxSpec, labels: dict[str, str]) -> list[Obj]:
        """The claim as a JSON patch (RFC 6902) whose first op tests that the pod is still warm: the API server
        applies it to the pod as stored, so of two claims racing for one pod exactly one passes the test (the other
        gets 422). It is conditional on the state label only, not on the whole resourceVersion as a merge patch
        would be: the kubelet's status writes bump that, and at 2,000 pods claims that queued for seconds lost 397
        of 2,000 races to them, each then a cold start (bench_k8s_scale.py)."""
        ops: list[Obj] = [{"op": "test", "path": f"/metadata/labels/{_pointer(L_STATE)}", "value": WARM}]
        for key, value in {L_STATE: CLAIMED, L_RUN: run_id_of(labels), **self.owner.labels()}.items():
            ops.append({"op": "add", "path": f"/metadata/labels/{_pointer(key)}", "value": value})
        notes = {**self.owner.annotations(), A_LABELS: json.dumps(labels, sort_keys=True)}
        if pod["metadata"].get("annotations"):
            ops += [{"op": "add", "path": f"/metadata/annotations/{_pointer(k)}", "value": v} for k, v in notes.items()]
        else:
            ops.append({"op": "add", "path": "/metadata/annotations", "value": notes})
        refs = self.owner.owner_references(self.cfg.namespace)
        if refs:
            ops.append({"op": "add", "path": "/metadata/ownerReferences", "value": refs})
        current = pod["spec"].get("activeDeadlineSeconds")
        wanted = math.ceil(age_s(pod, time.time()) + spec.ttl_s + 5)
        if current is None or wanted < current:  # the TTL counts from the claim (may only decrease)
            ops.append({"op": "add", "path": "/spec/activeDeadlineSeconds", "value": wanted})
        return ops

    async def _create(self, manifest: Obj, *, urgent: bool = False) -> Obj:
        """POST with retries on 429/5xx. A retry after an answer that got lost finds its own pod (409 with our
        nonce) instead of creating a second one; a name taken by someone else gets a fresh name. `urgent`: a cold
        start a trajectory waits on (the rate limit's urgent lane), not a refill."""
        for _ in range(3):
            try:
                return await self._call("POST", self.path, "create pod", body=manifest, urgent=urgent)
            except ApiError as e:
                if e.status != 409:
                    raise
            name = manifest["metadata"]["name"]
            existing = await self._call("GET", f"{self.path}/{name}", f"get pod {name}", urgent=urgent)
            if existing["metadata"].get("annotations", {}).get(A_NONCE) == manifest["metadata"]["annotations"][A_NONCE]:
                return existing
            manifest["metadata"]["name"] = f"{self.cfg.pool}-{secrets.token_hex(5)}"
        raise SandboxStartError("could not find a free pod name in 3 tries")

    async def _wait_running(self, name: str, deadline: float) -> Obj:
        def check(pod: Obj | None, deleted: bool) -> Obj | None:
            reason = death_reason(pod, deleted)
            if reason is not None:
                raise SandboxStartError(f"sandbox pod {name} failed to start: {reason}")
            return pod if pod is not None and is_running(pod) else None

        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                return await self.informer.wait(name, check)
        except TimeoutError:
            pod = self.informer.objects.get(name) or {}
            conds = [f"{c.get('type')}={c.get('status')} {c.get('reason', '')} {c.get('message', '')}".strip()
                     for c in pod.get("status", {}).get("conditions") or []]
            raise SandboxStartError(f"sandbox pod {name} not running after start_timeout_s="
                                    f"{self.cfg.start_timeout_s:.0f}s (phase {pod.get('status', {}).get('phase')}; "
                                    f"{'; '.join(conds) or 'not scheduled'})") from None

    # ------------------------------------------------------------------ refill and recycle

    async def warm_up(self, spec: SandboxSpec) -> None:
        if self._refill is None and self.cfg.warm > 0:
            self._refill = asyncio.create_task(self._refill_loop(spec), name="agentrl-k8s-refill")

    async def _refill_loop(self, spec: SandboxSpec) -> None:
        body = pod_spec(spec, self.opts, deadline_s=spec.ttl_s + self.cfg.warm_max_idle_s)
        shash = spec_hash(body)
        backoff = 0.0
        while True:
            changed = self.informer.changed()
            await self._recycle(time.time())
            self._inflight = {name for name in self._inflight if name not in self.facts}
            now = time.time()
            mine = [f for f in self.facts.values() if self._is_my_warm(f, now)]
            pending = sum(1 for f in mine if not f.ready) + len(self._inflight) + self._creating
            deficit = self.cfg.warm - len(mine) - len(self._inflight) - self._creating
            for _ in range(max(0, min(deficit, self.cfg.max_pending - pending))):
                self._spawn(self._create_warm(spec, body, shash))
            if self._failed_in_row:
                backoff = min(30.0, max(0.5, backoff * 2))
                self._failed_in_row = 0
                await asyncio.sleep(backoff)
                continue
            backoff = 0.0
            await asyncio.sleep(REFILL_GAP_S)
            try:
                async with asyncio.timeout(RECYCLE_EVERY_S):
                    await changed.wait()
            except TimeoutError:
                pass

    def _is_my_warm(self, f: PodFacts, now: float) -> bool:
        return (f.creator == self.owner.session and f.state == WARM and not f.dead
                and now - f.start < self.cfg.warm_max_idle_s - 5)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _create_warm(self, spec: SandboxSpec, body: Obj, shash: str) -> None:
        self._creating += 1
        try:
            pod = await self._create(self._manifest(spec, body, shash, {}, claimed=False))
            self._inflight.add(pod["metadata"]["name"])
            self.counters["refill_created"] += 1
        except (ApiError, SandboxStartError) as e:
            self.counters["refill_failures"] += 1
            self._failed_in_row += 1
            log.warning("warm pool refill: creating a pod failed: %s", e)
        finally:
            self._creating -= 1

    async def _recycle(self, now: float) -> None:
        doomed = [(name, f) for name, f in self.facts.items()
                  if f.state == WARM and not f.deleting and (now - f.start > self.cfg.warm_max_idle_s or f.dead)]
        for name, f in doomed[:16]:
            if await self._delete(name, f.rv):
                self.counters["recycled"] += 1
                if f.dead and name not in self._ever_ready:
                    self.counters["died_unready"] += 1
                    self.nodes.died_unready(f.node, now)
        for name in self.nodes.lapsed(now):  # made avoiding a node no longer avoided, and still unscheduled
            g = self.facts.get(name)
            if g and g.state == WARM and g.node is None and not g.deleting and await self._delete(name, g.rv):
                self.counters["avoidance_lapsed"] += 1

    # ------------------------------------------------------------------ release, state, sweep

    async def _delete(self, name: str, rv: str | None = None) -> bool:
        """Delete a pod (only at resourceVersion `rv` when given). False when it was gone or changed."""
        body: Obj = {"gracePeriodSeconds": self.cfg.delete_grace_s, "propagationPolicy": "Background"}
        if rv is not None:
            body["preconditions"] = {"resourceVersion": rv}
        try:
            await self._call("DELETE", f"{self.path}/{name}", f"delete pod {name}", body=body)
        except ApiError as e:
            if e.status in (404, 409):
                return False
            raise
        return True

    async def _delete_while_warm(self, name: str, rv: str | None) -> bool:
        """Delete a pod at `rv`; when it changed meanwhile (the kubelet's status updates move a starting pod's
        resourceVersion), read it again and retry while it is still an unclaimed warm pod (another worker's claim
        wins). `rv` None: unconditionally (a pod this worker holds)."""
        for _ in range(5):
            if await self._delete(name, rv):
                return True
            if rv is None:
                return False
            try:
                pod = await self._call("GET", f"{self.path}/{name}", f"get pod {name}")
            except ApiError as e:
                if e.status == 404:
                    return False
                raise
            meta = pod["metadata"]
            if (meta.get("labels") or {}).get(L_STATE) != WARM or meta.get("deletionTimestamp"):
                return False
            rv = meta["resourceVersion"]
        raise ApiError(409, "Conflict", f"pod {name} kept changing under 5 conditional deletes")

    async def release(self, name: str) -> None:
        await self._delete(name)
        self._live.discard(name)
        self.counters["deleted"] += 1

    async def _release_quietly(self, name: str) -> None:
        try:
            await self.release(name)
        except ApiError as e:
            log.warning("could not delete pod %s that failed to start: %s (agentrl sandbox gc removes it)", name, e)

    def death(self, name: str) -> str | None:
        pod = self.informer.objects.get(name)
        return death_reason(pod, pod is None and name in self.informer.deleted)

    def known(self, name: str) -> bool:
        return name in self.informer.objects

    async def sweep(self, *, run_id: str | None, all_runs: bool) -> int:
        pods = await self._list(f"{MANAGED_BY}={MANAGED},{L_ROLE}={ROLE}", "list sandbox pods")
        live = await live_owner_uids(self._call, pods)
        now = time.time()
        doomed = [pod for pod in pods if should_remove(pod, now=now, host=self.owner.host, live_owner_uids=live,
                                                       run_id=run_id, all_runs=all_runs)]

        async def remove(pod: Obj) -> bool:
            meta = pod["metadata"]
            unclaimed = (meta.get("labels") or {}).get(L_STATE) != CLAIMED
            try:
                return await self._delete(meta["name"], meta["resourceVersion"] if unclaimed else None)
            except ApiError as e:
                log.warning("sweep: could not delete pod %s: %s", meta["name"], e)
                return False

        removed = sum(await gather_bounded([remove(pod) for pod in doomed], SWEEP_CONCURRENCY))
        self.counters["swept"] += removed
        return removed

    async def close(self) -> None:
        if self._refill is not None:
            self._refill.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*([self._refill] if self._refill else []), *self._tasks, return_exceptions=True)
        doomed = [(name, None) for name in self._live]
        if not self.cfg.keep_warm_on_close:
            mine = await self._list(f"{L_CREATOR}={self.owner.session},{L_STATE}={WARM}", "list own warm pods")
            doomed += [(p["metadata"]["name"], p["metadata"]["resourceVersion"]) for p in mine]
        results = await asyncio.gather(*(self._delete_while_warm(n, rv) for n, rv in doomed), return_exceptions=True)
        for (name, _), result in zip(doomed, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("could not delete pod %s on close: %s (agentrl sandbox gc removes it)", name, result)
        self._live.clear()
        await self.informer.stop()


async def live_owner_uids(call: Any, objs: list[Obj]) -> set[str]:
    """UIDs of the owner pods named by claimed objects that still exist (one GET per distinct owner; an owner whose
    state cannot be read counts as live, so its sandboxes are kept)."""
    owners = {}
    for obj in objs:
        meta = obj["metadata"]
        uid = (meta.get("labels") or {}).get(L_OWNER_UID)
        where = (meta.get("annotations") or {}).get(A_POD, "")
        if uid and "/" in where:
            owners[uid] = where
    live = set()
    for uid, where in owners.items():
        ns, _, name = where.partition("/")
        try:
            owner = await call("GET", f"/api/v1/namespaces/{ns}/pods/{name}", f"get owner pod {name}")
        except ApiError as e:
            if e.status != 404:
                live.add(uid)
            continue
        if owner["metadata"].get("uid") == uid:
            live.add(uid)
    return live


def _pointer(key: str) -> str:
    """A map key as one JSON pointer token (RFC 6901): "agentrl.io/state" -> "agentrl.io~1state"."""
    return key.replace("~", "~0").replace("/", "~1")
