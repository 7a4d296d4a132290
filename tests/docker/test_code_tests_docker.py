"""The code_tests env end to end on docker sandboxes, run as a user runs it (the CLI in a subprocess): every reference
solution passes every test, and a rollout stores trajectories that were not infrastructure failures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.store import read_trajectories

pytestmark = pytest.mark.docker


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.mark.parametrize("options", [[], ["--env-option", "source=humaneval", "--tasks", "40"]],
                         ids=["easy", "humaneval-40"])
def test_envs_check_passes_every_reference_solution_on_docker(options: list[str]) -> None:
    r = _cli("envs", "check", "code_tests", "--sandbox", "docker", *options)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    total = [line for line in r.stdout.splitlines() if line.startswith("total:")]
    assert total, r.stdout[-2000:]
    done = total[0].removeprefix("total: ").partition(" tasks pass all tests")[0]
    passed, n = done.split("/")
    assert passed == n and int(n) >= (40 if options else 30), total[0]


def test_rollout_on_docker_stores_scored_trajectories(eos_prone_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    r = _cli("rollout", "--sandbox", "docker", "--engine", "local", "--env", "code_tests",
             "--model", str(eos_prone_model), "--tasks", "2", "--group-size", "2", "--max-turns", "2",
             "--max-new-tokens", "32", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    trajs = read_trajectories(out)
    assert len(trajs) == 4
    assert all(t.status != "infra_error" for t in trajs), [(t.status, t.error) for t in trajs]
    assert all(t.tests is not None and t.tests.total > 0 for t in trajs)  # the tests ran in the container
