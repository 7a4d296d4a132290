"""The rollout pipeline over the real scheduler, runner, renderer and store, with the simulated engine and sandbox
pool (agentrl.testing.simulated): admission bound, staleness drop, over-sampling cut, exact weight versions, the
synchronous mode against the pre-pipeline fan-out, resume slots, and simulated sandbox deaths retried as infra."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrl.runner import Budgets, Rollout, Scheduler, SchedulerConfig
from agentrl.testing.simulated import SimulatedEngine, SimulatedEnv, SimulatedPool, number_replies
from agentrl.tools.render import ChatRenderer
from agentrl.trainer.pipeline import PipelineConfig, RolloutPipeline, TaskStream, consumed_slots
from agentrl.errors import UnscoredLimitError
from agentrl.types import SamplingParams, Status, Trajectory


class GatedEnv(SimulatedEnv):
    """Tasks listed in `slow` wait for `release` before their tool call returns."""

    def __init__(self, *, slow: set[str] | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.slow = slow or set()
        self.release = asyncio.Event()

    async def call_tool(self, sandbox: Any, call: Any, *, task: Any) -> Any:
        if task.id in self.slow:
            await self.release.wait()
        return await super().call_tool(sandbox, call, task=task)


def parts(tok: Any, *, env: SimulatedEnv | None = None, group_size: int = 2, max_trajectories: int = 64,
          death_p: float = 0.0, retries: int = 2) -> tuple[Scheduler, SimulatedEngine, SimulatedPool]:
    env = env or SimulatedEnv(tasks=8)
    engine = SimulatedEngine(tok, number_replies(), decode_s=0.0001)
    pool = SimulatedPool(exec_p50_s=0.001, death_p=death_p)
    rollout = Rollout(env=env, engine=engine, renderer=ChatRenderer(tok, env.tools),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=32, seed=3),
                      budgets=Budgets(max_turns=3, max_completion_tokens=400, context_window=2048))
    cfg = SchedulerConfig(group_size=group_size, max_trajectories=max_trajectories, infra_retries=retries,
                          max_unscored_frac=1.0)
    return Scheduler(rollout, pool, cfg), engine, pool


class DyingEnv(GatedEnv):
    """Tasks in `dies` lose their sandbox at their first tool call (infra_error); the others are gated."""

    def __init__(self, *, dies: set[str], **kw: Any) -> None:
        super().__init__(**kw)
        self.dies = dies

    async def call_tool(self, sandbox: Any, call: Any, *, task: Any) -> Any:
        if task.id in self.dies:
            sandbox.dead = True  # removed from outside: the exec below is refused
        return await super().call_tool(sandbox, call, task=task)


def stream_of(ids: list[str]) -> TaskStream:
    return TaskStream(lambda epoch: list(ids))


def test_admission_bound_never_exceeded_and_versions_exact(smollm2_tokenizer: Any) -> None:
    sched, engine, pool = parts(smollm2_tokenizer, max_trajectories=5)
    tasks = {t.id: t for t in sched.rollout.env.tasks()}
    cfg = PipelineConfig(batch_groups=2, max_staleness=1, oversample=1.5)
    pipe = RolloutPipeline(sched, tasks, cfg, stream=stream_of(list(tasks)))
    peak_running = 0
    orig_busy = sched._busy

    def busy(delta: int) -> None:
        nonlocal peak_running
        orig_busy(delta)
        peak_running = max(peak_running, sched.running)

    sched._busy = busy  # type: ignore[method-assign]

    async def main() -> list[list[Trajectory]]:
        out = []
        for step in range(5):
            await engine.update_weights(None, step)  # the trainer's sync before each step
            out.append([t for g in await pipe.batch(step, []) for t in g])
            assert pipe._consumed + pipe.live <= cfg.limit(step) == (step + 2) * 2 + 1
            await asyncio.sleep(0.01)  # "training"
        await pipe.close()
        return out

    steps = asyncio.run(main())
    assert peak_running <= 5  # max_trajectories is the scheduler's, respected by the pipeline's fan-out
    assert all(len(s) == 4 for s in steps)
    stale = []
    for step, trajs in enumerate(steps):
        for t in trajs:
            assert t.train_step == t.step == step and t.dispatch_version is not None
            assert step - t.dispatch_version <= 1
            versions = [turn.weight_version for turn in t.turns]
            assert versions == sorted(versions) and t.dispatch_version <= versions[0] and versions[-1] <= step
            stale.append(step - t.dispatch_version)
    assert 1 in stale  # groups generated ahead of training were trained one step later
    assert pool.alive == 0  # every lease returned, including cancelled groups'
    slots = [t.meta["slot"] for s in steps for t in s]
    assert len(set(slots)) * 2 == len(slots)  # each slot trained once (2 samples per group)


def test_stale_group_is_dropped_and_counted(smollm2_tokenizer: Any) -> None:
    sched, _, pool = parts(smollm2_tokenizer)
    tasks = {t.id: t for t in sched.rollout.env.tasks()}
    pipe = RolloutPipeline(sched, tasks, PipelineConfig(batch_groups=1, max_staleness=0, oversample=2.0),
                           stream=stream_of(list(tasks)))

    async def main() -> tuple[list[Trajectory], list[Trajectory]]:
        pipe.admit(0)  # two groups with weights v0 ...
        while not all(g.handle.done() for g in pipe._live):  # ... both finish before step 0 asks
            await asyncio.sleep(0.005)
        first = [t for g in await pipe.batch(0, []) for t in g]
        second = [t for g in await pipe.batch(1, []) for t in g]
        await pipe.close()
        return first, second

    first, second = asyncio.run(main())
    assert pipe.counters[1].groups_dropped_stale == 1  # the unchosen v0 group cannot train at step 1 with k=0
    assert pipe.counters[1].groups_reissued == 1  # ... so its slot runs again with weights v1
    assert {t.dispatch_version for t in second} == {1}
    assert {first[0].meta["slot"], second[0].meta["slot"]} == {0, 1}  # the re-issued slot is the oldest one
    assert sched.guard.total == 0 or sched.progress.infra_errors == 0


def test_oversampling_cuts_stragglers_and_releases_their_sandboxes(smollm2_tokenizer: Any) -> None:
    env = GatedEnv(tasks=8, slow={"sim-0000"})
    sched, _, pool = parts(smollm2_tokenizer, env=env)
    tasks = {t.id: t for t in env.tasks()}
    pipe = RolloutPipeline(sched, tasks, PipelineConfig(batch_groups=2, max_staleness=0, oversample=1.5),
                           stream=stream_of(list(tasks)))

    async def main() -> list[Trajectory]:
        got = [t for g in await pipe.batch(0, []) for t in g]
        await asyncio.sleep(0)
        return got

    got = asyncio.run(main())
    c = pipe.counters[0]
    assert c.groups_started == 3 and c.groups_cancelled == 1 and c.groups_carried == 0
    assert {t.task_id for t in got} == {"sim-0001", "sim-0002"}  # the first complete ones
    assert pool.alive == 0  # the straggler's sandboxes were released
    assert sched.progress.infra_errors == 0  # a cancelled group is never a record, never an infra error


def test_oversampled_stragglers_are_carried_within_the_staleness_bound(smollm2_tokenizer: Any) -> None:
    env = GatedEnv(tasks=8, slow={"sim-0000"})
    sched, _, _ = parts(smollm2_tokenizer, env=env)
    tasks = {t.id: t for t in env.tasks()}
    pipe = RolloutPipeline(sched, tasks, PipelineConfig(batch_groups=2, max_staleness=1, oversample=1.5),
                           stream=stream_of(list(tasks)))

    async def main() -> list[Trajectory]:
        await pipe.batch(0, [])
        env.release.set()
        await asyncio.sleep(0.2)
        got = [t for g in await pipe.batch(1, []) for t in g]
        await pipe.close()
        return got

    got = asyncio.run(main())
    assert pipe.counters[0].groups_carried >= 1 and pipe.counters[0].groups_cancelled == 0
    assert "sim-0000" in {t.task_id for t in got}  # the straggler trained one step later
    assert {t.train_step - t.dispatch_version for t in got if t.task_id == "sim-0000"} == {1}


def test_synchronous_mode_equals_the_pre_pipeline_fan_out(smollm2_tokenizer: Any) -> None:
    """k=0, oversample 1: the same trajectories (tokens, logprobs, masks, turns, rewards, order) as the trainer's
    former fan-out (one `run_one` per prompt, gathered in prompt order) on a deterministic engine."""
    order = ["sim-0003", "sim-0001", "sim-0003", "sim-0005"]

    async def old_path() -> list[Trajectory]:
        sched, _, _ = parts(smollm2_tokenizer)
        tasks = {t.id: t for t in sched.rollout.env.tasks()}
        jobs = [sched.run_one(tasks[tid], group_id=f"s0-{i}", sample_index=k, step=0)
                for i, tid in enumerate(order) for k in range(2)]
        return list(await asyncio.gather(*jobs))

    async def new_path() -> list[Trajectory]:
        sched, _, _ = parts(smollm2_tokenizer)
        tasks = {t.id: t for t in sched.rollout.env.tasks()}
        pipe = RolloutPipeline(sched, tasks, PipelineConfig(batch_groups=4, max_staleness=0))
        return [t for g in await pipe.batch(0, order) for t in g]

    def comparable(t: Trajectory) -> dict[str, Any]:
        d = t.model_dump(exclude={"id", "group_id", "timing", "dispatch_version", "train_step"})
        for turn in d["turns"]:
            turn.pop("gen_duration_s", None)
            turn.pop("tool_duration_s", None)
            for r in turn["tool_results"]:
                r.pop("duration_s", None)
        return d

    old, new = asyncio.run(old_path()), asyncio.run(new_path())
    assert [comparable(t) for t in old] == [comparable(t) for t in new]
    assert [t.group_id for t in new][::2] == [t.group_id for t in new][1::2]  # groups stay consecutive
    assert {(t.dispatch_version, t.train_step) for t in new} == {(0, 0)}


def test_a_long_task_cut_as_a_straggler_is_reissued_and_trained(smollm2_tokenizer: Any) -> None:
    """The old pipeline cancelled a straggler and never ran its slot again, so a slow task lost its share of
    training; now the cut slot runs again with newer weights and is trained once it can finish."""
    env = GatedEnv(tasks=16, slow={"sim-0000"})
    sched, engine, pool = parts(smollm2_tokenizer, env=env)
    tasks = {t.id: t for t in env.tasks()}
    pipe = RolloutPipeline(sched, tasks, PipelineConfig(batch_groups=2, max_staleness=1),
                           stream=stream_of(list(tasks)))

    async def main() -> list[list[Trajectory]]:
        steps = []
        for step in range(6):
            await engine.update_weights(None, step)
            steps.append([t for g in await pipe.batch(step, []) for t in g])
            if step == 1:  # sim-0000 (slot 0, weights v0) was too slow for two steps: cut at the end of step 1
                env.release.set()  # ... and fast from now on
            await asyncio.sleep(0.2)  # "training"
        await pipe.close()
        return steps

    steps = asyncio.run(main())
    trained = [(t.meta["slot"], t.task_id, t.dispatch_version, t.train_step) for s in steps for t in s]
    assert sum(c.groups_cancelled for c in pipe.counters.values()) >= 1
    assert sum(c.groups_reissued for c in pipe.counters.values()) >= 1
    zero = {(slot, v, step) for slot, task_id, v, step in trained if task_id == "sim-0000"}
    assert len(zero) == 1, trained  # trained once (its two samples), in its own slot, with re-issued weights
    slot, version, step = zero.pop()
    assert slot == 0 and version >= 2 and step - version <= 1
    slots = [s for s, *_ in trained]
    assert len(slots) == 2 * len(set(slots))  # no slot trained twice
    assert pool.alive == 0


def test_synchronous_error_awaits_the_groups_it_cancels(smollm2_tokenizer: Any) -> None:
    """When one group fails (here: too many unscored trajectories), the others are cancelled and awaited before the
    error reaches the trainer: their sandboxes are back in the pool. The old pipeline only cancelled them."""
    env = DyingEnv(tasks=8, dies={"sim-0001"}, slow={"sim-0000", "sim-0002"})
    engine = SimulatedEngine(smollm2_tokenizer, number_replies(), decode_s=0.0001)
    pool = SimulatedPool(exec_p50_s=0.001)
    rollout = Rollout(env=env, engine=engine, renderer=ChatRenderer(smollm2_tokenizer, env.tools),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=32, seed=3),
                      budgets=Budgets(max_turns=3, max_completion_tokens=400, context_window=2048))
    sched = Scheduler(rollout, pool, SchedulerConfig(group_size=2, infra_retries=0, max_unscored_frac=0.0,
                                                     unscored_min_trajectories=1))
    pipe = RolloutPipeline(sched, {t.id: t for t in env.tasks()}, PipelineConfig(batch_groups=3, max_staleness=0))

    async def main() -> int:
        with pytest.raises(UnscoredLimitError):
            await pipe.batch(0, ["sim-0000", "sim-0001", "sim-0002"])
        return pool.alive  # right away, before anything else runs on the loop

    assert asyncio.run(main()) == 0


def test_resumed_stream_skips_consumed_slots_and_regenerates_the_rest() -> None:
    ids = [f"t{i}" for i in range(5)]
    done = [Trajectory(id=f"x{s}", group_id="g", task_id=ids[s % 5], env="e", status=Status.ok, prompt_ids=[1],
                       meta={"slot": s}) for s in (0, 1, 3)]
    stream = TaskStream(lambda epoch: ids, skip=consumed_slots(done))
    got = [stream.next() for _ in range(4)]
    assert got == [(2, "t2"), (4, "t4"), (5, "t0"), (6, "t1")]  # slot 2 (in flight at the crash) is redone


def test_simulated_sandbox_deaths_become_infra_errors_that_are_retried(smollm2_tokenizer: Any) -> None:
    sched, _, pool = parts(smollm2_tokenizer, death_p=0.15, retries=5)
    env = sched.rollout.env

    async def main() -> list[Trajectory]:
        return [t for g in await asyncio.gather(*(sched.submit(task) for task in env.tasks())) for t in g]

    trajs = asyncio.run(main())
    assert pool.deaths > 0
    assert any(t.attempt > 0 for t in trajs)  # a death was retried ...
    assert sched.progress.infra_errors <= sum(t.status is Status.infra_error for t in trajs)
    assert all(t.status is not Status.policy_error for t in trajs)  # ... never charged to the policy
    assert pool.alive == 0


@pytest.mark.parametrize("oversample", [1.0, 1.25, 2.0])
def test_limit_arithmetic(oversample: float) -> None:
    cfg = PipelineConfig(batch_groups=4, max_staleness=2, oversample=oversample, last_step=3)
    extra = {1.0: 0, 1.25: 1, 2.0: 4}[oversample]
    assert cfg.limit(0) == 3 * 4 + extra
    assert cfg.limit(3) == cfg.limit(5) == 4 * 4 + extra  # nothing admitted for steps after the last
