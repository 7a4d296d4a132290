"""`agentrl rollout`, `agentrl envs check` and `agentrl sandbox gc`: each command is one async function.

The parts come from the composition root (`agentrl.compose`: `build_run` for a rollout, `make_pool` for the checks);
this module opens the store, runs the groups, shows progress and writes the summary.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console

from agentrl.cli.display import ProgressDisplay, summary_table
from agentrl.cli.gc_policy import GcMonitor
from agentrl.compose import RunParts, build_run, env_backend_options, make_pool, run_env, select_tasks
from agentrl.config import RolloutConfig
from agentrl.envs import Env, Task, get_env, lease_sandbox
from agentrl.errors import ConfigError, InfraError
from agentrl.runner.guard import EXIT_UNSCORED, final_verdict
from agentrl.runner.lag import LoopLag
from agentrl.store import TrajectoryStore, read_trajectories, summarize
from agentrl.types import TestReport

log = logging.getLogger("agentrl")


def tune_gc(enabled: bool) -> Any:
    """Start-up is over: apply the collector policy (`gc_tune`, agentrl/cli/gc_policy.py). Returns the process's
    GcMonitor (installed whether or not the policy is on: the run reports what the collector cost either way)."""
    from agentrl.cli.gc_policy import process_monitor, tune

    if enabled:
        log.info("gc: %s", tune())
    return process_monitor()


async def run_rollout(cfg: RolloutConfig) -> int:
    console = Console(stderr=True)
    random.seed(cfg.seed)
    env, tasks = await asyncio.to_thread(run_env, cfg)  # may prepare the env's first use (repo_fix: pip)
    store = TrajectoryStore(cfg.out, resume=cfg.resume)  # refuses to clobber an existing file before any work
    with store:
        previous = store.completed()
        finished = {t.task_id for t in previous}
        todo = [t for t in tasks if t.id not in finished]
        if store.repaired_bytes:
            console.print(f"resume: dropped a torn last group ({store.repaired_bytes} bytes) from {cfg.out}")
        if cfg.resume:
            console.print(f"resume: {len(finished)} tasks already complete in {cfg.out}, {len(todo)} to run")
        t0 = time.perf_counter()
        # model load (and the one-time conversion of the embedded model) off the event loop
        parts = await asyncio.to_thread(build_run, cfg, env=env, tasks=tasks)
        try:
            if hasattr(parts.engine, "connect"):  # a server engine: fail fast with a clear message if unreachable
                await parts.engine.connect()
                parts.meta["engine"] = parts.engine.info()  # with what the servers reported (version, spans)
            gc_cost, lag = await _run_groups(cfg, parts, todo, store, console)
        finally:
            await parts.aclose()
        all_trajs = read_trajectories(cfg.out)
        summary: dict[str, Any] = dict(summarize(all_trajs, wall_s=time.perf_counter() - t0))
        summary["gc"] = gc_cost  # this process's collector cost (the trajectories above may span resumed runs)
        summary["loop_lag"] = lag  # how late the runner's event loop woke during this run
    console.print(summary_table(summary))
    console.print(f"gc: {gc_cost['gc_collections']} collections (gen 0/1/2), {gc_cost['gc_s']:.2f} s, longest pause "
                  f"{gc_cost['gc_max_pause_ms']:.0f} ms")
    console.print(f"event loop lag: p50 {lag['p50_ms']:.1f} ms, p99 {lag['p99_ms']:.1f} ms, max {lag['max_ms']:.0f} ms "
                  f"({lag['ticks']} ticks)")
    if cfg.summary_json:
        cfg.summary_json.write_text(json.dumps(summary, indent=2))
    failed = final_verdict(f"rollout {cfg.out}", int(summary.get("infra_errors", 0)), len(all_trajs),
                              cfg.max_unscored_frac)
    if failed:
        print(failed, file=sys.stderr)  # one line, never wrapped: scripts grep it
        return EXIT_UNSCORED
    return 0


async def _run_groups(cfg: RolloutConfig, parts: RunParts, todo: list[Task], store: TrajectoryStore,
                      console: Console) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run `todo` and store each group as it completes. Returns what the collector cost during the run and how
    late the event loop woke (agentrl.runner.LoopLag)."""
    tune_gc(cfg.gc_tune)
    sched = parts.scheduler()
    console.print(f"rollout: env {parts.env.name}, {len(todo)} tasks x {cfg.group_size} samples, model "
                  f"{parts.model_path.name}, sandbox {cfg.sandbox.backend.type}, out {cfg.out}")
    lag = await LoopLag().start()
    try:  # the heartbeat covers the pool's start too (warm sandboxes, image pulls)
        with ProgressDisplay(sched.progress, console) as display:
            async with parts.pool, parts.scorer:
                with GcMonitor() as gc_monitor:
                    async for group in sched.run(todo):
                        await asyncio.to_thread(store.append_group, group)  # write + fsync off the event loop
                        display.tick()
    finally:
        await lag.stop()
    return gc_monitor.summary(), lag.summary()


# -- envs check -------------------------------------------------------------------------------------------------

def _load_solutions(path: Path) -> dict[str, str]:
    if not path.exists():
        raise ConfigError(f"--solutions {str(path)!r} does not exist")
    out: dict[str, str] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out[str(row["task_id"])] = str(row["solution"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ConfigError(
                f'{path}:{lineno}: expected {{"task_id": ..., "solution": "<python source>"}} ({exc})') from None
    return out


async def prepare_env(env: Env) -> None:
    """First use: an env that can fetch or build what its tasks need on this machine (`env.prepare(say)`, e.g.
    repo_fix's sdists and test venvs) does it now, off the event loop, printing its progress."""
    prepare = getattr(env, "prepare", None)
    if callable(prepare):
        await asyncio.to_thread(prepare, lambda msg: print(msg, flush=True))


async def preflight(pool: Any, env: Env, tasks: list[Task]) -> None:
    """Start one sandbox before any task is checked: a backend that cannot start one (no namespace, no image, no
    credentials) is one error up front, not the same failure once per task."""
    if tasks:
        async with lease_sandbox(pool, env, tasks[0]):
            pass


class CheckProgress:
    """The heartbeat line of `envs check`: what it is doing, tasks checked and in flight, elapsed time."""

    def __init__(self, env: str) -> None:
        self.env = env
        self.phase = "preparing the env"
        self.total = self.done = self.running = 0
        self.started = time.perf_counter()

    def line(self) -> str:
        return (f"envs check {self.env}: {self.phase}, checked {self.done}/{self.total} tasks "
                f"({self.running} in flight)  {time.perf_counter() - self.started:.0f}s")


async def check_env(name: str, *, solutions: Path | None, backend: str, json_out: Path | None,
                    options: dict[str, Any], tasks: int | None, concurrency: int,
                    unsafe_no_isolation: bool = False, console: Console | None = None,
                    max_unscored_frac: float = 0.10) -> int:
    """Score the reference (or given) solutions of `name`'s tasks in real sandboxes; a heartbeat line (on
    `console`, default stderr) every few seconds until the last result, so a slow first use or sandbox is never
    silent."""
    env = get_env(name, **options)
    progress = CheckProgress(env.name)
    with ProgressDisplay(progress.line, console):
        return await _check_env(env, progress, solutions=solutions, backend=backend, json_out=json_out,
                                tasks=tasks, concurrency=concurrency, unsafe_no_isolation=unsafe_no_isolation,
                                max_unscored_frac=max_unscored_frac)


async def _check_env(env: Env, progress: CheckProgress, *, solutions: Path | None, backend: str,
                     json_out: Path | None, tasks: int | None, concurrency: int, unsafe_no_isolation: bool,
                     max_unscored_frac: float) -> int:
    await prepare_env(env)
    todo = select_tasks(env, tasks, [])
    progress.total = len(todo)
    given = _load_solutions(solutions) if solutions else None
    pool = make_pool(backend, env.sandbox_spec, warm=min(concurrency, 4), max_sandboxes=concurrency,
                     run_id=uuid.uuid4().hex[:12], unsafe_no_isolation=unsafe_no_isolation,
                     backend_options=env_backend_options(backend, env))
    sem = asyncio.Semaphore(concurrency)
    infra: set[str] = set()  # tasks whose scoring an infrastructure failure ended (not the solution's doing)
    # an env may list extra solutions with a required verdict (e.g. a no-op and a test-only patch must fail); those
    # envs also get the reference scored twice, and the two reports must agree
    check_cases = getattr(env, "check_cases", None) if given is None else None

    async def score(task: Task, solution: str) -> TestReport:
        try:
            async with lease_sandbox(pool, env, task) as sb:
                return await env.score_solution(sb, task, solution)
        except ConfigError:
            raise  # the setup is wrong, not this solution: one error for the whole check
        except Exception as exc:  # noqa: BLE001 - e.g. the solution killed its sandbox: score 0, check the rest
            if isinstance(exc, InfraError) and not getattr(exc, "in_flight", False):  # not during its code
                infra.add(task.id)
            reason = f"the sandbox broke while scoring this solution: {type(exc).__name__}: {exc}"
            return TestReport(passed=0, total=0, error=reason[:500])

    async def case_problems(task: Task, solution: str, first: TestReport) -> list[str]:
        problems = []
        assert check_cases is not None  # called only when the env lists cases
        for label, case, must_pass in check_cases(task):
            r = await score(task, case)
            ok = bool(r.total) and r.passed == r.total
            if ok != must_pass:
                verdict, must = ("passed" if ok else "failed"), ("pass" if must_pass else "fail")
                problems.append(f"the {label} {verdict} (it must {must})")
        again = await score(task, solution)
        if [(o.name, o.passed) for o in again.outcomes] != [(o.name, o.passed) for o in first.outcomes]:
            problems.append("a second run of the reference gave a different report")
        return problems

    async def one(task: Task) -> tuple[Task, TestReport]:
        async with sem:  # a task's every case in one slot: results (and progress lines) come task by task
            progress.running += 1
            try:
                return await check_one(task)
            finally:
                progress.running -= 1

    async def check_one(task: Task) -> tuple[Task, TestReport]:
        solution = given.get(task.id) if given is not None else env.reference_solution(task)
        if solution is None:
            return task, TestReport(passed=0, total=0, error="no solution given")
        report = await score(task, solution)
        if check_cases is not None and report.error is None:
            problems = await case_problems(task, solution, report)
            if problems:
                report = report.model_copy(update={"passed": 0, "error": "; ".join(problems)})
        return task, report

    results: list[tuple[Task, TestReport]] = []
    progress.phase = "starting sandboxes"
    async with pool:
        await preflight(pool, env, todo)
        progress.phase = "scoring solutions"
        jobs = [asyncio.create_task(one(t)) for t in todo]
        try:
            for fut in asyncio.as_completed(jobs):
                task, report = await fut
                results.append((task, report))
                progress.done += 1
                mark = "ok " if report.total and report.passed == report.total else "FAIL"
                error = f"  ({report.error})" if report.error else ""
                print(f"{mark} {task.id:40s} {report.passed}/{report.total}{error}")
                sys.stdout.flush()
        finally:
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
    order = {t.id: i for i, t in enumerate(todo)}
    results.sort(key=lambda r: order[r[0].id])
    full = sum(1 for _, r in results if r.total and r.passed == r.total)
    progress.phase = "done"
    print(f"total: {full}/{len(results)} tasks pass all tests; "
          f"{sum(r.passed for _, r in results)}/{sum(r.total for _, r in results)} tests passed")
    flagged = Counter(sig.name for _, r in results for sig in r.signals)  # a reference should raise none
    print("integrity signals raised by the grader: " + (", ".join(f"{n} on {c} task(s)" for n, c in
                                                                  sorted(flagged.items())) or "none"))
    if json_out:
        json_out.write_text(json.dumps([{"task_id": t.id, "passed": r.passed, "total": r.total, "error": r.error,
                                         "outcomes": [o.model_dump() for o in r.outcomes],
                                         "signals": [sig.model_dump() for sig in r.signals]} for t, r in results],
                                       indent=1))
    failed = final_verdict(f"envs check {env.name}", len(infra), len(results), max_unscored_frac)
    if failed:
        print(failed, file=sys.stderr)
        return EXIT_UNSCORED
    return 0 if given is not None or full == len(results) else 1


async def sandbox_gc(backend: str, *, all_runs: bool) -> int:
    from agentrl.sandbox.pool import make_backend

    b = make_backend(backend)
    try:
        n = await b.sweep(all_runs=all_runs)
    finally:
        await b.close()
    print(f"removed {n} {backend} sandboxes")
    return 0
