"""The `agent-sandbox` control plane of the kubernetes backend: one SandboxClaim per sandbox.

For clusters that run the Kubernetes SIG agent-sandbox controller (CRDs SandboxTemplate / SandboxWarmPool /
SandboxClaim in extensions.agents.x-k8s.io, Sandbox in agents.x-k8s.io). Owns: keeping a SandboxTemplate (the same
pod spec the `pods` plane creates, see `pods.py`) and a SandboxWarmPool (`replicas: warm`) named after the pool
in sync with the config; creating a claim against the warm pool (labels for owner and run, `lifecycle.shutdownTime`
= now + ttl_s with shutdownPolicy Delete, so an abandoned claim dies on its own); waiting through a watch on claims
until the claim is Ready with a pod IP; reading the bound Sandbox's pod name (annotation
`agents.x-k8s.io/pod-name`, else the Sandbox's name) to derive the pod's bearer token; deleting claims; sweeping
claims whose owner is gone. The controller does the pooling: a claim adopts a warm pod or starts one.

Small and honest: no claim `env` (it forces a cold start), the warm pool size is this config's `warm` (last writer
wins when workers disagree), and the template's network policy is left to k8s/base (`networkPolicyManagement:
Unmanaged`). API calls per sandbox: create claim + get Sandbox + delete claim.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from agentrl.errors import SandboxStartError
from agentrl.sandbox.base import SandboxSpec
from agentrl.sandbox.kubernetes.api import ApiError, Informer, KubeApi, gather_bounded, retrying
from agentrl.sandbox.kubernetes.pods import (
    A_LABELS,
    CLAIMED,
    L_POOL,
    L_ROLE,
    L_RUN,
    L_STATE,
    MANAGED,
    MANAGED_BY,
    ROLE,
    Obj,
    Owner,
    PodOptions,
    base_labels,
    pod_spec,
    run_id_of,
    should_remove,
    spec_hash,
)
from agentrl.sandbox.kubernetes.pool import SWEEP_CONCURRENCY, Acquired, live_owner_uids

log = logging.getLogger("agentrl.sandbox")
EXT_GROUP, CORE_GROUP = "extensions.agents.x-k8s.io", "agents.x-k8s.io"
POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"


def _ready(claim: Obj | None) -> tuple[bool | None, str]:
    """(Ready condition as bool, or None when not reported yet; its reason)."""
    for c in (claim or {}).get("status", {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True", f"{c.get('reason', '')} {c.get('message', '')}".strip()
    return None, ""


class ClaimPlane:
    """See the module docstring. Same interface as `k8s_pool.PodPool`."""

    def __init__(self, api: KubeApi, cfg: Any, opts: PodOptions, owner: Owner) -> None:
        self.api = api
        self.cfg = cfg
        self.opts = opts
        self.owner = owner
        v, ns = cfg.agent_sandbox.api_version, cfg.namespace
        self.ext = f"/apis/{EXT_GROUP}/{v}/namespaces/{ns}"
        self.sandboxes = f"/apis/{CORE_GROUP}/{v}/namespaces/{ns}/sandboxes"
        self.informer = Informer(api, f"{self.ext}/sandboxclaims", f"{MANAGED_BY}={MANAGED},{L_POOL}={cfg.pool}")
        self.counters: Counter[str] = Counter()
        self._live: set[str] = set()
        self._synced: set[str] = set()  # spec hashes whose template/warm pool are in sync
        self._sync_lock = asyncio.Lock()

    async def start(self) -> None:
        await self.informer.start()

    async def _call(self, method: str, path: str, what: str, **kwargs: Any) -> Any:
        return await self._retried(lambda: self.api.request(method, path, **kwargs), what)

    async def _retried(self, call: Callable[[], Awaitable[Any]], what: str) -> Any:
        c = self.cfg
        return await retrying(call, attempts=c.api_attempts, base_s=c.backoff_base_s, cap_s=c.backoff_max_s,
                              what=what)

    # ------------------------------------------------------------------ template and warm pool

    def template_manifest(self, spec: SandboxSpec) -> Obj:
        body = pod_spec(spec, self.opts, deadline_s=spec.ttl_s + self.cfg.warm_max_idle_s)
        labels = {**base_labels(self.cfg.pool, spec_hash(body), spec), L_STATE: CLAIMED}
        return {"apiVersion": f"{EXT_GROUP}/{self.cfg.agent_sandbox.api_version}", "kind": "SandboxTemplate",
                "metadata": {"name": self.cfg.pool, "namespace": self.cfg.namespace,
                             "labels": {MANAGED_BY: MANAGED}},
                "spec": {"podTemplate": {"metadata": {"labels": labels}, "spec": body},
                         "networkPolicyManagement": "Unmanaged"}}

    def warm_pool_manifest(self) -> Obj:
        return {"apiVersion": f"{EXT_GROUP}/{self.cfg.agent_sandbox.api_version}", "kind": "SandboxWarmPool",
                "metadata": {"name": self.cfg.pool, "namespace": self.cfg.namespace,
                             "labels": {MANAGED_BY: MANAGED}},
                "spec": {"replicas": self.cfg.warm, "sandboxTemplateRef": {"name": self.cfg.pool}}}

    async def warm_up(self, spec: SandboxSpec) -> None:
        if not self.cfg.agent_sandbox.manage_template:
            return
        key = spec_hash(pod_spec(spec, self.opts, deadline_s=spec.ttl_s))
        async with self._sync_lock:
            if key in self._synced:
                return
            await self._apply("sandboxtemplates", self.template_manifest(spec))
            await self._apply("sandboxwarmpools", self.warm_pool_manifest())
            self._synced.add(key)

    async def _apply(self, plural: str, body: Obj) -> None:
        """Create, or replace the spec when it differs (PUT with the read resourceVersion)."""
        path, name = f"{self.ext}/{plural}", body["metadata"]["name"]
        try:
            current = await self._call("GET", f"{path}/{name}", f"get {plural}/{name}")
        except ApiError as e:
            if e.status != 404:
                raise
            await self._call("POST", path, f"create {plural}/{name}", body=body)
            return
        if current.get("spec") != body["spec"]:
            body = {**body, "metadata": {**body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
            await self._call("PUT", f"{path}/{name}", f"update {plural}/{name}", body=body)

    # ------------------------------------------------------------------ claims

    async def acquire(self, spec: SandboxSpec, labels: dict[str, str]) -> Acquired:
        await self.warm_up(spec)
        t0 = time.monotonic()
        name = f"{self.cfg.pool}-{secrets.token_hex(5)}"
        own = {MANAGED_BY: MANAGED, L_ROLE: ROLE, L_POOL: self.cfg.pool, L_STATE: CLAIMED, L_RUN: run_id_of(labels),
               **self.owner.labels()}
        shutdown = datetime.fromtimestamp(time.time() + spec.ttl_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        claim = {"apiVersion": f"{EXT_GROUP}/{self.cfg.agent_sandbox.api_version}", "kind": "SandboxClaim",
                 "metadata": {"name": name, "namespace": self.cfg.namespace, "labels": own,
                              "annotations": {**self.owner.annotations(),
                                              A_LABELS: json.dumps(labels, sort_keys=True)}},
                 "spec": {"warmPoolRef": {"name": self.cfg.pool},
                          "lifecycle": {"shutdownTime": shutdown, "shutdownPolicy": "Delete"},
                          "additionalPodMetadata": {"labels": {L_RUN: own[L_RUN], **self.owner.labels()}}}}
        await self._call("POST", f"{self.ext}/sandboxclaims", "create sandboxclaim", body=claim, urgent=True)
        self._live.add(name)
        self.counters["claims"] += 1
        try:
            bound = await self._wait_bound(name, t0 + self.cfg.start_timeout_s)
            sandbox = await self._call("GET", f"{self.sandboxes}/{bound['status']['sandbox']['name']}", "get sandbox",
                                       urgent=True)
        except BaseException:
            await asyncio.shield(self.release(name))
            raise
        pod_name = (sandbox["metadata"].get("annotations") or {}).get(POD_NAME_ANNOTATION) or sandbox["metadata"][
            "name"]
        return Acquired(name=name, pod_name=pod_name, ip=bound["status"]["sandbox"]["podIPs"][0], labels=own,
                        warm=False, acquired_s=time.monotonic() - t0)

    async def _wait_bound(self, name: str, deadline: float) -> Obj:
        def check(claim: Obj | None, deleted: bool) -> Obj | None:
            if deleted:
                raise SandboxStartError(f"sandbox claim {name} was deleted while waiting for it")
            ready, _ = _ready(claim)
            ips = (claim or {}).get("status", {}).get("sandbox", {}).get("podIPs") or []
            return claim if ready and ips else None

        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                return await self.informer.wait(name, check)
        except TimeoutError:
            _, why = _ready(self.informer.objects.get(name))
            raise SandboxStartError(f"sandbox claim {name} not Ready after start_timeout_s="
                                    f"{self.cfg.start_timeout_s:.0f}s ({why or 'no status from the controller'}; "
                                    "is the agent-sandbox controller installed?)") from None

    async def release(self, name: str) -> None:
        try:
            await self._call("DELETE", f"{self.ext}/sandboxclaims/{name}", f"delete sandboxclaim {name}",
                             body={"propagationPolicy": "Background"})
        except ApiError as e:
            if e.status != 404:
                raise
        self._live.discard(name)
        self.counters["deleted"] += 1

    def death(self, name: str) -> str | None:
        claim = self.informer.objects.get(name)
        if claim is None:
            return "the sandbox claim was deleted" if name in self.informer.deleted else None
        ready, why = _ready(claim)
        if claim["metadata"].get("deletionTimestamp"):
            return "the sandbox claim is being deleted"
        return f"the sandbox is not ready any more ({why})" if ready is False else None

    def known(self, name: str) -> bool:
        return name in self.informer.objects

    async def sweep(self, *, run_id: str | None, all_runs: bool) -> int:
        selector = f"{MANAGED_BY}={MANAGED},{L_ROLE}={ROLE}"
        listing = await self._retried(lambda: self.api.list(f"{self.ext}/sandboxclaims", selector),
                                      "list sandboxclaims")
        claims = listing.get("items") or []
        live = await live_owner_uids(self._call, claims)
        now = time.time()
        doomed = [c["metadata"]["name"] for c in claims if should_remove(
            c, now=now, host=self.owner.host, live_owner_uids=live, run_id=run_id, all_runs=all_runs)]
        await gather_bounded([self.release(name) for name in doomed], SWEEP_CONCURRENCY)
        return len(doomed)

    async def close(self) -> None:
        results = await asyncio.gather(*(self.release(n) for n in list(self._live)), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                log.warning("could not delete a sandbox claim on close: %s (agentrl sandbox gc removes it)", result)
        await self.informer.stop()
