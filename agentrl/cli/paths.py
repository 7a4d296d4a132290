"""Where the commands that read a run find its files: a trajectory file (JSONL) or a run directory.

Every command that takes a trajectory file (`stats`, `replay`, `rescore`, `view`, `diff`) also takes the directory a
run wrote (`runs/demo`: its `trajectories.jsonl`, and `metrics.jsonl` for a training run). Anything else is a
StoreError that names the path and what was expected, never a traceback.
"""

from __future__ import annotations

from pathlib import Path

from agentrl.errors import StoreError

TRAJECTORIES = "trajectories.jsonl"
METRICS = "metrics.jsonl"
EXPECTED = f"pass a trajectory file (JSONL) or a run directory that holds {TRAJECTORIES}"


def trajectory_file(path: Path) -> Path:
    """The trajectory file `path` names: itself, or `path/trajectories.jsonl` for a run directory."""
    if path.is_dir():
        traj = path / TRAJECTORIES
        if not traj.is_file():
            raise StoreError(f"{path} is a directory without {TRAJECTORIES}: {EXPECTED}")
        return traj
    if not path.exists():
        raise StoreError(f"{path} does not exist: {EXPECTED}")
    if not path.is_file():
        raise StoreError(f"{path} is not a regular file: {EXPECTED}")
    return path


def metrics_file(path: Path) -> Path | None:
    """A run directory's `metrics.jsonl` when it has one (training runs), else None."""
    metrics = path / METRICS
    return metrics if path.is_dir() and metrics.is_file() else None
