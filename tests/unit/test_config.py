"""Config errors name the field and the source; unknown keys are rejected; CLI flags override YAML."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.cli import build_parser
from agentrl.cli import _overrides as cli_overrides
from agentrl.config import RolloutConfig, load_config
from agentrl.errors import ConfigError


def test_unknown_key_named(tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("env: code_tests\nbudgets:\n  max_turnz: 3\n")
    with pytest.raises(ConfigError) as exc:
        load_config(RolloutConfig, f)
    assert "budgets.max_turnz" in str(exc.value) and "unknown key" in str(exc.value)
    assert str(f) in str(exc.value)


def test_bad_value_named(tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("group_size: 0\nsandbox:\n  spec:\n    memory: lots\n")
    with pytest.raises(ConfigError) as exc:
        load_config(RolloutConfig, f)
    msg = str(exc.value)
    assert "group_size" in msg and "sandbox.spec.memory" in msg and "512m" in msg


def test_unknown_backend_named() -> None:
    with pytest.raises(ConfigError, match="sandbox.backend"):
        load_config(RolloutConfig, None, {"sandbox": {"backend": {"type": "podman"}}})


def test_missing_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(RolloutConfig, tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(RolloutConfig, bad)
    top = tmp_path / "list.yaml"
    top.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(RolloutConfig, top)


def test_cli_flags_override_yaml(tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("group_size: 8\nbudgets:\n  max_turns: 5\n  tool_timeout_s: 3\nsampling:\n  temperature: 0.3\n")
    args = build_parser().parse_args(["rollout", "--config", str(f), "--max-turns", "2", "--sandbox", "docker",
                                      "--env-option", "source=humaneval"])
    cfg = load_config(RolloutConfig, f, cli_overrides(args))
    assert cfg.group_size == 8 and cfg.budgets.max_turns == 2 and cfg.budgets.tool_timeout_s == 3
    assert cfg.sampling.temperature == 0.3 and cfg.sandbox.backend.type == "docker"
    assert cfg.env_options == {"source": "humaneval"}


def test_config_is_frozen() -> None:
    cfg = load_config(RolloutConfig)
    with pytest.raises(Exception):
        cfg.group_size = 3  # type: ignore[misc]


def test_deterministic_training_is_synchronous() -> None:
    from agentrl.trainer.config import TrainConfig

    assert TrainConfig(deterministic=True).pipeline.max_staleness == 0
    assert TrainConfig().pipeline.max_staleness == 1
    with pytest.raises(ValueError, match="deterministic: true needs pipeline.max_staleness: 0"):
        TrainConfig(deterministic=True, pipeline={"max_staleness": 1})
