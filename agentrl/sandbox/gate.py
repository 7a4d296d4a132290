"""StartGate: admission control for sandbox creation (used by `pool.py`).

Owns: how many sandboxes may be starting at once (`max_starting`), how many creations may begin per second
(`rate`, an aiolimiter token bucket), and the order between the two kinds of callers: a lease that has to start a
sandbox itself (priority) always goes before a background refill, so refilling the warm pool never starves leases.
Does not own: creating sandboxes (backends) or deciding when to start one (the pool).

    gate = StartGate(max_starting=8, rate=20.0)
    async with gate.slot(priority=True):      # a lease's cold start
        handle = await backend.create(...)

Release never awaits, so a slot is returned even when its holder is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from agentrl.errors import ConfigError, MissingDependencyError


class StartGate:
    """At most `max_starting` holders at once (None: no cap), at most `rate` slot grants per second (None: no
    limit); waiting priority callers block new non-priority grants."""

    def __init__(self, max_starting: int | None = None, rate: float | None = None) -> None:
        if max_starting is not None and max_starting < 1:
            raise ConfigError(f"max_starting={max_starting}: use 1 or more, or None for no cap")
        if rate is not None and rate <= 0:
            raise ConfigError(f"create_rate={rate}: use a positive number of creations per second, or None")
        self.max_starting = max_starting
        self.rate = rate
        self._limiter = _limiter(rate) if rate is not None else None
        self._holders = 0
        self._priority_waiting = 0
        self._changed = asyncio.Event()

    @property
    def starting(self) -> int:
        return self._holders

    def _admits(self, priority: bool) -> bool:
        has_room = self.max_starting is None or self._holders < self.max_starting
        return has_room and (priority or self._priority_waiting == 0)

    async def _wait_turn(self, priority: bool) -> None:
        while not self._admits(priority):
            changed = self._changed
            await changed.wait()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()  # wakes every current waiter; each re-checks whether it is admitted

    @asynccontextmanager
    async def slot(self, *, priority: bool) -> AsyncIterator[None]:
        """Hold one starting slot for the block (after waiting for room and, with a rate, for a token)."""
        if priority:
            self._priority_waiting += 1
        try:
            await self._wait_turn(priority)
        finally:
            if priority:
                self._priority_waiting -= 1
                self._notify()
        self._holders += 1
        try:
            if self._limiter is not None:
                await self._limiter.acquire()
            yield
        finally:
            self._holders -= 1
            self._notify()


def _limiter(rate: float) -> Any:
    try:
        from aiolimiter import AsyncLimiter
    except ImportError as e:
        raise MissingDependencyError("create_rate needs aiolimiter: pip install 'agentrl[docker]' "
                                     "(or pip install aiolimiter)") from e
    burst = max(1.0, rate)  # a bucket of `burst` tokens refilled at `rate` per second
    return AsyncLimiter(burst, burst / rate)
