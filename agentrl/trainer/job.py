"""One training job: the GRPO loop from sandbox rewards to new weights, on components the CLI built.

Owns the order of things: output-dir guard and resume preparation, the background loop that hosts the runner and
the sandbox pool, the rollout function and weight sync, the TRL trainer, the start-up consistency check, training,
evaluation hooks and teardown. Does not own building the env / engine / pool (agentrl.cli.train wires those) nor any
TRL name (grpo.py).

Output dir layout:

    config.json                  the job config as run (a resume refuses a config that changed what is trained)
    trajectories.jsonl           every training trajectory, tagged with its step and (per turn) weight version
    metrics.jsonl                one JSON object per step (metrics.py)
    checkpoints/checkpoint-<N>/  transformers/TRL checkpoints after N optimizer steps (weights, tokenizer,
                                 optimizer, scheduler, RNG, trainer_state.json); `--resume` continues from the last
    eval/step-<N>.json(l)        evaluation results (+ trajectories) after N steps; step-<N>.diff.json vs step-0
    snapshots.jsonl              behaviour snapshots (snapshots.py), one row per step and mode; their rollouts in
                                 checkpoints/checkpoint-<N>/snapshot.jsonl (step 0: checkpoints/start/)
    weights/step-<N>/            disk weight sync only: the full weights last handed to the engine
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentrl.envs.base import Env, Task
from agentrl.errors import ConfigError
from agentrl.reward import Scorer
from agentrl.runner import Budgets, LoopLag, Rollout, Scheduler, SchedulerConfig, check_time_needs
from agentrl.store import TrajectoryStore
from agentrl.trainer import eval as evaluation
from agentrl.trainer import snapshots
from agentrl.trainer.callbacks import StepCallback
from agentrl.trainer.checks import check_startup
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.dynamic_sampling import DynamicSampler
from agentrl.trainer.grpo import AgentGRPOTrainer, enable_importance_sampling, grpo_config, load_policy, peft_config
from agentrl.trainer.loop import BackgroundLoop
from agentrl.trainer.metrics import MetricsWriter
from agentrl.trainer.pipeline import PipelineConfig, RolloutPipeline, TaskStream, consumed_slots, sampler_order
from agentrl.trainer.resume import ResumeState, prepare_resume
from agentrl.trainer.rollout_func import AgentRollout, env_reward
from agentrl.trainer.weight_sync import DiskWeightSync, LocalWeightSync, WeightSync

log = logging.getLogger("agentrl.trainer")

# fields a resume may change: they do not change what is trained
RESUMABLE_CHANGES = frozenset({"steps", "eval_every", "eval", "checkpoint_every", "keep_checkpoints",
                               "max_trajectories", "sandbox", "output_dir", "snapshot", "drift_check",
                               "gc_tune"})


@dataclass
class JobParts:
    """The components a job runs on, built by the CLI wiring from the job config."""

    env: Env
    tasks: list[Task]
    engine: Any  # GenerationEngine; closed by the caller
    tokenizer: Any  # loaded from the checkpoint being trained
    model_path: Path
    renderer: Any  # ChatRenderer over `tokenizer`
    pool: Any  # SandboxPool (an async context manager), entered on the job's loop
    eval_tasks: list[Task] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    scorer: Scorer | None = None  # the job's reward (cfg.reward); None: unit_tests. Closed by the job
    snapshot_tasks: list[Task] = field(default_factory=list)  # the fixed set of behaviour snapshots
    drift_check: str = "inline"  # the per-turn drift check's mode (RolloutConfig.drift_check)
    drift_worker: Any = None  # DeferredDrift for mode "deferred"; closed by the caller
    gc_monitor: Any = None  # the process's GcMonitor (agentrl/cli/gc_policy.py): metrics.jsonl's time_gc_* columns


@dataclass
class JobResult:
    steps_done: int
    resumed_from: int
    rows: list[dict[str, Any]]
    output_dir: Path
    stopped_by: str | None = None  # the integrity alarm that stopped training (integrity.action: stop)


def guard_output_dir(cfg: TrainConfig, resume: bool) -> None:
    used = [p.name for p in (cfg.trajectories_path, cfg.metrics_path, cfg.checkpoints_dir)
            if p.exists() and (p.is_dir() and any(p.iterdir()) or p.is_file() and p.stat().st_size)]
    if used and not resume:
        raise ConfigError(f"output_dir {str(cfg.output_dir)!r} already holds a training run ({', '.join(used)}); "
                          f"pass --resume to continue it, or choose another output_dir")


def check_resume_config(cfg: TrainConfig) -> None:
    saved_path = cfg.output_dir / "config.json"
    if not saved_path.exists():
        return
    saved = json.loads(saved_path.read_text())
    now = json.loads(cfg.model_dump_json())
    changed = sorted(k for k in set(saved) | set(now) if k not in RESUMABLE_CHANGES and saved.get(k) != now.get(k))
    if changed:
        raise ConfigError(f"--resume with a config that changes what is trained: {', '.join(changed)} differ from "
                          f"{saved_path}; restore them or start a new output_dir (only "
                          f"{', '.join(sorted(RESUMABLE_CHANGES))} may change on resume)")


def task_dataset(tasks: list[Task], batch_size: int) -> Any:
    """TRL's dataset: column "prompt" = task id. Repeated so one step's batch fits even with few tasks."""
    from datasets import Dataset

    if not tasks:
        raise ConfigError("no tasks selected: check `env`, `tasks` and `task_ids`")
    ids = [t.id for t in tasks]
    ids = ids * -(-batch_size // len(ids))
    return Dataset.from_dict({"prompt": ids})


def budgets_of(cfg: TrainConfig, engine: Any) -> Budgets:
    b = cfg.budgets
    return Budgets(max_turns=b.max_turns, max_completion_tokens=b.max_completion_tokens,
                   context_window=b.context_window or engine.context_window, tool_timeout_s=b.tool_timeout_s)


def _weight_sync(cfg: TrainConfig, engine: Any, loop: BackgroundLoop) -> WeightSync:
    if cfg.weight_sync == "disk":
        return DiskWeightSync(engine, loop, cfg.output_dir / "weights")
    return LocalWeightSync(engine, loop)


def _strip_console_callbacks(trainer: Any) -> None:
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)


class Job:
    """Runs one training job; see the module docstring. `run()` may be called once."""

    def __init__(self, cfg: TrainConfig, parts: JobParts, *, resume: bool = False,
                 echo: Callable[[str], None] = print) -> None:
        self.cfg = cfg
        self.parts = parts
        self.resume = resume
        self.echo = echo
        self.sampling = cfg.training_sampling(list(parts.engine.eos_token_ids))
        self.budgets = budgets_of(cfg, parts.engine)
        self.rollout = Rollout(env=parts.env, engine=parts.engine, renderer=parts.renderer,
                               sampling=self.sampling, budgets=self.budgets, drift_check=parts.drift_check,
                               drift_worker=parts.drift_worker)
        self.sched_cfg = SchedulerConfig.from_config(cfg)
        check_time_needs(parts.env, tool_timeout_s=cfg.budgets.tool_timeout_s,
                         finalize_timeout_s=cfg.budgets.finalize_timeout_s)
        self.trainer: Any = None
        self.rollout_fn: AgentRollout | None = None

    def run(self) -> JobResult:
        cfg = self.cfg
        guard_output_dir(cfg, self.resume)
        if self.resume:
            check_resume_config(cfg)
        cfg.output_dir.mkdir(parents=True, exist_ok=True)
        state = prepare_resume(cfg.output_dir, cfg.completions_per_step) if self.resume else ResumeState(0, None)
        self._announce(state)
        (cfg.output_dir / "config.json").write_text(cfg.model_dump_json(indent=1))
        with BackgroundLoop() as loop, contextlib.ExitStack() as stack:
            pool_stack = contextlib.AsyncExitStack()
            loop.run(pool_stack.enter_async_context(self.parts.pool))
            stack.callback(lambda: loop.run(pool_stack.aclose()))
            lag = loop.run(LoopLag().start())  # how late the runner's loop wakes, per step in metrics.jsonl
            stack.callback(lambda: loop.run(lag.stop()))
            if self.parts.scorer is not None:  # its HTTP clients live on the job's loop
                scorer = self.parts.scorer
                stack.callback(lambda: loop.run(scorer.aclose()))
            store = stack.enter_context(TrajectoryStore(cfg.trajectories_path, resume=True))
            stack.callback(torch.use_deterministic_algorithms, torch.are_deterministic_algorithms_enabled())
            callback = self._build(loop, store, state, lag)  # deterministic: switches torch's deterministic mode on
            assert self.rollout_fn is not None
            stack.callback(self.rollout_fn.close)  # before the pool closes: groups running ahead are cancelled
            self.trainer.train(resume_from_checkpoint=str(state.checkpoint) if state.checkpoint else None)
        return JobResult(steps_done=int(self.trainer.state.global_step), resumed_from=state.step,
                         rows=callback.rows, output_dir=cfg.output_dir,
                         stopped_by=None if callback.stopped_by is None else str(callback.stopped_by))

    def _announce(self, state: ResumeState) -> None:
        cfg = self.cfg
        self.echo(f"train: env {self.parts.env.name}, {len(self.parts.tasks)} tasks, {cfg.batch_size} tasks x "
                  f"{cfg.group_size} samples per step, {cfg.steps} steps, model {self.parts.model_path.name}, "
                  f"output {cfg.output_dir}")
        if self.resume:
            where = f"checkpoint {state.checkpoint.name}" if state.checkpoint else "no checkpoint (step 0)"
            self.echo(f"resume: continuing at step {state.step} from {where}; kept {state.kept} trajectories, "
                      f"dropped {state.dropped}" + (f", reusing the stored rollout of step {state.step}"
                                                    if state.reuse else ""))

    def _build(self, loop: BackgroundLoop, store: TrajectoryStore, state: ResumeState,
               lag: LoopLag | None = None) -> StepCallback:
        cfg, parts = self.cfg, self.parts
        meta = {**parts.meta, "sampling": self.sampling.model_dump(), "seed": cfg.seed}
        scheduler = Scheduler(self.rollout, parts.pool, self.sched_cfg, meta=meta, scorer=parts.scorer)
        end_id = int(parts.engine.eos_token_ids[0])
        pipeline = RolloutPipeline(scheduler, {t.id: t for t in parts.tasks}, PipelineConfig(
            batch_groups=cfg.batch_size, max_staleness=cfg.pipeline.max_staleness,
            oversample=cfg.rollout.oversample, last_step=cfg.steps - 1), start_step=state.step)
        rollout_fn = AgentRollout(pipeline=pipeline, store=store, loop=loop,
                                  weight_sync=_weight_sync(cfg, parts.engine, loop), group_size=cfg.group_size,
                                  end_id=end_id, reuse=state.reuse, dynamic=_dynamic_sampler(cfg, scheduler, parts))
        self.rollout_fn = rollout_fn
        callback = StepCallback(rollout_fn, MetricsWriter(cfg.metrics_path), total_steps=cfg.steps,
                                echo=self.echo, eval_every=cfg.eval_every if parts.eval_tasks else 0,
                                run_eval=lambda step: self._evaluate(loop, rollout_fn, step),
                                snapshot_every=cfg.snapshot.every if parts.snapshot_tasks else 0,
                                run_snapshot=lambda step: self._snapshot(loop, rollout_fn, step),
                                gc_monitor=parts.gc_monitor, loop_lag=lag, integrity_options=cfg.integrity)
        if cfg.deterministic:  # before the policy is built: a LoRA adapter's initialisation draws from torch's RNG
            from transformers import enable_full_determinism

            enable_full_determinism(cfg.seed)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*rollout_func.*experimental")
            self.trainer = AgentGRPOTrainer(
                model=load_policy(parts.model_path, cfg), reward_funcs=[env_reward],
                args=grpo_config(cfg, self.sampling), train_dataset=task_dataset(parts.tasks, cfg.batch_size),
                processing_class=parts.tokenizer, peft_config=peft_config(cfg), rollout_func=rollout_fn,
                callbacks=[callback])
        _strip_console_callbacks(self.trainer)
        if not pipeline.config.synchronous:
            done = state.kept_trajectories + [t for ts in state.reuse.values() for t in ts]
            pipeline.stream = TaskStream(sampler_order(self.trainer, cfg.group_size), skip=consumed_slots(done))
        if cfg.importance_correction:
            enable_importance_sampling(self.trainer, cfg.importance_sampling, rollout_fn.maybe_sync)
        check_startup(engine=parts.engine, trainer=self.trainer, runner_tokenizer=parts.renderer.tok,
                      sampling=self.sampling, max_completion_tokens=cfg.budgets.max_completion_tokens)
        return callback

    def _evaluate(self, loop: BackgroundLoop, rollout_fn: AgentRollout, step: int) -> None:
        """Evaluate the current weights (synced to the engine first) on the fixed eval task set."""
        rollout_fn.maybe_sync(self.trainer, account=False)
        out = self.cfg.output_dir / "eval"
        result = loop.run(evaluation.evaluate(
            self.rollout, self.parts.pool, self.parts.eval_tasks, samples=self.cfg.eval.samples,
            greedy=self.cfg.eval.greedy, sched=self.sched_cfg, label=f"step-{step}",
            meta={**self.parts.meta, "step": step}, store_path=out / f"step-{step}.jsonl", scorer=self.parts.scorer,
            parent=rollout_fn.scheduler))
        evaluation.write_json(out / f"step-{step}.json", result)
        means = "  ".join(f"{m} {_fmt(v['mean'])}" for m, v in result["modes"].items())
        self.echo(f"eval step-{step}: {means}")
        baseline = out / "step-0.json"
        if step > 0 and baseline.exists():
            report = evaluation.diff_evals(json.loads(baseline.read_text()), result)
            evaluation.write_json(out / f"step-{step}.diff.json", report)
            self.echo(evaluation.format_diff(report, max_rows=10))


    def _snapshot(self, loop: BackgroundLoop, rollout_fn: AgentRollout, step: int) -> None:
        """Roll out the fixed snapshot task set with the current weights (synced first); append the rows."""
        rollout_fn.maybe_sync(self.trainer, account=False)
        cfg = self.cfg
        rows = loop.run(snapshots.run_snapshot(
            self.rollout, self.parts.pool, self.parts.snapshot_tasks, step=step, samples=cfg.snapshot.samples,
            greedy=cfg.snapshot.greedy, sched=self.sched_cfg, scorer=self.parts.scorer,
            meta={**self.parts.meta, "sampling": self.sampling.model_dump(), "seed": cfg.seed},
            store_path=snapshots.snapshot_path(cfg.checkpoints_dir, step), output_dir=cfg.output_dir))
        writer = MetricsWriter(cfg.snapshots_path)
        for row in rows:
            writer.write(row)
            self.echo(f"snapshot step-{step} [{row['mode']}]: reward {_fmt(row['reward_mean'])}  pass "
                      f"{_fmt(row['pass_rate'])}  len {_fmt(row['completion_len_mean'])}  format "
                      f"{_fmt(row['format_rate'])}  tool errors {_fmt(row['tool_error_rate'])}  trunc "
                      f"{_fmt(row['truncation_rate'])}")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _dynamic_sampler(cfg: TrainConfig, scheduler: Scheduler, parts: Any) -> DynamicSampler | None:
    if not cfg.dynamic_sampling.enabled:
        return None
    return DynamicSampler(scheduler, {t.id: t for t in parts.tasks}, batch_groups=cfg.batch_size,
                          max_extra_groups=cfg.max_extra_groups, seed=cfg.seed)
