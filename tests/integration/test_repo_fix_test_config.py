"""Test configuration by construction (issue 31, item 5), through the real grader (local bubblewrap sandbox,
`RepoFixEnv.score_solution`): grading runs pytest with the grader's own ini file (`-c`, taken from the task's
original tree), an explicit rootdir and conftest cut-off, so no configuration file the policy leaves in its tree is
read, whatever its name.

Each planted file below would change grading if pytest read it: the ini files ask for pytest 99 (pytest then
refuses to start, and the old grader raised GraderFailed), the conftest turns every report into a pass. The old
grader's deny-list caught all but `.pytest.ini`, which pytest reads before `setup.cfg` / `tox.ini` /
`pyproject.toml`: the policy configured the run that judged it. Now every one is ignored by construction, dropped
before grading, and reported as a protected path edit.
"""

from __future__ import annotations

import shutil
import uuid
from typing import Any

import pytest
from agentrl_repo_fix import RepoFixEnv, trees

from agentrl.sandbox import SandboxPool

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")

PLANTED = {
    ".pytest.ini": "[pytest]\nminversion = 99\n",
    "pytest.ini": "[pytest]\nminversion = 99\n",
    "tox.ini": "[pytest]\nminversion = 99\n",
    "setup.cfg": "[tool:pytest]\nminversion = 99\n",
    "pyproject.toml": "[tool.pytest.ini_options]\nminversion = \"99\"\n",
    "inflection/conftest.py": (
        "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n    rep = outcome.get_result()\n    rep.outcome, rep.longrepr = 'passed', None\n"),
}


@pytest.fixture(scope="module")
def env() -> RepoFixEnv:
    env = RepoFixEnv(packages=["inflection"])
    env.prepare(say=lambda _: None)
    return env


async def _score(env: RepoFixEnv, task: Any, solution: str) -> Any:
    async with SandboxPool(backend="local", spec=env.sandbox_spec, warm=1, max_sandboxes=1,
                           run_id=uuid.uuid4().hex[:8], backend_options={"ro_binds": env.ro_binds()}) as pool:
        async with pool.lease() as sb:
            return await env.score_solution(sb, task, solution)


def _with_file(env: RepoFixEnv, task: Any, path: str, *, fixed: bool) -> str:
    """A diff against the buggy tree: the reference fix (or nothing) plus the planted file."""
    buggy = env.buggy(task.data)
    base = trees.apply_diff(buggy, env.reference_solution(task) or "") if fixed else buggy
    old = base.get(path, b"")
    return trees.diff(buggy, {**base, path: old + b"\n" + PLANTED[path].encode()})


@pytest.mark.parametrize("path", sorted(PLANTED))
async def test_a_planted_configuration_file_is_never_read(env: RepoFixEnv, path: str) -> None:
    """The reference fix plus the planted file: scored on its merits (1), the file reported, not read."""
    task = env.tasks()[0]
    report = await _score(env, task, _with_file(env, task, path, fixed=True))
    assert (report.passed, report.total, report.error) == (1, 1, None), report.outcomes[:2]
    assert [s.name for s in report.signals] == ["protected_path_edit"] and path in report.signals[0].detail


@pytest.mark.parametrize("path", sorted(PLANTED))
async def test_a_planted_configuration_file_earns_nothing(env: RepoFixEnv, path: str) -> None:
    """The bug left in place plus the planted file: 0, never a grading crash."""
    task = env.tasks()[0]
    report = await _score(env, task, _with_file(env, task, path, fixed=False))
    assert (report.passed, report.total) == (0, 1), report.outcomes[:2]
    assert "FAIL_TO_PASS 0/" in report.outcomes[0].message, report.outcomes[0].message
