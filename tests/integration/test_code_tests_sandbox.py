"""code_tests through real sandboxes (local backend: bubblewrap): every reference solution passes every test, wrong
and hanging solutions score below 1, and the tool calls of an episode behave as the model is told."""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from typing import Any

import pytest
from agentrl_code_tests import CodeTestsEnv
from agentrl_code_tests.scoring import run_harness

from agentrl.sandbox import SandboxPool, SandboxSpec
from agentrl.types import TestReport as Report  # aliased: pytest would try to collect Test*
from agentrl.types import ToolCall

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
CONCURRENCY = 3  # sandboxes at once; the CI machines have 2 cores


def _pool(n: int = 1) -> SandboxPool:
    return SandboxPool(backend="local", spec=SandboxSpec(default_timeout_s=30), warm=n, max_sandboxes=n,
                       run_id=uuid.uuid4().hex[:8])


async def _score_all(env: CodeTestsEnv, solutions: dict[str, str]) -> dict[str, Report]:
    """Score `solutions` (task id -> code) in fresh sandboxes, CONCURRENCY at a time."""
    tasks = {t.id: t for t in env.tasks()}
    reports: dict[str, Report] = {}
    async with _pool(CONCURRENCY) as pool:
        queue: asyncio.Queue[str] = asyncio.Queue()
        for tid in solutions:
            queue.put_nowait(tid)

        async def worker() -> None:
            while not queue.empty():
                tid = queue.get_nowait()
                async with pool.lease() as sb:
                    await env.setup(sb, tasks[tid])
                    reports[tid] = await env.score_solution(sb, tasks[tid], solutions[tid])

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return reports


def _failures(reports: dict[str, Report]) -> dict[str, Any]:
    return {tid: (r.error, [o for o in r.outcomes if not o.passed][:2])
            for tid, r in reports.items() if r.error or r.passed != r.total}


@pytest.mark.parametrize("source", ["easy", "humaneval"])
async def test_every_reference_solution_passes_every_test(source: str) -> None:
    env = CodeTestsEnv(source=source)
    solutions = {t.id: env.reference_solution(t) or "" for t in env.tasks()}
    t0 = time.monotonic()
    reports = await _score_all(env, solutions)
    print(f"\nscored {len(reports)} {source} reference solutions "
          f"({sum(r.total for r in reports.values())} tests) in {time.monotonic() - t0:.1f}s")
    assert len(reports) == len(solutions) >= (164 if source == "humaneval" else 30)
    assert _failures(reports) == {}


async def test_wrong_solutions_score_below_one() -> None:
    env = CodeTestsEnv(source="all")
    picked = [t for t in env.tasks() if t.id in ("easy/add", "easy/fizzbuzz", "HumanEval/0", "HumanEval/12")]
    wrong = {t.id: f"def {t.data['entry_point']}(*args, **kwargs):\n    return None\n" for t in picked}
    wrong["easy/add"] = "def add(a, b):\n    return a * b\n"  # right on (0, 0) only
    reports = await _score_all(env, wrong)
    assert all(r.error is None and r.passed < r.total for r in reports.values()), reports
    assert reports["easy/add"].passed == 1


async def test_a_hanging_solution_times_out_per_test_and_the_budget_caps_the_run() -> None:
    env = CodeTestsEnv(source="easy", test_timeout_s=0.5, test_budget_s=1.3)
    task = next(t for t in env.tasks() if t.id == "easy/factorial")
    async with _pool() as pool, pool.lease() as sb:
        await env.setup(sb, task)
        report = await env.score_solution(sb, task, "def factorial(n):\n    while True:\n        pass\n")
    # error None: the harness itself reported (the sandbox's exec timeout, 15 s later, did not have to kill it)
    assert report.error is None and report.passed == 0 and report.total == len(task.data["tests"]) == 4
    messages = [o.message for o in report.outcomes]
    assert messages[:2] == ["timed out after 0.5s"] * 2
    assert messages[-1] == "not run: the time budget for all tests was used up"


async def test_codeblock_episode_runs_code_shows_visible_tests_and_scores_the_last_definition() -> None:
    env = CodeTestsEnv(source="easy")
    task = next(t for t in env.tasks() if t.id == "easy/add")
    async with _pool() as pool, pool.lease() as sb:
        await env.setup(sb, task)
        assert await env.solution(sb, task) is None
        assert (await env.finalize(sb, task)).passed == 0  # no solution yet: every test fails, not an error

        first = await env.call_tool(sb, ToolCall(id="c0", name="run_python", arguments={
            "code": "import math\n\ndef add(a, b):\n    return a - b\n\nprint('sum', add(2, 3))\n"}), task=task)
        assert first.error is None and first.exit_code == 0 and first.stdout == "sum -1\n"
        assert first.output.startswith("exit code 0\nstdout:\nsum -1")
        assert "tests: 0/1 passed\nFAIL assert add(2, 3) == 5 -> AssertionError: expected 5, got -1" in first.output

        crash = await env.call_tool(sb, ToolCall(id="c1", name="run_python", arguments={"code": "1/0"}), task=task)
        assert crash.exit_code == 1 and "ZeroDivisionError" in crash.output and "tests: 0/1 passed" in crash.output

        fixed = await env.call_tool(sb, ToolCall(id="c2", name="run_python", arguments={
            "code": "def add(a, b):\n    return a + b\n"}), task=task)
        assert "tests: 1/1 passed\nPASS assert add(2, 3) == 5" in fixed.output

        solution = await env.solution(sb, task)
        assert solution is not None and "return a + b" in solution and "print(" not in solution
        assert "import math" in solution and solution.count("def add") == 1
        report = await env.finalize(sb, task)
    assert report.error is None and report.passed == report.total == 5


async def test_run_python_timeout_caps_and_bad_calls() -> None:
    env = CodeTestsEnv(source="easy", run_timeout_s=1.0, output_chars=300)
    task = env.tasks()[0]
    async with _pool() as pool, pool.lease() as sb:
        await env.setup(sb, task)
        hang = await env.call_tool(sb, ToolCall(id="c0", name="run_python", arguments={
            "code": "print('started', flush=True)\nwhile True:\n    pass\n"}), task=task)
        assert hang.timed_out and hang.exit_code is None
        assert hang.output.startswith("timed out after") and "started" in hang.output
        loud = await env.call_tool(sb, ToolCall(id="c1", name="run_python", arguments={
            "code": "print('x' * 10000)\nprint('END')"}), task=task)
        assert loud.truncated and len(loud.stdout) < 400 and loud.stdout.rstrip().endswith("END")
        assert len(loud.output) < 1000
        unknown = await env.call_tool(sb, ToolCall(id="c2", name="rm_rf", arguments={}), task=task)
        assert unknown.error == "unknown_tool"
        bad = await env.call_tool(sb, ToolCall(id="c3", name="run_python", arguments={"code": 5}), task=task)
        assert bad.error == "bad_arguments"


async def test_hermes_run_tests_tool() -> None:
    env = CodeTestsEnv(source="easy", action_format="hermes")
    task = next(t for t in env.tasks() if t.id == "easy/is_even")
    async with _pool() as pool, pool.lease() as sb:
        await env.setup(sb, task)
        before = await env.call_tool(sb, ToolCall(id="c0", name="run_tests", arguments={}), task=task)
        assert before.output == "tests: not run (no definition of is_even() yet)"
        ran = await env.call_tool(sb, ToolCall(id="c1", name="run_python", arguments={
            "code": "def is_even(n):\n    return n % 2 == 0\n"}), task=task)
        assert "tests:" not in ran.output  # hermes: visible tests only through run_tests
        after = await env.call_tool(sb, ToolCall(id="c2", name="run_tests", arguments={}), task=task)
        assert after.output.startswith("tests: 2/2 passed")


async def test_planted_files_do_not_change_the_verdict() -> None:
    env = CodeTestsEnv(source="easy")
    task = next(t for t in env.tasks() if t.id == "easy/add")
    plant = ("open('json.py', 'w').write('raise SystemExit(0)')\n"
             "open('sitecustomize.py', 'w').write('import os; os._exit(0)')\n"
             "def add(a, b):\n    return 0\n")
    async with _pool() as pool, pool.lease() as sb:
        await env.setup(sb, task)
        await env.call_tool(sb, ToolCall(id="c0", name="run_python", arguments={"code": plant}), task=task)
        report = await env.finalize(sb, task)
    assert report.error is None and report.passed == 1 and report.total == 5  # only add(0, 0) == 0 passes


SOLUTION_REPLACEMENTS = {
    "directory": ("rm -f solution.py && mkdir solution.py", "could not be read"),
    "fifo": ("rm -f solution.py && mkfifo solution.py", "could not be read"),
    "symlink out of the workspace": ("ln -sf /etc/passwd solution.py", "could not be read"),
    "symlink to a device": ("ln -sf /dev/zero solution.py", "could not be read"),
    "symlink to a directory": ("mkdir -p d && ln -sfn d solution.py", "could not be read"),
    "huge file": ("head -c 3000000 /dev/zero | tr '\\0' '#' > solution.py", "larger than"),
}


@pytest.mark.parametrize("kind", sorted(SOLUTION_REPLACEMENTS))
async def test_a_solution_file_that_is_not_a_plain_file_scores_zero_with_a_reason(kind: str) -> None:
    env = CodeTestsEnv(source="easy")
    task = next(t for t in env.tasks() if t.id == "easy/add")
    command, reason = SOLUTION_REPLACEMENTS[kind]
    async with _pool() as pool, pool.lease() as sb:
        await env.setup(sb, task)
        await env.call_tool(sb, ToolCall(id="c0", name="run_python", arguments={
            "code": "def add(a, b):\n    return a + b\n"}), task=task)
        assert (await sb.exec(command)).exit_code == 0
        t0 = time.monotonic()
        report = await env.finalize(sb, task)
        assert time.monotonic() - t0 < 15  # never hangs on a FIFO
    assert report.error is None and report.passed == 0 and report.total == 5
    assert all(o.message.startswith("no solution: solution.py") and reason in o.message for o in report.outcomes)


async def test_run_python_recovers_after_the_code_replaced_solution_py_with_a_directory() -> None:
    env = CodeTestsEnv(source="easy")
    task = next(t for t in env.tasks() if t.id == "easy/add")
    async with _pool() as pool, pool.lease() as sb:
        await env.setup(sb, task)
        sabotage = "import os\nos.remove('solution.py')\nos.mkdir('solution.py')\n"
        first = await env.call_tool(sb, ToolCall(id="c0", name="run_python", arguments={"code": sabotage}), task=task)
        assert first.exit_code == 0
        assert (await env.finalize(sb, task)).passed == 0
        fixed = await env.call_tool(sb, ToolCall(id="c1", name="run_python", arguments={
            "code": "def add(a, b):\n    return a + b\n"}), task=task)
        assert "tests: 1/1 passed" in fixed.output
        report = await env.finalize(sb, task)
    assert report.error is None and report.passed == report.total == 5


async def test_in_the_sandbox_the_solution_cannot_open_the_fds_or_memory_of_the_harness_processes() -> None:
    """The judge and the spawner are non-dumpable: a same-uid process without CAP_SYS_PTRACE (every sandbox
    process) can neither open /proc/<pid>/fd/N of them (a way to their pipes) nor read their memory or environ."""
    env = CodeTestsEnv(source="easy")
    task = next(t for t in env.tasks() if t.id == "easy/add")
    tests = (("spawner", "assert add(1, 0) == []"), ("judge", "assert add(2, 0) == []"))
    probe = (
        "import os\n"
        "def add(a, b):\n"
        "    pid = os.getppid()\n"
        "    if a == 2:\n"
        "        pid = int(open('/proc/%d/stat' % pid).read().rsplit(')', 1)[1].split()[1])\n"
        "    opened = []\n"
        "    for name in ['fd/%d' % n for n in range(8)] + ['mem', 'environ']:\n"
        "        for flags in (os.O_RDONLY, os.O_WRONLY):\n"
        "            try:\n"
        "                os.close(os.open('/proc/%d/%s' % (pid, name), flags))\n"
        "                opened.append(name)\n"
        "            except OSError:\n"
        "                pass\n"
        "    return opened\n")
    async with _pool() as pool, pool.lease() as sb:
        report = await run_harness(sb, task.data, probe, tests, timeout_s=5, budget_s=10)
    assert report.error is None and [(o.passed, o.message) for o in report.outcomes] == [(True, "")] * 2
