"""Nodes that kill the pool's pods before they are Ready, and keeping new sandbox pods off them for a while.

A node whose pods all end before they serve (a broken container runtime, CNI or image store; at 2,000 pods on the
scale harness's simulated kubelets, two of ten nodes that ended every container as it started) is a black hole: its
pods die at once, so it is always the emptiest node, so the scheduler (which spreads by least allocation) sends it
the next pod, and the refill's whole `max_pending` budget ends up on it. The harness's fill stalled at 506 of 2,000
warm pods for 15 minutes that way. Kubernetes itself keeps such a node schedulable: it is Ready, its kubelet reports.

So the pool counts, per node, its warm pods that died without ever being Ready (`NodeStrikes`). At `NODE_STRIKES`
the node is avoided for `NODE_AVOID_S`: every pod the pool creates then (refill and cold starts) carries a required
node affinity, `metadata.name NotIn [node]` for each avoided node, merged into every term the pod (or its template)
already has. The avoidance expires on its own, so a node that recovers gets pods again.

Two rules keep the avoidance from ever stalling the pool (a required affinity is fixed for the pod's life):
- it only steers pods towards nodes known to work: while no node outside the avoided ones had a pod of the pool turn
  Ready in the last `GOOD_FOR_S`, nothing is avoided (every node bad, or none seen yet: excluding them all would only
  make every new pod pend);
- a warm pod created while a node was avoided, still unscheduled when that avoidance lapsed (the nodes it may use
  are full), is deleted (`lapsed`) so the refill makes it again without the exclusion, instead of it holding the
  refill's `max_pending` budget until `warm_max_idle_s`.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

log = logging.getLogger("agentrl.sandbox")
Obj = dict[str, Any]

NODE_STRIKES = 3  # warm pods of one node dead before Ready that make the node avoided
NODE_AVOID_S = 120.0  # how long new pods avoid it
MAX_AVOIDED = 64  # at most this many nodes at once (the most recently struck): a pod spec stays small
GOOD_FOR_S = 600.0  # a node where a pod turned Ready this recently is one that works


class NodeStrikes:
    """Per node: warm pods that died before they were ever Ready; nodes with NODE_STRIKES of them, until when."""

    def __init__(self, strikes: int = NODE_STRIKES, avoid_s: float = NODE_AVOID_S) -> None:
        self.strikes = strikes
        self.avoid_s = avoid_s
        self._count: dict[str, int] = {}
        self._until: dict[str, float] = {}
        self._good: dict[str, float] = {}  # node -> when a pod of the pool last turned Ready there
        self._pods: dict[str, tuple[frozenset[str], float]] = {}  # pod -> nodes it excludes, when made (unscheduled)

    def ready_on(self, node: str | None, now: float) -> None:
        """A pod of the pool turned Ready on `node`: the node works."""
        if node:
            self._good[node] = now

    def died_unready(self, node: str | None, now: float) -> None:
        if not node:  # never scheduled: no node to blame
            return
        n = self._count.get(node, 0) + 1
        if n < self.strikes:
            self._count[node] = n
            return
        self._count.pop(node, None)
        if self._until.get(node, 0.0) <= now:
            log.warning("kubernetes: node %s ended %d warm pods before they were Ready; new sandbox pods avoid it "
                        "for %.0f s", node, n, self.avoid_s)
        self._until[node] = now + self.avoid_s

    def avoided(self, now: float) -> list[str]:
        for node in [k for k, t in self._until.items() if t <= now]:
            del self._until[node]
        if not self._until or not any(t > now - GOOD_FOR_S and node not in self._until
                                      for node, t in self._good.items()):
            return []  # no node known to work is left to steer pods to
        return sorted(sorted(self._until, key=self._until.__getitem__)[-MAX_AVOIDED:])

    def avoid_for(self, pod: str, now: float) -> list[str]:
        """The nodes a pod made now must exclude; remembered until it is scheduled (`placed`) or gone."""
        nodes = self.avoided(now)
        if nodes:
            self._pods[pod] = (frozenset(nodes), now)
        return nodes

    def placed(self, pod: str) -> None:
        """The pod is scheduled, or gone: its exclusion no longer matters."""
        self._pods.pop(pod, None)

    def lapsed(self, now: float) -> list[str]:
        """Unscheduled pods that exclude a node no longer avoided (forgotten after 3 avoidances' time)."""
        current = set(self.avoided(now))
        for pod in [p for p, (_, t) in self._pods.items() if now - t > 3 * self.avoid_s]:
            del self._pods[pod]
        return [pod for pod, (nodes, _) in self._pods.items() if not nodes <= current]


def avoid_nodes(manifest: Obj, nodes: list[str]) -> Obj:
    """`manifest` with a required node affinity that excludes `nodes` (ANDed into each existing term; terms are
    ORed, so every one of them must exclude the nodes). Unchanged when `nodes` is empty."""
    if not nodes:
        return manifest
    out = copy.deepcopy(manifest)
    na = out["spec"].setdefault("affinity", {}).setdefault("nodeAffinity", {})
    req = na.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = req.get("nodeSelectorTerms") or [{}]
    for term in terms:  # one requirement per node: the API server takes one value per field selector requirement
        term.setdefault("matchFields", []).extend(
            {"key": "metadata.name", "operator": "NotIn", "values": [node]} for node in nodes)
    req["nodeSelectorTerms"] = terms
    return out
