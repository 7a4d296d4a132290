"""repo_fix's options (pydantic, extra="forbid"), its tool specs (hermes JSON tool calls) and the system prompt."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentrl.errors import ConfigError
from agentrl.types import ToolSpec

REPO = "/repo"  # a writable directory of its own (SandboxSpec.writable_dirs), outside the workspace
STATE_DIR = "/workspace/.agentrl"  # the tools' own state (the bash session's FIFOs, undo stacks); outside the repo
DEFAULT_TASKS = Path(__file__).with_name("data") / "tasks.jsonl"


class RepoFixOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tasks_file: Path = DEFAULT_TASKS
    cache_dir: Path | None = None  # default: ~/.cache/agentrl/repo_fix (or $AGENTRL_REPO_FIX_CACHE)
    split: Literal["all", "train", "eval"] = "all"
    packages: list[str] = Field(default_factory=list)  # only these packages' tasks (default: all)
    output_chars: int = Field(default=8000, ge=500)  # a tool's output: head + tail kept, the middle cut
    bash_timeout_s: float = Field(default=60.0, gt=0)
    grade_timeout_s: float = Field(default=150.0, gt=0)  # the whole graded suite run
    # docker / kubernetes: each task's sandbox runs <image_repository>-<package>:<version> (images.py)
    image_repository: str = Field(default="agentrl/repo-fix", pattern=r"^[a-z0-9][a-z0-9._/:-]*$")

    @field_validator("packages", mode="before")
    @classmethod
    def _comma_list(cls, v: Any) -> Any:
        return [p.strip() for p in v.split(",") if p.strip()] if isinstance(v, str) else v


def parse_options(options: dict[str, Any]) -> RepoFixOptions:
    try:
        return RepoFixOptions.model_validate(options)
    except ValidationError as exc:
        raise ConfigError(f"env repo_fix options: {exc}") from None


SYSTEM_PROMPT = f"""You are a software engineer fixing a bug in a Python repository checked out at {REPO}.
Use the tools: `bash` runs shell commands in one persistent shell (the working directory, variables, functions and
aliases persist between calls; background processes are killed when a call returns),
`str_replace_editor` views and edits files, `submit` ends the episode. Find the cause of the failing tests, fix the
package's source code, run the tests to check, then call submit. Changes to test files, conftest.py and test/build
configuration are discarded before grading; the grade is whether the failing tests and all other tests pass."""

TOOLS = [
    ToolSpec(name="bash", description="Run a shell command in a persistent bash session in the repository (cwd, "
             "variables, functions and aliases persist; background processes are killed when the call returns; "
             "long output is cut in the middle).",
             parameters={"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}),
    ToolSpec(name="str_replace_editor",
             description="View or edit files. view: a file with line numbers (view_range [start, end], end -1 = to "
             "the end) or a directory listing; create: write a new file; str_replace: replace old_str, which must "
             "occur exactly once, by new_str; insert: insert new_str after line insert_line (0 = top); undo_edit: "
             "revert the last edit of the file.",
             parameters={"type": "object", "properties": {
                 "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
                 "path": {"type": "string"}, "file_text": {"type": "string"}, "old_str": {"type": "string"},
                 "new_str": {"type": "string"}, "insert_line": {"type": "integer"},
                 "view_range": {"type": "array", "items": {"type": "integer"}}},
                 "required": ["command", "path"]}),
    ToolSpec(name="submit", description="Submit the current state of the repository for grading; ends the episode.",
             parameters={"type": "object", "properties": {}}),
]
