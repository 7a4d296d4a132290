"""repo_fix per-episode sandbox cost on the local (bubblewrap) backend: lease, setup (buggy repo + git commit), one
`bash` tool call (p50 of N), one editor view, and grading (finalize: pack, merge, pristine unpack, full suite),
side by side with the same package's suite run directly on the host (the floor grading cannot beat).

    python benchmarks/bench_repo_fix.py [--package inflection] [--episodes 5] [--calls 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

from agentrl_repo_fix import RepoFixEnv
from agentrl_repo_fix.build import run_suite
from agentrl_repo_fix.lockfile import load_lockfile

from agentrl.sandbox import SandboxPool, SandboxSpec
from agentrl.types import ToolCall


def _p50(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


async def main(package: str, episodes: int, calls: int) -> None:
    env = RepoFixEnv(packages=[package])
    task = env.tasks()[0]
    spec = SandboxSpec(default_timeout_s=60, memory="2g", disk="512m")
    times: dict[str, list[float]] = {k: [] for k in ("lease", "setup", "bash", "view", "grade")}
    async with SandboxPool(backend="local", spec=spec, warm=0, max_sandboxes=1, run_id=uuid.uuid4().hex[:8],
                           backend_options={"ro_binds": env.ro_binds()}) as pool:
        for _ in range(episodes):
            t = time.perf_counter()
            async with pool.lease() as sb:
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
                assert report.passed == 0, "the buggy repo must fail"
    lock = load_lockfile()
    (pkg,) = lock.select([package])
    host = []
    for _ in range(3):
        _, took, _ = run_suite(env.buggy(task.data), pkg, env.venv(task.data))
        host.append(took)
    print(f"package {package}, {episodes} episodes, {calls} calls of each tool per episode")
    print("| step | p50 s | n |")
    print("| --- | ---: | ---: |")
    for name, xs in times.items():
        print(f"| {name} | {_p50(xs):.3f} | {len(xs)} |")
    print(f"| host suite run (floor for grading) | {_p50(host):.3f} | {len(host)} |")
    print(f"grading / host suite: {_p50(times['grade']) / _p50(host):.2f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--package", default="inflection")
    ap.add_argument("--episodes", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20)
    a = ap.parse_args()
    asyncio.run(main(a.package, a.episodes, a.calls))
