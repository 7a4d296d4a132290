"""The TRL `rollout_func`: TRL's prompts (task ids) -> real multi-turn trajectories -> TRL's completion batch.

Owns: syncing the engine's weights first when the optimizer has stepped, asking the rollout pipeline
(`pipeline.py`: the one scheduler's fan-out, admission and staleness bounds, over-sampling) for the step's groups,
writing the step's trajectories to the store (one write per step, tagged with `train_step` and `dispatch_version`),
reusing a step's stored rollout on resume, the per-step timing the trainer waited and the engine idled, and
converting trajectories into TRL's dict; with several ranks (dist.py), rolling out every rank's prompts once on
rank 0 and returning each rank its slice (`FollowerRollout` on the other ranks). Does not own the loop of one
trajectory (runner), rewards (the trajectory's `reward`, read by `env_reward`), or when TRL calls us.

TRL contract (trl 1.16 `GRPOTrainer._generate`, see docs/architecture.md and docs/training.md):

    prompts      [B*G]  the dataset column "prompt" = task ids, ALREADY repeated G (= num_generations) times
                        consecutively by TRL's RepeatSampler: block i = prompts[i*G:(i+1)*G] is one GRPO group.
                        Never re-expanded here.
    returns      prompt_ids [B*G][P_i], completion_ids [B*G][C_i], logprobs [B*G][C_i] (0.0 at tool tokens),
                 env_mask [B*G][C_i] (1 = model token; TRL turns it into `tool_mask`, multiplied into the loss
                 mask), env_reward [B*G] (None for infra errors: excluded from the group baseline, advantage 0),
                 plus per-trajectory stats (num_turns, tool_errors, status, trajectory_id, weight_version) that
                 TRL forwards to reward functions.

Completions end on the model's end-of-turn token unless the runner's budget truncated them (TRL then counts them as
clipped and, with mask_truncated_completions, masks them). An infra-error trajectory carries no policy signal: it
is sent as a single end-of-turn token with env_mask 0 and reward None.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrl.errors import ConfigError
from agentrl.store import TrajectoryStore
from agentrl.trainer.dist import Ranks, rank_slice
from agentrl.trainer.dynamic_sampling import DynamicSampler
from agentrl.trainer.loop import BackgroundLoop
from agentrl.trainer.pipeline import RolloutPipeline
from agentrl.trainer.weight_sync import WeightSync
from agentrl.types import Status, Trajectory

log = logging.getLogger("agentrl.trainer")


@dataclass
class StepRollout:
    """What the rollout of one step produced, for the metrics of that step."""

    step: int
    trajectories: list[Trajectory]
    rollout_s: float  # the trainer's wait for this step's groups (= trainer_wait_s)
    reused: bool
    engine_idle_s: float = 0.0  # no trajectory of ours in flight, since the previous step's rollout returned
    pipeline: dict[str, int] = field(default_factory=dict)


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


class AgentRollout:
    """Callable passed as `GRPOTrainer(rollout_func=...)`. One instance per training job."""

    def __init__(self, *, pipeline: RolloutPipeline, store: TrajectoryStore, loop: BackgroundLoop,
                 weight_sync: WeightSync, group_size: int, end_id: int,
                 reuse: Mapping[int, list[Trajectory]] | None = None, ranks: Ranks | None = None,
                 dynamic: DynamicSampler | None = None) -> None:
        self.ranks = ranks or Ranks()
        self.pipeline = pipeline
        self.dynamic = dynamic
        self.scheduler = pipeline.scheduler
        self.store = store
        self.loop = loop
        self.weight_sync = weight_sync
        self.group_size = group_size
        self.end_id = end_id
        self.synced_version: int | None = None
        self.sync_s: dict[int, float] = {}
        self.steps: dict[int, StepRollout] = {}
        self._reuse = dict(reuse or {})
        self._idle_mark = 0.0
        self.waiting_step: int | None = None  # the step whose rollout the trainer waits for now (for the heartbeat)

    # -- TRL entry point -------------------------------------------------------------------------------------
    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        self.maybe_sync(trainer)
        if not self.ranks.distributed:
            return self.rollout(prompts, trainer)
        everything = self.ranks.gather(prompts)  # the global batch, in TRL's order (rank 0's slice first)
        batch = self.ranks.share(lambda: self.rollout(everything or [], trainer))
        return rank_slice(batch, self.ranks.rank, len(prompts))

    def rollout(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """The step's trajectories for `prompts` (all ranks' prompts when distributed), stored, as TRL's dict."""
        step = int(trainer.state.global_step)
        blocks = group_blocks(prompts, self.group_size)
        t0 = time.perf_counter()
        trajectories = self._take_reuse(step, blocks)
        dynamic_counts: dict[str, int] = {}
        reused = trajectories is not None
        self.waiting_step = step
        try:
            if trajectories is None:
                groups = self.loop.run(self.pipeline.batch(step, [b[0] for b in blocks]))
                if self.dynamic is not None:
                    groups, dynamic_counts = self.loop.run(self.dynamic.fill(step, groups))
                trajectories = [t for g in groups for t in g]
            else:
                self.pipeline.mark_consumed(len(blocks))
                self.loop.run(self._admit(step))  # the next steps' groups start while this step trains
        finally:
            self.waiting_step = None
        wait_s = time.perf_counter() - t0
        self.store.append_group(trajectories)  # the whole step in one write + fsync
        self.scheduler.guard.check(where=f"this run (up to step {step})")  # stored first: nothing is lost
        idle = self.scheduler.idle_seconds()
        counters = self.pipeline.counters.pop(step, None)
        self.steps[step] = StepRollout(step, trajectories, wait_s, reused, engine_idle_s=idle - self._idle_mark,
                                       pipeline={**(counters.as_dict() if counters else {}), **dynamic_counts})
        self._idle_mark = idle
        return to_trl_batch(trajectories, self.end_id)

    def maybe_sync(self, trainer: Any, *, account: bool = True) -> float:
        """Sync the engine to `global_step` unless it already holds that version; returns the seconds spent.

        `account=False` (evaluation between steps) keeps the time out of the next step's `time_sync_s`.
        """
        step = int(trainer.state.global_step)
        if self.synced_version == step:
            return 0.0
        t0 = time.perf_counter()
        self.weight_sync.sync(trainer, step)
        self.synced_version = step
        dt = time.perf_counter() - t0
        if account:
            self.sync_s[step] = self.sync_s.get(step, 0.0) + dt
        return dt

    def close(self) -> None:
        """Cancel the groups still running ahead of training (the job is over or failed)."""
        if not self.loop.closed:
            self.loop.run(self.pipeline.close())

    # -- internals ---------------------------------------------------------------------------------------------
    async def _admit(self, step: int) -> None:
        if not self.pipeline.config.synchronous:
            self.pipeline.admit(step)

    def _take_reuse(self, step: int, blocks: list[list[str]]) -> list[Trajectory] | None:
        """The stored complete rollout of `step` (from before a crash). Synchronous runs reuse it only if it
        matches TRL's prompts exactly; pipelined runs follow their own task stream, whose slots it consumed."""
        stored = self._reuse.pop(step, None)
        if stored is None:
            return None
        wanted = [p for block in blocks for p in block]
        if self.pipeline.config.synchronous and [t.task_id for t in stored] != wanted:
            log.warning("resume: the stored rollout of step %d is for other tasks than TRL drew now; regenerating",
                        step)
            return None
        log.info("resume: reusing the stored rollout of step %d (%d trajectories)", step, len(stored))
        return stored


class FollowerRollout:
    """The rollout function of ranks other than 0: no engine, pool or store. It takes part in the weight sync (a
    sharded model is gathered by every rank), sends its prompts to rank 0 and returns the slice rank 0 rolled out
    for it (dist.py)."""

    def __init__(self, *, ranks: Ranks, weight_sync: WeightSync) -> None:
        self.ranks = ranks
        self.weight_sync = weight_sync
        self.synced_version: int | None = None
        self.steps: dict[int, StepRollout] = {}  # never filled: rank 0 reports the steps
        self.sync_s: dict[int, float] = {}

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        self.maybe_sync(trainer)
        self.ranks.gather(prompts)
        return rank_slice(self.ranks.share(_never), self.ranks.rank, len(prompts))

    def maybe_sync(self, trainer: Any, *, account: bool = True) -> float:
        step = int(trainer.state.global_step)
        if self.synced_version != step:
            self.weight_sync.sync(trainer, step)
            self.synced_version = step
        return 0.0

    def close(self) -> None:
        pass


def _never() -> Any:
    raise AssertionError("only rank 0 rolls out")
