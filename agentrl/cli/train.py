"""`agentrl train` and `agentrl eval`: wiring the training job and checkpoint evaluation from a job config.

    agentrl train --config job.yaml [--resume] [--steps N] [--output-dir DIR] [--seed S] [--nproc N]
                  [--report-to tensorboard,wandb,trackio,mlflow]
    agentrl eval --checkpoint A [--baseline B] [--config job.yaml] [--out DIR] [--tasks N] [--samples K]
                 [--no-greedy]

The parts (env, engine + tokenizer from the checkpoint, renderer, sampling, budgets, sandbox pool, scorer,
config_hash) come from the composition root `agentrl.compose.build_run` and are handed to
`agentrl.trainer.job.Job` / `agentrl.trainer.eval.evaluate`. Under `torchrun` / `accelerate launch` (or
`--nproc N`, which starts `torchrun` on this machine with the same arguments) every rank runs `train`: rank 0 builds
the run's parts, the other ranks only the env, tasks and tokenizer (agentrl/trainer/dist.py). Registered into
the parser by `add_train_commands(subparsers)`.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agentrl.config import _deep_merge, load_config
from agentrl.errors import ConfigError
from agentrl.runner.guard import EXIT_UNSCORED, final_verdict


def add_train_commands(sub: Any) -> None:
    p = sub.add_parser("train", help="GRPO-train the policy (TRL) on an env through the real runner and sandboxes")
    p.add_argument("--config", type=Path, help="job YAML (agentrl.trainer.config.TrainConfig fields)")
    p.add_argument("--resume", action="store_true", help="continue output_dir from its last checkpoint")
    p.add_argument("--steps", type=int, help="total optimizer steps (overrides `steps`)")
    p.add_argument("--output-dir", type=Path, help="overrides `output_dir`")
    p.add_argument("--seed", type=int, help="overrides `seed`")
    p.add_argument("--deterministic", action="store_true", default=None,
                   help="identical trajectories, metrics and checkpoints per seed (slower; docs/determinism.md)")
    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="train on N processes on this machine (torchrun; rank 0 rolls out, every rank trains its "
                        "slice; docs/training.md, Scaling out)")
    p.add_argument("--report-to", action="append", metavar="TRACKER",
                   help="experiment trackers fed every per-step metric: tensorboard, wandb (offline unless WANDB_MODE "
                        "is set), trackio, mlflow; repeat or comma-separate; 'none' for none (overrides `report_to`)")
    p.set_defaults(func=_cmd_train)
    e = sub.add_parser("eval", help="score a checkpoint on a fixed task set (sampled + greedy), diff vs a baseline",
                       description="Means come with 95% bootstrap intervals over tasks; the candidate-vs-baseline "
                                   "difference with a paired sign-flip permutation test over tasks; a task is "
                                   "better/worse only when a permutation test of its samples says so (p < 0.05), "
                                   "else n.s.")
    e.add_argument("--checkpoint", required=True,
                   help="run output_dir (its last checkpoint), checkpoint dir, HF model dir, smollm2 or gemma3-270m")
    e.add_argument("--baseline", help="what to compare against (same forms as --checkpoint)")
    e.add_argument("--config", type=Path, help="job YAML for env / tasks / sampling (default: the run's config.json)")
    e.add_argument("--out", type=Path, help="report dir (default: <run>/eval/compare or ./eval-report)")
    e.add_argument("--tasks", type=int, help="evaluate the first N tasks (overrides eval.tasks)")
    e.add_argument("--samples", type=int, help="sampled runs per task (overrides eval.samples). A per-task verdict "
                   "needs enough of them: " + _samples_help())
    e.add_argument("--no-greedy", action="store_true", help="skip the greedy run")
    e.add_argument("--seed", type=int, help="overrides `seed`")
    e.add_argument("--deterministic", action="store_true", default=None,
                   help="same seed -> identical evaluation trajectories (docs/determinism.md)")
    e.set_defaults(func=_cmd_eval)


def _samples_help() -> str:
    from agentrl.trainer.eval_stats import samples_table

    return samples_table().replace("%", "%%")


# -- train --------------------------------------------------------------------------------------------------------

def _train_overrides(a: argparse.Namespace) -> dict[str, Any]:
    o: dict[str, Any] = {}
    for key, value in (("steps", a.steps), ("output_dir", a.output_dir), ("seed", a.seed),
                       ("deterministic", a.deterministic)):
        if value is not None:
            o[key] = str(value) if isinstance(value, Path) else value
    if getattr(a, "report_to", None):
        o["report_to"] = [n for item in a.report_to for n in item.split(",")]  # "none" clears; the config checks
    return o


def _quiet_libraries() -> None:
    """No per-file progress bars and no deprecation chatter from transformers in the per-step table."""
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\..*")


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def train_argv(a: argparse.Namespace) -> list[str]:
    """`train` and its arguments as parsed, without --nproc: what every rank runs."""
    argv = ["train"]
    for flag, value in (("--config", a.config), ("--steps", a.steps), ("--output-dir", a.output_dir),
                        ("--seed", a.seed)):
        if value is not None:
            argv += [flag, str(value)]
    for item in getattr(a, "report_to", None) or []:
        argv += ["--report-to", item]
    return argv + ["--resume"] * bool(a.resume) + ["--deterministic"] * bool(a.deterministic)


def launch_argv(nproc: int, argv: list[str]) -> list[str]:
    """The `torchrun` command that runs `agentrl <argv>` on `nproc` ranks of this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            "-m", "agentrl.cli", *argv]


def _cmd_train(a: argparse.Namespace) -> int:
    import os

    from agentrl.trainer.config import TrainConfig
    from agentrl.trainer.dist import Ranks

    if a.nproc < 1:
        raise ConfigError("--nproc must be >= 1")
    if a.nproc > 1:
        if Ranks.from_env().distributed:
            raise ConfigError("--nproc under torchrun / accelerate launch: the launcher already started the ranks; "
                              "drop --nproc")
        argv = launch_argv(a.nproc, train_argv(a))
        os.execv(argv[0], argv)  # torchrun owns the ranks now (and forwards SIGTERM / SIGINT to them)
    cfg = load_config(TrainConfig, a.config, _train_overrides(a))
    from agentrl.trainer.trackers import check_trackers, prepare_environment

    check_trackers(cfg.report_to)  # before the model loads
    prepare_environment(cfg.report_to, cfg.output_dir)  # before TRL imports the trackers' libraries
    _quiet_libraries()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # SIGTERM tears down like Ctrl-C
    try:
        result = run_train(cfg, resume=a.resume)
    except KeyboardInterrupt:
        print("interrupted: sandboxes removed; completed steps are kept (rerun with --resume)", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not result.is_main:
        return 0
    if result.stopped_by is not None:
        print(f"train: stopped after {result.steps_done} steps by the {result.stopped_by} (integrity.action: stop); "
              f"everything stored so far is kept: metrics {cfg.metrics_path}, trajectories {cfg.trajectories_path}, "
              f"checkpoints {cfg.checkpoints_dir}. Inspect with `agentrl stats {cfg.output_dir}` / `agentrl view`",
              file=sys.stderr)
        return 3
    print(f"train: done, {result.steps_done} steps; metrics {cfg.metrics_path}, trajectories "
          f"{cfg.trajectories_path}, checkpoints {cfg.checkpoints_dir}")
    if cfg.report_to:
        from agentrl.trainer.trackers import where

        print("trackers (trackers.json): " + "; ".join(where(cfg.output_dir)))
    return 0


def train_heartbeat(console: Any = None) -> Any:
    """The job's heartbeat (agentrl.trainer.job.Heartbeat): a progress line on `console` (default stderr) every
    HEARTBEAT_S seconds with the step, its phase (rollout, training, evaluation, snapshot) and the training
    scheduler's trajectories, turns, tool calls and tokens (in flight included). Always log lines, never a redrawn
    terminal line: the per-step table is printed between them."""
    from agentrl.cli.display import ProgressDisplay, progress_line

    def build(progress: Any, status: Any) -> Any:
        return ProgressDisplay(lambda: f"train {status()}: {progress_line(progress)}", console, live=False)

    return build


def run_train(cfg: Any, *, resume: bool = False, console: Any = None) -> Any:
    """Build the parts of `cfg` (agentrl.compose) and run the job (blocking). Returns the trainer's JobResult. The
    heartbeat goes to `console` (default stderr)."""
    from agentrl.trainer.dist import Ranks
    from agentrl.trainer.job import Job

    ranks = Ranks.from_env()
    parts = train_parts(cfg, main=ranks.is_main)
    try:
        return Job(cfg, parts, resume=resume, echo=lambda line: print(line, flush=True), ranks=ranks,
                   heartbeat=train_heartbeat(console)).run()
    finally:
        if ranks.is_main:
            asyncio.run(parts.run.aclose())
        ranks.stop()


def train_parts(cfg: Any, *, main: bool = True) -> Any:
    """The JobParts of a training job: the run's parts from the composition root plus the eval / snapshot tasks.
    `main=False`: a rank other than 0, which gets only the env, tasks and tokenizer (`build_rank_parts`)."""
    from agentrl.cli.wiring import tune_gc
    from agentrl.compose import build_rank_parts, build_run, select_tasks
    from agentrl.trainer.job import JobParts

    run = build_run(cfg) if main else build_rank_parts(cfg)
    eval_tasks = select_tasks(run.env, cfg.eval.tasks, cfg.eval.task_ids) if cfg.eval_every else []
    snap = cfg.snapshot
    snapshot_tasks = (select_tasks(run.env, None, snap.tasks) if isinstance(snap.tasks, list)
                      else select_tasks(run.env, snap.tasks, [])) if snap.every else []
    # a rank other than 0 gets RankParts: the job reads only its env, tasks, tokenizer and model path there
    return JobParts(run=run, eval_tasks=eval_tasks,  # type: ignore[arg-type]
                    snapshot_tasks=snapshot_tasks, gc_monitor=tune_gc(cfg.gc_tune))


# -- eval ---------------------------------------------------------------------------------------------------------

def _resolve(ref: str) -> Path:
    from agentrl.engine.models import is_embedded_name, resolve_model
    from agentrl.trainer.checkpoints import resolve_checkpoint

    if is_embedded_name(ref):
        return resolve_model(ref)
    return resolve_checkpoint(Path(ref))


def _eval_config(a: argparse.Namespace) -> Any:
    from agentrl.trainer.checkpoints import run_config
    from agentrl.trainer.config import TrainConfig

    overrides: dict[str, Any] = {}
    if a.tasks is not None:
        overrides.setdefault("eval", {})["tasks"] = a.tasks
    if a.samples is not None:
        overrides.setdefault("eval", {})["samples"] = a.samples
    if a.no_greedy:
        overrides.setdefault("eval", {})["greedy"] = False
    for key in ("seed", "deterministic"):
        if getattr(a, key) is not None:
            overrides[key] = getattr(a, key)
    if a.config is not None:
        return load_config(TrainConfig, a.config, overrides)
    saved = run_config(Path(a.checkpoint)) or {}
    try:
        return TrainConfig.model_validate(_deep_merge(saved, overrides))
    except ValidationError as exc:  # a run config written by another agentrl version
        raise ConfigError(f"cannot use the run's config.json for evaluation ({exc}); pass --config job.yaml") from None


def _cmd_eval(a: argparse.Namespace) -> int:
    cfg = _eval_config(a)
    _quiet_libraries()
    candidate = _resolve(a.checkpoint)
    baseline = _resolve(a.baseline) if a.baseline else None
    out = a.out or _default_eval_out(Path(a.checkpoint))
    tracked = _tracked_run(Path(a.checkpoint), candidate)
    rc = asyncio.run(run_eval(cfg, candidate, baseline, out))
    if tracked is not None:
        log_eval_to_trackers(tracked[0], tracked[1], out, cfg)
    return rc


def _tracked_run(checkpoint: Path, resolved: Path) -> tuple[Path, int] | None:
    """(run dir, step) when `checkpoint` is a training run (or one of its checkpoints) that logged to experiment
    trackers: `agentrl eval` then adds its results to the same tracker runs. Checks the libraries up front."""
    from agentrl.trainer.resume import checkpoint_step
    from agentrl.trainer.trackers import check_trackers, prepare_environment, read_state, tracked_names

    step = checkpoint_step(resolved)
    for run_dir in (checkpoint, *checkpoint.parents[:3]):
        state = read_state(run_dir)
        if state and step is not None:
            names = tracked_names(state)
            check_trackers(names)
            prepare_environment(names, run_dir)
            return run_dir, step
    return None


def log_eval_to_trackers(run_dir: Path, step: int, out: Path, cfg: Any) -> None:
    """The reports `run_eval` wrote into `out`, logged at the checkpoint's step as `eval_cli/<mode>/...` (and the
    baseline's as `eval_cli_baseline/...`) into the run's tracker runs (trackers.json)."""
    import json

    from agentrl.trainer.trackers import TrackerSet, read_state, tracked_names

    names = tracked_names(read_state(run_dir))
    with TrackerSet(run_dir, names, project=cfg.tracking.project, run_name=cfg.tracking.run_name) as trackers:
        for label, prefix in (("baseline", "eval_cli_baseline/"), ("candidate", "eval_cli/")):
            path = out / f"{label}.json"
            if path.exists():
                trackers.log_eval(step, json.loads(path.read_text()), prefix, now=True)
    print(f"eval: logged at step {step} to {', '.join(names)} (the run's trackers, {run_dir / 'trackers.json'})")


def _default_eval_out(checkpoint: Path) -> Path:
    from agentrl.trainer.checkpoints import run_config

    for candidate in (checkpoint, *checkpoint.parents[:3]):
        if (candidate / "checkpoints").is_dir() and run_config(candidate) is not None:
            return candidate / "eval" / "compare"
    return Path("eval-report")


async def eval_parts(cfg: Any, checkpoint: Path, *, env: Any = None, tasks: Any = None, pool: Any = None) -> Any:
    """The run's parts for evaluating `checkpoint` on the job's eval task set (agentrl.compose; the job's
    config_hash). `pool`: share the sandbox pool of the checkpoint evaluated before."""
    from agentrl.compose import build_run, run_env, select_tasks

    if env is None:
        env, _ = await asyncio.to_thread(run_env, cfg)
        tasks = select_tasks(env, cfg.eval.tasks, cfg.eval.task_ids)
    parts = await asyncio.to_thread(build_run, cfg, env=env, tasks=tasks, model=checkpoint, pool=pool)
    if cfg.engine.type != "local":  # a server serves what it last loaded: load the checkpoint being evaluated
        try:
            await _serve_checkpoint(parts.engine, parts.model_path)
            parts.meta["engine"] = parts.engine.info()
        except BaseException:
            await parts.aclose()
            raise
    return parts


async def _serve_checkpoint(engine: Any, path: Path) -> None:
    """Load `path` into every server of an HTTP engine (as a weight update, labelled one version up), unless they
    serve it already (the servers' own model)."""
    await engine.connect()
    served = {str(f.served_root) for f in getattr(engine, "facts", {}).values()}
    if served == {str(path)} and engine.weight_version == 0:
        return
    print(f"eval: loading {path} into the {engine.name} servers", flush=True)
    await engine.update_weights(str(path), engine.weight_version + 1)


class _Recorded:
    """The run's scheduler factory, keeping the schedulers it built (one per eval mode) for the heartbeat."""

    def __init__(self, factory: Any) -> None:
        self.factory = factory
        self.built: list[Any] = []

    def __call__(self, **kwargs: Any) -> Any:
        sched = self.factory(**kwargs)
        self.built.append(sched)
        return sched


async def _eval_one(cfg: Any, parts: Any, path: Path, label: str, out: Path, console: Any = None) -> dict:
    import time

    from agentrl.cli.display import ProgressDisplay, merged, progress_line
    from agentrl.cli.wiring import tune_gc
    from agentrl.trainer.eval import evaluate

    tune_gc(cfg.gc_tune)
    store = out / f"{label}.jsonl"
    store.unlink(missing_ok=True)
    print(f"eval {label}: {path} on {len(parts.tasks)} tasks ({cfg.eval.samples} sampled"
          f"{' + greedy' if cfg.eval.greedy else ''})", flush=True)
    schedulers, started = _Recorded(parts.scheduler), time.perf_counter()

    def line() -> str:
        return f"eval {label}: " + progress_line(merged((s.progress for s in schedulers.built), started))

    async with parts.scorer:
        with ProgressDisplay(line, console):  # every mode's trajectories, in flight included
            return await evaluate(schedulers, parts.tasks, sampling=parts.sampling, samples=cfg.eval.samples,
                                  greedy=cfg.eval.greedy, label=str(path), meta=parts.meta, store_path=store)


async def run_eval(cfg: Any, candidate: Path, baseline: Path | None, out: Path, console: Any = None) -> int:
    """Evaluate `candidate` (and `baseline`) on the config's eval task set; write JSON reports into `out`. The
    heartbeat goes to `console` (default stderr)."""
    import contextlib

    from agentrl.trainer.eval import diff_evals, format_diff, write_json

    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    shared: Any = None  # the first checkpoint's parts: env, tasks and the sandbox pool are shared
    async with contextlib.AsyncExitStack() as stack:
        for label, path in (("baseline", baseline), ("candidate", candidate)):
            if path is None:
                continue
            parts = await eval_parts(cfg, path, env=shared and shared.env, tasks=shared and shared.tasks,
                                     pool=shared and shared.pool)
            try:
                if shared is None:
                    shared = parts
                    await stack.enter_async_context(parts.pool)
                results[label] = await _eval_one(cfg, parts, path, label, out, console)
            finally:
                await parts.aclose()
            write_json(out / f"{label}.json", results[label])
    failed = _eval_unscored(cfg, results)
    if baseline is None:
        from agentrl.trainer.eval_stats import bootstrap_ci

        for mode, m in results["candidate"]["modes"].items():
            scores = [t["score"] for t in m["tasks"].values() if t["score"] is not None]
            ci = bootstrap_ci(scores)
            interval = f" [{ci[0]:.3f}, {ci[1]:.3f}] (95% bootstrap over {len(scores)} tasks)" if ci else ""
            print(f"[{mode}] mean reward {m['mean'] if m['mean'] is None else round(m['mean'], 3)}{interval}")
    else:
        report = diff_evals(results["baseline"], results["candidate"])
        write_json(out / "report.json", report)
        print(format_diff(report))
        print(f"report: {out / 'report.json'}")
    if failed:
        print(failed, file=sys.stderr)
        return EXIT_UNSCORED
    return 0


def _eval_unscored(cfg: Any, results: dict[str, dict]) -> str | None:
    """The failure line when too many eval runs (any checkpoint, any mode) ended infra_error, else None."""
    tasks = [t for r in results.values() for m in r["modes"].values() for t in m["tasks"].values()]
    infra = sum(int(t.get("infra_errors") or 0) for t in tasks)
    total = sum(len(t.get("rewards") or []) for t in tasks)
    return final_verdict("eval", infra, total, cfg.max_unscored_frac)
