"""Scoring cost of the code_tests env: every reference solution of a task source through real sandboxes.

Two rows per source: a fresh sandbox per task (what a trajectory pays: lease + setup + hidden tests) and one
sandbox per worker reused for every task (the harness alone: one `python3 -I -c` plus one fork per test). Prints a
markdown table: tasks, tests, wall time, tasks/s.

    python benchmarks/bench_code_tests_scoring.py [--source easy,humaneval] [--concurrency 3] [--backend local]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

from agentrl.sandbox import SandboxPool, SandboxSpec
from agentrl_code_tests import CodeTestsEnv


async def score(env: CodeTestsEnv, pool: SandboxPool, concurrency: int, *, reuse: bool) -> tuple[int, int, float]:
    queue: asyncio.Queue = asyncio.Queue()
    for task in env.tasks():
        queue.put_nowait(task)
    failed: list[str] = []
    tests = 0

    async def one(sb, task) -> None:  # type: ignore[no-untyped-def]
        nonlocal tests
        await env.setup(sb, task)
        report = await env.score_solution(sb, task, env.reference_solution(task) or "")
        tests += report.total
        if report.passed != report.total:
            failed.append(task.id)

    async def worker() -> None:
        if reuse:
            async with pool.lease() as sb:
                while not queue.empty():
                    await one(sb, queue.get_nowait())
            return
        while not queue.empty():
            task = queue.get_nowait()
            async with pool.lease() as sb:
                await one(sb, task)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    if failed:
        raise SystemExit(f"reference solutions failed: {failed}")
    return len(env.tasks()), tests, elapsed


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default="easy,humaneval")
    ap.add_argument("--concurrency", type=int, default=3)
    ap.add_argument("--backend", default="local")
    args = ap.parse_args()
    print("| source | sandboxes | tasks | tests | wall s | tasks/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for source in args.source.split(","):
        env = CodeTestsEnv(source=source)
        for reuse in (False, True):
            async with SandboxPool(backend=args.backend, spec=SandboxSpec(), warm=args.concurrency,
                                   max_sandboxes=args.concurrency, run_id=uuid.uuid4().hex[:8]) as pool:
                n, tests, wall = await score(env, pool, args.concurrency, reuse=reuse)
            mode = "reused per worker" if reuse else "fresh per task"
            print(f"| {source} | {mode} (x{args.concurrency}) | {n} | {tests} | {wall:.1f} | {n / wall:.1f} |")


if __name__ == "__main__":
    asyncio.run(main())
