"""Test harness that runs INSIDE the sandbox: stdlib only, Python 3.8+, no imports from agentrl.

Run as `python3 -I -c "<this file's text>"` with a JSON spec on stdin (nothing is read from the workspace, so files
the model planted there cannot change the verdict):

    {"prelude": str,        code run before the solution (the task's helper functions / imports), may be ""
     "solution": str,       the candidate code
     "setup": str,          code run after the solution, before each test (the test module's top level)
     "entry_point": str,    the function under test; bound to `candidate` as well
     "tests": [[name, code], ...],
     "timeout": float,      seconds per test
     "budget": float}       seconds for all tests; tests after it are failed as "not run"

Each test runs in its own forked child (own process group, stdin/stdout/stderr on /dev/null), so a solution that
hangs, crashes, exits or mutates global state affects only that test; a test that times out is killed with its
whole process group and counts as failed. Prints one line: RESULT_MARK + {"results": [[name, passed, message]]}.
"""

import sys

# Before any other import: drop the cwd / script dir from sys.path so a planted json.py cannot shadow the stdlib.
sys.path[:] = [p for p in sys.path if p not in ("", ".")]

import ast  # noqa: E402
import builtins  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import select  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402

RESULT_MARK = "AGENTRL_HARNESS_RESULT "
MAX_MESSAGE = 300
PRELOAD = ("math", "re", "string", "collections", "itertools", "functools", "heapq", "bisect", "typing", "random",
           "copy", "fractions", "decimal", "hashlib", "statistics", "operator")


def _short(text, limit=MAX_MESSAGE):
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(exc):
    msg = str(exc)
    return _short(type(exc).__name__ + (": " + msg if msg else ""))


def _compare_parts(test_code):
    """(left, right) source of a test ending in `assert LEFT == RIGHT`, for an expected/got message."""
    try:
        body = ast.parse(test_code).body
    except SyntaxError:
        return None
    last = body[-1] if body else None
    if not isinstance(last, ast.Assert) or not isinstance(last.test, ast.Compare):
        return None
    cmp = last.test
    if len(cmp.ops) != 1 or not isinstance(cmp.ops[0], ast.Eq):
        return None
    return ast.unparse(cmp.left), ast.unparse(cmp.comparators[0])


def _assertion_message(exc, test_code, ns):
    parts = _compare_parts(test_code) if hasattr(ast, "unparse") else None
    if parts is None:
        return _describe(exc)
    try:
        got, expected = eval(parts[0], ns), eval(parts[1], ns)
    except BaseException as inner:  # noqa: BLE001 - the re-evaluation itself failed; keep the plain message
        return "AssertionError (re-evaluating it raised " + _describe(inner) + ")"
    return _short("AssertionError: expected " + _short(repr(expected), 140) + ", got " + _short(repr(got), 140))


def _run_in_child(codes, entry_point, test_code):
    """The test body, in the forked child. Returns (passed, message)."""
    ns = {"__name__": "solution", "__builtins__": builtins}
    exec(codes["prelude"], ns)
    try:
        exec(codes["solution"], ns)
    except BaseException as exc:  # noqa: BLE001 - any failure of the candidate is a failed test
        return False, "the solution raised while loading: " + _describe(exc)
    if not callable(ns.get(entry_point)):
        return False, "the solution does not define " + entry_point + "()"
    ns["candidate"] = ns[entry_point]
    exec(codes["setup"], ns)
    try:
        exec(codes["test"], ns)
    except AssertionError as exc:
        return False, _assertion_message(exc, test_code, ns)
    except BaseException as exc:  # noqa: BLE001
        return False, _describe(exc)
    return True, ""


def _child_main(write_fd, codes, entry_point, test_code):
    try:
        os.setpgid(0, 0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        passed, message = _run_in_child(codes, entry_point, test_code)
    except BaseException as exc:  # noqa: BLE001
        passed, message = False, "harness error in test child: " + _describe(exc)
    try:
        os.write(write_fd, (json.dumps([bool(passed), message]) + "\n").encode())
    finally:
        os._exit(0)


def _read_result(read_fd, timeout):
    """Read one result line from the child; None on timeout, b"" / partial bytes if it died first."""
    data = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([read_fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        data += chunk
    return data


def _kill_group(pid):
    for kill, target in ((os.killpg, pid), (os.kill, pid)):
        try:
            kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _exit_message(status):
    if os.WIFSIGNALED(status):
        return "the test process was killed by signal " + str(os.WTERMSIG(status)) + " (crash or out of memory)"
    return "the test process exited with code " + str(os.WEXITSTATUS(status)) + " before reporting"


def run_test(codes, entry_point, test_code, timeout):
    """Fork, run one test, return (passed, message)."""
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child_main(write_fd, codes, entry_point, test_code)
    os.close(write_fd)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass  # the child already did it (or already exited)
    try:
        data = _read_result(read_fd, timeout)
    finally:
        os.close(read_fd)
        _kill_group(pid)  # also reaps anything the test left running in its group
        _, status = os.waitpid(pid, 0)
    if data is None:
        return False, "timed out after " + format(timeout, "g") + "s"
    try:
        passed, message = json.loads(data.decode("utf-8", "replace").splitlines()[0])
        return bool(passed), _short(message)
    except (ValueError, IndexError, TypeError):
        return False, _exit_message(status)


def _compile_all(spec):
    """Compile everything once in the parent: a syntax error fails every test with one clear message."""
    codes = {}
    for key, filename in (("prelude", "<task>"), ("solution", "solution.py"), ("setup", "<tests>")):
        try:
            codes[key] = compile(spec.get(key) or "", filename, "exec")
        except (SyntaxError, ValueError) as exc:
            who = "the solution" if key == "solution" else "the task's " + key
            return None, who + " does not compile: " + _describe(exc)
    return codes, None


def run_all(spec):
    timeout = float(spec["timeout"])
    deadline = time.monotonic() + float(spec["budget"])
    codes, error = _compile_all(spec)
    results = []
    for name, test_code in spec["tests"]:
        if error is not None:
            results.append([name, False, error])
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            results.append([name, False, "not run: the time budget for all tests was used up"])
            continue
        try:
            codes["test"] = compile(test_code, "<test " + name + ">", "exec")
        except (SyntaxError, ValueError) as exc:
            results.append([name, False, "the test does not compile: " + _describe(exc)])
            continue
        passed, message = run_test(codes, spec["entry_point"], test_code, min(timeout, left))
        results.append([name, passed, message])
    return results


def main():
    for module in PRELOAD:  # imported once here, inherited by every forked test
        try:
            __import__(module)
        except ImportError:
            pass
    spec = json.loads(sys.stdin.read())
    results = run_all(spec)
    sys.stdout.write(RESULT_MARK + json.dumps({"results": results}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
