"""Kubernetes backend benchmark on a real cluster (`bench_k8s.py --real`): the numbers the fake API cannot give.

    export KUBECONFIG=$(k8s/dev-cluster/up.sh | tail -1)
    k8s/dev-cluster/load-image.sh agentrl/python:latest && kubectl apply -k k8s/base
    .venv/bin/python benchmarks/bench_k8s.py --real [--cold 8] [--pool 8] [--sandboxes 32]

1. pod cold start: create -> agent answering, one pod at a time (no warm pool), p50/p99.
2. warm claim: a pre-filled pool, one claim at a time (claim patch + agent /health), p50/p99; then 4 workers claiming
   a pool of P all at once: claims/s and conflicts (real resourceVersion conflicts from the API server).
3. API calls per trajectory at 1/10/50 tool calls (client-side count of this worker's calls, refills included).
4. exec round trip via the pod IP (the agent, keep-alive HTTP), against `kubectl exec` of the same command through
   the API server and kubelet (the baseline an exec-based backend pays per tool call), side by side.
   `--compare-agent OLD`: only this, through an older agent (agent.py, agent.pyz or an agent package dir) and through
   this tree's, one pod each, alternated `--rounds` times.
5. control-plane CPU during a run of N sandboxes at once (each runs 10 commands): CPU seconds of kube-apiserver, etcd
   and the kubelet (+ its dockerd), read from /proc for the PIDs the dev cluster recorded (dev cluster only).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from agentrl.sandbox import Sandbox, SandboxSpec
from agentrl.sandbox.kubernetes import KubernetesBackend
from agentrl.sandbox.kubernetes.pods import is_ready

NS = os.environ.get("AGENTRL_K8S_NAMESPACE", "agentrl")
SPEC = SandboxSpec(image=os.environ.get("AGENTRL_K8S_IMAGE", "agentrl/python:latest"), cpus=0.05, memory="128m",
                   disk="64m")
CLUSTER_DIR = Path(os.environ.get("AGENTRL_K8S_DIR", Path.home() / ".cache/agentrl/k8s"))


def backend(pool: str, **kw: Any) -> KubernetesBackend:
    return KubernetesBackend(namespace=NS, pool=pool, image_pull_policy="IfNotPresent", **kw)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def ms(xs: list[float]) -> str:
    return f"p50 {statistics.median(xs) * 1000:7.1f} ms   p99 {pct(xs, 0.99) * 1000:7.1f} ms   (n={len(xs)})"


async def _ready_warm(b: KubernetesBackend) -> int:
    pods = b.plane.informer.objects.values()
    return sum(1 for p in pods if (p["metadata"].get("labels") or {}).get("agentrl.io/state") == "warm"
               and is_ready(p) and not p["metadata"].get("deletionTimestamp"))


async def _fill(pool: str, n: int) -> None:
    filler = backend(pool, warm=n, max_pending=n, keep_warm_on_close=True)
    await filler.warm_up(SPEC)
    while await _ready_warm(filler) < n:
        await asyncio.sleep(0.1)
    await filler.close()


async def cold_start(n: int) -> list[float]:
    b = backend("bench-cold")
    out = []
    for _ in range(n):
        t = time.perf_counter()
        h = await b.create(SPEC, {})
        out.append(time.perf_counter() - t)
        await b.destroy(h)
    await b.close()
    return out


async def warm_claims(n: int) -> list[float]:
    await _fill("bench-warm", n)
    b = backend("bench-warm")
    await b.sweep()  # connect + watch outside the measurement
    got, out = [], []
    for _ in range(n):
        t = time.perf_counter()
        h = await b.create(SPEC, {})
        out.append(time.perf_counter() - t)
        assert h.timings["warm_hit"], "the pool was filled: every claim must be warm"
        got.append(h)
    await asyncio.gather(*(b.destroy(h) for h in got))
    await b.close()
    return out


async def claims_per_s(workers: int, pool: int) -> dict[str, Any]:
    await _fill("bench-race", pool)
    bs = [backend("bench-race") for _ in range(workers)]
    for b in bs:
        await b.sweep()
    t0 = time.perf_counter()
    got = await asyncio.gather(*(b.create(SPEC, {}) for b in bs for _ in range(pool // workers)))
    wall = time.perf_counter() - t0
    conflicts = sum(b.plane.counters["claim_conflicts"] for b in bs)
    warm = sum(1 for h in got if h.timings["warm_hit"])
    assert len({h.id for h in got}) == len(got)
    await asyncio.gather(*(b.destroy(h) for b in bs for h in got if h.id in b.plane._live))
    for b in bs:
        await b.close()
    return {"claims": len(got), "warm": warm, "conflicts": conflicts, "per_s": len(got) / wall, "wall_s": wall}


async def calls_per_trajectory(tool_calls: list[int], trajectories: int) -> list[tuple[int, float, dict]]:
    b = backend("bench-traj", warm=2)
    await b.warm_up(SPEC)
    while await _ready_warm(b) < 2:
        await asyncio.sleep(0.1)
    rows = []
    for k in tool_calls:
        before = dict(b.api.calls)
        for _ in range(trajectories):
            h = await b.create(SPEC, {})
            sb = Sandbox(h, SPEC)
            for i in range(k):
                await sb.exec(f"echo {i}")
            await sb.close()
            await b.destroy(h)
            while await _ready_warm(b) < 2:
                await asyncio.sleep(0.05)
        used = {key: (n - before.get(key, 0)) / trajectories for key, n in b.api.calls.items()
                if n != before.get(key, 0)}
        rows.append((k, sum(used.values()), used))
    await b.close()
    return rows


async def agent_round_trip(n: int, agent_file: Path | None) -> list[float]:
    """exec `true` n times through the agent of one fresh pod (cold start not timed)."""
    b = backend("bench-cmp", agent_file=agent_file)
    h = await b.create(SPEC, {})
    sb = Sandbox(h, SPEC)
    out = []
    try:
        for _ in range(n):
            t = time.perf_counter()
            r = await sb.exec("true")
            out.append(time.perf_counter() - t)
            assert r.exit_code == 0, r
    finally:
        await sb.close()
        await b.destroy(h)
        await b.close()
    return out


async def compare_agents(old: Path, n: int, rounds: int) -> None:
    print("| agent | round | exec round trip via pod IP |\n| --- | --- | --- |")
    for r in range(rounds):
        for name, agent_file in (("old", old), ("this tree", None)):
            print(f"| {name} | {r + 1} | {ms(await agent_round_trip(n, agent_file))} |", flush=True)


async def exec_round_trip(n: int) -> tuple[list[float], list[float]]:
    b = backend("bench-exec")
    h = await b.create(SPEC, {})
    sb = Sandbox(h, SPEC)
    agent = []
    for _ in range(n):
        t = time.perf_counter()
        r = await sb.exec("true")
        agent.append(time.perf_counter() - t)
        assert r.exit_code == 0, r
    kube = []
    for _ in range(max(5, n // 10)):
        t = time.perf_counter()
        await asyncio.to_thread(subprocess.run, ["kubectl", "-n", NS, "exec", h.id, "-c", "sandbox", "--", "true"],
                                check=True, capture_output=True)
        kube.append(time.perf_counter() - t)
    await sb.close()
    await b.destroy(h)
    await b.close()
    return agent, kube


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def _components() -> dict[str, int]:
    out = {}
    for name in ("kube-apiserver", "etcd", "kubelet", "dockerd", "kube-controller-manager", "kube-scheduler"):
        f = CLUSTER_DIR / "run" / f"{name}.pid"
        if f.exists():
            out[name] = int(f.read_text())
    return out


async def control_plane_cpu(n: int) -> dict[str, Any]:
    procs = _components()
    b = backend("bench-cpu", max_pending=n)
    await b.sweep()
    before = {k: _cpu_s(p) for k, p in procs.items()}
    t0 = time.perf_counter()

    async def one() -> None:
        h = await b.create(SPEC, {})
        sb = Sandbox(h, SPEC)
        for i in range(10):
            await sb.exec(f"echo {i} > f && cat f")
        await sb.close()
        await b.destroy(h)

    await asyncio.gather(*(one() for _ in range(n)))
    wall = time.perf_counter() - t0
    used = {k: _cpu_s(p) - before[k] for k, p in procs.items()}
    await b.close()
    return {"wall_s": wall, "cpu_s": used}


async def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="bench_k8s.py --real")
    p.add_argument("--cold", type=int, default=8)
    p.add_argument("--pool", type=int, default=8)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--execs", type=int, default=200)
    p.add_argument("--trajectories", type=int, default=3)
    p.add_argument("--sandboxes", type=int, default=32)
    p.add_argument("--compare-agent", type=Path, help="only exec round trips: this older agent vs this tree's")
    p.add_argument("--rounds", type=int, default=3, help="--compare-agent: alternations of the two agents")
    a = p.parse_args(argv)
    if a.compare_agent:
        await compare_agents(a.compare_agent, a.execs, a.rounds)
        return
    print(f"real cluster ({os.environ.get('KUBECONFIG', '~/.kube/config')}), namespace {NS}, sandbox {SPEC.cpus} CPU "
          f"{SPEC.memory}")
    print(f"pod cold start (create -> agent answers):  {ms(await cold_start(a.cold))}")
    print(f"warm claim (claim patch -> agent answers): {ms(await warm_claims(a.pool))}")
    r = await claims_per_s(a.workers, a.pool)
    print(f"{a.workers} workers claiming a pool of {a.pool} at once: {r['per_s']:.1f} claims/s "
          f"({r['claims']} claims, {r['warm']} warm, {r['conflicts']} resourceVersion conflicts, {r['wall_s']:.2f} s)")
    for k, total, by in await calls_per_trajectory([1, 10, 50], a.trajectories):
        verbs = ", ".join(f"{v}={n:g}" for v, n in sorted(by.items()))
        print(f"API calls per trajectory at {k:>2} tool calls: {total:.2f}  ({verbs}); exec-based: {k + 2}")
    agent, kube = await exec_round_trip(a.execs)
    print(f"exec round trip, agent via pod IP: {ms(agent)}")
    print(f"exec round trip, kubectl exec:     {ms(kube)}   ratio of medians "
          f"{statistics.median(kube) / statistics.median(agent):.0f}x")
    if _components():
        r = await control_plane_cpu(a.sandboxes)
        cpu = ", ".join(f"{k} {v:.1f} s ({100 * v / r['wall_s']:.0f}%)" for k, v in r["cpu_s"].items())
        print(f"{a.sandboxes} sandboxes at once, 10 commands each, {r['wall_s']:.1f} s wall; CPU: {cpu}")
