"""agentrl.registry.Registry: the one named-class table behind @register_env and @register_reward."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from typing import Any

import pytest

from agentrl import registry as registry_module
from agentrl.errors import ConfigError
from agentrl.registry import Registry


class Base:
    name = ""


class Good(Base):
    pass


class Other(Base):
    pass


def _fake_entry_points(monkeypatch: pytest.MonkeyPatch, eps: list[EntryPoint]) -> None:
    def entry_points(*, group: str) -> list[EntryPoint]:
        return [ep for ep in eps if ep.group == group]

    monkeypatch.setattr(registry_module, "entry_points", entry_points)


def _reg(**kw: Any) -> Registry[Base]:
    return Registry(Base, "agentrl.test_plugins", what="widget", decorator="register_widget", **kw)


def test_register_names_the_class_and_refuses_a_second_class_under_the_same_name() -> None:
    reg = _reg()
    assert reg.register("w")(Good) is Good and Good.name == "w"
    reg.register("w")(Good)  # the same class again (a re-import) is fine
    with pytest.raises(ConfigError, match="widget name 'w' registered twice"):
        reg.register("w")(Other)
    with pytest.raises(TypeError, match=r"@register_widget\('x'\): int must subclass"):
        reg.register("x")(int)


def test_entry_points_load_lazily_and_a_broken_one_is_named_without_hiding_the_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_entry_points(monkeypatch, [
        EntryPoint("good", f"{__name__}:Other", "agentrl.test_plugins"),
        EntryPoint("broken", "agentrl_no_such_module_xyz:Thing", "agentrl.test_plugins"),
        EntryPoint("elsewhere", f"{__name__}:Good", "another.group"),
    ])
    reg = _reg(plural="widgetry")
    assert reg.get("good", fix="fix it") is Other
    assert list(reg.available()) == ["good"]
    with pytest.raises(ConfigError) as err:
        reg.get("broken", fix="Install the package.")
    msg = str(err.value)
    assert "widget 'broken' is not registered (entry point failed to load: ModuleNotFoundError" in msg
    assert "Known widgetry: good. Install the package." in msg


def test_builtin_modules_are_imported_before_a_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_entry_points(monkeypatch, [])
    imported: list[str] = []
    monkeypatch.setattr(registry_module.importlib, "import_module", imported.append)
    reg = _reg(builtin_modules=("pkg.a", "pkg.b"))
    with pytest.raises(ConfigError, match="Known widgets: none. say how"):
        reg.get("nothing", fix="say how")
    assert imported == ["pkg.a", "pkg.b"]


def test_envs_and_reward_sources_share_the_helper() -> None:
    from agentrl.envs import registry as envs
    from agentrl.reward import registry as rewards

    assert isinstance(envs._ENVS, Registry) and isinstance(rewards._SOURCES, Registry)
    assert "unit_tests" in rewards.available_rewards()
    with pytest.raises(ConfigError, match="Known sources: .*@register_reward"):
        rewards.reward_class("no_such_source")
    with pytest.raises(ConfigError, match="env 'no_such_env' is not registered. Known envs: .*--env package"):
        envs.get_env("no_such_env")
