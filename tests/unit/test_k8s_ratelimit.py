"""The Kubernetes client's rate limit (sandbox/kubernetes/ratelimit.py): fair order, an urgent lane for the calls a
trajectory waits on, cancelled waiters that cost nothing, and never more than rate x time + burst grants. Orders
and counts are asserted; the one time bound is a lower bound (the limiter must not over-grant)."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentrl.errors import ConfigError
from agentrl.sandbox.kubernetes.ratelimit import RequestGate


async def _queue(bucket: RequestGate, names: list[str], order: list[str], urgent: bool = False) -> list[asyncio.Task]:
    async def one(name: str) -> None:
        async with bucket.slot(urgent):
            order.append(name)

    tasks = []
    for name in names:
        tasks.append(asyncio.create_task(one(name)))
        await asyncio.sleep(0)  # each joins the queue before the next
    return tasks


async def test_waiters_are_served_in_the_order_they_came() -> None:
    bucket = RequestGate(200.0, 1)
    order: list[str] = []
    names = [f"w{i}" for i in range(12)]
    await asyncio.gather(*await _queue(bucket, names, order))
    assert order == names


async def test_an_urgent_call_goes_ahead_of_queued_housekeeping() -> None:
    bucket = RequestGate(100.0, 1)
    order: list[str] = []
    later = await _queue(bucket, [f"refill{i}" for i in range(20)], order)
    assert bucket.waiting() >= 19
    urgent = await _queue(bucket, ["claim"], order, urgent=True)
    await asyncio.gather(*later, *urgent)
    assert order.index("claim") <= 1, f"the claim waited behind {order.index('claim')} queued refills: {order}"
    assert [n for n in order if n != "claim"] == [f"refill{i}" for i in range(20)]


async def test_a_cancelled_waiter_takes_no_token_and_blocks_no_one() -> None:
    bucket = RequestGate(100.0, 1)
    order: list[str] = []
    tasks = await _queue(bucket, ["a", "b", "c", "d"], order)
    tasks[1].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert order == ["a", "c", "d"] and bucket.waiting() == 0


async def test_grants_never_exceed_the_rate_and_the_burst() -> None:
    bucket = RequestGate(100.0, 3)
    t = time.monotonic()
    async def one(urgent: bool) -> None:
        async with bucket.slot(urgent):
            pass

    await asyncio.gather(*(one(i % 3 == 0) for i in range(13)))
    # 3 from the burst, then 10 at 100/s: no sooner than 0.1 s
    assert time.monotonic() - t >= 0.1 * 0.95


def test_a_bad_budget_names_the_fields() -> None:
    with pytest.raises(ConfigError, match="qps=0"):
        RequestGate(0, 1)


async def test_an_urgent_call_takes_the_next_free_slot_ahead_of_queued_calls() -> None:
    """The rate has tokens to spare; the edge's threads are the limit (a slow API server): 2 slots, both held, 10
    housekeeping calls queued. The urgent call gets the first slot that frees."""
    gate = RequestGate(10_000.0, 1_000, concurrency=2)
    order: list[str] = []
    release = asyncio.Event()

    async def call(name: str, urgent: bool = False) -> None:
        async with gate.slot(urgent):
            order.append(name)
            await release.wait()

    tasks = []
    for i in range(12):
        tasks.append(asyncio.create_task(call(f"h{i}")))
        await asyncio.sleep(0)
    tasks.append(asyncio.create_task(call("claim", urgent=True)))
    await asyncio.sleep(0.01)
    assert order == ["h0", "h1"] and gate.running == 2 and gate.waiting() == 11
    release.set()
    await asyncio.gather(*tasks)
    assert order[2] == "claim", order
    assert gate.running == 0 and gate.waiting() == 0


async def test_a_slot_is_given_back_when_its_call_fails_or_is_cancelled() -> None:
    gate = RequestGate(10_000.0, 1_000, concurrency=1)
    with pytest.raises(RuntimeError):
        async with gate.slot():
            raise RuntimeError("the API call failed")
    assert gate.running == 0
    hold = asyncio.Event()

    async def holder() -> None:
        async with gate.slot():
            await hold.wait()

    first = asyncio.create_task(holder())
    await asyncio.sleep(0)
    second = asyncio.create_task(holder())
    await asyncio.sleep(0)
    second.cancel()  # cancelled while it waits for the slot
    first.cancel()  # cancelled while it holds it
    await asyncio.gather(first, second, return_exceptions=True)
    assert gate.running == 0 and gate.waiting() == 0
    async with gate.slot():
        assert gate.running == 1
