"""repo_fix per-episode sandbox cost on the local (bubblewrap) and docker backends: lease, setup (buggy repo + git
commit), one `bash` tool call (p50 of N), one editor view, and grading (finalize: pack, merge, pristine unpack, full
suite), side by side with the same package's suite run directly on the host (the floor grading cannot beat).

    python benchmarks/bench_repo_fix.py [--package inflection] [--episodes 5] [--calls 20]
        [--backend local|docker|both] [--warm 0|1]

docker runs each task in its package's image (`python -m agentrl_repo_fix images --packages PACKAGE` first).
`--warm 1`: each lease finds a ready warm sandbox of that image (the pool refills between episodes, not timed);
`--warm 0`: every lease starts a sandbox (cold). The local backend always starts one (its start is ~0.1 s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid

from agentrl_repo_fix import RepoFixEnv
from agentrl_repo_fix.build import run_suite
from agentrl_repo_fix.lockfile import load_lockfile

from agentrl.envs import lease_sandbox
from agentrl.sandbox import SandboxPool
from agentrl.types import ToolCall


def _p50(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


async def episodes_on(backend: str, env: RepoFixEnv, task: object, episodes: int, calls: int,
                      warm: int) -> dict[str, list[float]]:
    spec = env.sandbox_spec  # with the writable /repo the env needs
    options = {"ro_binds": env.ro_binds()} if backend == "local" else {}
    times: dict[str, list[float]] = {k: [] for k in ("lease", "setup", "bash", "view", "grade")}
    async with SandboxPool(backend=backend, spec=spec, warm=warm, max_sandboxes=1 + warm,
                           run_id=uuid.uuid4().hex[:8], backend_options=options) as pool:
        for n in range(episodes + (1 if warm else 0)):  # warm: one untimed episode first shifts the warm set
            while warm and n and pool.stats()["warm_by_image"].get(env.sandbox_image(task), 0) < warm:
                await asyncio.sleep(0.01)
            t = time.perf_counter()
            async with lease_sandbox(pool, env, task) as sb:
                times["lease"].append(time.perf_counter() - t)
                t = time.perf_counter()
                await env.setup(sb, task)
                times["setup"].append(time.perf_counter() - t)
                for i in range(calls):
                    t = time.perf_counter()
                    await env.call_tool(sb, ToolCall(id=str(i), name="bash", arguments={"command": "ls | wc -l"}),
                                        task=task)
                    times["bash"].append(time.perf_counter() - t)
                    t = time.perf_counter()
                    await env.call_tool(sb, ToolCall(id=str(i), name="str_replace_editor", arguments={
                        "command": "view", "path": str(task.data["file"]), "view_range": [1, 40]}), task=task)
                    times["view"].append(time.perf_counter() - t)
                t = time.perf_counter()
                report = await env.finalize(sb, task)
                times["grade"].append(time.perf_counter() - t)
                assert report.passed == 0, f"the buggy repo must fail: {report.error}"
    if warm:
        times = {k: v[len(v) // (episodes + 1):] for k, v in times.items()}  # drop the untimed first episode
    return times


async def main(package: str, episodes: int, calls: int, backends: list[str], warm: int) -> None:
    env = RepoFixEnv(packages=[package])
    task = env.tasks()[0]
    columns = {b: await episodes_on(b, env, task, episodes, calls, warm if b != "local" else 0) for b in backends}
    lock = load_lockfile()
    (pkg,) = lock.select([package])
    host = []
    for _ in range(3):
        _, took, _ = run_suite(env.buggy(task.data), pkg, env.venv(task.data))
        host.append(took)
    print(f"package {package}, {episodes} episodes, {calls} calls of each tool per episode, warm={warm}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| step (p50 s) | " + " | ".join(backends) + " |")
    print("| --- |" + " ---: |" * len(backends))
    for name in ("lease", "setup", "bash", "view", "grade"):
        print(f"| {name} | " + " | ".join(f"{_p50(columns[b][name]):.3f}" for b in backends) + " |")
    # repo_fix's judge: the original's two reference runs happen in the first setup of a task (kept per env process)
    print("| setup, first of the task (max) | " + " | ".join(f"{max(columns[b]['setup']):.3f}" for b in backends)
          + " |")
    print("| host suite run (floor for grading) | " + " | ".join(f"{_p50(host):.3f}" for _ in backends) + " |")
    print("| grading / host suite | " + " | ".join(f"{_p50(columns[b]['grade']) / _p50(host):.2f}x"
                                                   for b in backends) + " |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--package", default="inflection")
    ap.add_argument("--episodes", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--backend", choices=["local", "docker", "both"], default="local")
    ap.add_argument("--warm", type=int, choices=[0, 1], default=0, help="docker: lease warm sandboxes")
    a = ap.parse_args()
    asyncio.run(main(a.package, a.episodes, a.calls, ["local", "docker"] if a.backend == "both" else [a.backend],
                     a.warm))
