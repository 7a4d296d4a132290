"""`agentrl envs check` on a machine that is not set up yet: an env that can prepare what it needs does it on first
use, with progress output (repo_fix: sdists + test venvs); a backend that cannot start a sandbox (a kubernetes
namespace that does not exist) is one error up front, not the same failure once per task.

Only the external edges are replaced: pip (repo_fix's fetch/venv build) and the sandbox backend's API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import agentrl.cli.wiring as wiring
from agentrl.cli import main
from agentrl.errors import ConfigError
from agentrl.sandbox import SandboxPool
from agentrl.testing.simulated import SimulatedPool

NAMESPACE_ERROR = ("namespace 'agentrl' does not exist: kubectl apply -k k8s/base, or set "
                   "sandbox.backend.namespace")


class NoNamespaceBackend:
    """A kubernetes control plane whose namespace is missing: every create is refused with the backend's error."""

    name = "kubernetes"

    def __init__(self) -> None:
        self.creates = 0

    async def create(self, spec: Any, labels: dict[str, str]) -> Any:
        self.creates += 1
        raise ConfigError(NAMESPACE_ERROR)

    async def sweep(self, all_runs: bool = False) -> int:
        return 0

    async def destroy(self, handle: Any) -> None:
        return None

    async def close(self) -> None:
        return None


def test_a_backend_that_cannot_start_a_sandbox_is_one_error_up_front(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    backend = NoNamespaceBackend()
    monkeypatch.setattr(wiring, "make_pool", lambda *a, **k: SandboxPool(backend=backend, warm=0, max_sandboxes=4))
    rc = main(["envs", "check", "code_tests", "--sandbox", "kubernetes", "--tasks", "6", "--concurrency", "3"])
    out = capsys.readouterr()
    assert rc == 2
    assert (out.out + out.err).count("does not exist") == 1, out
    assert out.err.startswith("error: namespace 'agentrl' does not exist") and "FAIL" not in out.out
    assert backend.creates == 1  # checked once, before any task


ENV_FILE = '''
from pathlib import Path
from agentrl.errors import ConfigError
from agentrl.testing.simulated import SimulatedEnv
from agentrl.types import TestReport

class NeedsPrepare(SimulatedEnv):
    """Tasks that can only be listed once their data is prepared on this machine."""

    marker = Path({marker!r})

    def prepare(self, say):
        if not self.marker.exists():
            say("needs_prepare: fetching task data (first use)")
            self.marker.write_text("ready")

    def tasks(self):
        if not self.marker.exists():
            raise ConfigError("task data missing: run the prepare command")
        return super().tasks()

    def reference_solution(self, task):
        return str(task.data["number"])

    async def score_solution(self, sandbox, task, solution):
        right = solution == str(task.data["number"])
        return TestReport(passed=int(right), total=1)
'''


def test_envs_check_prepares_what_the_env_needs_on_first_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "prepared"
    env_file = tmp_path / "needs_prepare.py"
    env_file.write_text(ENV_FILE.format(marker=str(marker)))
    monkeypatch.setattr(wiring, "make_pool", lambda *a, **k: SimulatedPool(exec_p50_s=0.001))
    argv = ["envs", "check", f"{env_file}:NeedsPrepare", "--env-option", "tasks=3"]
    assert main(argv) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "fetching task data (first use)" in out and "total: 3/3 tasks pass all tests" in out
    assert main(argv) == 0
    assert "first use" not in capsys.readouterr().out  # prepared once: the second check says nothing about it


def test_repo_fix_prepares_only_the_packages_its_cache_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import agentrl_repo_fix.env as repo_env
    from agentrl_repo_fix.env import RepoFixEnv

    fetched: list[str] = []
    built: list[str] = []

    def fetch_sdist(pkg: Any, cache: Path) -> Path:  # pip download of the hash-checked sdist
        fetched.append(pkg.key)
        target = cache / "sdists" / f"{pkg.key}.tar.gz"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"sdist")
        return target

    def ensure_venv(lock: Any, pkg: Any, cache: Path) -> Path:  # pip install into a fresh venv
        built.append(pkg.key)
        venv = cache / "venvs" / pkg.key
        venv.mkdir(parents=True, exist_ok=True)
        (venv / ".agentrl-ready").write_text("deps")
        return venv

    monkeypatch.setattr(repo_env, "fetch_sdist", fetch_sdist)
    monkeypatch.setattr(repo_env, "ensure_venv", ensure_venv)
    env = RepoFixEnv(cache_dir=str(tmp_path))
    keys = [f"{p}-{v}" for p, v in env.unprepared()]
    assert len(keys) >= 2
    with pytest.raises(ConfigError, match="agentrl_repo_fix prepare"):
        env.ro_binds()  # what the pool needs on the local backend: missing before prepare
    first = tmp_path / "sdists" / f"{keys[0]}.tar.gz"  # one package already cached (sdist + venv)
    first.parent.mkdir(parents=True)
    first.write_bytes(b"sdist")
    (tmp_path / "venvs" / keys[0]).mkdir(parents=True)
    (tmp_path / "venvs" / keys[0] / ".agentrl-ready").write_text("deps")
    said: list[str] = []
    env.prepare(said.append)
    assert fetched == built == keys[1:]
    assert any(f"preparing {keys[1]} (1/{len(keys) - 1}, first use)" in m for m in said)
    assert sum("ready (" in m for m in said) == len(keys) - 1
    assert len(env.ro_binds()) == len(keys) and env.unprepared() == []
    said.clear()
    env.prepare(said.append)
    assert said == [] and fetched == keys[1:]  # a prepared cache: nothing fetched, nothing said


def test_every_run_entry_point_prepares_the_env_on_first_use(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """rollout, train and eval build their env through the composition root's run_env: an env with a prepare hook
    (repo_fix on a fresh install) prepares itself there, with progress, instead of stopping with 'run prepare'."""
    from agentrl.compose import run_env
    from agentrl.config import RolloutConfig

    marker = tmp_path / "prepared"
    env_file = tmp_path / "needs_prepare.py"
    env_file.write_text(ENV_FILE.format(marker=str(marker)))
    env, tasks = run_env(RolloutConfig(env=f"{env_file}:NeedsPrepare", env_options={"tasks": 3},
                                       out=tmp_path / "x.jsonl"))
    assert marker.exists() and len(tasks) == 3
    assert "fetching task data (first use)" in capsys.readouterr().err
