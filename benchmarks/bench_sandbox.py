"""Sandbox latency: lease from a warm pool vs a cold start, and exec round-trips through the in-sandbox agent vs a
bare host process spawn. Prints a markdown table (see BENCHMARKS.md for recorded numbers).

    python benchmarks/bench_sandbox.py [--backend local] [--leases 30] [--execs 200] [--cpus 0.05]
    python benchmarks/bench_sandbox.py --separation 600   # local: exec round trip, commands in their own cgroup
                                                          # vs one shared budget, interleaved (same machine load)
    python benchmarks/bench_sandbox.py --compare-agent OLD_AGENT --execs 300 [--cpus 0.05] [--shared]
        # local: exec ['true'] through OLD_AGENT (an older single-file agent.py, e.g. `git show
        # REV:agentrl/sandbox/agent.py`, an agent.pyz, or an agent package directory) and through this
        # tree's agent, interleaved (same load): round trip p50/p99 and the sandbox cgroup's CPU per exec;
        # --shared: agent and commands in one CPU budget (as in a Kubernetes pod), not resource-separated
    python benchmarks/bench_sandbox.py --seccomp 300 [--cpus 1]
        # local: exec round trips with the syscall policy on (this tree's agent) and off (the same agent with
        # SECCOMP_POLICY = "off" in agent/spawner.py), alternating: ['true'], ['python3', '-c', 'pass'] (~500
        # syscalls) and a python that signals itself 1000 times (each signal a round trip to the agent where signals
        # are watched)
    python benchmarks/bench_sandbox.py --seccomp 300 --seccomp-base OLD_AGENT
        # the same, the base arm OLD_AGENT as it is (e.g. the policy before signals were watched) instead of "off"

--leases 0 skips the lease measurements; --cpus sets the sandbox's CPU quota (cgroup cpu.max / cfs_quota_us over a
100 ms period): at 0.05 every exec whose agent + command CPU passes 5 ms in a period waits for the next period.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrl.sandbox import SandboxPool, SandboxSpec
from agentrl.sandbox.artifact import shipped


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

    spec = SandboxSpec()
    async with SandboxPool(LocalBackend(state_dir=state_dir), spec, max_sandboxes=1) as sep_pool, \
            SandboxPool(LocalBackend(state_dir=state_dir, separate_resources=False), spec, max_sandboxes=1) as sh_pool:
        async with sep_pool.lease() as separated, sh_pool.lease() as shared:
            if not separated.resources_separated:
                raise SystemExit("--separation needs host root and cgroup limits (resources_separated is false here)")
            out = await alternate_execs((("separated", separated), ("shared", shared)), n)
    return out


async def alternate_execs(pair: tuple[tuple[str, Any], ...], n: int) -> dict[str, list[float]]:
    """exec ['true'] n times in each sandbox of `pair`, alternating (who goes first too), after 20 warm-up execs
    each, so both see the same load: the round trips per key. Also used by bench_docker.py."""
    out: dict[str, list[float]] = {key: [] for key, _ in pair}
    for _ in range(20):
        for _, sb in pair:
            await sb.exec(["true"])
    for i in range(n):
        for key, sb in pair if i % 2 else pair[::-1]:
            t0 = time.perf_counter()
            await sb.exec(["true"])
            out[key].append(time.perf_counter() - t0)
    return out


def _cpu_ns(backend, sandbox_id: str) -> int:
    """CPU time used so far by the sandbox: its cgroup's usage (v2), or (v1, where the cpu hierarchy keeps no
    usage) the user + system time of every live process in its cgroup tree plus what they reaped (the agent reaps
    every command, so finished commands are in its cutime/cstime)."""
    state = json.loads((backend.state_root / sandbox_id / "state.json").read_text())
    for d in state["cgroups"]:
        if Path(d, "cpu.stat").exists() and "usage_usec" in Path(d, "cpu.stat").read_text():  # cgroup v2
            stat = dict(line.split() for line in Path(d, "cpu.stat").read_text().splitlines())
            return int(stat["usage_usec"]) * 1000
    ticks = 0
    for procs in Path(state["cgroups"][0]).rglob("cgroup.procs"):
        for pid in procs.read_text().split():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            ticks += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


async def bench_compare_agent(old_agent: str, spec: SandboxSpec, n: int, shared: bool,
                              state_dir: str) -> dict[str, list[float]]:
    """exec ['true'] in turn through `old_agent`, through this tree's agent, and through this tree's agent
    without uid separation (a user namespace, no --run-as: the cost before uid separation), each in its own local
    sandbox of `spec`; returns round trips and, under "<key>_cpu", the sandbox's CPU seconds per exec."""
    from agentrl.sandbox.local import LocalBackend

    backends = {key: LocalBackend(state_dir=state_dir, separate_resources=not shared)
                for key in ("single_uid", "old", "new")}
    backends["old"]._agent_file = str(shipped(old_agent))
    backends["single_uid"].uid_separated = False
    out: dict[str, list[float]] = {}
    async with contextlib.AsyncExitStack() as stack:
        arms = []
        for key, backend in backends.items():
            pool = await stack.enter_async_context(SandboxPool(backend, spec, max_sandboxes=1))
            arms.append((key, await stack.enter_async_context(pool.lease()), backend))
        for _ in range(20):
            for _, sb, _ in arms:
                await sb.exec(["true"])
        cpu0 = {key: _cpu_ns(backend, sb.id) for key, sb, backend in arms}
        for i in range(n):
            for key, sb, _ in arms[i % 3:] + arms[:i % 3]:
                t0 = time.perf_counter()
                await sb.exec(["true"])
                out.setdefault(key, []).append(time.perf_counter() - t0)
        for key, sb, backend in arms:
            out[f"{key}_cpu"] = [(_cpu_ns(backend, sb.id) - cpu0[key]) / n / 1e9]
    return out


SELF_SIGNALS = ["python3", "-c", ("import os, signal\nsignal.signal(signal.SIGUSR1, lambda *a: None)\n"
                                  "for _ in range(1000):\n    os.kill(os.getpid(), signal.SIGUSR1)")]


async def bench_seccomp(spec: SandboxSpec, n: int, state_dir: str, base: str | None = None) -> dict[str, list[float]]:
    """exec round trips through this tree's agent with the syscall policy on and off (the artifact of a copy of the
    agent package with SECCOMP_POLICY = "off"; `base`: that agent, as it is, instead), one local sandbox each,
    alternating (who goes first too) after 20 warm-up execs."""
    from agentrl.sandbox.artifact import PACKAGE_DIR, artifact_path
    from agentrl.sandbox.local import LocalBackend

    on, off = (LocalBackend(state_dir=state_dir) for _ in range(2))
    if base:
        off._agent_file = str(shipped(base))
    else:
        copy = Path(state_dir, "agent-seccomp-off", "agent")
        shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
        source = (copy / "spawner.py").read_text()
        assert 'SECCOMP_POLICY = "notify"' in source, "agent/spawner.py no longer sets SECCOMP_POLICY = \"notify\""
        (copy / "spawner.py").write_text(source.replace('SECCOMP_POLICY = "notify"', 'SECCOMP_POLICY = "off"'))
        off._agent_file = str(artifact_path(Path(state_dir), package_dir=copy))
    out: dict[str, list[float]] = {}
    async with contextlib.AsyncExitStack() as stack:
        arms = []
        for key, backend in (("on", on), ("off", off)):
            pool = await stack.enter_async_context(SandboxPool(backend, spec, max_sandboxes=1))
            arms.append((key, await stack.enter_async_context(pool.lease())))
        for cmd_key, cmd in (("true", ["true"]), ("python", ["python3", "-c", "pass"]), ("signals", SELF_SIGNALS)):
            for _ in range(20):
                for _, sb in arms:
                    await sb.exec(cmd)
            for i in range(n):
                for key, sb in arms if i % 2 else arms[::-1]:
                    t0 = time.perf_counter()
                    await sb.exec(cmd)
                    out.setdefault(f"{cmd_key}_{key}", []).append(time.perf_counter() - t0)
        for key, sb in arms:
            await sb.health()
            out[f"mode_{key}"] = sb.agent_info.get("seccomp")
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="local")
    ap.add_argument("--leases", type=int, default=30)
    ap.add_argument("--execs", type=int, default=200)
    ap.add_argument("--cpus", type=float, default=None, help="the sandbox's CPU quota (default: SandboxSpec's)")
    ap.add_argument("--separation", type=int, default=0, help="only the separated-vs-shared exec comparison, N each")
    ap.add_argument("--compare-agent", default=None,
                    help="an older agent (agent.py, agent.pyz or package dir): exec through it vs this tree's")
    ap.add_argument("--shared", action="store_true", help="--compare-agent: agent and commands share one budget")
    ap.add_argument("--seccomp", type=int, default=0, help="only the syscall policy on-vs-off comparison, N each")
    ap.add_argument("--seccomp-base", default=None, help="--seccomp: this agent, as it is, instead of policy off")
    args = ap.parse_args()
    if args.seccomp:
        spec = SandboxSpec() if args.cpus is None else SandboxSpec(cpus=args.cpus)
        with tempfile.TemporaryDirectory(prefix="agrl-bench-", dir="/tmp") as state_dir:
            res = await bench_seccomp(spec, args.seccomp, state_dir, args.seccomp_base)
        base = f"agent {args.seccomp_base}" if args.seccomp_base else "syscall policy off"
        print(f"local, cpus={spec.cpus}; policy on: {res['mode_on']}, base: {res['mode_off']}\n")
        print("| exec round trip | N | p50 ms | p99 ms | ratio (p50) |\n| --- | --- | --- | --- | --- |")
        for cmd_key, name in (("true", "['true']"), ("python", "['python3', '-c', 'pass']"),
                              ("signals", "python, 1000 signals to itself")):
            off = statistics.median(res[f"{cmd_key}_off"]) * 1000
            print(_row(f"{name}, {base}", res[f"{cmd_key}_off"]))
            print(_row(f"{name}, this tree (notify)", res[f"{cmd_key}_on"], off))
        return
    if args.compare_agent:
        spec = SandboxSpec() if args.cpus is None else SandboxSpec(cpus=args.cpus)
        with tempfile.TemporaryDirectory(prefix="agrl-bench-", dir="/tmp") as state_dir:
            cmp = await bench_compare_agent(args.compare_agent, spec, args.execs, args.shared, state_dir)
        base = statistics.median(cmp["old"]) * 1000
        budget = "one shared budget" if args.shared else "commands in their own cgroup"
        print(f"local, cpus={spec.cpus}, {budget}\n")
        print("| exec ['true'] round trip | N | p50 ms | p99 ms | ratio (p50) | sandbox CPU per exec, ms |")
        print("| --- | --- | --- | --- | --- | --- |")
        for key, name in (("old", f"agent {args.compare_agent}, uid-separated"),
                          ("new", "agent of this tree, uid-separated"),
                          ("single_uid", "agent of this tree, single uid (no --run-as, user namespace)")):
            cpu = statistics.median(cmp[f"{key}_cpu"]) * 1000
            print(f"{_row(name, cmp[key], None if key == 'old' else base)} {cpu:.2f} |")
        return
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
