"""Options and fixed texts of the code_tests env: the validated constructor kwargs, the tool specs per action format,
and the system prompt."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl.errors import ConfigError
from agentrl.tools import format_tool_instructions
from agentrl.types import ToolSpec
from agentrl_code_tests.tasks import ActionFormat, Source


class CodeTestsOptions(BaseModel):
    """`get_env("code_tests", **options)`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Source = "easy"  # "easy" (built-in), "humaneval" (164 problems) or "all"
    action_format: ActionFormat = "codeblock"  # small models only write ```python blocks
    run_timeout_s: float = Field(default=10.0, gt=0)  # one run_python call
    # one test, the solution process's start included: 10 s, not 3, since an honest `add(1, 1)` test timed out after
    # 3 s at load 40+ on 2 cores (a false 0 for a right answer); a hang still costs at most test_budget_s in all
    test_timeout_s: float = Field(default=10.0, gt=0)
    test_budget_s: float = Field(default=30.0, gt=0)  # all tests of one harness run; later tests fail "not run"
    output_chars: int = Field(default=2048, ge=256)  # per stream, in what the model sees


def parse_options(options: dict[str, Any]) -> CodeTestsOptions:
    try:
        return CodeTestsOptions.model_validate(options)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'options'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"env code_tests: invalid options ({problems}). Fields: "
                          f"{', '.join(CodeTestsOptions.model_fields)}") from exc


RUN_PYTHON = ToolSpec(
    name="run_python",
    description="Runs the Python code in a fresh process in your workspace (files persist between runs, variables "
    "do not) and returns its exit code and output. Functions you define are saved to solution.py; the last "
    "definition of the task's function is your answer.",
    parameters={"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
)
RUN_TESTS = ToolSpec(
    name="run_tests",
    description="Runs the task's example tests against your current solution and returns which pass.",
    parameters={"type": "object", "properties": {}},
)


def tool_specs(action_format: ActionFormat) -> list[ToolSpec]:
    """Code blocks only reach run_python (the visible tests run after each block); hermes gets both tools."""
    return [RUN_PYTHON] if action_format == "codeblock" else [RUN_PYTHON, RUN_TESTS]


def system_prompt(action_format: ActionFormat) -> str:
    instructions = format_tool_instructions(action_format, tool_specs(action_format))
    return f"You are an expert Python programmer.\n\n{instructions}"
