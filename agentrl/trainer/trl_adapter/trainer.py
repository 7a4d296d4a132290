"""The GRPOTrainer subclass, `TrainConfig` -> `GRPOConfig`, LoRA, the resume-stable sampler and the
importance-sampling shim. Part of the TRL adapter (this package's `__init__` lists every TRL internal it touches).

Mapping (one SamplingParams for rollouts, evaluation and training): temperature / top_p / top_k -> GRPOConfig's
fields of the same name (top_k 0 = off in both; TRL recomputes logprobs with the same temperature, so they match
the engine's exactly when top_p = 1 and top_k = 0), budgets.max_completion_tokens -> max_completion_length (the
runner enforces it; TRL only normalises by it), group_size -> num_generations, one optimizer step per step:
per_device_train_batch_size = micro_batch, gradient_accumulation_steps = batch*group/micro_batch, and TRL's default
steps_per_generation = gradient_accumulation_steps, so rollout_func is called once per optimizer step with all
batch*group prompts (with N ranks: per_device = micro_batch, accumulation = batch*group/(micro_batch*N), and each
rank's rollout_func gets its batch*group/N prompts; dist.py).

Importance-sampling shim (docs/training.md, Off-policy correction): TRL computes the IS ratio between the trainer's
logprobs and the sampling logprobs only when `use_vllm` is on. `enable_importance_sampling` flips the trainer's
attributes after construction (never `args.use_vllm`, which would start vLLM) and installs an object with
`sync_weights()` as `vllm_generation`, which TRL then calls whenever `global_step` changed. It relies on private
TRL internals, so `check_importance_sampling_support()` verifies them and refuses with a clear message if a TRL
upgrade removed them (tested in tests/integration/test_trainer.py).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from agentrl.errors import ConfigError
from agentrl.trainer import mismatch
from agentrl.trainer.config import ImportanceSampling, TrainConfig
from agentrl.types import SamplingParams

try:
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import RepeatSampler
except ImportError as exc:  # pragma: no cover - depends on the install
    from agentrl.errors import MissingDependencyError

    raise MissingDependencyError(
        f"training needs the [train] extra (trl, peft, datasets): run `pip install 'agentrl[train]'` ({exc})"
    ) from exc


def grpo_config(cfg: TrainConfig, sampling: SamplingParams, world: int = 1) -> GRPOConfig:
    """The GRPOConfig of a job. Checkpoints go to `<output_dir>/checkpoints/checkpoint-<step>`.

    `world` ranks share one step's `batch_size * group_size` completions: each trains `micro_batch` completions per
    forward/backward, `per_step / (micro_batch * world)` times, so the global batch is the same at any world size."""
    per_step = cfg.completions_per_step
    micro = cfg.micro_batch_size or max(1, per_step // world)  # unset: each rank's share in one pass
    if per_step % (micro * world):
        raise ConfigError(f"{world} ranks x micro_batch_size {micro} must divide batch_size * group_size = "
                          f"{per_step} completions per step: choose a micro_batch_size that divides "
                          f"{per_step // world if per_step % world == 0 else per_step} or another number of ranks")
    is_cfg = cfg.importance_sampling
    extra: dict[str, Any] = {}
    if cfg.epsilon_high is not None:
        extra["epsilon_high"] = cfg.epsilon_high
    return GRPOConfig(
        output_dir=str(cfg.checkpoints_dir),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=per_step // (micro * world),
        num_generations=cfg.group_size,
        num_iterations=1,
        max_steps=cfg.steps,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler,
        warmup_steps=0,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        beta=cfg.beta,
        loss_type=cfg.loss_type,
        epsilon=cfg.epsilon,
        scale_rewards=cfg.scale_rewards,
        mask_truncated_completions=cfg.mask_truncated_completions,
        max_completion_length=cfg.budgets.max_completion_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        vllm_importance_sampling_correction=cfg.importance_correction,
        vllm_importance_sampling_mode=is_cfg.mode,
        vllm_importance_sampling_clip_min=is_cfg.clip_min,
        vllm_importance_sampling_clip_max=is_cfg.clip_max,
        save_strategy="steps",
        save_steps=cfg.checkpoint_every,
        save_total_limit=cfg.keep_checkpoints,
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        log_level="warning",
        use_cpu=cfg.device == "cpu",
        bf16=cfg.bf16,
        fp16=False,
        gradient_checkpointing=False,
        remove_unused_columns=False,
        shuffle_dataset=True,
        seed=cfg.seed,
        data_seed=cfg.seed,
        full_determinism=cfg.deterministic,  # torch.use_deterministic_algorithms + seeds, at trainer start
        dataloader_num_workers=0,
        ddp_find_unused_parameters=False if world > 1 else None,  # every parameter takes part in the loss
        **extra,
    )


def peft_config(cfg: TrainConfig) -> Any:
    if cfg.lora is None:
        return None
    from peft import LoraConfig

    return LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                      target_modules=cfg.lora.target_modules, task_type="CAUSAL_LM")


class EpochRepeatSampler(RepeatSampler):
    """TRL's RepeatSampler whose shuffle depends only on (seed, epoch), so the task order after a resume is the
    order the interrupted run had (TRL's own sampler carries its generator state across epochs, which a resume
    cannot restore)."""

    def __init__(self, *args: Any, seed: int, **kwargs: Any) -> None:
        super().__init__(*args, seed=seed, **kwargs)  # type: ignore[misc]  # seed is keyword-only here, never in args
        self._base_seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Any:
        if self.shuffle:
            self.generator.manual_seed(self._base_seed + 1_000_003 * self.epoch)
        return super().__iter__()


def clipped_fraction(ratio: Any, mask: Any, mode: str, clip_min: float | None, clip_max: float) -> float:
    """Fraction of IS ratios (tokens, or sequences in sequence modes) that the truncation clamped / the mask
    zeroed. `ratio` is TRL's ratio after clamping: (B, T) per token or (B, 1) per sequence."""
    if mode.endswith("_mask"):
        clipped = ratio == 0.0
    else:
        clipped = ratio >= clip_max * (1.0 - 1e-6)
        if clip_min is not None:
            clipped = clipped | (ratio <= clip_min * (1.0 + 1e-6))
    mask = mask.bool()
    if ratio.shape[-1] == 1:
        rows = mask.any(dim=-1)
        return float(clipped[:, 0][rows].float().mean()) if rows.any() else 0.0
    return float(clipped[mask].float().mean()) if mask.any() else 0.0


IS_CLIPPED_KEY = "sampling/importance_sampling_ratio/clipped_frac"  # logged by AgentGRPOTrainer
MISMATCH_LOG_KEYS = {  # metrics.jsonl key -> the key AgentGRPOTrainer logs it under in TRL's logs (mismatch.py)
    "mismatch_logprob_abs_mean": "mismatch/logprob_abs_mean",
    "mismatch_logprob_abs_max": "mismatch/logprob_abs_max",
    "mismatch_kl": "mismatch/kl_k3",
}


class AgentGRPOTrainer(GRPOTrainer):
    """GRPOTrainer with a resume-stable data order, the IS clipped fraction and the train-inference mismatch
    (mismatch.py) logged. Everything else is TRL's."""

    measure_mismatch = True  # build_trainer sets TrainConfig.mismatch_metrics; off: no extra forward when IS is off

    def _generate_and_score_completions(self, inputs: Any) -> Any:
        out = super()._generate_and_score_completions(inputs)
        mask = out["completion_mask"] if out.get("tool_mask") is None else out["completion_mask"] * out["tool_mask"]
        mode = "train" if self.model is not None and self.model.training else "eval"
        ratio = out.get("importance_sampling_ratio")
        if ratio is not None:
            self._metrics[mode][IS_CLIPPED_KEY].append(clipped_fraction(
                ratio, mask, self.vllm_importance_sampling_mode, self.vllm_importance_sampling_clip_min,
                self.vllm_importance_sampling_clip_max))  # type: ignore[arg-type]  # set from our config, a float
        if out.get("sampling_per_token_logps") is not None and (self.measure_mismatch or
                                                                  out.get("old_per_token_logps") is not None):
            self._log_mismatch(out, mask, mode)
        return out

    def _log_mismatch(self, out: Any, mask: Any, mode: str) -> None:
        """The engine's logprobs against the trainer's over the loss's model tokens, all ranks together. The trainer's
        are TRL's `old_per_token_logps` when it computed them (IS on), else one no-grad forward pass."""
        trainer_logps = out.get("old_per_token_logps")
        if trainer_logps is None:
            trainer_logps = self._recompute_logps(out, mode)
        sums = mismatch.partial_sums(trainer_logps, out["sampling_per_token_logps"], mask)
        for key, value in mismatch.reduce_sums(self.accelerator.gather(sums.unsqueeze(0))).items():
            if value is not None:
                self._metrics[mode][MISMATCH_LOG_KEYS[key]].append(value)

    def _recompute_logps(self, out: Any, mode: str) -> Any:
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        attention = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        batch = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        with torch.no_grad():
            logps, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, attention,
                                                                  out["completion_ids"].size(1), batch_size=batch)
        return logps

    def _get_train_sampler(self, dataset: Any = None) -> Any:
        return EpochRepeatSampler(
            data_source=dataset if dataset is not None else self.train_dataset,
            mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,  # type: ignore[attr-defined]
            repeat_count=self.num_iterations * self.args.steps_per_generation,  # type: ignore[attr-defined]
            shuffle=self.shuffle_dataset,
            seed=self.args.seed,
        )


# -- importance-sampling shim -----------------------------------------------------------------------------------

_IS_GATE = "self.use_vllm and self.vllm_importance_sampling_correction"
_SYNC_GATE = "self.vllm_generation.sync_weights()"


def check_importance_sampling_support() -> None:
    """Raise ConfigError unless the installed TRL still has the code paths the shim switches on."""
    import trl

    needs = {
        "_generate_and_score_completions": [_IS_GATE, "sampling_per_token_logps", "importance_sampling_ratio"],
        "_compute_loss": [_IS_GATE, 'inputs["importance_sampling_ratio"]'],
        "_generate": ["self.rollout_func", _SYNC_GATE, "_last_loaded_step"],
    }
    missing = []
    for method, snippets in needs.items():
        source = inspect.getsource(getattr(GRPOTrainer, method))
        missing += [f"{method}: {s!r}" for s in snippets if s not in source]
    if missing:
        raise ConfigError(
            f"importance_sampling.enabled relies on TRL 1.16 GRPOTrainer internals that trl {trl.__version__} "
            f"no longer has ({'; '.join(missing)}); set importance_sampling.enabled: false or install trl==1.16.0"
        )


class _SyncHook:
    """Stands in for TRL's `vllm_generation`: TRL calls `sync_weights()` when `global_step` changed."""

    def __init__(self, trainer: Any, sync: Any) -> None:
        self._trainer = trainer
        self._sync = sync

    def sync_weights(self) -> None:
        self._sync(int(self._trainer.state.global_step))


def enable_importance_sampling(trainer: Any, options: ImportanceSampling, sync: Any) -> None:
    """Switch on TRL's IS correction for a rollout_func trainer; `sync(step)` gives the engine weights version
    `step` (the job's `sync_weights` phase)."""
    check_importance_sampling_support()
    trainer.use_vllm = True
    trainer.vllm_importance_sampling_correction = True
    trainer.vllm_importance_sampling_mode = options.mode
    trainer.vllm_importance_sampling_clip_min = options.clip_min
    trainer.vllm_importance_sampling_clip_max = options.clip_max
    trainer.vllm_generation = _SyncHook(trainer, sync)
    trainer._last_loaded_step = -1


def load_policy(model_path: Any, cfg: TrainConfig) -> Any:
    """The trainable model, loaded from the same checkpoint as the engine (fp32 unless bf16)."""
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if cfg.bf16 else torch.float32
    return AutoModelForCausalLM.from_pretrained(str(model_path), dtype=dtype)
