"""Kubernetes backend: sandboxes as pods, from a warm pool shared by every rollout worker. The control plane only.

Owns: the backend's config (`KubernetesSandboxConfig`), bootstrapping what every sandbox pod needs in its
namespace (the agent ConfigMap, the token key Secret), turning a claimed or created pod into a `SandboxHandle`
(pod IP + agent port + the pod's bearer token), waiting until its agent answers, and choosing the control plane:

    control_plane: pods           this package's own warm pool of pods (`pool.py`): claims by conditional
                                  update, refill, recycling, sweep (the default; needs only pod verbs + 2 objects)
    control_plane: agent-sandbox  the Kubernetes SIG agent-sandbox CRDs (`claims.py`): a SandboxClaim per
                                  sandbox against a SandboxWarmPool of a SandboxTemplate rendered from this config

Does not own: commands (they go to the in-sandbox agent over keep-alive HTTP with TCP_NODELAY through `client.py`;
never Kubernetes exec), leases (`pool.py`), manifests and pod rules (`pods.py`), API I/O (`api.py`).

API calls per sandbox are constant, whatever the number of commands: warm hit = 1 conditional patch (claim) + 1
delete, plus the refill's 1 create; cold = 1 create + 1 delete. Readiness comes from one watch per process.
The bearer token is never logged and is in no API object (see `pods.py`).

Wiring (in the CLI): `sandbox.backend: {type: kubernetes, namespace: agentrl, warm: 32, ...}` validates as
`KubernetesSandboxConfig`; `make_backend("kubernetes", config=cfg)` builds the backend. Outside a pod it uses the
kubeconfig (`kubeconfig`/`context` or $KUBECONFIG); in a pod its service account (the Role in k8s/base).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentrl.errors import (
    ConfigError,
    SandboxError,
    SandboxStartError,
)
from agentrl.sandbox.artifact import shipped_bytes
from agentrl.sandbox.base import AgentEndpoint, SandboxHandle, SandboxSpec
from agentrl.sandbox.client import probe_health
from agentrl.sandbox.kubernetes.api import (
    ApiError,
    KubeApi,
    load_client_configuration,
    retrying,
)
from agentrl.sandbox.kubernetes.pods import (
    Owner,
    PodOptions,
    agent_configmap,
    agent_configmap_name,
    derive_token,
    key_secret,
)
from agentrl.sandbox.kubernetes.pods import (
    death_cause as pod_death_cause,
)
from agentrl.sandbox.kubernetes.template import check_template

log = logging.getLogger("agentrl.sandbox")
DEATH_SETTLE_S = 6.0  # how long death_cause() waits for the kubelet to report a container the agent died in
# Agent health probes of starting sandboxes in flight at once, per backend. Each is a fresh connection with a 2 s
# connect timeout; 2,000 claims at once (a step's start) opened 2,000 of them, the event loop could not complete any
# within its timeout, and every retry opened another: no sandbox became ready (bench_k8s_scale.py, 2,000 pods).
AGENT_PROBES = 64
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class AgentSandboxOptions(BaseModel):
    """The agent-sandbox control plane (extensions.agents.x-k8s.io). The backend keeps a SandboxTemplate and a
    SandboxWarmPool named after `pool` in sync with this config unless `manage_template` is false (then they must
    exist, their pods built like this backend's: `KubernetesBackend.sandbox_template()` renders one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    api_version: str = "v1beta1"
    manage_template: bool = True


class KubernetesSandboxConfig(BaseModel):
    """`sandbox.backend` for `type: kubernetes`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["kubernetes"] = "kubernetes"
    namespace: str = Field(default="agentrl", pattern=_DNS_LABEL, max_length=63)
    kubeconfig: str | None = None  # None: in-cluster in a pod, else $KUBECONFIG / ~/.kube/config
    context: str | None = None
    control_plane: Literal["pods", "agent-sandbox"] = "pods"
    pool: str = Field(default="default", pattern=_DNS_LABEL, max_length=40)  # workers sharing a pool share pods
    warm: int = Field(default=0, ge=0)  # ready unclaimed pods this worker keeps in the shared pool
    max_pending: int = Field(default=16, ge=1)  # this worker's refill: pods created and not ready yet, at most
    warm_max_idle_s: int = Field(default=900, ge=30)  # a warm pod older than this is recycled, never claimed
    claim_attempts: int = Field(default=8, ge=1)  # conditional-update conflicts before starting a pod cold
    claim_grace_s: float = Field(default=0.0, ge=0)  # wait this long for a warm pod when refills are pending
    qps: float = Field(default=50.0, gt=0)  # client-side API rate limit (requests/s) and burst
    burst: int = Field(default=100, ge=1)
    threads: int = Field(default=16, ge=2)  # threads (and HTTP connections) for API calls
    api_timeout_s: float = Field(default=30.0, gt=0)
    api_attempts: int = Field(default=6, ge=1)  # tries of one call on 429 / 5xx / no answer
    backoff_base_s: float = Field(default=0.2, gt=0)
    backoff_max_s: float = Field(default=10.0, gt=0)
    start_timeout_s: float = Field(default=300.0, gt=0)  # scheduling + image pull + agent up, per pod
    agent_port: int = Field(default=8765, ge=1, le=65535)
    # the agent's own container (not the commands' budget): CPU for serving requests, memory for reading files up
    # to the agent's 64 MB cap with headroom; the pod requests these on top of the sandbox spec's
    agent_cpus: float = Field(default=0.2, gt=0, le=8)
    agent_memory_mb: int = Field(default=256, ge=64)
    runtime_class: str | None = None  # e.g. "gvisor" (k8s/components/gvisor)
    # IfNotPresent: thousands of sandbox pods of one task image must not pull it each time (a moving tag needs
    # Always, at a cold-start cost); None leaves it to Kubernetes (Always for :latest)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = "IfNotPresent"
    pod_template: dict[str, Any] | None = None  # PodTemplateSpec (metadata + spec): scheduling, pull secrets...
    key_secret: str = Field(default="agentrl-sandbox-key", pattern=_DNS_LABEL)
    delete_grace_s: int = Field(default=1, ge=0)
    keep_warm_on_close: bool = False  # leave this worker's warm pods for other workers when it exits
    agent_sandbox: AgentSandboxOptions = Field(default_factory=AgentSandboxOptions)

    @field_validator("pod_template")
    @classmethod
    def _template(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        try:
            check_template(v)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return v


class KubernetesBackend:
    """Sandboxes as pods. `KubernetesBackend(config)` or `KubernetesBackend(namespace=..., warm=...)` (config
    fields as keywords). `api_host` points the client at a plain-HTTP API (the fake in tests/k8s);
    `owner` replaces the owner identity read from the environment (tests simulate several workers with it)."""

    name = "kubernetes"

    def __init__(self, config: KubernetesSandboxConfig | None = None, *, api_host: str | None = None,
                 owner: Owner | None = None, agent_file: Path | None = None, **fields: Any) -> None:
        if config is not None and fields:
            raise ConfigError(f"KubernetesBackend: pass either config or fields, not both ({sorted(fields)})")
        self.config = config or KubernetesSandboxConfig(**fields)
        self._api_host = api_host
        self.owner = owner or Owner.from_env(secrets.token_hex(6))
        self._agent_file = agent_file  # None: this tree's agent; else an artifact or an agent package directory
        self.api: KubeApi | None = None
        self.plane: Any = None
        self._key = b""
        self._agent_artifact = b""
        self._bootstrapped = False
        self._start_lock = asyncio.Lock()
        self._closed = False
        self._pod_names: dict[str, str] = {}  # handle id (pod or claim name) -> pod name, for death_cause()
        self._probes = asyncio.Semaphore(AGENT_PROBES)

    def __repr__(self) -> str:
        c = self.config
        return f"KubernetesBackend(namespace={c.namespace!r}, pool={c.pool!r}, control_plane={c.control_plane!r})"

    # ------------------------------------------------------------------ start-up

    async def _started(self, *, bootstrap: bool = True) -> Any:
        """The control plane: connected (API client, plane object) and, with `bootstrap`, ready to create sandboxes
        (agent ConfigMap and key Secret ensured, watch running). `sweep()` needs only the connection."""
        async with self._start_lock:
            if self._closed:
                raise SandboxStartError("the kubernetes backend is closed")
            if self.plane is None:
                await self._connect()
            if bootstrap and not self._bootstrapped:
                await self._bootstrap()
        return self.plane

    async def _connect(self) -> None:
        c = self.config
        configuration = await asyncio.to_thread(load_client_configuration, c.kubeconfig, c.context, self._api_host)
        self.api = KubeApi(configuration, threads=c.threads, qps=c.qps, burst=c.burst, timeout_s=c.api_timeout_s)
        self._agent_artifact = await asyncio.to_thread(shipped_bytes, self._agent_file)
        opts = PodOptions(namespace=c.namespace, pool=c.pool, agent_port=c.agent_port,
                          agent_configmap=agent_configmap_name(self._agent_artifact), key_secret=c.key_secret,
                          runtime_class=c.runtime_class, image_pull_policy=c.image_pull_policy,
                          template=c.pod_template, agent_cpus=c.agent_cpus,
                          agent_memory_bytes=c.agent_memory_mb << 20)
        if c.control_plane == "pods":
            from agentrl.sandbox.kubernetes.pool import PodPool

            self.plane = PodPool(self.api, c, opts, self.owner)
        else:
            from agentrl.sandbox.kubernetes.claims import ClaimPlane

            self.plane = ClaimPlane(self.api, c, opts, self.owner)

    async def _bootstrap(self) -> None:
        c = self.config
        cm_name = self.plane.opts.agent_configmap
        await self._ensure("configmaps", cm_name, agent_configmap(cm_name, self._agent_artifact, c.namespace))
        secret = await self._ensure("secrets", c.key_secret, key_secret(c.key_secret, secrets.token_hex(32),
                                                                         c.namespace))
        self._key = base64.b64decode(secret["data"]["key"]).strip()
        await self.plane.start()
        self._bootstrapped = True

    async def _call(self, method: str, path: str, what: str, **kwargs: Any) -> Any:
        c, api = self.config, self.api
        assert api is not None, "the backend is not started"  # _started() connects first
        return await retrying(lambda: api.request(method, path, **kwargs), attempts=c.api_attempts,
                              base_s=c.backoff_base_s, cap_s=c.backoff_max_s, what=what)

    async def _ensure(self, plural: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Get the object, creating it when missing (another worker may win the race: then read theirs)."""
        path = f"/api/v1/namespaces/{self.config.namespace}/{plural}"
        try:
            return await self._call("GET", f"{path}/{name}", f"get {plural}/{name}")
        except ApiError as e:
            if e.status != 404:
                raise self._api_problem(e, f"reading {plural}/{name}") from e
        try:
            return await self._call("POST", path, f"create {plural}/{name}", body=body)
        except ApiError as e:
            if e.status == 409:
                return await self._call("GET", f"{path}/{name}", f"get {plural}/{name}")
            raise self._api_problem(e, f"creating {plural}/{name}") from e

    def _api_problem(self, e: ApiError, doing: str, error: type[Exception] = SandboxStartError) -> Exception:
        if e.status in (401, 403):
            return ConfigError(f"kubernetes backend: {doing} in namespace {self.config.namespace!r} was refused "
                               f"({e}); apply k8s/base (Role agentrl-rollout) and run with its service account")
        if e.status == 404 and "namespace" in e.message.lower():
            return ConfigError(f"namespace {self.config.namespace!r} does not exist: kubectl apply -k k8s/base, or "
                               "set sandbox.backend.namespace")
        return error(f"kubernetes backend: {doing} failed: {e}")

    async def warm_up(self, spec: SandboxSpec) -> None:
        """Start keeping `config.warm` pods of `spec` in the shared pool now (create() does it on first use)."""
        plane = await self._started()
        await plane.warm_up(spec)

    # ------------------------------------------------------------------ the backend protocol

    async def create(self, spec: SandboxSpec, labels: dict[str, str]) -> SandboxHandle:
        """A sandbox of `spec`: a claimed warm pod when one is ready, else a new pod. Returns once its agent
        answers. Cancellation-safe: a pod claimed or created by a cancelled or failed call is deleted."""
        plane = await self._started()
        t0 = time.monotonic()
        try:
            got = await plane.acquire(spec, labels)
        except ApiError as e:
            raise self._api_problem(e, "starting a sandbox pod") from e
        try:
            endpoint = self._endpoint(got.ip, got.pod_name)
            t1 = time.monotonic()
            await self._wait_agent(plane, got.name, endpoint, t0 + self.config.start_timeout_s)
        except BaseException:
            await asyncio.shield(self._discard(plane, got.name))
            raise
        timings = {"create_s": got.acquired_s, "agent_ready_s": time.monotonic() - t1, "warm_hit": float(got.warm)}
        self._pod_names[got.name] = got.pod_name
        return SandboxHandle(id=got.name, backend=self.name, endpoint=endpoint, labels=got.labels, timings=timings)

    def _endpoint(self, ip: str, pod_name: str) -> AgentEndpoint:
        host = f"[{ip}]" if ":" in ip else ip
        return AgentEndpoint(kind="tcp", address=f"{host}:{self.config.agent_port}",
                             token=derive_token(self._key, pod_name))

    async def _wait_agent(self, plane: Any, name: str, endpoint: AgentEndpoint, deadline: float) -> None:
        """The agent may still be binding its port: retry /health (data plane, not the API) with a growing delay,
        failing fast when the pod dies meanwhile."""
        delay = 0.005
        while True:
            async with self._probes:  # a bounded number at once: see AGENT_PROBES
                if await probe_health(endpoint):
                    return
            dead = plane.death(name)
            if dead is not None:
                raise SandboxStartError(f"sandbox pod {name} died before its agent answered: {dead}")
            if time.monotonic() >= deadline:
                raise SandboxStartError(f"agent in pod {name} did not answer within "
                                        f"start_timeout_s={self.config.start_timeout_s:.0f}s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)

    async def _discard(self, plane: Any, name: str) -> None:
        try:
            await plane.release(name)
        except Exception as e:  # noqa: BLE001 - the create's own error is what propagates
            log.warning("could not delete half-started sandbox pod %s: %s (agentrl sandbox gc removes it)", name, e)

    async def destroy(self, handle: SandboxHandle) -> None:
        """Delete the pod (or claim). Idempotent."""
        if self.plane is None:
            return
        self._pod_names.pop(handle.id, None)
        try:
            await self.plane.release(handle.id)
        except ApiError as e:
            raise self._api_problem(e, f"deleting sandbox {handle.id}", SandboxError) from e

    async def alive(self, handle: SandboxHandle) -> bool:
        """From the watch cache: the pod runs and is not being deleted (no API call)."""
        if self.plane is None:
            return False
        return self.plane.death(handle.id) is None and self.plane.known(handle.id)

    async def death_cause(self, handle: SandboxHandle) -> str | None:
        """From a fresh GET of the sandbox's pod (see `k8s_pods.death_cause`): 404 -> "deleted"; None when the API
        does not answer. The kubelet reports a dead container a moment after the fact (its pod lifecycle events): while
        the pod still says running but the agent does not answer, it asks again, up to DEATH_SETTLE_S, so that an agent
        killed from outside is not taken for one that died with no cause."""
        if self.api is None:
            return None
        pod_name = self._pod_names.get(handle.id, handle.id)
        end = time.monotonic() + DEATH_SETTLE_S
        while True:
            try:
                pod = await self.api.request("GET", f"/api/v1/namespaces/{self.config.namespace}/pods/{pod_name}",
                                             urgent=True)
            except ApiError as e:
                if e.status == 404:
                    return "deleted"
                log.warning("could not read pod %s to tell why it died: %s", pod_name, e)
                return None
            cause = pod_death_cause(pod)
            if cause is not None or time.monotonic() >= end or await probe_health(handle.endpoint, timeout_s=1.0):
                return cause
            await asyncio.sleep(0.25)

    async def sweep(self, *, run_id: str | None = None, all_runs: bool = False) -> int:
        """Delete agentrl sandboxes in the namespace and return how many: with neither argument, orphans (claimed by
        an owner that is gone, dead, or past their TTL); with `run_id`, every one of that run; with `all_runs`,
        every one."""
        plane = await self._started(bootstrap=False)
        try:
            return await plane.sweep(run_id=run_id, all_runs=all_runs)
        except ApiError as e:
            raise self._api_problem(e, "sweeping sandbox pods", SandboxError) from e

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.plane.counters) if self.plane is not None else {}
        out["api_calls"] = dict(self.api.calls) if self.api is not None else {}
        out["api_errors"] = dict(self.api.statuses) if self.api is not None else {}
        return out

    async def close(self) -> None:
        """Delete what this worker holds (its claimed pods; its warm pods unless keep_warm_on_close), stop the
        watch and the API threads. Safe to call twice."""
        async with self._start_lock:
            if self._closed:
                return
            self._closed = True
        if self.plane is not None and self._bootstrapped:
            await self.plane.close()
        if self.api is not None:
            await self.api.close()

    def sandbox_template(self, spec: SandboxSpec) -> dict[str, Any]:
        """The SandboxTemplate (agent-sandbox CRD) of `spec`, after start-up (names the agent ConfigMap)."""
        if self.plane is None or not hasattr(self.plane, "template_manifest"):
            raise ConfigError("sandbox_template() needs control_plane: agent-sandbox and a started backend")
        return self.plane.template_manifest(spec)
