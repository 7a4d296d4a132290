"""tests/conftest.py's bubblewrap gating, run in a child pytest on a machine without bubblewrap (an empty PATH):
a test marked `bwrap` and a test failing because bubblewrap is missing are skipped with the reason and the fix;
an unrelated failure stays a failure; AGENTRL_REQUIRE_BWRAP=1 turns the skips back into failures."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
CASES = '''
import pytest

@pytest.mark.bwrap
def test_marked():
    raise AssertionError("would need a sandbox")

def test_needs_bwrap():
    raise RuntimeError("bubblewrap ('bwrap') not found on PATH: install bubblewrap")

def test_unrelated():
    assert 1 == 2
'''


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_cases.py").write_text(CASES)
    empty = tmp_path / "bin"
    empty.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if k != "AGENTRL_REQUIRE_BWRAP"}
    child_env = {**base, "PATH": str(empty), **env}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfs", "-p", "no:cacheprovider", "-o", "addopts=",
                           str(tmp_path)], cwd=tmp_path, env=child_env, capture_output=True, text=True, timeout=120)


def test_missing_bwrap_skips_with_the_fix(tmp_path: Path) -> None:
    r = _run(tmp_path)
    assert "1 failed, 2 skipped" in r.stdout, r.stdout + r.stderr
    assert "FAILED test_cases.py::test_unrelated" in r.stdout
    assert r.stdout.count("bubblewrap is not installed: apt-get install -y bubblewrap") == 2, r.stdout


def test_require_bwrap_turns_skips_into_failures(tmp_path: Path) -> None:
    r = _run(tmp_path, AGENTRL_REQUIRE_BWRAP="1")
    assert "3 failed" in r.stdout, r.stdout + r.stderr


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap on this machine's PATH")
def test_working_bwrap_rewrites_nothing(tmp_path: Path) -> None:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_cases.py").write_text(CASES)
    env = {k: v for k, v in os.environ.items() if k != "AGENTRL_REQUIRE_BWRAP"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", str(tmp_path)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    from_conftest = subprocess.run(["bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/",
                                    "--", "/bin/true"], capture_output=True)
    if from_conftest.returncode != 0:
        pytest.skip("bubblewrap cannot create namespaces on this machine")
    assert "3 failed" in r.stdout, r.stdout + r.stderr
