"""The scheduler's lifecycle over the real runner, renderer and scorer with the simulated engine and sandbox pool:
a cancellation at any await point of a trajectory leaves no lease, pool slot or scheduler slot behind (the verdict of
a dead sandbox included), `run()` and `submit()` share one fan-out and one replica numbering, and `submit()` refuses
bad arguments with a clear error."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrl.runner import Budgets, Rollout, Scheduler, SchedulerConfig
from agentrl.testing.simulated import SimulatedEngine, SimulatedEnv, SimulatedPool, number_replies
from agentrl.tools.render import ChatRenderer
from agentrl.types import SamplingParams, Status

MAX_TRAJECTORIES = 3


class ProbedPool(SimulatedPool):
    """A SimulatedPool whose `death_cause` (asked while the verdict of a dead sandbox is decided) waits for
    `release`, so a test can cancel exactly there."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.asking = asyncio.Event()
        self.release = asyncio.Event()

    async def death_cause(self, sandbox: Any) -> str | None:
        self.asking.set()
        await self.release.wait()
        return await super().death_cause(sandbox)


def scheduler(tok: Any, pool: SimulatedPool, *, group_size: int = 1, seed: int | None = None,
              timed: bool = True, teardown_timeout_s: float = 60.0) -> Scheduler:
    """`timed=False`: the engine's prefill and decode take no wall time (each generate is one `sleep(0)`), so a
    trajectory's progress is counted in loop iterations alone, the same on a quiet machine as on a loaded one."""
    env = SimulatedEnv(tasks=4)
    engine = (SimulatedEngine(tok, number_replies(), decode_s=0.0001) if timed
              else SimulatedEngine(tok, number_replies(), decode_s=0.0, prefill_s=0.0))
    rollout = Rollout(env=env, engine=engine,
                      renderer=ChatRenderer(tok, env.tools),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=32, seed=3),
                      budgets=Budgets(max_turns=3, max_completion_tokens=400, context_window=2048))
    return Scheduler(rollout, pool, SchedulerConfig(group_size=group_size, max_trajectories=MAX_TRAJECTORIES,
                                                    infra_retries=0, max_unscored_frac=1.0, seed=seed,
                                                    teardown_timeout_s=teardown_timeout_s))


def left_behind(sched: Scheduler, pool: SimulatedPool) -> dict[str, int]:
    """What a finished or cancelled trajectory must not hold: sandbox leases, pool slots, scheduler slots."""
    free_pool = pool._slots._value if pool._slots is not None else pool.max_sandboxes
    return {"leases": pool.alive, "pool_slots": pool.max_sandboxes - free_pool,
            "scheduler_slots": MAX_TRAJECTORIES - sched.slots._value, "running": sched.running}


NOTHING = {"leases": 0, "pool_slots": 0, "scheduler_slots": 0, "running": 0}


def test_cancel_while_the_verdict_of_a_dead_sandbox_is_decided_returns_the_lease(smollm2_tokenizer: Any) -> None:
    """The old scheduler skipped the lease's __aexit__ when the cancellation landed in `_verdict` (asking the
    backend why the sandbox died): the lease and the pool's slot stayed taken until garbage collection."""
    pool = ProbedPool(exec_p50_s=0.001, death_p=1.0, max_sandboxes=2)
    sched = scheduler(smollm2_tokenizer, pool)
    task = sched.rollout.env.tasks()[0]

    async def main() -> dict[str, int]:
        async with pool:
            handle = sched.submit(task)
            await asyncio.wait_for(pool.asking.wait(), 10)  # the sandbox died; its verdict is being decided
            handle.cancel()
            await asyncio.gather(handle, return_exceptions=True)
            assert handle.cancelled()
            return left_behind(sched, pool)  # checked on the live loop, before any finalizer could run

    assert asyncio.run(main()) == NOTHING


@pytest.mark.parametrize("death_p", [0.0, 1.0])
def test_cancel_at_every_await_point_leaves_no_lease_or_slot(smollm2_tokenizer: Any, death_p: float) -> None:
    """Cancel one group after 0, 1, 2, ... loop iterations until the group finishes on its own: every await point
    of lease, setup, turns, verdict, finalize, scoring and teardown is hit by some cancellation."""

    async def cancelled_after(n: int) -> tuple[bool, dict[str, int]]:
        pool = SimulatedPool(exec_p50_s=0.0, death_p=death_p, max_sandboxes=2)
        sched = scheduler(smollm2_tokenizer, pool, group_size=2, timed=False)  # wall-clock sleeps would make the
        async with pool:                                                       # count of iterations depend on load
            handle = sched.submit(sched.rollout.env.tasks()[0])
            for _ in range(n):
                await asyncio.sleep(0)
            finished = handle.done()
            handle.cancel()
            await asyncio.gather(handle, return_exceptions=True)
            return finished, left_behind(sched, pool)

    async def sweep() -> int:
        for n in range(2000):
            finished, left = await cancelled_after(n)
            assert left == NOTHING, f"cancelled after {n} loop iterations: {left}"
            if finished:
                return n
        raise AssertionError("the group never finished")

    assert asyncio.run(sweep()) > 5  # the sweep crossed several await points before the group was done


def test_a_cancellation_during_teardown_waits_for_the_lease_to_be_returned(smollm2_tokenizer: Any) -> None:
    """A cancellation that lands while the lease is being returned does not abandon the return half-way."""

    class SlowReturn(SimulatedPool):
        returning = asyncio.Event()

        def lease(self) -> Any:
            inner = super().lease()
            outer = self

            class Lease:
                async def __aenter__(self) -> Any:
                    return await inner.__aenter__()

                async def __aexit__(self, *exc: Any) -> Any:
                    outer.returning.set()
                    await asyncio.sleep(0.05)  # e.g. the backend deleting the container
                    return await inner.__aexit__(*exc)

            return Lease()

    pool = SlowReturn(exec_p50_s=0.001, max_sandboxes=2)
    sched = scheduler(smollm2_tokenizer, pool)

    async def main() -> dict[str, int]:
        SlowReturn.returning = asyncio.Event()
        async with pool:
            handle = sched.submit(sched.rollout.env.tasks()[0])
            await asyncio.wait_for(SlowReturn.returning.wait(), 10)
            handle.cancel()
            await asyncio.gather(handle, return_exceptions=True)
            assert handle.cancelled()  # the cancellation still wins ...
            return left_behind(sched, pool)  # ... once the lease is back

    assert asyncio.run(main()) == NOTHING


class TroubledReturn(SimulatedPool):
    """Returning a lease first returns it to the simulated pool, then runs past teardown_timeout_s ("slow": a pod's
    DELETE queued behind thousands of calls on a loaded API server) or fails ("fails": the API server refused)."""

    def __init__(self, trouble: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.trouble = trouble

    def lease(self) -> Any:
        inner, trouble = super().lease(), self.trouble

        class Lease:
            async def __aenter__(self) -> Any:
                return await inner.__aenter__()

            async def __aexit__(self, *exc: Any) -> Any:
                await inner.__aexit__(*exc)
                if trouble == "slow":
                    await asyncio.sleep(5)
                raise RuntimeError("the API server refused the delete")

        return Lease()


@pytest.mark.parametrize("trouble", ["slow", "fails"])
def test_a_lease_return_that_fails_or_runs_late_never_changes_the_verdict(smollm2_tokenizer: Any,
                                                                          trouble: str) -> None:
    """The episode is over when its lease is returned: the backend's deleting speed is not the policy's doing. The
    old teardown re-raised the return's own error (TimeoutError past teardown_timeout_s, or the delete's), which
    turned the trajectory into policy_error finalize_failed: 1,405 of 2,000 in a scale run whose DELETEs queued for
    ~90 s."""
    pool = TroubledReturn(trouble, exec_p50_s=0.001, max_sandboxes=2)
    sched = scheduler(smollm2_tokenizer, pool, teardown_timeout_s=0.2)

    async def main() -> tuple[Any, dict[str, int]]:
        async with pool:
            group = await sched.submit(sched.rollout.env.tasks()[0])
            return group[0], left_behind(sched, pool)

    traj, left = asyncio.run(main())
    assert traj.status is Status.max_turns and traj.error_kind is None, (traj.status, traj.error_kind, traj.error)
    assert traj.reward is not None and left == NOTHING


def test_run_and_submit_share_one_fan_out_and_one_replica_numbering(smollm2_tokenizer: Any) -> None:
    """Two `run()` calls over the same task and step used to restart replica numbering, so a scheduler gave two
    groups the same id (and, seeded, the same sampling seeds); `submit()` kept its own counter."""
    pool = SimulatedPool(exec_p50_s=0.0)
    sched = scheduler(smollm2_tokenizer, pool, group_size=2, seed=7)
    task = sched.rollout.env.tasks()[1]

    async def main() -> list[str]:
        ids = []
        async with pool:
            for _ in range(2):
                async for group in sched.run([task], step=0):
                    ids.append(group[0].group_id)
            ids.append((await sched.submit(task, step=0))[0].group_id)
        return ids

    ids = asyncio.run(main())
    assert len(set(ids)) == 3  # replicas 0, 1, 2 of (task, step 0)
    assert ids == [sched.ids.group_id(task.id, 0, replica=r) for r in range(3)]
    assert sched.running == 0 and sched.idle_seconds() > 0  # run() is accounted like submit()
    assert sched.progress.trajectories_done == sched.progress.trajectories_total == 6


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"group_id": ""}, "group_id=''"),
    ({"group_id": "  "}, "group_id='  '"),
    ({"step": -1}, "step=-1"),
    ({"step": "3"}, "step='3'"),
])
def test_submit_refuses_bad_arguments_clearly(smollm2_tokenizer: Any, kwargs: dict[str, Any], message: str) -> None:
    sched = scheduler(smollm2_tokenizer, SimulatedPool())
    task = sched.rollout.env.tasks()[0]

    async def main() -> None:
        sched.submit(task, **kwargs)

    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        asyncio.run(main())
    assert sched.progress.trajectories_total == 0  # nothing was started


def test_submit_refuses_a_task_id_in_place_of_a_task(smollm2_tokenizer: Any) -> None:
    sched = scheduler(smollm2_tokenizer, SimulatedPool())
    with pytest.raises(TypeError, match="agentrl Task, got str"):
        sched.submit("sim-0000")  # type: ignore[arg-type]


def test_a_group_that_dies_everywhere_is_a_record_not_a_leak(smollm2_tokenizer: Any) -> None:
    pool = SimulatedPool(exec_p50_s=0.0, death_p=1.0)
    sched = scheduler(smollm2_tokenizer, pool, group_size=2)

    async def main() -> list[Any]:
        async with pool:
            return [t for g in await asyncio.gather(*(sched.submit(t) for t in sched.rollout.env.tasks())) for t in g]

    trajs = asyncio.run(main())
    assert len(trajs) == 8 and all(t.status is Status.infra_error for t in trajs)
    assert left_behind(sched, pool) == NOTHING
