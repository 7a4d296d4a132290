"""Grading the policy cannot tamper with. Owns: reading the agent's repository as data, dropping protected changes,
and running the recorded suite over a pristine copy.

1. After every process of the sandbox user is killed, `tar` (not git: the repo's .git/config could run commands)
   packs the files of the agent's repository; the host reads the archive as data (regular files only, no links).
2. The host compares it with the buggy tree it built itself and keeps only changes to files that are not tests,
   conftest, *.pth, sitecustomize/usercustomize or test/pytest/tox/setup/packaging configuration; dropped paths
   are reported (in the report and in the stored solution).
3. The graded tree = the host's pristine buggy tree + the kept changes. It is unpacked into a new directory with a
   random name (chosen after the policy's processes are dead) and the task's recorded pytest command runs there
   with the package's read-only venv: no user site, no plugin autoload, a per-test timeout (pytest-timeout) and a
   total timeout; leftovers are killed after it.
4. Verdicts come only from the JUnit XML report (never stdout). Reward input: passed=1 of total=1 iff every
   FAIL_TO_PASS and PASS_TO_PASS test passed; the per-test verdicts and the FAIL_TO_PASS fraction are outcomes.

Steps 1-2 run in the policy's sandbox (RepoFixEnv.collect), step 3-4 in a fresh sandbox of the same pool that the
policy never used (RepoFixEnv.grade; the runner's `grading_sandbox = "fresh"` hook): nothing the policy left outside
its repository's kept source files exists there. See docs/envs/repo_fix.md for the threat model and its limit: the
agent's source changes execute in-process with pytest, like any SWE-style grader.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from agentrl.sandbox.client import Sandbox, SandboxFileError, SandboxPathError
from agentrl.types import TestOutcome, TestReport
from agentrl_repo_fix import trees
from agentrl_repo_fix.config import REPO
from agentrl_repo_fix.testrun import parse_junit, pytest_argv, suite_env

CONFIG_FILES = {"conftest.py", "sitecustomize.py", "usercustomize.py", "setup.py", "setup.cfg", "pyproject.toml",
                "tox.ini", "pytest.ini", "noxfile.py", ".coveragerc", "MANIFEST.in", "requirements.txt"}
TEST_DIRS = {"test", "tests", "testing"}
TAR_TIMEOUT_S = 30.0


def protected(path: str, test_paths: list[str]) -> str | None:
    """Why a change to `path` is dropped before grading, or None when it is kept."""
    parts = path.split("/")
    base = parts[-1]
    if base.endswith(".pth"):
        return "path configuration (.pth)"
    if base in CONFIG_FILES or base.startswith(("pytest", "tox")):
        return "test/build configuration"
    if any(p in TEST_DIRS for p in parts[:-1]) or base.startswith("test_") or base.endswith("_test.py") \
            or any(path == t or path.startswith(t.rstrip("/") + "/") for t in test_paths):
        return "test file"
    return None


def merge(buggy: trees.Tree, agent: trees.Tree, test_paths: list[str]) -> tuple[trees.Tree, dict[str, str]]:
    """(graded tree, {dropped path: why}): the buggy tree with the agent's changes to unprotected files."""
    graded = dict(buggy)
    dropped: dict[str, str] = {}
    for path in sorted(set(buggy) | set(agent)):
        if buggy.get(path) == agent.get(path):
            continue
        why = protected(path, test_paths)
        if why is not None:
            dropped[path] = why
        elif path in agent:
            graded[path] = agent[path]
        else:
            del graded[path]
    return graded, dropped


HARNESS_MARKERS = (b"pytest", b"junit", b"pluggy", b"settrace", b"setprofile", b"os._exit", b"faulthandler")


def harness_markers(buggy: trees.Tree, graded: trees.Tree) -> list[str]:
    """`path: marker` for every added line of the kept changes that names the test harness. The agent's source runs
    in-process with pytest, so a "fix" that reaches into pytest could forge the report; such a change scores 0.
    A speed bump, not a proof (an obfuscated reference passes): see docs/envs/repo_fix.md."""
    found = []
    for path in sorted(graded):
        old = set(buggy.get(path, b"").splitlines())
        added = [ln for ln in graded[path].splitlines() if ln not in old]
        for marker in HARNESS_MARKERS:
            if any(marker in ln.lower() for ln in added):
                found.append(f"{path}: {marker.decode()}")
    return found


class PolicyBrokeRepo(Exception):
    """What the policy left cannot be read as a repository (a task-level failure, scored 0)."""


async def read_agent_tree(sandbox: Sandbox) -> tuple[trees.Tree, list[str]]:
    """The files of the agent's repository (no .git), as data. Raises PolicyBrokeRepo when it cannot be packed."""
    archive = f"/workspace/.agentrl-pack-{secrets.token_hex(8)}.tar"
    res = await sandbox.exec(["tar", "-C", REPO, "--exclude=./.git", "--exclude=__pycache__", "-cf", archive, "."],
                             timeout=TAR_TIMEOUT_S, kill_leftovers=True)
    try:
        if res.timed_out or res.exit_code not in (0, 1):  # 1: a file changed while read (nothing runs now)
            raise PolicyBrokeRepo(f"packing {REPO} failed: {(res.stderr or res.stdout)[-300:]}")
        try:
            data = await sandbox.read_bytes(archive)
        except (SandboxFileError, SandboxPathError, FileNotFoundError) as exc:
            raise PolicyBrokeRepo(f"the packed repository could not be read: {exc}") from None
        try:
            return await asyncio.to_thread(trees.from_tar, data)  # parsing a whole repo: off the event loop
        except (ValueError, OSError) as exc:  # tarfile.TarError is an Exception subclass: caught below
            raise PolicyBrokeRepo(f"the packed repository is unusable: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - a malformed archive is the policy's repo, not infra
            raise PolicyBrokeRepo(f"the packed repository is unusable: {type(exc).__name__}: {exc}") from None
    finally:
        await sandbox.exec(["rm", "-f", "--", archive], timeout=TAR_TIMEOUT_S)


async def run_graded(sandbox: Sandbox, task: dict[str, Any], graded: trees.Tree, venv: str, *,
                     timeout_s: float) -> TestReport:
    """Unpack `graded` in a fresh directory, run the task's suite there, and read the verdicts from the report."""
    root = f"/workspace/.agentrl-grade-{secrets.token_hex(8)}"
    repo, report = f"{root}/repo", f"{root}/report.xml"
    await sandbox.exec(["mkdir", "-p", repo, f"{root}/home"], timeout=TAR_TIMEOUT_S)
    try:
        await sandbox.write_file(f"{root}/tree.tar", trees.to_tar(graded))
        res = await sandbox.exec(["tar", "-xf", f"{root}/tree.tar", "-C", repo], timeout=TAR_TIMEOUT_S)
        if res.exit_code != 0:
            raise PolicyBrokeRepo(f"unpacking the graded tree failed: {res.stderr[-300:]}")
        argv = pytest_argv(f"{venv}/bin/python", list(task["tests"]), report, deselect=list(task.get("deselect", [])),
                           per_test_timeout_s=float(task["per_test_timeout_s"]))
        run = await sandbox.exec(argv, cwd=repo, timeout=timeout_s, kill_leftovers=True,
                                 env=suite_env(f"{repo}/{task['pythonpath']}", f"{root}/home"))
        try:
            data = await sandbox.read_bytes(report)
        except (FileNotFoundError, SandboxFileError, SandboxPathError):
            why = "timed out" if run.timed_out else f"exited {run.exit_code}"
            return verdict(task, {}, error=f"the test run wrote no report ({why}): {run.stdout[-300:]}")
        result = parse_junit(data)
        return verdict(task, result.passed, messages=result.messages, error=result.error,
                       timed_out=run.timed_out)
    finally:
        await sandbox.exec(["rm", "-rf", "--", root], timeout=TAR_TIMEOUT_S, kill_leftovers=True)


def verdict(task: dict[str, Any], passed: dict[str, bool], *, messages: dict[str, str] | None = None,
            error: str | None = None, timed_out: bool = False, dropped: dict[str, str] | None = None) -> TestReport:
    """The TestReport: 1/1 iff every FAIL_TO_PASS and PASS_TO_PASS test passed, else 0/1; details as outcomes."""
    messages = messages or {}
    f2p, p2p = list(task["fail_to_pass"]), list(task["pass_to_pass"])
    f2p_ok = [t for t in f2p if passed.get(t) is True]
    p2p_bad = [t for t in p2p if passed.get(t) is not True]
    resolved = error is None and len(f2p_ok) == len(f2p) and not p2p_bad
    summary = (f"FAIL_TO_PASS {len(f2p_ok)}/{len(f2p)} (fraction {len(f2p_ok) / len(f2p):.3f}), "
               f"PASS_TO_PASS {len(p2p) - len(p2p_bad)}/{len(p2p)}" + (" [suite timed out]" if timed_out else ""))
    if dropped:
        summary += "; dropped changes: " + ", ".join(f"{p} ({why})" for p, why in sorted(dropped.items()))
    outcomes = [TestOutcome(name="resolved", passed=resolved, message=summary if error is None else error)]
    outcomes += [TestOutcome(name=f"FAIL_TO_PASS::{t}", passed=passed.get(t) is True,
                             message=messages.get(t, "" if passed.get(t) is not None else "not run"))
                 for t in f2p]
    outcomes += [TestOutcome(name=f"PASS_TO_PASS::{t}", passed=False,
                             message=messages.get(t, "not run")) for t in p2p_bad[:50]]
    return TestReport(passed=int(resolved), total=1, outcomes=outcomes, error=error)
