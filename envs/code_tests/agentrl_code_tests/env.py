"""CodeTestsEnv: write a Python function; reward = fraction of hidden unit tests passed.

Episode: the prompt shows the function's stub and its visible tests. Each code the model runs (a ```python block,
or a `run_python` call) runs in the sandbox as main.py; its definitions are merged into solution.py there (the last
definition wins, see extract.py), so the state lives in the sandbox and the env holds none. With code blocks the
visible tests' results follow every run; with hermes tool calls `run_tests` runs them. The episode ends when the
model replies without code / tool call (the runner ends on a reply with no calls), or at the runner's max turns.
`finalize` runs the hidden tests against solution.py, each in its own process with a timeout; no solution -> every
test fails (a policy outcome, not an infra error). solution.py lives in the model's workspace, so the model can
replace it: a directory, FIFO, symlink out of the workspace or huge file there is "no solution" with the reason in
every test's message; a read that hangs on a sandbox whose agent still answers is the same; a sandbox that no longer
answers raises (infra).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from agentrl.envs import Env, Task, register_env
from agentrl.errors import SandboxDiedError
from agentrl.types import TestOutcome, TestReport, ToolCall, ToolResult
from agentrl_code_tests.config import parse_options, system_prompt, tool_specs
from agentrl_code_tests.extract import defines, merge_solution
from agentrl_code_tests.scoring import (
    HARNESS_SLACK_S,
    MAIN_FILE,
    SOLUTION_FILE,
    cap,
    format_exec,
    format_tests,
    no_solution_report,
    run_harness,
)
from agentrl_code_tests.tasks import load_tasks

MAX_SOLUTION_BYTES = 1024 * 1024  # a larger solution.py is "no solution"
READ_TIMEOUT_S = 20.0

if TYPE_CHECKING:
    from agentrl.sandbox.client import Sandbox

IO_SLACK_S = 5.0  # file reads/writes around the runs


@register_env("code_tests")
class CodeTestsEnv(Env):
    """Implement a Python function; reward = hidden unit tests passed (easy tasks + HumanEval)."""

    action_format = "codeblock"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.config = parse_options(options)
        self.action_format = self.config.action_format
        self.tools = tool_specs(self.config.action_format)
        self.system_prompt = system_prompt(self.config.action_format)
        self._tasks: list[Task] | None = None

    def tasks(self) -> list[Task]:
        if self._tasks is None:
            self._tasks = load_tasks(self.config.source, self.config.action_format)
        return list(self._tasks)

    async def setup(self, sandbox: Sandbox, task: Task) -> None:
        await sandbox.write_file(SOLUTION_FILE, "")  # "" = no solution yet

    async def call_tool(self, sandbox: Sandbox, call: ToolCall, *, task: Task) -> ToolResult:
        code = call.arguments.get("code")
        if call.name == "run_tests":
            solution = await self.solution(sandbox, task) or ""
            text, report = await self._visible(sandbox, task, solution)
            return ToolResult(call_id=call.id, name=call.name, output=text, tests=report)
        if call.name != "run_python":
            return ToolResult(call_id=call.id, name=call.name, output=f"unknown tool {call.name!r}",
                              error="unknown_tool")
        if not isinstance(code, str):
            return ToolResult(call_id=call.id, name=call.name, output="run_python needs a string argument 'code'",
                              error="bad_arguments")
        return await self._run_python(sandbox, call, task, code)

    async def _run_python(self, sandbox: Sandbox, call: ToolCall, task: Task, code: str) -> ToolResult:
        await sandbox.write_file(MAIN_FILE, code)
        # a fixed hash seed: printed sets and dict-of-str orders are the same in every run (reproducible runs)
        res = await sandbox.exec(["python3", MAIN_FILE], timeout=self.config.run_timeout_s,
                                 env={"PYTHONHASHSEED": "0"})
        current, problem = await self._read_solution(sandbox)
        current = current or ""
        merged = merge_solution(current, code)
        if merged is not None:
            if problem is not None:  # the code replaced solution.py by something unwritable: start it afresh
                await sandbox.exec(["rm", "-rf", "--", SOLUTION_FILE], timeout=self.config.run_timeout_s)
            await sandbox.write_file(SOLUTION_FILE, merged)
        output = format_exec(res, self.config.output_chars, timeout_s=self.config.run_timeout_s)
        report = None
        if self.action_format == "codeblock":
            text, report = await self._visible(sandbox, task, current if merged is None else merged)
            output += "\n\n" + text
        limit = self.config.output_chars
        return ToolResult(
            call_id=call.id, name=call.name, output=output, exit_code=res.exit_code, stdout=cap(res.stdout, limit),
            stderr=cap(res.stderr, limit), duration_s=res.duration_s, timed_out=res.timed_out,
            truncated=res.truncated or max(len(res.stdout), len(res.stderr)) > limit, tests=report,
        )

    async def _visible(self, sandbox: Sandbox, task: Task, solution: str) -> tuple[str, TestReport | None]:
        """The visible tests' results as the model sees them, and the report (kept on the tool result)."""
        entry = task.data["entry_point"]
        if not task.data["visible_tests"]:
            return "tests: none to show for this task", None
        if not defines(solution, entry):
            return f"tests: not run (no definition of {entry}() yet)", None
        tests = [(f"visible_{i}", src) for i, src in enumerate(task.data["visible_tests"])]
        report = await run_harness(sandbox, task.data, solution, tests, timeout_s=self.config.test_timeout_s,
                                   budget_s=self.config.test_budget_s)
        return format_tests(report, task.data["visible_tests"]), report

    async def finalize(self, sandbox: Sandbox, task: Task) -> TestReport:
        solution, problem = await self._read_solution(sandbox)
        if solution is None:
            return no_solution_report(task.data["tests"], task.data["entry_point"], problem)
        return await self.score_solution(sandbox, task, solution)

    async def solution(self, sandbox: Sandbox, task: Task) -> str | None:
        return (await self._read_solution(sandbox))[0]

    async def _read_solution(self, sandbox: Sandbox) -> tuple[str | None, str | None]:
        """(solution text or None, why it could not be read or None). Raises only when the sandbox is gone."""
        try:
            data = await asyncio.wait_for(sandbox.read_bytes(SOLUTION_FILE), READ_TIMEOUT_S)
        except FileNotFoundError:  # setup() never ran here, or the model deleted it
            return None, None
        except (ValueError, PermissionError) as exc:  # a directory, FIFO, device, symlink out, > the agent's limit
            return None, f"{SOLUTION_FILE} could not be read ({exc})"
        except TimeoutError:
            if not await sandbox.health():
                raise SandboxDiedError(
                    f"sandbox {sandbox.id} stopped answering while {SOLUTION_FILE} was read") from None
            return None, f"reading {SOLUTION_FILE} did not finish within {READ_TIMEOUT_S:g}s"
        if len(data) > MAX_SOLUTION_BYTES:
            return None, f"{SOLUTION_FILE} is larger than {MAX_SOLUTION_BYTES} bytes"
        text = data.decode("utf-8", "replace")
        return (text if text.strip() else None), None

    def reference_solution(self, task: Task) -> str | None:
        return str(task.data["reference"])

    async def score_solution(self, sandbox: Sandbox, task: Task, solution: str) -> TestReport:
        await sandbox.write_file(SOLUTION_FILE, solution)
        return await run_harness(sandbox, task.data, solution, task.data["tests"],
                                 timeout_s=self.config.test_timeout_s, budget_s=self.config.test_budget_s)

    def failed_report(self, task: Task, reason: str) -> TestReport:
        outcomes = [TestOutcome(name=name, passed=False, message=reason) for name, _ in task.data["tests"]]
        return TestReport(passed=0, total=len(outcomes), outcomes=outcomes, error=reason)

    def time_needs(self) -> dict[str, float]:
        harness = self.config.test_budget_s + HARNESS_SLACK_S
        io = READ_TIMEOUT_S + IO_SLACK_S  # reading solution.py (bounded) and writing it back
        return {"tool_call": self.config.run_timeout_s + harness + io, "finalize": harness + io}
