"""`agentrl train` and `agentrl eval`: wiring the training job and checkpoint evaluation from a job config.

    agentrl train --config job.yaml [--resume] [--steps N] [--output-dir DIR] [--seed S]
    agentrl eval --checkpoint A [--baseline B] [--config job.yaml] [--out DIR] [--tasks N] [--samples K]
                 [--no-greedy]

Builds env, engine + tokenizer (from the checkpoint), renderer and sandbox pool with the shared helpers of
`wiring.py`, then hands them to `agentrl.trainer.job.Job` / `agentrl.trainer.eval.evaluate`. Registered into the
parser by `add_train_commands(subparsers)`.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agentrl.config import _deep_merge, load_config
from agentrl.errors import ConfigError


def add_train_commands(sub: Any) -> None:
    p = sub.add_parser("train", help="GRPO-train the policy (TRL) on an env through the real runner and sandboxes")
    p.add_argument("--config", type=Path, help="job YAML (agentrl.trainer.config.TrainConfig fields)")
    p.add_argument("--resume", action="store_true", help="continue output_dir from its last checkpoint")
    p.add_argument("--steps", type=int, help="total optimizer steps (overrides `steps`)")
    p.add_argument("--output-dir", type=Path, help="overrides `output_dir`")
    p.add_argument("--seed", type=int, help="overrides `seed`")
    p.add_argument("--deterministic", action="store_true", default=None,
                   help="identical trajectories, metrics and checkpoints per seed (slower; docs/determinism.md)")
    p.set_defaults(func=_cmd_train)
    e = sub.add_parser("eval", help="score a checkpoint on a fixed task set (sampled + greedy), diff vs a baseline",
                       description="Means come with 95%% bootstrap intervals over tasks; the candidate-vs-baseline "
                                   "difference with a paired sign-flip permutation test over tasks; a task is "
                                   "better/worse only when a permutation test of its samples says so (p < 0.05), "
                                   "else n.s.")
    e.add_argument("--checkpoint", required=True,
                   help="run output_dir (its last checkpoint), checkpoint dir, HF model dir or 'smollm2'")
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
    return o


def _quiet_libraries() -> None:
    """No per-file progress bars and no deprecation chatter from transformers in the per-step table."""
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\..*")


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _cmd_train(a: argparse.Namespace) -> int:
    from agentrl.trainer.config import TrainConfig

    cfg = load_config(TrainConfig, a.config, _train_overrides(a))
    _quiet_libraries()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # SIGTERM tears down like Ctrl-C
    try:
        result = run_train(cfg, resume=a.resume)
    except KeyboardInterrupt:
        print("interrupted: sandboxes removed; completed steps are kept (rerun with --resume)", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    if result.stopped_by is not None:
        print(f"train: stopped after {result.steps_done} steps by the {result.stopped_by} (integrity.action: stop); "
              f"everything stored so far is kept: metrics {cfg.metrics_path}, trajectories {cfg.trajectories_path}, "
              f"checkpoints {cfg.checkpoints_dir}. Inspect with `agentrl stats {cfg.output_dir}` / `agentrl view`",
              file=sys.stderr)
        return 3
    print(f"train: done, {result.steps_done} steps; metrics {cfg.metrics_path}, trajectories "
          f"{cfg.trajectories_path}, checkpoints {cfg.checkpoints_dir}")
    return 0


def _meta(cfg: Any, model_path: Path, engine: Any) -> dict[str, Any]:
    import hashlib

    import agentrl

    return {"model": str(model_path), "engine": engine.info(), "agentrl_version": agentrl.__version__,
            "config_hash": hashlib.sha256(cfg.model_dump_json(exclude={"output_dir"}).encode()).hexdigest()[:16]}


def _pool_for(cfg: Any, env: Any = None) -> Any:
    from agentrl.cli.wiring import pool_from_config

    spec = cfg.sandbox.spec.model_copy(update={"default_timeout_s": cfg.budgets.tool_timeout_s})
    return pool_from_config(cfg.rollout_config(), spec, uuid.uuid4().hex[:12], env)


def run_train(cfg: Any, *, resume: bool = False) -> Any:
    """Build the components of `cfg` and run the job (blocking). Returns the trainer's JobResult."""
    from agentrl.cli.wiring import (_renderer, make_drift, make_engine_and_tokenizer, make_scorer, select_tasks,
                                    tune_gc)
    from agentrl.envs import get_env
    from agentrl.trainer.job import Job, JobParts

    env = get_env(cfg.env, **cfg.env_options)
    tasks = select_tasks(env, cfg.tasks, cfg.task_ids)
    eval_tasks = select_tasks(env, cfg.eval.tasks, cfg.eval.task_ids) if cfg.eval_every else []
    snap = cfg.snapshot
    snapshot_tasks = (select_tasks(env, None, snap.tasks) if isinstance(snap.tasks, list)
                      else select_tasks(env, snap.tasks, [])) if snap.every else []
    engine, tokenizer, model_path = make_engine_and_tokenizer(cfg.rollout_config())
    renderer = _renderer(env, tokenizer)
    drift = make_drift(cfg.drift_check, renderer)
    gc_monitor = tune_gc(cfg.gc_tune)
    try:
        parts = JobParts(env=env, tasks=tasks, engine=engine, tokenizer=tokenizer, model_path=model_path,
                         renderer=renderer, pool=_pool_for(cfg, env), eval_tasks=eval_tasks,
                         meta=_meta(cfg, model_path, engine), scorer=make_scorer(cfg.reward, env),
                         snapshot_tasks=snapshot_tasks, drift_check=cfg.drift_check, drift_worker=drift,
                         gc_monitor=gc_monitor)
        return Job(cfg, parts, resume=resume, echo=lambda line: print(line, flush=True)).run()
    finally:
        if drift is not None:
            drift.close()
        asyncio.run(engine.close())


# -- eval ---------------------------------------------------------------------------------------------------------

def _resolve(ref: str) -> Path:
    from agentrl.engine.models import EMBEDDED_NAMES, resolve_model
    from agentrl.trainer.checkpoints import resolve_checkpoint

    if ref.lower() in EMBEDDED_NAMES:
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
    return asyncio.run(run_eval(cfg, candidate, baseline, out))


def _default_eval_out(checkpoint: Path) -> Path:
    from agentrl.trainer.checkpoints import run_config

    for candidate in (checkpoint, *checkpoint.parents[:3]):
        if (candidate / "checkpoints").is_dir() and run_config(candidate) is not None:
            return candidate / "eval" / "compare"
    return Path("eval-report")


async def _eval_one(cfg: Any, env: Any, tasks: list[Any], path: Path, pool: Any, label: str, out: Path) -> dict:
    from agentrl.cli.wiring import _renderer, make_drift, make_engine_and_tokenizer, make_scorer, tune_gc
    from agentrl.runner import Rollout, SchedulerConfig
    from agentrl.trainer.eval import evaluate
    from agentrl.trainer.job import budgets_of

    rcfg = cfg.rollout_config()
    rcfg = rcfg.model_copy(update={"engine": rcfg.engine.model_copy(update={"model": str(path)})})
    engine, tokenizer, model_path = await asyncio.to_thread(make_engine_and_tokenizer, rcfg)
    renderer = _renderer(env, tokenizer)
    drift = make_drift(cfg.drift_check, renderer)
    tune_gc(cfg.gc_tune)
    try:
        sampling = cfg.training_sampling(list(engine.eos_token_ids))
        rollout = Rollout(env=env, engine=engine, renderer=renderer, sampling=sampling,
                          budgets=budgets_of(cfg, engine), drift_check=cfg.drift_check, drift_worker=drift)
        sched = SchedulerConfig.from_config(cfg, group_size=1)
        store = out / f"{label}.jsonl"
        store.unlink(missing_ok=True)
        print(f"eval {label}: {path} on {len(tasks)} tasks ({cfg.eval.samples} sampled"
              f"{' + greedy' if cfg.eval.greedy else ''})", flush=True)
        async with make_scorer(cfg.reward, env, tasks) as scorer:
            return await evaluate(rollout, pool, tasks, samples=cfg.eval.samples, greedy=cfg.eval.greedy,
                                  sched=sched, label=str(path), meta=_meta(cfg, model_path, engine), store_path=store,
                                  scorer=scorer)
    finally:
        if drift is not None:
            await drift.aclose()
        await engine.close()


async def run_eval(cfg: Any, candidate: Path, baseline: Path | None, out: Path) -> int:
    """Evaluate `candidate` (and `baseline`) on the config's eval task set; write JSON reports into `out`."""
    from agentrl.cli.wiring import select_tasks
    from agentrl.envs import get_env
    from agentrl.trainer.eval import diff_evals, format_diff, write_json

    env = get_env(cfg.env, **cfg.env_options)
    tasks = select_tasks(env, cfg.eval.tasks, cfg.eval.task_ids)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    async with _pool_for(cfg, env) as pool:
        for label, path in (("baseline", baseline), ("candidate", candidate)):
            if path is not None:
                results[label] = await _eval_one(cfg, env, tasks, path, pool, label, out)
                write_json(out / f"{label}.json", results[label])
    if baseline is None:
        from agentrl.trainer.eval_stats import bootstrap_ci

        for mode, m in results["candidate"]["modes"].items():
            scores = [t["score"] for t in m["tasks"].values() if t["score"] is not None]
            ci = bootstrap_ci(scores)
            interval = f" [{ci[0]:.3f}, {ci[1]:.3f}] (95% bootstrap over {len(scores)} tasks)" if ci else ""
            print(f"[{mode}] mean reward {m['mean'] if m['mean'] is None else round(m['mean'], 3)}{interval}")
        return 0
    report = diff_evals(results["baseline"], results["candidate"])
    write_json(out / "report.json", report)
    print(format_diff(report))
    print(f"report: {out / 'report.json'}")
    return 0
