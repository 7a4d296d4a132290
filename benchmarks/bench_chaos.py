"""Chaos soak (issue 22: the policy must not own what judges it): the real `agentrl rollout` under outside faults and
hostile completions at known rates, on the local (bubblewrap) and docker backends.

What runs for real: the `agentrl rollout` CLI process (runner, scheduler, store, the code_tests env with hermes tool
calls, sandboxes, the http reward source). Only the model is scripted: a ScriptedEngine served over HTTP by the
SGLang stand-in. Every trajectory (task, sample) is assigned, deterministically from `--seed`, one of:

    honest   writes the reference solution (and a marker file naming its trajectory), checks it, ends
    attack   one of ATTACKS, the one attack list of `agentrl.testing.scripted_attacks`: grader attacks (forged
             verdicts, magic __eq__, exit/kill during grading, planted modules), workspace attacks (a solution.py
             that is a FIFO / directory / symlink / symlink chain / 80 MB), sandbox attacks (fork bomb, memory bomb,
             signalling the agent, a daemon that rewrites solution.py) and tool-call JSON attacks (a 5,000-digit
             integer, lone surrogates, 5,000-deep nesting)
    fault    the honest script, and on its first attempt an outside fault from the host (fault_kinds()): the
             sandbox deleted (local: its state dir removed and its process group killed, as a sweep does; docker:
             `docker rm -f`), bubblewrap or the container killed, its agent SIGKILLed, either while the model
             generates or while the policy's command runs; every engine request of a turn reset (the engine is
             gone for the client's whole retry budget) or only one (a blip the client absorbs); the reward service
             answering 503 to every request (past its retries) or to one

    dockerd restart  (docker, `--dockerd-restart-every SECONDS`) the sandboxes run on a private dockerd this script
             starts (its own socket, data root, exec root, pid file; no bridge, no iptables: the sandboxes have no
             network), with the sandbox image loaded into it by `docker save | docker load`; every SECONDS of the
             chaos run it gets SIGTERM (no live-restore: it stops every container) and is started again. Before
             each SIGTERM the script records the attempts in flight: the sandboxes running in that engine, by the
             marker each trajectory's first command writes (attacks get that first command too when restarts
             run), and the leased ones with no marker yet, matched afterwards to the attempt whose error names
             them. Each must be recorded infra_error and retried to a right score (or have been done with its
             sandbox: its own record final and scored right). The machine's dockerd is never touched; the private
             one is stopped, unmounted and removed at the end (atexit too)

The runner derives trajectory ids from the seed (`--deterministic`), so the engine, the reward service and the fault
injector know every request's (task, sample, attempt). A fault hits attempt 0 only; the retry runs clean.

Invariants (per backend): trajectories lost (requested - stored) = 0; every injected fault that is not absorbed
inside a client is recorded as infra_error (the CLI's retry log names its error_kind) and retried to a clean,
fully scored record (a reward service that keeps failing may instead leave the record unscored, infra_error
reward_failed with reward None, after the source's own retries: never a 0); absorbed blips leave an ok record
with the honest reward and show the retry on the server side; every attack is scored (never infra_error, never
retried, reward 0); the run completes. A clean run of the same size (all honest, no faults) gives the wall-time
baseline.

    python benchmarks/bench_chaos.py [--backend local docker] [--tasks 25 --group-size 20] [--seed 0]
                                     [--attack-rate 0.3] [--fault-rate 0.35] [--concurrency 16] [--no-clean]
                                     [--attacks NAME ...] [--faults KIND ...] [--workdir DIR] [--json FILE]
                                     [--dockerd-restart-every SECONDS]

The pieces it runs are the chaos test tier's (tests/chaos/: chaos_plan, chaos_faults, chaos_dockerd,
chaos_services, chaos_run, chaos_judge; `pytest -m chaos tests/chaos` runs a small soak); the attacks are the one
list of `agentrl.testing.scripted_attacks`. This script times them: a clean run (all honest, no faults) as the
wall-time baseline, then the chaos run, and prints the tables of BENCHMARKS.md. The code under test is whatever
`agentrl` PYTHONPATH (or the venv) gives the CLI.

Needs bubblewrap as root (uid-separated sandboxes) for local, a Docker Engine and the agentrl/python image for
docker. Exit status 1 when an invariant fails. Sandboxes of this run only are touched: the local state root is
private to the run, and a sandbox is only acted on when its workspace holds the marker of one of this run's
trajectories (read from the host through /proc/<agent pid>/root).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "chaos"))  # the chaos harness is test code

from chaos_dockerd import SANDBOX_IMAGE, PrivateDockerd, start_private_dockerd  # noqa: E402
from chaos_judge import judge  # noqa: E402
from chaos_plan import ATTACKS, ENV_OPTIONS, Slot, fault_kinds, make_plan  # noqa: E402
from chaos_run import run_once  # noqa: E402

from agentrl.envs import get_env  # noqa: E402


def uptime() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def table(reports: list[dict[str, Any]]) -> str:
    rows = ["| backend | requested | stored | lost | faults injected / planned | faults infra + retried | "
            "attacks scored | honest full reward | wall s (clean) | wall s (chaos) | chaos / clean | "
            "load (chaos run) |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in reports:
        clean = r.get("clean_wall_s")
        ratio = f"{r['wall_s'] / clean:.2f}x" if clean else "-"
        rows.append(f"| {r['backend']} | {r['requested']} | {r['stored']} | {r['lost']} | "
                    f"{r['faults_injected']} / {r['faults_planned']} | {r['faults_handled']} / {r['faults_planned']} | "
                    f"{r['attacks_scored']} / {r['attacks_planned']} | {r['honest']['ok']} / {r['honest']['n']} | "
                    f"{clean if clean else '-'} | {r['wall_s']} | {ratio} | "
                    f"{r['load'].get('mean', '-')} mean, {r['load'].get('max', '-')} max |")
    return "\n".join(rows)


def fault_table(reports: list[dict[str, Any]]) -> str:
    rows = ["| backend | fault | n | injected | infra + retried to a full score | first attempt's error_kind |",
            "| --- | --- | ---: | ---: | ---: | --- |"]
    for r in reports:
        for name, f in sorted(r["faults"].items()):
            kinds = ", ".join(f"{k} x{n}" for k, n in sorted(f["kinds"].items())) or "-"
            n_pre = f.get("preempted_by_restart", 0)
            pre = f" ({n_pre} pre-empted by a dockerd restart)" if n_pre else ""
            rows.append(f"| {r['backend']} | {name} | {f['n']} | {f['injected']}{pre} | {f['handled']} | {kinds} |")
    return "\n".join(rows)


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    from transformers import AutoTokenizer

    from agentrl.engine.models import resolve_model

    model_path = resolve_model(None)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    env = get_env("code_tests", **ENV_OPTIONS)
    tasks = list(env.tasks())[: args.tasks]
    task_ids = [t.id for t in tasks]
    # the CLI runs in workdir: `python -m` puts its cwd first on sys.path, so the code under test is PYTHONPATH's
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="agentrl-chaos-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    dockerd = None
    if args.dockerd_restart_every and "docker" in args.backend:
        dockerd = await asyncio.to_thread(start_private_dockerd, SANDBOX_IMAGE)
    try:
        return await _run_backends(args, tasks, task_ids, tokenizer, model_path, workdir, dockerd)
    finally:
        if dockerd is not None:
            left = await asyncio.to_thread(dockerd.cleanup)
            print(f"private dockerd stopped and removed{'; LEFT: ' + ', '.join(left) if left else ''}",
                  file=sys.stderr)



async def _run_backends(args: argparse.Namespace, tasks: list[Any], task_ids: list[str], tokenizer: Any,
                        model_path: Path, workdir: Path, dockerd: PrivateDockerd | None) -> list[dict[str, Any]]:
    reports = []
    for backend in args.backend:
        plan = make_plan(task_ids, args.group_size, seed=args.seed, attack_rate=args.attack_rate,
                         fault_rate=args.fault_rate, backend=backend, attacks=args.attacks,
                         faults=[f for f in args.faults or [] if f in fault_kinds(backend)] or None)
        load_before = uptime()
        clean_wall, clean_info = None, {}
        if not args.no_clean:
            clean_plan = {k: Slot(k[0], k[1], "honest", "") for k in plan}
            clean = await run_once(backend=backend, tasks=tasks, group_size=args.group_size, seed=args.seed,
                                   plan=clean_plan, chaos=False, tokenizer=tokenizer, model_path=model_path,
                                   concurrency=args.concurrency, workdir=workdir, dockerd=dockerd)
            clean_report = judge(clean, clean_plan)
            clean_wall = clean_report["wall_s"]
            clean_info = {k: clean_report[k] for k in ("stored", "lost", "load", "rc", "final_infra_error")}
            clean_info["honest_full_reward"] = clean_report["honest"]["ok"]
            print(f"[{backend}] clean run: {clean_report['stored']}/{clean_report['requested']} stored, "
                  f"{clean_report['honest']['ok']} full reward, {clean_wall} s", file=sys.stderr)
        run = await run_once(backend=backend, tasks=tasks, group_size=args.group_size, seed=args.seed, plan=plan,
                             chaos=True, tokenizer=tokenizer, model_path=model_path, concurrency=args.concurrency,
                             workdir=workdir, dockerd=dockerd, restart_every_s=args.dockerd_restart_every)
        report = judge(run, plan, restarts_expected=backend == "docker" and args.dockerd_restart_every > 0)
        report.update({"clean_wall_s": clean_wall, "clean": clean_info, "load_before": load_before,
                       "load_after": uptime(),
                       "seed": args.seed, "attack_rate": args.attack_rate, "fault_rate": args.fault_rate,
                       "concurrency": args.concurrency, "workdir": str(workdir),
                       "fault_log": [asdict(r) for r in run.faults],
                       "restart_log": [asdict(r) for r in run.restarts]})
        reports.append(report)
        print(f"[{backend}] chaos run: {json.dumps(report['invariants'])}", file=sys.stderr)
    return reports


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", nargs="+", default=["local", "docker"], choices=["local", "docker"])
    p.add_argument("--tasks", type=int, default=25, help="first N easy tasks (47 in all)")
    p.add_argument("--group-size", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--attack-rate", type=float, default=0.3)
    p.add_argument("--fault-rate", type=float, default=0.35)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--attacks", nargs="+", help=f"only these attacks (default all: {' '.join(ATTACKS)})")
    p.add_argument("--faults", nargs="+", help="only these faults (default all; see fault_kinds())")
    p.add_argument("--no-clean", action="store_true", help="skip the clean baseline run")
    p.add_argument("--dockerd-restart-every", type=float, default=0.0, metavar="SECONDS",
                   help="docker: run the sandboxes (clean and chaos runs) on a private dockerd this script starts, "
                        "and restart it (SIGTERM, start again) every SECONDS during the chaos run (default 0: off, "
                        "the machine's engine)")
    p.add_argument("--workdir", help="where trajectories, configs and CLI logs are kept (default: a temp dir)")
    p.add_argument("--json", type=Path, help="write the full report here")
    args = p.parse_args()
    reports = asyncio.run(main_async(args))
    print(table(reports))
    print()
    print(fault_table(reports))
    for r in reports:
        for name, a in sorted(r["attacks"].items()):
            if a["bad"]:
                print(f"{r['backend']}: attack {name}: {a['n'] - a['scored']} not scored: {a['bad'][:3]}")
        for name, f in sorted(r["faults"].items()):
            if f["bad"]:
                print(f"{r['backend']}: fault {name}: {f['n'] - f['handled']} not handled: {f['bad'][:3]}")
        if r["honest"]["bad"]:
            print(f"{r['backend']}: honest not scored in full: {r['honest']['bad'][:3]}")
        if "dockerd_restarts" in r:
            d = r["dockerd_restarts"]
            print(f"{r['backend']}: dockerd restarted {d['restarts']}x (away {d['down_s']} s): {d['affected']} "
                  f"attempts in flight ({d['marked']} by their marker, {d['unmarked_leased']} leased before their "
                  f"first command, {len(d['unmarked_unmapped'])} of these named by no error), "
                  f"{d['infra_retried_scored']} recorded infra + retried to a score ({d['kinds']}), "
                  f"{d['done_before_death']} done with their sandbox before it died, {len(d['bad'])} wrong "
                  f"{d['bad'][:3]}; warm sandboxes lost {d['warm']}; attempts recorded with a restart's infra "
                  f"kind {d['restart_infra_attempts']} ({d['restart_infra_attempts_unidentified']} not in flight at "
                  f"a snapshot: leased between the snapshot and the SIGTERM, or while dockerd was away)")
    if args.json:
        args.json.write_text(json.dumps(reports, indent=1, default=str))
    return 0 if all(all(r["invariants"].values()) for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
