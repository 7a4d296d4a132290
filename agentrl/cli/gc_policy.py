"""The process's garbage-collector policy for long rollout / training runs (config `gc_tune`, default on).

Why. With thousands of trajectories in flight, CPython's collector was the largest single cost on the event loop
(benchmarks/bench_scale.py, BENCHMARKS.md): a young collection runs every 700 net allocations, and a full collection
walks every tracked object, including the ~300,000 that importing torch / transformers and loading the tokenizer
created and that never die. Full collections paused the loop for 14 -> 330 ms each, growing with the heap.

What `tune()` does, once start-up is over (model, tokenizer, env and renderer built):

- `gc.freeze()`: everything alive now moves to a permanent generation that no collection scans again (the
  tokenizer, modules, the model's Python objects). It is still reachable and freed normally at exit.
- the young-generation threshold goes from 700 to `gen0` (50,000) allocations: ~70x fewer young collections;
  cycles are still collected (the thresholds of the older generations are kept), at the price of up to `gen0`
  more young objects alive between collections (a few MB).

`GcMonitor` times every collection (`gc.callbacks`) so a run can report what the collector cost: collections,
total seconds and the longest pause per generation. `process_monitor()` is the one the CLI roots install: training
writes its per-step share to metrics.jsonl (`time_gc_s`, `time_gc_max_pause_s`), `agentrl rollout` prints it at the
end. Nothing here changes what a run computes.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any

DEFAULT_GEN0 = 50_000


def tune(gen0: int = DEFAULT_GEN0) -> dict[str, int]:
    """Freeze the objects alive now and raise the young-generation threshold. Returns what it did (for logs)."""
    if gen0 < 1:
        raise ValueError(f"gc gen0 threshold must be >= 1, got {gen0}")
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0, gen1, gen2)
    return {"frozen_objects": gc.get_freeze_count(), "gen0_threshold": gen0}


@dataclass
class GcMonitor:
    """Collections, seconds and the longest pause per generation while installed (a context manager)."""

    collections: list[int] = field(default_factory=lambda: [0, 0, 0])
    seconds: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    max_pause_s: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    _t0: float = 0.0
    _window_s: float = 0.0  # since the last take()
    _window_max_s: float = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        gen = int(info.get("generation", 2))
        dt = time.perf_counter() - self._t0
        self.collections[gen] += 1
        self.seconds[gen] += dt
        self.max_pause_s[gen] = max(self.max_pause_s[gen], dt)
        self._window_s += dt
        self._window_max_s = max(self._window_max_s, dt)

    def take(self) -> dict[str, float]:
        """Seconds in collections and the longest pause since the previous take() (or since installed), then
        start a new window: one training step's share, as metrics.jsonl reports it."""
        out = {"time_gc_s": round(self._window_s, 4), "time_gc_max_pause_s": round(self._window_max_s, 4)}
        self._window_s = self._window_max_s = 0.0
        return out

    def __enter__(self) -> GcMonitor:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def summary(self) -> dict[str, Any]:
        return {"gc_collections": list(self.collections), "gc_s": round(sum(self.seconds), 4),
                "gc_max_pause_ms": round(max(self.max_pause_s) * 1e3, 2),
                "gc_full_max_pause_ms": round(self.max_pause_s[2] * 1e3, 2)}


_PROCESS_MONITOR: GcMonitor | None = None


def process_monitor() -> GcMonitor:
    """The process's monitor, installed on first use and kept until exit (gc.callbacks is process-wide: one is
    enough however many runs a process starts)."""
    global _PROCESS_MONITOR
    if _PROCESS_MONITOR is None:
        _PROCESS_MONITOR = GcMonitor().__enter__()
    return _PROCESS_MONITOR
