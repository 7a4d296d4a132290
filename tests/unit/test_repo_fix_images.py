"""repo_fix image naming and inputs (no Docker): names valid as Docker references, the wheels of a host venv found
in the cache (and a clear error when one is missing), and an inputs hash that changes with every input."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from agentrl_repo_fix import RepoFixEnv, images
from agentrl_repo_fix.lockfile import Package

from agentrl.envs import Task
from agentrl.errors import ConfigError

REF = re.compile(r"^[a-z0-9]+(?:[._/-][a-z0-9]+)*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
PKG = Package(name="python_Slugify", version="8.0.4+local", sha256="0" * 64, split="train", source=["slugify"],
              tests=["test.py"])


def test_image_names_are_valid_docker_references() -> None:
    assert images.image_name("inflection", "0.5.1") == "agentrl/repo-fix-inflection:0.5.1"
    name = images.image_name(PKG.name, PKG.version, "my.registry/team/repo-fix")
    assert name == "my.registry/team/repo-fix-python-slugify:8.0.4_local"
    assert REF.match(name.split("/", 1)[1])


def test_the_env_names_the_image_of_each_tasks_package() -> None:
    env = RepoFixEnv(image_repository="lab/rf")
    task = Task(id="x", prompt="p", data={"package": "sqlparse", "version": "0.5.1"})
    assert env.sandbox_image(task) == "lab/rf-sqlparse:0.5.1"
    with pytest.raises(ConfigError, match="image_repository"):
        RepoFixEnv(image_repository="Not Valid")


def _venv(tmp: Path, dists: list[str]) -> Path:
    site = tmp / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    for dist in dists:
        (site / f"{dist}.dist-info").mkdir()
    return tmp / "venv"


def test_venv_wheels_maps_installed_distributions_to_cached_wheels(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in ("pytest-8.3.4-py3-none-any.whl", "pytest_timeout-2.3.1-py3-none-any.whl",
                 "python_dateutil-2.9.0-py2.py3-none-any.whl", "unrelated-1.0-py3-none-any.whl"):
        (wheels / name).write_bytes(name.encode())
    venv = _venv(tmp_path, ["pytest-8.3.4", "pytest_timeout-2.3.1", "python_dateutil-2.9.0"])
    got = [p.name for p in images.venv_wheels(venv, wheels)]
    assert got == ["pytest-8.3.4-py3-none-any.whl", "pytest_timeout-2.3.1-py3-none-any.whl",
                   "python_dateutil-2.9.0-py2.py3-none-any.whl"]


def test_a_wheel_missing_from_the_cache_says_to_run_prepare(tmp_path: Path) -> None:
    (tmp_path / "wheels").mkdir()
    venv = _venv(tmp_path, ["pytest-8.3.4"])
    with pytest.raises(ConfigError, match="pytest 8.3.4 .*prepare"):
        images.venv_wheels(venv, tmp_path / "wheels")
    with pytest.raises(ConfigError, match="prepare --packages python_Slugify"):
        images.host_venv(PKG, tmp_path)


def test_inputs_hash_changes_with_each_input(tmp_path: Path) -> None:
    whl = tmp_path / "pytest-8.3.4-py3-none-any.whl"
    whl.write_bytes(b"one")
    base = images.inputs_hash(PKG, ["pytest==8.3.4"], [whl], "sha256:aa")
    assert images.inputs_hash(PKG, ["pytest==8.3.4"], [whl], "sha256:aa") == base
    assert images.inputs_hash(PKG, ["pytest==8.3.4", "x"], [whl], "sha256:aa") != base
    assert images.inputs_hash(PKG, ["pytest==8.3.4"], [whl], "sha256:bb") != base
    assert images.inputs_hash(PKG.model_copy(update={"deselect": ["t"]}), ["pytest==8.3.4"], [whl],
                              "sha256:aa") != base
    whl.write_bytes(b"two")
    assert images.inputs_hash(PKG, ["pytest==8.3.4"], [whl], "sha256:aa") != base
