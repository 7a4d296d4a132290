"""Reward-source registry: `@register_reward` for in-tree classes, the `agentrl.rewards` entry-point group for
packages. Mirrors the env registry (one module-level table, entry points loaded lazily on the first lookup)."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Callable, TypeVar

from agentrl.errors import ConfigError
from agentrl.reward.base import RewardSource

ENTRY_POINT_GROUP = "agentrl.rewards"
BUILTIN_MODULES = ("agentrl.reward.unit_tests", "agentrl.reward.format", "agentrl.reward.http")
_REGISTRY: dict[str, type[RewardSource]] = {}

R = TypeVar("R", bound=type[RewardSource])


def register_reward(name: str) -> Callable[[R], R]:
    def deco(cls: R) -> R:
        if not (isinstance(cls, type) and issubclass(cls, RewardSource)):
            raise TypeError(f"@register_reward({name!r}): {cls!r} must subclass agentrl.reward.RewardSource")
        prev = _REGISTRY.get(name)
        if prev is not None and prev is not cls and prev.__qualname__ != cls.__qualname__:
            raise ConfigError(f"reward source {name!r} registered twice ({prev.__module__} and {cls.__module__})")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def _load_entry_points() -> dict[str, str]:
    """Import every source registered under `agentrl.rewards`. Returns name -> error for broken ones."""
    for module in BUILTIN_MODULES:  # in-tree sources register on import
        importlib.import_module(module)
    broken: dict[str, str] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _REGISTRY:
            continue
        try:
            obj = ep.load()
        except Exception as exc:  # a broken third-party source must not hide the others
            broken[ep.name] = f"{type(exc).__name__}: {exc}"
            continue
        if isinstance(obj, type) and issubclass(obj, RewardSource) and ep.name not in _REGISTRY:
            register_reward(ep.name)(obj)
    return broken


def available_rewards() -> dict[str, type[RewardSource]]:
    _load_entry_points()
    return dict(sorted(_REGISTRY.items()))


def reward_class(name: str) -> type[RewardSource]:
    broken = _load_entry_points()
    if name not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        hint = f" (entry point failed to load: {broken[name]})" if name in broken else ""
        raise ConfigError(f"reward source {name!r} is not registered{hint}. Known sources: {known}. Install the "
                          f"source's package (an '{ENTRY_POINT_GROUP}' entry point) or decorate it with "
                          f"@register_reward.")
    return _REGISTRY[name]
