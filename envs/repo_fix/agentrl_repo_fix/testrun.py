"""How a package's test suite is run and read, shared by the task build (on the host) and grading (in a sandbox), so
both see the same test ids: the pytest command line, its environment, the JUnit XML parser (the build, on the host)
and the verdict channel (grading, where the graded code may be hostile).

A test id is `<classname>::<name>` of the JUnit report. The build reads the JUnit XML report. Grading never reads a
file: the verdict plugin (verdict_plugin.py, loaded first) writes one MAC'd, sequenced line per expected test to the
exec's stdout pipe as the test finishes; `read_channel` accepts the run only when the stream starts, is contiguous,
verifies under the run's key, holds each expected test at most once, ends with the plugin's own end line with
nothing after it, reports no tampering and matches the process's exit status.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

MESSAGE_CHARS = 600


@dataclass(frozen=True)
class SuiteResult:
    """Per-test verdicts of one run (True = passed; skipped tests are left out) and failure messages."""

    passed: dict[str, bool]
    messages: dict[str, str]
    error: str | None = None

    def failing(self) -> list[str]:
        return sorted(t for t, ok in self.passed.items() if not ok)


def pytest_argv(python: str, tests: list[str], report: str | None, *,
                deselect: list[str] = (),  # type: ignore[assignment]
                per_test_timeout_s: float = 20.0, plugin: str | None = None,
                grading: GradingPaths | None = None) -> list[str]:
    """The test command: no user site (-s), no bytecode written (-B), no cache dir, a per-test timeout. With
    `plugin` (grading): the verdict plugin of that module name loaded right after pytest_timeout, no JUnit report,
    and -P (the working directory, the repository, is not put on sys.path before the plugin puts it there). With
    `grading`: the grader's own ini file (`-c`: no configuration file of the graded tree is read), the repository
    as explicit rootdir and conftest cut-off (no conftest above it), and a fixed basetemp."""
    where = ["--rootdir=."] if grading is None else [
        "-c", grading.ini, f"--rootdir={grading.repo}", f"--confcutdir={grading.repo}", f"--basetemp={grading.tmp}"]
    argv = [python, "-s", "-B", *(["-P"] if plugin else []), "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "-p", "pytest_timeout", *(["-p", plugin] if plugin else []),
            f"--timeout={per_test_timeout_s:g}", "-o", "junit_family=xunit1", "-o", "addopts=",
            *([f"--junitxml={report}"] if report else []), *where]
    for test in deselect:
        argv += ["--deselect", test]
    return argv + list(tests)


@dataclass(frozen=True)
class GradingPaths:
    """Where a graded run's configuration lives: the grader's ini (outside the repository), the repository, and
    pytest's temporary directory."""

    ini: str
    repo: str
    tmp: str


# the files pytest reads its configuration from, in the order it prefers them in one directory
INI_NAMES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
_INI_SECTIONS = {"pyproject.toml": b"[tool.pytest.ini_options]", "tox.ini": b"[pytest]", "setup.cfg": b"[tool:pytest]"}


def grader_ini(original: dict[str, bytes]) -> tuple[str, bytes]:
    """(file name, content) of the ini file grading passes with -c: the configuration file pytest would pick at the
    root of the task's ORIGINAL tree (host data), else an empty pytest.ini. Whatever the graded tree holds under
    any configuration name is never read."""
    for name in INI_NAMES:
        data = original.get(name)
        if data is not None and (name not in _INI_SECTIONS or _INI_SECTIONS[name] in data):
            return name, data
    return "pytest.ini", b"[pytest]\n"


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


PLUGIN_SOURCE = Path(__file__).with_name("verdict_plugin.py")
TRACE_SOURCE = Path(__file__).with_name("value_trace.py")


@dataclass(frozen=True)
class ChannelResult:
    """What the verdict channel of one graded run says: per-test verdicts (True = passed; skipped left out), failure
    messages, tampering found (by the plugin or in the stream), and whether the plugin started at all."""

    passed: dict[str, bool]
    messages: dict[str, str]
    tampered: list[str] = field(default_factory=list)
    started: bool = True
    collect_errors: list[str] = field(default_factory=list)
    traces: dict[str, list] = field(default_factory=dict)  # per expected test: value_trace's records


def plugin_input(key: bytes, tests: list[str], repo: str, pythonpath: str, protected: list[str], *,
                 trace: str, tmp: str) -> str:
    """The plugin's configuration, sent on the test process's stdin (never in its argv, environment or a file)."""
    return json.dumps({"key": key.hex(), "tests": tests, "repo": repo, "pythonpath": pythonpath,
                       "protected": protected, "trace": trace, "tmp": tmp})


def read_channel(stdout: str, key: bytes, tests: list[str], *, exit_code: int | None,
                 truncated: bool = False) -> ChannelResult:
    """Verify and read the plugin's stream (the test process's stdout pipe). Any line that does not verify, a gap
    in the sequence, a test reported twice, anything after the end line, a missing end line, or an exit status
    other than the one the plugin saw is tampering. `exit_code` None: the run was killed at its timeout (no end
    line is expected; the caller scores the timeout)."""
    tampered: list[str] = []
    passed: dict[str, bool] = {}
    messages: dict[str, str] = {}
    collect_errors: list[str] = []
    traces: dict[str, list] = {}
    base = hmac.new(key, digestmod=hashlib.sha256)
    lines = stdout.split("\n")
    tail = lines.pop()  # "" when the stream ends with a newline
    records = []
    for n, line in enumerate(lines):
        body, _, mac = line.rpartition("\t")
        check = base.copy()
        check.update(body.encode())
        seq, _, payload = body.partition("\t")
        if not hmac.compare_digest(mac, check.hexdigest()[:32]) or seq != str(n):
            tampered.append(f"line {n} of the verdict channel was not written by the grader: {line[:120]!r}")
            break
        records.append(json.loads(payload))
    if tail:
        tampered.append(f"the verdict channel ends with a partial line: {tail[:120]!r}")
    if truncated:
        tampered.append("the verdict channel overflowed (something else wrote to it)")
    if not records or records[0][0] != "S":  # nothing of the repository can run before the plugin's first line
        return ChannelResult({}, {}, tampered, started=False)
    ended = None
    for rec in records[1:]:
        kind = rec[0]
        if ended is not None:
            tampered.append(f"the verdict channel has a record after the grader's end line: {rec[:2]}")
            break
        if kind == "T":
            test = tests[rec[1]]
            if test in passed:
                tampered.append(f"{test} was reported twice")
                passed[test] = False
                continue
            if rec[2] != "s":
                passed[test] = rec[2] == "p"
            if rec[2] == "f":
                messages[test] = trim_message(rec[3] if len(rec) > 3 else "")
        elif kind == "V":
            traces[tests[rec[1]]] = rec[2]
        elif kind == "X":
            tampered.append(str(rec[1]))
        elif kind == "C":
            collect_errors.append(f"{rec[1]}: {trim_message(str(rec[2]), 300)}")
        elif kind == "E":
            ended = rec
    if exit_code is None:  # killed at the suite timeout: the caller reports that (scored 0 all the same)
        pass
    elif ended is None:
        tampered.append("the test process ended before the grader's end line (os._exit, a crash or a kill)")
    elif exit_code != ended[2]:
        tampered.append(f"the test process exited {exit_code} after the grader saw exit status {ended[2]}")
    return ChannelResult(passed, messages, tampered, collect_errors=collect_errors, traces=traces)
