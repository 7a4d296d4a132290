"""The client-side rate limit of the Kubernetes API edge: QPS + burst (like client-go), fair, with an urgent lane.

Owns: who may send the next API request. Tokens accrue at `rate` per second up to `burst`. Waiters are served in
arrival order, urgent ones first: a call a trajectory is waiting on (claiming a warm pod, creating the pod it will
run in, reading why its pod died) goes ahead of the pool's own housekeeping (refill creates, deletes, sweeps, lists).

Why the lane: at the seeds' scale the housekeeping alone fills the budget. After a step's first burst of 2,000
claims the refill posts 2,000 pods and the finished trajectories delete theirs, so the queue holds hundreds of calls
at qps 50; a claim that queued behind them waited seconds (the steady claim p99 of the scale benchmark). Fair order
matters too: a limiter whose waiters all sleep and race for the next token serves them in no particular order, so one
unlucky caller can wait for much longer than the queue it joined.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from agentrl.errors import ConfigError


class TokenBucket:
    """`rate` requests per second on average, bursts of up to `burst`; `take(urgent=True)` jumps the queue of
    non-urgent waiters (never another urgent one)."""

    def __init__(self, rate: float, burst: int) -> None:
        if rate <= 0 or burst < 1:
            raise ConfigError(f"api qps={rate} / burst={burst}: use qps > 0 and burst >= 1")
        self.rate = rate
        self.capacity = float(burst)
        self._tokens = float(burst)
        self._stamp = time.monotonic()
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._later: deque[asyncio.Future[None]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def waiting(self) -> int:
        """Callers queued for a token now."""
        return sum(not f.done() for f in self._urgent) + sum(not f.done() for f in self._later)

    def _accrue(self) -> None:
        now = time.monotonic()
        self._tokens = min(self.capacity, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    async def take(self, urgent: bool = False) -> None:
        self._accrue()
        if self._tokens >= 1.0 and not self.waiting():
            self._tokens -= 1.0
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        (self._urgent if urgent else self._later).append(fut)
        self._arm()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._tokens += 1.0  # granted, then cancelled before it was used: give it back
                self._serve()
            raise

    def _arm(self) -> None:
        if self._timer is None and self.waiting():
            delay = max(0.0, (1.0 - self._tokens) / self.rate)
            self._timer = asyncio.get_running_loop().call_later(delay, self._wake)

    def _wake(self) -> None:
        self._timer = None
        self._serve()

    def _serve(self) -> None:
        self._accrue()
        for queue in (self._urgent, self._later):
            while queue and self._tokens >= 1.0:
                fut = queue.popleft()
                if fut.done():  # its caller was cancelled while it waited
                    continue
                self._tokens -= 1.0
                fut.set_result(None)
        for queue in (self._urgent, self._later):
            while queue and queue[0].done():
                queue.popleft()
        self._arm()
