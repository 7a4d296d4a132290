"""Env registry: `@register_env` for in-tree classes, the `agentrl.envs` entry-point group for packages, and env
specs that name a class directly.

The decorator writes into one module-level table (an `agentrl.registry.Registry`, shared with the reward sources; the
one deliberate global: registration must work at import time, like verl's `@register`). Entry points are loaded
lazily on each lookup.

Everywhere an env name is accepted (`get_env`, so rollout, train, eval, envs check, replay), a spec works too:

    path/to/file.py:Class      a file (relative to the working directory); if it lies in a package (directories
                               with __init__.py), it is imported as that package's module so relative imports work
    package.module:Class       an importable module

A class loaded from a spec keeps its registered name if it has one, else its `name` becomes the spec itself, so the
trajectories it produces name an env that `get_env` can load again.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from agentrl.envs.base import Env
from agentrl.errors import ConfigError
from agentrl.registry import Registry

ENTRY_POINT_GROUP = "agentrl.envs"
_ENVS: Registry[Env] = Registry(Env, ENTRY_POINT_GROUP, what="env", decorator="register_env")

E = TypeVar("E", bound=type[Env])


def register_env(name: str) -> Callable[[E], E]:
    return _ENVS.register(name)


def available_envs() -> dict[str, type[Env]]:
    return _ENVS.available()


def is_env_spec(name: str) -> bool:
    """True for `file.py:Class` / `package.module:Class`; registered names contain no colon."""
    return ":" in name


def load_env_class(spec: str) -> type[Env]:
    """The Env subclass a spec names (see the module docstring). Raises ConfigError naming the spec and the fix."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr.isidentifier():
        raise ConfigError(f"env {spec!r}: expected path/to/file.py:Class or package.module:Class")
    if target.endswith(".py") or "/" in target:
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"env {spec!r}: file {target!r} does not exist (relative to {Path.cwd()})")
        module = _import_file(path)
    else:
        module = _import_module(target, spec)
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        found = sorted(n for n, v in vars(module).items()
                       if isinstance(v, type) and issubclass(v, Env) and v is not Env)
        what = "is not an agentrl.envs.Env subclass" if cls is not None else "does not exist"
        raise ConfigError(f"env {spec!r}: {attr} {what} in {module.__name__} (Env classes there: "
                          f"{', '.join(found) or 'none'})")
    if not cls.name:
        cls.name = spec
    return cls


def _import_module(dotted: str, spec: str):  # type: ignore[no-untyped-def]
    try:
        return importlib.import_module(dotted)
    except Exception as exc:  # any error in the user's module: report it with the spec
        raise ConfigError(f"env {spec!r}: cannot import {dotted} ({type(exc).__name__}: {exc})") from exc


@functools.cache
def _import_file(path: Path):  # type: ignore[no-untyped-def]
    """Import `path` as part of its package when it has one (relative imports work), else as a lone module."""
    root, parts = path.parent, [path.stem]
    while (root / "__init__.py").is_file():
        parts.insert(0, root.name)
        root = root.parent
    if len(parts) > 1:
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        return _import_module(".".join(parts), str(path))
    name = "agentrl_env_file_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"env file {str(path)!r} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ConfigError(f"env file {str(path)!r}: import failed ({type(exc).__name__}: {exc})") from exc
    return module


def get_env(name: str, **options: object) -> Env:
    """An instance of the env `name`: a registered name, or a spec (`file.py:Class`, `package.module:Class`)."""
    if is_env_spec(name):
        return load_env_class(name)(**options)
    cls = _ENVS.get(name, fix=f"Install the env's package (it must declare an '{ENTRY_POINT_GROUP}' entry point), "
                              "decorate its class with @register_env, or name the class directly: --env "
                              "path/to/file.py:Class or --env package.module:Class.")
    return cls(**options)
