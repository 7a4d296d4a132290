"""Wiring: build env, engine, sandbox pool, renderer, scheduler and store from a config, and run them.

The only module that knows every concrete component. Each command is one async function.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console

import agentrl
from agentrl.cli.display import ProgressDisplay, summary_table
from agentrl.cli.gc_policy import GcMonitor
from agentrl.config import RolloutConfig, check_ttl_covers_budgets
from agentrl.envs import Env, Task, get_env, lease_sandbox, spec_for_env
from agentrl.errors import ConfigError
from agentrl.reward import RewardSpec, Scorer
from agentrl.runner import Budgets, LoopLag, Rollout, Scheduler, SchedulerConfig, check_time_needs
from agentrl.sandbox.base import SandboxSpec
from agentrl.store import TrajectoryStore, read_trajectories, summarize
from agentrl.types import TestReport

log = logging.getLogger("agentrl")


def select_tasks(env: Env, n: int | None, ids: list[str]) -> list[Task]:
    tasks = list(env.tasks())
    if ids:
        by_id = {t.id: t for t in tasks}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise ConfigError(f"task_ids: {missing} not in env {env.name!r} (first ids: {list(by_id)[:5]})")
        tasks = [by_id[i] for i in ids]
    return tasks[:n] if n is not None else tasks


def make_pool(backend: str, spec: SandboxSpec, *, warm: int, max_sandboxes: int, run_id: str,
              unsafe_no_isolation: bool = False, backend_options: dict[str, Any] | None = None,
              **pool_options: Any) -> Any:
    from agentrl.sandbox import SandboxPool

    return SandboxPool(backend=backend, spec=spec, warm=warm, max_sandboxes=max_sandboxes, run_id=run_id,
                       unsafe_no_isolation=unsafe_no_isolation, backend_options=backend_options, **pool_options)


def env_backend_options(backend: str, env: Env | None) -> dict[str, Any]:
    """Backend options an env asks for: on the local backend, the host paths its sandboxes must see read-only
    (`env.ro_binds()`, e.g. repo_fix's per-package test venvs)."""
    ro_binds = getattr(env, "ro_binds", None)
    if backend == "local" and callable(ro_binds):
        return {"ro_binds": list(ro_binds())}
    return {}


def pool_from_config(cfg: RolloutConfig, spec: SandboxSpec, run_id: str, env: Env | None = None) -> Any:
    b, s = cfg.sandbox.backend, cfg.sandbox
    opts: dict[str, Any] = env_backend_options(b.type, env)
    if env is not None:
        spec = spec_for_env(spec, env)  # e.g. repo_fix's writable /repo, whatever the config's spec says
    if b.type == "docker" and b.docker_host:
        opts["docker_host"] = b.docker_host
    if b.type == "kubernetes":
        opts["config"] = b
    return make_pool(b.type, spec, warm=s.warm, max_sandboxes=s.max_sandboxes, run_id=run_id,
                     unsafe_no_isolation=getattr(b, "unsafe_no_isolation", False), backend_options=opts,
                     max_starting=s.max_starting, create_rate=s.create_rate, cold_start_grace_s=s.cold_start_grace_s)


def make_engine_and_tokenizer(cfg: RolloutConfig) -> tuple[Any, Any, Path]:
    import torch
    from transformers import AutoTokenizer

    if cfg.engine.type == "sglang":
        return make_sglang_engine_and_tokenizer(cfg)
    if cfg.engine.type == "vllm":
        return make_vllm_engine_and_tokenizer(cfg)

    from agentrl.engine.local import LocalEngine
    from agentrl.engine.models import resolve_model

    path = resolve_model(cfg.engine.model)
    tokenizer = AutoTokenizer.from_pretrained(path)  # always from the checkpoint being run
    dtype = torch.float32 if cfg.engine.dtype == "float32" else torch.bfloat16
    engine = LocalEngine(path, max_batch_size=cfg.engine.max_batch_size, dtype=dtype, seed=cfg.seed,
                         deterministic=cfg.deterministic)
    return engine, tokenizer, path


def make_sglang_engine_and_tokenizer(cfg: RolloutConfig) -> tuple[Any, Any, Path]:
    """SGLang engine; the tokenizer comes from engine.model (a local copy of the served checkpoint) or, if unset,
    from the tokenizer_path the server reports (/model_info), which must then be readable here too. Start-up only:
    the one metadata request is blocking (like loading a local model)."""
    from transformers import AutoTokenizer

    from agentrl.engine.models import resolve_model
    from agentrl.engine.sglang import SGLangEngine, checkpoint_facts, read_tokenizer_path

    e = cfg.engine
    if e.model is not None:
        path = resolve_model(e.model)
    else:
        served = read_tokenizer_path(e.router_url or e.urls[0], via_router=e.router_url is not None)
        if not Path(served).is_dir():
            raise ConfigError(f"the SGLang server's tokenizer_path {served!r} is not a directory on this machine: "
                              "pass --model with a local copy of the served checkpoint (engine.model)")
        path = Path(served)
    tokenizer = AutoTokenizer.from_pretrained(path)
    eos, window = checkpoint_facts(path)
    engine = SGLangEngine(
        urls=e.urls, router_url=e.router_url, eos_token_ids=eos, context_window=e.context_window or window,
        model_path=str(path), max_connections=e.max_connections, request_timeout_s=e.request_timeout_s,
        connect_timeout_s=e.connect_timeout_s, control_timeout_s=e.control_timeout_s, retries=e.retries,
        retry_backoff_s=e.retry_backoff_s, weight_update=e.weight_update, max_sessions=e.max_sessions,
        deterministic=cfg.deterministic)
    return engine, tokenizer, path


def make_vllm_engine_and_tokenizer(cfg: RolloutConfig) -> tuple[Any, Any, Path]:
    """vLLM engine; the tokenizer comes from engine.model (a local copy of the served checkpoint) or, if unset, from
    the `root` path GET /v1/models reports, which must then be readable here too. Start-up only (blocking)."""
    from transformers import AutoTokenizer

    from agentrl.engine.models import resolve_model
    from agentrl.engine.sglang import checkpoint_facts
    from agentrl.engine.vllm import VLLMEngine, read_served_model

    e = cfg.engine
    served = None
    if e.model is not None:
        path = resolve_model(e.model)
    else:
        served, root = read_served_model(e.urls[0])
        if not root or not Path(root).is_dir():
            raise ConfigError(f"the vLLM server serves {served!r} from {root!r}, not a directory on this machine: "
                              "pass --model with a local copy of the served checkpoint (engine.model)")
        path = Path(root)
    tokenizer = AutoTokenizer.from_pretrained(path)
    eos, window = checkpoint_facts(path)
    engine = VLLMEngine(
        urls=e.urls, eos_token_ids=eos, context_window=e.context_window or window, model_path=str(path),
        served_model=served, max_connections=e.max_connections, request_timeout_s=e.request_timeout_s,
        connect_timeout_s=e.connect_timeout_s, control_timeout_s=e.control_timeout_s, retries=e.retries,
        retry_backoff_s=e.retry_backoff_s, pause_mode=e.pause_mode, max_sessions=e.max_sessions)
    return engine, tokenizer, path


def _renderer(env: Env, tokenizer: Any) -> Any:
    """The env's system prompt already describes its tools, so the template is not given them again."""
    from agentrl.tools.render import ChatRenderer

    return ChatRenderer(tokenizer)


def make_drift(mode: str, renderer: Any) -> Any:
    """The deferred drift check's worker process pool for `renderer` (mode `deferred`), else None. Close it with
    `await worker.aclose()` when the run ends."""
    if mode != "deferred":
        return None
    from agentrl.tools.drift import DeferredDrift

    return DeferredDrift(renderer)


def tune_gc(enabled: bool) -> Any:
    """Start-up is over: apply the collector policy (`gc_tune`, agentrl/cli/gc_policy.py). Returns the process's
    GcMonitor (installed whether or not the policy is on: the run reports what the collector cost either way)."""
    from agentrl.cli.gc_policy import process_monitor, tune

    if enabled:
        log.info("gc: %s", tune())
    return process_monitor()


def make_scorer(specs: list[RewardSpec], env: Env, tasks: list[Task] | None = None) -> Scorer:
    """The run's reward: `specs` weighted; sources that need the task's prompt get it from `env` (by task id)."""
    by_id = {t.id: t for t in (tasks if tasks is not None else env.tasks())}

    def prompt_messages(traj: Any) -> list[Any]:
        task = by_id.get(traj.task_id)
        if task is None:
            raise ConfigError(f"trajectory {traj.id}: task {traj.task_id!r} is not a task of env {env.name!r}")
        return env.messages(task)

    return Scorer(specs, prompt_messages=prompt_messages)


def _config_hash(cfg: RolloutConfig) -> str:
    """What was run, not where it was written: two runs of one config into two files hash the same."""
    # drift_check is monitoring and gc_tune the collector's schedule: the trajectories are the same
    skip = {"out", "resume", "summary_json", "drift_check", "gc_tune"}
    return hashlib.sha256(cfg.model_dump_json(exclude=skip).encode()).hexdigest()[:16]


async def run_rollout(cfg: RolloutConfig) -> int:
    console = Console(stderr=True)
    random.seed(cfg.seed)
    env = get_env(cfg.env, **cfg.env_options)
    check_time_needs(env, tool_timeout_s=cfg.budgets.tool_timeout_s, finalize_timeout_s=cfg.budgets.finalize_timeout_s)
    check_ttl_covers_budgets(cfg.budgets, cfg.sandbox)
    tasks = select_tasks(env, cfg.tasks, cfg.task_ids)
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
        engine, tokenizer, model_path = await asyncio.to_thread(make_engine_and_tokenizer, cfg)
        try:
            if hasattr(engine, "connect"):  # a server engine: fail fast with a clear message if it is unreachable
                await engine.connect()
            gc_cost, lag = await _run_groups(cfg, env, todo, engine, tokenizer, model_path, store, console)
        finally:
            await engine.close()
        all_trajs = read_trajectories(cfg.out)
        summary = summarize(all_trajs, wall_s=time.perf_counter() - t0)
        summary["gc"] = gc_cost  # this process's collector cost (the trajectories above may span resumed runs)
        summary["loop_lag"] = lag  # how late the runner's event loop woke during this run
    console.print(summary_table(summary))
    console.print(f"gc: {gc_cost['gc_collections']} collections (gen 0/1/2), {gc_cost['gc_s']:.2f} s, longest pause "
                  f"{gc_cost['gc_max_pause_ms']:.0f} ms")
    console.print(f"event loop lag: p50 {lag['p50_ms']:.1f} ms, p99 {lag['p99_ms']:.1f} ms, max {lag['max_ms']:.0f} ms "
                  f"({lag['ticks']} ticks)")
    if cfg.summary_json:
        cfg.summary_json.write_text(json.dumps(summary, indent=2))
    return 0


async def _run_groups(cfg: RolloutConfig, env: Env, todo: list[Task], engine: Any, tokenizer: Any,
                      model_path: Path, store: TrajectoryStore, console: Console
                      ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run `todo` and store each group as it completes. Returns what the collector cost during the run and how
    late the event loop woke (agentrl.runner.LoopLag)."""
    context_window = cfg.budgets.context_window or engine.context_window
    sampling = cfg.sampling.model_copy(update={
        "seed": cfg.sampling.seed if cfg.sampling.seed is not None else cfg.seed,
        "stop_token_ids": cfg.sampling.stop_token_ids or list(engine.eos_token_ids)})
    budgets = Budgets(max_turns=cfg.budgets.max_turns, max_completion_tokens=cfg.budgets.max_completion_tokens,
                      context_window=context_window, tool_timeout_s=cfg.budgets.tool_timeout_s)
    renderer = _renderer(env, tokenizer)
    drift = make_drift(cfg.drift_check, renderer)
    tune_gc(cfg.gc_tune)
    rollout = Rollout(env=env, engine=engine, renderer=renderer, sampling=sampling, budgets=budgets,
                      drift_check=cfg.drift_check, drift_worker=drift)
    spec = spec_for_env(cfg.sandbox.spec.model_copy(update={"default_timeout_s": cfg.budgets.tool_timeout_s}), env)
    meta = {"model": str(model_path), "engine": engine.info(), "sampling": sampling.model_dump(),
            "config_hash": _config_hash(cfg), "seed": cfg.seed, "deterministic": cfg.deterministic,
            "agentrl_version": agentrl.__version__,
            "env_options": dict(cfg.env_options), "sandbox_spec": spec.model_dump()}
    backend = cfg.sandbox.backend.type
    pool = pool_from_config(cfg, spec, uuid.uuid4().hex[:12], env)
    scorer = make_scorer(cfg.reward, env, todo)
    sched = Scheduler(rollout, pool, SchedulerConfig.from_config(cfg), meta=meta, scorer=scorer)
    console.print(f"rollout: env {env.name}, {len(todo)} tasks x {cfg.group_size} samples, model {model_path.name}, "
                  f"sandbox {backend}, out {cfg.out}")
    lag = await LoopLag().start()
    try:
        async with pool, scorer:
            with ProgressDisplay(sched.progress, console) as display, GcMonitor() as gc_monitor:
                async for group in sched.run(todo):
                    await asyncio.to_thread(store.append_group, group)  # write + fsync off the event loop
                    display.tick()
    finally:
        await lag.stop()
        if drift is not None:
            await drift.aclose()
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
            raise ConfigError(f'{path}:{lineno}: expected {{"task_id": ..., "solution": "<python source>"}} ({exc})')
    return out


async def check_env(name: str, *, solutions: Path | None, backend: str, json_out: Path | None,
                    options: dict[str, Any], tasks: int | None, concurrency: int,
                    unsafe_no_isolation: bool = False) -> int:

    env = get_env(name, **options)
    todo = select_tasks(env, tasks, [])
    given = _load_solutions(solutions) if solutions else None
    pool = make_pool(backend, env.sandbox_spec, warm=min(concurrency, 4), max_sandboxes=concurrency,
                     run_id=uuid.uuid4().hex[:12], unsafe_no_isolation=unsafe_no_isolation,
                     backend_options=env_backend_options(backend, env))
    sem = asyncio.Semaphore(concurrency)
    # an env may list extra solutions with a required verdict (e.g. a no-op and a test-only patch must fail); those
    # envs also get the reference scored twice, and the two reports must agree
    check_cases = getattr(env, "check_cases", None) if given is None else None

    async def score(task: Task, solution: str) -> TestReport:
        try:
            async with lease_sandbox(pool, env, task) as sb:
                return await env.score_solution(sb, task, solution)
        except Exception as exc:  # noqa: BLE001 - e.g. the solution killed its sandbox: score 0, check the rest
            reason = f"the sandbox broke while scoring this solution: {type(exc).__name__}: {exc}"
            return TestReport(passed=0, total=0, error=reason[:500])

    async def case_problems(task: Task, solution: str, first: TestReport) -> list[str]:
        problems = []
        for label, case, must_pass in check_cases(task):
            r = await score(task, case)
            ok = bool(r.total) and r.passed == r.total
            if ok != must_pass:
                problems.append(f"the {label} {'passed' if ok else 'failed'} (it must {'pass' if must_pass else 'fail'})")
        again = await score(task, solution)
        if [(o.name, o.passed) for o in again.outcomes] != [(o.name, o.passed) for o in first.outcomes]:
            problems.append("a second run of the reference gave a different report")
        return problems

    async def one(task: Task) -> tuple[Task, TestReport]:
        async with sem:  # a task's every case in one slot: results (and progress lines) come task by task
            return await check_one(task)

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
    async with pool:
        for fut in asyncio.as_completed([one(t) for t in todo]):
            task, report = await fut
            results.append((task, report))
            mark = "ok " if report.total and report.passed == report.total else "FAIL"
            print(f"{mark} {task.id:40s} {report.passed}/{report.total}" + (f"  ({report.error})" if report.error else ""))
            sys.stdout.flush()
    order = {t.id: i for i, t in enumerate(todo)}
    results.sort(key=lambda r: order[r[0].id])
    full = sum(1 for _, r in results if r.total and r.passed == r.total)
    print(f"total: {full}/{len(results)} tasks pass all tests; "
          f"{sum(r.passed for _, r in results)}/{sum(r.total for _, r in results)} tests passed")
    if json_out:
        json_out.write_text(json.dumps([{"task_id": t.id, "passed": r.passed, "total": r.total, "error": r.error,
                                         "outcomes": [o.model_dump() for o in r.outcomes]} for t, r in results],
                                       indent=1))
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

