"""Running code and tests in a sandbox, and turning the results into what the model and the trajectory see.

Owns: the sandbox file layout of the env (solution.py, main.py), how the in-sandbox harness (harness.py) is invoked
and its output parsed into a `TestReport`, and the capped text of observations. It does not choose tasks or parse
tool calls. A harness that produces no report is a `TestReport` with `error` set and 0 passed (the model can break
its own sandbox); a sandbox that dies raises from the sandbox client (infra) and is not caught here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib.resources import files
from typing import TYPE_CHECKING, Any

from agentrl.types import TestOutcome, TestReport

if TYPE_CHECKING:
    from agentrl.sandbox.base import ExecResult
    from agentrl.sandbox.client import Sandbox

SOLUTION_FILE = "solution.py"
MAIN_FILE = "main.py"
RESULT_MARK = "AGENTRL_HARNESS_RESULT "
HARNESS_SLACK_S = 15.0  # interpreter start + compile, on top of the tests' own budget


def harness_source() -> str:
    return files(__package__).joinpath("harness.py").read_text(encoding="utf-8")


def harness_spec(data: Any, solution: str, tests: Sequence[tuple[str, str]], *, timeout_s: float,
                 budget_s: float) -> str:
    return json.dumps({
        "prelude": data["prelude"],
        "solution": solution,
        "setup": data["setup"],
        "entry_point": data["entry_point"],
        "tests": [list(t) for t in tests],
        "timeout": timeout_s,
        "budget": budget_s,
    })


async def run_harness(sandbox: Sandbox, data: Any, solution: str, tests: Sequence[tuple[str, str]], *,
                      timeout_s: float, budget_s: float) -> TestReport:
    """Run `tests` against `solution` in the sandbox, each test in its own process. Never raises for anything the
    solution does; sandbox failures propagate."""
    spec = harness_spec(data, solution, tests, timeout_s=timeout_s, budget_s=budget_s)
    result = await sandbox.exec(["python3", "-I", "-c", harness_source()], stdin=spec,
                                timeout=budget_s + HARNESS_SLACK_S)
    return parse_harness_output(result, [name for name, _ in tests])


def parse_harness_output(result: ExecResult, names: list[str]) -> TestReport:
    line = next((ln for ln in reversed(result.stdout.splitlines()) if ln.startswith(RESULT_MARK)), None)
    try:
        rows = json.loads(line[len(RESULT_MARK):])["results"] if line else None
        outcomes = [TestOutcome(name=str(n), passed=bool(p), message=str(m)) for n, p, m in rows or []]
    except (ValueError, KeyError, TypeError):
        outcomes = []
    if line is None or [o.name for o in outcomes] != names:
        why = "timed out" if result.timed_out else f"exit code {result.exit_code}"
        error = f"test harness produced no report ({why}): {cap(result.stderr, 500)}"
        failed = [TestOutcome(name=n, passed=False, message="not run: the harness failed") for n in names]
        return TestReport(passed=0, total=len(names), outcomes=failed, error=error)
    return TestReport(passed=sum(o.passed for o in outcomes), total=len(outcomes), outcomes=outcomes)


def no_solution_report(tests: Sequence[tuple[str, str]], entry_point: str) -> TestReport:
    msg = f"no solution: the model never ran a definition of {entry_point}()"
    outcomes = [TestOutcome(name=n, passed=False, message=msg) for n, _ in tests]
    return TestReport(passed=0, total=len(outcomes), outcomes=outcomes)


# -- observation text ----------------------------------------------------------------------------------------------


def cap(text: str, limit: int) -> str:
    """At most ~`limit` characters: the head and the tail (a traceback's last line matters most)."""
    if len(text) <= limit:
        return text
    head, tail = limit // 2, limit - limit // 2
    return f"{text[:head]}\n... [{len(text) - limit} characters cut] ...\n{text[-tail:]}"


def format_exec(result: ExecResult, limit: int, timeout_s: float | None = None) -> str:
    """What the model sees of a run. A timeout names the limit (`timeout_s`) rather than the measured duration,
    so the observation does not depend on the machine's load (reproducible runs)."""
    took = result.duration_s if timeout_s is None else timeout_s
    status = (f"timed out after {took:.1f}s and was killed" if result.timed_out
              else f"exit code {result.exit_code}")
    parts = [status]
    for name, stream in (("stdout", result.stdout), ("stderr", result.stderr)):
        if stream.strip():
            parts.append(f"{name}:\n{cap(stream, limit).rstrip()}")
    if not result.stdout.strip() and not result.stderr.strip():
        parts.append("(no output)")
    return "\n".join(parts)


def format_tests(report: TestReport, sources: Sequence[str]) -> str:
    """The visible tests' results as the model sees them: one line per test with its source."""
    if report.error:
        return f"tests: could not run ({report.error})"
    lines = [f"tests: {report.passed}/{report.total} passed"]
    for outcome, src in zip(report.outcomes, sources, strict=True):
        first = src.strip().splitlines()[-1] if src.strip() else outcome.name
        lines.append(f"PASS {first}" if outcome.passed else f"FAIL {first} -> {outcome.message}")
    return "\n".join(lines)
