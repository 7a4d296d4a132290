"""The agent-sandbox control plane (SandboxTemplate / SandboxWarmPool / SandboxClaim) against the fake API edge
with a fake agent-sandbox controller: template and warm pool kept in sync, claim -> bound pod -> agent reachable
with the pod's token, deletion, sweep of a dead owner's claims, and the rendered template's pod spec validated."""

from __future__ import annotations

import socket
import subprocess
from typing import Any

import pytest

from agentrl.sandbox import Sandbox
from agentrl.sandbox.kubernetes.pods import Owner
from fake_kubelet import CLAIMS, TEMPLATES, WARMPOOLS, FakeAgentSandboxController

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def controller(fake_cluster: Any) -> FakeAgentSandboxController:
    return FakeAgentSandboxController(fake_cluster.fake)


async def test_claim_binds_a_pod_and_commands_reach_it(fake_cluster: Any, controller: Any) -> None:
    fake = fake_cluster.fake
    backend = fake_cluster.backend(control_plane="agent-sandbox", warm=3)
    handle = await backend.create(fake_cluster.spec, {"agentrl/run-id": "crd-run"})
    template = fake.get(TEMPLATES, "agentrl", fake_cluster.pool)
    pool = fake.get(WARMPOOLS, "agentrl", fake_cluster.pool)
    assert pool["spec"] == {"replicas": 3, "sandboxTemplateRef": {"name": fake_cluster.pool}}
    assert template["spec"]["networkPolicyManagement"] == "Unmanaged"
    claim = fake.get(CLAIMS, "agentrl", handle.id)
    assert claim["spec"]["warmPoolRef"]["name"] == fake_cluster.pool
    assert claim["spec"]["lifecycle"]["shutdownPolicy"] == "Delete"
    assert claim["metadata"]["labels"]["agentrl.io/run-id"] == "crd-run"
    sb = Sandbox(handle, fake_cluster.spec)
    r = await sb.exec("echo via-claim")
    assert r.exit_code == 0 and r.stdout == "via-claim\n"
    assert await backend.alive(handle)
    await sb.close()
    await backend.destroy(handle)
    assert fake.get(CLAIMS, "agentrl", handle.id) is None
    assert fake.objects("pods", "agentrl", "agents.x-k8s.io/claim-uid") == [] or all(
        p["metadata"].get("deletionTimestamp") for p in fake.objects("pods", "agentrl", "agents.x-k8s.io/claim-uid"))
    assert sum(n for k, n in backend.api.calls.items() if "exec" in k) == 0


async def test_template_changes_are_applied_and_dead_owner_claims_swept(fake_cluster: Any, controller: Any) -> None:
    fake = fake_cluster.fake
    proc = subprocess.Popen(["true"])
    proc.wait()
    dead = Owner(session="s-dead", host=socket.gethostname(), pid=proc.pid, pid_start="0")
    first = fake_cluster.backend(control_plane="agent-sandbox", owner=dead)
    await first.create(fake_cluster.spec, {})
    bigger = fake_cluster.spec.model_copy(update={"memory": "256m"})
    second = fake_cluster.backend(control_plane="agent-sandbox", warm=1)
    handle = await second.create(bigger, {})
    containers = fake.get(TEMPLATES, "agentrl", fake_cluster.pool)["spec"]["podTemplate"]["spec"]["containers"]
    limits = next(c for c in containers if c["name"] == "sandbox")["resources"]["limits"]
    assert limits["memory"] == "256Mi"
    assert await second.sweep() == 1  # the dead process's claim; the live one stays
    assert [c["metadata"]["name"] for c in fake.objects(CLAIMS, "agentrl")] == [handle.id]
    first.plane._live.clear()
    await second.destroy(handle)


def test_rendered_template_pod_spec_is_a_valid_pod() -> None:
    import kubernetes_validate

    from agentrl.sandbox import SandboxSpec
    from agentrl.sandbox.kubernetes.claims import ClaimPlane
    from agentrl.sandbox.kubernetes.pods import Owner as O, PodOptions
    from agentrl.sandbox.kubernetes import KubernetesSandboxConfig

    cfg = KubernetesSandboxConfig(control_plane="agent-sandbox", warm=4)
    opts = PodOptions(namespace="agentrl", pool="default", agent_port=8765, agent_configmap="agentrl-agent-x",
                      key_secret="agentrl-sandbox-key")
    plane = ClaimPlane.__new__(ClaimPlane)
    plane.cfg, plane.opts, plane.owner = cfg, opts, O.from_env("s")
    tmpl = plane.template_manifest(SandboxSpec())
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", **tmpl["spec"]["podTemplate"]["metadata"]},
           "spec": tmpl["spec"]["podTemplate"]["spec"]}
    kubernetes_validate.validate(pod, "1.30.0", strict=True)
    assert set(tmpl["spec"]) == {"podTemplate", "networkPolicyManagement"}
    assert plane.warm_pool_manifest()["spec"] == {"replicas": 4, "sandboxTemplateRef": {"name": "default"}}
