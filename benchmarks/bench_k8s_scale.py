"""The Kubernetes backend at the seeds' scale, by simulation: thousands of sandbox pods on a real control plane.

    .venv/bin/python benchmarks/bench_k8s_scale.py --sizes 100 500 2000

One command starts everything, runs it and tears it down:
- the dev cluster (k8s/dev-cluster/up.sh: real etcd, kube-apiserver, kube-scheduler, kube-controller-manager, from
  Debian's Kubernetes source), unless it already runs;
- hollow nodes (k8s/dev-cluster/hollow-nodes.sh: kubemark from the same source tree, a real kubelet with a fake
  container runtime), enough for the largest size; the real scheduler binds the sandbox pods there, the real
  kubelets run them (fake containers) and report them Running and Ready (the kubelet's own TCP readiness probe);
- a simulated agent (agentrl.testing.sim_agent) at the address every hollow pod reports as its IP: agentrl's own
  client talks HTTP to it; its latency is the real agent's exec round trip on the dev cluster (--agent-p50-ms,
  --agent-p99-ms: measure with `bench_k8s.py --real`) plus the command's run time (--command-p50-s).

The harness's one change to the product's pods: their readiness probe runs every 10 s (--probe-s) instead of every
second. On a cluster each node's kubelet probes its own pods and each agent answers its own probes; here all of them
land on this machine's 2 cores and one simulated agent (2,000 TCP connections a second at 2,000 pods, which starved
the run: at 1 s only 471 of 2,000 warm pods stayed Ready). Everything that talks to Kubernetes is the product's own
code: KubernetesBackend with the `pods` control plane (its
informer, QPS bucket, claims by conditional update, refill, sweep), under a real SandboxPool and Scheduler (the
runner) with the simulated engine. The `agent-sandbox` control plane is not run: it needs the SIG's controller,
which nothing installable here provides (tests/k8s holds it to a fake controller). Per size S (warm pods =
trajectories in flight = S) it reports:

  fill        S warm pods from nothing to Ready: seconds and the refill rate (pods/s)
  run         S trajectories at once through one runner (the start of a step: every claim at once, so the k-th
              waits ~k / qps in the client's rate limit: the burst's p50/p99 and how long until all S held a
              sandbox), then, while they are in flight, steady-state claims (one create() + destroy every
              --probe-every-s: claim patch + agent health) p50/p99 of the warm hits, and how many found no warm
              pod Ready (the refill behind: a cold start, counted apart); the most calls queued in the client's
              rate limit; trajectories that got no sandbox, API requests per trajectory and per second (against the
              QPS budget), 429s, resourceVersion conflicts, event-loop lag p50/p99, the runner's RSS growth from
              holding the informer's S pods, kube-apiserver and etcd CPU (% of one core) and RSS
  leaks       pods of the run never deleted after close (must be 0), and how long until all were gone (a deleted
              pod waits for its kubelet; at most --gone-limit-s)
  orphans     a runner that claimed S pods is SIGKILLed; a new runner's start-up sweep deletes them: the sweep
              call's seconds and until the last pod is gone

`--json FILE` writes every figure. Results and the load: BENCHMARKS.md. `--deadline-s S` ends a run that takes
longer with a report of where every pod stands and why (k8s_scale_stall.py), and tears everything down as always.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from agentrl.runner import Budgets, Rollout, Scheduler, SchedulerConfig
from agentrl.runner.lag import LoopLag
from agentrl.sandbox import SandboxPool, SandboxSpec
from agentrl.sandbox.kubernetes import KubernetesBackend
from agentrl.sandbox.kubernetes.pods import is_ready
from agentrl.testing.simulated import SimulatedEngine, SimulatedEnv, number_replies
from agentrl.tools.render import ChatRenderer
from agentrl.types import SamplingParams, TestOutcome, TestReport, ToolResult

sys.path.insert(0, str(Path(__file__).resolve().parent))
from k8s_scale_fleet import K8S_DIR, NS, PODS_PER_NODE, PORT, Fleet, stall_report  # noqa: E402
from loop_stalls import StallSampler  # noqa: E402

PROBE_PERIOD_S = 10  # --probe-s
SPEC = SandboxSpec(image="agentrl/python:latest", cpus=0.01, memory="16m", disk="16m", ttl_s=3600)
TEMPLATE = {"spec": {"nodeSelector": {"agentrl.io/hollow": "true"},
                     "tolerations": [{"key": "agentrl.io/hollow", "operator": "Equal", "value": "true",
                                      "effect": "NoSchedule"}]}}


def backend(pool: str, args: argparse.Namespace, **kw: Any) -> ScaleBackend:
    fields = {"namespace": NS, "pool": pool, "agent_port": PORT, "agent_cpus": 0.01, "agent_memory_mb": 64,
              "pod_template": TEMPLATE, "qps": args.qps, "burst": args.burst, "start_timeout_s": 900,
              "max_pending": args.max_pending, **kw}
    return ScaleBackend(**fields)


class ScaleBackend(KubernetesBackend):
    """KubernetesBackend, unchanged, with each create() timed (warm hits apart)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.claims_s: list[float] = []
        self.cold_s: list[float] = []
        self.agent_s: list[float] = []  # of each warm claim: from the claimed pod to its agent answering
        self.api_s: dict[str, list[float]] = {}  # by verb: the API call's time, client rate limit included

    async def _connect(self) -> None:
        await super()._connect()
        api = self.api
        assert api is not None
        request = api.request

        async def timed(method: str, path: str, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return await request(method, path, **kw)
            finally:
                self.api_s.setdefault(method, []).append(time.perf_counter() - t)

        api.request = timed  # type: ignore[method-assign]
        manifest = self.plane._manifest

        def probed_less(*a: Any, **kw: Any) -> Any:  # the harness's one change to the product's pods: see --probe-s
            m = manifest(*a, **kw)
            for c in m["spec"]["containers"]:
                if "readinessProbe" in c:
                    c["readinessProbe"]["periodSeconds"] = PROBE_PERIOD_S
            return m

        self.plane._manifest = probed_less

    async def create(self, spec: SandboxSpec, labels: dict[str, str]) -> Any:
        t = time.perf_counter()
        h = await super().create(spec, labels)
        (self.claims_s if h.timings.get("warm_hit") else self.cold_s).append(time.perf_counter() - t)
        if h.timings.get("warm_hit"):
            self.agent_s.append(h.timings["agent_ready_s"])
        return h


# ---------------------------------------------------------------- the simulated fleet


class ScaleEnv(SimulatedEnv):
    """SimulatedEnv through a real Sandbox: each tool call is one `echo` on the (simulated) agent."""

    async def call_tool(self, sandbox: Any, call: Any, *, task: Any) -> Any:
        value = str(call.arguments.get("code", "")).removeprefix("print(").removesuffix(")").strip()
        r = await sandbox.exec(f"echo {value}", timeout=60)
        sandbox.last = r.stdout.strip()
        return ToolResult(call_id=call.id, name=call.name, output=f"exit {r.exit_code}\n{r.stdout[:200]}",
                          exit_code=r.exit_code, stdout=r.stdout[:200], duration_s=r.duration_s,
                          timed_out=r.timed_out)

    async def finalize(self, sandbox: Any, task: Any) -> TestReport:
        r = await sandbox.exec(f"echo {getattr(sandbox, 'last', '')}", timeout=60)
        right = r.stdout.strip() == str(task.data["number"])
        return TestReport(passed=int(right), total=1, outcomes=[TestOutcome(name="prints_number", passed=right)])


def proc_stats(pid: int) -> tuple[float, int]:
    """CPU seconds (user + system) and RSS bytes of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    rss = next(int(line.split()[1]) * 1024 for line in Path(f"/proc/{pid}/status").read_text().splitlines()
               if line.startswith("VmRSS:"))
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), rss


def control_plane() -> dict[str, int]:
    out = {}
    for name in ("kube-apiserver", "etcd"):
        f = K8S_DIR / "run" / f"{name}.pid"
        if f.exists():
            out[name] = int(f.read_text())
    return out


def open_fds(pid: int | str = "self") -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


FDS: dict[str, int] = {"runner": 0, "agent": 0}
STAGE: dict[str, Any] = {"phase": "starting the fleet", "backend": None}  # for the stall report
GONE_LIMIT = {"s": 600.0}  # --gone-limit-s
QUEUE = {"max": 0}


async def watch_queue(b: KubernetesBackend) -> None:
    """The most API calls waiting in the client's gate (rate limit and threads) at once during the run."""
    QUEUE["max"] = 0
    while b.api is not None:
        QUEUE["max"] = max(QUEUE["max"], b.api._gate.waiting())
        await asyncio.sleep(0.1)


async def watch_fds(agent_pid: int) -> None:
    """The most file descriptors the runner and the simulated agent held (a socket per connection)."""
    while True:
        FDS["runner"] = max(FDS["runner"], open_fds())
        FDS["agent"] = max(FDS["agent"], open_fds(agent_pid))
        await asyncio.sleep(0.5)


# ---------------------------------------------------------------- measurements


def rss_bytes() -> int:
    return proc_stats(os.getpid())[1]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


async def pods_left(b: KubernetesBackend, selector: str) -> tuple[int, int]:
    """Pods matching `selector`: all of them, and those nobody has deleted (no deletionTimestamp)."""
    assert b.api is not None
    got = (await b.api.list(f"/api/v1/namespaces/{NS}/pods", selector))["items"]
    return len(got), sum(1 for p in got if not p["metadata"].get("deletionTimestamp"))


async def until_gone(b: KubernetesBackend, selector: str) -> tuple[float, int, int]:
    """Seconds until no pod matches `selector` (at most --gone-limit-s), then the pods left and those of them never
    deleted. A pod deleted but not gone waits for its kubelet: kubemark's fake runtime answers some kills with "not
    found" and the kubelet retries on its sync period, which can take minutes; that is the simulation's, not a leak."""
    t = time.perf_counter()
    left, undeleted = await pods_left(b, selector)
    while left and time.perf_counter() - t < GONE_LIMIT["s"]:
        await asyncio.sleep(1.0)
        left, undeleted = await pods_left(b, selector)
    return time.perf_counter() - t, left, undeleted


def ready_warm(b: KubernetesBackend) -> int:
    return sum(1 for p in b.plane.informer.objects.values()
               if (p["metadata"].get("labels") or {}).get("agentrl.io/state") == "warm" and is_ready(p)
               and not p["metadata"].get("deletionTimestamp"))


async def one_size(n: int, args: argparse.Namespace, tok: Any) -> dict[str, Any]:
    pool_name = f"scale-{n}"
    out: dict[str, Any] = {"size": n}
    procs = control_plane()
    rss0 = rss_bytes()
    b = backend(pool_name, args, warm=n)
    STAGE.update(phase=f"[{n}] fill", backend=b)
    cp0 = {k: proc_stats(p) for k, p in procs.items()}
    t0 = time.perf_counter()
    await b.warm_up(SPEC)
    while ready_warm(b) < n:
        if time.perf_counter() - t0 > args.fill_timeout_s:
            print(await asyncio.to_thread(stall_report, NS, K8S_DIR, b), flush=True)
            raise SystemExit(f"size {n}: only {ready_warm(b)} of {n} warm pods Ready after {args.fill_timeout_s}s")
        await asyncio.sleep(0.2)
    fill_s = time.perf_counter() - t0
    out["fill_s"], out["refill_pods_per_s"] = fill_s, n / fill_s
    out["informer_rss_mb"] = (rss_bytes() - rss0) / 2**20
    print(f"[{n}] fill: {n} warm pods Ready in {fill_s:.1f} s ({n / fill_s:.1f} pods/s); runner RSS +"
          f"{out['informer_rss_mb']:.0f} MB", flush=True)

    # S trajectories at once through the real runner, each leasing one sandbox
    env = ScaleEnv(tasks=max(1, n // args.group_size))
    n_traj = len(env.tasks()) * args.group_size
    engine = SimulatedEngine(tok, number_replies(), decode_s=0.0005, batch_knee=512)
    rollout = Rollout(env=env, engine=engine, renderer=ChatRenderer(tok, env.tools),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=32, seed=1),
                      budgets=Budgets(max_turns=args.turns, max_completion_tokens=100_000, context_window=100_000,
                                      tool_timeout_s=60))
    cfg = SchedulerConfig(group_size=args.group_size, max_trajectories=n, infra_retries=3, max_unscored_frac=1.0)
    lag = await LoopLag(0.01).start()
    sampler = await StallSampler(args.stall_sample_s).start() if args.stall_sample_s else None
    assert b.api is not None
    calls0, status0 = dict(b.api.calls), dict(b.api.statuses)
    b.api_s.clear()
    cpu0 = time.process_time()
    cp1 = {k: proc_stats(p) for k, p in procs.items()}
    t1 = time.perf_counter()
    peak = 0
    queue = asyncio.create_task(watch_queue(b))
    STAGE["phase"] = f"[{n}] run"
    async with SandboxPool(b, SPEC, max_sandboxes=n, start_timeout_s=900, max_starting=n) as pool:
        sched = Scheduler(rollout, pool, cfg)
        futs = [asyncio.ensure_future(sched.submit(task)) for task in env.tasks()]
        while len(b.claims_s) + len(b.cold_s) < n_traj and not all(f.done() for f in futs):
            peak = max(peak, len(pool._active))
            await asyncio.sleep(0.2)
        burst_s = time.perf_counter() - t1
        burst_claims = list(b.claims_s)
        # steady state: one claim (create + destroy) every probe_every_s while the run's trajectories are in flight
        probe_s, probe_cold, in_flight = [], [], []
        for _ in range(args.probe_claims):
            if all(f.done() for f in futs):
                break
            in_flight.append(len(pool._active))
            peak = max(peak, len(pool._active))
            t = time.perf_counter()
            h = await b.create(SPEC, {"agentrl/run-id": "probe"})
            # a warm claim, or a cold start when the refill had no warm pod Ready (counted apart)
            (probe_s if h.timings.get("warm_hit") else probe_cold).append(time.perf_counter() - t)
            await b.destroy(h)
            await asyncio.sleep(args.probe_every_s)
        groups = await asyncio.gather(*futs)
        queue.cancel()
    run_s = time.perf_counter() - t1
    runner_cpu = time.process_time() - cpu0
    await lag.stop()
    if sampler is not None:
        await sampler.stop()
        print(f"[{n}] {sampler.report()}", flush=True)
        out["loop_stalls"] = [{"s": st.ended - st.started, "loop_cpu_s": st.cpu_s,
                               "top_stacks": [[list(k), c] for k, c in st.stacks.most_common(3)]}
                              for st in sampler.stalls]
    cp2 = {k: proc_stats(p) for k, p in procs.items()}
    trajs = [t for g in groups for t in g]
    statuses: dict[str, int] = {}
    kinds: dict[str, int] = {}  # why the errors were errors (runner.attribution's error_kind)
    messages: Counter[str] = Counter()  # and what they said (digits folded, so that one cause counts once)
    for t in trajs:
        statuses[t.status] = statuses.get(t.status, 0) + 1
        if t.error_kind:
            kinds[t.error_kind] = kinds.get(t.error_kind, 0) + 1
            messages[f"{t.error_kind}: {re.sub(r'[0-9]+', 'N', (t.error or '').partition(chr(10))[0][:300])}"] += 1
    calls = {k: v - calls0.get(k, 0) for k, v in b.api.calls.items() if v != calls0.get(k, 0)}
    errors = {k: v - status0.get(k, 0) for k, v in b.api.statuses.items() if v != status0.get(k, 0)}
    total = sum(calls.values())
    lags = lag.summary()
    out.update({
        "run_s": run_s, "trajectories": len(trajs), "statuses": statuses, "error_kinds": kinds,
        "error_messages": messages.most_common(5),
        "claims": len(b.claims_s), "cold": len(b.cold_s), "peak_in_flight": peak, "burst_s": burst_s,
        "burst_claim_p50_ms": 1000 * pct(burst_claims, 0.5), "burst_claim_p99_ms": 1000 * pct(burst_claims, 0.99),
        "claim_p50_ms": 1000 * pct(probe_s, 0.5), "claim_p99_ms": 1000 * pct(probe_s, 0.99),
        "probe_claims": len(probe_s), "probe_in_flight_min": min(in_flight, default=0),
        "probe_cold": len(probe_cold), "probe_cold_p50_s": pct(probe_cold, 0.5) if probe_cold else None,
        "rate_limit_queue_max": QUEUE["max"],
        "cold_p50_s": pct(b.cold_s, 0.5) if b.cold_s else None,
        "api_calls": calls, "api_per_trajectory": total / max(1, len(trajs)), "api_per_s": total / run_s,
        "qps_budget": args.qps, "http_errors": errors, "conflicts": b.plane.counters["claim_conflicts"],
        "runner_cpu_pct": 100 * runner_cpu / run_s,
        "agent_health_p50_ms": 1000 * pct(b.agent_s, 0.5), "agent_health_p99_ms": 1000 * pct(b.agent_s, 0.99),
        "api_ms": {verb: {"p50": 1000 * pct(xs, 0.5), "p99": 1000 * pct(xs, 0.99), "n": len(xs)}
                   for verb, xs in b.api_s.items()},
        "loop_lag_p50_ms": lags["p50_ms"], "loop_lag_p99_ms": lags["p99_ms"], "loop_lag_max_ms": lags["max_ms"],
        "control_plane_fill": {k: {"cpu_pct": 100 * (cp1[k][0] - cp0[k][0]) / fill_s, "rss_mb": cp1[k][1] / 2**20}
                               for k in procs},
        "control_plane_run": {k: {"cpu_pct": 100 * (cp2[k][0] - cp1[k][0]) / run_s, "rss_mb": cp2[k][1] / 2**20}
                              for k in procs},
    })
    for text, count in messages.most_common(5):
        print(f"[{n}] error x{count}: {text}", flush=True)
    print(f"[{n}] run: {len(trajs)} trajectories in {run_s:.1f} s, statuses {statuses} (errors by kind {kinds}), "
          f"peak {peak} in flight; "
          f"burst: {n} claims in {burst_s:.1f} s, p50 {out['burst_claim_p50_ms']:.0f} ms p99 "
          f"{out['burst_claim_p99_ms']:.0f} ms ({len(b.cold_s)} cold); steady claims (>= "
          f"{out['probe_in_flight_min']} in flight, n={len(probe_s)} warm + {len(probe_cold)} cold): p50 "
          f"{out['claim_p50_ms']:.0f} ms p99 {out['claim_p99_ms']:.0f} ms; most calls queued in the rate limit "
          f"{QUEUE['max']}; API {out['api_per_trajectory']:.2f}/trajectory, "
          f"{out['api_per_s']:.1f}/s (budget {args.qps:g}); "
          f"errors {errors}; conflicts {out['conflicts']}; loop lag p99 {out['loop_lag_p99_ms']:.1f} ms; runner CPU "
          f"{out['runner_cpu_pct']:.0f}%; API ms by verb {out['api_ms']}; claimed pod -> agent answers p50 "
          f"{out['agent_health_p50_ms']:.0f} ms p99 {out['agent_health_p99_ms']:.0f} ms", flush=True)
    STAGE["phase"] = f"[{n}] leaks"
    await b.close()
    out["leak_wait_s"], out["left"], out["leaked"] = await until_gone_fresh(args, f"agentrl.io/pool={pool_name}")
    print(f"[{n}] leaks: {out['leaked']} pods never deleted, {out['left']} not gone yet after "
          f"{out['leak_wait_s']:.1f} s (the rest wait for their kubelet)", flush=True)
    out.update(await orphans(n, args))
    return out


async def until_gone_fresh(args: argparse.Namespace, selector: str) -> tuple[float, int, int]:
    probe = backend("scale-probe", args)
    await probe.sweep(run_id="nothing-of-this-name")  # connects only
    try:
        return await until_gone(probe, selector)
    finally:
        await probe.close()


def dead_runner(n: int, qps: float, burst: int, max_pending: int) -> None:
    """The runner that dies: claims n pods (cold: a pool of its own, no warm pods), says so, waits for SIGKILL."""
    args = argparse.Namespace(qps=qps, burst=burst, max_pending=max_pending)

    async def hold() -> None:
        b = backend("scale-orphans", args)
        await asyncio.gather(*(b.create(SPEC, {"agentrl/run-id": "dead-run"}) for _ in range(n)))
        print(f"held {n}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(hold())


async def orphans(n: int, args: argparse.Namespace) -> dict[str, Any]:
    t = time.perf_counter()
    child = subprocess.Popen([sys.executable, __file__, "--dead-runner", str(n), "--probe-s", str(args.probe_s),
                              "--qps", str(args.qps),
                              "--burst", str(args.burst), "--max-pending", str(args.max_pending)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    STAGE["phase"] = f"[{n}] orphans: the runner that dies claims {n} pods"
    try:
        line = await asyncio.to_thread(child.stdout.readline)
        if not line.startswith("held"):
            raise SystemExit(f"the dead runner did not claim its pods (exit {child.poll()})")
    finally:  # also on the deadline: the thread reading its output ends when it does
        child.kill()
        child.wait()
    hold_s = time.perf_counter() - t
    b = backend("scale-orphans", args)
    STAGE.update(phase=f"[{n}] orphans: the new runner sweeps", backend=b)
    t0 = time.perf_counter()
    removed = await b.sweep()
    sweep_s = time.perf_counter() - t0
    gone_s, left, undeleted = await until_gone(b, "agentrl.io/pool=scale-orphans")
    await b.close()
    print(f"[{n}] orphans: a dead runner's {n} claimed pods (cold-started in {hold_s:.0f} s); the new runner's sweep "
          f"deleted {removed} in {sweep_s:.1f} s, all gone {sweep_s + gone_s:.1f} s after it started ({left} left, "
          f"{undeleted} of them never deleted)", flush=True)
    return {"orphan_cold_start_s": hold_s, "swept": removed, "sweep_s": sweep_s, "orphans_gone_s": sweep_s + gone_s,
            "orphans_left": left, "orphans_undeleted": undeleted}


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    from transformers import AutoTokenizer

    from agentrl.engine.models import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model(None))
    nodes = -(-int(max(args.sizes) * 1.1) // PODS_PER_NODE) + 1  # the dead runner's pods come after the run's
    fleet = Fleet(args.nodes or nodes, args)
    results = []
    fds = None
    me = asyncio.current_task()
    assert me is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, me.cancel)  # stopped: still tear down (finally)
    t0 = time.perf_counter()
    try:  # a failed start still stops what it started (the simulated agent, hollow nodes)
        fleet.up()
        assert fleet.agent is not None
        fds = asyncio.create_task(watch_fds(fleet.agent.pid))
        left = args.deadline_s - (time.perf_counter() - t0) if args.deadline_s else None
        try:
            async with asyncio.timeout(left):
                for n in args.sizes:
                    FDS.update(runner=0, agent=0)
                    results.append(await one_size(n, args, tok))
                    results[-1]["max_fds"] = dict(FDS)
                    print(f"[{n}] most open file descriptors: {FDS}", flush=True)
                    if args.json:
                        args.json.write_text(json.dumps(results, indent=1))
        except TimeoutError:
            print(f"deadline: {args.deadline_s:.0f} s passed during {STAGE['phase']}; where the pods stand:",
                  flush=True)
            print(await asyncio.to_thread(stall_report, NS, K8S_DIR, STAGE["backend"]), flush=True)
            raise SystemExit(f"the run passed --deadline-s {args.deadline_s:.0f} during {STAGE['phase']}") from None
    finally:
        if fds is not None:
            fds.cancel()
        fleet.down()
    return results


def table(results: list[dict[str, Any]]) -> str:
    rows = ["| warm pods = trajectories | fill (pods/s) | claim p50 / p99 (steady) | burst: all claimed in, p99 | "
            "peak in flight | no sandbox | API / trajectory | API/s "
            "(budget) | 429 / conflicts | loop lag p99 | informer RSS | apiserver CPU / RSS (run) | leaked | sweep "
            "of N orphans / all gone |", "|" + " --- |" * 14]
    for r in results:
        api = r["control_plane_run"].get("kube-apiserver", {})
        bad = r["statuses"].get("infra_error", 0)  # a trajectory whose sandbox never came
        rows.append(f"| {r['size']} | {r['fill_s']:.0f} s ({r['refill_pods_per_s']:.1f}) | "
                    f"{r['claim_p50_ms']:.0f} / {r['claim_p99_ms']:.0f} ms | {r['burst_s']:.0f} s, "
                    f"{r['burst_claim_p99_ms'] / 1000:.1f} s | {r['peak_in_flight']} | {bad} | "
                    f"{r['api_per_trajectory']:.2f} | "
                    f"{r['api_per_s']:.1f} ({r['qps_budget']:g}) | {r['http_errors'].get('429', 0)} / "
                    f"{r['conflicts']} | {r['loop_lag_p99_ms']:.1f} ms | {r['informer_rss_mb']:.0f} MB | "
                    f"{api.get('cpu_pct', 0):.0f}% / {api.get('rss_mb', 0):.0f} MB | {r['leaked']} | "
                    f"{r['sweep_s']:.1f} s / {r['orphans_gone_s']:.1f} s |")
    return "\n".join(rows)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 500, 2000])
    p.add_argument("--nodes", type=int, default=0, help="hollow nodes (default: enough for the largest size)")
    p.add_argument("--qps", type=float, default=50.0, help="the backend's client-side QPS (its default)")
    p.add_argument("--burst", type=int, default=100)
    p.add_argument("--max-pending", type=int, default=16, help="the backend's refill: pods not ready yet, at most")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4, help="GRPO group size (sizes should be multiples)")
    p.add_argument("--agent-p50-ms", type=float, default=2.5)
    p.add_argument("--agent-p99-ms", type=float, default=8.0)
    p.add_argument("--command-p50-s", type=float, default=10.0, help="a tool command's median run time")
    p.add_argument("--probe-claims", type=int, default=40, help="steady-state claims while the run is in flight")
    p.add_argument("--probe-every-s", type=float, default=1.0)
    p.add_argument("--fill-timeout-s", type=float, default=900)
    p.add_argument("--stall-sample-s", type=float, default=0, help="sample the runner loop's stack while it "
                   "stalls longer than this, and report where (benchmarks/loop_stalls.py; 0: off)")
    p.add_argument("--gone-limit-s", type=float, default=600, help="how long to wait for deleted pods to be gone")
    p.add_argument("--deadline-s", type=float, default=0, help="end the whole run after this long, with a report of "
                   "where every pod stands (0: no deadline)")
    p.add_argument("--probe-s", type=int, default=PROBE_PERIOD_S, help="the pods' readiness probe period")
    p.add_argument("--keep-cluster", action="store_true", help="leave a cluster this run started running")
    p.add_argument("--json", type=Path)
    p.add_argument("--dead-runner", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    PROBE_PERIOD_S = a.probe_s
    GONE_LIMIT["s"] = a.gone_limit_s
    if a.dead_runner:
        dead_runner(a.dead_runner, a.qps, a.burst, a.max_pending)
        sys.exit(0)
    try:
        res = asyncio.run(main(a))
    except asyncio.CancelledError:  # SIGTERM: main tore everything down
        sys.exit("stopped (SIGTERM); the fleet was torn down")
    print(table(res))
    for r in res:
        print(json.dumps({k: v for k, v in r.items() if k in ("size", "api_calls", "http_errors", "statuses",
                                                              "error_kinds", "api_ms",
                                                              "control_plane_fill", "control_plane_run")}))
