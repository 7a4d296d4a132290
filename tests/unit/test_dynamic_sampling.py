"""Dynamic sampling (agentrl/trainer/dynamic_sampling.py): zero-std groups are replaced by refill groups generated
through the scheduler, up to the cap; the batch always has B groups; counters say what happened. A fake scheduler
returns groups with fixed rewards per task (no model, no sandbox). The config rule and the metrics row too."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrl.envs import Task
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.dynamic_sampling import DynamicSampler, informative
from agentrl.trainer.metrics import step_metrics
from agentrl.types import Status, Trajectory

G = 4


def _group(task_id: str, rewards: list[float | None], gid: str = "g") -> list[Trajectory]:
    return [Trajectory(id=f"{gid}-{i}", group_id=gid, task_id=task_id, env="toy", prompt_ids=[1], reward=r,
                       status=Status.infra_error if r is None else Status.ok, sample_index=i)
            for i, r in enumerate(rewards)]


class FakeIds:
    def group_id(self, task_id: str, step: int | None, replica: int = 0) -> str:
        return f"{task_id}-s{step}-r{replica}"


class FakeScheduler:
    """submit() -> a task resolving to the group of fixed rewards for that task."""

    def __init__(self, rewards: dict[str, list[float | None]]) -> None:
        self.rewards, self.ids, self.submitted = rewards, FakeIds(), []

    def submit(self, task: Task, *, group_id: str, step: int) -> asyncio.Task[list[Trajectory]]:
        self.submitted.append((task.id, group_id, step))

        async def run() -> list[Trajectory]:
            return _group(task.id, self.rewards[task.id], group_id)

        return asyncio.ensure_future(run())


REWARDS: dict[str, list[float | None]] = {
    "flat0": [0.0] * G, "flat1": [1.0] * G, "mixA": [0.0, 1.0, 0.0, 0.0], "mixB": [1.0, 0.0, 1.0, 1.0],
    "mixC": [0.0, 0.0, 0.0, 1.0], "flat2": [0.0] * G, "oneScored": [1.0, None, None, None],
}


def _sampler(cap: int, batch: int = 3) -> tuple[DynamicSampler, FakeScheduler]:
    sched = FakeScheduler(REWARDS)
    tasks = {t: Task(id=t, prompt=t) for t in REWARDS}
    return DynamicSampler(sched, tasks, batch_groups=batch, max_extra_groups=cap, seed=0), sched  # type: ignore[arg-type]


def test_informative_needs_two_different_scored_rewards() -> None:
    assert informative(_group("mixA", REWARDS["mixA"]))
    assert not informative(_group("flat0", REWARDS["flat0"])) and not informative(_group("flat1", REWARDS["flat1"]))
    assert not informative(_group("x", [1.0, None, None, 0.0][:1] + [None] * 3))
    assert informative(_group("x", [1.0, None, 0.0, None]))


def test_zero_std_groups_are_replaced_by_informative_refills() -> None:
    sampler, sched = _sampler(cap=6)
    first = [_group("flat0", REWARDS["flat0"]), _group("mixA", REWARDS["mixA"]), _group("flat1", REWARDS["flat1"])]
    batch, counts = asyncio.run(sampler.fill(5, first))
    assert len(batch) == 3 and all(informative(g) for g in batch)
    assert batch[0][0].task_id == "mixA"  # the informative first groups come first, in order
    assert all(t.dispatch_version == 5 and t.train_step == 5 for g in batch[1:] for t in g)
    refilled = [tid for tid, _, _ in sched.submitted]
    assert all(step == 5 for _, _, step in sched.submitted)
    assert len({gid for _, gid, _ in sched.submitted}) == len(sched.submitted)  # distinct group ids (seeds)
    assert counts["groups_extra"] == len(refilled) <= 6
    assert counts["groups_dropped_zero_std"] == 2 + sum(not informative(_group(t, REWARDS[t])) for t in refilled)
    assert counts["groups_zero_std_kept"] == 0
    # the refill order is seeded: the same for the same (seed, step), the step's own tasks last
    assert sampler.refill_order(5, {"mixA"}) == sampler.refill_order(5, {"mixA"})
    assert sampler.refill_order(5, {"mixA"})[-1] == "mixA"


def test_cap_reached_keeps_the_batch_size_with_zero_std_groups() -> None:
    sampler, sched = _sampler(cap=1)
    sampler.refill_order = lambda step, exclude: ["flat2", "mixB"]  # type: ignore[method-assign]
    first = [_group("flat0", REWARDS["flat0"]), _group("mixA", REWARDS["mixA"]), _group("flat1", REWARDS["flat1"])]
    batch, counts = asyncio.run(sampler.fill(0, first))
    assert [g[0].task_id for g in batch] == ["mixA", "flat0", "flat1"]  # cap 1: flat2 was the refill, not enough
    assert counts == {"groups_dropped_zero_std": 1, "groups_extra": 1, "groups_zero_std_kept": 2}
    assert [tid for tid, _, _ in sched.submitted] == ["flat2"]


def test_all_informative_generates_nothing_extra() -> None:
    sampler, sched = _sampler(cap=4, batch=2)
    first = [_group("mixA", REWARDS["mixA"]), _group("mixB", REWARDS["mixB"])]
    batch, counts = asyncio.run(sampler.fill(0, first))
    assert batch == first and sched.submitted == []
    assert counts == {"groups_dropped_zero_std": 0, "groups_extra": 0, "groups_zero_std_kept": 0}


BASE: dict[str, Any] = {"env": "tool_calc", "reward": [{"calc_answer": 1.0}]}


def test_config_dynamic_sampling_is_synchronous_only_and_capped() -> None:
    with pytest.raises(ValueError, match="dynamic_sampling.enabled needs pipeline.max_staleness: 0"):
        TrainConfig.model_validate({**BASE, "dynamic_sampling": {"enabled": True}})
    cfg = TrainConfig.model_validate({**BASE, "batch_size": 3, "pipeline": {"max_staleness": 0},
                                      "dynamic_sampling": {"enabled": True}})
    assert cfg.max_extra_groups == 3
    cfg = TrainConfig.model_validate({**BASE, "pipeline": {"max_staleness": 0},
                                      "dynamic_sampling": {"enabled": True, "max_extra_groups": 7}})
    assert cfg.max_extra_groups == 7
    assert TrainConfig.model_validate(BASE).max_extra_groups == 0


def test_metrics_row_carries_the_counters() -> None:
    row = step_metrics(0, _group("mixA", REWARDS["mixA"]), {}, rollout_s=1.0, train_s=1.0, sync_s=0.0,
                       pipeline={"groups_dropped_zero_std": 3, "groups_extra": 4, "groups_zero_std_kept": 1})
    assert (row["groups_dropped_zero_std"], row["groups_extra"], row["groups_zero_std_kept"]) == (3, 4, 1)
