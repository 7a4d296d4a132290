"""Deadlines that count the awaited party's time, not the runner's own stalls.

Owns: `Deadline`, used wherever a missed deadline decides a verdict: the sandbox client's per-request deadlines
(a missed one is a dead or hung sandbox), the scheduler's stage budgets, the rollout's tool timeout.
Imports nothing of agentrl.

Why: `asyncio.timeout` is a timer on the event loop. When the loop itself stalls (the runner starved of CPU, a long
callback), the timer fires late, in the same loop pass as the answers that arrived meanwhile, and it runs before the
task that would read them: the request is judged hung although its answer sits unread in the socket. A 2,000-pod
scale run stalled once for ~50 s with ~1,100 trajectories in flight: every request whose deadline fell in the stall
would be judged hung and, as its sandbox then answered a health probe, charged to the policy ("a request missed its
deadline while the sandbox still answers"). A stall of the runner must never be scored as the policy's.

What it does: when the timer fires more than STALL_TOLERANCE_S after it was due, the deadline is extended once by
that lateness (at most STALL_EXTRA_MAX_S), so the loop reads whatever arrived during its stall before the awaited
work is judged. The awaited party gets no more time than it had while the loop was running; work that never
finishes still expires, at most STALL_EXTRA_MAX_S later.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

STALL_TOLERANCE_S = 0.5  # a deadline timer firing later than this was held up by the runner's own event loop
STALL_EXTRA_MAX_S = 60.0  # the most a deadline is extended after such a stall

__all__ = ["Deadline", "STALL_EXTRA_MAX_S", "STALL_TOLERANCE_S"]


class Deadline:
    """`async with Deadline(seconds):` like `asyncio.timeout(seconds)` (TimeoutError on expiry, `expired()`),
    but extended once by the lateness of its own timer when the event loop stalled past the deadline."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.extended_s = 0.0  # how much a late timer added (0: it fired on time, or has not fired)
        self._timeout = asyncio.timeout(None)
        self._timer: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> Deadline:
        await self._timeout.__aenter__()
        if self.seconds is not None:
            loop = asyncio.get_running_loop()
            due = loop.time() + max(0.0, self.seconds)  # a budget already spent is due now, not overdue
            self._timer = loop.call_at(due, self._due, loop, due)
        return self

    def _due(self, loop: asyncio.AbstractEventLoop, due: float) -> None:
        now = loop.time()
        late = now - due
        if late > STALL_TOLERANCE_S:
            self.extended_s = min(late, STALL_EXTRA_MAX_S)
            self._timeout.reschedule(now + self.extended_s)
        else:
            self._timeout.reschedule(now)  # expires on the next pass

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        await self._timeout.__aexit__(exc_type, exc, tb)  # a cancellation it caused becomes TimeoutError

    def expired(self) -> bool:
        """The deadline fired and cancelled the awaited work (as `asyncio.Timeout.expired`)."""
        return self._timeout.expired()
