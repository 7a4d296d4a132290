"""`envs init` scaffolds and `--env` specs (`path/to/file.py:Class`, `package.module:Class`): what gets written,
how a spec is loaded, and the errors that name the spec and the fix."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.cli.envs_init import class_name, scaffold
from agentrl.envs import Env, get_env
from agentrl.envs.registry import load_env_class
from agentrl.errors import ConfigError

LONE = '''
from agentrl.envs import Env, Task

class Lone(Env):
    """A lone-file env."""
    def tasks(self):
        return [Task(id="t", prompt="p")]

class NotAnEnv:
    pass
'''


def test_class_names() -> None:
    assert [class_name(n) for n in ("myenv", "my_env", "my-env", "calc", "web_nav")] == \
        ["MyEnv", "MyEnv", "MyEnv", "CalcEnv", "WebNavEnv"]


def test_scaffold_writes_a_package_with_an_entry_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["envs", "init", "my-env"]) == 0
    root = tmp_path / "my-env"
    meta = tomllib.loads((root / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["agentrl.envs"] == {"my-env": "my_env.env:MyEnv"}
    assert (root / "my_env" / "__init__.py").is_file() and (root / "tests" / "test_env.py").is_file()
    for f in root.rglob("*.py"):  # every generated file is valid Python
        compile(f.read_text(), str(f), "exec")
    assert "pip install -e my-env" in capsys.readouterr().out
    env = get_env(f"{root}/my_env/env.py:MyEnv")
    tasks = list(env.tasks())
    assert env.action_format == "hermes" and [t.name for t in env.tools] == ["write_file"]
    assert len(tasks) == 3 and all(env.reference_solution(t) for t in tasks)
    assert env.name == f"{root}/my_env/env.py:MyEnv"  # trajectories name a spec get_env can load again


def test_scaffold_refuses_a_bad_name_or_a_used_dir(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="lowercase"):
        scaffold("My Env", tmp_path / "x")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "f").write_text("")
    with pytest.raises(ConfigError, match="not empty; pass --dir"):
        scaffold("ok", tmp_path / "used")


def test_file_and_module_specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "lone.py").write_text(LONE)
    monkeypatch.chdir(tmp_path)
    env = get_env("./lone.py:Lone")
    assert isinstance(env, Env) and [t.id for t in env.tasks()] == ["t"]
    pkg = tmp_path / "pkgspec"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "envmod.py").write_text(LONE.replace("Lone", "InPkg"))
    monkeypatch.syspath_prepend(str(tmp_path))
    by_module = load_env_class("pkgspec.envmod:InPkg")
    assert by_module is load_env_class("pkgspec/envmod.py:InPkg")  # a file in a package is that package's module


@pytest.mark.parametrize(("spec", "message"), [
    ("./missing.py:X", "file './missing.py' does not exist"),
    ("./lone.py:Nope", "Nope does not exist in .* \\(Env classes there: Lone\\)"),
    ("./lone.py:NotAnEnv", "NotAnEnv is not an agentrl.envs.Env subclass"),
    ("no_such_module_xyz:Env", "cannot import no_such_module_xyz"),
    ("./lone.py:", "expected path/to/file.py:Class or package.module:Class"),
])
def test_spec_errors_name_the_spec(spec: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "lone.py").write_text(LONE)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=message):
        get_env(spec)


def test_unknown_name_mentions_specs() -> None:
    with pytest.raises(ConfigError, match="--env path/to/file.py:Class"):
        get_env("no_such_env")


def test_cli_reports_a_bad_spec_with_exit_2(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "envs", "check", "./nope.py:X"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "nope.py" in r.stderr and "does not exist" in r.stderr
