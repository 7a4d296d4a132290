"""Fixtures of the kubernetes tier.

`cluster` runs a test twice: against the fake API edge (`fake_k8s.py` here + a fake kubelet that runs every
sandbox pod as a real local agent process on its own loopback IP, so the data plane is real) in the default tier,
and against a real cluster (pytest mark `k8s`) when KUBECONFIG is set. The real cluster is normally the dev cluster:

    export KUBECONFIG=$(k8s/dev-cluster/up.sh | tail -1)
    make test-k8s        # loads agentrl/python:latest into it, applies k8s/base, runs `pytest -m k8s tests/k8s`

Any other cluster works when the test process reaches pod IPs, the manifests of k8s/base are applied, and an image
with python3 is present (AGENTRL_K8S_IMAGE, default agentrl/python:latest). Without KUBECONFIG the real variants
skip with the reason, or fail when AGENTRL_REQUIRE_K8S=1.

`fake_cluster` is the fake alone, for tests that script failures the real server cannot be made to produce;
`real_cluster` the real one alone, for what only a real kubelet does (TTL kills, cgroup limits, killed processes).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.sandbox import SandboxSpec
from agentrl.sandbox.kubernetes.api import KubeApi, load_client_configuration
from agentrl.sandbox.kubernetes import KubernetesBackend
from fake_k8s import FakeKubernetes
from fake_kubelet import FakeKubelet

NAMESPACE = os.environ.get("AGENTRL_K8S_NAMESPACE", "agentrl")
IMAGE = os.environ.get("AGENTRL_K8S_IMAGE", "agentrl/python:latest")


class Cluster:
    """One API server (fake or real) plus helpers that act like kubectl. `backend()` makes a worker whose pool
    is private to this test; `kube` is an independent client (not the backend's)."""

    def __init__(self, kind: str, kube: KubeApi, host: str | None, fake: FakeKubernetes | None = None,
                 kubelet: FakeKubelet | None = None) -> None:
        self.kind = kind
        self.kube = kube
        self.host = host
        self.fake = fake
        self.kubelet = kubelet
        self.pool = f"t{uuid.uuid4().hex[:8]}"
        self.spec = SandboxSpec(image=IMAGE, cpus=0.1, memory="128m", disk="64m", default_timeout_s=20)
        self.backends: list[KubernetesBackend] = []

    def backend(self, **fields: Any) -> KubernetesBackend:
        fields.setdefault("namespace", NAMESPACE)
        fields.setdefault("pool", self.pool)
        fields.setdefault("image_pull_policy", "IfNotPresent")
        b = KubernetesBackend(api_host=self.host, **fields)
        self.backends.append(b)
        return b

    def path(self, name: str = "") -> str:
        return f"/api/v1/namespaces/{NAMESPACE}/pods" + (f"/{name}" if name else "")

    async def pods(self, selector: str | None = None) -> list[dict[str, Any]]:
        sel = f"agentrl.io/pool={self.pool}" + (f",{selector}" if selector else "")
        return (await self.kube.request("GET", self.path(), query={"labelSelector": sel}))["items"]

    async def delete_pod(self, name: str) -> None:
        await self.kube.request("DELETE", self.path(name), body={"gracePeriodSeconds": 0})

    async def cleanup(self) -> None:
        for b in self.backends:
            await b.close()
        for pod in await self.pods():
            try:
                await self.delete_pod(pod["metadata"]["name"])
            except Exception:  # noqa: BLE001 - already gone
                pass


def _real_problem() -> str | None:
    if not os.environ.get("KUBECONFIG"):
        return "no Kubernetes cluster: set KUBECONFIG (export KUBECONFIG=$(k8s/dev-cluster/up.sh | tail -1))"
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        return "the kubernetes client is not installed: pip install 'agentrl[k8s]'"
    return None


@pytest.fixture
async def fake_cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with FakeKubernetes() as fake:
        kubelet = FakeKubelet(fake, tmp_path, probe_period_s=0.05)
        kube = KubeApi(load_client_configuration(None, None, fake.url), threads=4)
        cluster = Cluster("fake", kube, fake.url, fake, kubelet)
        try:
            yield cluster
        finally:
            await cluster.cleanup()
            await kubelet.close()
            await kube.close()


@pytest.fixture
async def real_cluster() -> AsyncIterator[Cluster]:
    problem = _real_problem()
    if problem is not None:
        if os.environ.get("AGENTRL_REQUIRE_K8S") == "1":
            pytest.fail(f"AGENTRL_REQUIRE_K8S=1 but the k8s tier cannot run: {problem}", pytrace=False)
        pytest.skip(problem)
    kube = KubeApi(load_client_configuration(None, None), threads=4)
    cluster = Cluster("real", kube, None)
    try:
        await _check_namespace(kube)
        await _check_nodes(kube)
        yield cluster
    finally:
        await cluster.cleanup()
        await kube.close()


async def _check_nodes(kube: KubeApi) -> None:
    """A node under pressure (disk, memory, pids) is tainted, so pods stay Pending or are evicted ("the pod is being
    deleted") and every test times out far from the cause. Name the cause instead."""
    nodes = (await kube.request("GET", "/api/v1/nodes"))["items"]
    ok = []
    problems = []
    for node in nodes:
        name = node["metadata"]["name"]
        conds = {c["type"]: c for c in node.get("status", {}).get("conditions") or []}
        bad = [f"{t}: {c.get('message', '')}" for t, c in conds.items()
               if (t == "Ready") != (c.get("status") == "True")]
        taints = [t["key"] for t in node.get("spec", {}).get("taints") or [] if t.get("effect") != "PreferNoSchedule"]
        if bad or taints:
            problems.append(f"node {name}: {'; '.join(bad + [f'taint {t}' for t in taints])}")
        else:
            ok.append(name)
    if not ok:
        pytest.fail("no node can run sandbox pods: " + (" | ".join(problems) or "the cluster has no nodes")
                    + " (DiskPressure: free disk space on the machine (the dev cluster's kubelet evicts below 1 GiB); "
                    "then k8s/dev-cluster/down.sh && k8s/dev-cluster/up.sh)", pytrace=False)


async def _check_namespace(kube: KubeApi) -> None:
    from agentrl.sandbox.kubernetes.api import ApiError

    try:
        await kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/agentrl-rollout")
    except ApiError as e:
        pytest.fail(f"namespace {NAMESPACE!r} is not set up on the cluster ({e}): kubectl apply -k k8s/base "
                    "(make test-k8s does it)", pytrace=False)


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.k8s)])
def cluster(request: pytest.FixtureRequest) -> Cluster:
    return request.getfixturevalue(f"{request.param}_cluster")
