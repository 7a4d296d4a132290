"""agentrl.deadline.Deadline: a stall of the runner's own event loop past a deadline does not make work that
finished during the stall expire; work that never finishes still does."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from agentrl import deadline as deadline_mod
from agentrl.deadline import Deadline


def _answer_from_a_thread(fut: asyncio.Future[str], after_s: float) -> threading.Timer:
    loop = fut.get_loop()
    timer = threading.Timer(after_s, lambda: loop.call_soon_threadsafe(fut.set_result, "answer"))
    timer.start()
    return timer


async def _stalled_wait(cm: object, after_s: float) -> str:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[str] = loop.create_future()
    answer = _answer_from_a_thread(fut, after_s)
    loop.call_later(0.05, time.sleep, 1.0)  # the loop is blocked from 0.05 s to 1.05 s
    try:
        async with cm:  # type: ignore[attr-defined]
            return await fut
    finally:
        answer.cancel()


async def test_asyncio_timeout_expires_work_that_finished_during_a_stall() -> None:
    """The failure Deadline exists for: the answer came at 0.2 s, inside the 0.3 s budget, yet the late timer
    runs before the task that would take it."""
    with pytest.raises(TimeoutError):
        await _stalled_wait(asyncio.timeout(0.3), 0.2)


async def test_work_that_finished_during_a_stall_is_taken() -> None:
    cm = Deadline(0.3)
    assert await _stalled_wait(cm, 0.2) == "answer"
    assert not cm.expired() and cm.extended_s > deadline_mod.STALL_TOLERANCE_S


async def test_work_that_never_finishes_still_expires_after_a_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deadline_mod, "STALL_EXTRA_MAX_S", 0.2)
    cm = Deadline(0.3)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await _stalled_wait(cm, 30.0)
    assert cm.expired() and cm.extended_s == pytest.approx(0.2)
    assert time.monotonic() - t0 < 3.0


async def test_on_time_it_is_asyncio_timeout() -> None:
    cm = Deadline(0.1)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        async with cm:
            await asyncio.sleep(5)
    assert cm.expired() and cm.extended_s == 0.0 and time.monotonic() - t0 < 1.0
    async with Deadline(None) as free:
        await asyncio.sleep(0.01)
    assert not free.expired()


async def test_a_budget_already_spent_expires_at_once_and_is_not_taken_for_a_stall() -> None:
    cm = Deadline(-30.0)  # e.g. the grading's share of finalize_timeout_s, all used by collect()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        async with cm:
            await asyncio.sleep(5)
    assert cm.extended_s == 0.0 and time.monotonic() - t0 < 1.0
