"""How late the runner's event loop wakes: the one number that says whether the runner keeps up.

Every trajectory's turns, tool results and sandbox I/O are callbacks on one asyncio loop. When the loop is busy
(thousands of trajectories in flight, a slow synchronous call, a long collector pause), every ready event waits,
and generation and tools sit idle for it. `LoopLag` measures that directly: a tick sleeps `period_s` and records how
much later than asked it woke (0 when the loop is free). Cheap: 20 wake-ups a second at the default period.

`take()` returns the window since the previous take() (training writes it per step to metrics.jsonl as
`time_loop_lag_p99_s` / `time_loop_lag_max_s`); `summary()` covers the run since start (the rollout summary; the
last KEEP_TICKS ticks).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from typing import Any

DEFAULT_PERIOD_S = 0.05
KEEP_TICKS = 200_000  # summary(): the last ~2.8 hours at the default period


def _pct(sorted_xs: list[float], q: float) -> float:
    return sorted_xs[min(len(sorted_xs) - 1, math.ceil(q * len(sorted_xs)) - 1)] if sorted_xs else 0.0


class LoopLag:
    """A lag probe on the running loop. `await start()` on the loop it measures, `await stop()` on the same loop."""

    def __init__(self, period_s: float = DEFAULT_PERIOD_S) -> None:
        if period_s <= 0:
            raise ValueError(f"loop lag period must be > 0 s, got {period_s}")
        self.period_s = period_s
        self._window: list[float] = []  # appended on the loop's thread; swapped out by take() from any thread
        self._all: deque[float] = deque(maxlen=KEEP_TICKS)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> LoopLag:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._tick(), name="agentrl-loop-lag")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(self.period_s)
            late = max(0.0, loop.time() - t - self.period_s)
            self._window.append(late)
            self._all.append(late)

    def take(self) -> dict[str, float | None]:
        """p99 and max lag (seconds) of the ticks since the previous take(); None when there was none."""
        window, self._window = self._window, []  # one swap: ticks that land meanwhile go to the next window
        xs = sorted(window)
        if not xs:
            return {"time_loop_lag_p99_s": None, "time_loop_lag_max_s": None}
        return {"time_loop_lag_p99_s": round(_pct(xs, 0.99), 4), "time_loop_lag_max_s": round(xs[-1], 4)}

    def summary(self) -> dict[str, Any]:
        """The run so far (the last KEEP_TICKS ticks), in milliseconds."""
        xs = sorted(self._all)
        return {"ticks": len(xs), "p50_ms": round(_pct(xs, 0.5) * 1e3, 2), "p99_ms": round(_pct(xs, 0.99) * 1e3, 2),
                "max_ms": round((xs[-1] if xs else 0.0) * 1e3, 2)}
