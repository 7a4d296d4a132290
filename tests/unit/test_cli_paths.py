"""Every command that reads a trajectory file also takes a run directory, and a path that is neither gives one clear
error naming it (exit 2), never a traceback (`agentrl.cli.paths`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.cli.paths import metrics_file, trajectory_file
from agentrl.errors import StoreError
from agentrl.replay import write_trajectories
from agentrl.view.synthetic import trajectories


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "demo"
    run.mkdir(parents=True)
    write_trajectories(run / "trajectories.jsonl", list(trajectories(8, steps=2, seed=1)))
    return run


def _commands(target: Path, other: Path, tmp: Path) -> dict[str, list[str]]:
    return {
        "stats": ["stats", str(target), "--json", str(tmp / "stats.json")],
        "replay": ["replay", str(target)],
        "rescore": ["rescore", str(target)],
        "view": ["view", str(target), "-o", str(tmp / "report.html")],
        "diff": ["diff", str(target), str(other), "--no-decode"],
    }


@pytest.mark.parametrize("command", ["stats", "replay", "rescore", "view", "diff"])
def test_every_reading_command_takes_a_run_directory(command: str, run_dir: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    argv = _commands(run_dir, run_dir / "trajectories.jsonl", tmp_path)[command]
    assert main(argv) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error:" not in err
    if command == "stats":
        assert '"summary"' in (tmp_path / "stats.json").read_text()
    if command == "view":
        assert (tmp_path / "report.html").stat().st_size > 0


@pytest.mark.parametrize("command", ["stats", "replay", "rescore", "view", "diff"])
@pytest.mark.parametrize("kind", ["empty dir", "missing"])
def test_neither_a_file_nor_a_run_directory_is_one_clear_error(command: str, kind: str, run_dir: Path,
                                                                tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "not-a-run"
    if kind == "empty dir":
        bad.mkdir()
    assert main(_commands(bad, run_dir, tmp_path)[command]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "trajectories.jsonl" in err and "run directory" in err, err
    assert err.count("error:") == 1 and "Traceback" not in err


def test_resolver(run_dir: Path, tmp_path: Path) -> None:
    assert trajectory_file(run_dir) == run_dir / "trajectories.jsonl"
    assert trajectory_file(run_dir / "trajectories.jsonl") == run_dir / "trajectories.jsonl"
    assert metrics_file(run_dir) is None
    (run_dir / "metrics.jsonl").write_text("{}\n")
    assert metrics_file(run_dir) == run_dir / "metrics.jsonl"
    assert metrics_file(run_dir / "trajectories.jsonl") is None
    with pytest.raises(StoreError, match="does not exist"):
        trajectory_file(tmp_path / "nope.jsonl")
