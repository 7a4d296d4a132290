"""Reward-source registry: `@register_reward` for in-tree classes, the `agentrl.rewards` entry-point group for
packages. One `agentrl.registry.Registry` (the env registry uses the same helper): one table, entry points loaded
lazily on each lookup, the in-tree sources imported first."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from agentrl.registry import Registry
from agentrl.reward.base import RewardSource

ENTRY_POINT_GROUP = "agentrl.rewards"
BUILTIN_MODULES = ("agentrl.reward.unit_tests", "agentrl.reward.format", "agentrl.reward.http")
_SOURCES: Registry[RewardSource] = Registry(RewardSource, ENTRY_POINT_GROUP, what="reward source",
                                            decorator="register_reward", plural="sources",
                                            builtin_modules=BUILTIN_MODULES)

R = TypeVar("R", bound=type[RewardSource])


def register_reward(name: str) -> Callable[[R], R]:
    return _SOURCES.register(name)


def available_rewards() -> dict[str, type[RewardSource]]:
    return _SOURCES.available()


def reward_class(name: str) -> type[RewardSource]:
    return _SOURCES.get(name, fix=f"Install the source's package (an '{ENTRY_POINT_GROUP}' entry point) or "
                                  "decorate it with @register_reward.")
