"""StartGate: the cap on sandboxes starting at once, the creation rate, and leases going before refills."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentrl.errors import ConfigError
from agentrl.sandbox.gate import StartGate


async def test_never_more_than_max_starting_hold_a_slot() -> None:
    gate = StartGate(max_starting=2)
    peak = 0

    async def start() -> None:
        nonlocal peak
        async with gate.slot(priority=True):
            peak = max(peak, gate.starting)
            await asyncio.sleep(0.01)

    await asyncio.gather(*(start() for _ in range(7)))
    assert peak == 2 and gate.starting == 0


async def test_a_waiting_lease_goes_before_a_waiting_refill() -> None:
    gate = StartGate(max_starting=1)
    order: list[str] = []
    release = asyncio.Event()

    async def hold() -> None:
        async with gate.slot(priority=False):
            await release.wait()

    async def start(name: str, priority: bool) -> None:
        async with gate.slot(priority=priority):
            order.append(name)

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    refill = asyncio.create_task(start("refill", False))  # queued first
    await asyncio.sleep(0)
    lease = asyncio.create_task(start("lease", True))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(holder, refill, lease)
    assert order == ["lease", "refill"]


async def test_a_cancelled_waiter_leaves_no_trace() -> None:
    gate = StartGate(max_starting=1)
    release = asyncio.Event()

    async def hold() -> None:
        async with gate.slot(priority=True):
            await release.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    waiting_lease = asyncio.create_task(hold())
    await asyncio.sleep(0)
    waiting_lease.cancel()
    release.set()
    await holder
    with pytest.raises(asyncio.CancelledError):
        await waiting_lease
    async with asyncio.timeout(1):  # a refill is admitted: no phantom priority waiter, no leaked slot
        async with gate.slot(priority=False):
            assert gate.starting == 1
    assert gate.starting == 0


async def test_rate_limits_grants_per_second() -> None:
    gate = StartGate(rate=5.0)  # a bucket of 5, refilled at 5/s: 8 grants need at least 3/5 s
    t0 = time.monotonic()
    for _ in range(8):
        async with gate.slot(priority=True):
            pass
    assert time.monotonic() - t0 >= 0.5


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ConfigError, match="max_starting"):
        StartGate(max_starting=0)
    with pytest.raises(ConfigError, match="create_rate"):
        StartGate(rate=0)
