"""The live counters of a scheduler's run, read by progress displays (a module of its own: displays import it without
importing the scheduler, which only the composition root constructs)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentrl.runner.rollout import TrajectoryState


@dataclass
class Progress:
    """Live counters for the progress display (updated as trajectories finish)."""

    trajectories_done: int = 0
    trajectories_total: int = 0
    turns: int = 0
    tool_calls: int = 0
    tokens: int = 0
    infra_errors: int = 0
    policy_errors: int = 0
    drift_check_errors: int = 0  # deferred drift checks that failed (their turns' drift flags are unset)
    started: float = field(default_factory=time.perf_counter)
    in_flight: dict[str, TrajectoryState] = field(default_factory=dict)  # attempts running now, by trajectory id

    def tokens_per_s(self) -> float:
        return self.tokens / max(time.perf_counter() - self.started, 1e-9)

    def live(self) -> tuple[int, int, int]:
        """(turns, model tokens, tool calls): the finished trajectories' plus what the in-flight ones have so far.
        Read on the event loop's thread (the states change between awaits)."""
        states = list(self.in_flight.values())
        return (self.turns + sum(len(s.turns) for s in states), self.tokens + sum(sum(s.env_mask) for s in states),
                self.tool_calls + sum(len(t.tool_calls) for s in states for t in s.turns))
