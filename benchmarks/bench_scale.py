"""Many trajectories in flight: the real runner, scheduler, renderer, pipeline and store over the simulated engine and
sandbox pool (agentrl.testing.simulated). Reports, per size (concurrent trajectories): event-loop lag p50/p99 (a
10 ms ticker's lateness), runner CPU per tool call (process CPU time / tool calls: everything that is not the
simulated sleeps; and the same net of the CPU spent inside the event loop's waits, i.e. the cost of idling and
waking the thread, which dominates when events arrive one at a time: see WaitMeter), memory per in-flight trajectory (peak RSS growth / trajectories), store write throughput, and
the over-sampling cut on a heavy tail (seconds per step with and without `oversample`).

`--drift-check` picks where the per-turn drift check runs (inline, the default here and in the product's config: on
the event loop; deferred: in a worker process after the last turn, whose CPU is reported separately as
worker_cpu_ms_per_tool_call; off). Every result records the mode it ran with (`drift_check`). `--gc` applies the CLI's
collector policy after start-up (tuned, the default of `gc_tune`: agentrl/cli/gc_policy.py) or leaves CPython's
defaults (default); each size reports what the collector cost (collections, seconds, longest pause).

`--workload` picks the simulated edges' costs:
- stress: tool commands with a 50 ms median (lognormal, p99/p50 ~ 33x), a decode step of 0.5 ms growing to 2.5 ms at
  2,000 calls in flight, prefills in parallel without limit. ~10,000 turns/s are asked of the runner while all
  2,000 run (first ~2 s), then the heavy tail drains; a turn rate ~30x the one below.
- seed: the workload of the issue's own numbers (80,000 container executions in a 5-12 minute step with 1,300-1,800
  sandboxes alive: ~110-270 tool calls/s). Tool commands 1 s median (mean 3.1 s, p99 33 s: "tens of seconds"),
  a decode step of 10 ms growing to 88 ms at 2,000 in flight, prefills sharing 50,000 tokens/s (a chunked-prefill
  engine). ~400 turns/s at 2,000 in flight, held for tens of seconds.

`--engine sglang` replaces the in-process simulated engine by the real SGLang engine client (agentrl.engine.sglang:
the request body with the whole context's token ids, JSON, HTTP over loopback, the answer parsed into a Generation)
talking to a stand-in SGLang server (agentrl.engine.standin.sglang, the SGLang face with its contract check) in its own
process, whose model is the same simulated engine (same decode/prefill costs). `--obs-chars N` makes every tool
output N characters long, so contexts grow by a few hundred tokens per turn (long multi-turn contexts: each turn's
request carries all of them). The runner process's CPU per tool call then includes the client's per-turn cost; the
server process's CPU is reported apart (server_cpu_ms_per_tool_call), as the sandbox and the model are not counted.

    PYTHONPATH=. python benchmarks/bench_scale.py --sizes 100 500 2000 --turns 8              # drift check inline
    PYTHONPATH=. python benchmarks/bench_scale.py --workload seed --sizes 2000 --turns 8 --steps 0
    PYTHONPATH=. python benchmarks/bench_scale.py --engine sglang --obs-chars 2000 --sizes 2000 --turns 8 --steps 0
    PYTHONPATH=. python benchmarks/bench_scale.py --event-density 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import selectors
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrl.cli.gc_policy import GcMonitor, tune
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


WORKLOADS: dict[str, dict[str, Any]] = {
    "stress": {"exec_p50_s": 0.05, "engine": {"decode_s": 0.0005, "batch_knee": 512}},
    "seed": {"exec_p50_s": 1.0, "engine": {"decode_s": 0.01, "batch_knee": 256, "prefill_tokens_per_s": 50_000}},
}


class LongOutputEnv(SimulatedEnv):
    """SimulatedEnv whose tool outputs are `obs_chars` long (a log's worth of lines): long multi-turn contexts."""

    def __init__(self, tasks: int, obs_chars: int) -> None:
        super().__init__(tasks=tasks)
        line = "INFO step {i:05d} finished: checked 17 files, 0 warnings, cache hit\n"
        self.padding = "".join(line.format(i=i) for i in range(obs_chars // len(line) + 1))[:obs_chars]

    async def call_tool(self, sandbox: Any, call: Any, *, task: Any) -> Any:
        r = await super().call_tool(sandbox, call, task=task)
        return r.model_copy(update={"output": f"{r.output}\n{self.padding}"})


CONTEXT = 131_072  # context window of the sglang runs (the simulated model behind the stand-in has no limit)


def build(tok: Any, n: int, turns: int, *, exec_p50_s: float, death_p: float, group_size: int = 8,
          drift: str = "inline", worker: DeferredDrift | None = None, engine_kw: dict[str, Any] | None = None,
          engine: Any = None, obs_chars: int = 0) -> tuple[Scheduler, Any, SimulatedPool, SimulatedEnv]:
    """`engine`: a generation engine to use instead of a fresh in-process SimulatedEngine (the SGLang client)."""
    tasks = max(1, n // group_size)
    env = LongOutputEnv(tasks, obs_chars) if obs_chars else SimulatedEnv(tasks=tasks)
    if engine is None:
        engine = SimulatedEngine(tok, number_replies(), **(engine_kw or WORKLOADS["stress"]["engine"]))
    pool = SimulatedPool(exec_p50_s=exec_p50_s, death_p=death_p, max_sandboxes=n + 64)
    rollout = Rollout(env=env, engine=engine, renderer=ChatRenderer(tok, env.tools),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=32, seed=1),
                      budgets=Budgets(max_turns=turns, max_completion_tokens=100_000, context_window=100_000,
                                      tool_timeout_s=60), drift_check=drift, drift_worker=worker)
    cfg = SchedulerConfig(group_size=group_size, max_trajectories=n, infra_retries=3, max_unscored_frac=1.0)
    return Scheduler(rollout, pool, cfg), engine, pool, env


class WaitMeter(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The event loop's selector, metered: how many times the loop waited for an event (a select with a timeout
    other than 0) and the CPU time spent inside those waits. That CPU is the kernel's cost of putting the thread to
    sleep and waking it (on this VM 25-40 us per wake-up, measured by a bare `asyncio.sleep` loop), paid once per
    event when events arrive one at a time. It is charged to the process like the runner's work, but it is not
    the runner's work: the same count of events costs it in any runner."""

    waits = 0
    cpu_s = 0.0

    def select(self, timeout: float | None = None) -> Any:
        if timeout is not None and timeout <= 0:
            return super().select(timeout)
        c = time.thread_time()
        try:
            return super().select(timeout)
        finally:
            self.waits += 1
            self.cpu_s += time.thread_time() - c


METER = WaitMeter()  # the selector of the loop main() runs on


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


async def probe_cpu_s_per_s(seconds: float = 2.0) -> tuple[float, float]:
    """CPU seconds per second the lag probe costs on an otherwise idle loop (subtracted from the runner's CPU: the
    instrument is not the runner): in all, and inside the loop's waits."""
    stop = asyncio.Event()
    cpu0, t0, wait0 = time.process_time(), time.perf_counter(), METER.cpu_s
    probe = asyncio.create_task(lag_probe([], [], stop))
    await asyncio.sleep(seconds)
    stop.set()
    await probe
    wall = time.perf_counter() - t0
    return (time.process_time() - cpu0) / wall, (METER.cpu_s - wait0) / wall


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def serve_standin(port: int, workload: str) -> None:
    """The stand-in SGLang server (its SGLang face: contract check, admission, JSON answer) over the workload's
    simulated model, on 127.0.0.1:`port`, until killed (`--serve-standin`: the server process of --engine sglang)."""
    from agentrl.engine.standin.sglang_contract import generate_validator
    from agentrl.engine.standin.sglang import StandIn
    from agentrl.engine.standin.core import StandInServer

    async def serve() -> None:
        engine = SimulatedEngine(tokenizer(), number_replies(), context_window=CONTEXT, **WORKLOADS[workload]["engine"])
        standin = StandIn(engine, model_path="simulated", validator=generate_validator(), worker_id=f"bench:{port}",
                          context_window=CONTEXT, max_log=1)
        server = StandInServer(standin, "127.0.0.1", port)
        await server.start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


class StandInProcess:
    """`--serve-standin` in a child process; its CPU seconds read from /proc (utime + stime of the process)."""

    def __init__(self, workload: str) -> None:
        import socket
        import subprocess

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve-standin", str(self.port), "--workload",
                                      workload], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"the stand-in server did not start (exit {self.proc.poll()})")
        self.url = f"http://127.0.0.1:{self.port}"

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


async def one_size(tok: Any, n: int, turns: int, out_dir: Path, drift: str, workload: str = "stress",
                   engine: str = "simulated", obs_chars: int = 0) -> dict[str, Any]:
    from agentrl.engine.sglang import SGLangEngine

    probe_cpu, probe_wait_cpu = await probe_cpu_s_per_s()
    worker = DeferredDrift(ChatRenderer(tok, SimulatedEnv.tools)) if drift == "deferred" else None
    worker_cpu0 = await worker.worker_cpu_s() if worker else 0.0  # started (and its renderer built) before timing
    w = WORKLOADS[workload]
    server = StandInProcess(workload) if engine == "sglang" else None
    client = None
    if server is not None:  # the real client, connected (model_info read) before timing
        client = SGLangEngine(urls=[server.url], eos_token_ids=[tok.eos_token_id], context_window=CONTEXT)
        await client.connect()
    server_cpu0 = server.cpu_s() if server else 0.0
    sched, engine_obj, pool, env = build(tok, n, turns, exec_p50_s=w["exec_p50_s"], death_p=0.002, drift=drift,
                                         worker=worker, engine_kw=w["engine"], engine=client, obs_chars=obs_chars)
    lags: list[float] = []
    rss: list[int] = []
    stop = asyncio.Event()
    rss0 = rss_bytes()
    probe = asyncio.create_task(lag_probe(lags, rss, stop))
    store = TrajectoryStore(out_dir / f"scale-{n}.jsonl")
    store_s, stored = 0.0, 0
    cpu0, t0, waits0, wait_cpu0 = time.process_time(), time.perf_counter(), METER.waits, METER.cpu_s
    in_flight_s = 0.0  # how long all n trajectories were running at once (before the first group was done)
    contexts: list[int] = []  # each trajectory's final context (prompt + every turn), tokens
    with GcMonitor() as gc_mon:
        handles = [sched.submit(task) for task in env.tasks()]
        for fut in asyncio.as_completed(handles):
            group = await fut
            in_flight_s = in_flight_s or time.perf_counter() - t0
            ts = time.perf_counter()
            await asyncio.to_thread(store.append_group, group)
            store_s += time.perf_counter() - ts
            stored += len(group)
            contexts += [len(t.prompt_ids) + len(t.completion_ids) for t in group]
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    server_cpu = server.cpu_s() - server_cpu0 if server else 0.0
    if server is not None:
        await client.close()
        server.close()
    waits, wait_cpu = METER.waits - waits0, METER.cpu_s - wait_cpu0
    worker_cpu = await worker.worker_cpu_s() - worker_cpu0 if worker else 0.0
    if worker:
        await worker.aclose()
    peak = max(rss, default=rss0) - rss0
    stop.set()
    await probe
    store.close()
    calls = max(sched.progress.tool_calls, 1)
    sent = {}
    if server is not None:
        sent = {"server_cpu_ms_per_tool_call": round(server_cpu / calls * 1e3, 3),
                "final_context_tokens_mean": round(sum(contexts) / max(len(contexts), 1)),
                "final_context_tokens_max": max(contexts, default=0)}
    return {"workload": workload, "engine": engine, "obs_chars": obs_chars, "trajectories": stored, "turns": turns,
            "wall_s": round(wall, 2),
            "all_in_flight_s": round(in_flight_s, 2), "tool_calls": calls,
            "loop_lag_p50_ms": round(pct(lags, 0.5) * 1e3, 2), "loop_lag_p99_ms": round(pct(lags, 0.99) * 1e3, 2),
            "loop_lag_p999_ms": round(pct(lags, 0.999) * 1e3, 2),
            "loop_lag_max_ms": round(max(lags, default=0) * 1e3, 2),
            **gc_mon.summary(),
            "cpu_ms_per_tool_call": round((cpu - probe_cpu * wall) / calls * 1e3, 3),
            # the same, net of the CPU spent inside the loop's waits (going idle and waking: see WaitMeter)
            "cpu_net_of_waits_ms_per_tool_call":
                round((cpu - wait_cpu - (probe_cpu - probe_wait_cpu) * wall) / calls * 1e3, 3),
            "loop_waits_per_tool_call": round(waits / calls, 2),
            "wait_cpu_ms_per_tool_call": round(wait_cpu / calls * 1e3, 3),
            "probe_cpu_ms_per_tool_call": round(probe_cpu * wall / calls * 1e3, 3),
            "worker_cpu_ms_per_tool_call": round(worker_cpu / calls * 1e3, 3),
            "drift_check": drift, "drift_check_errors": sched.progress.drift_check_errors,
            "mem_kib_per_trajectory": round(peak / max(stored, 1) / 1024, 1),
            "store_traj_per_s": round(stored / max(store_s, 1e-9), 1),
            "sandbox_deaths": pool.deaths, "infra_errors": sched.progress.infra_errors,
            **({"prefix_cached_frac": round(engine_obj.cached_tokens / max(1, engine_obj.input_tokens), 3)}
               if server is None else sent),
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


async def bare_wakeup_cpu_us(gap_s: float, n: int = 2000) -> float:
    """CPU per wake-up of an event loop with nothing else to do, sleeping `gap_s` on average between wake-ups: what
    idling and waking the thread costs on this machine (a floor no runner can go below, paid once per event when
    events arrive one at a time)."""
    rng = random.Random(0)
    c0 = time.thread_time()
    for _ in range(n):
        await asyncio.sleep(gap_s * 2 * rng.random())
    return (time.thread_time() - c0) / n * 1e6


async def density_run(tok: Any, n: int, turns: int, exec_p50_s: float) -> float:
    """Loop-thread CPU seconds for n trajectories x `turns` (drift check off, no probe, nothing stored)."""
    sched, _, _, env = build(tok, n, turns, exec_p50_s=exec_p50_s, death_p=0.0, drift="off",
                             engine_kw={"decode_s": exec_p50_s / 100, "batch_knee": 256})
    c0 = time.thread_time()
    await asyncio.gather(*(sched.submit(task) for task in env.tasks()))
    return time.thread_time() - c0


async def event_density(tok: Any, n: int) -> dict[str, Any]:
    """The same runner work at three event densities: CPU per turn = (CPU at 8 turns - CPU at 1 turn) / 7 / n (the
    per-trajectory start and end cancel out). Only the tool latency (and the decode step with it) differs, so what
    changes is how many events each loop wake-up finds ready."""
    out: dict[str, Any] = {"trajectories": n, "bare_wakeup_cpu_us": {}}
    for gap in (0.0005, 0.002, 0.01):
        out["bare_wakeup_cpu_us"][f"{gap * 1e3:g}ms"] = round(await bare_wakeup_cpu_us(gap), 1)
    for p50 in (0.002, 0.2, 2.0):
        one, eight = await density_run(tok, n, 1, p50), await density_run(tok, n, 8, p50)
        out[f"tool_p50_{p50:g}s_cpu_us_per_turn"] = round((eight - one) / 7 / n * 1e6, 1)
        print(out, file=sys.stderr)
    return out


async def main(args: argparse.Namespace) -> None:
    tok = tokenizer()
    out: dict[str, Any] = {"load_avg_before": os.getloadavg(), "sizes": {}, "oversample": [],
                           "drift_check": args.drift_check, "gc": args.gc, "workload": args.workload,
                           "engine": args.engine, "obs_chars": args.obs_chars}
    if args.gc == "tuned":
        out["gc_tune"] = tune()  # what the CLI does once start-up is over
    if args.event_density:
        print(json.dumps({"gc": args.gc, **await event_density(tok, args.event_density)}, indent=1))
        return
    with tempfile.TemporaryDirectory() as d:
        for n in args.sizes:
            out["sizes"][n] = await one_size(tok, n, args.turns, Path(d), args.drift_check, args.workload,
                                             args.engine, args.obs_chars)
            print(n, out["sizes"][n], file=sys.stderr)
    for o in (1.0, 1.25) if args.steps else ():
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
    p.add_argument("--drift-check", choices=["deferred", "inline", "off"], default="inline",
                   help="where the per-turn drift check runs (default inline, as in the product's config)")
    p.add_argument("--engine", choices=["simulated", "sglang"], default="simulated",
                   help="sglang: the real SGLang client against a stand-in server process (see above)")
    p.add_argument("--obs-chars", type=int, default=0, help="tool output length in characters (0: short outputs)")
    p.add_argument("--serve-standin", type=int, metavar="PORT", help=argparse.SUPPRESS)
    p.add_argument("--gc", choices=["tuned", "default"], default="tuned")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="stress")
    p.add_argument("--event-density", type=int, default=0, metavar="N",
                   help="instead: CPU per turn of N trajectories at three event densities, and a bare loop's "
                        "CPU per wake-up")
    parsed = p.parse_args()
    if parsed.serve_standin:
        serve_standin(parsed.serve_standin, parsed.workload)
        sys.exit(0)
    with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(METER)) as runner:
        runner.run(main(parsed))
