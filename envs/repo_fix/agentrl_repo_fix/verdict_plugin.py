"""The pytest plugin grading loads first (`-p <random name>`), shipped as source into the grading sandbox; it imports
only the standard library and pytest (it runs under the package's test venv, never agentrl).

At import, before any file of the graded repository can be imported (the repository is not on sys.path yet):
  - reads its configuration from stdin (a per-run MAC key, the expected test ids, the repository, the protected
    files) and closes stdin;
  - keeps the exec's stdout pipe (read by the sandbox agent, which runs as another uid) as its private CHANNEL and
    points fd 1 at stderr, so nothing else the run prints lands on the channel;
  - fingerprints the test machinery (every function, class and method of _pytest, pytest, pluggy, pytest_timeout,
    unittest, builtins and itself), wraps atexit.register and os._exit, then puts the repository on sys.path.

It also has pytest's assertion rewriter pass test modules and conftests through value_trace (shipped beside it under
a random name, part of the audited machinery): before each expected test's verdict line, a `V` line carries the
records of what the test compared, for the judge on the host (judge.py).

Each test's verdict leaves the process as the test finishes: one line per expected test (setup/call/teardown folded
like the JUnit report: skipped if any phase skipped, else failed if any phase failed), each line
`<seq>\t<json>\t<mac>` with a contiguous sequence number and an HMAC-SHA256 under the run's key. Before every line
it audits the machinery; tampering (a patched harness function or class, a replaced harness module, a hook
implemented in a non-test file of the repository, a tracer, an atexit hook registered from the package's code, a
test function swapped after collection, os._exit) is reported on the channel as an `X` line. The last line is `E`
(the number of test lines and the session's exit status), written at pytest_unconfigure; the host rejects anything
after it. See docs/envs/repo_fix.md for what this does not prevent (the package's code runs in this process).
"""

from __future__ import annotations

import atexit
import builtins
import functools
import hashlib
import hmac
import importlib
import json
import os
import sys
import sysconfig
import time
from types import BuiltinFunctionType, FunctionType
from typing import Any

import pytest

HARNESS = ("_pytest", "pytest", "pluggy", "pytest_timeout", "unittest")
_CONF = json.loads(b"".join(iter(lambda: os.read(0, 1 << 16), b"")))
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
CHANNEL = os.dup(1)  # the exec's stdout pipe; not inherited by subprocesses (PEP 446)
os.dup2(2, 1)
_MAC = hmac.new(bytes.fromhex(_CONF.pop("key")), digestmod=hashlib.sha256)
REPO = os.path.realpath(_CONF["repo"])
PROTECTED = {os.path.join(REPO, p) for p in _CONF["protected"]}
INDEX = {t: i for i, t in enumerate(_CONF["tests"])}
# read-only to the graded code: the venv and the interpreter's own files (not this plugin's directory, which is
# the graded uid's: only this file itself is trusted there)
TRACE = importlib.import_module(_CONF["trace"])  # value_trace.py under its random name, beside this file
TRACE.configure(REPO, _CONF["tmp"])
TRUSTED = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sysconfig.get_paths()["stdlib"])})
SELF = os.path.realpath(__file__)
_state: dict[str, Any] = {"seq": 0, "lines": 0, "ended": False, "exitstatus": None, "tampered": set(), "audit_s": 0.0}
_phases: dict[str, list[str]] = {}
_messages: dict[str, str] = {}
_tests: dict[str, tuple[int, int]] = {}
_ITEMS: dict[str, pytest.Item] = {}
_CONFIG: list[pytest.Config] = []
_HOOKS_SEEN: dict[int, object] = {}
_real_exit = os._exit
_PID = os.getpid()
_real_register = atexit.register


def _emit(record: list) -> None:
    if _state["ended"] or os.getpid() != _PID:  # a forked child (it inherited the channel) reports nothing
        return
    body = f"{_state['seq']}\t{json.dumps(record, ensure_ascii=True)}"
    mac = _MAC.copy()
    mac.update(body.encode())
    line = f"{body}\t{mac.hexdigest()[:32]}\n".encode()
    _state["seq"] += 1
    while line:
        line = line[os.write(CHANNEL, line):]


def _tamper(reason: str) -> None:
    if reason not in _state["tampered"]:
        _state["tampered"].add(reason)
        _emit(["X", reason[:500]])


@functools.lru_cache(maxsize=4096)
def _origin(code_file: str | None) -> str | None:
    """The repository file a code object comes from when it is the package's code (not a protected test/conftest
    file), '<unknown>' for code compiled from a string, else None (the venv, the standard library, C)."""
    if code_file is None:
        return None
    if code_file.startswith("<frozen "):
        return None
    real = os.path.realpath(code_file)
    if real.startswith(TRUSTED) or real == SELF:
        return None
    if real in PROTECTED:
        return None
    if real.startswith(REPO + os.sep):
        return os.path.relpath(real, REPO)
    return code_file


def _code_file(obj: object) -> str | None:
    for attr in ("__func__", "func"):  # bound methods, classmethods, functools.partial
        obj = getattr(obj, attr, obj)
    code = getattr(obj, "__code__", None)
    return code.co_filename if code is not None else None


def _functions_of(member: object) -> list[FunctionType]:
    if isinstance(member, (classmethod, staticmethod)):
        member = member.__func__
    if isinstance(member, property):
        return [f for f in (member.fget, member.fset, member.fdel) if isinstance(f, FunctionType)]
    return [member] if isinstance(member, FunctionType) else []


def _harness_modules() -> dict[str, object]:
    return {n: m for n, m in list(sys.modules.items())
            if m is not None and (n.split(".")[0] in HARNESS or n in (__name__, TRACE.__name__))}


Names = list[tuple[object, str, object, str]]


def _fingerprint() -> tuple[Names, list[tuple[FunctionType, object]]]:
    """(namespace, name, object, label) for every function, class and method of the harness modules and builtins,
    and (function, code object) for every such function: what `_changed` compares by identity."""
    names: Names = []
    codes: list[tuple[FunctionType, object]] = []
    classes: set[int] = set()
    for mname, module in (*_harness_modules().items(), ("builtins", builtins)):
        space = vars(module)
        for key, value in list(space.items()):
            if isinstance(value, (FunctionType, BuiltinFunctionType, type)) and (mname, key) not in MUTABLE:
                names.append((space, key, value, f"{mname}.{key}"))
            codes += [(f, f.__code__) for f in _functions_of(value)]
            if isinstance(value, type) and id(value) not in classes:
                classes.add(id(value))
                cspace = value.__dict__
                _CLASS_KEYS.append((value, frozenset(cspace)))  # an attribute added to a class shadows a base's
                for ckey, member in list(cspace.items()):
                    funcs = _functions_of(member)
                    if funcs or isinstance(member, type):
                        names.append((cspace, ckey, member, f"{value.__module__}.{value.__qualname__}.{ckey}"))
                    codes += [(f, f.__code__) for f in funcs]
    return names, codes


def _changed() -> list[str]:
    out = [label for space, key, value, label in _NAMES if space.get(key) is not value]  # type: ignore[attr-defined]
    out += [f"the code of {f.__module__}.{f.__qualname__}" for f, code in _CODES if f.__code__ is not code]
    for cls, keys in _CLASS_KEYS:  # methods added (shadowing a base class's) or removed; data flags are pytest's own
        if len(cls.__dict__) != len(keys):
            space = cls.__dict__
            out += [f"{cls.__module__}.{cls.__qualname__}.{key}" for key in sorted(set(space) ^ keys)
                    if key not in space or _functions_of(space[key]) or isinstance(space[key], type)]
    return out


# pytest rebinds these during a test run (the assertion plugin's per-test callbacks)
MUTABLE = {("_pytest.assertion.util", "_reprcompare"), ("_pytest.assertion.util", "_assertion_pass"),
           ("_pytest.assertion.util", "_config"), ("builtins", "_")}


def _guarded_exit(code: int = 0) -> None:
    caller = _origin(sys._getframe(1).f_code.co_filename)
    if caller is not None:
        _tamper(f"os._exit({code}) called from {caller}")
    _real_exit(code)


def _guarded_register(func, *args, **kwargs):  # type: ignore[no-untyped-def]
    caller = _origin(sys._getframe(1).f_code.co_filename)
    if caller is not None:
        _tamper(f"an atexit hook was registered from {caller}")
    return _real_register(func, *args, **kwargs)


def _instrumenting_rewrite(mod, source, module_path=None, config=None):  # type: ignore[no-untyped-def]
    """pytest's rewrite of a test module or conftest, then value_trace's: the test's checks leave records."""
    _rewrite_asserts(mod, source, module_path, config)
    rel = os.path.relpath(os.path.realpath(module_path), REPO) if module_path else "?"
    TRACE.instrument(mod, rel, TRACE.__name__)


import _pytest.assertion.rewrite as _rewrite  # noqa: E402 - imported by pytest already; patched before any test

_rewrite_asserts = _rewrite.rewrite_asserts
_rewrite.rewrite_asserts = _instrumenting_rewrite
os._exit = _guarded_exit  # type: ignore[assignment]  # the guard records the call, then exits
atexit.register = _guarded_register  # type: ignore[assignment]  # the guard records who registered
_MODULES: dict[str, Any] = {}
_NAMES: Names = []
_CODES: list[tuple[FunctionType, object]] = []
_CLASS_KEYS: list[tuple[type, frozenset]] = []
_emit(["S", len(INDEX)])


@pytest.hookimpl(trylast=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """The baseline, once pytest's own start-up patches are in (legacypath's, tryfirst) and before the first conftest
    (Config's own trylast implementation, registered before this plugin, runs after this one): then the repository
    goes on sys.path, in front, where `python -m pytest` with PYTHONPATH=<pythonpath> put it."""
    _MODULES.update(_harness_modules())
    names, codes = _fingerprint()
    _NAMES.extend(names)
    _CODES.extend(codes)
    sys.path[0:0] = [REPO, os.path.join(REPO, _CONF["pythonpath"])]
    os.environ["PYTHONPATH"] = os.path.join(REPO, _CONF["pythonpath"])  # subprocesses of tests, as before


def _audit(config: pytest.Config | None) -> None:
    """Report every trace of tampering with the test machinery found now (an audit that fails is tampering too)."""
    t0 = time.perf_counter()
    try:
        _audit_now(config)
    except Exception as exc:  # noqa: BLE001 - whatever breaks the audit was put there by the code under test
        _tamper(f"the audit of the test machinery failed: {type(exc).__name__}: {exc}")
    _state["audit_s"] += time.perf_counter() - t0


def _audit_now(config: pytest.Config | None) -> None:
    current = _harness_modules()
    for name, module in _MODULES.items():
        if current.get(name) is not module:
            _tamper(f"the harness module {name} was replaced in sys.modules")
    for name, module in current.items():
        if name not in _MODULES and _origin(getattr(module, "__file__", None)) is not None:
            _tamper(f"the harness module {name} comes from {_origin(getattr(module, '__file__', None))}")
    for what in _changed():
        _tamper(f"{what} was changed at run time")
    if sys.gettrace() is not None or sys.getprofile() is not None:
        _tamper("a trace or profile function is installed")
    if config is not None:
        for hook_name, caller in list(vars(config.hook).items()):
            for impl in getattr(caller, "get_hookimpls", lambda: [])():
                if id(impl.function) in _HOOKS_SEEN:
                    continue
                where = _origin(_code_file(impl.function))
                if where is not None:
                    _tamper(f"the hook {hook_name} is implemented in {where}")
                else:
                    _HOOKS_SEEN[id(impl.function)] = impl.function  # kept alive: its id stays its own


def _test_id(nodeid: str) -> str:
    from _pytest.junitxml import mangle_test_address

    names = mangle_test_address(nodeid)
    return ".".join(names[:-1]) + "::" + names[-1]


def _callable_fp(item: pytest.Item) -> tuple[int, int]:
    obj = getattr(item, "obj", None)
    func = getattr(obj, "__func__", obj)
    return id(func), id(getattr(func, "__code__", None))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        _tests[item.nodeid] = _callable_fp(item)
        _ITEMS[item.nodeid] = item
    _audit(session.config)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    if item.nodeid in _tests and _callable_fp(item) != _tests[item.nodeid]:
        _tamper(f"the test function of {item.nodeid} was replaced after collection")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _phases.setdefault(report.nodeid, []).append(report.outcome)
    if report.failed and report.nodeid not in _messages and len(_messages) < 200:
        _messages[report.nodeid] = report.longreprtext[-600:]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    if _test_id(nodeid) in INDEX:
        TRACE.begin()


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    phases = _phases.pop(nodeid, [])
    records = TRACE.take()
    _audit(_CONFIG[0] if _CONFIG else None)
    item = _ITEMS.get(nodeid)
    if item is not None and nodeid in _tests and _callable_fp(item) != _tests[nodeid]:
        _tamper(f"the test function of {nodeid} was replaced after collection")
    index = INDEX.get(_test_id(nodeid))
    if index is None:
        return
    outcome = "s" if "skipped" in phases else "f" if "failed" in phases else "p" if "passed" in phases else "f"
    _emit(["V", index, records])  # what the test compared, for the judge on the host (judge.py)
    record: list = ["T", index, outcome]
    if outcome == "f":
        record.append(_messages.pop(nodeid, "no report")[-600:])
    _emit(record)
    _state["lines"] += 1


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    _CONFIG.append(config)


@pytest.hookimpl(tryfirst=True)
def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed and len(_messages) < 200:
        _emit(["C", report.nodeid, report.longreprtext[-600:]])


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _state["exitstatus"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    _audit(config)
    _emit(["E", _state["lines"], _state["exitstatus"], round(_state["audit_s"], 3), len(_NAMES), len(_CODES)])
    _state["ended"] = True
    os.close(CHANNEL)
