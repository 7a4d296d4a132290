"""The TRL `rollout_func`: TRL's prompts (task ids) -> real multi-turn trajectories -> TRL's completion batch.

Owns: mapping each received prompt to its task, running exactly one trajectory per prompt through the real runner
(`Scheduler.run_one`, all of a step concurrently on the job's background loop), syncing the engine's weights first
when the optimizer has stepped, writing the step's trajectories to the store (one write per step), reusing a
step's stored rollout on resume, and converting trajectories into TRL's dict. Does not own the loop of one
trajectory (runner), rewards (the trajectory's `reward`, read by `env_reward`), or when TRL calls us.

TRL contract (trl 1.16 `GRPOTrainer._generate`, see DESIGN §3 and reference/trl-sglang.md §2.3):

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

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentrl.envs.base import Task
from agentrl.errors import ConfigError
from agentrl.runner import Scheduler
from agentrl.store import TrajectoryStore
from agentrl.trainer.loop import BackgroundLoop
from agentrl.trainer.weight_sync import WeightSync
from agentrl.types import Status, Trajectory

log = logging.getLogger("agentrl.trainer")


@dataclass
class StepRollout:
    """What the rollout of one step produced, for the metrics of that step."""

    step: int
    trajectories: list[Trajectory]
    rollout_s: float
    reused: bool


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

    def __init__(self, *, scheduler: Scheduler, tasks: Mapping[str, Task], store: TrajectoryStore,
                 loop: BackgroundLoop, weight_sync: WeightSync, group_size: int, max_concurrency: int,
                 end_id: int, reuse: Mapping[int, list[Trajectory]] | None = None) -> None:
        self.scheduler = scheduler
        self.tasks = dict(tasks)
        self.store = store
        self.loop = loop
        self.weight_sync = weight_sync
        self.group_size = group_size
        self.max_concurrency = max_concurrency
        self.end_id = end_id
        self.synced_version: int | None = None
        self.sync_s: dict[int, float] = {}
        self.steps: dict[int, StepRollout] = {}
        self._reuse = dict(reuse or {})

    # -- TRL entry point -------------------------------------------------------------------------------------
    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        step = int(trainer.state.global_step)
        self.maybe_sync(trainer)
        blocks = group_blocks(prompts, self.group_size)
        t0 = time.perf_counter()
        trajectories = self._take_reuse(step, blocks)
        reused = trajectories is not None
        if trajectories is None:
            trajectories = self.loop.run(self._run_step(blocks, step))
        self.store.append_group(trajectories)  # the whole step in one write + fsync
        self.steps[step] = StepRollout(step, trajectories, time.perf_counter() - t0, reused)
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

    # -- internals ---------------------------------------------------------------------------------------------
    def _task(self, task_id: str) -> Task:
        task = self.tasks.get(task_id)
        if task is None:
            raise ConfigError(f"rollout_func got prompt {task_id!r}, which is not a task id of this job "
                              f"(first ids: {list(self.tasks)[:5]}); the dataset column 'prompt' must hold task ids")
        return task

    async def _run_step(self, blocks: list[list[str]], step: int) -> list[Trajectory]:
        """Exactly one trajectory per received prompt, all concurrently (bounded), in prompt order."""
        slots = asyncio.Semaphore(self.max_concurrency)

        async def one(task: Task, group_id: str, k: int) -> Trajectory:
            async with slots:
                return await self.scheduler.run_one(task, group_id=group_id, sample_index=k, step=step)

        jobs = []
        seen: dict[str, int] = {}
        for block in blocks:
            task = self._task(block[0])
            seen[task.id] = seen.get(task.id, -1) + 1  # TRL may draw a task twice in one step: distinct groups
            group_id = f"s{step}-{self.scheduler.ids.group_id(task.id, step, replica=seen[task.id])}"
            jobs += [one(task, group_id, k) for k in range(len(block))]
        return list(await asyncio.gather(*jobs))

    def _take_reuse(self, step: int, blocks: list[list[str]]) -> list[Trajectory] | None:
        """The stored complete rollout of `step` (from before a crash) if it matches these prompts exactly."""
        stored = self._reuse.pop(step, None)
        if stored is None:
            return None
        wanted = [p for block in blocks for p in block]
        if [t.task_id for t in stored] != wanted:
            log.warning("resume: the stored rollout of step %d is for other tasks than TRL drew now; regenerating",
                        step)
            return None
        log.info("resume: reusing the stored rollout of step %d (%d trajectories)", step, len(stored))
        return stored
