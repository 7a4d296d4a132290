"""One named-class table: `@register(name)` for in-tree classes, an entry-point group for installed packages.

Owns: the name -> class table of one kind of plugin (envs, reward sources), the refusal of two different classes
under one name, loading the entry-point group lazily on each lookup (a broken package is reported by name, never
hides the others), and the "not registered" error that lists the known names and the three ways to fix it. Does not
own what a plugin is: the caller gives the base class and the words. Imports only agentrl.errors, so every layer may
use it (envs and reward both do).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from agentrl.errors import ConfigError

T = TypeVar("T")
C = TypeVar("C", bound=type)


class Registry(Generic[T]):
    """Classes of kind `base` by name. `what` names the kind in errors ("env", "reward source"); `decorator` is the
    decorator's name in messages, `plural` the kind in "Known ...:"; `builtin_modules` are imported before each lookup
    (in-tree classes register on
    import)."""

    def __init__(self, base: type[T], group: str, *, what: str, decorator: str, plural: str | None = None,
                 builtin_modules: Iterable[str] = ()) -> None:
        self.base, self.group, self.what, self.decorator = base, group, what, decorator
        self.plural = plural or f"{what}s"
        self.builtin_modules = tuple(builtin_modules)
        self._table: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[C], C]:
        """Decorator: file `cls` under `name` and set `cls.name`. The same class again (or a reload of it) is fine."""

        def deco(cls: C) -> C:
            if not (isinstance(cls, type) and issubclass(cls, self.base)):
                raise TypeError(f"@{self.decorator}({name!r}): {getattr(cls, '__name__', repr(cls))} must subclass "
                                f"{self.base.__module__.rsplit('.', 1)[0]}.{self.base.__name__}")
            prev = self._table.get(name)
            if prev is not None and prev is not cls and prev.__qualname__ != cls.__qualname__:
                raise ConfigError(f"{self.what} name {name!r} registered twice ({prev.__module__} and "
                                  f"{cls.__module__})")
            cls.name = name  # type: ignore[attr-defined]
            self._table[name] = cls
            return cls

        return deco

    def load(self) -> dict[str, str]:
        """Import the built-in modules and every entry point of the group. Returns name -> error for broken ones."""
        for module in self.builtin_modules:
            importlib.import_module(module)
        broken: dict[str, str] = {}
        for ep in entry_points(group=self.group):
            if ep.name in self._table:
                continue
            try:
                obj = ep.load()
            except Exception as exc:  # a broken third-party package must not hide the others
                broken[ep.name] = f"{type(exc).__name__}: {exc}"
                continue
            if isinstance(obj, type) and issubclass(obj, self.base) and ep.name not in self._table:
                self.register(ep.name)(obj)
        return broken

    def available(self) -> dict[str, type[T]]:
        """Every registered class by name, sorted (entry points loaded first)."""
        self.load()
        return dict(sorted(self._table.items()))

    def get(self, name: str, *, fix: str) -> type[T]:
        """The class registered as `name`; else ConfigError listing the known names, then `fix` (how to register)."""
        broken = self.load()
        if name not in self._table:
            known = ", ".join(sorted(self._table)) or "none"
            hint = f" (entry point failed to load: {broken[name]})" if name in broken else ""
            raise ConfigError(f"{self.what} {name!r} is not registered{hint}. Known {self.plural}: {known}. {fix}")
        return self._table[name]
