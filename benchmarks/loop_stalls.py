"""Where an event loop spends a stall: a thread samples the loop thread's stack while the loop has not ticked for
more than `threshold_s`, and reports each stall with its length, the loop thread's own CPU time during it, and its
most frequent stacks. bench_k8s_scale.py's `--stall-sample-s` (the 2,000-pod runs had a ~50 s stall of the runner's
loop, twice, that LoopLag measures but cannot explain).

The loop thread's CPU time during a stall tells the kind: close to the stall's length, the loop was computing (the
stacks say what); close to 0, it was blocked or starved (waiting on a lock, the GIL held by another thread, no core).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

_TICKS = os.sysconf("SC_CLK_TCK")


def _thread_cpu_s(native_id: int) -> float:
    try:
        fields = open(f"/proc/self/task/{native_id}/stat").read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except OSError:
        return float("nan")


@dataclass
class Stall:
    started: float  # monotonic: the last tick before it
    cpu0: float
    ended: float = 0.0
    cpu_s: float = 0.0
    stacks: Counter[tuple[str, ...]] = field(default_factory=Counter)


class StallSampler:
    """`await start()` on the loop to watch, `await stop()` on it, then `report()`."""

    def __init__(self, threshold_s: float = 2.0, every_s: float = 0.2, depth: int = 14) -> None:
        self.threshold_s, self.every_s, self.depth = threshold_s, every_s, depth
        self.stalls: list[Stall] = []
        self._beat = time.monotonic()
        self._stop = threading.Event()
        self._tick: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None

    async def start(self) -> StallSampler:
        loop_thread = threading.current_thread()
        self._tick = asyncio.get_running_loop().create_task(self._beats())
        self._thread = threading.Thread(target=self._watch, args=(loop_thread.ident, loop_thread.native_id),
                                        name="stall-sampler", daemon=True)
        self._thread.start()
        return self

    async def stop(self) -> None:
        self._stop.set()
        if self._tick is not None:
            self._tick.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._tick
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5)

    async def _beats(self) -> None:
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(0.05)

    def _watch(self, ident: int | None, native_id: int | None) -> None:
        current: Stall | None = None
        while not self._stop.wait(self.every_s):
            beat = self._beat
            stalled = time.monotonic() - beat > self.threshold_s
            if current is not None and (not stalled or beat != current.started):
                current.ended = beat if beat != current.started else time.monotonic()
                current.cpu_s = _thread_cpu_s(native_id or 0) - current.cpu0
                current = None
            if not stalled:
                continue
            if current is None:
                current = Stall(started=beat, cpu0=_thread_cpu_s(native_id or 0))
                self.stalls.append(current)
            frame = sys._current_frames().get(ident or 0)
            if frame is not None:
                stack = traceback.extract_stack(frame)[-self.depth:]
                current.stacks[tuple(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in stack)] += 1
        if current is not None:
            current.ended = time.monotonic()
            current.cpu_s = _thread_cpu_s(native_id or 0) - current.cpu0

    def report(self, most: int = 5, stacks: int = 3) -> str:
        if not self.stalls:
            return f"loop stalls over {self.threshold_s:g} s: none"
        lines = [f"loop stalls over {self.threshold_s:g} s: {len(self.stalls)}"]
        for s in sorted(self.stalls, key=lambda s: s.started - s.ended)[:most]:
            n = sum(s.stacks.values())
            lines.append(f"- {s.ended - s.started:.1f} s, the loop thread's CPU {s.cpu_s:.1f} s, {n} samples")
            for stack, k in s.stacks.most_common(stacks):
                lines.append(f"  {k} x: " + " <- ".join(reversed(stack)))
        return "\n".join(lines)
