"""A node that ends the pool's pods before they are Ready (agentrl/sandbox/kubernetes/nodes.py): the pool stops sending
it new pods for a while, instead of feeding it the whole refill (the scale harness's fill stalled at 506 of 2,000 warm
pods for 15 minutes when two of ten simulated kubelets ended every container as it started)."""

from __future__ import annotations

import copy
import time
from typing import Any

from agentrl.sandbox import SandboxSpec
from agentrl.sandbox.kubernetes.backend import KubernetesSandboxConfig
from agentrl.sandbox.kubernetes.nodes import NodeStrikes, avoid_nodes
from agentrl.sandbox.kubernetes.pods import Owner, PodOptions, pod_spec, spec_hash
from agentrl.sandbox.kubernetes.pool import PodPool

SPEC = SandboxSpec(image="agentrl/python:latest", cpus=0.1, memory="128m", disk="64m")


class DeletingApi:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        assert method == "DELETE", (method, path)
        self.deleted.append(path.rsplit("/", 1)[1])
        return {}


def _pool(template: Any = None) -> tuple[PodPool, DeletingApi]:
    cfg = KubernetesSandboxConfig()
    opts = PodOptions(namespace=cfg.namespace, pool=cfg.pool, agent_port=cfg.agent_port,
                      agent_configmap="agentrl-agent-0123456789ab", key_secret=cfg.key_secret,
                      runtime_class=None, image_pull_policy="IfNotPresent", template=template)
    pool = PodPool(None, cfg, opts, Owner(session="s1", host="h", pid=1, pid_start="1"))  # type: ignore[arg-type]
    api = DeletingApi()
    pool.api = api  # type: ignore[assignment]
    return pool, api


def _warm(pool: PodPool, name: str, node: str, *, ready: bool, ended: bool) -> dict[str, Any]:
    body = pod_spec(SPEC, pool.opts, deadline_s=SPEC.ttl_s + 900)
    m = pool._manifest(SPEC, copy.deepcopy(body), spec_hash(body), {}, claimed=False)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    m["metadata"].update(name=name, resourceVersion="1", creationTimestamp=now)
    m["spec"]["nodeName"] = node
    m["status"] = {"phase": "Running", "podIP": "10.0.0.1", "startTime": now,
                   "conditions": [{"type": "Ready", "status": str(ready)}],
                   "containerStatuses": [{"name": c["name"], "state": {"running": {}}} for c in body["containers"]]}
    if ended:  # what the harness's bad kubelets did: every container ended at once, exit 0
        m["status"]["phase"] = "Succeeded"
        m["status"]["containerStatuses"] = [{"name": c["name"], "state": {"terminated": {"exitCode": 0}}}
                                            for c in body["containers"]]
        m["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "PodCompleted"}]
    return m


def _excluded(manifest: dict[str, Any]) -> list[list[str]]:
    """Per required term: the node names it excludes by field."""
    terms = (((manifest["spec"].get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    return [[v for f in t.get("matchFields", []) if f["key"] == "metadata.name" and f["operator"] == "NotIn"
             for v in f["values"]] for t in terms]


def _new_warm(pool: PodPool) -> dict[str, Any]:
    body = pod_spec(SPEC, pool.opts, deadline_s=SPEC.ttl_s + 900)
    return pool._manifest(SPEC, body, spec_hash(body), {}, claimed=False)


async def test_a_node_that_ends_warm_pods_before_ready_gets_no_new_pods_for_a_while() -> None:
    pool, api = _pool()
    for i in range(3):  # bad: ended before it was ever Ready
        pool._observe(f"bad-{i}", _warm(pool, f"bad-{i}", "node-bad", ready=False, ended=False))
        pool._observe(f"bad-{i}", _warm(pool, f"bad-{i}", "node-bad", ready=False, ended=True))
    for i in range(3):  # served (was Ready), then ended: not the node's fault as far as the pool can tell
        pool._observe(f"ok-{i}", _warm(pool, f"ok-{i}", "node-ok", ready=True, ended=False))
        pool._observe(f"ok-{i}", _warm(pool, f"ok-{i}", "node-ok", ready=False, ended=True))
    now = time.time()
    await pool._recycle(now)
    assert sorted(api.deleted) == sorted([f"bad-{i}" for i in range(3)] + [f"ok-{i}" for i in range(3)])
    assert pool.counters["died_unready"] == 3
    assert _excluded(_new_warm(pool)) == [["node-bad"]]
    pool.nodes._until["node-bad"] = now - 1  # the avoidance ran out: the node gets pods again
    assert _excluded(_new_warm(pool)) == []


def test_two_strikes_are_not_enough_and_strikes_count_per_node() -> None:
    strikes = NodeStrikes(strikes=3, avoid_s=60)
    strikes.ready_on("c", 100.0)  # a node that works, to steer pods to
    for node in ("a", "a", "b", "b", None):
        strikes.died_unready(node, 100.0)
    assert strikes.avoided(100.0) == []
    strikes.died_unready("b", 100.0)
    assert strikes.avoided(100.0) == ["b"] and strikes.avoided(159.0) == ["b"] and strikes.avoided(161.0) == []


def test_the_exclusion_joins_every_term_of_the_users_own_node_affinity() -> None:
    """Required terms are ORed: an exclusion added to one term only would let the pod onto the node through another."""
    own = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]},
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["cpu"]}]}]}}
    manifest = {"spec": {"affinity": {"nodeAffinity": own}, "containers": []}}
    out = avoid_nodes(manifest, ["n1", "n2"])
    assert _excluded(out) == [["n1", "n2"], ["n1", "n2"]]
    required = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    terms = required["nodeSelectorTerms"]
    assert [t["matchExpressions"][0]["values"] for t in terms] == [["gpu"], ["cpu"]]
    assert all(len(f["values"]) == 1 for t in terms for f in t["matchFields"])  # the API server's rule for fields
    assert "matchFields" not in own["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert avoid_nodes(manifest, []) is manifest


async def test_when_every_node_that_worked_is_struck_none_is_avoided() -> None:
    """Excluding every node would only make every new pod pend (a required affinity is fixed for the pod's life): the
    small scale run has two hollow nodes. The avoidance only steers pods towards a node known to work."""
    pool, api = _pool()
    for node in ("node-a", "node-b"):
        pool._observe(f"{node}-ok", _warm(pool, f"{node}-ok", node, ready=True, ended=False))
    for node in ("node-a", "node-b"):
        for i in range(3):
            pool._observe(f"{node}-{i}", _warm(pool, f"{node}-{i}", node, ready=False, ended=True))
        await pool._recycle(time.time())
        for i in range(3):  # the watch's delete events
            pool._observe(f"{node}-{i}", None)
        if node == "node-a":  # node-b still works: node-a is avoided
            assert _excluded(_new_warm(pool)) == [["node-a"]]
    assert pool.counters["died_unready"] == 6
    assert _excluded(_new_warm(pool)) == []
    strikes = NodeStrikes(strikes=1, avoid_s=60)
    strikes.died_unready("a", 100.0)
    assert strikes.avoided(100.0) == []  # no node seen working yet: nothing to steer towards
    strikes.ready_on("b", 100.0 - 601)
    assert strikes.avoided(100.0) == []  # b worked, but too long ago to count
    strikes.ready_on("b", 100.0)
    assert strikes.avoided(100.0) == ["a"]


async def test_a_warm_pod_still_unscheduled_when_its_avoidance_lapses_is_made_again() -> None:
    """A pod made while a node was avoided keeps excluding it: if it still pends when the avoidance lapses (the nodes
    it may use are full), it would hold the refill's max_pending budget until warm_max_idle_s. It is deleted, so the
    refill makes it again without the exclusion; a pod that was scheduled meanwhile is left alone."""
    pool, api = _pool()
    pool._observe("ok", _warm(pool, "ok", "node-ok", ready=True, ended=False))
    for i in range(3):
        pool._observe(f"bad-{i}", _warm(pool, f"bad-{i}", "node-bad", ready=False, ended=True))
    now = time.time()
    await pool._recycle(now)
    for i in range(3):  # the watch's delete events
        pool._observe(f"bad-{i}", None)
    made = {}
    for key in ("pends", "placed"):
        m = _new_warm(pool)
        assert _excluded(m) == [["node-bad"]]
        m["metadata"].update(resourceVersion="7", creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                   time.gmtime()))
        m["status"] = {"phase": "Pending"}
        made[key] = m["metadata"]["name"]
        if key == "placed":
            m["spec"]["nodeName"] = "node-ok"
        pool._observe(made[key], m)
    api.deleted.clear()
    await pool._recycle(now + 1)
    assert api.deleted == []  # still avoided: both pods are right as they are
    pool.nodes._until["node-bad"] = now  # the avoidance lapsed
    await pool._recycle(now + 2)
    assert api.deleted == [made["pends"]]
    assert pool.counters["avoidance_lapsed"] == 1 and pool.counters["died_unready"] == 3
