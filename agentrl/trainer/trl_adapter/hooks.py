"""Where TRL calls agentrl: task ids as TRL's prompts, the `rollout_func`, the reward echo, the TrainerCallbacks.
Part of the TRL adapter (this package's `__init__` lists every TRL internal it touches).

Prompt encoding: TRL's dataset column "prompt" holds task ids (`task_dataset`). TRL's RepeatSampler repeats each one
`num_generations` (= group_size) times consecutively, so block i = prompts[i*G:(i+1)*G] is one GRPO group;
`group_blocks` regroups them (never re-expanding) and the job's `rollout_and_score` phase gets one task id per group.

rollout_func contract (`RolloutHook`, called by `GRPOTrainer._generate`):

    prompts      [B*G]  task ids, already repeated G times (see above)
    returns      prompt_ids [B*G][P_i], completion_ids [B*G][C_i], logprobs [B*G][C_i] (0.0 at tool tokens),
                 env_mask [B*G][C_i] (1 = model token; TRL turns it into `tool_mask`, multiplied into the loss
                 mask), env_reward [B*G] (None for infra errors: excluded from the group baseline, advantage 0),
                 plus per-trajectory stats (num_turns, tool_errors, status, trajectory_id, weight_version) that
                 TRL forwards to reward functions.

Reward echo: the runner scored every trajectory; `env_reward` is TRL's one reward function and returns the
`env_reward` column unchanged (never re-parsed from decoded text), so TRL's advantages are computed from it.

Completions end on the model's end-of-turn token unless the runner's budget truncated them (TRL then counts them as
clipped and, with mask_truncated_completions, masks them). An infra-error trajectory carries no policy signal: it
is sent as a single end-of-turn token with env_mask 0 and reward None.

With several ranks (dist.py) every rank's hook sends its prompts to rank 0, rank 0 rolls out the global batch once
and each rank returns its slice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from agentrl.errors import ConfigError
from agentrl.trainer.dist import Ranks, rank_slice
from agentrl.trainer.metrics import UPDATE_KEYS
from agentrl.trainer.trl_adapter.trainer import IS_CLIPPED_KEY, MISMATCH_LOG_KEYS
from agentrl.types import Status, Trajectory

if TYPE_CHECKING:
    from agentrl.envs.base import Task
    from agentrl.trainer.phases import StepPhases

# metrics.UPDATE_KEYS -> the name of that number in TRL's log of a step
UPDATE_LOG_KEYS = {"kl": "kl", "loss": "loss", "grad_norm": "grad_norm", "learning_rate": "learning_rate",
                   "entropy": "entropy", "clip_ratio": "clip_ratio/region_mean",
                   "is_ratio_mean": "sampling/importance_sampling_ratio/mean", "is_ratio_clipped_frac": IS_CLIPPED_KEY,
                   "sampling_logp_diff_mean": "sampling/sampling_logp_difference/mean", **MISMATCH_LOG_KEYS}
assert tuple(UPDATE_LOG_KEYS) == UPDATE_KEYS


def task_dataset(tasks: list[Task], batch_size: int) -> Any:
    """TRL's dataset: column "prompt" = task id. Repeated so one step's batch fits even with few tasks."""
    from datasets import Dataset

    if not tasks:
        raise ConfigError("no tasks selected: check `env`, `tasks` and `task_ids`")
    ids = [t.id for t in tasks]
    ids = ids * -(-batch_size // len(ids))
    return Dataset.from_dict({"prompt": ids})


def group_blocks(prompts: list[Any], group_size: int) -> list[list[str]]:
    """Split TRL's prompts into GRPO groups (consecutive blocks of `group_size` equal task ids)."""
    if len(prompts) % group_size:
        raise ConfigError(f"rollout_func got {len(prompts)} prompts, not a multiple of group_size={group_size}: "
                          f"TRL's num_generations must equal the job's group_size")
    blocks = [[str(p) for p in prompts[i: i + group_size]] for i in range(0, len(prompts), group_size)]
    for block in blocks:
        if len(set(block)) != 1:
            raise ConfigError(f"rollout_func got a group of different prompts {block}: the dataset column 'prompt' "
                              f"must hold task ids and TRL must repeat each one group_size={group_size} times")
    return blocks


def trl_row(traj: Trajectory, end_id: int) -> tuple[list[int], list[float], list[int]]:
    """(completion_ids, logprobs, env_mask) of one trajectory as TRL trains on them."""
    if traj.status is Status.infra_error or not traj.completion_ids:
        return [end_id], [0.0], [0]  # nothing to learn from; one end token keeps TRL's shapes and EOS check happy
    return list(traj.completion_ids), list(traj.logprobs), list(traj.env_mask)


def to_trl_batch(trajectories: list[Trajectory], end_id: int) -> dict[str, list[Any]]:
    """The dict `rollout_func` returns: one entry per trajectory, in prompt order."""
    rows = [trl_row(t, end_id) for t in trajectories]
    return {
        "prompt_ids": [list(t.prompt_ids) for t in trajectories],
        "completion_ids": [r[0] for r in rows],
        "logprobs": [r[1] for r in rows],
        "env_mask": [r[2] for r in rows],
        "env_reward": [None if t.reward is None else float(t.reward) for t in trajectories],
        "num_turns": [len(t.turns) for t in trajectories],
        "tool_errors": [t.num_tool_errors for t in trajectories],
        "status": [t.status.value for t in trajectories],
        "trajectory_id": [t.id for t in trajectories],
        "weight_version": [min((turn.weight_version for turn in t.turns), default=-1) for t in trajectories],
    }


def env_reward(prompts: list[Any], completions: list[Any], env_reward: list[float | None],
               **kwargs: Any) -> list[float | None]:
    """TRL reward function: the env's reward computed by the runner (never re-parsed from decoded text).

    None (an infra error) makes TRL exclude the row from its group's baseline and give it advantage 0.
    """
    return [None if r is None else float(r) for r in env_reward]


def update_numbers(logs: dict[str, Any]) -> dict[str, Any]:
    """TRL's log of one step -> the update's numbers under agentrl's names (metrics.UPDATE_KEYS)."""
    return {key: logs.get(log_key) for key, log_key in UPDATE_LOG_KEYS.items()}


class RolloutHook:
    """Callable passed as `GRPOTrainer(rollout_func=...)`: the step's `sync_weights` then `rollout_and_score`
    phases, TRL's prompts in, TRL's completion batch out. `end_id`: the engine's end-of-turn id (None on ranks
    other than 0, which never convert a batch)."""

    def __init__(self, phases: StepPhases, *, ranks: Ranks, group_size: int, end_id: int | None) -> None:
        self.phases = phases
        self.ranks = ranks
        self.group_size = group_size
        self.end_id = end_id

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        step = int(trainer.state.global_step)
        self.phases.sync_weights(step)
        if not self.ranks.distributed:
            return self._batch(step, prompts)
        everything = self.ranks.gather(prompts)  # the global batch, in TRL's order (rank 0's slice first)
        batch = self.ranks.share(lambda: self._batch(step, everything or []))
        return rank_slice(batch, self.ranks.rank, len(prompts))

    def _batch(self, step: int, prompts: list[Any]) -> dict[str, list[Any]]:
        """Rank 0: the step's trajectories for `prompts` (all ranks' prompts when distributed) as TRL's dict."""
        blocks = group_blocks(prompts, self.group_size)
        trajectories = self.phases.rollout_and_score(step, [b[0] for b in blocks])
        assert self.end_id is not None, "only rank 0 rolls out"
        return to_trl_batch(trajectories, self.end_id)


class PhaseCallback(TrainerCallback):
    """Calls the job's step phases from the trainer's hooks. Hook order within one optimizer step (transformers 5):
    on_step_begin -> [rollout_func, forward/backward, optimizer.step] -> on_step_end (global_step already
    incremented) -> on_log (TRL's averaged logs) -> save -> on_save."""

    def __init__(self, phases: StepPhases) -> None:
        self.phases = phases

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.phases.before_training(int(state.global_step))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.phases.begin_step()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.phases.after_update(int(state.global_step))

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        logs = logs or {}
        if "loss" not in logs:
            return  # the end-of-training summary log, not a step
        if self.phases.record_step(int(state.global_step) - 1, update_numbers(logs)):
            control.should_training_stop = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.phases.checkpoint_saved(int(state.global_step))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.phases.after_training(int(state.global_step))


class RankStop(TrainerCallback):
    """Several ranks: after each step's log, every rank learns whether rank 0 (whose record_step phase raised the
    integrity alarm) stops training, so that no rank waits for a step the others never start. Registered after
    the PhaseCallback."""

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if "loss" in (logs or {}) and self.ranks.share(lambda: bool(control.should_training_stop)):
            control.should_training_stop = True


def strip_console_callbacks(trainer: Any) -> None:
    """transformers' own progress printing: the job prints its table (and the heartbeat) instead."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)


def sampler_order(trainer: Any, group_size: int) -> Any:
    """Epoch -> task ids in the order TRL's (resume-stable) train sampler draws them, one per group (the pipelined
    run's TaskStream replicates it)."""
    sampler = trainer._get_train_sampler()
    prompts = list(trainer.train_dataset["prompt"])

    def order(epoch: int) -> list[str]:
        sampler.set_epoch(epoch)
        return [str(prompts[i]) for i in list(sampler)[::group_size]]

    return order
