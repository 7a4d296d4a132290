"""The judge of repo_fix's verdicts (issue 31, items 4, 5 and 7) in isolation: value_trace's snapshots never run the
graded code's methods, the judge's rules on records, the grader's own ini, and a grader error named as it is
recorded. The end-to-end attacks are tests/integration/test_repo_fix_rigged.py and test_repo_fix_test_config.py."""

from __future__ import annotations

import pytest
from agentrl_repo_fix import grading, judge, testrun, value_trace

from agentrl.errors import AgentRLError, PolicyError, is_infra
from agentrl.runner.attribution import Stage, classify


class _Trap(Exception):
    pass


def _trap(*_a: object, **_k: object) -> object:
    raise _Trap("the snapshot ran the graded code")


class _LoudMeta(type):
    __eq__ = __hash__ = __instancecheck__ = __subclasscheck__ = __getattribute__ = _trap  # type: ignore


class _Loud(metaclass=_LoudMeta):
    __eq__ = __ne__ = __bool__ = __len__ = __iter__ = __repr__ = __getattr__ = _trap  # type: ignore
    __getattribute__ = _trap  # type: ignore

    def __init__(self) -> None:
        object.__setattr__(self, "value", 3)


class _LiesAboutItsState:
    __dict__ = property(_trap)  # type: ignore  # replaces the C-level descriptor: unreadable, never called


def test_a_snapshot_reads_objects_without_running_any_of_their_methods() -> None:
    snap, plain = value_trace.snapshot([_Loud(), {"k": (1, 2.5, "s", None, True)}])
    assert not plain
    assert snap[1][0][:2] == ["o", f"{__name__}._Loud"] and ["__dict__", ["d", [[["s", "value"], ["i", "3"]]]]] \
        in snap[1][0][2]
    assert snap[1][1] == ["d", [[["s", "k"], ["t", [["i", "1"], ["f", "2.5"], ["s", "s"], ["n", None], ["b", True]]]]]]
    assert value_trace.snapshot(_Loud)[0] == ["c", f"{__name__}._Loud"]  # a class by name: no metaclass call
    assert value_trace.snapshot(_LiesAboutItsState())[0] == ["o", f"{__name__}._LiesAboutItsState",
                                                             [["__dict__", ["unreadable"]]]]
    assert value_trace.snapshot([1, (2, frozenset({3}))]) == (
        ["l", [["i", "1"], ["t", [["i", "2"], ["F", [["i", "3"]]]]]]], True)


def test_a_subclass_of_a_builtin_is_not_plain() -> None:
    class Liar(int):
        def __eq__(self, other: object) -> bool:
            return True

    assert value_trace.snapshot(Liar(1))[1] is False and value_trace.snapshot(1)[1] is True


def _rec(kind: str, what: str, operands: list, result: object, site: str = "t.py:1:0") -> list:
    value_trace._state.update(on=True, records=[], rest=None)
    value_trace._record(kind, site, what, operands, result)
    return value_trace.take()[0]


def test_the_judge_keeps_passes_on_the_originals_values_and_overturns_the_rest() -> None:
    ref = {"t::a": [_rec("K", "Eq", [["x"], ["x"]], True)], "t::b": [_rec("K", "Eq", [3, 3], True)]}
    same = {"t::a": list(ref["t::a"]), "t::b": list(ref["t::b"])}
    assert judge.overturned({"t::a": True, "t::b": True}, same, ref) == {}
    rigged = {"t::a": [_rec("K", "Eq", [_Yes(), ["x"]], True)], "t::b": [_rec("K", "Eq", [3.0, 3], True)]}
    out = judge.overturned({"t::a": True, "t::b": True}, rigged, ref)
    assert list(out) == ["t::a"] and "rigged comparison" in out["t::a"]  # 3.0 == 3 holds on plain values
    assert "made 0 checks" in judge.overturned({"t::a": True}, {"t::a": []}, ref)["t::a"]  # a skipped loop
    assert judge.overturned({"t::a": False, "t::c": True}, rigged, ref) == {}  # failed anyway / no reference
    forged = [_rec("K", "Eq", [4, 4], True)]  # plain values that do not hold the test's own side of the check
    assert judge.overturned({"t::b": True}, {"t::b": forged}, ref) != {}


class _Yes:
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = None  # type: ignore[assignment]


def test_the_judge_recomputes_plain_checks_itself() -> None:
    rec = _rec("K", "Lt", [1, 2], True)
    assert judge.recomputes(rec)
    rec[6][1] = ["b", False]  # a result the values do not give
    assert not judge.recomputes(rec)
    assert judge.rebuild(["d", [[["t", [["i", "1"]]], ["S", [["s", "a"]]]]]]) == {(1,): {"a"}}


def test_the_graders_ini_is_the_original_trees_by_pytests_own_precedence() -> None:
    assert testrun.grader_ini({"setup.cfg": b"[metadata]\n"}) == ("pytest.ini", b"[pytest]\n")
    tree = {"setup.cfg": b"[tool:pytest]\nx = 1\n", "tox.ini": b"[tox]\n", "pyproject.toml": b"[tool.black]\n"}
    assert testrun.grader_ini(tree) == ("setup.cfg", tree["setup.cfg"])
    assert testrun.grader_ini({**tree, ".pytest.ini": b""})[0] == ".pytest.ini"
    paths = testrun.GradingPaths(ini="/g/config/setup.cfg", repo="/g/repo", tmp="/g/tmp")
    argv = testrun.pytest_argv("python", ["tests"], None, plugin="p", grading=paths)
    assert argv[argv.index("-c") + 1] == paths.ini and "--rootdir=/g/repo" in argv and "--confcutdir=/g/repo" in argv


@pytest.mark.parametrize("path", [".pytest.ini", "pytest.toml", ".pytest.toml", "sub/conftest.py", "a.pth"])
def test_every_configuration_name_pytest_reads_is_protected(path: str) -> None:
    assert grading.protected(path, ["tests"]) is not None


def test_grader_errors_are_named_as_failure_attribution_records_them() -> None:
    """An exception's base says infra or policy; classify must record it the same way (GraderFailed was an
    InfraError that classify charged to the policy as finalize_failed)."""
    found = [v for v in vars(grading).values() if isinstance(v, type) and issubclass(v, AgentRLError)
             and v.__module__ == grading.__name__]
    assert found
    for cls in found:
        exc = cls("the verdict plugin did not start")
        assert classify(exc, Stage.finalize).infra is is_infra(exc), cls
    verdict = classify(grading.GraderNotStarted("x"), Stage.finalize)
    assert issubclass(grading.GraderNotStarted, PolicyError) and verdict.kind == "finalize_failed"


def test_a_tests_records_stay_within_the_channels_budget() -> None:
    value_trace.begin()
    for i in range(5000):
        value_trace.cmp(f"t.py:{i}:0", "Eq", i, i)
    records = value_trace.take()
    import json

    assert len(json.dumps(records)) <= value_trace.MAX_LINE_BYTES + 200 < grading.CHANNEL_BYTES_PER_TEST
    assert records[-1][0] == "R" and records[-1][1] + len(records) - 1 == 5000  # the rest folded, counted
