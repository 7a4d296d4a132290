"""One class per experiment tracker: TensorBoard, Weights & Biases, trackio and MLflow, each over its own library.

Owns how each library is opened offline-first under the run directory, how a resumed run reopens the same tracker
run, and how one step (scalars, histograms, the trajectory table) is written. Every library is imported here, lazily,
when its tracker is opened; `agentrl.trainer.trackers` checks up front that they are installed.

Where each writes (unless the user's own environment variable says otherwise):

    tensorboard   <run>/tensorboard/            event files (`tensorboard --logdir <run>`); the table as a text panel
    wandb         <run>/wandb/offline-run-*/    WANDB_MODE=offline unless set (`wandb sync <dir>` uploads later)
    trackio       <run>/trackio/                its SQLite store, unless TRACKIO_DIR is set (`trackio show`); read
                                                when trackio is first imported (prepare_environment)
    mlflow        <run>/mlflow/mlflow.db        SQLite store + artifacts, unless MLFLOW_TRACKING_URI is set

Resume: `state` is what `info()` returned in the earlier process (trackers.json); W&B reopens its run id, MLflow its
run id, trackio its run name, TensorBoard its directory. Only TensorBoard can drop points already written:
`rewinds` says so (it purges steps >= the resumed step, so redone steps replace the old ones); the caller skips
already-logged steps for the others.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

from agentrl.trainer.trackers.record import TABLE_COLUMNS

log = logging.getLogger("agentrl.trainer")
TABLE_KEY = "train/trajectory_table"


class TensorBoardTracker:
    name = "tensorboard"
    rewinds = True

    def __init__(self, run_dir: Path, state: dict[str, Any], *, purge_step: int | None, **_: Any) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: 0 starts a new run (its session start; TensorBoard's UI purges only at a later start), a step
        # purges the steps >= it that a resumed run redoes, None appends (`agentrl eval`)
        self.dir = run_dir / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.dir), purge_step=purge_step)

    def info(self) -> dict[str, Any]:
        return {"dir": str(self.dir), "open": f"tensorboard --logdir {self.dir}"}

    def log(self, step: int, scalars: dict[str, float], histograms: dict[str, list[float]],
            table: list[list[Any]] | None) -> None:
        import numpy as np

        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        for key, values in histograms.items():
            self.writer.add_histogram(key, np.asarray(values, dtype=np.float64), step)
        if table:
            self.writer.add_text(TABLE_KEY, markdown_table(table), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def markdown_table(rows: list[list[Any]]) -> str:
    """TensorBoard's text panel renders markdown: one row per trajectory, newlines as <br>."""
    def cell(value: Any) -> str:
        return "" if value is None else str(value).replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows])


class WandbTracker:
    name = "wandb"
    rewinds = False

    def __init__(self, run_dir: Path, state: dict[str, Any], *, project: str, run_name: str | None,
                 config: dict[str, Any], **_: Any) -> None:
        import wandb

        self.wandb = wandb
        self.mode = os.environ.get("WANDB_MODE") or "offline"  # offline first: the user's mode wins when set
        self.id = state.get("id") or uuid.uuid4().hex[:8]
        self.previous_dirs = list(state.get("dirs", []))
        # show_warnings off: TRL asks every checkpoint's model card for the run URL, which warns in offline mode
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, disable_git=True,
                                  save_code=False, x_save_requirements=False, disable_job_creation=True,
                                  show_warnings=False)
        self.run = wandb.init(project=state.get("project", project), name=run_name, id=self.id, resume="allow",
                              dir=str(run_dir), config=config, mode=self.mode,  # type: ignore[arg-type]  # W&B checks it
                              settings=settings)
        self.dir = Path(self.run.dir).parent  # <run>/wandb/offline-run-<time>-<id>

    def info(self) -> dict[str, Any]:
        dirs = [*self.previous_dirs, str(self.dir)] if str(self.dir) not in self.previous_dirs else self.previous_dirs
        return {"id": self.id, "mode": self.mode, "project": self.run.project, "dirs": dirs,
                "sync": "wandb sync " + " ".join(dirs) if self.mode == "offline" else None}

    def log(self, step: int, scalars: dict[str, float], histograms: dict[str, list[float]],
            table: list[list[Any]] | None) -> None:
        data: dict[str, Any] = dict(scalars)
        data.update({key: self.wandb.Histogram(values) for key, values in histograms.items()})
        if table:
            data[TABLE_KEY] = self.wandb.Table(columns=list(TABLE_COLUMNS), data=table)
        self.run.log(data, step=step)

    def close(self) -> None:
        self.run.finish()


class TrackioTracker:
    name = "trackio"
    rewinds = False

    def __init__(self, run_dir: Path, state: dict[str, Any], *, project: str, run_name: str | None,
                 config: dict[str, Any], **_: Any) -> None:
        os.environ.setdefault("TRACKIO_DIR", str((run_dir / "trackio").resolve()))  # read when trackio is imported
        import trackio
        from trackio import utils

        self.trackio = trackio
        self.project = state.get("project", project)
        self.run_name = state.get("run") or run_name or f"{run_dir.name}-{uuid.uuid4().hex[:8]}"
        self.dir = Path(utils.TRACKIO_DIR)  # where it really writes (recorded in trackers.json)
        if self.dir != Path(os.environ["TRACKIO_DIR"]):
            log.warning("trackio was imported before TRACKIO_DIR was set and writes to %s; set TRACKIO_DIR before "
                        "importing the trainer to keep its store under the run", self.dir)
        with contextlib.redirect_stdout(io.StringIO()):  # its "* Created new run" lines would split our table
            self.run = trackio.init(project=self.project, name=self.run_name, resume="allow", config=config,
                                    embed=False, auto_log_cpu=False, auto_log_gpu=False)

    def info(self) -> dict[str, Any]:
        return {"dir": str(self.dir), "project": self.project, "run": self.run_name,
                "open": f"TRACKIO_DIR={self.dir} trackio show --project {self.project}"}

    def log(self, step: int, scalars: dict[str, float], histograms: dict[str, list[float]],
            table: list[list[Any]] | None) -> None:
        data: dict[str, Any] = dict(scalars)
        data.update({key: self.trackio.Histogram(values) for key, values in histograms.items()})
        if table:
            data[TABLE_KEY] = self.trackio.Table(columns=list(TABLE_COLUMNS), data=table)
        self.run.log(data, step=step)

    def close(self) -> None:
        from trackio import context_vars

        with contextlib.redirect_stdout(io.StringIO()):
            self.run.finish()
            if context_vars.current_run.get() is self.run:  # else trackio finishes it again at exit, printing
                context_vars.current_run.set(None)


class MlflowTracker:
    name = "mlflow"
    rewinds = False

    def __init__(self, run_dir: Path, state: dict[str, Any], *, project: str, run_name: str | None,
                 config: dict[str, Any], **_: Any) -> None:
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        for noisy in ("mlflow", "alembic"):  # schema creation logs at INFO into the step table
            logging.getLogger(noisy).setLevel(logging.WARNING)

        self.Metric = Metric
        own = run_dir / "mlflow"
        self.uri = state.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI") or \
            f"sqlite:///{(own / 'mlflow.db').resolve()}"
        if self.uri.startswith("sqlite:///"):
            own.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=self.uri)
        self.experiment_id = state.get("experiment_id") or self._experiment(project, own)
        self.run_id = state.get("run_id") or self._create(run_name, config)

    def _experiment(self, project: str, own: Path) -> str:
        experiment = self.client.get_experiment_by_name(project)
        if experiment is not None:
            return str(experiment.experiment_id)
        artifacts = (own / "artifacts").resolve().as_uri() if self.uri.startswith("sqlite:///") else None
        return str(self.client.create_experiment(project, artifact_location=artifacts))

    def _create(self, run_name: str | None, config: dict[str, Any]) -> str:
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags={"agentrl.source": "agentrl train"})
        self.client.log_dict(run.info.run_id, config, "config.json")
        return str(run.info.run_id)

    def info(self) -> dict[str, Any]:
        return {"tracking_uri": self.uri, "experiment_id": self.experiment_id, "run_id": self.run_id,
                "open": f"mlflow ui --backend-store-uri {self.uri}"}

    def log(self, step: int, scalars: dict[str, float], histograms: dict[str, list[float]],
            table: list[list[Any]] | None) -> None:
        now = int(time.time() * 1000)
        metrics = [self.Metric(key, value, now, step) for key, value in scalars.items()]
        for i in range(0, len(metrics), 1000):  # MLflow's batch limit
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])
        if histograms:  # MLflow has no histogram type: the step's values as a JSON artifact
            self.client.log_dict(self.run_id, {"step": step, **histograms}, f"histograms/step-{step:06d}.json")
        if table:
            self.client.log_table(self.run_id, data={col: [row[i] for row in table]
                                                     for i, col in enumerate(TABLE_COLUMNS)},
                                  artifact_file=f"trajectories/step-{step:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


BACKENDS: dict[str, type] = {t.name: t for t in (TensorBoardTracker, WandbTracker, TrackioTracker, MlflowTracker)}
