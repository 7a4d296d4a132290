"""Many trajectories in flight: the real runner, scheduler, renderer, pipeline and store over the simulated engine and
sandbox pool (agentrl.testing.simulated). Reports, per size (concurrent trajectories): event-loop lag p50/p99 (a
10 ms ticker's lateness), runner CPU per tool call (process CPU time / tool calls: everything that is not the
simulated sleeps), memory per in-flight trajectory (peak RSS growth / trajectories), store write throughput, and
the over-sampling cut on a heavy tail (seconds per step with and without `oversample`).

`--drift-check` picks where the per-turn drift check runs (deferred: in a worker process after the last turn, whose
CPU is reported separately as worker_cpu_ms_per_tool_call; inline: on the event loop; off). `--gc-tune` freezes the
start-up objects and raises the gen-0 GC threshold before the runs (what a composition root could do).

    PYTHONPATH=. python benchmarks/bench_scale.py --sizes 100 500 2000 --turns 8
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrl.runner import Budgets, Rollout, Scheduler, SchedulerConfig
from agentrl.store import TrajectoryStore
from agentrl.testing.simulated import SimulatedEngine, SimulatedEnv, SimulatedPool, number_replies
from agentrl.tools.drift import DeferredDrift
from agentrl.tools.render import ChatRenderer
from agentrl.trainer.pipeline import PipelineConfig, RolloutPipeline, TaskStream
from agentrl.types import SamplingParams


def tokenizer() -> Any:
    from transformers import AutoTokenizer

    from agentrl.engine.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(None))


def build(tok: Any, n: int, turns: int, *, exec_p50_s: float, death_p: float, group_size: int = 8,
          drift: str = "inline", worker: DeferredDrift | None = None
          ) -> tuple[Scheduler, SimulatedEngine, SimulatedPool, SimulatedEnv]:
    env = SimulatedEnv(tasks=max(1, n // group_size))
    engine = SimulatedEngine(tok, number_replies(), decode_s=0.0005, batch_knee=512)
    pool = SimulatedPool(exec_p50_s=exec_p50_s, death_p=death_p, max_sandboxes=n + 64)
    rollout = Rollout(env=env, engine=engine, renderer=ChatRenderer(tok, env.tools),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=32, seed=1),
                      budgets=Budgets(max_turns=turns, max_completion_tokens=100_000, context_window=100_000,
                                      tool_timeout_s=60), drift_check=drift, drift_worker=worker)
    cfg = SchedulerConfig(group_size=group_size, max_trajectories=n, infra_retries=3, max_unscored_frac=1.0)
    return Scheduler(rollout, pool, cfg), engine, pool, env


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def lag_probe(samples: list[float], rss: list[int], stop: asyncio.Event, period: float = 0.01) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        t = loop.time()
        await asyncio.sleep(period)
        samples.append(max(0.0, loop.time() - t - period))
        if len(samples) % 10 == 0:
            rss.append(rss_bytes())


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


async def one_size(tok: Any, n: int, turns: int, out_dir: Path, drift: str) -> dict[str, Any]:
    worker = DeferredDrift(ChatRenderer(tok, SimulatedEnv.tools)) if drift == "deferred" else None
    worker_cpu0 = await worker.worker_cpu_s() if worker else 0.0  # started (and its renderer built) before timing
    sched, engine, pool, env = build(tok, n, turns, exec_p50_s=0.05, death_p=0.002, drift=drift, worker=worker)
    lags: list[float] = []
    rss: list[int] = []
    stop = asyncio.Event()
    rss0 = rss_bytes()
    probe = asyncio.create_task(lag_probe(lags, rss, stop))
    store = TrajectoryStore(out_dir / f"scale-{n}.jsonl")
    store_s, stored = 0.0, 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    handles = [sched.submit(task) for task in env.tasks()]
    for fut in asyncio.as_completed(handles):
        group = await fut
        ts = time.perf_counter()
        await asyncio.to_thread(store.append_group, group)
        store_s += time.perf_counter() - ts
        stored += len(group)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    worker_cpu = await worker.worker_cpu_s() - worker_cpu0 if worker else 0.0
    if worker:
        await worker.aclose()
    peak = max(rss, default=rss0) - rss0
    stop.set()
    await probe
    store.close()
    calls = max(sched.progress.tool_calls, 1)
    return {"trajectories": stored, "turns": turns, "wall_s": round(wall, 2), "tool_calls": calls,
            "loop_lag_p50_ms": round(pct(lags, 0.5) * 1e3, 2), "loop_lag_p99_ms": round(pct(lags, 0.99) * 1e3, 2),
            "cpu_ms_per_tool_call": round(cpu / calls * 1e3, 3),
            "worker_cpu_ms_per_tool_call": round(worker_cpu / calls * 1e3, 3),
            "drift_check": drift, "drift_check_errors": sched.progress.drift_check_errors,
            "mem_kib_per_trajectory": round(peak / max(stored, 1) / 1024, 1),
            "store_traj_per_s": round(stored / max(store_s, 1e-9), 1),
            "sandbox_deaths": pool.deaths, "infra_errors": sched.progress.infra_errors,
            "prefix_cached_frac": round(engine.cached_tokens / max(1, engine.input_tokens), 3),
            "renderer": dict(sched.rollout.renderer.stats)}  # which render paths were taken (fast / full)


async def oversample_run(tok: Any, oversample: float, steps: int, batch: int) -> dict[str, Any]:
    """Seconds per step of a pipeline (k=0) on a heavy tail, with and without over-sampling."""
    sched, _, pool, env = build(tok, 4096, 4, exec_p50_s=0.05, death_p=0.0)
    tasks = {t.id: t for t in env.tasks()}
    pipe = RolloutPipeline(sched, tasks, PipelineConfig(batch_groups=batch, max_staleness=0, oversample=oversample),
                           stream=TaskStream(lambda e: list(tasks)))
    t0 = time.perf_counter()
    cancelled = 0
    ids = list(tasks)
    for step in range(steps):
        await pipe.batch(step, ids[step * batch:(step + 1) * batch])  # the synchronous mode follows these
        cancelled += pipe.counters[step].groups_cancelled
    per_step = (time.perf_counter() - t0) / steps
    await pipe.close()
    return {"oversample": oversample, "s_per_step": round(per_step, 3), "groups_cancelled": cancelled,
            "sandboxes_alive_after": pool.alive}


async def main(args: argparse.Namespace) -> None:
    tok = tokenizer()
    out: dict[str, Any] = {"load_avg_before": os.getloadavg(), "sizes": {}, "oversample": [],
                           "drift_check": args.drift_check, "gc_tune": args.gc_tune}
    if args.gc_tune:
        gc.collect()
        gc.freeze()  # start-up objects (tokenizer, modules) are never scanned again
        gc.set_threshold(50_000, 20, 20)
    with tempfile.TemporaryDirectory() as d:
        for n in args.sizes:
            out["sizes"][n] = await one_size(tok, n, args.turns, Path(d), args.drift_check)
            print(n, out["sizes"][n], file=sys.stderr)
    for o in (1.0, 1.25):
        out["oversample"].append(await oversample_run(tok, o, args.steps, args.batch))
        print(out["oversample"][-1], file=sys.stderr)
    out["load_avg_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 500, 2000])
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--drift-check", choices=["deferred", "inline", "off"], default="deferred")
    p.add_argument("--gc-tune", action="store_true")
    asyncio.run(main(p.parse_args()))
