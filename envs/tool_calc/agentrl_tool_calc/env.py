"""ToolCalcEnv: arithmetic the model cannot do in its head; it runs Python in the sandbox, then answers.

Episode: the opening chat is the system prompt, a one-shot example (question -> ```python block -> its output ->
`ANSWER: n`) and the question. Each ```python block runs in the sandbox as main.py (a fresh process, a timeout);
the observation is what it printed (or its error). The episode ends when the model replies without a code block, or
at the runner's max turns.

Grading: the reward is the `calc_answer` source (reward.py): the model's last turn must say `ANSWER: <n>` with n the
true value, which the grader computes from the env's own question text. Policy code never decides the reward (the
sandbox only serves the tool), so `finalize` has no tests to run: it returns an empty report, and a job on this env
must use `reward: [{calc_answer: 1.0}]` (the default `unit_tests` would score every episode 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentrl.envs import Env, Task, register_env
from agentrl.types import Message, TestOutcome, TestReport, ToolCall, ToolResult
from agentrl_tool_calc.config import EXAMPLE, RUN_PYTHON, SYSTEM_PROMPT, parse_options
from agentrl_tool_calc.tasks import make_tasks

if TYPE_CHECKING:
    from agentrl.sandbox.client import Sandbox

MAIN_FILE = "main.py"
IO_SLACK_S = 5.0


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


@register_env("tool_calc")
class ToolCalcEnv(Env):
    """Arithmetic questions answered by running Python in the sandbox; reward: the final `ANSWER: n` is right."""

    action_format = "codeblock"
    tools = [RUN_PYTHON]
    system_prompt = SYSTEM_PROMPT

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.config = parse_options(options)
        self._tasks: list[Task] | None = None

    def tasks(self) -> list[Task]:
        if self._tasks is None:
            c = self.config
            self._tasks = make_tasks(c.split, c.tasks, c.digits, c.ops)
        return list(self._tasks)

    def messages(self, task: Task) -> list[Message]:
        return [Message(role="system", content=self.system_prompt), *EXAMPLE,
                Message(role="user", content=task.prompt)]

    async def call_tool(self, sandbox: Sandbox, call: ToolCall, *, task: Task) -> ToolResult:
        code = call.arguments.get("code")
        if call.name != RUN_PYTHON.name or not isinstance(code, str):
            return ToolResult(call_id=call.id, name=call.name, output="only ```python blocks can be run",
                              error="unknown_tool" if call.name != RUN_PYTHON.name else "bad_arguments")
        await sandbox.write_file(MAIN_FILE, self.program(code, task))
        res = await sandbox.exec(["python3", MAIN_FILE], timeout=self.config.run_timeout_s,
                                 env={"PYTHONHASHSEED": "0"})
        limit = self.config.output_chars
        if res.timed_out:
            output = f"error: the code did not finish within {self.config.run_timeout_s:g}s"
        elif res.exit_code != 0:
            output = f"error (exit code {res.exit_code}):\n{_tail(res.stderr.strip(), limit)}"
        else:
            output = _tail(res.stdout.strip(), limit) or "(no output: print the result)"
        return ToolResult(call_id=call.id, name=call.name, output=output, exit_code=res.exit_code,
                          stdout=_tail(res.stdout, limit), stderr=_tail(res.stderr, limit),
                          duration_s=res.duration_s, timed_out=res.timed_out,
                          truncated=res.truncated or max(len(res.stdout), len(res.stderr)) > limit)

    def program(self, code: str, task: Task) -> str:
        """What main.py holds for the model's block (tool_chain puts its hidden function before it)."""
        return code

    async def finalize(self, sandbox: Sandbox, task: Task) -> TestReport:
        return TestReport(passed=0, total=0)  # graded from the transcript by `calc_answer` (module docstring)

    async def score_solution(self, sandbox: Sandbox, task: Task, solution: str) -> TestReport:
        """`agentrl envs check --solutions`: a solution is a program that prints the task's answer."""
        await sandbox.write_file(MAIN_FILE, self.program(solution, task))
        res = await sandbox.exec(["python3", MAIN_FILE], timeout=self.config.run_timeout_s)
        printed = res.stdout.strip()
        ok = res.exit_code == 0 and printed == str(task.data["answer"])
        why = "" if ok else (f"printed {_tail(printed, 80)!r}" if res.exit_code == 0 else
                             f"exit code {res.exit_code}: {_tail(res.stderr.strip(), 200)}")
        return TestReport(passed=int(ok), total=1,
                          outcomes=[TestOutcome(name="prints_the_answer", passed=ok, message=why)])

    def reference_solution(self, task: Task) -> str | None:
        return f"print({task.data['a']} {task.data['op']} {task.data['b']})"

    def time_needs(self) -> dict[str, float]:
        return {"tool_call": self.config.run_timeout_s + IO_SLACK_S, "finalize": 1.0}
