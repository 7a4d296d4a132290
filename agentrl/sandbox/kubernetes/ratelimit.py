"""The client-side gate of the Kubernetes API edge: a rate limit (QPS + burst, like client-go) and the client's
concurrent requests, both served fairly, with an urgent lane.

Owns: who may send the next API request, and when. Tokens accrue at `rate` per second up to `burst`; a request also
holds one of `concurrency` slots (the edge's I/O threads) until its answer is in. Waiters are served in arrival
order, urgent ones first: a call a trajectory is waiting on (claiming a warm pod, creating the pod it will run in,
reading why its pod died) goes ahead of the pool's own housekeeping (refill creates, deletes, sweeps, lists).

Why, measured with benchmarks/bench_k8s_scale.py: at 500 pods the steady claim p99 was 3.5 s while its own PATCH took
~0.1 s. After a step's burst of claims the refill posts hundreds of pods and the finished trajectories delete theirs;
with the API server answering in 0.2-8 s under that load, those calls held all of the edge's threads and a claim
queued behind them, first in the rate limit and then in the thread pool's queue. Here it waits for neither: it takes
the next token and the next free thread. Fair order matters too: a limiter whose waiters all sleep and race for the
next token serves them in no particular order, so one unlucky caller waits much longer than the queue it joined.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import AsyncIterator

from agentrl.errors import ConfigError


class RequestGate:
    """`rate` requests per second on average, bursts of up to `burst`, at most `concurrency` in flight (through
    `slot()`). `urgent=True` goes ahead of waiting non-urgent callers, never of another urgent one."""

    def __init__(self, rate: float, burst: int, concurrency: int | None = None) -> None:
        if rate <= 0 or burst < 1:
            raise ConfigError(f"api qps={rate} / burst={burst}: use qps > 0 and burst >= 1")
        self.rate = rate
        self.capacity = float(burst)
        self.concurrency = math.inf if concurrency is None else concurrency
        self.running = 0  # slots held
        self._tokens = float(burst)
        self._stamp = time.monotonic()
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._later: deque[asyncio.Future[None]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def waiting(self) -> int:
        """Callers queued now (a count for stats: it walks the queues)."""
        return sum(not f.done() for f in self._urgent) + sum(not f.done() for f in self._later)

    def _queued(self) -> bool:
        """Anyone in line (cancelled entries included until served: they only make a caller queue and be served at
        once). O(1): this runs on every request."""
        return bool(self._urgent or self._later)

    @contextlib.asynccontextmanager
    async def slot(self, urgent: bool = False) -> AsyncIterator[None]:
        """A token and one of the `concurrency` slots, held for the block (the request and its answer)."""
        await self._enter(urgent)
        try:
            yield
        finally:
            self.running -= 1
            self._serve()

    def _accrue(self) -> None:
        now = time.monotonic()
        self._tokens = min(self.capacity, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def _can_go(self) -> bool:
        return self._tokens >= 1.0 and self.running < self.concurrency

    def _grant(self) -> None:
        self._tokens -= 1.0
        self.running += 1

    async def _enter(self, urgent: bool) -> None:
        self._accrue()
        if not self._queued() and self._can_go():
            self._grant()
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        (self._urgent if urgent else self._later).append(fut)
        self._serve()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # granted, then cancelled before it was used: give it back
                self._tokens += 1.0
                self.running -= 1
            self._serve()
            raise

    def _serve(self) -> None:
        """Grant waiters in order (urgent first) while the head of the line can go; then wait for a token (timer)
        or a slot (the next release)."""
        self._accrue()
        for queue in (self._urgent, self._later):
            while queue:
                fut = queue[0]
                if fut.done():  # its caller was cancelled while it waited
                    queue.popleft()
                    continue
                if not self._can_go():
                    break
                queue.popleft()
                self._grant()
                fut.set_result(None)
            if queue:  # the urgent line is blocked: nobody behind it goes first
                break
        if self._timer is None and self._queued() and self._tokens < 1.0:
            self._timer = asyncio.get_running_loop().call_later((1.0 - self._tokens) / self.rate, self._wake)

    def _wake(self) -> None:
        self._timer = None
        self._serve()
