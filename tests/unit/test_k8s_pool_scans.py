"""The `pods` control plane at scale: a claim or a refill pass must not re-derive every pod's state from its raw
object (at 2,000 pods that was ~0.2 s of event-loop time per claim and per watch event, bench_k8s_scale.py). The
facts are derived once per watch event; a claim then parses no timestamp. Counted, not timed."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import pytest

from agentrl.sandbox import SandboxSpec
from agentrl.sandbox.kubernetes import pods as pods_mod
from agentrl.sandbox.kubernetes.backend import KubernetesSandboxConfig
from agentrl.sandbox.kubernetes.pods import L_STATE, WARM, Owner, PodOptions, pod_spec, spec_hash
from agentrl.sandbox.kubernetes.pool import SWEEP_CONCURRENCY, PodPool

SPEC = SandboxSpec(image="agentrl/python:latest", cpus=0.1, memory="128m", disk="64m")


class PatchingApi:
    """The one call a warm claim makes: the conditional PATCH, answered with the patched pod."""

    def __init__(self, pods: dict[str, Any]) -> None:
        self.pods = pods
        self.patches = 0

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        assert method == "PATCH", (method, path)
        self.patches += 1
        pod = copy.deepcopy(self.pods[path.rsplit("/", 1)[1]])
        for op in kw["body"]:  # the claim's JSON patch: a test of the state label, then adds
            key = op["path"].rsplit("/", 1)[1].replace("~1", "/")
            if op["path"].startswith("/metadata/labels/") and op["op"] == "add":
                pod["metadata"]["labels"][key] = op["value"]
        return pod


def _warm_pods(pool: PodPool, n: int) -> dict[str, Any]:
    body = pod_spec(SPEC, pool.opts, deadline_s=SPEC.ttl_s + 900)
    shash = spec_hash(body)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out = {}
    for i in range(n):
        m = pool._manifest(SPEC, copy.deepcopy(body), shash, {}, claimed=False)
        m["metadata"].update(name=f"warm-{i}", resourceVersion=str(i + 1), creationTimestamp=now)
        m["status"] = {"phase": "Running", "podIP": "10.0.0.1", "startTime": now,
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": c["name"], "state": {"running": {}}} for c in body["containers"]]}
        out[m["metadata"]["name"]] = m
    return out


def _pool(n: int) -> tuple[PodPool, PatchingApi, str]:
    cfg = KubernetesSandboxConfig()
    opts = PodOptions(namespace=cfg.namespace, pool=cfg.pool, agent_port=cfg.agent_port,
                      agent_configmap="agentrl-agent-0123456789ab", key_secret=cfg.key_secret,
                      runtime_class=None, image_pull_policy="IfNotPresent", template=None)
    owner = Owner(session="s1", host="h", pid=1, pid_start="1")
    pool = PodPool(None, cfg, opts, owner)  # type: ignore[arg-type]
    pods = _warm_pods(pool, n)
    api = PatchingApi(pods)
    pool.api = api  # type: ignore[assignment]
    pool.informer._replace({"items": list(pods.values()), "metadata": {"resourceVersion": str(n)}})
    return pool, api, spec_hash(pod_spec(SPEC, opts, deadline_s=SPEC.ttl_s))


async def test_a_claim_among_thousands_of_warm_pods_parses_no_timestamp(monkeypatch: Any) -> None:
    pool, api, shash = _pool(1000)
    calls = {"n": 0}
    real = pods_mod.parse_time

    def counted(text: str | None) -> float | None:
        calls["n"] += 1
        return real(text)

    monkeypatch.setattr(pods_mod, "parse_time", counted)
    claimed = await pool._claim(shash, SPEC, {"agentrl/run-id": "r"})
    assert claimed is not None and claimed["metadata"]["labels"][L_STATE] == "claimed" and api.patches == 1
    assert calls["n"] <= 2, f"one claim parsed {calls['n']} timestamps among 1,000 warm pods"


async def test_facts_follow_the_watch() -> None:
    pool, _, shash = _pool(3)
    assert len(pool._claimable(shash, time.time())) == 3
    pod = copy.deepcopy(pool.informer.objects["warm-0"])
    pod["metadata"]["labels"][L_STATE] = "claimed"
    pod["metadata"]["resourceVersion"] = "10"
    pool.informer._apply("MODIFIED", pod)
    gone = copy.deepcopy(pool.informer.objects["warm-1"])
    pool.informer._apply("DELETED", gone)
    assert pool._claimable(shash, time.time()) == ["warm-2"]
    assert set(pool.facts) == {"warm-0", "warm-2"} and pool.facts["warm-2"].state == WARM


class SlowDeleteApi:
    """A list of orphans, and deletes that take a while: how many are in flight at once."""

    def __init__(self, pods: list[Any]) -> None:
        self.pods = pods
        self.in_flight = self.most = self.deleted = 0

    async def list(self, path: str, selector: str) -> Any:
        return {"items": self.pods, "metadata": {"resourceVersion": "1"}}

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        assert method == "DELETE", (method, path)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.02)
        self.in_flight -= 1
        self.deleted += 1
        return {}


async def test_a_sweep_deletes_orphans_concurrently_within_a_bound() -> None:
    pool, _, _ = _pool(0)
    orphans = list(_warm_pods(pool, 64).values())
    for p in orphans:
        p["status"]["phase"] = "Failed"  # dead pods are orphans whoever made them
    api = SlowDeleteApi(orphans)
    pool.api = api  # type: ignore[assignment]
    assert await pool.sweep(run_id=None, all_runs=False) == 64 and api.deleted == 64
    assert 1 < api.most <= SWEEP_CONCURRENCY, f"{api.most} deletes in flight at once"


@pytest.mark.parametrize("limit", ["rate", "threads"])
async def test_a_claim_goes_ahead_of_the_refill_creates_queued_in_the_client(limit: str) -> None:
    """At scale the housekeeping alone fills the client: the QPS budget (rate) or, with a slow API server, the edge's
    I/O threads (threads). A claim a trajectory waits on must not queue behind the refill's creates in either.
    Through the real KubeApi; the server side records the order the calls left in."""
    from kubernetes import client

    from agentrl.sandbox.kubernetes.api import KubeApi

    pool, patching, shash = _pool(4)
    if limit == "rate":
        api = KubeApi(client.Configuration(), threads=1, qps=100.0, burst=1)
    else:
        api = KubeApi(client.Configuration(), threads=2, qps=10_000.0, burst=1_000)
    sent: list[str] = []

    def request_sync(method: str, path: str, **kw: Any) -> Any:
        sent.append(method)
        time.sleep(0.01)  # the server's answer
        if method == "PATCH":
            return asyncio.run(patching.request(method, path, **kw))
        return {"metadata": {"name": "created"}}

    api.request_sync = request_sync  # type: ignore[method-assign]
    pool.api = api
    refills = []
    for _ in range(30):
        manifest = pool._manifest(SPEC, pod_spec(SPEC, pool.opts, deadline_s=SPEC.ttl_s), shash, {}, claimed=False)
        refills.append(asyncio.create_task(pool._create(manifest)))
        await asyncio.sleep(0)
    try:
        before = len(sent)  # creates already sent when the claim is issued (more on a loaded machine)
        claimed = await pool._claim(shash, SPEC, {"agentrl/run-id": "r"})
        assert claimed is not None and claimed["metadata"]["labels"][L_STATE] == "claimed"
        behind = sent.index("PATCH") - before
        assert before < 28 and behind <= 2, f"the claim left after {behind} refill creates queued after it: {sent}"
    finally:
        await asyncio.gather(*refills)
        await api.close()
    assert sent.count("POST") == 30


async def test_agent_health_probes_of_a_burst_of_claims_are_bounded(monkeypatch: Any) -> None:
    """A step's start claims thousands of warm pods at once; each then probes its agent on a fresh connection. Opened
    all at once they starved the event loop past their own connect timeout, and every retry opened another (2,000
    pods: no sandbox ever became ready). At most AGENT_PROBES are in flight."""
    from agentrl.sandbox.base import AgentEndpoint
    from agentrl.sandbox.kubernetes import backend as backend_mod

    state = {"now": 0, "most": 0}

    async def probe(endpoint: Any, **kw: Any) -> bool:
        state["now"] += 1
        state["most"] = max(state["most"], state["now"])
        await asyncio.sleep(0.001)
        state["now"] -= 1
        return True

    monkeypatch.setattr(backend_mod, "probe_health", probe)
    b = backend_mod.KubernetesBackend()
    endpoint = AgentEndpoint(kind="tcp", address="127.0.0.1:1", token="t")
    n = backend_mod.AGENT_PROBES * 4
    await asyncio.gather(*(b._wait_agent(None, f"p{i}", endpoint, time.monotonic() + 30) for i in range(n)))
    assert 1 < state["most"] <= backend_mod.AGENT_PROBES, f"{state['most']} probes in flight at once"
