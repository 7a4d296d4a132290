"""`agentrl envs init NAME [--dir DIR]`: write a working env package to start a new environment from.

Owns the scaffold's files and their templates: a pyproject with the `agentrl.envs` entry point, an Env class with one
hermes tool (`write_file`) and `finalize` (hidden tests run in the same sandbox), reference solutions, and a pytest
file that runs `agentrl envs check` on it. `pip install -e DIR` makes it visible to `agentrl envs list`; without
installing, `--env DIR/<package>/env.py:<Class>` names it directly. Walkthrough: docs/envs.md.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError

NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")

PYPROJECT = '''[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1.0"
description = "agentrl environment {name}: write a Python function; reward = hidden tests passed"
requires-python = ">=3.11"
dependencies = ["agentrl"]

[project.entry-points."agentrl.envs"]
{name} = "{package}.env:{cls}"

[tool.setuptools]
packages = ["{package}"]
'''

INIT = '''"""agentrl environment {name} (written by `agentrl envs init`)."""

from {package}.env import {cls}

__all__ = ["{cls}"]
'''

ENV = '''"""{cls}: write a Python function in solution.py; reward = fraction of hidden tests passed.

One tool, `write_file` (hermes format: <tool_call>{{"name": "write_file", "arguments": {{"path": ..., "content":
...}}}}</tool_call>), writes a file in the trajectory's own sandbox. The runner ends the episode when the model replies
without a tool call (or at max turns); `finalize` then runs the hidden tests in the same sandbox. Edit TASKS, the
tool and the tests to make it yours; `agentrl envs check {name}` must keep reporting every task passing.
"""

from __future__ import annotations

import json
from typing import Any

from agentrl.envs import Env, Task
from agentrl.types import TestOutcome, TestReport, ToolCall, ToolResult, ToolSpec

TASKS = [
    {{"id": "add", "prompt": "Write solution.py defining add(a, b), which returns a + b.",
     "tests": ["add(1, 2) == 3", "add(-1, 1) == 0", "add(2.5, 0.5) == 3.0"],
     "reference": "def add(a, b):\\n    return a + b\\n"}},
    {{"id": "reverse", "prompt": "Write solution.py defining reverse(s), which returns the string s reversed.",
     "tests": ["reverse('abc') == 'cba'", "reverse('') == ''", "reverse('ab ba') == 'ab ba'"],
     "reference": "def reverse(s):\\n    return s[::-1]\\n"}},
    {{"id": "evens", "prompt": "Write solution.py defining evens(xs), the even numbers of the list xs, in order.",
     "tests": ["evens([1, 2, 3, 4]) == [2, 4]", "evens([]) == []", "evens([7]) == []"],
     "reference": "def evens(xs):\\n    return [x for x in xs if x % 2 == 0]\\n"}},
]

# Runs in the sandbox: imports solution.py, evaluates each test expression, prints one JSON line of outcomes.
HARNESS = """import json, sys
tests = json.loads(sys.argv[1])
try:
    from solution import *
except BaseException as exc:
    out = [[t, False, "import failed: %r" % exc] for t in tests]
else:
    out = []
    for t in tests:
        try:
            ok = bool(eval(t))
            out.append([t, ok, "" if ok else "false"])
        except BaseException as exc:
            out.append([t, False, repr(exc)])
print("\\\\n" + json.dumps(out))
"""

WRITE_FILE = ToolSpec(name="write_file", description="Write a text file in your workspace (relative path).",
                      parameters={{"type": "object", "required": ["path", "content"], "properties": {{
                          "path": {{"type": "string"}}, "content": {{"type": "string"}}}}}})


class {cls}(Env):
    """Write a small Python function; reward = hidden tests passed ({name})."""

    action_format = "hermes"
    tools = [WRITE_FILE]
    system_prompt = (
        "You solve small Python tasks. Call the tool write_file to write solution.py, like this:\\n"
        '<tool_call>{{"name": "write_file", "arguments": {{"path": "solution.py", "content": "def f():\\\\n    '
        'return 1\\\\n"}}}}</tool_call>\\n'
        "Reply without a tool call when you are done.")
    test_timeout_s = 10.0

    def tasks(self) -> list[Task]:
        return [Task(id=t["id"], prompt=t["prompt"], data=t) for t in TASKS]

    async def call_tool(self, sandbox: Any, call: ToolCall, *, task: Task) -> ToolResult:
        if call.name != "write_file":
            return ToolResult(call_id=call.id, name=call.name, output=f"unknown tool {{call.name!r}}; use write_file",
                              error="unknown_tool")
        path, content = call.arguments.get("path"), call.arguments.get("content")
        if not (isinstance(path, str) and isinstance(content, str)) or path.startswith("/") or ".." in path:
            return ToolResult(call_id=call.id, name=call.name, error="bad_arguments",
                              output="write_file needs a relative 'path' and a string 'content'")
        await sandbox.write_file(path, content)
        return ToolResult(call_id=call.id, name=call.name, output=f"wrote {{len(content)}} characters to {{path}}")

    async def finalize(self, sandbox: Any, task: Task) -> TestReport:
        tests = list(task.data["tests"])
        await sandbox.write_file("_hidden_tests.py", HARNESS)
        res = await sandbox.exec(["python3", "_hidden_tests.py", json.dumps(tests)], timeout=self.test_timeout_s)
        try:
            rows = json.loads(res.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):  # killed by the timeout, or the solution broke stdout: every test fails
            why = "timed out" if res.timed_out else f"no test report (exit {{res.exit_code}}): {{res.stderr[-300:]}}"
            rows = [[t, False, why] for t in tests]
        outcomes = [TestOutcome(name=n, passed=bool(ok), message=m) for n, ok, m in rows]
        return TestReport(passed=sum(o.passed for o in outcomes), total=len(tests), outcomes=outcomes)

    async def solution(self, sandbox: Any, task: Task) -> str | None:
        try:
            return await sandbox.read_file("solution.py")
        except FileNotFoundError:
            return None

    def reference_solution(self, task: Task) -> str | None:
        return str(task.data["reference"])

    async def score_solution(self, sandbox: Any, task: Task, solution: str) -> TestReport:
        await sandbox.write_file("solution.py", solution)
        return await self.finalize(sandbox, task)
'''

TEST = '''"""`agentrl envs check` on this env: every task's reference solution passes its hidden tests in a real
sandbox."""

import subprocess
import sys
from pathlib import Path

from {package}.env import TASKS

SPEC = f"{{Path(__file__).resolve().parents[1] / '{package}' / 'env.py'}}:{cls}"


def test_reference_solutions_pass_envs_check() -> None:
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "envs", "check", SPEC], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"total: {{len(TASKS)}}/{{len(TASKS)}} tasks pass all tests" in r.stdout
'''


def class_name(name: str) -> str:
    """`myenv` / `my_env` / `my-env` -> `MyEnv`; `calc` -> `CalcEnv`."""
    camel = "".join(part[:1].upper() + part[1:] for part in re.split(r"[_-]+", name) if part)
    return (camel[:-3] if camel.lower().endswith("env") else camel) + "Env"


def scaffold(name: str, directory: Path) -> list[Path]:
    """Write the env package `name` into `directory` (must not exist or be empty). Returns the files written."""
    if not NAME_RE.match(name):
        raise ConfigError(f"envs init {name!r}: a name is lowercase letters, digits, '_' or '-', starting with a "
                          "letter (e.g. myenv)")
    if directory.exists() and any(directory.iterdir()):
        raise ConfigError(f"envs init: {directory} already exists and is not empty; pass --dir NEW_DIR")
    package, cls = name.replace("-", "_"), class_name(name)
    fields = {"name": name, "package": package, "cls": cls}
    files = {
        "pyproject.toml": PYPROJECT, f"{package}/__init__.py": INIT, f"{package}/env.py": ENV,
        "tests/test_env.py": TEST,
    }
    written = []
    for rel, template in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(template.format(**fields))
        written.append(path)
    return written


def _cmd_envs_init(a: argparse.Namespace) -> int:
    directory = a.dir if a.dir is not None else Path(a.name)
    files = scaffold(a.name, directory)
    package, cls = a.name.replace("-", "_"), class_name(a.name)
    print(f"wrote env package {a.name!r} in {directory}/:")
    for path in files:
        print(f"  {path}")
    print(f"next: pip install -e {directory} && agentrl envs check {a.name}\n"
          f"  or, without installing: agentrl envs check {directory}/{package}/env.py:{cls}")
    return 0


def add_envs_init(envs_sub: Any) -> None:
    """Register `envs init` under the `envs` subparsers."""
    p = envs_sub.add_parser("init", help="write a new env package (entry point, env class, reference solutions, "
                                         "a test): pip install -e DIR makes it visible to `envs list`")
    p.add_argument("name", help="env name, e.g. myenv (also the package and entry-point name)")
    p.add_argument("--dir", type=Path, help="where to write it (default: ./NAME)")
    p.set_defaults(func=_cmd_envs_init)
