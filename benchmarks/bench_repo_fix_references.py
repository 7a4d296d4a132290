"""repo_fix's reference solutions through `RepoFixEnv.score_solution` (the `agentrl envs check` path), one JSON line
per task: whether it scored 1, the integrity signals raised (false positives of `rigged_comparison`: 0 expected),
the failing outcomes, and the seconds of the original's reference runs and of the graded run.

    python benchmarks/bench_repo_fix_references.py OUT.jsonl [--concurrency 2] [--every 10] [--first ID,ID]
        [--skip DONE.jsonl]

Tasks are taken round-robin over the packages (every `--every`-th task of the file), `--first` ids before them.
Works with the grader before the judge too (no reference runs: no `ref_s`), for before/after timing.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
import uuid
from pathlib import Path
from typing import Any

from agentrl_repo_fix import RepoFixEnv, grading

from agentrl.sandbox import SandboxPool


def _timed(times: dict[str, dict[str, float]], key: str, func: Any) -> Any:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.monotonic()
        try:
            return await func(*args, **kwargs)
        finally:
            times.setdefault(args[1]["id"], {})[key] = round(time.monotonic() - t0, 3)
    return wrapper


def _tasks(env: RepoFixEnv, every: int, first: list[str], skip: set[str]) -> list[Any]:
    by_package: dict[str, list[Any]] = {}
    for task in env.tasks()[::every]:
        by_package.setdefault(task.data["package"], []).append(task)
    sample = [t for group in itertools.zip_longest(*by_package.values()) for t in group if t is not None]
    chosen = [t for t in env.tasks() if t.id in first] + [t for t in sample if t.id not in first]
    return [t for t in chosen if t.id not in skip]


async def main(out: Path, concurrency: int, every: int, first: list[str], skip: set[str]) -> None:
    env = RepoFixEnv()
    env.prepare(say=lambda _: None)
    times: dict[str, dict[str, float]] = {}
    grading.run_graded = _timed(times, "graded_s", grading.run_graded)  # type: ignore[method-assign]
    if hasattr(grading, "reference_traces"):
        grading.reference_traces = _timed(times, "ref_s", grading.reference_traces)  # type: ignore[attr-defined]
    sem = asyncio.Semaphore(concurrency)
    with out.open("a") as f:
        async with SandboxPool(backend="local", spec=env.sandbox_spec, warm=concurrency,
                               max_sandboxes=concurrency + 1, run_id=uuid.uuid4().hex[:8],
                               backend_options={"ro_binds": env.ro_binds()}) as pool:
            async def one(task: Any) -> None:
                async with sem, pool.lease() as sb:
                    try:
                        r = await env.score_solution(sb, task, env.reference_solution(task) or "")
                        row = {"id": task.id, "passed": r.passed, "error": r.error,
                               "signals": [s.name for s in r.signals], "detail": [s.detail for s in r.signals],
                               "failed": [(o.name, o.message[-300:]) for o in r.outcomes if not o.passed][:4],
                               **times.get(task.id, {})}
                    except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                        row = {"id": task.id, "exc": f"{type(exc).__name__}: {exc}"[:500]}
                f.write(json.dumps(row) + "\n")
                f.flush()
            await asyncio.gather(*(one(t) for t in _tasks(env, every, first, skip)))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--first", default="")
    ap.add_argument("--skip", type=Path)
    a = ap.parse_args()
    done = {json.loads(line)["id"] for line in a.skip.open()} if a.skip else set()
    asyncio.run(main(a.out, a.concurrency, a.every, [i for i in a.first.split(",") if i], done))
