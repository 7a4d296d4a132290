"""The train-inference mismatch of a training run dir in `agentrl stats` (table + --json) and the HTML report: read
from its metrics.jsonl, per step; a rollout file shows no such section; an unreadable metrics line is named and
skipped."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from agentrl.cli.debug import add_replay_commands
from agentrl.replay import write_trajectories
from agentrl.view.synthetic import trajectories

ROWS = [{"step": 0, "loss": 0.1, "mismatch_logprob_abs_mean": 0.0162, "mismatch_logprob_abs_max": 0.309,
         "mismatch_kl": 0.000431, "is_ratio_mean": 1.002, "is_ratio_clipped_frac": 0.0015, "staleness_max": 0},
        {"step": 1, "loss": 0.2, "mismatch_logprob_abs_mean": 0.0187, "mismatch_logprob_abs_max": 0.412,
         "mismatch_kl": 0.000517, "is_ratio_mean": None, "is_ratio_clipped_frac": None, "staleness_max": 1}]


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agentrl")
    add_replay_commands(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def _run_dir(tmp_path: Path, metrics: str) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    write_trajectories(run / "trajectories.jsonl", list(trajectories(16, steps=2, seed=3)))
    (run / "metrics.jsonl").write_text(metrics)
    return run


def test_stats_shows_the_mismatch_per_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_dir(tmp_path, "".join(json.dumps(r) + "\n" for r in ROWS))
    out_json = tmp_path / "stats.json"
    assert _cli(["stats", str(run), "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "train-inference mismatch per step" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()[:1].isdigit()}
    assert lines["0"][-6:] == ["0.0162", "0.309", "0.000431", "1", "0.0015", "0"]
    assert lines["1"][-6:] == ["0.0187", "0.412", "0.000517", "–", "–", "1"]
    mismatch = json.loads(out_json.read_text())["mismatch"]
    assert [r["step"] for r in mismatch] == [0, 1] and mismatch[1]["mismatch_logprob_abs_max"] == 0.412


def test_report_has_the_mismatch_section(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, json.dumps(ROWS[1]) + "\n{not json\n" + json.dumps(ROWS[0]) + "\n")
    page_path = tmp_path / "r.html"
    assert _cli(["view", str(run), "-o", str(page_path)]) == 0
    page = page_path.read_text()
    table = page.split('id="mismatch-table">')[1].split("</table>")[0]
    steps = [cells.split("</td>")[0] for cells in table.split("<tr><td>")[1:]]
    assert steps == ["0", "1"] and "<td>0.0187</td><td>0.412</td><td>0.000517</td>" in table
    assert page.count("<svg") >= 3 and 'aria-label="KL k3"' in page
    # no section for a rollout file, nor for a run from before the metrics existed
    path = tmp_path / "t.jsonl"
    write_trajectories(path, list(trajectories(8, steps=2, seed=3)))
    assert _cli(["view", str(path), "-o", str(tmp_path / "r2.html")]) == 0
    assert 'id="mismatch"' not in (tmp_path / "r2.html").read_text()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "loss": 0.1}) + "\n")
    assert _cli(["view", str(run), "-o", str(tmp_path / "r3.html")]) == 0
    assert 'id="mismatch"' not in (tmp_path / "r3.html").read_text()


def test_unreadable_metrics_line_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_dir(tmp_path, json.dumps(ROWS[0]) + "\n{not json\n")
    assert _cli(["stats", str(run)]) == 0
    captured = capsys.readouterr()
    assert "metrics.jsonl:2: not JSON" in captured.err and "0.0162" in captured.out
