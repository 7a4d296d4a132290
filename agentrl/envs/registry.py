"""Env registry: `@register_env` for in-tree classes, the `agentrl.envs` entry-point group for packages.

The decorator writes into one module-level table (the one deliberate global: registration must work at import
time, like verl's `@register`). Entry points are loaded lazily on the first lookup.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Callable, TypeVar

from agentrl.envs.base import Env
from agentrl.errors import ConfigError

ENTRY_POINT_GROUP = "agentrl.envs"
_REGISTRY: dict[str, type[Env]] = {}

E = TypeVar("E", bound=type[Env])


def register_env(name: str) -> Callable[[E], E]:
    def deco(cls: E) -> E:
        if not issubclass(cls, Env):
            raise TypeError(f"@register_env({name!r}): {cls.__name__} must subclass agentrl.envs.Env")
        prev = _REGISTRY.get(name)
        if prev is not None and prev is not cls and prev.__qualname__ != cls.__qualname__:
            raise ConfigError(f"env name {name!r} registered twice ({prev.__module__} and {cls.__module__})")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def _load_entry_points() -> dict[str, str]:
    """Import every package registered under `agentrl.envs`. Returns name -> error for broken ones."""
    broken: dict[str, str] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _REGISTRY:
            continue
        try:
            obj = ep.load()
        except Exception as exc:  # a broken third-party env must not hide the others
            broken[ep.name] = f"{type(exc).__name__}: {exc}"
            continue
        if isinstance(obj, type) and issubclass(obj, Env) and ep.name not in _REGISTRY:
            register_env(ep.name)(obj)
    return broken


def available_envs() -> dict[str, type[Env]]:
    _load_entry_points()
    return dict(sorted(_REGISTRY.items()))


def get_env(name: str, **options: object) -> Env:
    broken = _load_entry_points()
    if name not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        hint = f" (entry point failed to load: {broken[name]})" if name in broken else ""
        raise ConfigError(
            f"env {name!r} is not registered{hint}. Known envs: {known}. Install the env's package "
            f"(it must declare an '{ENTRY_POINT_GROUP}' entry point) or decorate its class with @register_env."
        )
    return _REGISTRY[name](**options)
