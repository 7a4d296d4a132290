"""The reward-source interface: one small class per source, its options as a pydantic model.

A source turns one finished trajectory into one unweighted number (`value`); the `Scorer` (scorer.py) weights and
sums them. A source never sees `infra_error` trajectories (the scorer leaves those unscored) and returns `None` only
when the trajectory carries nothing it can score (e.g. no test report): the whole reward is then `None`, never 0.
A source whose service fails raises an `InfraError` (the trajectory stays unscored, `reward_failed`; the episode is
never sampled again). A source that rejects the trajectory's own content raises `ContentRejected`: that component is
0 and the reason is stored in `meta["reward_rejected"]`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from agentrl.types import Message, Trajectory

# trajectory -> the opening chat of its task (system + user messages); given by the composition root, which knows envs
PromptMessages = Callable[[Trajectory], list[Message]]


class ContentRejected(Exception):  # noqa: N818 - an outcome, not a failure
    """The source refused this trajectory because of what the policy wrote in it (while it accepts others): the
    component is 0, and `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SourceOptions(BaseModel):
    """Options of one source as written under its name in `reward:` (besides `weight` and `label`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class RewardSource(ABC):
    """Subclass, set `Options`, implement `value`, and register with `@register_reward("name")`."""

    name: ClassVar[str] = ""
    Options: ClassVar[type[SourceOptions]] = SourceOptions
    # the same stored trajectory always gets the same value (rescore reproduces it)
    deterministic: ClassVar[bool] = True

    def __init__(self, options: SourceOptions, *, prompt_messages: PromptMessages | None = None) -> None:
        self.options = options
        self.prompt_messages = prompt_messages

    @abstractmethod
    async def value(self, traj: Trajectory) -> float | None:
        """The unweighted value of this source for a scorable (not infra_error) trajectory."""

    async def aclose(self) -> None:
        """Release connections; called once when the scorer closes."""
        return None
