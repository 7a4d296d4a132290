"""Sandbox latency: lease from a warm pool vs a cold start, and exec round-trips through the in-sandbox agent vs a
bare host process spawn. Prints a markdown table (see BENCHMARKS.md for recorded numbers).

    python benchmarks/bench_sandbox.py [--backend local] [--leases 30] [--execs 200] [--cpus 0.05]
    python benchmarks/bench_sandbox.py --separation 600   # local: exec round trip, commands in their own cgroup
                                                          # vs one shared budget, interleaved (same machine load)

--leases 0 skips the lease measurements; --cpus sets the sandbox's CPU quota (cgroup cpu.max / cfs_quota_us over a
100 ms period): at 0.05 every exec whose agent + command CPU passes 5 ms in a period waits for the next period.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import tempfile
import time

from agentrl.sandbox import SandboxPool, SandboxSpec


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _row(name: str, values: list[float], base: float | None = None) -> str:
    p50 = statistics.median(values) * 1000
    ratio = f"{p50 / base:.2f}x" if base else "1.00x"
    return f"| {name} | {len(values)} | {p50:.2f} | {_pct(values, 0.99) * 1000:.2f} | {ratio} |"


async def bench_leases(backend: str, spec: SandboxSpec, n: int, state_dir: str) -> dict[str, list[float]]:
    """Time from entering `pool.lease()` to holding a ready sandbox; warm: the pool was filled first."""
    out: dict[str, list[float]] = {"warm": [], "cold": [], "release": []}
    async with SandboxPool(backend, spec, warm=4, max_sandboxes=8, state_dir=state_dir) as pool:
        for _ in range(n):
            await pool.fill(timeout_s=60)
            t0 = time.perf_counter()
            async with pool.lease():
                t1 = time.perf_counter()
            out["warm"].append(t1 - t0)
            out["release"].append(time.perf_counter() - t1)
    async with SandboxPool(backend, spec, warm=0, max_sandboxes=8, state_dir=state_dir) as pool:
        for _ in range(n):
            t0 = time.perf_counter()
            async with pool.lease():
                out["cold"].append(time.perf_counter() - t0)
    return out


async def bench_exec(backend: str, spec: SandboxSpec, n: int, state_dir: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"agent_health": [], "agent_argv": [], "agent_sh": [], "host_run": [],
                                   "host_async": []}
    async with SandboxPool(backend, spec, max_sandboxes=1, state_dir=state_dir) as pool:
        async with pool.lease() as sb:
            for _ in range(20):  # warm up the connection and the page cache
                await sb.exec(["true"])
            for _ in range(n):
                t0 = time.perf_counter()
                await sb.health()
                out["agent_health"].append(time.perf_counter() - t0)
            for key, cmd in (("agent_argv", ["true"]), ("agent_sh", "true")):
                for _ in range(n):
                    t0 = time.perf_counter()
                    await sb.exec(cmd)
                    out[key].append(time.perf_counter() - t0)
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(["true"], check=True)
        out["host_run"].append(time.perf_counter() - t0)
    for _ in range(n):
        t0 = time.perf_counter()
        proc = await asyncio.create_subprocess_exec("true")
        await proc.wait()
        out["host_async"].append(time.perf_counter() - t0)
    return out


async def bench_separation(n: int, state_dir: str) -> dict[str, list[float]]:
    """exec ['true'] alternately in a resource-separated local sandbox and in one sharing its budget with the agent."""
    from agentrl.sandbox.local import LocalBackend

    out: dict[str, list[float]] = {"separated": [], "shared": []}
    spec = SandboxSpec()
    async with SandboxPool(LocalBackend(state_dir=state_dir), spec, max_sandboxes=1) as sep_pool, \
            SandboxPool(LocalBackend(state_dir=state_dir, separate_resources=False), spec, max_sandboxes=1) as sh_pool:
        async with sep_pool.lease() as separated, sh_pool.lease() as shared:
            if not separated.resources_separated:
                raise SystemExit("--separation needs host root and cgroup limits (resources_separated is false here)")
            pair = (("separated", separated), ("shared", shared))
            for _ in range(20):
                for _, sb in pair:
                    await sb.exec(["true"])
            for i in range(n):
                for key, sb in pair if i % 2 else pair[::-1]:
                    t0 = time.perf_counter()
                    await sb.exec(["true"])
                    out[key].append(time.perf_counter() - t0)
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="local")
    ap.add_argument("--leases", type=int, default=30)
    ap.add_argument("--execs", type=int, default=200)
    ap.add_argument("--cpus", type=float, default=None, help="the sandbox's CPU quota (default: SandboxSpec's)")
    ap.add_argument("--separation", type=int, default=0, help="only the separated-vs-shared exec comparison, N each")
    args = ap.parse_args()
    if args.separation:
        with tempfile.TemporaryDirectory(prefix="agrl-bench-", dir="/tmp") as state_dir:
            sep = await bench_separation(args.separation, state_dir)
        shared = statistics.median(sep["shared"]) * 1000
        print("| measurement | N | p50 ms | p99 ms | ratio (p50) |\n| --- | --- | --- | --- | --- |")
        print(_row("exec ['true'], agent and commands share one budget", sep["shared"]))
        print(_row("exec ['true'], commands in their own cgroup", sep["separated"], shared))
        return
    spec = SandboxSpec() if args.cpus is None else SandboxSpec(cpus=args.cpus)
    with tempfile.TemporaryDirectory(prefix="agrl-bench-", dir="/tmp") as state_dir:
        leases = await bench_leases(args.backend, spec, args.leases, state_dir) if args.leases else {}
        execs = await bench_exec(args.backend, spec, args.execs, state_dir)
    host = statistics.median(execs["host_run"]) * 1000
    print(f"backend={args.backend}  spec: cpus={spec.cpus} memory={spec.memory} pids={spec.pids}\n")
    print("| measurement | N | p50 ms | p99 ms | ratio (p50) |")
    print("| --- | --- | --- | --- | --- |")
    if leases:
        warm = statistics.median(leases["warm"]) * 1000
        print(_row("lease, warm pool (acquire + health check)", leases["warm"]))
        print(_row("lease, cold start (create + agent ready)", leases["cold"], warm))
        print(_row("lease release (destroy)", leases["release"], warm))
    print(_row("host: subprocess.run(['true'])", execs["host_run"]))
    print(_row("host: asyncio.create_subprocess_exec('true')", execs["host_async"], host))
    print(_row("agent GET /health round-trip (transport only)", execs["agent_health"], host))
    print(_row("agent exec ['true'] round-trip", execs["agent_argv"], host))
    print(_row("agent exec 'true' (via /bin/sh -c) round-trip", execs["agent_sh"], host))


if __name__ == "__main__":
    asyncio.run(main())
