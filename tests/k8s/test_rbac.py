"""The Role in k8s/base (and the agent-sandbox overlay's) allows every API call the backend makes, and nothing in
the backend needs more: the calls are recorded by the backend's own API edge while it works against the fake."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml

from agentrl.sandbox import Sandbox
from agentrl.sandbox.kubernetes.pods import is_ready
from fake_kubelet import FakeAgentSandboxController

K8S = Path(__file__).resolve().parents[2] / "k8s"
GROUPS = {"sandboxclaims": "extensions.agents.x-k8s.io", "sandboxtemplates": "extensions.agents.x-k8s.io",
          "sandboxwarmpools": "extensions.agents.x-k8s.io", "sandboxes": "agents.x-k8s.io"}


def _rules(*files: str) -> list[dict]:
    out = []
    for f in files:
        for doc in yaml.safe_load_all((K8S / f).read_text()):
            if doc and doc["kind"] == "Role" and doc["metadata"]["name"].startswith("agentrl-rollout"):
                out += doc["rules"]
    return out


def _allowed(rules: list[dict], verb: str, resource: str) -> bool:
    return any(verb in r["verbs"] and resource in r["resources"] and GROUPS.get(resource, "") in r["apiGroups"]
               and not r.get("resourceNames") for r in rules) or any(
        verb in r["verbs"] and resource in r["resources"] and r.get("resourceNames") for r in rules)


async def _exercise(cluster: Any, **fields: Any) -> dict[str, int]:
    backend = cluster.backend(warm=1, **fields)
    await backend.warm_up(cluster.spec)
    if backend.config.control_plane == "pods":  # let the warm pod become ready, so one create is a claim
        async with asyncio.timeout(30):
            while not any(is_ready(p) for p in await cluster.pods("agentrl.io/state=warm")):
                await asyncio.sleep(0.05)
    handles = [await backend.create(cluster.spec, {}) for _ in range(2)]
    sb = Sandbox(handles[0], cluster.spec)
    await sb.exec("true")
    await sb.close()
    await backend.destroy(handles[0])
    await backend.sweep()
    await backend.close()
    return dict(backend.api.calls)


async def test_base_role_allows_every_call_of_the_pods_plane(fake_cluster: Any) -> None:
    calls = await _exercise(fake_cluster)
    rules = _rules("base/rbac.yaml")
    assert {"create pods", "patch pods", "delete pods", "watch pods", "list pods"} <= set(calls)
    for key in calls:
        verb, resource = key.split(" ")
        assert _allowed(rules, verb, resource), f"the backend called {key!r}, which k8s/base's Role does not allow"


async def test_agent_sandbox_roles_allow_every_call_of_the_claim_plane(fake_cluster: Any) -> None:
    FakeAgentSandboxController(fake_cluster.fake)
    calls = await _exercise(fake_cluster, control_plane="agent-sandbox")
    rules = _rules("base/rbac.yaml", "overlays/agent-sandbox/rbac.yaml")
    assert {"create sandboxclaims", "delete sandboxclaims", "get sandboxes"} <= set(calls)
    for key in calls:
        verb, resource = key.split(" ")
        assert _allowed(rules, verb, resource), f"the backend called {key!r}, which the Roles do not allow"
