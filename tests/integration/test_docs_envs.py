"""docs/envs.md is executed: every ```bash block runs, in order, in an empty directory, and must succeed.

The commands run in a throwaway virtual environment that sees this interpreter's packages (a .pth that adds its
site-packages) and has `agentrl` / `pip` launchers, so `pip install -e myenv` installs into the throwaway venv only.
PYTHONPATH is passed through, so the agentrl under test is the one imported.
"""

from __future__ import annotations

import os
import re
import site
import subprocess
import venv
from pathlib import Path

import pytest

from agentrl.store import read_trajectories

DOC = Path(__file__).resolve().parents[2] / "docs" / "envs.md"
pytestmark = pytest.mark.bwrap


def bash_blocks(markdown: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^```bash\n(.*?)^```", markdown, flags=re.M | re.S)]


def _throwaway_venv(path: Path) -> Path:
    venv.create(path, with_pip=False, symlinks=True)
    site_dir = next(path.glob("lib/python*/site-packages"))
    (site_dir / "_shared.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in site.getsitepackages()))
    launchers = {"agentrl": "from agentrl.cli import main", "pip": "from pip._internal.cli.main import main"}
    for name, line in launchers.items():
        exe = path / "bin" / name
        exe.write_text(f"#!{path / 'bin' / 'python'}\nimport sys\n{line}\nsys.exit(main())\n")
        exe.chmod(0o755)
    return path / "bin"


def test_blocks_are_found() -> None:
    blocks = bash_blocks(DOC.read_text())
    assert len(blocks) >= 4 and blocks[0].strip() == "agentrl envs init myenv"


def test_every_command_in_docs_envs_runs(tmp_path: Path) -> None:
    bin_dir = _throwaway_venv(tmp_path / "venv")
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("VIRTUAL_ENV", None)
    outputs = []
    for block in bash_blocks(DOC.read_text()):
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=work, env=env, capture_output=True,
                           text=True, timeout=900)
        assert r.returncode == 0, f"docs/envs.md block failed:\n{block}\n--- stdout\n{r.stdout[-3000:]}\n" \
                                  f"--- stderr\n{r.stderr[-3000:]}"
        outputs.append(r.stdout)
    text = "\n".join(outputs)
    assert re.search(r"^myenv\s+Write a small Python function", text, flags=re.M), "envs list does not show myenv"
    assert text.count("total: 3/3 tasks pass all tests") >= 3  # envs check by name, by file, by module
    trajs = read_trajectories(work / "runs" / "myenv.jsonl")
    assert len(trajs) == 1 and {t.env for t in trajs} == {"./myenv/myenv/env.py:MyEnv"}
    assert all(t.reward is not None for t in trajs), [t.status for t in trajs]  # scored, no infra error
