"""Groups, concurrency, budgets and streaming of whole groups. One asyncio task per trajectory, no turn barrier.

Owns: turning (task, sample) pairs into finished `Trajectory` records — leasing a sandbox, running the loop
(`rollout.py`) under a wall-clock budget, finalizing (hidden tests -> reward), retrying infrastructure failures
within a budget, and yielding each group as soon as its G trajectories are done. Does not own: the loop itself,
the store (callers write what is yielded), or sandbox lifecycles (the pool's).

Concurrency: `max_trajectories` bounds trajectories in flight (each holds one sandbox lease; the pool bounds
sandboxes separately), and the engine batches whatever generate calls are outstanding.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agentrl.envs.base import Task
from agentrl.errors import InfraError
from agentrl.reward import score
from agentrl.runner.rollout import Rollout, TrajectoryState
from agentrl.runner.seeds import IdPlan
from agentrl.types import Status, Timing, Trajectory

log = logging.getLogger("agentrl.runner")


@dataclass(frozen=True)
class SchedulerConfig:
    group_size: int = 4
    max_trajectories: int = 16
    trajectory_timeout_s: float = 600.0
    infra_retries: int = 2
    finalize_timeout_s: float = 120.0
    seed: int | None = None  # deterministic: ids and per-turn sampling seeds derived from it (runner/seeds.py)
    namespace: str = ""  # separates deterministic runs that share a seed (e.g. evaluation modes)


@dataclass
class Progress:
    """Live counters for the progress display (updated as trajectories finish)."""

    trajectories_done: int = 0
    trajectories_total: int = 0
    turns: int = 0
    tool_calls: int = 0
    tokens: int = 0
    infra_errors: int = 0
    started: float = field(default_factory=time.perf_counter)

    def tokens_per_s(self) -> float:
        return self.tokens / max(time.perf_counter() - self.started, 1e-9)


class Scheduler:
    def __init__(self, rollout: Rollout, pool: Any, config: SchedulerConfig, *, meta: dict[str, Any] | None = None,
                 on_trajectory: Callable[[Trajectory], None] | None = None) -> None:
        self.rollout = rollout
        self.pool = pool
        self.config = config
        self.meta = dict(meta or {})
        self.progress = Progress()
        self._on_trajectory = on_trajectory
        self._slots = asyncio.Semaphore(config.max_trajectories)
        self.ids = IdPlan(config.seed, config.namespace)

    async def run(self, tasks: Iterable[Task], *, step: int | None = None) -> AsyncIterator[list[Trajectory]]:
        """Run G samples of every task; yield each group (ordered by sample index) as soon as it is complete."""
        done: asyncio.Queue[tuple[str, Trajectory]] = asyncio.Queue()
        groups: dict[str, list[Trajectory]] = {}
        workers: list[asyncio.Task[None]] = []
        seen: dict[str, int] = {}
        for task in tasks:
            seen[task.id] = seen.get(task.id, -1) + 1
            group_id = self.ids.group_id(task.id, step, replica=seen[task.id])
            groups[group_id] = []
            for k in range(self.config.group_size):
                workers.append(asyncio.create_task(self._one(task, group_id, k, step, done)))
        self.progress.trajectories_total += len(workers)
        try:
            for _ in range(len(workers)):
                group_id, traj = await done.get()
                groups[group_id].append(traj)
                if len(groups[group_id]) == self.config.group_size:
                    yield sorted(groups.pop(group_id), key=lambda t: t.sample_index)
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _one(self, task: Task, group_id: str, k: int, step: int | None,
                   done: asyncio.Queue[tuple[str, Trajectory]]) -> None:
        async with self._slots:
            traj = await self.run_one(task, group_id=group_id, sample_index=k, step=step)
        self._account(traj)
        await done.put((group_id, traj))

    async def run_one(self, task: Task, *, group_id: str, sample_index: int, step: int | None = None) -> Trajectory:
        """One trajectory with infra retries. Never raises for task or infra failures: they are data."""
        attempt = 0
        while True:
            traj = await self._attempt(task, group_id, sample_index, attempt, step)
            if traj.status is not Status.infra_error or attempt >= self.config.infra_retries:
                return traj
            log.warning("trajectory %s (task %s) infra error, attempt %d: %s", traj.id, task.id, attempt, traj.error)
            attempt += 1

    async def _attempt(self, task: Task, group_id: str, k: int, attempt: int, step: int | None) -> Trajectory:
        traj_id = self.ids.trajectory_id(group_id, k, attempt)
        state = self.rollout.start(task, seed=self.ids.trajectory_seed(group_id, k))
        timing = Timing()
        t0 = time.perf_counter()
        tests, solution, error = None, None, None
        try:
            async with asyncio.timeout(self.config.trajectory_timeout_s + self.config.finalize_timeout_s + 60):
                async with self.pool.lease() as sandbox:
                    timing.sandbox_wait_s = time.perf_counter() - t0
                    tests, solution, timing = await self._in_sandbox(state, task, sandbox, traj_id, timing)
        except InfraError as exc:
            state.status, error = Status.infra_error, f"{type(exc).__name__}: {exc}"
        except TimeoutError:
            state.status, error = Status.infra_error, "sandbox lease/teardown exceeded its deadline"
        except Exception as exc:  # an env or engine bug: not the policy's fault, never scored as 0
            state.status = Status.infra_error
            error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
        timing.total_s = time.perf_counter() - t0
        end_session = getattr(self.rollout.engine, "end_session", None)
        if end_session is not None:  # engines with sticky routing forget this trajectory's worker
            end_session(traj_id)
        return self._record(task, state, traj_id, group_id, k, attempt, step, tests, solution, error, timing)

    async def _in_sandbox(self, state: TrajectoryState, task: Task, sandbox: Any, traj_id: str,
                          timing: Timing) -> tuple[Any, str | None, Timing]:
        env = self.rollout.env
        t = time.perf_counter()
        await env.setup(sandbox, task)
        timing.setup_s = time.perf_counter() - t
        try:
            async with asyncio.timeout(self.config.trajectory_timeout_s):
                await self.rollout.run(state, task, sandbox, session_id=traj_id)
        except TimeoutError:
            state.status = Status.timeout  # the policy ran out of wall time: scored on what it left behind
        timing.generation_s, timing.tools_s = state.gen_s, state.tools_s
        t = time.perf_counter()
        async with asyncio.timeout(self.config.finalize_timeout_s):
            tests = await env.finalize(sandbox, task)
            solution = await env.solution(sandbox, task)
        timing.finalize_s = time.perf_counter() - t
        return tests, solution, timing

    def _record(self, task: Task, state: TrajectoryState, traj_id: str, group_id: str, k: int, attempt: int,
                step: int | None, tests: Any, solution: str | None, error: str | None, timing: Timing) -> Trajectory:
        infra = state.status is Status.infra_error
        return score(Trajectory(
            id=traj_id, group_id=group_id, task_id=task.id, env=self.rollout.env.name, status=state.status,
            sample_index=k, attempt=attempt, step=step, prompt_ids=state.prompt_ids,
            completion_ids=state.completion_ids, logprobs=state.logprobs, env_mask=state.env_mask,
            turns=state.turns, tests=None if infra else tests,
            error=error, solution=solution, drift_count=sum(t.prefix_drift for t in state.turns), timing=timing,
            meta={**self.meta, "group_size": self.config.group_size},
        ))

    def _account(self, traj: Trajectory) -> None:
        p = self.progress
        p.trajectories_done += 1
        p.turns += len(traj.turns)
        p.tool_calls += traj.num_tool_calls
        p.tokens += traj.num_model_tokens
        p.infra_errors += traj.status is Status.infra_error
        if self._on_trajectory is not None:
            self._on_trajectory(traj)
