"""Docker sandboxes, measured side by side in one run on this machine (prints a markdown table).

1. exec round-trip of the same command in the same container: through the in-sandbox agent (unix socket, keep-alive)
   vs `docker exec` (Docker SDK `container.exec_run`). Target: the agent at least 20x faster (p50).
2. lease latency: a lease from a warm pool (ready sandbox, health-checked) vs a cold container start (create + start
   + agent ready). Target: warm p50 under 10 ms.
3. throughput: N concurrent sandboxes (default 32) each running short commands back to back: execs/s, and the CPU
   time dockerd used meanwhile (it is not on the hot path, so this should be ~0).

    python benchmarks/bench_docker.py --compare-agent OLD_AGENT.py [--execs 300] [--docker-execs 60] [--rounds 2]
        # only (1), through OLD_AGENT.py and this tree's agent in turn (same load), `rounds` times each
    python benchmarks/bench_docker.py --separation 600 [--cpus 1]
        # only exec ['true'] in a resource-separated container (commands in the sandbox's `commands` cgroup) and in
        # one sharing the container's budget with its agent, alternated (same load): p50/p99 and their ratio
    python benchmarks/bench_docker.py [--execs 300] [--docker-execs 60] [--leases 40] [--cold 15]
                                      [--concurrency 32] [--seconds 10] [--json FILE]

Needs a running Docker Engine and the image (`.ci/docker-setup.sh`). Creates and removes its own containers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import docker

from agentrl.sandbox import Sandbox, SandboxPool, SandboxSpec
from agentrl.sandbox.docker import DockerBackend

CMD = "echo hi"
RUN_ID = f"bench-{uuid.uuid4().hex[:8]}"


def summary(xs: list[float]) -> dict[str, float]:
    ordered = sorted(xs)
    return {"n": len(ordered), "p50": statistics.median(ordered),
            "p99": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))], "mean": statistics.fmean(ordered)}


def ms(x: float) -> str:
    return f"{x * 1000:.2f} ms"


def dockerd_cpu_s() -> float | None:
    """User+system CPU seconds used so far by the local dockerd (None when it cannot be read)."""
    try:
        pid = int(Path("/var/run/docker.pid").read_text())
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except (OSError, ValueError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def bench_exec(backend: DockerBackend, spec: SandboxSpec, n_agent: int, n_docker: int) -> dict[str, Any]:
    handle = await backend.create(spec, {"agentrl.run_id": RUN_ID})
    sb = Sandbox(handle, spec)
    client = docker.from_env()
    try:
        container = client.containers.get(handle.id)
        for _ in range(10):  # warm up both paths
            await sb.exec(CMD)
        container.exec_run(["/bin/sh", "-c", CMD])
        agent = []
        for _ in range(n_agent):
            t0 = time.perf_counter()
            r = await sb.exec(CMD)
            agent.append(time.perf_counter() - t0)
            assert r.stdout == "hi\n", r
        dexec = []
        for _ in range(n_docker):  # blocking on purpose: measures the call alone, nothing else is running
            t0 = time.perf_counter()
            r2 = container.exec_run(["/bin/sh", "-c", CMD])
            dexec.append(time.perf_counter() - t0)
            assert r2.output == b"hi\n", r2
    finally:
        client.close()
        await sb.close()
        await backend.destroy(handle)
    return {"agent": summary(agent), "docker_exec": summary(dexec)}


async def bench_leases(spec: SandboxSpec, n_leases: int, n_cold: int) -> dict[str, Any]:
    warm_n = 4
    async with SandboxPool(backend="docker", spec=spec, warm=warm_n, max_sandboxes=warm_n + 1, run_id=RUN_ID,
                           sweep_on_start=False) as pool:
        warm = []
        for _ in range(n_leases):
            while pool.stats()["warm_ready"] < warm_n:  # measure warm hits: let the refill catch up (not timed)
                await asyncio.sleep(0.01)
            t0 = time.perf_counter()
            async with pool.lease():
                warm.append(time.perf_counter() - t0)
        backend = pool.backend
        cold, phases = [], {"create_s": [], "start_s": [], "agent_ready_s": []}
        for _ in range(n_cold):
            t0 = time.perf_counter()
            handle = await backend.create(spec, {"agentrl.run_id": RUN_ID})
            cold.append(time.perf_counter() - t0)
            for k, values in phases.items():
                values.append(handle.timings[k])
            await backend.destroy(handle)
    return {"warm_lease": summary(warm), "cold_start": summary(cold),
            "cold_phases_p50_s": {k: statistics.median(v) for k, v in phases.items()}}


async def bench_throughput(backend: DockerBackend, spec: SandboxSpec, n: int, seconds: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    handles = await asyncio.gather(*(backend.create(spec, {"agentrl.run_id": RUN_ID}) for _ in range(n)))
    startup = time.perf_counter() - t0
    sandboxes = [Sandbox(h, spec) for h in handles]
    counts = [0] * n

    async def loop(i: int, sb: Sandbox, until: float) -> None:
        while time.perf_counter() < until:
            r = await sb.exec(CMD)
            assert r.exit_code == 0, r
            counts[i] += 1

    try:
        cpu0 = dockerd_cpu_s()
        t1 = time.perf_counter()
        await asyncio.gather(*(loop(i, sb, t1 + seconds) for i, sb in enumerate(sandboxes)))
        elapsed = time.perf_counter() - t1
        cpu1 = dockerd_cpu_s()
    finally:
        for sb in sandboxes:
            await sb.close()
        await asyncio.gather(*(backend.destroy(h) for h in handles), return_exceptions=True)
    return {"sandboxes": n, "startup_s": startup, "execs": sum(counts), "seconds": elapsed,
            "execs_per_s": sum(counts) / elapsed, "min_per_sandbox": min(counts),
            "dockerd_cpu_s": None if cpu0 is None or cpu1 is None else cpu1 - cpu0}


def table(res: dict[str, Any]) -> str:
    e, lz, t = res["exec"], res["lease"], res["throughput"]
    ratio = e["docker_exec"]["p50"] / e["agent"]["p50"]
    cold_ratio = lz["cold_start"]["p50"] / lz["warm_lease"]["p50"]
    ph = lz["cold_phases_p50_s"]
    rows = [
        ("exec round-trip via agent (`echo hi`)", f"n={e['agent']['n']}", ms(e["agent"]["p50"]), ms(e["agent"]["p99"]),
         ""),
        ("exec round-trip via `docker exec` (exec_run)", f"n={e['docker_exec']['n']}", ms(e["docker_exec"]["p50"]),
         ms(e["docker_exec"]["p99"]), f"agent {ratio:.0f}x faster (target >= 20x)"),
        ("lease from warm pool", f"n={lz['warm_lease']['n']}", ms(lz["warm_lease"]["p50"]),
         ms(lz["warm_lease"]["p99"]), "target p50 < 10 ms"),
        ("cold container start (create+start+agent ready)", f"n={lz['cold_start']['n']}",
         ms(lz["cold_start"]["p50"]), ms(lz["cold_start"]["p99"]),
         (f"warm {cold_ratio:.0f}x faster; phases p50: create {ms(ph['create_s'])}, start {ms(ph['start_s'])}, "
          f"agent ready {ms(ph['agent_ready_s'])}")),
    ]
    lines = ["| measurement | samples | p50 | p99 | note |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} | {n} |" for a, b, c, d, n in rows]
    cpu = "n/a" if t["dockerd_cpu_s"] is None else f"{t['dockerd_cpu_s']:.2f} CPU-s"
    lines += ["", "| throughput | value |", "| --- | --- |",
              f"| concurrent sandboxes | {t['sandboxes']} (started in {t['startup_s']:.1f} s) |",
              f"| execs/s (`echo hi`, {t['seconds']:.1f} s) | {t['execs_per_s']:.0f} |",
              f"| fewest execs by one sandbox | {t['min_per_sandbox']} |",
              f"| dockerd CPU during the run | {cpu} |"]
    return "\n".join(lines)


async def compare_agents(args: argparse.Namespace) -> None:
    """(1) through `args.compare_agent` and through this tree's agent, alternately, in fresh containers."""
    spec = SandboxSpec(cpus=1, memory="256m")
    print("| agent | round | agent exec p50 / p99 | `docker exec` p50 / p99 | speed-up (p50) |")
    print("| --- | --- | --- | --- | --- |")
    for r in range(args.rounds):
        for name, agent_file in (("old", args.compare_agent), ("this tree", None)):
            backend = DockerBackend(agent_file=agent_file)
            try:
                res = await bench_exec(backend, spec, args.execs, args.docker_execs)
            finally:
                await backend.sweep(run_id=RUN_ID)
                await backend.close()
            a, d = res["agent"], res["docker_exec"]
            print(f"| {name} | {r + 1} | {ms(a['p50'])} / {ms(a['p99'])} | {ms(d['p50'])} / {ms(d['p99'])} | "
                  f"{d['p50'] / a['p50']:.1f}x |", flush=True)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    spec = SandboxSpec(cpus=1, memory="256m")
    backend = DockerBackend()
    try:
        res = {"exec": await bench_exec(backend, spec, args.execs, args.docker_execs)}
        res["lease"] = await bench_leases(spec, args.leases, args.cold)
        res["throughput"] = await bench_throughput(backend, spec, args.concurrency, args.seconds)
    finally:
        await backend.sweep(run_id=RUN_ID)
        await backend.close()
    return res


async def bench_separation(n: int, cpus: float) -> None:
    """exec ['true'] alternately in the three layouts (same load): host cgroups (agent and commands cgroups), two
    containers (the agent's own and the commands'), and one container sharing its budget with the agent; and the
    cold start (create until the agent answers) of each, alternated too."""
    from bench_sandbox import alternate_execs  # this script's folder is on sys.path

    spec = SandboxSpec(image="agentrl/python:latest", cpus=cpus)
    backends = {"cgroups": DockerBackend(separation="cgroups"), "containers": DockerBackend(separation="containers"),
                "shared": DockerBackend(separate_resources=False)}
    starts: dict[str, list[float]] = {k: [] for k in backends}
    try:
        for _ in range(10):
            for key, b in backends.items():
                t0 = time.perf_counter()
                h = await b.create(spec, {"agentrl.run_id": RUN_ID})
                starts[key].append(time.perf_counter() - t0)
                await b.destroy(h)
        async with SandboxPool(backends["cgroups"], spec, max_sandboxes=1, run_id=RUN_ID) as cp, \
                SandboxPool(backends["containers"], spec, max_sandboxes=1, run_id=RUN_ID) as tp, \
                SandboxPool(backends["shared"], spec, max_sandboxes=1, run_id=RUN_ID) as hp:
            async with cp.lease() as a, tp.lease() as c, hp.lease() as b:
                if not (a.resources_separated and c.resources_separated) or b.resources_separated:
                    raise SystemExit("--separation needs host root and cgroup v1 with the cgroupfs driver "
                                     f"(cgroups={a.resources_separated}, containers={c.resources_separated})")
                out = await alternate_execs((("cgroups", a), ("containers", c), ("shared", b)), n)
    finally:
        for b in backends.values():
            await b.close()
    sh = summary(out["shared"])
    print("| cpus | layout | exec p50 / p99 | ratio of p50 to shared | cold start p50 |\n"
          "| --- | --- | ---: | ---: | ---: |")
    for key in ("shared", "cgroups", "containers"):
        se = summary(out[key])
        print(f"| {cpus:g} | {key} | {ms(se['p50'])} / {ms(se['p99'])} | {se['p50'] / sh['p50']:.2f}x | "
              f"{ms(sorted(starts[key])[len(starts[key]) // 2])} |")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--execs", type=int, default=300, help="agent exec round-trips")
    p.add_argument("--docker-execs", type=int, default=60, help="docker exec_run round-trips")
    p.add_argument("--leases", type=int, default=40, help="warm-pool leases")
    p.add_argument("--cold", type=int, default=15, help="cold container starts")
    p.add_argument("--concurrency", type=int, default=32, help="sandboxes in the throughput run")
    p.add_argument("--seconds", type=float, default=10.0, help="length of the throughput run")
    p.add_argument("--json", type=Path, help="also write the raw numbers here")
    p.add_argument("--compare-agent", help="an older agent (agent.py, agent.pyz or an agent package dir): "
                   "exec round trips through it vs this tree's agent")
    p.add_argument("--rounds", type=int, default=2, help="--compare-agent: alternations of the two agents")
    p.add_argument("--separation", type=int, default=0,
                   help="only the layouts' exec comparison (host cgroups, two containers, shared), N each")
    p.add_argument("--cpus", type=float, default=1.0, help="--separation: the sandboxes' CPU quota")
    a = p.parse_args()
    if a.separation:
        asyncio.run(bench_separation(a.separation, a.cpus))
        sys.exit(0)
    if a.compare_agent:
        asyncio.run(compare_agents(a))
        sys.exit(0)
    result = asyncio.run(main(a))
    print(table(result))
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
    sys.exit(0)
