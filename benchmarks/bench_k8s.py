"""Kubernetes backend benchmark on the fake API edge (tests/k8s/fake_k8s.py) with simulated API latency.

Measures, with real agent processes behind the fake kubelet (so the data plane is real):

1. claim throughput: W workers claim from a pre-filled warm pool of P ready pods, all at once, while every API
   request takes `latency` seconds: warm claims per second (including the agent /health check), conflicts, and the
   lease latency p50/max. Repeated for several latencies.
2. API calls per trajectory as the number of tool calls grows: each trajectory leases a sandbox from the shared pool
   (claim), runs K commands through the agent, and is destroyed; calls of every kind (the worker's own refills
   included) divided by trajectories. Target: constant in K (commands never touch the API server). An exec-based
   backend would need K more calls (and a websocket upgrade each).

    .venv/bin/python benchmarks/bench_k8s.py [--workers 4] [--pool 32] [--latencies 0,0.005,0.02] [--quick]

`--real` measures the same on a real cluster instead (KUBECONFIG; the dev cluster of k8s/dev-cluster, namespace
agentrl with k8s/base applied, agentrl/python:latest loaded): see `bench_k8s_real.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrl.sandbox import Sandbox, SandboxSpec
from agentrl.sandbox.kubernetes.pods import is_ready
from agentrl.sandbox.kubernetes import KubernetesBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "k8s"))  # the fake API edge is test code
from fake_k8s import FakeKubernetes  # noqa: E402
from fake_kubelet import FakeKubelet  # noqa: E402

SPEC = SandboxSpec(image="agentrl/python:latest", cpus=0.1, memory="128m", disk="64m")


async def _ready_warm(fake: FakeKubernetes, pool: str) -> int:
    return sum(1 for p in fake.objects("pods", "agentrl", f"agentrl.io/pool={pool},agentrl.io/state=warm")
               if is_ready(p))


async def _fill(fake: FakeKubernetes, pool: str, n: int) -> None:
    filler = KubernetesBackend(api_host=fake.url, pool=pool, warm=n, max_pending=n, keep_warm_on_close=True)
    await filler.warm_up(SPEC)
    while await _ready_warm(fake, pool) < n:
        await asyncio.sleep(0.05)
    await filler.close()


async def claim_throughput(workers: int, pool_size: int, latency: float) -> dict[str, Any]:
    async with FakeKubernetes() as fake:
        kubelet = FakeKubelet(fake, tempfile.mkdtemp(prefix="bench-k8s-"), probe_period_s=0.05)
        pool = f"claims{int(latency * 1000)}"
        await _fill(fake, pool, pool_size)
        backends = [KubernetesBackend(api_host=fake.url, pool=pool, qps=1000, burst=1000) for _ in range(workers)]
        for b in backends:
            await b.sweep()  # start-up (bootstrap + watch) outside the measurement
        fake.latency_s = latency
        per = pool_size // workers
        lat: list[float] = []

        async def one(b: KubernetesBackend) -> Any:
            t = time.perf_counter()
            h = await b.create(SPEC, {})
            lat.append(time.perf_counter() - t)
            return b, h

        t0 = time.perf_counter()
        got = await asyncio.gather(*(one(b) for b in backends for _ in range(per)))
        wall = time.perf_counter() - t0
        warm = sum(1 for _, h in got if h.timings["warm_hit"])
        conflicts = sum(b.plane.counters["claim_conflicts"] for b in backends)
        fake.latency_s = 0.0
        await asyncio.gather(*(b.destroy(h) for b, h in got))
        for b in backends:
            await b.close()
        await kubelet.close()
    return {"latency_ms": latency * 1000, "claims": len(got), "warm_hits": warm, "conflicts": conflicts,
            "claims_per_s": len(got) / wall, "p50_ms": statistics.median(lat) * 1000, "max_ms": max(lat) * 1000}


async def calls_per_trajectory(tool_calls: list[int], trajectories: int) -> list[dict[str, Any]]:
    rows = []
    async with FakeKubernetes() as fake:
        kubelet = FakeKubelet(fake, tempfile.mkdtemp(prefix="bench-k8s-"), probe_period_s=0.05)
        backend = KubernetesBackend(api_host=fake.url, pool="traj", warm=2)
        await backend.warm_up(SPEC)
        while await _ready_warm(fake, "traj") < 2:
            await asyncio.sleep(0.05)
        for k in tool_calls:
            before = sum(fake.calls.values())
            backend_before = dict(backend.api.calls)
            for _ in range(trajectories):
                h = await backend.create(SPEC, {})
                sb = Sandbox(h, SPEC)
                for i in range(k):
                    await sb.exec(f"echo {i}")
                await sb.close()
                await backend.destroy(h)
                while await _ready_warm(fake, "traj") < 2:  # let the refill catch up (it is part of the cost)
                    await asyncio.sleep(0.02)
            used = {key: n - backend_before.get(key, 0) for key, n in backend.api.calls.items()
                    if n != backend_before.get(key, 0)}
            rows.append({"tool_calls": k, "api_calls_per_traj": (sum(fake.calls.values()) - before) / trajectories,
                         "exec_based_would_be": k + 2, "by_verb": {key: n / trajectories for key, n in
                                                                   sorted(used.items())}})
        await backend.close()
        await kubelet.close()
    return rows


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--pool", type=int, default=32)
    p.add_argument("--latencies", default="0,0.005,0.02")
    p.add_argument("--trajectories", type=int, default=6)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--real", action="store_true", help="on the cluster of $KUBECONFIG (see bench_k8s_real.py)")
    a, rest = p.parse_known_args()
    if a.real:
        from bench_k8s_real import main as real_main

        await real_main(rest)
        return
    logging.basicConfig(level=logging.WARNING)
    latencies = [float(x) for x in a.latencies.split(",")]
    tool_calls = [1, 10, 50] if a.quick else [1, 10, 50, 200]
    print(f"claim throughput: {a.workers} workers, warm pool of {a.pool} ready pods, all claims at once")
    print(f"{'API latency':>12} {'claims':>7} {'warm':>5} {'conflicts':>9} {'claims/s':>9} {'p50 ms':>8} {'max ms':>8}")
    for lat in latencies:
        r = await claim_throughput(a.workers, a.pool, lat)
        print(f"{r['latency_ms']:>10.0f}ms {r['claims']:>7} {r['warm_hits']:>5} {r['conflicts']:>9} "
              f"{r['claims_per_s']:>9.1f} {r['p50_ms']:>8.1f} {r['max_ms']:>8.1f}")
    print(f"\nAPI calls per trajectory ({a.trajectories} trajectories per row, warm pool of 2, refills included)")
    print(f"{'tool calls':>10} {'API calls/traj':>15} {'exec-based':>11}  by verb (backend side)")
    for r in await calls_per_trajectory(tool_calls, a.trajectories):
        verbs = ", ".join(f"{k}={v:g}" for k, v in r["by_verb"].items())
        print(f"{r['tool_calls']:>10} {r['api_calls_per_traj']:>15.2f} {r['exec_based_would_be']:>11}  {verbs}")


if __name__ == "__main__":
    asyncio.run(main())
