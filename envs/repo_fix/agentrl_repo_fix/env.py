"""RepoFixEnv: fix a synthesized bug in a real package's repository; reward 1 iff its failing tests and all its other
tests pass (grading.py), else 0.

Episode: setup() unpacks the buggy tree (built on the host from the hash-checked sdist + the task's bug diff) at
/repo (a writable directory every backend provides: `sandbox_spec.writable_dirs`) as a fresh one-commit git
repository (no history, no clean copy anywhere in the sandbox: the package is not installed in its venv, and no
.pyc is shipped). The prompt names the failing tests with a trimmed
failure message. Tools: bash (one persistent shell per trajectory, shell.py) / str_replace_editor / submit
(tools.py).
Grading runs in a FRESH sandbox (`grading_sandbox = "fresh"`): collect() packs the agent's repository once, as data,
in its own sandbox (the graded tree and the stored solution are both built from that one pack), the runner returns
that sandbox, and grade() runs the suite over the graded tree in a second sandbox the policy never used.
finalize() does both steps in one given sandbox (solution() does the first), for callers that hold only one
(score_solution: where nothing of a policy ran, only our setup and `git apply` of a diff).
Where the package's test venv is depends on the backend: the local backend binds the host venv (lockfile.py)
read-only at its host path (`ro_binds()`); on docker and kubernetes each task names its package's image
(`sandbox_image()`, built by `python -m agentrl_repo_fix images`), which carries the venv at `images.IMAGE_VENV`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.envs import Env, Submission, Task, register_env
from agentrl.errors import ConfigError
from agentrl.sandbox.base import SandboxSpec
from agentrl.sandbox.client import Sandbox
from agentrl.types import IntegritySignal, TestOutcome, TestReport, ToolCall, ToolResult
from agentrl_repo_fix import grading, images, trees
from agentrl_repo_fix.build import TASK_FORMAT
from agentrl_repo_fix.config import REPO, SYSTEM_PROMPT, TOOLS, parse_options
from agentrl_repo_fix.lockfile import DEFAULT_LOCKFILE, default_cache_dir, ensure_venv, fetch_sdist, load_lockfile
from agentrl_repo_fix.shell import CLIENT_GRACE_S, ShellSessions
from agentrl_repo_fix.testrun import node_id
from agentrl_repo_fix.tools import run_bash, run_editor

SETUP_TIMEOUT_S = 60.0
PROMPT_TESTS = 5
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1"}  # the sandbox's /etc is not readable by its user: no system gitconfig


def load_tasks(path: Path, split: str, packages: list[str]) -> list[dict[str, Any]]:
    if not path.exists():
        raise ConfigError(f"repo_fix tasks_file {path} does not exist: build one with "
                          "`python -m agentrl_repo_fix build --out FILE`")
    out = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{path}:{lineno}: not JSON ({exc})") from None
        if not isinstance(row, dict) or row.get("format") != TASK_FORMAT:
            raise ConfigError(f"{path}:{lineno}: not a {TASK_FORMAT} task (rebuild the task file)")
        if (split == "all" or row["split"] == split) and (not packages or row["package"] in packages):
            out.append(row)
    return out


def task_prompt(row: dict[str, Any], files: set[str]) -> str:
    f2p = [node_id(t, files) for t in row["fail_to_pass"]]
    shown = "\n".join(f"  - {t}" for t in f2p[:PROMPT_TESTS])
    more = f"\n  ... and {len(f2p) - PROMPT_TESTS} more" if len(f2p) > PROMPT_TESTS else ""
    first = f2p[0]
    message = row.get("failure_messages", {}).get(row["fail_to_pass"][0], "")
    return (f"The repository at {REPO} ({row['package']} {row['version']}) has a bug: these tests fail:\n"
            f"{shown}{more}\n\nFailure of {first} (trimmed):\n{message}\n\n"
            f"Run the tests from {REPO} with: python -m pytest {' '.join(row['tests'])}\n"
            "Fix the bug in the package's source code, then call submit.")


@register_env("repo_fix")
class RepoFixEnv(Env):
    """Fix a synthesized bug in a real Python package; graded by the package's own tests (all-or-nothing)."""

    action_format = "hermes"
    system_prompt = SYSTEM_PROMPT
    tools = TOOLS
    sandbox_spec = SandboxSpec(memory="2g", disk="512m", pids=512, default_timeout_s=60.0, writable_dirs=(REPO,))
    grading_sandbox = "fresh"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.config = parse_options(options)
        self.cache = self.config.cache_dir or default_cache_dir()
        self._rows: list[dict[str, Any]] | None = None
        self._buggy: dict[str, trees.Tree] = {}  # per task id (derived data, not per-trajectory state)
        self._original: dict[str, trees.Tree] = {}  # per task id: buggy + reference fix (what the judge trusts)
        self._reference: dict[str, dict[str, list]] = {}  # per task id: the original's value records (judge.py)
        self.shells = ShellSessions()  # each sandbox's bash session (its pid: kept here, out of the policy's reach)

    # -- tasks

    def rows(self) -> list[dict[str, Any]]:
        if self._rows is None:
            self._rows = load_tasks(self.config.tasks_file, self.config.split, self.config.packages)
        return self._rows

    def tasks(self) -> list[Task]:
        return [Task(id=row["id"], prompt=task_prompt(row, self._files(row)), data=row) for row in self.rows()]

    def _files(self, row: dict[str, Any]) -> set[str]:
        """The file names of the task's repository (from the bug diff's sdist when cached, else none)."""
        sdist = self.cache / "sdists" / f"{row['package']}-{row['version']}.tar.gz"
        return set(self.buggy(row)) if sdist.exists() else set()

    def prepare(self, say: Callable[[str], None] = print) -> None:
        """First use (`agentrl envs check` calls it): fetch the hash-checked sdist and build the test venv of every
        package this env's tasks use that the cache lacks, as `python -m agentrl_repo_fix prepare` does, saying
        what it does. Blocking (pip): call it off the event loop. On a prepared cache it only looks at files."""
        missing = self.unprepared()
        if not missing:
            return
        lock = load_lockfile(DEFAULT_LOCKFILE)
        locked = {(p.name, p.version): p for p in lock.package}
        for i, key in enumerate(missing, 1):
            pkg = locked.get(key)
            if pkg is None:
                raise ConfigError(f"repo_fix: tasks use {key[0]} {key[1]}, which is not in {DEFAULT_LOCKFILE}: "
                                  "rebuild the task file (python -m agentrl_repo_fix build)")
            say(f"repo_fix: preparing {pkg.key} ({i}/{len(missing)}, first use): sdist + test venv in {self.cache}")
            t0 = time.monotonic()
            fetch_sdist(pkg, self.cache)
            ensure_venv(lock, pkg, self.cache)
            say(f"repo_fix: {pkg.key} ready ({time.monotonic() - t0:.0f}s)")

    def unprepared(self) -> list[tuple[str, str]]:
        """(package, version) of this env's tasks whose sdist or test venv is not in the cache, in task order."""
        out: list[tuple[str, str]] = []
        for row in self.rows():
            key = (row["package"], row["version"])
            stem = f"{key[0]}-{key[1]}"
            ready = ((self.cache / "sdists" / f"{stem}.tar.gz").exists()
                     and (self.cache / "venvs" / stem / ".agentrl-ready").exists())
            if not ready and key not in out:
                out.append(key)
        return out

    def venv(self, row: Any) -> Path:
        path = self.cache / "venvs" / f"{row['package']}-{row['version']}"
        if not (path / ".agentrl-ready").exists():
            raise ConfigError(f"repo_fix: the test venv {path} is missing: run `python -m agentrl_repo_fix prepare "
                              f"--packages {row['package']}`")
        return path

    def sandbox_image(self, task: Task) -> str:
        """The package's image on docker / kubernetes (the local backend ignores it)."""
        return images.image_name(task.data["package"], task.data["version"], self.config.image_repository)

    def sandbox_venv(self, sandbox: Sandbox, row: Any) -> str:
        """The test venv's path inside `sandbox`: the host venv bound read-only on the local backend, else the
        fixed path in the package's image."""
        if sandbox.handle.backend == "local":
            return str(self.venv(row))
        return images.IMAGE_VENV

    def ro_binds(self) -> list[str]:
        """Host paths a local sandbox must see read-only: the tasks' test venvs."""
        return sorted({str(self.venv(row)) for row in self.rows()})

    def pristine(self, row: Any) -> trees.Tree:
        sdist = self.cache / "sdists" / f"{row['package']}-{row['version']}.tar.gz"
        if not sdist.exists():
            raise ConfigError(f"repo_fix: {sdist} is missing: run `python -m agentrl_repo_fix prepare`")
        return trees.from_sdist(sdist)

    def original(self, row: Any) -> trees.Tree:
        """The tree whose behaviour the judge trusts: the buggy tree with the task's reference fix (for a built
        task, the package as released). Grading takes its pytest configuration from here too."""
        if row["id"] not in self._original:
            self._original[row["id"]] = trees.apply_diff(self.buggy(row), row["reference_diff"])
        return self._original[row["id"]]

    def buggy(self, row: Any) -> trees.Tree:
        if row["id"] not in self._buggy:
            self._buggy[row["id"]] = trees.apply_diff(self.pristine(row), row["bug_diff"])
        return self._buggy[row["id"]]

    # -- episode

    async def setup(self, sandbox: Sandbox, task: Task) -> None:
        if REPO not in sandbox.spec.writable_dirs:
            raise ConfigError(f"repo_fix needs a writable {REPO} in its sandboxes: create the pool with "
                              "agentrl.envs.spec_for_env(spec, env) or a SandboxSpec with writable_dirs=('/repo',)")
        archive = "/workspace/.agentrl-setup.tar"
        await sandbox.write_file(archive, trees.to_tar(self.buggy(task.data)))
        script = (f"set -e; mkdir -p {REPO}; tar -xf {archive} -C {REPO}; rm -f {archive}; cd {REPO}; "
                  "git init -q; git add -A; git -c user.name=agentrl -c user.email=agentrl@localhost "
                  "-c commit.gpgsign=false commit -qm 'initial commit'")
        res = await sandbox.exec(["sh", "-c", script], timeout=SETUP_TIMEOUT_S, env=GIT_ENV)
        if res.exit_code != 0:
            raise RuntimeError(f"repo_fix setup of {task.id} failed: {(res.stderr or res.stdout)[-500:]}")
        await self.reference(sandbox, task)

    async def reference(self, sandbox: Sandbox, task: Task) -> dict[str, list]:
        """What the task's tests compare on the original package (grading.reference_traces), run once per task and
        kept: in setup(), before the policy acts (a failure there is infra), or else by grade() before the graded
        run. The judge checks every graded pass against it."""
        if task.id not in self._reference:
            self._reference[task.id] = await grading.reference_traces(
                sandbox, dict(task.data), self.original(task.data), self.sandbox_venv(sandbox, task.data),
                timeout_s=self.config.grade_timeout_s)
        return self._reference[task.id]

    async def call_tool(self, sandbox: Sandbox, call: ToolCall, *, task: Task) -> ToolResult:
        limit = self.config.output_chars
        if call.name == "bash":
            env = {"PATH": f"{self.sandbox_venv(sandbox, task.data)}/bin:/usr/local/bin:/usr/bin:/bin",
                   "PYTHONPATH": f"{REPO}/{task.data['pythonpath']}", "PYTHONDONTWRITEBYTECODE": "1",
                   "GIT_PAGER": "cat", "PAGER": "cat", **GIT_ENV}
            return await run_bash(sandbox, call, sessions=self.shells, initial_env=env,
                                  timeout_s=self.config.bash_timeout_s, limit=limit)
        if call.name == "str_replace_editor":
            return await run_editor(sandbox, call, limit=limit)
        if call.name == "submit":
            return ToolResult(call_id=call.id, name=call.name, output="submitted for grading", done=True)
        return ToolResult(call_id=call.id, name=call.name, output=f"unknown tool {call.name!r}: use bash, "
                          "str_replace_editor or submit", error="unknown_tool")

    async def collect(self, sandbox: Sandbox, task: Task) -> Submission:
        """In the policy's sandbox: stop its processes, then pack its repository and read it as data
        (`stop_policy_processes` + `pack_submission`)."""
        await self.stop_policy_processes(sandbox)
        return await self.pack_submission(sandbox, task)

    async def stop_policy_processes(self, sandbox: Sandbox) -> None:
        """Kill every process of the sandbox user (its bash session included). The runner does this before
        collecting too; finalize() / score_solution() / solution() rely on it here."""
        await sandbox.kill_all()

    async def pack_submission(self, sandbox: Sandbox, task: Task) -> Submission:
        """Pack the agent's repository once with tar and read it as data (nothing of the policy may still run);
        build the graded tree (the host's buggy tree + the kept changes) and the stored solution from it. Raises
        PolicyBrokeRepo when the repository cannot be packed or read (the policy's doing: scored 0)."""
        agent, skipped = await grading.pack_agent_repository(sandbox)
        buggy = self.buggy(task.data)
        graded, dropped = grading.merge(buggy, agent, list(task.data["tests"]))
        dropped.update({p: "not a regular file" for p in skipped})
        head = "".join(f"# dropped before grading: {p} ({why})\n" for p, why in sorted(dropped.items()))
        solution = (head + trees.diff(buggy, graded)) or None
        return Submission(payload=(graded, dropped), solution=solution)

    async def grade(self, sandbox: Sandbox, task: Task, submission: Submission) -> TestReport:
        """In a fresh sandbox: unpack the graded tree into a new directory and run the recorded suite there."""
        graded, dropped = submission.payload
        reference = await self.reference(sandbox, task)  # normally from setup(); else before any graded code here
        try:
            report = await grading.run_graded(sandbox, dict(task.data), graded, self.sandbox_venv(sandbox, task.data),
                                              original=self.original(task.data), reference=reference,
                                              timeout_s=self.config.grade_timeout_s)
        except grading.PolicyBrokeRepo as exc:  # e.g. the kept changes fill the disk: its episode, scored 0
            return self.failed_report(task, str(exc))
        if dropped:
            first = report.outcomes[0]
            note = "; dropped changes: " + ", ".join(f"{p} ({why})" for p, why in sorted(dropped.items()))
            report.outcomes[0] = first.model_copy(update={"message": first.message + note})
            report.signals.append(IntegritySignal(name="protected_path_edit", count=len(dropped),
                                                  detail=note.removeprefix("; dropped changes: ")[:1000]))
        return report

    async def finalize(self, sandbox: Sandbox, task: Task) -> TestReport:
        """collect() + grade() in one sandbox (the runner uses a fresh one for grade: see grading_sandbox)."""
        try:
            submission = await self.collect(sandbox, task)
        except grading.PolicyBrokeRepo as exc:
            return self.failed_report(task, str(exc))
        return await self.grade(sandbox, task, submission)

    async def solution(self, sandbox: Sandbox, task: Task) -> str | None:
        """The Env contract's stored solution: the agent's diff against the buggy tree that grading kept, with the
        dropped paths listed first. Not a pure read: it is collect() (stops the policy's processes, packs the
        repository); the runner's fresh-grading path stores collect()'s solution and never calls this."""
        try:
            return (await self.collect(sandbox, task)).solution
        except grading.PolicyBrokeRepo:
            return None

    def reference_solution(self, task: Task) -> str | None:
        return str(task.data["reference_diff"])

    async def score_solution(self, sandbox: Sandbox, task: Task, solution: str) -> TestReport:
        """Grade a unified diff against the buggy repo through the agent's path: set the episode up, apply the
        diff in the agent's repository with `git apply`, then finalize()."""
        await self.setup(sandbox, task)
        if solution.strip():
            await sandbox.write_file("/workspace/.agentrl-solution.diff", solution)
            res = await sandbox.exec(["git", "apply", "--whitespace=nowarn", "/workspace/.agentrl-solution.diff"],
                                     cwd=REPO, timeout=SETUP_TIMEOUT_S, env=GIT_ENV)
            if res.exit_code != 0:
                return self.failed_report(task, f"the solution diff does not apply: {res.stderr.strip()[-300:]}")
        return await self.finalize(sandbox, task)

    def failed_report(self, task: Task, reason: str) -> TestReport:
        outcomes = [TestOutcome(name="resolved", passed=False, message=reason)]
        outcomes += [TestOutcome(name=f"FAIL_TO_PASS::{t}", passed=False, message=reason)
                     for t in task.data["fail_to_pass"]]
        return TestReport(passed=0, total=1, outcomes=outcomes, error=reason)

    def time_needs(self) -> dict[str, float]:
        io = 4 * grading.TAR_TIMEOUT_S  # pack + its cleanup, unpack + cleanup, each bounded; reads are fast
        return {"tool_call": self.config.bash_timeout_s + CLIENT_GRACE_S + 15.0,
                "finalize": self.config.grade_timeout_s + io}

    def check_cases(self, task: Task) -> list[tuple[str, str, bool]]:
        """`agentrl envs check` also requires: a no-op patch fails, and a patch that only edits tests (every test
        file emptied) fails."""
        buggy = self.buggy(task.data)
        tests = list(task.data["tests"])
        emptied = {p: (b"" if grading.protected(p, tests) == "test file" else data) for p, data in buggy.items()}
        return [("no-op patch", "", False), ("test-only patch", trees.diff(buggy, emptied), False)]
