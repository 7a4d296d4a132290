"""Grading the policy cannot tamper with. Owns: reading the agent's repository as data, dropping protected changes,
and running the recorded suite over a pristine copy.

1. After every process of the sandbox user is killed, `tar` (not git: the repo's .git/config could run commands)
   packs the files of the agent's repository; the host reads the archive as data (regular files only, no links).
2. The host compares it with the buggy tree it built itself and keeps only changes to files that are not tests,
   conftest, *.pth, sitecustomize/usercustomize or test/pytest/tox/setup/packaging configuration; dropped paths
   are reported (in the report and in the stored solution).
3. The graded tree = the host's pristine buggy tree + the kept changes. It is unpacked into a new directory with a
   random name (chosen after the policy's processes are dead) and the task's recorded pytest command runs there
   with the package's read-only venv and the grader's own configuration (testrun.GradingPaths: `-c` with the
   original tree's ini, explicit rootdir, conftest cut-off and basetemp: nothing the graded tree holds configures
   pytest): no user site, no plugin autoload, the repository off sys.path until the verdict plugin (loaded first,
   random module name) has started, a per-test timeout (pytest-timeout) and a total timeout; leftovers are killed
   after it.
4. Verdicts come only from the plugin's channel: one MAC'd, sequenced line per test on the test process's stdout
   pipe, whose reader is the sandbox agent (another uid), never a file (testrun.read_channel; the plugin also
   audits the test machinery per test, and tampering scores 0), with value_trace's records of what each test
   compared.
5. The judge (judge.py, here on the host) keeps a pass only if the test's checks saw the values the original tree
   gives (reference_traces: the same suite run twice on the buggy tree + the reference fix, where no policy code
   ran) or plain values it recomputes itself; an overturned pass raises `rigged_comparison`. Reward input:
   passed=1 of total=1 iff every FAIL_TO_PASS and PASS_TO_PASS test passed; the per-test verdicts and the
   FAIL_TO_PASS fraction are outcomes.

Steps 1-2 run in the policy's sandbox (RepoFixEnv.collect), steps 3-4 in a fresh sandbox of the same pool that the
policy never used (RepoFixEnv.grade; the runner's `grading_sandbox = "fresh"` hook): nothing the policy left outside
its repository's kept source files exists there. See docs/envs/repo_fix.md for the threat model and its limit: the
agent's source changes execute in-process with pytest, so nothing in that process is secret from them; what decides
a pass is out of their reach (the judge), up to the forgeries listed there.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from agentrl.errors import PolicyError
from agentrl.sandbox.base import ExecResult
from agentrl.sandbox.client import Sandbox, SandboxFileError, SandboxPathError
from agentrl.types import IntegritySignal, TestOutcome, TestReport
from agentrl_repo_fix import judge, trees
from agentrl_repo_fix.config import REPO
from agentrl_repo_fix.testrun import (
    PLUGIN_SOURCE,
    TRACE_SOURCE,
    ChannelResult,
    GradingPaths,
    grader_ini,
    plugin_input,
    pytest_argv,
    read_channel,
    suite_env,
)

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
    if base in CONFIG_FILES or base.startswith(("pytest", ".pytest", "tox")):
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


class PolicyBrokeRepo(Exception):
    """What the policy left cannot be read as a repository (a task-level failure, scored 0)."""


async def pack_agent_repository(sandbox: Sandbox) -> tuple[trees.Tree, list[str]]:
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
                     timeout_s: float, original: trees.Tree, reference: dict[str, list]) -> TestReport:
    """Run the task's suite over `graded` (run_suite) and score it: the plugin's per-test verdicts, each pass then
    checked by the judge against `reference` (the original package's records, reference_traces). Raises
    GraderNotStarted when the plugin never started (charged to the policy: see the class)."""
    channel, run = await run_suite(sandbox, task, graded, venv, timeout_s=timeout_s, original=original)
    error = None
    if channel.tampered:
        error = "tampering with the test machinery (scored 0): " + "; ".join(channel.tampered[:5])
    elif run.timed_out:
        error = f"the test suite did not finish within {timeout_s:g}s (scored 0)"
    rigged = judge.overturned(channel.passed, channel.traces, reference)
    passed = {**channel.passed, **{t: False for t in rigged}}
    messages = {**channel.messages, **rigged}
    report = verdict(task, passed, messages=messages, error=error, timed_out=run.timed_out,
                     notes=channel.collect_errors)
    if channel.tampered:  # detection, for the integrity monitor (the verdict above already scores it 0)
        report.signals.append(IntegritySignal(name="test_tamper", count=len(channel.tampered),
                                              detail="; ".join(channel.tampered[:5])[:1000]))
    if rigged:
        report.signals.append(IntegritySignal(
            name="rigged_comparison", count=len(rigged),
            detail="; ".join(f"{t}: {why}" for t, why in sorted(rigged.items())[:judge.MAX_REASONS])[:1000]))
    return report


async def reference_traces(sandbox: Sandbox, task: dict[str, Any], original: trees.Tree, venv: str, *,
                           timeout_s: float) -> dict[str, list]:
    """What each FAIL_TO_PASS / PASS_TO_PASS test compares on the original package (nothing of the policy's): its
    records from two runs, where a digest that differs between them (a value that changes from run to run of the
    original itself: an id-based hash, a timestamp) is the wildcard "*"; a test whose two runs made a different
    number of checks, or that failed in either, is left out (judge: no reference). Run before any graded code in
    the sandbox. Raises GraderNotStarted as run_suite does."""
    runs = []
    for _ in range(2):
        channel, _ = await run_suite(sandbox, task, original, venv, timeout_s=timeout_s, original=original)
        runs.append({t: channel.traces[t] for t, ok in channel.passed.items() if ok and t in channel.traces})
    return {t: judge.stable(records, runs[1][t]) for t, records in runs[0].items()
            if t in runs[1] and len(records) == len(runs[1][t])}


async def run_suite(sandbox: Sandbox, task: dict[str, Any], tree: trees.Tree, venv: str, *, timeout_s: float,
                    original: trees.Tree) -> tuple[ChannelResult, ExecResult]:
    """Unpack `tree` in a fresh directory, run the task's suite there with the verdict plugin loaded first and the
    grader's ini (from `original`), and read the verdicts and value records from its channel (the test process's
    stdout pipe, held by the sandbox agent)."""
    token = secrets.token_hex(8)
    root = f"/workspace/.agentrl-grade-{token}"
    repo, plugin, trace = f"{root}/repo", f"agentrl_verdict_{token}", f"agentrl_trace_{token}"
    tests = list(task["fail_to_pass"]) + list(task["pass_to_pass"])
    key = secrets.token_bytes(32)
    ini_name, ini = grader_ini(original)
    paths = GradingPaths(ini=f"{root}/config/{ini_name}", repo=repo, tmp=f"{root}/tmp")
    await sandbox.exec(["mkdir", "-p", repo, f"{root}/home", f"{root}/plugin", f"{root}/config"],
                       timeout=TAR_TIMEOUT_S)
    try:
        await sandbox.write_file(f"{root}/plugin/{plugin}.py", PLUGIN_SOURCE.read_bytes())
        await sandbox.write_file(f"{root}/plugin/{trace}.py", TRACE_SOURCE.read_bytes())
        await sandbox.write_file(paths.ini, ini)
        await sandbox.write_file(f"{root}/tree.tar", trees.to_tar(tree))
        res = await sandbox.exec(["tar", "-xf", f"{root}/tree.tar", "-C", repo], timeout=TAR_TIMEOUT_S)
        if res.exit_code != 0:
            raise PolicyBrokeRepo(f"unpacking the graded tree failed: {res.stderr[-300:]}")
        argv = pytest_argv(f"{venv}/bin/python", list(task["tests"]), None, deselect=list(task.get("deselect", [])),
                           per_test_timeout_s=float(task["per_test_timeout_s"]), plugin=plugin, grading=paths)
        limit = CHANNEL_BYTES_PER_TEST * len(tests) + CHANNEL_BASE_BYTES
        stdin = plugin_input(key, tests, repo, str(task["pythonpath"]),
                             sorted(p for p in tree if protected(p, list(task["tests"])) is not None),
                             trace=trace, tmp=paths.tmp)
        run = await _with_output_limit(sandbox, limit).exec(
            argv, cwd=repo, timeout=timeout_s, kill_leftovers=True, stdin=stdin,
            env=suite_env(f"{root}/plugin", f"{root}/home"))
        channel = read_channel(run.stdout, key, tests, exit_code=run.exit_code,
                               truncated=len(run.stdout.encode()) >= limit)
        if not channel.started:
            raise GraderNotStarted(f"the verdict plugin did not start ({'timed out' if run.timed_out else 'exit'} "
                                   f"{run.exit_code}): {run.stderr[-500:]}")
        return channel, run
    finally:
        await sandbox.exec(["rm", "-rf", "--", root], timeout=TAR_TIMEOUT_S, kill_leftovers=True)


# a test's lines: its verdict (sequence number, index, outcome, MAC) and its value records (value_trace: at most
# MAX_LINE_BYTES, 12 KiB); failure messages: the base. What the sandbox's agent may buffer for the run.
CHANNEL_BYTES_PER_TEST = 16 * 1024
CHANNEL_BASE_BYTES = 1 << 20


def _with_output_limit(sandbox: Sandbox, limit: int) -> Sandbox:
    """The same sandbox (same agent connection) whose execs keep up to `limit` bytes per stream."""
    if limit <= sandbox.spec.output_limit:
        return sandbox
    return Sandbox(sandbox.handle, sandbox.spec.model_copy(update={"output_limit": limit}), client=sandbox.client)


class GraderNotStarted(PolicyError):
    """The grader's plugin never reported. Scored as the policy's (`finalize_failed`, reward 0), as failure
    attribution records every finalize failure without proof of an outside cause: pytest reads nothing of the
    graded tree before the plugin starts (the grader's own ini, rootdir and conftest cut-off), but nothing proves
    the sandbox failed either, and an unscored verdict is what a policy would aim for."""

    kind = "finalize_failed"


def verdict(task: dict[str, Any], passed: dict[str, bool], *, messages: dict[str, str] | None = None,
            error: str | None = None, timed_out: bool = False, dropped: dict[str, str] | None = None,
            notes: list[str] | None = None) -> TestReport:
    """The TestReport: 1/1 iff every FAIL_TO_PASS and PASS_TO_PASS test passed, else 0/1; details as outcomes."""
    messages = messages or {}
    f2p, p2p = list(task["fail_to_pass"]), list(task["pass_to_pass"])
    f2p_ok = [t for t in f2p if passed.get(t) is True]
    p2p_bad = [t for t in p2p if passed.get(t) is not True]
    resolved = error is None and len(f2p_ok) == len(f2p) and not p2p_bad
    summary = (f"FAIL_TO_PASS {len(f2p_ok)}/{len(f2p)} (fraction {len(f2p_ok) / len(f2p):.3f}), "
               f"PASS_TO_PASS {len(p2p) - len(p2p_bad)}/{len(p2p)}" + (" [suite timed out]" if timed_out else ""))
    if notes:
        summary += "; collection errors: " + "; ".join(notes[:3])
    if dropped:
        summary += "; dropped changes: " + ", ".join(f"{p} ({why})" for p, why in sorted(dropped.items()))
    outcomes = [TestOutcome(name="resolved", passed=resolved, message=summary if error is None else error)]
    outcomes += [TestOutcome(name=f"FAIL_TO_PASS::{t}", passed=passed.get(t) is True,
                             message=messages.get(t, "" if passed.get(t) is not None else "not run"))
                 for t in f2p]
    outcomes += [TestOutcome(name=f"PASS_TO_PASS::{t}", passed=False,
                             message=messages.get(t, "not run")) for t in p2p_bad[:50]]
    return TestReport(passed=int(resolved), total=1, outcomes=outcomes, error=error)
