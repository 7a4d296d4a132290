"""The scale harness's fleet (bench_k8s_scale.py): the dev cluster, the hollow nodes and the simulated agent
(`Fleet`: started by `up`, stopped by `down`), and what the harness prints when a phase passes its deadline
(`stall_report`): where every pod of the run stands and why, so that a stalled run (in CI above all, where nothing else
of the cluster survives) says what stalled it instead of only that it timed out.

    pods     by pool, state, phase, node, Ready, being deleted, and the first reason found (a terminated container's
             reason and exit code, a waiting container's reason, or why the scheduler could not place it)
    nodes    each hollow node's Ready condition and whether its kubemark process still runs
    events   the namespace's most frequent event reasons
    pool     the backend's own counters (died_unready, avoidance_lapsed, cold starts, ...) and the nodes it avoids
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "k8s" / "dev-cluster"
K8S_DIR = Path(os.environ.get("AGENTRL_K8S_DIR", Path.home() / ".cache/agentrl/k8s"))
NS = "agentrl-scale"
PORT = 18765
PODS_PER_NODE = 250


def _run(cmd: list[str], **kw: Any) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


class Fleet:
    """The dev cluster, the hollow nodes and the simulated agent: started by `up`, stopped by `down`."""

    def __init__(self, nodes: int, args: argparse.Namespace) -> None:
        self.nodes = nodes
        self.args = args
        self.started_cluster = False
        self.agent: subprocess.Popen[str] | None = None

    def up(self) -> None:
        t = time.perf_counter()
        was_up = subprocess.run(["bash", "-c", f"kubectl --kubeconfig {K8S_DIR}/pki/admin.kubeconfig get --raw "
                                 "/readyz"], capture_output=True).returncode == 0
        kubeconfig = _run(["bash", str(CLUSTER / "up.sh")]).strip().splitlines()[-1]
        self.started_cluster = not was_up
        os.environ["KUBECONFIG"] = kubeconfig
        os.environ["PATH"] = f"{os.environ['PATH']}:{K8S_DIR / 'bin'}"
        for _ in range(120):  # a namespace a previous run deleted must be gone before it is made again
            phase = subprocess.run(["kubectl", "get", "namespace", NS, "-o", "jsonpath={.status.phase}"],
                                   capture_output=True, text=True).stdout
            if phase != "Terminating":
                break
            time.sleep(2)
        subprocess.run(["kubectl", "create", "namespace", NS], capture_output=True)
        self.agent = subprocess.Popen(
            [sys.executable, "-m", "agentrl.testing.sim_agent", "--port", str(PORT), "--agent-p50-ms",
             str(self.args.agent_p50_ms), "--agent-p99-ms", str(self.args.agent_p99_ms), "--command-p50-s",
             str(self.args.command_p50_s)], stdout=subprocess.PIPE, text=True)
        assert self.agent.stdout is not None
        if "listening" not in self.agent.stdout.readline():
            raise SystemExit("the simulated agent did not start")
        env = {**os.environ, "AGENTRL_HOLLOW_POD_IP": "127.0.0.1", "AGENTRL_HOLLOW_MAX_PODS": str(PODS_PER_NODE)}
        subprocess.run(["bash", str(CLUSTER / "hollow-nodes.sh"), "up", str(self.nodes)], check=True, env=env)
        print(f"fleet: cluster {'started' if self.started_cluster else 'reused'}, {self.nodes} hollow nodes of "
              f"{PODS_PER_NODE} pods, simulated agent on 127.0.0.1:{PORT} ({time.perf_counter() - t:.0f} s)",
              flush=True)

    def down(self) -> None:
        subprocess.run(["kubectl", "delete", "namespace", NS, "--wait=false"], capture_output=True)
        subprocess.run(["bash", str(CLUSTER / "hollow-nodes.sh"), "down"])
        if self.agent is not None:
            self.agent.send_signal(signal.SIGTERM)
            out, _ = self.agent.communicate(timeout=30)
            print(f"simulated agent served: {out.strip().splitlines()[-1] if out.strip() else '?'}")
        if self.started_cluster and not self.args.keep_cluster:
            subprocess.run(["bash", str(CLUSTER / "down.sh")])


def _kubectl_json(*args: str) -> dict[str, Any]:
    run = subprocess.run(["kubectl", *args, "-o", "json"], capture_output=True, text=True, timeout=60)
    if run.returncode != 0:
        return {"items": [], "error": run.stderr.strip()[-300:]}
    return json.loads(run.stdout)


def _why(pod: dict[str, Any]) -> str:
    status = pod.get("status") or {}
    inits = [c for c in status.get("initContainerStatuses") or []  # an init container that ended well says nothing
             if (c.get("state") or {}).get("terminated", {}).get("exitCode") != 0]
    for c in (status.get("containerStatuses") or []) + inits:
        state = c.get("state") or {}
        if "terminated" in state:
            t = state["terminated"]
            return f"{c['name']} ended: {t.get('reason', '')} exit {t.get('exitCode')}"
        if "waiting" in state:
            return f"{c['name']} waiting: {state['waiting'].get('reason', '?')}"
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"unschedulable: {str(cond.get('message', ''))[:120]}"
    return status.get("reason", "")


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def stall_report(namespace: str, k8s_dir: Path, backend: Any = None) -> str:
    """A few dozen lines: see the module docstring."""
    lines = []
    pods = _kubectl_json("get", "pods", "-n", namespace)
    groups: Counter[tuple[str, ...]] = Counter()
    for p in pods["items"]:
        meta = p["metadata"]
        labels = meta.get("labels") or {}
        groups[(labels.get("agentrl.io/pool", "-"), labels.get("agentrl.io/state", "-"),
                (p.get("status") or {}).get("phase", "?"), (p.get("spec") or {}).get("nodeName") or "unscheduled",
                "ready" if _ready(p) else "not ready", "deleting" if meta.get("deletionTimestamp") else "",
                _why(p))] += 1
    lines.append(f"pods in {namespace}: {len(pods['items'])} {pods.get('error', '')}")
    lines += [f"  {n:5d}  {' | '.join(k)}" for k, n in groups.most_common(25)]
    nodes = _kubectl_json("get", "nodes", "-l", "agentrl.io/hollow=true")
    for n in nodes["items"]:
        name = n["metadata"]["name"]
        ready = next((c.get("status") for c in n.get("status", {}).get("conditions", []) if c["type"] == "Ready"), "?")
        pid_file = k8s_dir / "run" / "hollow" / f"{name}.pid"
        try:
            os.kill(int(pid_file.read_text()), 0)
            alive = "kubemark runs"
        except (OSError, ValueError):
            alive = "kubemark NOT running"
        lines.append(f"node {name}: Ready={ready}, {alive}, unschedulable={n.get('spec', {}).get('unschedulable')}")
    events = _kubectl_json("get", "events", "-n", namespace)
    reasons = Counter(e.get("reason", "?") for e in events["items"])
    example = {e.get("reason", "?"): str(e.get("message", ""))[:110] for e in events["items"]}
    lines.append(f"events in {namespace} by reason (of {len(events['items'])}), with the last message of each:")
    lines += [f"  {n:5d}  {r}: {example[r]}" for r, n in reasons.most_common(12)]
    if backend is not None and getattr(backend, "plane", None) is not None:
        plane = backend.plane
        lines.append(f"pool counters: {dict(getattr(plane, 'counters', {}))}")
        nodes_of = getattr(plane, "nodes", None)
        if nodes_of is not None:
            lines.append(f"nodes avoided now: {nodes_of.avoided(time.time())}")
    return "\n".join(lines)
