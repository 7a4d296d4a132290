"""The rollout pipeline: which groups a training step trains on, and which groups run while a step trains.

Owns: dispatching groups through the job's one `Scheduler` (`submit`), the admission bound, the staleness bound,
over-sampling with a cut, and the per-step pipeline counters. Does not own one trajectory (runner), the store
(the rollout function writes what a step consumed), TRL, or weight sync.

Two modes, chosen by the config:

    synchronous  max_staleness 0 and oversample 1: step t starts exactly the groups of TRL's prompts for step t with
                 weights version t, waits for all of them and returns them in prompt order. This is the run the
                 trainer did before pipelining, through the same scheduler path (regression-tested).
    pipelined    the task order is a `TaskStream` (the trainer's own resume-stable sampler order, replicated by the
                 TRL adapter's `sampler_order`), cut into
                 slots (one slot = one group). At step t (weights version t, already synced):
                   1. groups whose dispatch version is older than t - k are dropped (cancelled if still running)
                      and counted: never trained on silently; their slots are re-issued;
                   2. admission starts groups (dispatch version t) until consumed + ready + running groups
                      reach (t + k + 1) * B + extra, extra = ceil(B * (oversample - 1)), capped at the job's last
                      step, so at most k steps of groups run ahead of training. Re-issued slots start first, then
                      the next slots of the stream;
                   3. as soon as B groups are complete they are trained on (if more are complete, the oldest;
                      returned ordered by slot);
                   4. the cut: groups left running whose version would be too stale for step t + 1 are cancelled
                      and counted (their sandboxes are released by the scheduler's lease teardown), and their slots
                      re-issued; the others are carried. A finished group not chosen that becomes too stale is
                      dropped by 1. next step.
                 Re-issue: a dropped or cut slot runs again with newer weights (same slot, same task), so a long
                 task is not under-trained for being slow; after REISSUE_LIMIT re-issues a slot is abandoned and
                 counted (a task that can never finish within the staleness window).
                 Groups for t+1..t+k keep running on the job's background loop while TRL trains step t.

Staleness of a trained group = train_step - dispatch_version <= k. Each turn still carries the exact
`weight_version` the engine generated it with (a group may straddle a weight update). Resume: stored trajectories
record their slot (`meta["slot"]`); a resumed pipeline skips consumed slots and regenerates everything else,
so nothing is lost or trained twice.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrl.envs.base import Task
from agentrl.errors import ConfigError
from agentrl.types import Trajectory

log = logging.getLogger("agentrl.trainer")

SLOT_KEY = "slot"
REISSUE_LIMIT = 3  # re-issues of one slot before it is abandoned (counted as groups_abandoned)


@dataclass
class StepCounters:
    """What the pipeline did for one step (merged into that step's metrics row)."""

    groups_dropped_stale: int = 0
    groups_cancelled: int = 0  # over-sampled groups cut (too stale to carry)
    groups_carried: int = 0  # over-sampled or run-ahead groups still running into the next step
    groups_reissued: int = 0  # dropped or cut slots started again with newer weights
    groups_abandoned: int = 0  # slots dropped or cut REISSUE_LIMIT times more (never trained; see module docstring)
    groups_started: int = 0
    in_flight_max: int = 0  # consumed-bound check: groups ready or running right after admission

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class _Group:
    slot: int
    task: Task
    group_id: str
    version: int
    handle: asyncio.Task[list[Trajectory]]
    reissues: int = 0  # how many times this slot was started before


class TaskStream:
    """The pipelined run's task order: `epoch_order(e)` gives epoch e's task ids (one per group); slots count groups
    from the start of training. Slots already consumed (a resume) are skipped."""

    def __init__(self, epoch_order: Callable[[int], list[str]], *, skip: set[int] | None = None) -> None:
        self._epoch_order = epoch_order
        self._skip = set(skip or ())
        self._it = self._slots()

    def _slots(self) -> Iterator[tuple[int, str]]:
        slot, epoch = 0, 0
        while True:
            order = self._epoch_order(epoch)
            if not order:
                raise ConfigError("the task stream of the pipeline is empty: the job has no tasks")
            for task_id in order:
                if slot not in self._skip:
                    yield slot, task_id
                slot += 1
            epoch += 1

    def next(self) -> tuple[int, str]:
        return next(self._it)


@dataclass
class PipelineConfig:
    batch_groups: int  # B: groups per step
    max_staleness: int = 1  # k
    oversample: float = 1.0
    last_step: int | None = None  # no admission for steps after it (0-based, inclusive)

    @property
    def synchronous(self) -> bool:
        return self.max_staleness == 0 and self.oversample <= 1.0

    @property
    def extra(self) -> int:
        return math.ceil(self.batch_groups * (self.oversample - 1.0) - 1e-9)

    def limit(self, step: int) -> int:
        """Most groups consumed + ready + running while step `step` is being served."""
        ahead = step + self.max_staleness
        if self.last_step is not None:
            ahead = min(ahead, self.last_step)
        return (ahead + 1) * self.batch_groups + self.extra


@dataclass
class RolloutPipeline:
    """Lives on the job's background loop; `batch()` is awaited once per training step (see module docstring)."""

    scheduler: Any  # agentrl.runner.Scheduler, built by the composition root (agentrl.compose)
    tasks: Mapping[str, Task]
    config: PipelineConfig
    stream: TaskStream | None = None  # required unless synchronous (set once the trainer's sampler exists)
    start_step: int = 0
    counters: dict[int, StepCounters] = field(default_factory=dict)
    _live: list[_Group] = field(default_factory=list)  # ready or running, dispatch order
    _consumed: int = -1
    _cancelled: list[asyncio.Task[list[Trajectory]]] = field(default_factory=list)  # awaited by close()
    _reissue: list[tuple[int, Task, int]] = field(default_factory=list)  # (slot, task, re-issues so far), FIFO

    def __post_init__(self) -> None:
        self._consumed = self.start_step * self.config.batch_groups

    # -- public ----------------------------------------------------------------------------------------------
    def task(self, task_id: str) -> Task:
        task = self.tasks.get(task_id)
        if task is None:
            raise ConfigError(f"rollout_func got prompt {task_id!r}, which is not a task id of this job "
                              f"(first ids: {list(self.tasks)[:5]}); the dataset column 'prompt' must hold task ids")
        return task

    async def batch(self, step: int, task_ids: list[str]) -> list[list[Trajectory]]:
        """The B groups step `step` trains on. `task_ids`: TRL's tasks for the step (one per group); only the
        synchronous mode follows them, the pipelined mode follows its TaskStream."""
        c = self.counters.setdefault(step, StepCounters())
        if self.config.synchronous:
            return await self._synchronous(step, task_ids, c)
        self._drop_stale(step, c)
        self.admit(step)
        chosen = await self._first_complete(self.config.batch_groups)
        self._consumed += len(chosen)
        self._cut(step, c)
        return [self._tag(g, step) for g in sorted(chosen, key=lambda g: g.slot)]

    def admit(self, step: int) -> int:
        """Start groups (dispatch version `step`) up to the admission bound; returns how many were started."""
        c = self.counters.setdefault(step, StepCounters())
        started = 0
        if self.stream is None:
            raise RuntimeError("a pipelined RolloutPipeline needs its TaskStream before the first step")
        while self._consumed + len(self._live) < self.config.limit(step):
            if self._reissue:
                slot, task, reissues = self._reissue.pop(0)
                self._live.append(self._dispatch(task, step, slot, reissues=reissues))
                c.groups_reissued += 1
            else:
                slot, task_id = self.stream.next()
                self._live.append(self._dispatch(self.task(task_id), step, slot))
            started += 1
        c.groups_started += started
        c.in_flight_max = max(c.in_flight_max, len(self._live))
        return started

    def mark_consumed(self, groups: int) -> None:
        """Count groups a step trained on without the pipeline (a stored rollout reused on resume)."""
        self._consumed += groups

    async def close(self) -> None:
        """Cancel every group still running (their sandboxes are returned); nothing of them is stored."""
        live, self._live = self._live, []
        for g in live:
            g.handle.cancel()
        cancelled, self._cancelled = self._cancelled + [g.handle for g in live], []
        await asyncio.gather(*cancelled, return_exceptions=True)

    @property
    def live(self) -> int:
        return len(self._live)

    # -- internals -------------------------------------------------------------------------------------------
    def _dispatch(self, task: Task, version: int, slot: int, *, reissues: int = 0) -> _Group:
        group_id = f"v{version}-{self.scheduler.ids.group_id(task.id, version, replica=slot)}"
        handle = self.scheduler.submit(task, group_id=group_id, step=version)
        return _Group(slot=slot, task=task, group_id=group_id, version=version, handle=handle, reissues=reissues)

    async def _synchronous(self, step: int, task_ids: list[str], c: StepCounters) -> list[list[Trajectory]]:
        groups = [self._dispatch(self.task(tid), step, slot=i) for i, tid in enumerate(task_ids)]
        c.groups_started += len(groups)
        c.in_flight_max = len(groups)
        try:
            results = await asyncio.gather(*(g.handle for g in groups))
        finally:  # on an error (or a cancellation) the other groups are cancelled and awaited: leases returned
            for g in groups:
                g.handle.cancel()
            await asyncio.gather(*(g.handle for g in groups), return_exceptions=True)
        self._consumed += len(groups)
        return [[t.model_copy(update={"dispatch_version": step, "train_step": step}) for t in r] for r in results]

    def _drop_stale(self, step: int, c: StepCounters) -> None:
        oldest = step - self.config.max_staleness
        for g in [g for g in self._live if g.version < oldest]:
            self._live.remove(g)
            self._cancel(g)
            c.groups_dropped_stale += 1
            self._requeue(g, c)
            log.info("pipeline: dropped group %s (task %s, weights v%d) at step %d: older than max_staleness=%d",
                     g.group_id, g.task.id, g.version, step, self.config.max_staleness)

    async def _first_complete(self, n: int) -> list[_Group]:
        """Wait until `n` live groups are done; of the done ones take the oldest (dispatch version, then slot):
        they are the closest to the staleness bound."""
        if len(self._live) < n:
            raise RuntimeError(f"pipeline has {len(self._live)} groups live, needs {n} (admission bug)")
        while sum(g.handle.done() for g in self._live) < n:
            await asyncio.wait([g.handle for g in self._live if not g.handle.done()],
                               return_when=asyncio.FIRST_COMPLETED)
        done = [g for g in self._live if g.handle.done()]
        for g in done:
            if g.handle.cancelled():
                raise RuntimeError(f"group {g.group_id} was cancelled outside the pipeline")
            exc = g.handle.exception()
            if exc is not None:
                raise exc
        done.sort(key=lambda g: (g.version, g.slot))
        chosen = done[:n]
        for g in chosen:
            self._live.remove(g)
        return chosen

    def _cut(self, step: int, c: StepCounters) -> None:
        """Over-sampled groups that could not be trained at step + 1 are cancelled now (sandboxes released)."""
        oldest_next = step + 1 - self.config.max_staleness
        for g in list(self._live):
            if g.version < oldest_next and not g.handle.done():
                self._live.remove(g)
                self._cancel(g)
                c.groups_cancelled += 1
                self._requeue(g, c)
        c.groups_carried = sum(g.version <= step for g in self._live)

    def _requeue(self, g: _Group, c: StepCounters) -> None:
        """Re-issue a dropped or cut slot at the next admission, unless it has been re-issued REISSUE_LIMIT times."""
        if g.reissues >= REISSUE_LIMIT:
            c.groups_abandoned += 1
            log.warning("pipeline: slot %d (task %s) abandoned: dropped or cut %d times (it never finished within "
                        "max_staleness=%d)", g.slot, g.task.id, g.reissues + 1, self.config.max_staleness)
            return
        self._reissue.append((g.slot, g.task, g.reissues + 1))

    def _cancel(self, g: _Group) -> None:
        g.handle.cancel()
        self._cancelled = [h for h in self._cancelled if not h.done()] + [g.handle]

    @staticmethod
    def _tag(g: _Group, step: int) -> list[Trajectory]:
        return [t.model_copy(update={"dispatch_version": g.version, "train_step": step, "step": step,
                                     "meta": {**t.meta, SLOT_KEY: g.slot}}) for t in g.handle.result()]


def consumed_slots(trajectories: list[Trajectory]) -> set[int]:
    """Slots of the task stream that stored (trained) trajectories came from."""
    return {int(t.meta[SLOT_KEY]) for t in trajectories if SLOT_KEY in t.meta}
