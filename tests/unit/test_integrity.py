"""Integrity signals (agentrl.runner.integrity): the rules over observed facts, their per-step rates, the alarm, and
where they show (stats summary, terminal view, HTML data). Detection never changes a reward."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentrl.runner import integrity
from agentrl.sandbox.base import ExecResult
from agentrl.store import summarize
from agentrl.trainer.config import IntegrityOptions
from agentrl.types import IntegritySignal, Status, TestOutcome, TestReport, ToolResult, Trajectory, Turn
from agentrl.view import data


def _report(passed: int, total: int, subject: str | None = "abc", signals: list[IntegritySignal] | None = None
            ) -> TestReport:
    outcomes = [TestOutcome(name=f"t{i}", passed=i < passed) for i in range(total)]
    return TestReport(passed=passed, total=total, outcomes=outcomes, subject=subject, signals=signals or [])


def _traj(results: list[ToolResult], tests: TestReport | None, *, status: Status = Status.ok,
          error_kind: str | None = None, reward: float | None = 1.0, tid: str = "t") -> Trajectory:
    turns = [Turn(index=i, start=0, model_len=0, tool_results=[r]) for i, r in enumerate(results)]
    return Trajectory(id=tid, group_id="g", task_id="task", env="e", status=status, prompt_ids=[1], turns=turns,
                      tests=tests, reward=reward, error_kind=error_kind)


def _result(**kw: object) -> ToolResult:
    return ToolResult(call_id="c", name="run_python", output="", **kw)  # type: ignore[arg-type]


def test_honest_trajectories_raise_nothing() -> None:
    honest = [
        _traj([_result(exit_code=1, tests=_report(0, 2, subject="v1")), _result(exit_code=0, tests=_report(2, 2))],
              _report(3, 3)),  # fixed after a failing visible run: another solution digest
        _traj([_result(exit_code=None, timed_out=True)], _report(0, 3), reward=0.0),  # our timeout killed it
        _traj([], None, status=Status.infra_error, error_kind="sandbox_lost:deleted", reward=None),
    ]
    for t in honest:
        assert integrity.observe(t).integrity == []


def test_full_marks_for_a_solution_that_failed_its_visible_tests_is_unsupported() -> None:
    t = integrity.observe(_traj([_result(exit_code=0), _result(exit_code=0, tests=_report(1, 2))], _report(5, 5)))
    assert [(s.name, s.turn) for s in t.integrity] == [("reward_unsupported", 1)]
    assert "1/2 visible tests" in t.integrity[0].detail
    assert t.reward == 1.0  # detection only


def test_partial_marks_or_unknown_subject_are_not_unsupported() -> None:
    failing = [_result(tests=_report(1, 2))]
    assert integrity.observe(_traj(failing, _report(4, 5))).integrity == []
    assert integrity.observe(_traj(failing, _report(5, 5, subject=None))).integrity == []
    errored = _report(0, 2).model_copy(update={"error": "harness failed"})
    assert integrity.observe(_traj([_result(tests=errored)], _report(5, 5))).integrity == []


def test_a_kernel_kill_and_a_death_in_a_command_are_resource_exhaustion() -> None:
    t = integrity.observe(_traj([_result(exit_code=0), _result(exit_code=137), _result(exit_code=-9)], _report(0, 1)))
    assert [(s.name, s.count, s.turn) for s in t.integrity] == [("resource_exhaustion", 2, 1)]
    died = _traj([_result(exit_code=0)], _report(0, 1), status=Status.policy_error,
                 error_kind="sandbox_died_in_command:oom", reward=0.0)
    assert [s.name for s in integrity.observe(died).integrity] == ["resource_exhaustion"]


def test_signals_reported_by_the_env_and_the_grader_keep_their_turn() -> None:
    seen = IntegritySignal(name="protected_path_edit", detail="tests/test_x.py")
    t = integrity.observe(_traj([_result(), _result(signals=[seen])],
                                _report(0, 1, signals=[IntegritySignal(name="test_tamper", turn=7, count=2)])))
    assert [(s.name, s.count, s.turn) for s in t.integrity] == [("protected_path_edit", 1, 1),
                                                                ("test_tamper", 2, None)]


def test_rates_count_flagged_scored_trajectories_per_signal() -> None:
    flagged = _traj([_result(exit_code=137), _result(exit_code=137)], _report(0, 1), tid="a")
    clean = _traj([_result(exit_code=0)], _report(1, 1), tid="b")
    infra = _traj([_result(exit_code=137)], None, status=Status.infra_error, reward=None, tid="c")
    trajs = [integrity.observe(t) for t in (flagged, clean, infra)]
    rates = integrity.rates(trajs)
    assert rates["integrity_resource_exhaustion_frac"] == 0.5  # infra errors never count
    assert rates["integrity_reward_unsupported_frac"] == 0.0
    assert set(rates) >= {f"integrity_{name}_frac" for name in integrity.SIGNALS}
    assert integrity.counts(trajs) == {"resource_exhaustion": {"trajectories": 2, "count": 3}}
    assert summarize(trajs)["integrity_flagged"] == 2


def _rows(*fracs: float) -> list[dict[str, object]]:
    return [{"step": i, "integrity_test_tamper_frac": f, "integrity_reward_unsupported_frac": 0.0,
             "integrity_flagged_frac": f}
            for i, f in enumerate(fracs)]


def test_alarm_rings_above_a_threshold_or_when_a_rate_doubles() -> None:
    assert integrity.check_alarm(_rows(0.0, 0.0, 0.0), max_frac={}, window=2, min_frac=0.1) == []
    assert integrity.check_alarm(_rows(0.3, 0.3, 0.35), max_frac={}, window=2, min_frac=0.1) == []  # flat
    rising = integrity.check_alarm(_rows(0.0, 0.0, 0.5), max_frac={}, window=2, min_frac=0.1)
    assert [(a.signal, a.step) for a in rising] == [("test_tamper", 2)]
    assert "0% 2 step(s) earlier" in str(rising[0])
    assert integrity.check_alarm(_rows(0.0, 0.05), max_frac={}, window=2, min_frac=0.1) == []  # below min_frac
    over = integrity.check_alarm(_rows(0.3, 0.3), max_frac={"test_tamper": 0.2}, window=2, min_frac=0.1)
    assert [a.reason for a in over] == ["above its threshold 0.2"]


def test_integrity_options_name_an_unknown_signal() -> None:
    with pytest.raises(ValidationError, match="unknown signal 'tamper'.*known: protected_path_edit"):
        IntegrityOptions(max_frac={"tamper": 0.1})
    with pytest.raises(ValidationError, match="0..1"):
        IntegrityOptions(max_frac={"test_tamper": 2.0})


def test_view_data_and_terminal_show_signals_at_their_turn() -> None:
    from rich.console import Console

    from agentrl.view.terminal import listing_table, trajectory_view

    t = integrity.observe(_traj([_result(exit_code=0), _result(exit_code=137)], _report(0, 1)))
    row = dict(zip(data.INDEX_COLUMNS, data.index_row(t)))
    assert row["flags"] == "resource_exhaustion"
    assert data.detail(t, 1000)["integrity"][0][:3] == ["resource_exhaustion", 1, 1]
    assert data.step_summary([t])["flagged_frac"] == 1.0
    console = Console(width=200, record=True)
    console.print(trajectory_view(t))
    console.print(listing_table([t]))
    text = console.export_text()
    assert "INTEGRITY resource_exhaustion x1 at turn 1" in text
    assert text.index("turn 1 ·") < text.rindex("INTEGRITY resource_exhaustion")  # inline, inside turn 1


def _exec(**kw: object) -> ExecResult:
    return ExecResult(exit_code=0, stdout="", stderr="", duration_s=2.0, **kw)  # type: ignore[arg-type]


def test_the_sandboxs_counters_raise_signals_whatever_the_exit_code() -> None:
    found = integrity.from_sandbox([
        _exec(resources={"oom_kills": 1}),  # a child OOM-killed under a main process that exited 0
        _exec(resources={"cpu_throttled_us": 1_500_000}),  # throttled for 1.5 s of a 2 s command
        _exec(resources={"cpu_throttled_us": 900_000, "cpu_throttled_periods": 9, "shm_bytes": 4096}),  # honest
        _exec(probes={"add_key": 2, "enosys:fchmodat2": 1}),  # refused calls; ENOSYS fallbacks are no probe
        _exec(probes={"enosys:cachestat": 3, "io_uring_setup": 1}),  # libuv tries io_uring and falls back
        _exec(resources={"shm_bytes": 65 << 20}),
    ])
    assert [(s.name, s.count) for s in found] == [("resource_exhaustion", 1), ("resource_exhaustion", 1),
                                                  ("sandbox_probe", 2), ("sandbox_probe", 1)]
    assert "oom_kills=1" in found[0].detail and "add_key x2" in found[2].detail


def test_counted_calls_are_not_counted_twice_and_late_ones_are_at_grading() -> None:
    counted = integrity.from_sandbox([_exec(resources={"oom_kills": 1})])
    late = integrity.from_sandbox([_exec(probes={"ptrace": 1})])
    t = integrity.observe(_traj([_result(exit_code=137, signals=counted)], _report(0, 1)), late=late)
    assert [(s.name, s.count, s.turn) for s in t.integrity] == [("resource_exhaustion", 1, 0),
                                                                ("sandbox_probe", 1, None)]
