"""How a package's test suite is run and read, shared by the task build (on the host) and grading (in a sandbox), so
both see the same test ids: the pytest command line, its environment, and the JUnit XML parser.

Results come only from the JUnit XML report pytest writes to a path outside the repository, never from stdout. A
test id is `<classname>::<name>` of the report. A test missing from the report counts as failed.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

MESSAGE_CHARS = 600


@dataclass(frozen=True)
class SuiteResult:
    """Per-test verdicts of one run (True = passed; skipped tests are left out) and failure messages."""

    passed: dict[str, bool]
    messages: dict[str, str]
    error: str | None = None

    def failing(self) -> list[str]:
        return sorted(t for t, ok in self.passed.items() if not ok)


def pytest_argv(python: str, tests: list[str], report: str, *, deselect: list[str] = (),  # type: ignore[assignment]
                per_test_timeout_s: float = 20.0) -> list[str]:
    """The test command: no user site (-s), no bytecode written (-B), no cache dir, a per-test timeout."""
    argv = [python, "-s", "-B", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pytest_timeout",
            f"--timeout={per_test_timeout_s:g}", "-o", "junit_family=xunit1", "-o", "addopts=",
            f"--junitxml={report}", "--rootdir=."]
    for test in deselect:
        argv += ["--deselect", test]
    return argv + list(tests)


def suite_env(pythonpath: str, home: str) -> dict[str, str]:
    return {"PYTHONPATH": pythonpath, "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0", "HOME": home, "LANG": "C.UTF-8",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # only the plugins named on the command line


def parse_junit(data: bytes) -> SuiteResult:
    """Per-test verdicts from a JUnit XML report. A malformed report -> SuiteResult with `error` set."""
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        return SuiteResult({}, {}, error=f"the test report is not valid XML ({exc})")
    passed: dict[str, bool] = {}
    messages: dict[str, str] = {}
    for case in root.iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("skipped") is not None:
            continue
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        ok = bad is None and passed.get(test_id, True)  # a duplicate id counts as failed if any copy failed
        passed[test_id] = ok
        if bad is not None:
            text = (bad.get("message") or "") + "\n" + (bad.text or "")
            messages[test_id] = trim_message(text)
    return SuiteResult(passed, messages)


def trim_message(text: str, limit: int = MESSAGE_CHARS) -> str:
    """The end of a failure text (the assertion and its values are at the end), at most `limit` characters."""
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def node_id(test_id: str, files: set[str] | dict[str, bytes]) -> str:
    """The pytest node id of a JUnit id (`pkg.tests.test_x.Class::name` -> `pkg/tests/test_x.py::Class::name`)
    when the module is one of `files`, else the JUnit id unchanged."""
    classname, _, name = test_id.partition("::")
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if path in files:
            return "::".join([path, *parts[cut:], name])
    return test_id
