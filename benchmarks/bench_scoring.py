"""Scoring time per HumanEval task: the code_tests harness of a baseline revision (default: git `main`) against the
one in this checkout, side by side in one run.

Each task's reference solution is scored by both harnesses in alternation (A B, then B A for the next task, so load
drifts hit both alike), each run being what the env runs: `python3 -I -c <harness>` with the JSON spec on stdin,
either as a plain subprocess (`--via subprocess`, the harness alone) or inside one local bubblewrap sandbox
(`--via sandbox`, plus the agent's exec round trip). Prints a markdown table: per-task median and mean for both,
and the ratio current / baseline.

    python benchmarks/bench_scoring.py [--baseline main] [--via subprocess|sandbox] [--tasks N] [--repeat R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from agentrl_code_tests.scoring import harness_source, harness_spec, new_nonce
from agentrl_code_tests.tasks import load_tasks

HARNESS_PATH = "envs/code_tests/agentrl_code_tests/harness.py"
MARK = "AGENTRL_HARNESS_RESULT "


def baseline_source(rev: str) -> str:
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run(["git", "-C", str(repo), "show", f"{rev}:{HARNESS_PATH}"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"cannot read {HARNESS_PATH} at {rev!r}: {out.stderr.strip()}")
    return out.stdout


def all_passed(stdout: str, total: int) -> bool:
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith(MARK)), "")
    body = line[len(MARK):]
    if body[:1] != "{":  # the current format puts the nonce first
        body = body.split(" ", 1)[-1]
    try:
        rows = json.loads(body)["results"]
    except (ValueError, KeyError):
        return False
    return len(rows) == total and all(r[1] for r in rows)


class SubprocessRunner:
    async def run(self, source: str, spec: str) -> str:
        proc = await asyncio.to_thread(subprocess.run, [sys.executable, "-I", "-c", source], input=spec,
                                       capture_output=True, text=True, timeout=120)
        return proc.stdout


class SandboxRunner:
    def __init__(self, sandbox: Any) -> None:
        self.sandbox = sandbox

    async def run(self, source: str, spec: str) -> str:
        return (await self.sandbox.exec(["python3", "-I", "-c", source], stdin=spec, timeout=120)).stdout


async def measure(runner: Any, sources: dict[str, str], tasks: list[Any], repeat: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in sources}
    order = list(sources)
    for i, task in enumerate(tasks):
        tests = task.data["tests"]
        spec = harness_spec(task.data, task.data["reference"], tests, timeout_s=10.0, budget_s=60.0,
                            nonce=new_nonce())
        for _ in range(repeat):
            for name in order if i % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                stdout = await runner.run(sources[name], spec)
                times[name].append(time.perf_counter() - t0)
                if not all_passed(stdout, len(tests)):
                    raise SystemExit(f"{name} harness did not pass {task.id}: {stdout[-500:]!r}")
    return times


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="main", help="git revision of the baseline harness (default main)")
    ap.add_argument("--via", choices=["subprocess", "sandbox"], default="subprocess")
    ap.add_argument("--tasks", type=int, default=164, help="first N HumanEval tasks (default all 164)")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    sources = {f"baseline ({args.baseline})": baseline_source(args.baseline), "current": harness_source()}
    tasks = load_tasks("humaneval", "codeblock")[: args.tasks]
    if args.via == "sandbox":
        from agentrl.sandbox import SandboxPool, SandboxSpec

        async with SandboxPool(backend="local", spec=SandboxSpec(default_timeout_s=120), warm=1, max_sandboxes=1,
                               run_id=uuid.uuid4().hex[:8]) as pool, pool.lease() as sb:
            times = await measure(SandboxRunner(sb), sources, tasks, args.repeat)
    else:
        times = await measure(SubprocessRunner(), sources, tasks, args.repeat)
    base, cur = (times[name] for name in sources)
    print(f"{len(tasks)} HumanEval tasks x {args.repeat}, via {args.via}, "
          f"{sum(len(t.data['tests']) for t in tasks)} tests per pass\n")
    print("| harness | median ms/task | mean ms/task |")
    print("|---|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts) * 1e3:.0f} | {statistics.mean(ts) * 1e3:.0f} |")
    ratio_med = statistics.median(cur) / statistics.median(base)
    ratio_mean = statistics.mean(cur) / statistics.mean(base)
    print(f"| ratio current / baseline | {ratio_med:.2f}x | {ratio_mean:.2f}x |")


if __name__ == "__main__":
    asyncio.run(main())
