"""One training job: the GRPO loop from sandbox rewards to new weights, on components the CLI built.

Owns the order of things: output-dir guard and resume preparation, the background loop that hosts the runner and the
sandbox pool, the order of one training step (`StepPhases` in phases.py: roll out and score -> advantages -> update
-> eval -> checkpoint, with the weight sync before the next rollout), the start-up consistency check, training and
teardown. Does not own building anything it runs on: the env, engine, renderer, sampling, budgets, pool, scorer and
every scheduler come built from the composition root (agentrl.compose, through agentrl.cli.train) in `JobParts.run`.
Nor any TRL name: the TRL adapter (agentrl.trainer.trl_adapter) builds the trainer and calls the step phases from
TRL's hooks.

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
    trackers.json                `report_to` only: where each experiment tracker wrote, its run id, last step logged
    tensorboard/ wandb/ trackio/ mlflow/   the trackers' local stores (agentrl/trainer/trackers/backends.py)
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from agentrl.envs.base import Env, Task
from agentrl.errors import ConfigError
from agentrl.reward import Scorer
from agentrl.runner.lag import LoopLag
from agentrl.store import TrajectoryStore
from agentrl.trainer import eval as evaluation
from agentrl.trainer import snapshots, trl_adapter
from agentrl.trainer.checks import check_startup
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.dist import Ranks
from agentrl.trainer.dynamic_sampling import DynamicSampler
from agentrl.trainer.loop import BackgroundLoop
from agentrl.trainer.metrics import MetricsWriter
from agentrl.trainer.pipeline import PipelineConfig, RolloutPipeline, TaskStream, consumed_slots
from agentrl.trainer.resume import ResumeState, prepare_resume
from agentrl.trainer.rollouts import AgentRollout, FollowerRollout
from agentrl.trainer.steps import TrainingSteps
from agentrl.trainer.trackers import TrackerSet, check_trackers
from agentrl.trainer.weight_sync import AdapterWeightSync, DiskWeightSync, LocalWeightSync, WeightSync
from agentrl.types import SamplingParams

log = logging.getLogger("agentrl.trainer")

# fields a resume may change: they do not change what is trained
RESUMABLE_CHANGES = frozenset({"steps", "eval_every", "eval", "checkpoint_every", "keep_checkpoints",
                               "max_trajectories", "sandbox", "output_dir", "snapshot", "drift_check",
                               "gc_tune", "report_to", "tracking"})


class BuiltRun(Protocol):
    """What the job uses of the parts the composition root built (agentrl.compose.RunParts)."""

    env: Env
    tasks: list[Task]  # the training tasks
    engine: Any  # GenerationEngine; closed by the caller
    tokenizer: Any  # loaded from the checkpoint being trained
    model_path: Path
    renderer: Any  # ChatRenderer over `tokenizer`
    sampling: SamplingParams  # the one SamplingParams of rollouts, evaluation and TRL's GRPOConfig
    pool: Any  # SandboxPool (an async context manager), entered on the job's loop
    scorer: Scorer  # the job's reward (cfg.reward); closed by the job
    meta: dict[str, Any]  # the run metadata (config_hash, model, engine, sampling, seed, ...)

    def scheduler(self, *, sampling: SamplingParams | None = None, group_size: int | None = None,
                  namespace: str = "", meta: dict[str, Any] | None = None, shares_slots_with: Any = None) -> Any:
        ...


@dataclass
class JobParts:
    """The components a job runs on: the run's parts (built by the composition root) and the job's fixed task sets."""

    run: BuiltRun
    eval_tasks: list[Task] = field(default_factory=list)
    snapshot_tasks: list[Task] = field(default_factory=list)  # the fixed set of behaviour snapshots
    gc_monitor: Any = None  # the process's GcMonitor (agentrl/cli/gc_policy.py): metrics.jsonl's time_gc_* columns


Heartbeat = Callable[[Any, Callable[[], str]], Any]
"""Builds the job's heartbeat from the training scheduler's `Progress` and the job's `status()` (the step and its
phase): an async context manager entered and exited on the job's loop (the CLI's ProgressDisplay), so long rollouts
and training steps are never silent."""


@dataclass
class JobResult:
    steps_done: int
    resumed_from: int
    rows: list[dict[str, Any]]
    output_dir: Path
    stopped_by: str | None = None  # the integrity alarm that stopped training (integrity.action: stop)
    is_main: bool = True  # rank 0 (which reports the job); False on the other ranks


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


def _weight_sync(cfg: TrainConfig, engine: Any, loop: BackgroundLoop | None) -> WeightSync:  # None: not rank 0
    if cfg.weight_sync == "disk":
        return DiskWeightSync(engine, loop, cfg.output_dir / "weights")
    if cfg.weight_sync == "adapter":
        return AdapterWeightSync(engine, loop, cfg.output_dir / "weights")
    return LocalWeightSync(engine, loop)


class Job:
    """Runs one training job; see the module docstring. `run()` may be called once."""

    def __init__(self, cfg: TrainConfig, parts: JobParts, *, resume: bool = False,
                 echo: Callable[[str], None] = print, ranks: Ranks | None = None,
                 heartbeat: Heartbeat | None = None) -> None:
        self.cfg = cfg
        self.parts = parts
        self.resume = resume
        self.ranks = ranks or Ranks()
        self.echo = echo if self.ranks.is_main else _silent
        self.heartbeat = heartbeat if self.ranks.is_main else None
        self.phase: str | None = None  # set while evaluating or snapshotting (the heartbeat says so)
        self.run_parts = parts.run
        self.sampling = parts.run.sampling
        self.trainer: Any = None
        self.rollout_fn: AgentRollout | None = None
        self.trackers: TrackerSet | None = None  # rank 0 with `report_to` only

    def run(self) -> JobResult:
        """Rank 0 (the only rank of a 1-process job) prepares the output dir, rolls out and writes everything; the
        other ranks train their slice of each step (dist.py). The order of one step: `StepPhases`."""
        state = self._prepare_ranks()
        if not self.ranks.is_main:
            return self._run_follower(state)
        with BackgroundLoop() as loop, contextlib.ExitStack() as stack:
            store, lag = self._open(loop, stack, state)  # pool, loop-lag probe, scorer, store, trackers
            steps = self._build(loop, store, state, lag)  # the phases, the trainer calling them, the start-up check
            self._start_heartbeat(loop, stack)
            assert self.rollout_fn is not None
            stack.callback(self.rollout_fn.close)  # before the pool closes: groups running ahead are cancelled
            # each step: sync weights -> roll out and score -> advantages -> update -> eval -> metrics -> checkpoint
            done = trl_adapter.train(self.trainer, state.checkpoint)
        return JobResult(steps_done=done, resumed_from=state.step, rows=steps.rows, output_dir=self.cfg.output_dir,
                         stopped_by=None if steps.stopped_by is None else str(steps.stopped_by))

    def status(self) -> str:
        """What the job is doing now, for the heartbeat: the step and its phase (waiting for the step's rollout,
        TRL's training step, an evaluation or a snapshot)."""
        step = trl_adapter.global_step(self.trainer) if self.trainer is not None else 0
        where = f"step {min(step + 1, self.cfg.steps)}/{self.cfg.steps}"
        if self.phase is not None:
            return f"{where}, {self.phase}"
        waiting = self.rollout_fn is not None and self.rollout_fn.waiting_step is not None
        return f"{where}, {'rollout (the trainer waits)' if waiting else 'training'}"

    def _prepare_ranks(self) -> ResumeState:
        """Rank 0 prepares the output dir (and the resume); the other ranks get its step, checkpoint and sampling."""
        prepared: list[ResumeState] = []
        if not self.ranks.distributed:
            self._prepare(prepared)
            return prepared[0]
        self.ranks.start(self.cfg.device)
        step, checkpoint, self.sampling = self.ranks.share(lambda: self._prepare(prepared))
        return prepared[0] if prepared else ResumeState(step, checkpoint)

    def _prepare(self, out: list[ResumeState]) -> tuple[int, Path | None, SamplingParams]:
        """Rank 0: guard the output dir, cut it back to its last checkpoint on resume, write config.json."""
        cfg = self.cfg
        check_trackers(cfg.report_to)  # a missing tracker library fails before anything is built or written
        guard_output_dir(cfg, self.resume)
        if self.resume:
            check_resume_config(cfg)
        cfg.output_dir.mkdir(parents=True, exist_ok=True)
        state = prepare_resume(cfg.output_dir, cfg.completions_per_step) if self.resume else ResumeState(0, None)
        self._announce(state)
        (cfg.output_dir / "config.json").write_text(cfg.model_dump_json(indent=1))
        out.append(state)
        return state.step, state.checkpoint, self.sampling

    def _open(self, loop: BackgroundLoop, stack: contextlib.ExitStack, state: ResumeState
              ) -> tuple[TrajectoryStore, LoopLag]:
        """What rank 0's steps run on, closed by `stack` in reverse order: the sandbox pool, the loop-lag probe, the
        scorer's clients (on the job's loop), the trajectory store, torch's deterministic mode (restored), the
        experiment trackers."""
        pool_stack = contextlib.AsyncExitStack()
        loop.run(pool_stack.enter_async_context(self.run_parts.pool))
        stack.callback(lambda: loop.run(pool_stack.aclose()))
        lag = loop.run(LoopLag().start())  # how late the runner's loop wakes, per step in metrics.jsonl
        stack.callback(lambda: loop.run(lag.stop()))
        scorer = self.run_parts.scorer  # its HTTP clients live on the job's loop
        stack.callback(lambda: loop.run(scorer.aclose()))
        store = stack.enter_context(TrajectoryStore(self.cfg.trajectories_path, resume=True))
        stack.callback(torch.use_deterministic_algorithms, torch.are_deterministic_algorithms_enabled())
        self.trackers = self._trackers(state)
        if self.trackers is not None:
            stack.callback(self.trackers.close)
        return store, lag

    def _start_heartbeat(self, loop: BackgroundLoop, stack: contextlib.ExitStack) -> None:
        """The heartbeat on the job's loop, which stays free while TRL trains."""
        if self.heartbeat is None:
            return
        assert self.rollout_fn is not None
        beat = self.heartbeat(self.rollout_fn.scheduler.progress, self.status)
        loop.run(beat.__aenter__())
        stack.callback(lambda: loop.run(beat.__aexit__(None, None, None)))

    def _trackers(self, state: ResumeState) -> TrackerSet | None:
        """Rank 0's experiment trackers; a resumed run reopens the tracker runs recorded in trackers.json."""
        cfg = self.cfg
        if not cfg.report_to:
            return None
        trackers = TrackerSet(cfg.output_dir, cfg.report_to, resume_step=state.step if self.resume else None,
                              project=cfg.tracking.project, run_name=cfg.tracking.run_name,
                              config=json.loads(cfg.model_dump_json()),
                              prompts={t.id: t.prompt for t in self.run_parts.tasks},
                              table_rows=cfg.tracking.table_rows)
        done_eval = cfg.output_dir / "eval" / f"step-{state.step}.json"
        if self.resume and state.step > 0 and done_eval.exists():  # a TensorBoard purge dropped it; not rerun
            trackers.log_eval(state.step, json.loads(done_eval.read_text()))
        return trackers

    def _run_follower(self, state: ResumeState) -> JobResult:
        """A rank other than 0: no pool, store or metrics; the same trainer, fed its slice by rank 0."""
        cfg = self.cfg
        rollout_fn = FollowerRollout(weight_sync=_weight_sync(cfg, None, None))
        self.rollout_fn = rollout_fn  # type: ignore[assignment]
        sync = functools.partial(_sync_between_steps, self, rollout_fn)  # rank 0's evaluation syncs collectively
        steps = TrainingSteps(rollout_fn, None, total_steps=cfg.steps, echo=_silent,
                              eval_every=cfg.eval_every if self.parts.eval_tasks else 0, run_eval=sync,
                              snapshot_every=cfg.snapshot.every if self.parts.snapshot_tasks else 0,
                              run_snapshot=sync)
        with contextlib.ExitStack() as stack:
            stack.callback(torch.use_deterministic_algorithms, torch.are_deterministic_algorithms_enabled())
            self.trainer = self._trainer(steps, end_id=None)
            done = trl_adapter.train(self.trainer, state.checkpoint)
        return JobResult(steps_done=done, resumed_from=state.step, rows=[], output_dir=cfg.output_dir,
                         is_main=False)

    def _trainer(self, steps: TrainingSteps, *, end_id: int | None) -> Any:
        """The trainer of this rank (every rank builds the same one from the same seed), calling `steps`."""
        run = self.run_parts
        trainer = trl_adapter.build_trainer(self.cfg, steps, model_path=run.model_path, tokenizer=run.tokenizer,
                                            tasks=run.tasks, sampling=self.sampling, ranks=self.ranks,
                                            end_id=end_id)
        steps.trainer = trainer
        return trainer

    def _announce(self, state: ResumeState) -> None:
        cfg = self.cfg
        run = self.run_parts
        self.echo(f"train: env {run.env.name}, {len(run.tasks)} tasks, {cfg.batch_size} tasks x "
                  f"{cfg.group_size} samples per step, {cfg.steps} steps, model {run.model_path.name}, "
                  f"output {cfg.output_dir}")
        if self.resume:
            where = f"checkpoint {state.checkpoint.name}" if state.checkpoint else "no checkpoint (step 0)"
            self.echo(f"resume: continuing at step {state.step} from {where}; kept {state.kept} trajectories, "
                      f"dropped {state.dropped}" + (f", reusing the stored rollout of step {state.step}"
                                                    if state.reuse else ""))

    def _build(self, loop: BackgroundLoop, store: TrajectoryStore, state: ResumeState,
               lag: LoopLag | None = None) -> TrainingSteps:
        """Rank 0's step phases over the rollout pipeline, and the trainer that calls them (deterministic jobs:
        building it switches torch's deterministic mode on); then the start-up check."""
        cfg, parts, run = self.cfg, self.parts, self.run_parts
        scheduler = run.scheduler()
        end_id = int(run.engine.eos_token_ids[0])
        pipeline = RolloutPipeline(scheduler, {t.id: t for t in run.tasks}, PipelineConfig(
            batch_groups=cfg.batch_size, max_staleness=cfg.pipeline.max_staleness,
            oversample=cfg.rollout.oversample, last_step=cfg.steps - 1), start_step=state.step)
        rollout_fn = AgentRollout(pipeline=pipeline, store=store, loop=loop,
                                  weight_sync=_weight_sync(cfg, run.engine, loop), group_size=cfg.group_size,
                                  reuse=state.reuse, dynamic=_dynamic_sampler(cfg, scheduler, run))
        self.rollout_fn = rollout_fn
        steps = TrainingSteps(rollout_fn, MetricsWriter(cfg.metrics_path), total_steps=cfg.steps,
                              echo=self.echo, eval_every=cfg.eval_every if parts.eval_tasks else 0,
                              run_eval=lambda step: self._evaluate(loop, rollout_fn, step),
                              snapshot_every=cfg.snapshot.every if parts.snapshot_tasks else 0,
                              run_snapshot=lambda step: self._snapshot(loop, rollout_fn, step),
                              gc_monitor=parts.gc_monitor, loop_lag=lag, integrity_options=cfg.integrity,
                              trackers=self.trackers)
        self.trainer = self._trainer(steps, end_id=end_id)
        if not pipeline.config.synchronous:
            done = state.kept_trajectories + [t for ts in state.reuse.values() for t in ts]
            pipeline.stream = TaskStream(trl_adapter.sampler_order(self.trainer, cfg.group_size),
                                         skip=consumed_slots(done))
        check_startup(engine=run.engine, trainer=self.trainer, generation=trl_adapter.generation_settings(self.trainer),
                      runner_tokenizer=run.renderer.tok, sampling=self.sampling,
                      max_completion_tokens=cfg.budgets.max_completion_tokens)
        return steps

    def _evaluate(self, loop: BackgroundLoop, rollout_fn: AgentRollout, step: int) -> None:
        """Evaluate the current weights (synced to the engine first) on the fixed eval task set."""
        rollout_fn.maybe_sync(self.trainer, step, account=False)
        out = self.cfg.output_dir / "eval"
        self.phase = f"evaluating step-{step}"
        try:
            result = loop.run(evaluation.evaluate(
                self._shared_schedulers(rollout_fn), self.parts.eval_tasks, sampling=self.sampling,
                samples=self.cfg.eval.samples, greedy=self.cfg.eval.greedy, label=f"step-{step}",
                meta={**self.run_parts.meta, "step": step}, store_path=out / f"step-{step}.jsonl"))
        finally:
            self.phase = None
        evaluation.write_json(out / f"step-{step}.json", result)
        if self.trackers is not None:
            self.trackers.log_eval(step, result)
        means = "  ".join(f"{m} {_fmt(v['mean'])}" for m, v in result["modes"].items())
        self.echo(f"eval step-{step}: {means}")
        baseline = out / "step-0.json"
        if step > 0 and baseline.exists():
            report = evaluation.diff_evals(json.loads(baseline.read_text()), result)
            evaluation.write_json(out / f"step-{step}.diff.json", report)
            self.echo(evaluation.format_diff(report, max_rows=10))

    def _shared_schedulers(self, rollout_fn: AgentRollout) -> Callable[..., Any]:
        """Schedulers for evaluation during training: they share the training scheduler's `max_trajectories`."""
        return functools.partial(self.run_parts.scheduler, shares_slots_with=rollout_fn.scheduler)

    def _snapshot(self, loop: BackgroundLoop, rollout_fn: AgentRollout, step: int) -> None:
        """Roll out the fixed snapshot task set with the current weights (synced first); append the rows."""
        rollout_fn.maybe_sync(self.trainer, step, account=False)
        cfg = self.cfg
        self.phase = f"snapshot step-{step}"
        try:
            rows = loop.run(snapshots.run_snapshot(
                self.run_parts.scheduler, self.parts.snapshot_tasks, sampling=self.sampling, step=step,
                samples=cfg.snapshot.samples, greedy=cfg.snapshot.greedy, meta=self.run_parts.meta,
                store_path=snapshots.snapshot_path(cfg.checkpoints_dir, step), output_dir=cfg.output_dir))
        finally:
            self.phase = None
        writer = MetricsWriter(cfg.snapshots_path)
        for row in rows:
            writer.write(row)
            self.echo(f"snapshot step-{step} [{row['mode']}]: reward {_fmt(row['reward_mean'])}  pass "
                      f"{_fmt(row['pass_rate'])}  len {_fmt(row['completion_len_mean'])}  format "
                      f"{_fmt(row['format_rate'])}  tool errors {_fmt(row['tool_error_rate'])}  trunc "
                      f"{_fmt(row['truncation_rate'])}")


def _silent(line: str) -> None:
    """Ranks other than 0 print nothing: rank 0 reports the job."""


def _sync_between_steps(job: Job, rollout_fn: FollowerRollout, step: int) -> None:
    """A follower's side of rank 0's sync before evaluation or a snapshot (collective when the model is sharded)."""
    rollout_fn.maybe_sync(job.trainer, step, account=False)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _dynamic_sampler(cfg: TrainConfig, scheduler: Any, run: Any) -> DynamicSampler | None:
    if not cfg.dynamic_sampling.enabled:
        return None
    return DynamicSampler(scheduler, {t.id: t for t in run.tasks}, batch_groups=cfg.batch_size,
                          max_extra_groups=cfg.max_extra_groups, seed=cfg.seed)
