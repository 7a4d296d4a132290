"""Every registered env honours the Env contract: unique frozen tasks, valid tool specs, a known action format."""

from __future__ import annotations

import dataclasses

import pytest

from agentrl.envs import Env, Task, available_envs, get_env

ENVS = sorted(available_envs())


def test_code_tests_is_registered_through_its_entry_point() -> None:
    assert "code_tests" in ENVS


@pytest.mark.parametrize("name", ENVS)
def test_env_contract(name: str) -> None:
    env = get_env(name)
    assert isinstance(env, Env) and env.name == name
    assert env.action_format in ("hermes", "codeblock")
    tasks = list(env.tasks())
    assert tasks, f"env {name} has no tasks"
    assert all(isinstance(t, Task) for t in tasks)
    assert len({t.id for t in tasks}) == len(tasks), "task ids must be unique"
    with pytest.raises(dataclasses.FrozenInstanceError):
        tasks[0].id = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        tasks[0].data["new"] = 1  # type: ignore[index]
    for spec in env.tools:
        assert spec.parameters.get("type") == "object" and isinstance(spec.parameters.get("properties", {}), dict)
    assert env.messages(tasks[0])[-1].role == "user"


def test_unknown_env_error_lists_known() -> None:
    from agentrl.errors import ConfigError

    with pytest.raises(ConfigError, match="code_tests"):
        get_env("nope")
