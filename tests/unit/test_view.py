"""Replay display, pure re-scoring, stats and the HTML report on synthetic trajectories (no sandbox, no browser).

The report's embedded JSON is parsed back and checked against the trajectories it came from: row counts, the
env_mask runs, trimming, escaping of hostile text, the size budget, and the per-step histograms and deltas.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from agentrl.cli.debug import add_replay_commands
from agentrl.errors import ConfigError, StoreError
from agentrl.replay import load, rescore_pure, select, write_trajectories
from agentrl.store import read_trajectories, summarize
from agentrl.types import SCHEMA_VERSION, Status, ToolCall, ToolResult, Trajectory, Turn
from agentrl.types import TestOutcome as Outcome  # aliased: pytest would try to collect Test*
from agentrl.types import TestReport as Report
from agentrl.view import build_report, write_report
from agentrl.view import data, plots
from agentrl.view.synthetic import trajectories

HOSTILE = "</script><script>window.pwned=1</script><!-- [bold red]not markup[/] & \u2028 end"


def _traj(tid: str = "t-0", *, step: int | None = None, reward: float | None = 0.5, output: str = "2 passed\n",
          status: Status = Status.ok, task: str = "add", passed: int = 1, total: int = 2) -> Trajectory:
    """Two turns: turn 0 = 3 model tokens + 2 tool tokens, turn 1 = 2 model tokens."""
    call = ToolCall(id="call_0_0", name="run_python", arguments={"code": "print(1)\nprint(2)"})
    result = ToolResult(call_id=call.id, name=call.name, output=output, exit_code=1, duration_s=0.25,
                        error=None, stderr="Traceback: boom")
    turns = [Turn(index=0, start=0, model_len=3, env_len=2, text="let me run it", tool_calls=[call],
                  tool_results=[result], observation=output, weight_version=7, finish_reason="stop",
                  gen_duration_s=0.5, tool_duration_s=0.25),
             Turn(index=1, start=5, model_len=2, text="done", weight_version=8, finish_reason="length")]
    tests = Report(passed=passed, total=total, outcomes=[Outcome(name="test_a", passed=True),
                                                         Outcome(name="test_b", passed=False, message="assert 3 == 4")])
    return Trajectory(id=tid, group_id=f"g-{tid}", task_id=task, env="code_tests", status=status, step=step,
                      prompt_ids=[1, 2, 3], completion_ids=[10, 11, 12, 90, 91, 13, 14],
                      logprobs=[-0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5], env_mask=[1, 1, 1, 0, 0, 1, 1],
                      turns=turns, tests=tests, reward=reward, solution="def add(a, b):\n    return a - b\n",
                      meta={"group_size": 1})


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agentrl")
    add_replay_commands(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def _store(path: Path, trajs: list[Trajectory]) -> Path:
    write_trajectories(path, trajs)
    return path


def _strict_json(text: str) -> Any:
    """json.loads as strict as the page's JSON.parse: NaN / Infinity are errors."""
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def _scripts(page: str) -> dict[str, Any]:
    """Every embedded JSON script of a report page, by element id."""
    found = re.findall(r'<script type="application/json" id="([^"]+)">(.*?)</script>', page, flags=re.S)
    return {sid: _strict_json(body) for sid, body in found}


# -- data ---------------------------------------------------------------------------------------------------------

def test_trim_keeps_head_and_tail_and_counts_the_cut() -> None:
    text = "A" * 50 + "B" * 50
    out = data.trim(text, 30)
    assert out.startswith("A" * 20) and out.endswith("B" * 10)
    assert "[70 characters trimmed]" in out
    assert data.trim(text, 100) == text and data.trim(text, 0) == text


def test_mask_runs_cover_the_completion() -> None:
    assert data.mask_runs([1, 1, 0, 0, 0, 1]) == [[1, 2], [0, 3], [1, 1]]
    assert data.mask_runs([]) == []
    t = next(trajectories(1, seed=3))
    runs = data.mask_runs(t.env_mask)
    assert sum(n for _, n in runs) == len(t.completion_ids)
    assert sum(n for m, n in runs if m) == t.num_model_tokens
    assert [n for m, n in runs if m] == [turn.model_len for turn in t.turns]  # one model run per turn


def test_detail_and_index_row_carry_the_trajectory() -> None:
    t = _traj()
    row = dict(zip(data.INDEX_COLUMNS, data.index_row(t)))
    assert row["model_tokens"] == 5 and row["tool_tokens"] == 2 and (row["wv_min"], row["wv_max"]) == (7, 8)
    assert (row["passed"], row["total"], row["calls"], row["turns"]) == (1, 2, 1, 2)
    d = data.detail(t, 1000)
    assert d["mask"] == [[1, 3], [0, 2], [1, 2]]
    turn0 = d["turns"][0]
    assert (turn0["model_len"], turn0["env_len"], turn0["wv"], turn0["finish"]) == (3, 2, 7, "stop")
    assert turn0["calls"][0]["args"] == "code:\nprint(1)\nprint(2)"
    assert turn0["results"][0]["exit"] == 1 and turn0["results"][0]["stderr"] == "Traceback: boom"
    assert d["tests"]["outcomes"][1] == ["test_b", False, "assert 3 == 4"]


def test_non_finite_numbers_become_null() -> None:
    t = _traj(reward=math.nan)
    assert data.index_row(t)[data.INDEX_COLUMNS.index("reward")] is None
    assert data.detail(t, 100)["reward"] is None


# -- plots --------------------------------------------------------------------------------------------------------

def test_histogram_fractions_and_integer_bins() -> None:
    edges = plots.bin_edges([1, 2, 2, 4])
    assert edges == [0.5, 1.5, 2.5, 3.5, 4.5]
    assert plots.histogram([1, 2, 2, 4], edges) == [0.25, 0.5, 0.0, 0.25]
    float_edges = plots.bin_edges([0.0, 0.3, 1.0], bins=4)
    assert float_edges[0] == 0.0 and float_edges[-1] == 1.0 and len(float_edges) == 5
    assert plots.histogram([0.0, 0.3, 1.0], float_edges) == pytest.approx([1 / 3, 1 / 3, 0.0, 1 / 3])  # 1.0: last bin
    assert plots.bin_edges([]) == [0.0, 1.0] and plots.histogram([], [0.0, 1.0]) == [0.0]


def test_histogram_svg_draws_bars_and_the_previous_step() -> None:
    edges = plots.bin_edges([1, 2, 3])
    svg = plots.histogram_svg([1, 1, 3], edges, title="turns <&>", previous=[2, 2])
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg.count("</rect>") == 2  # two non-empty bins: bars carry a <title>, legend swatches do not
    assert "<polyline" in svg and "turns &lt;&amp;&gt;" in svg and "<&>" not in svg
    assert "<polyline" not in plots.histogram_svg([1], edges, title="x")


def test_step_comparison_deltas() -> None:
    steps = data.by_step([_traj("a", step=1, reward=1.0), _traj("b", step=0, reward=0.2), _traj("c", step=0,
                                                                                              reward=0.4)])
    assert list(steps) == [0, 1]
    rows = data.step_comparison(steps)
    assert rows[0]["deltas"]["reward_mean"] is None
    assert rows[0]["values"]["reward_mean"] == pytest.approx(0.3)
    assert rows[1]["deltas"]["reward_mean"] == pytest.approx(0.7)
    assert rows[1]["deltas"]["trajectories"] == -1
    assert list(data.by_step([_traj()])) == [data.NO_STEP]


# -- html ---------------------------------------------------------------------------------------------------------

def test_report_embeds_every_trajectory_and_escapes_hostile_text() -> None:
    trajs = [_traj(f"t-{k}", step=k % 3, output=HOSTILE if k == 1 else "ok\n") for k in range(7)]
    page, limit = build_report(trajs, title="run <1>")
    assert limit == 4000
    scripts = _scripts(page)
    index = scripts["index"]
    assert [r[0] for r in index["rows"]] == [t.id for t in trajs]
    details = [scripts[f"d{k}"] for k in range(7)]
    assert [d["id"] for d in details] == [t.id for t in trajs]
    assert details[1]["turns"][0]["results"][0]["output"] == HOSTILE
    assert "<script>window.pwned" not in page and "<!--" not in page  # the raw tags never reach the HTML
    assert page.count("</script>") == 7 + 2  # details + index + the page script: nothing injected
    assert "<title>run &lt;1&gt;</title>" in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in page
    assert page.count('class="stepblock plots"') == 3 and 'id="step-table"' in page


def test_report_shrinks_texts_to_fit_the_byte_budget(tmp_path: Path) -> None:
    trajs = [_traj(f"t-{k}", output="x" * 20_000) for k in range(20)]
    roomy = write_report(tmp_path / "a.html", trajs)
    tight = write_report(tmp_path / "b.html", trajs, max_bytes=120_000)
    assert roomy.max_chars == 4000 and tight.max_chars < 4000
    assert tight.bytes < roomy.bytes and tight.bytes <= 120_000
    out = _scripts((tmp_path / "b.html").read_text())["d0"]["turns"][0]["results"][0]["output"]
    assert "characters trimmed" in out and len(out) < tight.max_chars + 100


# -- commands -----------------------------------------------------------------------------------------------------

def test_replay_shows_turns_tools_and_tests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _store(tmp_path / "t.jsonl", [_traj("alpha-1", output=HOSTILE), _traj("beta-2", task="mul")])
    assert _cli(["replay", str(path), "--id", "alpha"]) == 0
    out = capsys.readouterr().out
    for expected in ("trajectory alpha-1", "let me run it", "tool call call_0_0: run_python", "exit 1",
                     "weights v7", "finish length", "test_b", "FAIL", "assert 3 == 4", "model · 3 tokens",
                     "tool · 2 tokens", "[bold red]not markup[/]", "Traceback: boom", "return a - b"):
        assert expected in out, expected
    assert "beta-2" not in out


def test_replay_lists_when_nothing_is_selected_and_errors_when_nothing_matches(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _store(tmp_path / "t.jsonl", [_traj("alpha-1", step=0), _traj("alpha-2", step=1)])
    assert _cli(["replay", str(path)]) == 0
    out = capsys.readouterr().out
    assert "alpha-1" in out and "alpha-2" in out and "pick one with --id" in out
    assert _cli(["replay", str(path), "--step", "1"]) == 0
    assert "trajectory alpha-2" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="ambiguous"):
        _cli(["replay", str(path), "--id", "alpha"])
    with pytest.raises(ConfigError, match="no trajectory matches --task nope"):
        _cli(["replay", str(path), "--task", "nope"])


def test_select_filters_combine() -> None:
    trajs = [_traj("a", step=0, task="x"), _traj("b", step=1, task="x"), _traj("c", step=1, task="y")]
    assert [t.id for t in select(trajs, task="x", step=1)] == ["b"]
    assert [t.id for t in select(trajs, traj_id="c")] == ["c"]
    assert select(trajs, traj_id="c", task="x") == []


def test_rescore_pure_reports_only_changed_rewards(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _traj("good", reward=0.5)  # 1/2 tests: consistent
    stale = _traj("stale", reward=0.9)  # stored reward disagrees with its test report
    infra = _traj("infra", reward=None, status=Status.infra_error)
    rows = rescore_pure([good, stale, infra])
    assert [r.differs for r in rows] == [False, True, False]
    path = _store(tmp_path / "t.jsonl", [good, stale, infra])
    out_file = tmp_path / "rescored.jsonl"
    assert _cli(["rescore", str(path), "--out", str(out_file)]) == 1
    out = capsys.readouterr().out
    assert "stale" in out and "good" not in out.split("rescored rewards")[1].split("rescored 3")[0]
    assert "1 rewards differ" in out
    assert [t.reward for t in read_trajectories(out_file)] == [0.5, 0.5, None]
    assert _cli(["rescore", str(out_file)]) == 0  # idempotent once rescored


def test_stats_prints_the_summary_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trajs = list(trajectories(24, steps=3, seed=5))
    path = _store(tmp_path / "t.jsonl", trajs)
    out_json = tmp_path / "stats.json"
    assert _cli(["stats", str(path), "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "mean reward" in out and "pass@G" in out and "per step" in out
    payload = json.loads(out_json.read_text())
    assert payload["summary"] == pytest.approx(summarize(trajs))
    assert set(payload["steps"]) == {"0", "1", "2"}
    assert payload["steps"]["1"] == pytest.approx(summarize([t for t in trajs if t.step == 1]))
    assert payload["unreadable_lines"] == 0


def _damaged_file(tmp_path: Path) -> Path:
    good = [_traj(f"ok-{k}") for k in range(3)]
    future = json.loads(good[0].model_copy(update={"id": "future"}).model_dump_json())
    future["schema_version"] = SCHEMA_VERSION + 1
    lines = [good[0].model_dump_json(), '{"schema_version": 1, "id": "x", "gro', json.dumps(future),
             good[1].model_dump_json(), "\x00\x01 garbage", good[2].model_dump_json()[:-40]]
    path = tmp_path / "damaged.jsonl"
    path.write_text("\n".join(lines) + "\n" + good[2].model_dump_json())  # last line: no newline, still whole
    return path


@pytest.mark.parametrize("command", [["replay"], ["stats"], ["view", "-o", "{tmp}/r.html"], ["rescore"]])
def test_bad_lines_are_named_counted_and_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 command: list[str]) -> None:
    path = _damaged_file(tmp_path)
    argv = [command[0], str(path), *(a.format(tmp=tmp_path) for a in command[1:])]
    assert _cli(argv) == 0
    captured = capsys.readouterr()
    for lineno in (2, 3, 5, 6):
        assert f"{path}:{lineno}:" in captured.err
    assert "newer than this agentrl reads" in captured.err
    assert "4 unreadable line(s)" in captured.err and "read 3 trajectories" in captured.err
    if command[0] == "view":
        page = (tmp_path / "r.html").read_text()
        assert len(_scripts(page)["index"]["rows"]) == 3
        assert "4 unreadable line(s) skipped" in page and f"{path}:3:" in page


def test_load_counts_errors_and_missing_file_is_an_error(tmp_path: Path) -> None:
    loaded = load(_damaged_file(tmp_path))
    assert [t.id for t in loaded.trajectories] == ["ok-0", "ok-1", "ok-2"]
    assert [e.line for e in loaded.errors] == [2, 3, 5, 6]
    for command in ("replay", "stats", "rescore", "view"):
        with pytest.raises(StoreError, match="does not exist"):
            _cli([command, str(tmp_path / "missing.jsonl")])
