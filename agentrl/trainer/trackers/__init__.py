"""Experiment trackers (`report_to`): TensorBoard, Weights & Biases, trackio and MLflow.

Owns which trackers a run logs to, the up-front check that their libraries are installed (`check_trackers`: a
missing one is a MissingDependencyError naming the extra to install, before anything is built), and `TrackerSet`:
one object per run on rank 0 that forwards each per-step metrics row (the row metrics.py writes to metrics.jsonl:
one source of truth, so every tracker's scalars match the file step for step), the step's histograms and trajectory
table (record.py), and evaluation results to every tracker (backends.py).

`<run>/trackers.json` records, per tracker, where it wrote, how to open it, its run identity and the last step it
logged. A resumed run (`agentrl train --resume`) reopens the same tracker runs from it. Steps a crash made the job
redo (logged before the crash, after the last checkpoint) are never logged twice: TensorBoard purges them and logs
the redone values; W&B, trackio and MLflow cannot drop points, so they keep the values first logged and the job
skips those steps (and evaluations of steps already logged). `agentrl eval` on a run directory logs its results into
the same tracker runs.

Evaluation during training runs between two steps' logs (after update N, before step N-1's row is logged); its
results are held until the step before them is logged, so every tracker sees steps in order (W&B drops a step lower
than one it already has). A tracker that fails while logging is reported once and switched off: training goes on.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.errors import MissingDependencyError
from agentrl.trainer.trackers.record import eval_scalars, histograms, scalars, trajectory_table
from agentrl.types import Trajectory

log = logging.getLogger("agentrl.trainer")

TRACKERS = ("tensorboard", "wandb", "trackio", "mlflow")
STATE_FILE = "trackers.json"
# tracker -> (modules it needs, the extra that installs them)
REQUIRES: dict[str, tuple[tuple[str, ...], str]] = {
    "tensorboard": (("tensorboard",), "tensorboard"),
    "wandb": (("wandb",), "wandb"),
    "trackio": (("trackio",), "trackio"),
    "mlflow": (("mlflow", "sqlalchemy", "alembic"), "mlflow"),
}


def check_trackers(names: Iterable[str]) -> None:
    """Refuse up front (before the model loads) when a tracker's library is not installed."""
    for name in names:
        modules, extra = REQUIRES[name]
        missing = [m for m in modules if importlib.util.find_spec(m) is None]
        if missing:
            raise MissingDependencyError(
                f"report_to: {name} needs {', '.join(missing)}, which is not installed: run "
                f"`pip install 'agentrl[{extra}]'` (or 'agentrl[trackers]' for all four), or remove {name} from "
                f"report_to / --report-to")


def prepare_environment(names: Iterable[str], run_dir: Path) -> None:
    """Set what a tracker library reads once, when it is first imported: TRACKIO_DIR (default `<run>/trackio`, or
    where the run's trackio store already is), unless the user set it. TRL imports trackio with itself, so the CLI
    calls this before the trainer is imported; a library user sets TRACKIO_DIR themselves."""
    if "trackio" in names:
        where = read_state(run_dir).get("trackio", {}).get("dir") or str((Path(run_dir) / "trackio").resolve())
        os.environ.setdefault("TRACKIO_DIR", where)


def read_state(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / STATE_FILE
    if not path.exists():
        return {}
    try:
        return dict(json.loads(path.read_text()))
    except (ValueError, TypeError):
        log.warning("%s is unreadable: the trackers start new runs", path)
        return {}


def tracked_names(state: dict[str, Any]) -> list[str]:
    """The trackers a run's trackers.json records a run of (its other keys are not trackers)."""
    return [name for name, entry in state.items() if isinstance(entry, dict)]


def _write_state(run_dir: Path, state: dict[str, Any]) -> None:
    path = Path(run_dir) / STATE_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state, indent=1) + "\n")
    os.replace(tmp, path)


class TrackerSet:
    """The trackers of one run (see the module docstring). `resume_step`: the step a resumed training run continues
    at (None: a new run, or `append`: add evaluation results to the trackers of a finished run)."""

    def __init__(self, run_dir: Path, names: Sequence[str], *, resume_step: int | None = None, project: str,
                 run_name: str | None = None, config: Mapping[str, Any] | None = None,
                 prompts: Mapping[str, str] | None = None, table_rows: int = 4) -> None:
        from agentrl.trainer.trackers.backends import BACKENDS

        check_trackers(names)
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.state = read_state(self.run_dir)
        self.prompts = dict(prompts or {})
        self.table_rows = table_rows
        self.trackers: list[Any] = []
        self.skip_through: dict[str, int] = {}  # tracker -> steps <= this were logged before a resume: not again
        self.skip_eval_through: dict[str, int] = {}  # the same for evaluation results
        # evaluation results (step, values, from training) waiting for the step before them
        self.pending: list[tuple[int, dict[str, float], bool]] = []
        self.last_row_step = -1 if resume_step is None else resume_step - 1
        try:
            for name in dict.fromkeys(names):
                prev = dict(self.state.get(name, {}))
                last = int(prev.get("last_step", -1))
                redone = resume_step is not None and last >= resume_step
                tracker = BACKENDS[name](self.run_dir, prev, project=project, run_name=run_name,
                                         config=dict(config or {}),
                                         purge_step=resume_step if redone else None if prev else 0)
                purged = redone and tracker.rewinds  # steps >= resume_step are gone from this tracker
                last_eval = int(prev.get("last_eval_step", -1))
                if purged:
                    assert resume_step is not None
                    last, last_eval = resume_step - 1, min(last_eval, resume_step - 1)
                self.skip_through[name] = last if redone else -1
                self.skip_eval_through[name] = last_eval if resume_step is not None else -1
                self.state[name] = {**tracker.info(), "last_step": last, "last_eval_step": last_eval}
                self.trackers.append(tracker)
        except BaseException:
            self.close()
            raise
        _write_state(self.run_dir, self.state)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.trackers]

    def log_step(self, row: Mapping[str, Any], trajectories: Sequence[Trajectory]) -> None:
        """One training step: the metrics row as written to metrics.jsonl, plus the step's trajectories."""
        step = int(row["step"])
        values, hists = scalars(row), histograms(trajectories)
        table = trajectory_table(step, trajectories, self.prompts, self.table_rows)
        for tracker in list(self.trackers):
            if step > self.skip_through.get(tracker.name, -1):
                self._call(tracker, step, values, hists, table)
        self.last_row_step = max(self.last_row_step, step)
        self._flush(through=step + 1)
        _write_state(self.run_dir, self.state)

    def log_eval(self, step: int, result: Mapping[str, Any], prefix: str = "eval/", *, now: bool = False) -> None:
        """An evaluation of the weights after `step` updates; held until step-1's row is logged unless `now`."""
        self.pending.append((step, eval_scalars(result, prefix), not now))
        self._flush(through=None if now else self.last_row_step + 1)
        _write_state(self.run_dir, self.state)

    def _flush(self, through: int | None) -> None:
        ready = [p for p in self.pending if through is None or p[0] <= through]
        self.pending = [p for p in self.pending if p not in ready]
        for step, values, training in ready:
            for tracker in list(self.trackers):
                if not training or step > self.skip_eval_through.get(tracker.name, -1):  # else logged before
                    self._call(tracker, step, values, {}, None, eval_step=training)

    def _call(self, tracker: Any, step: int, values: dict[str, float], hists: dict[str, list[float]],
              table: list[list[Any]] | None, eval_step: bool | None = None) -> None:
        """`eval_step`: None for a training step's row, True for a training evaluation, False for `agentrl eval`."""
        try:
            tracker.log(step, values, hists, table)
        except Exception as exc:  # a tracker's failure never stops training; metrics.jsonl has every step
            log.warning("tracker %s failed at step %d and is switched off for this run: %s", tracker.name, step, exc)
            self.state[tracker.name]["error"] = f"step {step}: {exc}"
            self.trackers.remove(tracker)
            return
        key = {None: "last_step", True: "last_eval_step"}.get(eval_step)
        if key is not None:
            self.state[tracker.name][key] = max(int(self.state[tracker.name].get(key, -1)), step)

    def close(self) -> None:
        """Log held evaluation results, close every tracker (W&B / trackio / MLflow finish their run)."""
        self._flush(through=None)
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception as exc:
                log.warning("tracker %s failed to close: %s", tracker.name, exc)
        self.trackers = []
        if self.state:
            _write_state(self.run_dir, self.state)

    def __enter__(self) -> TrackerSet:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def where(run_dir: Path) -> list[str]:
    """One line per tracker of a run: where it wrote and how to open it (from trackers.json)."""
    state = read_state(run_dir)
    return [f"{name}: {state[name].get('open') or state[name].get('sync') or state[name].get('dir')}"
            for name in tracked_names(state)]
