"""The TRL adapter: the one place in agentrl that knows TRL's names and internals (an import contract in
pyproject.toml lets nothing else import `trl`). Written against trl 1.16.0 (transformers 5.24).

TRL's `GRPOTrainer.train()` drives the training loop; the adapter makes it call the job's step phases
(`agentrl.trainer.phases.StepPhases`, the step's order and which hook runs each phase) and hands it what it trains on:

    trainer.py   AgentGRPOTrainer (the GRPOTrainer subclass), TrainConfig -> GRPOConfig, the LoRA config, the
                 resume-stable sampler, the importance-sampling shim, the IS clipped fraction and mismatch logging
    hooks.py     task ids as TRL's prompts and their regrouping, the rollout_func, the reward echo (`env_reward`),
                 TRL's log -> the update's numbers, the TrainerCallbacks (PhaseCallback, RankStop), the sampler order
    __init__     build_trainer, train, global_step, generation_settings: the job's only calls into TRL

What an upgrade of TRL must re-check (everything below; `check_importance_sampling_support` checks the IS shim's
part at start-up, tests/integration/test_trainer.py and tests/unit/test_trainer_units.py the rest):

  private GRPOTrainer internals
    _generate_and_score_completions   overridden (AgentGRPOTrainer): reads its output keys completion_mask,
                                      tool_mask, prompt_ids, prompt_mask, completion_ids, importance_sampling_ratio,
                                      sampling_per_token_logps, old_per_token_logps; its source must still hold the
                                      IS gate `self.use_vllm and self.vllm_importance_sampling_correction`
    _get_train_sampler                overridden (EpochRepeatSampler) and called by `sampler_order`
    _get_per_token_logps_and_entropies  called for the mismatch's no-grad forward
    _metrics[mode][key]               appended to: IS clipped fraction, mismatch numbers
    _generate (source)                calls `self.rollout_func(prompts, self)`; with use_vllm calls
                                      `self.vllm_generation.sync_weights()` when global_step != _last_loaded_step
    _compute_loss (source)            applies inputs["importance_sampling_ratio"] behind the IS gate
    _last_loaded_step, use_vllm, vllm_generation, vllm_importance_sampling_{correction,mode,clip_min,clip_max}
                                      set after construction by the IS shim
    trl.trainer.utils.RepeatSampler   subclassed; its `generator` and `shuffle` attributes
  public but load-bearing
    GRPOTrainer(rollout_func=...)     experimental in 1.16; its returned keys (hooks.py) and env_mask -> tool_mask;
                                      extra keys are forwarded to reward functions (the reward echo)
    GRPOConfig fields                 every field `grpo_config` sets, generation_batch_size, steps_per_generation
    eos_token_ids, num_generations, num_iterations, shuffle_dataset, train_dataset, args
    TRL's log names                   hooks.UPDATE_LOG_KEYS (kl, loss, clip_ratio/region_mean, sampling/...)
  transformers Trainer (TRL's base)   TrainerCallback hook order, state.global_step, train(resume_from_checkpoint),
                                      remove_callback(PrinterCallback / ProgressCallback), enable_full_determinism
  transformers, used elsewhere        the Trainer's accelerator / model / processing_class (weight_sync.py,
                                      checks.py); its checkpoint layout checkpoint-<N>/trainer_state.json (resume.py)
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.trainer.checks import TrainerGeneration
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.dist import Ranks
from agentrl.trainer.trl_adapter.hooks import (
    PhaseCallback,
    RankStop,
    RolloutHook,
    env_reward,
    sampler_order,
    strip_console_callbacks,
    task_dataset,
)
from agentrl.trainer.trl_adapter.trainer import (
    AgentGRPOTrainer,
    check_importance_sampling_support,
    enable_importance_sampling,
    grpo_config,
    load_policy,
    peft_config,
)
from agentrl.types import SamplingParams

if TYPE_CHECKING:
    from agentrl.envs.base import Task
    from agentrl.trainer.phases import StepPhases

TRL_VERSION = "1.16.0"  # the version this adapter was written and tested against

__all__ = ["TRL_VERSION", "build_trainer", "check_importance_sampling_support", "generation_settings",
           "global_step", "sampler_order", "train"]


def build_trainer(cfg: TrainConfig, phases: StepPhases, *, model_path: Path, tokenizer: Any, tasks: list[Task],
                  sampling: SamplingParams, ranks: Ranks, end_id: int | None) -> AgentGRPOTrainer:
    """The trainer of this rank (every rank builds the same one from the same seed), calling `phases`."""
    if cfg.deterministic:  # before the policy is built: a LoRA adapter's initialisation draws from torch's RNG
        from transformers import enable_full_determinism

        enable_full_determinism(cfg.seed)
    callbacks: list[Any] = [PhaseCallback(phases)] + ([RankStop(ranks)] if ranks.distributed else [])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*rollout_func.*experimental")
        trainer = AgentGRPOTrainer(
            model=load_policy(model_path, cfg), reward_funcs=[env_reward],
            args=grpo_config(cfg, sampling, ranks.world),
            train_dataset=task_dataset(tasks, cfg.batch_size), processing_class=tokenizer,
            peft_config=peft_config(cfg),
            rollout_func=RolloutHook(phases, ranks=ranks, group_size=cfg.group_size, end_id=end_id),
            callbacks=callbacks)
    strip_console_callbacks(trainer)
    trainer.measure_mismatch = cfg.mismatch_metrics
    if cfg.importance_correction:
        enable_importance_sampling(trainer, cfg.importance_sampling, phases.sync_weights)
    return trainer


def train(trainer: Any, checkpoint: Path | None) -> int:
    """Run TRL's training loop (from `checkpoint` on resume); returns the optimizer steps done."""
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    return global_step(trainer)


def global_step(trainer: Any) -> int:
    """Optimizer steps done = the version of the trainer's weights."""
    return int(trainer.state.global_step)


def generation_settings(trainer: Any) -> TrainerGeneration:
    """What the trainer assumes about generation, for the start-up check against the engine and the runner."""
    args = trainer.args
    return TrainerGeneration(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k or 0,
                             max_completion_tokens=args.max_completion_length,
                             end_ids=sorted(set(trainer.eos_token_ids) | {trainer.processing_class.pad_token_id}))
