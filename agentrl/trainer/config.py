"""The training job config (`agentrl train --config job.yaml`): one pydantic model composed of the rollout pieces of
`agentrl.config` plus the GRPO knobs. Unknown keys are rejected; errors name the field and the fix.

Owns: the job's fields, their cross-field rules (a training temperature > 0, a micro-batch that divides the step's
completions, the model named once), and the view the composition root builds the run from: `rollout_config()` (the
`RolloutConfig` of the job; `agentrl.compose.build_run` derives the one `SamplingParams` shared by rollouts,
evaluation and TRL's `GRPOConfig` from it). Does not own the mapping onto TRL's `GRPOConfig` (`trl_adapter/trainer.py`).

Step arithmetic: a step draws `batch_size` tasks, runs `group_size` trajectories of each (the GRPO group), and does
exactly one optimizer update on those `batch_size * group_size` completions, split into micro-batches of
`micro_batch_size` completions for gradient accumulation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from agentrl.config import (
    BudgetConfig,
    EngineConfig,
    LocalEngineConfig,
    RewardList,
    RolloutConfig,
    SandboxConfig,
    _Config,
    default_reward,
)
from agentrl.runner.integrity import SIGNALS
from agentrl.types import SamplingParams

LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo"]


class LoraOptions(_Config):
    """PEFT LoRA adapter (trained instead of the full model). The engine gets merged full weights, or with
    `weight_sync: adapter` the adapter alone."""

    r: int = Field(default=16, ge=1)
    alpha: int = Field(default=32, ge=1)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class ImportanceSampling(_Config):
    """Off-policy correction with the engine's sampling logprobs (TRL's vLLM IS path, enabled through a shim).

    `token_*` modes correct per token, `sequence_*` multiply the ratios of a whole trajectory (masks long multi-turn
    traces easily). `*_truncate` clamps the ratio into [clip_min, clip_max], `*_mask` zeroes tokens outside it.
    """

    enabled: bool | None = None  # None: on exactly when rollouts can be stale (pipeline.max_staleness > 0)
    mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = "token_truncate"
    clip_min: float | None = Field(default=None, ge=0.0)
    clip_max: float = Field(default=2.0, gt=0.0)  # the TIS cap

    @model_validator(mode="after")
    def _bounds(self) -> ImportanceSampling:
        """A ratio of 1 is a token the trainer and the engine agree on: the band must keep it."""
        if self.clip_max < 1.0:
            raise ValueError(f"importance_sampling.clip_max={self.clip_max} is below 1: every token the trainer and "
                             f"the engine agree on (ratio 1) would be scaled down or masked; use a cap >= 1 "
                             f"(e.g. 2.0)")
        if self.clip_min is not None and self.clip_min > 1.0:
            raise ValueError(f"importance_sampling.clip_min={self.clip_min} is above 1: every token the trainer and "
                             f"the engine agree on (ratio 1) would be raised or masked; use a value <= 1 or null")
        return self


class PipelineOptions(_Config):
    """Pipelined training (trainer/pipeline.py): groups for steps t+1..t+k are generated while step t trains.

    `max_staleness` k bounds how old the weights behind a trained group may be: a group started with weights
    version v is trained at step t only if t - v <= k, else it is dropped and counted. k=0 is the synchronous run
    (each step generates its own groups with its own weights, then trains)."""

    max_staleness: int = Field(default=1, ge=0)


class RolloutOptions(_Config):
    """Stragglers: `oversample` 1.25 starts 25% more groups than a step needs and trains on the first complete
    ones; the rest are carried into the next step (within the staleness bound) or cancelled, sandboxes released."""

    oversample: float = Field(default=1.0, ge=1.0, le=4.0)


class DynamicSamplingOptions(_Config):
    """Dynamic sampling (trainer/dynamic_sampling.py): groups whose G rewards are all equal (no GRPO signal) are
    dropped from the step and replaced by extra groups, at most `max_extra_groups` per step (null: batch_size, i.e.
    at most twice the step's generation). Synchronous runs only (pipeline.max_staleness 0, oversample 1)."""

    enabled: bool = False
    max_extra_groups: int | None = Field(default=None, ge=1)


class EvalOptions(_Config):
    """The fixed evaluation task set: every task run `samples` times with the training sampling parameters and
    once greedily. Defaults to the first `tasks` tasks of the training env."""

    tasks: int | None = Field(default=8, ge=1)
    task_ids: list[str] = Field(default_factory=list)
    samples: int = Field(default=2, ge=1)
    greedy: bool = True


class IntegrityOptions(_Config):
    """The integrity alarm (agentrl.runner.integrity; docs/reward-integrity.md): after each step, a signal whose rate
    (`integrity_<signal>_frac` in metrics.jsonl) is above `max_frac[signal]`, or has at least doubled over the last
    `window` steps while at least `min_frac`, logs a warning; `action: stop` also ends training after that step
    (everything stored so far is kept). Signals never change rewards."""

    max_frac: dict[str, float] = Field(default_factory=dict)
    action: Literal["warn", "stop"] = "warn"
    window: int = Field(default=2, ge=1)
    min_frac: float = Field(default=0.1, gt=0.0, le=1.0)

    @field_validator("max_frac")
    @classmethod
    def _known(cls, value: dict[str, float]) -> dict[str, float]:
        for name, frac in value.items():
            if name not in SIGNALS:
                raise ValueError(f"integrity.max_frac: unknown signal {name!r}; known: {', '.join(SIGNALS)}")
            if not 0.0 <= frac <= 1.0:
                raise ValueError(f"integrity.max_frac.{name}={frac}: a fraction of trajectories, 0..1")
        return value


class SnapshotOptions(_Config):
    """Behaviour snapshots: every `every` optimizer steps (and before the first), the current weights roll out a fixed
    task set through the same runner: `samples` runs per task with the training sampling parameters, plus one greedy
    run if `greedy`. Results: `snapshots.jsonl` (one row per step and mode) and the rollouts under the checkpoint of
    those weights. `tasks`: the first N tasks of the env, or a list of task ids."""

    every: int = Field(default=0, ge=0)  # 0: off
    tasks: int | list[str] = 4
    samples: int = Field(default=1, ge=0)
    greedy: bool = False

    @model_validator(mode="after")
    def _rules(self) -> SnapshotOptions:
        if isinstance(self.tasks, int) and self.tasks < 1:
            raise ValueError("snapshot.tasks must be >= 1 (a task count) or a list of task ids")
        if isinstance(self.tasks, list) and not self.tasks:
            raise ValueError("snapshot.tasks: give a task count or at least one task id")
        if self.samples == 0 and not self.greedy:
            raise ValueError("snapshot: samples is 0 and greedy is false, so nothing would run; set one of them")
        return self


TrackerName = Literal["tensorboard", "wandb", "trackio", "mlflow"]


class TrackingOptions(_Config):
    """Experiment trackers' run identity (`report_to`; agentrl.trainer.trackers): the project (W&B project, MLflow
    experiment, trackio project), the run's display name (None: the tracker picks one), and how many of a step's
    trajectories go into its trajectory table (0: none)."""

    project: str = "agentrl"
    run_name: str | None = None
    table_rows: int = Field(default=4, ge=0, le=64)


class TrainConfig(_Config):
    # -- what is trained, on what
    model: str | None = None  # HF checkpoint dir; None: the embedded SmolLM2-135M-Instruct
    env: str = "code_tests"
    env_options: dict[str, Any] = Field(default_factory=dict)
    tasks: int | None = Field(default=None, ge=1)  # the first N tasks of the env
    task_ids: list[str] = Field(default_factory=list)
    # -- GRPO
    group_size: int = Field(default=4, ge=2)  # G trajectories per task (TRL num_generations)
    batch_size: int = Field(default=2, ge=1)  # tasks (prompts) per optimizer step
    micro_batch_size: int | None = Field(default=None, ge=1)  # completions per forward/backward; None: all
    steps: int = Field(default=10, ge=1)
    learning_rate: float = Field(default=1e-6, gt=0.0)
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"
    beta: float = Field(default=0.0, ge=0.0)  # KL coefficient; 0 = no reference model
    loss_type: LossType = "dapo"
    epsilon: float = Field(default=0.2, gt=0.0)
    epsilon_high: float | None = Field(default=None, gt=0.0)
    scale_rewards: Literal["group", "batch", "none"] = "group"
    mask_truncated_completions: bool = True
    max_grad_norm: float = Field(default=1.0, ge=0.0)
    weight_decay: float = Field(default=0.0, ge=0.0)
    lora: LoraOptions | None = None
    importance_sampling: ImportanceSampling = Field(default_factory=ImportanceSampling)
    # the train-inference mismatch per step (trainer/mismatch.py); free when importance sampling runs, else one extra
    # no-grad forward pass over the step's completions; false: that pass is skipped and the mismatch_* metrics are null
    mismatch_metrics: bool = True
    pipeline: PipelineOptions = Field(default_factory=PipelineOptions)
    rollout: RolloutOptions = Field(default_factory=RolloutOptions)
    dynamic_sampling: DynamicSamplingOptions = Field(default_factory=DynamicSamplingOptions)
    drift_check: Literal["deferred", "inline", "off"] = "inline"  # see RolloutConfig.drift_check
    gc_tune: bool = True  # see RolloutConfig.gc_tune
    # -- rollouts (the same pieces as `agentrl rollout`)
    sampling: SamplingParams = Field(default_factory=lambda: SamplingParams(temperature=1.0))
    budgets: BudgetConfig = Field(default_factory=BudgetConfig)
    engine: EngineConfig = Field(default_factory=LocalEngineConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    max_trajectories: int = Field(default=16, ge=1)
    infra_retries: int = Field(default=2, ge=0)
    max_unscored_frac: float = Field(default=0.10, ge=0.0, le=1.0)  # more infra_error than this stops training
    unscored_min_trajectories: int = Field(default=20, ge=1)  # ... once this many trajectories are in
    # disk: save full weights (LoRA merged) + engine.update_weights(path); adapter (LoRA only): save the adapter alone
    # + engine.load_adapter(path) (SGLang/vLLM hot-swap it; the local engine applies it in process)
    weight_sync: Literal["local", "disk", "adapter"] = "local"
    # -- outputs
    output_dir: Path = Path("runs/train")
    checkpoint_every: int = Field(default=1, ge=1)
    keep_checkpoints: int | None = Field(default=None, ge=1)  # None: keep all
    eval_every: int = Field(default=0, ge=0)  # 0: no evaluation during training
    eval: EvalOptions = Field(default_factory=EvalOptions)
    snapshot: SnapshotOptions = Field(default_factory=SnapshotOptions)
    integrity: IntegrityOptions = Field(default_factory=IntegrityOptions)
    # experiment trackers fed every per-step metric (docs/training.md, Experiment trackers); [] / "none": none
    report_to: list[TrackerName] = Field(default_factory=list)
    tracking: TrackingOptions = Field(default_factory=TrackingOptions)
    reward: RewardList = Field(default_factory=default_reward)  # weighted reward sources (agentrl.reward)
    seed: int = 0
    deterministic: bool = False  # identical trajectories, metrics and checkpoints per seed (docs/determinism.md)
    device: Literal["cpu", "auto"] = "cpu"  # auto: accelerate picks (GPU if present)
    bf16: bool = False

    @model_validator(mode="before")
    @classmethod
    def _deterministic_is_synchronous(cls, data: Any) -> Any:
        """Pipelining makes which weights generate a turn depend on timing: deterministic runs are synchronous
        (pipeline.max_staleness 0) unless the user asked otherwise, which is refused in _rules."""
        if isinstance(data, dict) and data.get("deterministic") and "pipeline" not in data:
            return {**data, "pipeline": {"max_staleness": 0}}
        return data

    @field_validator("report_to", mode="before")
    @classmethod
    def _tracker_list(cls, value: Any) -> Any:
        """`report_to: tensorboard`, `report_to: "tensorboard,wandb"` or a list; `none` means no tracker."""
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            return value
        names = [n.strip().lower() for item in items for n in (item.split(",") if isinstance(item, str) else [item])]
        return [n for n in dict.fromkeys(names) if n and n != "none"]

    @model_validator(mode="after")
    def _rules(self) -> TrainConfig:
        if self.deterministic and (self.pipeline.max_staleness > 0 or self.rollout.oversample > 1.0):
            raise ValueError("deterministic: true needs pipeline.max_staleness: 0 and rollout.oversample: 1.0 (with "
                             "pipelining or over-sampling, which weights generate a turn and which groups are "
                             "trained depend on timing)")
        if self.dynamic_sampling.enabled and (self.pipeline.max_staleness > 0 or self.rollout.oversample > 1.0):
            raise ValueError("dynamic_sampling.enabled needs pipeline.max_staleness: 0 and rollout.oversample: 1.0 "
                             "(its refill groups are generated by the step's own weights)")
        if self.sampling.temperature <= 0:
            raise ValueError("sampling.temperature must be > 0 for training (greedy rollouts have no gradient "
                             "signal and TRL divides logits by it); greedy runs belong to `agentrl eval`")
        if self.weight_sync == "adapter" and self.lora is None:
            raise ValueError("weight_sync: adapter syncs only a LoRA adapter, but no `lora:` is configured; add "
                             "`lora: {r: 16, alpha: 32}` (train an adapter) or use weight_sync: disk (full weights)")
        if self.engine.model is not None:
            raise ValueError("engine.model must not be set: set the top-level `model`, which the trainer and the "
                             "engine always share")
        per_step = self.batch_size * self.group_size
        if self.micro_batch_size is not None and per_step % self.micro_batch_size:
            raise ValueError(f"micro_batch_size ({self.micro_batch_size}) must divide batch_size * group_size "
                             f"({per_step}) completions per step")
        if self.importance_sampling.clip_min is not None and self.importance_sampling.clip_min >= \
                self.importance_sampling.clip_max:
            raise ValueError("importance_sampling.clip_min must be < importance_sampling.clip_max")
        if self.snapshot.every and self.snapshot.every % self.checkpoint_every:
            raise ValueError(f"snapshot.every ({self.snapshot.every}) must be a multiple of checkpoint_every "
                             f"({self.checkpoint_every}): snapshot rollouts are stored under their checkpoint")
        return self

    @property
    def importance_correction(self) -> bool:
        """Whether the IS correction runs: as configured, by default exactly when rollouts can be off-policy."""
        enabled = self.importance_sampling.enabled
        if enabled is None:
            return self.pipeline.max_staleness > 0 or self.rollout.oversample > 1.0
        return enabled

    @property
    def max_extra_groups(self) -> int:
        """Refill groups per step under dynamic sampling (0 when it is off)."""
        if not self.dynamic_sampling.enabled:
            return 0
        return self.dynamic_sampling.max_extra_groups or self.batch_size

    @property
    def completions_per_step(self) -> int:
        return self.batch_size * self.group_size

    @property
    def micro_batch(self) -> int:
        return self.micro_batch_size or self.completions_per_step

    @property
    def trajectories_path(self) -> Path:
        return self.output_dir / "trajectories.jsonl"

    @property
    def metrics_path(self) -> Path:
        return self.output_dir / "metrics.jsonl"

    @property
    def checkpoints_dir(self) -> Path:
        return self.output_dir / "checkpoints"

    @property
    def snapshots_path(self) -> Path:
        return self.output_dir / "snapshots.jsonl"

    def rollout_config(self) -> RolloutConfig:
        """The rollout view of this job (what `agentrl rollout` would run), which the composition root builds from."""
        return RolloutConfig(
            env=self.env, env_options=self.env_options, tasks=self.tasks, task_ids=self.task_ids,
            group_size=self.group_size, out=self.trajectories_path, resume=True, seed=self.seed,
            deterministic=self.deterministic,
            max_trajectories=self.max_trajectories, infra_retries=self.infra_retries, sampling=self.sampling,
            max_unscored_frac=self.max_unscored_frac, unscored_min_trajectories=self.unscored_min_trajectories,
            budgets=self.budgets, engine=self.engine.model_copy(update={"model": self.model}), sandbox=self.sandbox,
            reward=self.reward, drift_check=self.drift_check, gc_tune=self.gc_tune,
        )
