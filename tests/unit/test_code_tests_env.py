"""code_tests env: task loading, HumanEval splitting, solution extraction, options, and the harness run as a plain
subprocess (the same `python3 -I -c` command the sandbox runs). Sandbox-backed runs: tests/integration."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from agentrl_code_tests import CodeTestsEnv
from agentrl_code_tests.extract import defines, merge_solution
from agentrl_code_tests.scoring import (
    RESULT_MARK,
    cap,
    format_exec,
    harness_source,
    harness_spec,
    new_nonce,
    parse_harness_output,
)
from agentrl_code_tests.tasks import load_tasks, split_check, strip_function

from agentrl.envs import get_env
from agentrl.errors import ConfigError
from agentrl.sandbox.base import ExecResult
from agentrl.tools import parse_tool_calls


@pytest.fixture(scope="module")
def easy() -> list:
    return load_tasks("easy", "codeblock")


@pytest.fixture(scope="module")
def humaneval() -> list:
    return load_tasks("humaneval", "codeblock")


# -- registration and options ------------------------------------------------------------------------------------


def test_registered_by_entry_point_and_options_validated() -> None:
    env = get_env("code_tests", source="humaneval", action_format="hermes")
    assert isinstance(env, CodeTestsEnv) and env.name == "code_tests"
    assert env.action_format == "hermes" and [t.name for t in env.tools] == ["run_python", "run_tests"]
    assert "<tool_call>" in env.system_prompt and "run_tests" in env.system_prompt
    default = CodeTestsEnv()
    assert default.action_format == "codeblock" and [t.name for t in default.tools] == ["run_python"]
    assert "```python" in default.system_prompt
    with pytest.raises(ConfigError, match="source"):
        CodeTestsEnv(source="mbpp")
    with pytest.raises(ConfigError, match="nonsense"):
        CodeTestsEnv(nonsense=1)
    with pytest.raises(ConfigError, match="test_timeout_s"):
        CodeTestsEnv(test_timeout_s=0)


def test_source_all_is_easy_plus_humaneval(easy: list, humaneval: list) -> None:
    ids = [t.id for t in CodeTestsEnv(source="all").tasks()]
    assert ids == [t.id for t in easy] + [t.id for t in humaneval]


# -- task data -----------------------------------------------------------------------------------------------------


def test_easy_tasks_are_well_formed(easy: list) -> None:
    assert len(easy) >= 30
    assert len({t.id for t in easy}) == len(easy)
    for task in easy:
        d = task.data
        assert task.id.startswith("easy/") and d["source"] == "easy"
        assert 3 <= len(d["tests"]) <= 8 and 1 <= len(d["visible_tests"]) <= 2
        assert not set(d["visible_tests"]) & {code for _, code in d["tests"]}, task.id  # visible tests are extra
        assert f"def {d['entry_point']}(" in d["stub"] and f"def {d['entry_point']}(" in d["reference"]
        assert d["stub"].strip() in task.prompt and all(v in task.prompt for v in d["visible_tests"])
        for _, code in d["tests"]:
            ast.parse(code)
            assert d["entry_point"] in code


def test_humaneval_has_164_tasks_each_split_into_named_tests(humaneval: list) -> None:
    assert [t.id for t in humaneval] == [f"HumanEval/{i}" for i in range(164)]
    total = 0
    for task in humaneval:
        d = task.data
        assert len(d["tests"]) >= 1, task.id
        names = [n for n, _ in d["tests"]]
        assert len(set(names)) == len(names)
        for _, code in d["tests"]:
            tree = ast.parse(code)
            assert any(isinstance(n, ast.Assert) for n in ast.walk(tree)), task.id
            assert not any(isinstance(n, ast.Name) and n.id == "candidate" for n in ast.walk(tree)), task.id
        assert f"def {d['entry_point']}(" not in d["prelude"]
        assert d["reference"].startswith(d["stub"])
        total += len(d["tests"])
    assert total > 164 * 5  # most problems have many asserts: splitting actually happened


def test_split_check_one_test_per_assert_with_preamble_and_loops() -> None:
    source = '''
METADATA = {}

def check(candidate):
    print
    assert True, "tests nothing"
    assert candidate(1) == 2
    import math
    x = math.floor(2.5)
    assert candidate(x) == 3, "msg"
    for i in range(3):
        assert candidate(i) == i + 1
'''
    tests = split_check(source, "inc")
    assert [n for n, _ in tests] == ["test_00", "test_01", "test_02"]
    assert tests[0][1] == "assert inc(1) == 2"
    assert tests[1][1] == "import math\nx = math.floor(2.5)\nassert inc(x) == 3, 'msg'"
    assert tests[2][1].startswith("import math\nx = math.floor(2.5)\nfor i in range(3):")
    with pytest.raises(ValueError, match="no assertion"):
        split_check("def check(candidate):\n    assert True\n", "f")


def test_strip_function_keeps_helpers_and_imports() -> None:
    prompt = "import math\n\n\ndef helper(x):\n    return x\n\n\n@dec\ndef target(y):\n    \"\"\"doc\"\"\"\n"
    assert strip_function(prompt, "target") == "import math\n\n\ndef helper(x):\n    return x\n\n\n"


def test_prompt_code_blocks_are_well_formed(easy: list) -> None:
    # the prompt shows the stub and the visible tests in ```python blocks (what a model echoing it would run)
    out = parse_tool_calls(easy[0].prompt, "codeblock", CodeTestsEnv().tools)
    assert out.errors == [] and len(out.calls) == 2


# -- solution extraction -----------------------------------------------------------------------------------------


def test_last_definition_wins_and_helpers_imports_survive() -> None:
    first = "import math\n\ndef helper(x):\n    return x * 2\n\ndef f(x):\n    return helper(x)\n\nprint(f(2))\n"
    sol = merge_solution("", first)
    assert sol is not None
    assert "print(" not in sol and "def helper" in sol and sol.startswith("import math\n")
    second = "import math\nimport os\n\ndef f(x):\n    # better\n    return helper(x) + 1\n\nassert f(1) == 3\n"
    sol2 = merge_solution(sol, second)
    assert sol2 is not None
    assert sol2.count("import math") == 1 and "import os" in sol2
    assert sol2.count("def f(") == 1 and "# better" in sol2 and "def helper" in sol2
    assert "assert f(1)" not in sol2
    ns: dict = {}
    exec(sol2, ns)
    assert ns["f"](1) == 3


def test_extraction_drops_statements_and_keeps_constants_classes_decorators() -> None:
    code = (
        "from __future__ import annotations\nimport functools\nVOWELS = 'aeiou'\ncount = 0\n"
        "@functools.lru_cache(None)\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
        "class Box:\n    pass\n"
        "if __name__ == '__main__':\n    print(fib(10))\n"
        "x = 1; def_line = 2\n"
    )
    sol = merge_solution("", code)
    assert sol is not None
    assert "VOWELS = 'aeiou'" in sol and "count = 0" not in sol and "__main__" not in sol
    assert "@functools.lru_cache(None)\ndef fib(n):" in sol and "class Box" in sol
    assert sol.startswith("from __future__ import annotations\n")
    assert defines(sol, "fib") and defines(sol, "Box") and not defines(sol, "count")


def test_extraction_ignores_code_without_definitions_or_syntax() -> None:
    assert merge_solution("def f():\n    return 1\n", "print(f())\n") is None
    assert merge_solution("def f():\n    return 1\n", "def f(:\n") is None
    assert merge_solution("def f():\n    return 1\n", "def f():\n    return 1\n") is None  # unchanged
    assert merge_solution("", "   ") is None
    assert not defines("", "f") and not defines("def f(:", "f")


# -- scoring helpers ---------------------------------------------------------------------------------------------


def test_cap_keeps_head_and_tail() -> None:
    text = "a" * 3000 + "LAST LINE"
    out = cap(text, 200)
    assert out.startswith("a" * 100) and out.endswith("LAST LINE") and "characters cut" in out
    assert len(out) < 300 and cap("short", 200) == "short"


def test_format_exec_shows_exit_code_timeout_and_streams() -> None:
    ok = format_exec(ExecResult(exit_code=1, stdout="", stderr="Traceback...\nZeroDivisionError"), 2048)
    assert ok.splitlines()[0] == "exit code 1" and "ZeroDivisionError" in ok and "stdout" not in ok
    slow = format_exec(ExecResult(exit_code=None, stdout="partial", stderr="", timed_out=True, duration_s=10.0), 2048)
    assert "timed out after 10.0s" in slow and "partial" in slow
    late = ExecResult(exit_code=None, stdout="", stderr="", timed_out=True, duration_s=10.37)
    assert format_exec(late, 2048, timeout_s=10).startswith("timed out after 10.0s")  # the limit, not the load
    assert "(no output)" in format_exec(ExecResult(exit_code=0, stdout="", stderr=""), 2048)


def test_harness_output_that_is_missing_or_mismatched_is_an_error_report() -> None:
    names, nonce = ["t0", "t1"], "n0nce"
    bad = parse_harness_output(ExecResult(exit_code=137, stdout="", stderr="Killed"), names, nonce)
    assert bad.passed == 0 and bad.total == 2 and bad.error and "exit code 137" in bad.error
    wrong = f"{RESULT_MARK}{nonce} " + json.dumps({"results": [["t0", True, ""]]})
    assert parse_harness_output(ExecResult(exit_code=0, stdout=wrong, stderr=""), names, nonce).error
    good = f"{RESULT_MARK}{nonce} " + json.dumps({"results": [["t0", True, ""], ["t1", False, "boom"]]})
    rep = parse_harness_output(ExecResult(exit_code=0, stdout="noise\n" + good + "\n", stderr=""), names, nonce)
    assert (rep.passed, rep.total, rep.error, rep.outcomes[1].message) == (1, 2, None, "boom")


def test_a_result_line_is_believed_only_with_the_nonce_exit_0_and_last() -> None:
    names, nonce = ["t0"], "n0nce"
    line = f"{RESULT_MARK}{nonce} " + json.dumps({"results": [["t0", True, ""]]})
    forged = RESULT_MARK + json.dumps({"results": [["t0", True, ""]]})  # the pre-nonce format
    other = f"{RESULT_MARK}guess " + json.dumps({"results": [["t0", True, ""]]})
    cases = {
        "no nonce": ExecResult(exit_code=0, stdout=forged, stderr=""),
        "wrong nonce": ExecResult(exit_code=0, stdout=other, stderr=""),
        "not last": ExecResult(exit_code=0, stdout=line + "\nmore", stderr=""),
        "exit 1": ExecResult(exit_code=1, stdout=line, stderr=""),
        "timed out": ExecResult(exit_code=None, stdout=line, stderr="", timed_out=True),
        "passed not a bool": ExecResult(exit_code=0, stdout=line.replace("true", "1"), stderr=""),
    }
    for why, result in cases.items():
        report = parse_harness_output(result, names, nonce)
        assert (report.passed, report.error is not None) == (0, True), why
    assert parse_harness_output(ExecResult(exit_code=0, stdout=line, stderr=""), names, "").error  # no nonce
    ok = parse_harness_output(ExecResult(exit_code=0, stdout=line + "\n", stderr=""), names, nonce)
    assert (ok.passed, ok.error) == (1, None)
    assert new_nonce() != new_nonce() and len(new_nonce()) == 32


# -- the harness, run as a plain subprocess ----------------------------------------------------------------------

DATA = {"prelude": "", "setup": "", "entry_point": "f"}
TESTS = [("t0", "assert f(1) == 2"), ("t1", "assert f(2) == 3"), ("t2", "assert f(-1) == 0")]


def run_harness_subprocess(solution: str, tests=TESTS, *, data=DATA, timeout=2.0, budget=30.0, cwd: Path) -> list:
    nonce = new_nonce()
    spec = harness_spec(data, solution, tests, timeout_s=timeout, budget_s=budget, nonce=nonce)
    proc = subprocess.run([sys.executable, "-I", "-c", harness_source()], input=spec, capture_output=True,
                          text=True, cwd=cwd, timeout=120)
    report = parse_harness_output(ExecResult(exit_code=proc.returncode, stdout=proc.stdout, stderr=proc.stderr),
                                  [n for n, _ in tests], nonce)
    assert report.error is None, report.error
    return [(o.passed, o.message) for o in report.outcomes]


def test_harness_passes_correct_and_reports_expected_got(tmp_path: Path) -> None:
    assert run_harness_subprocess("def f(x):\n    return x + 1\n", cwd=tmp_path) == [(True, "")] * 3
    res = run_harness_subprocess("def f(x):\n    return x + 1 if x > 0 else 5\n", cwd=tmp_path)
    assert res[:2] == [(True, ""), (True, "")]
    assert res[2] == (False, "AssertionError: expected 0, got 5")


def test_harness_isolates_hangs_crashes_and_exits(tmp_path: Path) -> None:
    solution = (
        "import os, sys\n"
        "def f(x):\n"
        "    if x == 1:\n        while True: pass\n"
        "    if x == 2:\n        os._exit(0)\n"
        "    if x == -1:\n        sys.exit(0)\n"
    )
    res = run_harness_subprocess(solution, timeout=1.0, cwd=tmp_path)
    assert res[0] == (False, "timed out after 1s")
    assert res[1] == (False, "the solution process ended (exit, crash or out of memory) before returning a value")
    assert res[2] == (False, "SystemExit: 0")


class _OneShotSpawner:
    """A stand-in for the harness's process spawner: a real child process (killed and reaped by close) and a pipe."""

    alive = True

    def spawn(self) -> tuple[int, int, int]:
        import os

        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        r, w = os.pipe()
        return child.pid, w, r


@pytest.mark.parametrize("body", ["hangs past the alarm", "returns, then a late alarm arrives"])
def test_harness_alarm_is_a_timeout_while_armed_and_inert_after(body: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-shot SIGALRM may land anywhere: during the test it is that test's timeout; once the test is over
    (even on the same deadline, even on entering a function) it must do nothing, never crash the harness and
    lose every test's report (seen as a flaky test_a_hanging_solution_times_out_per_test_...)."""
    import signal
    import time

    from agentrl_code_tests import harness

    def hang(*args: object) -> tuple[bool, str]:
        time.sleep(5)
        return True, ""

    monkeypatch.setattr(harness, "_run_test_body", hang if body.startswith("hangs") else lambda *a: (True, ""))
    previous = signal.signal(signal.SIGALRM, harness._on_alarm)
    try:
        t0 = time.monotonic()
        verdict = harness.run_test(_OneShotSpawner(), {}, "f", None, 0.2)
        if body.startswith("hangs"):
            assert verdict == (False, "timed out after 0.2s") and time.monotonic() - t0 < 4
        else:
            assert verdict == (True, "")
            signal.raise_signal(signal.SIGALRM)  # the alarm of a test that is over: no exception
        assert harness._ALARM["armed"] is False
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_harness_test_state_does_not_leak_between_tests(tmp_path: Path) -> None:
    solution = "SEEN = []\ndef f(x):\n    SEEN.append(x)\n    return len(SEEN) + x\n"
    assert run_harness_subprocess(solution, cwd=tmp_path) == [(True, ""), (True, ""), (True, "")]


def test_harness_reports_missing_function_syntax_error_and_load_error(tmp_path: Path) -> None:
    missing = run_harness_subprocess("def g(x):\n    return x\n", cwd=tmp_path)
    assert missing == [(False, "the solution does not define f()")] * 3
    broken = run_harness_subprocess("def f(x:\n", cwd=tmp_path)
    assert all(not p and m.startswith("the solution does not compile: SyntaxError") for p, m in broken)
    raising = run_harness_subprocess("raise RuntimeError('at import')\n", cwd=tmp_path)
    assert raising == [(False, "the solution raised while loading: RuntimeError: at import")] * 3


def test_harness_budget_fails_the_remaining_tests(tmp_path: Path) -> None:
    res = run_harness_subprocess("def f(x):\n    while True: pass\n", timeout=0.5, budget=0.8, cwd=tmp_path)
    assert res[0] == (False, "timed out after 0.5s")
    assert res[1][0] is False and res[1][1].startswith("timed out after ")
    assert float(res[1][1].removeprefix("timed out after ").rstrip("s")) < 0.5  # clipped to the budget left
    assert res[2] == (False, "not run: the time budget for all tests was used up")


def test_planted_modules_in_the_workspace_do_not_change_the_verdict(tmp_path: Path) -> None:
    (tmp_path / "json.py").write_text("raise SystemExit('planted')\n")
    (tmp_path / "math.py").write_text("def floor(x):\n    return 42\n")
    res = run_harness_subprocess("import math\ndef f(x):\n    return math.floor(x) + 1\n", cwd=tmp_path)
    assert res == [(True, ""), (True, ""), (True, "")]


def test_harness_binds_candidate_and_runs_prelude_and_setup(tmp_path: Path) -> None:
    data = {"prelude": "def helper(x):\n    return x * 10\n", "setup": "K = 3\n", "entry_point": "f"}
    tests = [("t0", "assert candidate(1) == 10 + K")]
    solution = "def f(x):\n    return helper(x) + 3\n"
    assert run_harness_subprocess(solution, tests, data=data, cwd=tmp_path) == [(True, "")]


# -- the judge / solution split: values are plain data, the solution sees no test ----------------------------------


def test_plain_values_of_every_builtin_type_round_trip_exactly(tmp_path: Path) -> None:
    value = ("{1: (2, -0.0, b'\\x00\\xff', frozenset({1, (2, 3)})), 'k': [None, True, 2 ** 200, -(2 ** 70), 1e308],"
             " (1, 'a'): {'\\ud800', 'x'}, 'e': [[], (), {}, set(), '']}")
    tests = [("t0", f"assert f(0) == {value}"),
             ("t1", f"v = f(0)\nassert type(v[(1, 'a')]) is set and type(v[1][3]) is frozenset and v == {value}"),
             ("t2", "assert f(0)['k'][1] is True and type(f(0)['k'][2]) is int")]
    solution = f"def f(x):\n    return {value}\n"
    assert run_harness_subprocess(solution, tests, cwd=tmp_path) == [(True, "")] * 3


def test_values_that_are_not_plain_data_fail_with_a_message_naming_the_type(tmp_path: Path) -> None:
    cases = {
        "class Yes:\n    def __eq__(self, o): return True\ndef f(x):\n    return Yes()\n":
            "returned an object of type solution.Yes; only plain data",
        "class I(int):\n    def __eq__(self, o): return True\ndef f(x):\n    return I(x + 1)\n":
            "returned an object of type solution.I; only plain data",
        "def f(x):\n    return [x + 1, map(str, [1])]\n": "returned an object of type map; only plain data",
        "def f(x):\n    return (i for i in [x + 1])\n": "returned an object of type generator; only plain data",
        "def f(x):\n    a = []\n    a.append(a)\n    return a\n": "returned nested deeper than 100 levels",
    }
    for solution, message in cases.items():
        res = run_harness_subprocess(solution, TESTS[:1], cwd=tmp_path)
        assert res[0][0] is False and res[0][1].startswith(message), (solution, res)


def test_exceptions_of_the_solution_reach_the_test_as_builtin_exceptions(tmp_path: Path) -> None:
    solution = ("class Mine(Exception):\n    pass\n"
                "def f(x):\n    if x:\n        raise ValueError('bad x')\n    raise Mine('m')\n")
    tests = [("t0", "try:\n    f(1)\nexcept ValueError as e:\n    assert str(e) == 'bad x'\nelse:\n    assert False"),
             ("t1", "assert f(1) == 2"), ("t2", "assert f(0) == 2")]
    assert run_harness_subprocess(solution, tests, cwd=tmp_path) == [
        (True, ""), (False, "ValueError: bad x"), (False, "Mine: m")]


def test_the_solution_process_holds_only_its_two_pipes(tmp_path: Path) -> None:
    solution = (
        "import os\n"
        "def f(x):\n"
        "    return [os.readlink('/proc/self/fd/%d' % fd) for fd in (0, 1, 2)] + sorted(os.listdir('/proc/self/fd'))\n")
    # the sixth entry is the directory listdir itself opened
    tests = [("t0", "v = f(0)\nassert v[:3] == ['/dev/null'] * 3 and v[3:] == ['0', '1', '2', '3', '4', '5']")]
    assert run_harness_subprocess(solution, tests, data=DATA, cwd=tmp_path) == [(True, "")]


def test_the_solution_cannot_find_the_expected_values_in_its_memory(tmp_path: Path) -> None:
    solution = (
        "import gc, sys\n"
        "def f(x):\n"
        "    pattern = ''.join(map(chr, [69, 88, 80, 69, 67, 84, 69, 68, 95, 55]))  # not a constant of this code\n"
        "    for o in gc.get_objects():\n"
        "        for s in (o.values() if isinstance(o, dict) else o if isinstance(o, (list, tuple)) else ()):\n"
        "            if isinstance(s, str) and pattern in s and s != pattern:\n"
        "                return s\n"
        "    return 'not found'\n")
    tests = [("t0", "assert f('probe') == 'SECRET_EXPECTED_7'")]
    res = run_harness_subprocess(solution, tests, cwd=tmp_path)
    assert res == [(False, "AssertionError: expected 'SECRET_EXPECTED_7', got 'not found'")]


def test_forged_frames_on_the_value_pipe_fail_the_test(tmp_path: Path) -> None:
    cases = {
        "import os\nos.write(4, b'\\x00\\x00\\x00\\x0a[\"ok\", 10]')\ndef f(x):\n    return 0\n":
            "the solution process sent an invalid reply while loading",
        "import os\ndef f(x):\n    os.write(4, b'\\xff\\xff\\xff\\xff')\n    os._exit(0)\n":
            "the solution process sent an invalid value: a value of 4294967295 bytes",
        "import os\ndef f(x):\n    os.write(4, b'\\x00\\x00\\x00\\x0c[\"ok\", 1e999')\n    os._exit(0)\n":
            "the solution process sent an invalid value",
        "import os, json\ndef f(x):\n    b = json.dumps(['ok', ['i', 'f' * 400000]]).encode()\n"
        "    os.write(4, len(b).to_bytes(4, 'big') + b)\n    os._exit(0)\n":
            "the solution process sent an invalid value: bad i payload",
    }
    for solution, message in cases.items():
        res = run_harness_subprocess(solution, TESTS[:1], cwd=tmp_path)
        assert res[0][0] is False and res[0][1].startswith(message), (solution, res)


def test_the_tests_own_arguments_are_not_changed_by_a_solution_that_mutates_them(tmp_path: Path) -> None:
    solution = "def f(xs):\n    xs.sort()\n    return len(xs)\n"
    tests = [("t0", "xs = [3, 1, 2]\nassert f(xs) == 3 and xs == [3, 1, 2]")]
    assert run_harness_subprocess(solution, tests, cwd=tmp_path) == [(True, "")]
