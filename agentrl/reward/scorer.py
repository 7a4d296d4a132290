"""The Scorer: a trajectory's reward = the weighted sum of its sources' values; each unweighted value is stored in
`reward_components` under the source's name (or label), and the reward config itself in `meta["reward"]` so that
`agentrl rescore` can recompute it.

Order and exactness: sources are evaluated in the listed order and summed left to right from 0.0, so the same stored
trajectory under the same config always gets bit-identical rewards (a lone `unit_tests` at weight 1 gives exactly
the test fraction). Rules: `infra_error` trajectories stay unscored (reward None, no components); a source that
returns None makes the whole reward None; a source that cannot reach its service raises `InfraError` out of `score`
(the scheduler then leaves the trajectory unscored, `infra_error` / `reward_failed`, without sampling the episode
again); a source that rejects the trajectory's content (`ContentRejected`) gives that component 0 and the reason in
`meta["reward_rejected"]`; a non-finite value is a bug, raised as `ValueError` naming the source.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from agentrl.reward.base import ContentRejected, PromptMessages, RewardSource
from agentrl.reward.registry import reward_class
from agentrl.reward.spec import DEFAULT_REWARD, RewardSpec, check_reward_list
from agentrl.types import Status, Trajectory

META_KEY = "reward"
REJECTED_KEY = "reward_rejected"  # meta: {source key: why it rejected the trajectory's content} (that component is 0)


class Scorer:
    """Scores trajectories with a list of weighted sources. Async context manager: closes the sources' clients."""

    def __init__(self, specs: Sequence[RewardSpec] = DEFAULT_REWARD, *,
                 prompt_messages: PromptMessages | None = None) -> None:
        self.specs = tuple(check_reward_list(list(specs)))
        self.sources: list[tuple[RewardSpec, RewardSource]] = []
        for spec in self.specs:
            cls = reward_class(spec.source)
            self.sources.append((spec, cls(cls.Options.model_validate(spec.options), prompt_messages=prompt_messages)))

    @property
    def deterministic(self) -> bool:
        return all(src.deterministic for _, src in self.sources)

    def describe(self) -> list[dict[str, Any]]:
        """The config as recorded in `meta["reward"]` (the canonical `RewardSpec` form)."""
        return [spec.model_dump(mode="json") for spec in self.specs]

    async def score(self, traj: Trajectory) -> Trajectory:
        """A copy of `traj` with `reward`, `reward_components` and `meta["reward"]` set (see the module doc)."""
        meta = {**{k: v for k, v in traj.meta.items() if k != REJECTED_KEY}, META_KEY: self.describe()}
        if traj.status is Status.infra_error:
            return traj.model_copy(update={"reward": None, "reward_components": {}, "meta": meta})
        components: dict[str, float] = {}
        for spec, source in self.sources:
            try:
                value = await source.value(traj)
            except ContentRejected as rejected:
                value = 0.0
                meta[REJECTED_KEY] = {**meta.get(REJECTED_KEY, {}), spec.key: rejected.reason}
            if value is None:
                return traj.model_copy(update={"reward": None, "reward_components": components, "meta": meta})
            if not math.isfinite(value):
                raise ValueError(f"reward source {spec.key!r} returned {value!r} for trajectory {traj.id}")
            components[spec.key] = float(value)
        reward = 0.0
        for spec, _ in self.sources:
            reward += spec.weight * components[spec.key]
        return traj.model_copy(update={"reward": reward, "reward_components": components, "meta": meta})

    async def aclose(self) -> None:
        for _, source in self.sources:
            await source.aclose()

    async def __aenter__(self) -> Scorer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def recorded_specs(traj: Trajectory) -> list[RewardSpec] | None:
    """The reward config a trajectory was scored with (`meta["reward"]`), or None for records from before it."""
    raw = traj.meta.get(META_KEY)
    if not isinstance(raw, list):
        return None
    return [RewardSpec.model_validate(item) for item in raw]
