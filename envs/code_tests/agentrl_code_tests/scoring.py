"""Running code and tests in a sandbox, and turning the results into what the model and the trajectory see.

Owns: the sandbox file layout of the env (solution.py, main.py), how the in-sandbox harness (harness.py) is invoked
and its output parsed into a `TestReport`, and the capped text of observations. It does not choose tasks or parse
tool calls. A harness that produces no report is a `TestReport` with `error` set and 0 passed (the model can break
its own sandbox); a sandbox that dies raises from the sandbox client (infra) and is not caught here.

The report is believed only when the harness exited 0 and the last line of its stdout is RESULT_MARK followed by
the per-run nonce this module generated and passed on stdin (the harness never shows it to solution code), with one
row per test in order. Anything else (a forged line, a killed harness, a timeout) is "no report": 0 passed.

The judge is non-dumpable from its first instruction: it is started from the sandbox's execute-only interpreter
(`Sandbox.judge_python`; the kernel makes a process started from a binary its user cannot read non-dumpable at
execve), so a same-uid process can never open its memory or fds. And no grader runs while a policy process is alive:
every harness run (visible tests included) starts only after `kill_all()` left no process of the policy in the
sandbox. Without that interpreter (user images, non-root hosts) the judge runs on `python3` and turns non-dumpable
at its first statement, after the interpreter's start-up: then the kill alone keeps a daemon from opening its memory
in that moment (and rewriting its verdicts); a warning says so once per process.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
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
log = logging.getLogger("agentrl.envs.code_tests")
_warned: set[str] = set()


def harness_source() -> str:
    return files(__package__).joinpath("harness.py").read_text(encoding="utf-8")


def new_nonce() -> str:
    """A fresh secret for one harness run: the result line must carry it."""
    return secrets.token_hex(16)


def harness_spec(data: Any, solution: str, tests: Sequence[tuple[str, str]], *, timeout_s: float,
                 budget_s: float, nonce: str) -> str:
    return json.dumps({
        "prelude": data["prelude"],
        "solution": solution,
        "setup": data["setup"],
        "entry_point": data["entry_point"],
        "tests": [list(t) for t in tests],
        "timeout": timeout_s,
        "budget": budget_s,
        "nonce": nonce,
    })


async def run_harness(sandbox: Sandbox, data: Any, solution: str, tests: Sequence[tuple[str, str]], *,
                      timeout_s: float, budget_s: float) -> TestReport:
    """Run `tests` against `solution` in the sandbox, each test in its own process. Never raises for anything the
    solution does; sandbox failures propagate."""
    await sandbox.kill_all()  # nothing of the policy may be alive while the judge starts (module docstring)
    nonce = new_nonce()
    spec = harness_spec(data, solution, tests, timeout_s=timeout_s, budget_s=budget_s, nonce=nonce)
    result = await sandbox.exec(judge_argv(sandbox, harness_source()), stdin=spec, timeout=budget_s + HARNESS_SLACK_S)
    line, why = _result_object(result, nonce)
    report = _report(result, [name for name, _ in tests], line, why)
    if report.error is None and line is not None:
        _warn_if_dumpable_at_start(sandbox.judge_python, line.get("nondumpable_from_exec") is True)
    return report.model_copy(update={"subject": solution_digest(solution)})


def judge_argv(sandbox: Sandbox, program: str) -> list[str]:
    """The command that runs `program` as the judge: on the sandbox's execute-only interpreter when it has one
    (non-dumpable from execve), else on python3; isolated mode (-I: no cwd, user site or PYTHON* variables)."""
    return [sandbox.grader_python, "-I", "-c", program]


def _warn_if_dumpable_at_start(judge: str | None, nondumpable: bool) -> None:
    """Once per process and reason: the judge was dumpable during its start-up (only kill_all guarded it)."""
    if nondumpable:
        return
    why = ("the sandbox has no execute-only interpreter for it (Sandbox.judge_python: a user image or a non-root "
           "host)" if judge is None else f"it was started from {judge} but the kernel did not make it non-dumpable "
           "at execve (a command spawner that still held privileges, e.g. the agent's setpriv fallback)")
    if why not in _warned:
        _warned.add(why)
        log.warning("code_tests judge: dumpable until its first statement because %s; only the kill of every "
                    "policy process before it starts guards its start-up", why)


def solution_digest(solution: str) -> str:
    """What a report graded, to match a visible-tests report with the final one (agentrl.runner.integrity)."""
    return hashlib.sha256(solution.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def parse_harness_output(result: ExecResult, names: list[str], nonce: str) -> TestReport:
    """The harness's report, or a 0-passed report with `error` saying why none can be believed."""
    return _report(result, names, *_result_object(result, nonce))


def _report(result: ExecResult, names: list[str], line: dict[str, Any] | None, why: str) -> TestReport:
    outcomes, why = _believed_outcomes(line, names) if line is not None else (None, why)
    if outcomes is None:
        error = f"test harness produced no report ({why}): {cap(result.stderr, 500)}"
        failed = [TestOutcome(name=n, passed=False, message="not run: the harness failed") for n in names]
        return TestReport(passed=0, total=len(names), outcomes=failed, error=error)
    return TestReport(passed=sum(o.passed for o in outcomes), total=len(outcomes), outcomes=outcomes)


def _result_object(result: ExecResult, nonce: str) -> tuple[dict[str, Any] | None, str]:
    """The JSON object of the harness's last line when it can be believed to be this run's, else None and why."""
    if result.timed_out:
        return None, "timed out"
    if result.exit_code != 0:
        return None, f"exit code {result.exit_code}"
    lines = result.stdout.rstrip("\n").split("\n")
    prefix = f"{RESULT_MARK}{nonce} "
    if not nonce or not lines[-1].startswith(prefix):
        return None, "no result line with this run's nonce"
    try:
        line = json.loads(lines[-1][len(prefix):])
    except ValueError:
        return None, "unreadable result line"
    return (line, "") if isinstance(line, dict) else (None, "unreadable result line")


def _believed_outcomes(line: dict[str, Any], names: list[str]) -> tuple[list[TestOutcome] | None, str]:
    try:
        outcomes = [_outcome(row) for row in line["results"]]
    except (ValueError, KeyError, TypeError):
        return None, "unreadable result line"
    if [o.name for o in outcomes] != names:
        return None, "the result line does not list the tests run"
    return outcomes, ""


def _outcome(row: Any) -> TestOutcome:
    name, passed, message = row
    if type(passed) is not bool or not isinstance(name, str) or not isinstance(message, str):
        raise TypeError(f"bad result row {row!r:.100}")
    return TestOutcome(name=name, passed=passed, message=message)


def no_solution_report(tests: Sequence[tuple[str, str]], entry_point: str, problem: str | None = None) -> TestReport:
    """Every test failed (scored 0): the model left no solution, or `problem` says why its file is unusable."""
    msg = f"no solution: {problem}" if problem else f"no solution: the model never ran a definition of {entry_point}()"
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
