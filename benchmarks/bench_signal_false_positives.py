"""False positives of the integrity signals on honest work: every reference solution of code_tests and a sample of
repo_fix's, scored through `Env.score_solution` (the `agentrl envs check` path) in real sandboxes, then
`kill_all` (what the runner does before grading). Counts every signal the sandbox's agent (`sandbox_probe`,
`resource_exhaustion`: `integrity.from_sandbox` over everything the agent counted during the scoring, background
processes included) and the graders (`test_tamper`, `rigged_comparison`, ...) raised. 0 is expected everywhere.

    python benchmarks/bench_signal_false_positives.py [--backend local|docker] [--repo-fix-every 10]
        [--concurrency 2] [--envs code_tests,repo_fix] [--control ATTACK]

`--control ATTACK` (code_tests): score that grader hack of agentrl.testing.grader_attacks instead of the
references, to see that the same measurement does count (e.g. kills_its_parent_and_group: `signal_foreign`).

Prints one line per task that raised anything (with the agent's counts by name), then a table per env: tasks,
scored full marks, and the count of each signal.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import time
import uuid
from typing import Any

from agentrl.envs import get_env, lease_sandbox
from agentrl.envs.base import spec_for_env
from agentrl.runner import integrity
from agentrl.sandbox import SandboxPool
from agentrl.testing.grader_attacks import CODE_TESTS_ATTACKS


def _tasks(env: Any, every: int) -> list[Any]:
    tasks = list(env.tasks())
    if env.name != "repo_fix" or every <= 1:
        return tasks
    by_package: dict[str, list[Any]] = {}
    for task in tasks[::every]:
        by_package.setdefault(task.data["package"], []).append(task)
    return [t for group in by_package.values() for t in group]


async def _run_env(name: str, backend: str, every: int, concurrency: int,
                   control: str | None = None) -> tuple[int, int, collections.Counter]:
    env = get_env(name)
    prepare = getattr(env, "prepare", None)
    if callable(prepare):
        prepare(say=lambda msg: print(f"  {name}: {msg}", flush=True))
    tasks = _tasks(env, every)
    counts: collections.Counter = collections.Counter()
    full = 0
    sem = asyncio.Semaphore(concurrency)
    options = {"ro_binds": env.ro_binds()} if backend == "local" and hasattr(env, "ro_binds") else {}
    async with SandboxPool(backend=backend, spec=spec_for_env(env.sandbox_spec, env), warm=concurrency,
                           max_sandboxes=concurrency + 1, run_id=f"fp-{uuid.uuid4().hex[:8]}",
                           backend_options=options) as pool:
        async def one(task: Any) -> None:
            nonlocal full
            async with sem, lease_sandbox(pool, env, task) as sb:
                solution = env.reference_solution(task) or ""
                if control:
                    solution = CODE_TESTS_ATTACKS[control].replace("{f}", task.data["entry_point"])
                report = await env.score_solution(sb, task, solution)
                await sb.kill_all()
                observed = sb.take_observed()
            signals = integrity.from_sandbox(observed) + list(report.signals)
            full += int(report.total > 0 and report.passed == report.total)
            for s in signals:
                counts[s.name] += 1
            if signals or report.passed != report.total:
                agent = {k: v for r in observed for k, v in r.probes.items()}
                print(f"  {task.id}: {report.passed}/{report.total} signals={[s.name for s in signals]} "
                      f"agent_counts={agent} {report.error or ''}", flush=True)

        t0 = time.monotonic()
        await asyncio.gather(*(one(t) for t in tasks))
        print(f"  {name}: {len(tasks)} tasks in {time.monotonic() - t0:.0f} s", flush=True)
    return len(tasks), full, counts


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="local")
    ap.add_argument("--envs", default="code_tests,repo_fix")
    ap.add_argument("--repo-fix-every", type=int, default=10, help="repo_fix: every N-th task, per package")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--control", default=None, help="code_tests: score this grader hack instead (a control)")
    args = ap.parse_args()
    print(f"backend {args.backend}, load {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    for name in args.envs.split(","):
        rows.append((name, *await _run_env(name, args.backend, args.repo_fix_every, args.concurrency,
                                           args.control)))
    names = sorted({k for *_, c in rows for k in c} | {"sandbox_probe", "resource_exhaustion"})
    print(f"load {os.getloadavg()[0]:.1f}")
    print("| env | tasks | full marks | " + " | ".join(f"`{n}`" for n in names) + " |")
    print("| --- | ---: | ---: | " + " | ".join("---:" for _ in names) + " |")
    for name, n, full, counts in rows:
        print(f"| {name} | {n} | {full} | " + " | ".join(str(counts.get(k, 0)) for k in names) + " |")


if __name__ == "__main__":
    asyncio.run(main())
