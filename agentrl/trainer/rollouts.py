"""The rollout of one training step: the step's groups from the rollout pipeline, stored, timed.

Owns: syncing the engine's weights when the optimizer has stepped (`maybe_sync`), asking the rollout pipeline
(`pipeline.py`: the one scheduler's fan-out, admission and staleness bounds, over-sampling) for the step's groups,
dynamic sampling's refill, writing the step's trajectories to the store (one write per step, tagged with
`train_step` and `dispatch_version`), reusing a step's stored rollout on resume, and the per-step timing the trainer
waited and the engine idled. `FollowerRollout` is the same role on ranks other than 0 (dist.py): it only joins the
weight sync. Does not own the loop of one trajectory (runner), rewards (the runner scored every trajectory), nor how
the trainer asks for a step and gets the trajectories (the TRL adapter, `trl_adapter/hooks.py`: task ids in, TRL's
completion batch out; with several ranks rank 0 rolls out every rank's groups and hands each rank its slice).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrl.store import TrajectoryStore
from agentrl.trainer.dynamic_sampling import DynamicSampler
from agentrl.trainer.loop import BackgroundLoop
from agentrl.trainer.pipeline import RolloutPipeline
from agentrl.trainer.weight_sync import WeightSync
from agentrl.types import Trajectory

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


class AgentRollout:
    """Rank 0's rollout of each training step. One instance per training job."""

    def __init__(self, *, pipeline: RolloutPipeline, store: TrajectoryStore, loop: BackgroundLoop,
                 weight_sync: WeightSync, group_size: int, reuse: Mapping[int, list[Trajectory]] | None = None,
                 dynamic: DynamicSampler | None = None) -> None:
        self.pipeline = pipeline
        self.dynamic = dynamic
        self.scheduler = pipeline.scheduler
        self.store = store
        self.loop = loop
        self.weight_sync = weight_sync
        self.group_size = group_size
        self.synced_version: int | None = None
        self.sync_s: dict[int, float] = {}
        self.steps: dict[int, StepRollout] = {}
        self._reuse = dict(reuse or {})
        self._idle_mark = 0.0
        self.waiting_step: int | None = None  # the step whose rollout the trainer waits for now (for the heartbeat)

    def rollout(self, step: int, task_ids: list[str]) -> list[Trajectory]:
        """The step's trajectories, one group per task id (all ranks' groups when distributed), in order, stored."""
        t0 = time.perf_counter()
        trajectories = self._take_reuse(step, task_ids)
        dynamic_counts: dict[str, int] = {}
        reused = trajectories is not None
        self.waiting_step = step
        try:
            if trajectories is None:
                groups = self.loop.run(self.pipeline.batch(step, task_ids))
                if self.dynamic is not None:
                    groups, dynamic_counts = self.loop.run(self.dynamic.fill(step, groups))
                trajectories = [t for g in groups for t in g]
            else:
                self.pipeline.mark_consumed(len(task_ids))
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
        return trajectories

    def maybe_sync(self, trainer: Any, step: int, *, account: bool = True) -> float:
        """Give the engine the trainer's weights as version `step` (= optimizer steps done) unless it already holds
        that version; returns the seconds spent.

        `account=False` (evaluation between steps) keeps the time out of the next step's `time_sync_s`.
        """
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

    def _take_reuse(self, step: int, task_ids: list[str]) -> list[Trajectory] | None:
        """The stored complete rollout of `step` (from before a crash). Synchronous runs reuse it only if it
        matches the trainer's task ids exactly; pipelined runs follow their own task stream, whose slots it
        consumed."""
        stored = self._reuse.pop(step, None)
        if stored is None:
            return None
        wanted = [task_id for task_id in task_ids for _ in range(self.group_size)]
        if self.pipeline.config.synchronous and [t.task_id for t in stored] != wanted:
            log.warning("resume: the stored rollout of step %d is for other tasks than TRL drew now; regenerating",
                        step)
            return None
        log.info("resume: reusing the stored rollout of step %d (%d trajectories)", step, len(stored))
        return stored


class FollowerRollout:
    """The rollout of ranks other than 0: no engine, pool or store. It takes part in the weight sync (a sharded
    model is gathered by every rank); rank 0 rolls out its groups (the TRL adapter sends its task ids and hands it
    its slice, dist.py)."""

    def __init__(self, *, weight_sync: WeightSync) -> None:
        self.weight_sync = weight_sync
        self.synced_version: int | None = None
        self.steps: dict[int, StepRollout] = {}  # never filled: rank 0 reports the steps
        self.sync_s: dict[int, float] = {}

    def rollout(self, step: int, task_ids: list[str]) -> list[Trajectory]:
        raise AssertionError("only rank 0 rolls out")

    def maybe_sync(self, trainer: Any, step: int, *, account: bool = True) -> float:
        if self.synced_version != step:
            self.weight_sync.sync(trainer, step)
            self.synced_version = step
        return 0.0

    def close(self) -> None:
        pass
