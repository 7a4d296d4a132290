"""LoopLag: how late the runner's event loop wakes, per window (metrics.jsonl) and for the run (rollout summary)."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentrl.runner import LoopLag


async def test_a_blocked_loop_shows_as_lag_in_its_window_only() -> None:
    lag = await LoopLag(period_s=0.02).start()
    await asyncio.sleep(0.15)
    free = lag.take()
    time.sleep(0.3)  # a synchronous call on the loop: every tick due meanwhile waits for it
    await asyncio.sleep(0.1)
    blocked = lag.take()
    await asyncio.sleep(0.15)
    after = lag.take()
    await lag.stop()
    assert blocked["time_loop_lag_max_s"] is not None and blocked["time_loop_lag_max_s"] >= 0.25
    assert free["time_loop_lag_max_s"] is not None and free["time_loop_lag_max_s"] < blocked["time_loop_lag_max_s"]
    assert after["time_loop_lag_max_s"] is not None and after["time_loop_lag_max_s"] < blocked["time_loop_lag_max_s"]
    run = lag.summary()
    assert run["ticks"] >= 10 and run["max_ms"] >= 250 and run["p50_ms"] <= run["p99_ms"] <= run["max_ms"]


async def test_no_ticks_is_none_and_stop_is_idempotent() -> None:
    lag = LoopLag(period_s=10.0)
    assert lag.take() == {"time_loop_lag_p99_s": None, "time_loop_lag_max_s": None}
    await lag.start()
    await lag.stop()
    await lag.stop()
    assert lag.summary() == {"ticks": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    with pytest.raises(ValueError, match="period"):
        LoopLag(period_s=0)
