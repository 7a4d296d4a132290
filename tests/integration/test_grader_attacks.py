"""Grader hacks against code_tests, through the real local bubblewrap sandbox and `agentrl envs check`'s scoring path
(`check_env` with a --solutions file): a policy that only wants the score must not get it from the grader.

Each attack is a solution that does NOT solve the task (it returns a wrong value, or nothing) and tries to get
graded as passing anyway: magic objects, lying subclasses of builtins, forged verdicts on every fd, fake result lines,
exiting early, monkeypatching what the test uses, redefining the task's own helpers, reading the expected answers
from memory. Each must score 0 on every task, as a report (never an exception, never "unscored"). Planted modules in
the workspace and /tmp must leave an honest solution's score exactly as it is."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from agentrl_code_tests import CodeTestsEnv

from agentrl.cli.wiring import check_env
from agentrl.sandbox import SandboxPool, SandboxSpec
from agentrl.testing.grader_attacks import CODE_TESTS_ATTACKS

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")

TASKS = ("easy/add", "easy/is_even", "easy/reverse_string", "HumanEval/2", "HumanEval/32", "HumanEval/38")
ATTACKS = CODE_TESTS_ATTACKS


def _env_tasks() -> dict[str, Any]:
    return {t.id: t for t in CodeTestsEnv(source="all").tasks() if t.id in TASKS}


async def _check(tmp_path: Path, solutions: dict[str, str]) -> tuple[int, dict[str, dict[str, Any]], str]:
    """Run `check_env` (what `agentrl envs check code_tests --solutions FILE` runs) on `solutions`."""
    sol_file, out = tmp_path / "solutions.jsonl", tmp_path / "results.json"
    sol_file.write_text("".join(json.dumps({"task_id": k, "solution": v}) + "\n" for k, v in solutions.items()))
    rc = await check_env("code_tests", solutions=sol_file, backend="local", json_out=out, options={"source": "all"},
                         tasks=None, concurrency=3)
    rows = {r["task_id"]: r for r in json.loads(out.read_text()) if r["task_id"] in solutions}
    return rc, rows, out.read_text()


@pytest.mark.parametrize("attack", sorted(ATTACKS))
async def test_attack_scores_zero_on_every_task(attack: str, tmp_path: Path) -> None:
    tasks = _env_tasks()
    solutions = {tid: ATTACKS[attack].replace("{f}", t.data["entry_point"]) for tid, t in tasks.items()}
    rc, rows, _ = await _check(tmp_path, solutions)
    assert rc == 0 and set(rows) == set(TASKS)
    scored = {tid: (r["passed"], r["total"]) for tid, r in rows.items()}
    assert all(p == 0 and t == len(tasks[tid].data["tests"]) for tid, (p, t) in scored.items()), scored
    assert not any("sandbox broke" in (r["error"] or "") for r in rows.values()), rows
    for tid, r in rows.items():  # every failure says why (no silent zero)
        assert all(o["message"] for o in r["outcomes"]), (tid, r["outcomes"])


async def test_the_honest_solutions_of_the_same_tasks_still_pass(tmp_path: Path) -> None:
    """The control: the path used above does give full marks to solutions that are right."""
    env = CodeTestsEnv(source="all")
    solutions = {t.id: env.reference_solution(t) or "" for t in env.tasks() if t.id in TASKS}
    rc, rows, _ = await _check(tmp_path, solutions)
    assert rc == 0 and {tid: r["passed"] == r["total"] > 0 for tid, r in rows.items()} == dict.fromkeys(TASKS, True)


async def test_magic_values_get_a_message_that_names_the_type(tmp_path: Path) -> None:
    rc, rows, _ = await (_check(tmp_path, {"easy/add": ATTACKS["magic_eq_object"].replace("{f}", "add")}))
    message = rows["easy/add"]["outcomes"][0]["message"]
    assert message.startswith("returned an object of type solution.Magic; only plain data")


async def test_killing_every_process_it_can_is_reported_and_the_rest_is_checked(tmp_path: Path) -> None:
    """`os.kill(-1, 9)` may take the sandbox down with it (same uid as its agent, before uid separation): envs check
    prints that task with score 0 and its reason and checks the others."""
    tasks = _env_tasks()
    killer = "import os\ndef {f}(*args, **kwargs):\n    os.kill(-1, 9)\n"
    solutions = {tid: (killer if tid == "easy/add" else "") for tid in tasks}
    solutions["easy/is_even"] = "def is_even(n):\n    return n % 2 == 0\n"
    solutions = {tid: s.replace("{f}", tasks[tid].data["entry_point"]) for tid, s in solutions.items()}
    rc, rows, _ = await _check(tmp_path, solutions)
    assert rc == 0 and set(rows) == set(TASKS)
    assert rows["easy/add"]["passed"] == 0
    assert rows["easy/is_even"]["passed"] == rows["easy/is_even"]["total"] == len(tasks["easy/is_even"].data["tests"])


PLANTS = {
    "sitecustomize.py": "import os\nos._exit(0)\n",
    "usercustomize.py": "import os\nos._exit(0)\n",
    "evil.pth": "import os; os._exit(0)\n",
    "json.py": "raise SystemExit(0)\n",
    "math.py": "def isclose(*a, **k):\n    return True\ndef fabs(x):\n    return 0.0\n",
    "random.py": "def randint(a, b):\n    return a\ndef choice(s):\n    return s[0]\n",
    "string.py": "ascii_lowercase = 'a'\n",
    "socket.py": "raise SystemExit(0)\n",
}


async def test_planted_modules_in_workspace_and_tmp_leave_the_honest_score(tmp_path: Path) -> None:
    env = CodeTestsEnv(source="all")
    tasks = _env_tasks()
    wrong = {"easy/add": "def add(a, b):\n    return a * b\n",  # right on (0, 0) only: 1 of 5
             "HumanEval/2": "def truncate_number(number):\n    return 0.5\n",  # right on 3.5 only
             "HumanEval/38": tasks["HumanEval/38"].data["reference"]}  # right: all
    async with SandboxPool(backend="local", spec=SandboxSpec(default_timeout_s=30), warm=1, max_sandboxes=1,
                           run_id=uuid.uuid4().hex[:8]) as pool:
        for tid, solution in wrong.items():
            async with pool.lease() as sb:
                await env.setup(sb, tasks[tid])
                honest = await env.score_solution(sb, tasks[tid], solution)
            async with pool.lease() as sb:
                await env.setup(sb, tasks[tid])
                for name, text in PLANTS.items():
                    await sb.write_file(name, text)
                    await sb.write_file(f"site-packages/{name}", text)
                await sb.exec("cp *.py *.pth /tmp/ && mkdir -p /tmp/site-packages && cp *.py /tmp/site-packages/")
                planted = await env.score_solution(sb, tasks[tid], solution)
            assert planted.error is None and honest.error is None
            assert [o.passed for o in planted.outcomes] == [o.passed for o in honest.outcomes], tid
    assert honest.passed == honest.total  # the last one, HumanEval/38's reference, is right
