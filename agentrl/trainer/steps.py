"""The job's step phases (`StepPhases` in phases.py): what agentrl does in each phase of a training step.

Owns the timing of a step (begin_step .. after_update, minus the rollout and weight-sync time the rollout measured =
train time; evaluation and checkpoint saving are outside the step), the step's metrics row (metrics.jsonl, the table
line, the experiment trackers of `report_to` on rank 0) and integrity alarm, and when evaluation runs: before the
first step (the baseline, "step-0"), after every `eval_every` optimizer steps, and after the last step; and when
behaviour snapshots run: before the first step and right after each saved checkpoint whose step is a multiple of
`snapshot_every` (so their rollouts go into that checkpoint's directory).

Does not own which trainer hook calls which phase (the TRL adapter, `trl_adapter/hooks.py`), rolling out
(`rollouts.py`), evaluating or snapshotting (job.py hands them in as `run_eval` / `run_snapshot`).

Ranks other than 0 run the same phases without a writer (their rollout records no steps) so that they join rank 0's
weight sync before evaluation and snapshots; the adapter carries rank 0's stop to them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from agentrl.runner import integrity
from agentrl.trainer.metrics import MetricsWriter, step_metrics, table_header, table_row
from agentrl.trainer.rollouts import AgentRollout, FollowerRollout
from agentrl.types import Trajectory

log = logging.getLogger("agentrl.integrity")


class TrainingSteps:
    """Implements phases.StepPhases; the methods below are in the order one step runs them."""

    def __init__(self, rollout: AgentRollout | FollowerRollout, writer: MetricsWriter | None, *, total_steps: int,
                 echo: Callable[[str], None] = print, eval_every: int = 0,
                 run_eval: Callable[[int], None] | None = None, snapshot_every: int = 0,
                 run_snapshot: Callable[[int], None] | None = None, gc_monitor: Any = None,
                 loop_lag: Any = None, integrity_options: Any = None, trackers: Any = None) -> None:
        self.rollout = rollout
        self.trainer: Any = None  # the trainer whose weights are synced; set once it is built
        self.writer = writer
        self.total_steps = total_steps
        self.echo = echo
        self.eval_every = eval_every
        self.run_eval = run_eval
        self.evaluated: set[int] = set()
        self.snapshot_every = snapshot_every
        self.run_snapshot = run_snapshot
        self.snapshotted: set[int] = set()
        self.rows: list[dict[str, Any]] = []
        self.gc_monitor = gc_monitor  # GcMonitor-like (`take()`: the collector's cost since the last call) or None
        self.loop_lag = loop_lag  # agentrl.runner.LoopLag on the job's loop, or None
        self.integrity = integrity_options  # trainer.config.IntegrityOptions, or None: no alarm
        self.trackers = trackers  # agentrl.trainer.trackers.TrackerSet (rank 0 with report_to), or None
        self.alarms: list[integrity.Alarm] = []
        self.stopped_by: integrity.Alarm | None = None  # the alarm that stopped training (action: stop)
        self._t0 = 0.0
        self._t_end = 0.0

    # -- the phases, in step order -------------------------------------------------------------------------------
    def before_training(self, step: int) -> None:
        self.echo(table_header())
        if step == 0:
            self._eval(0)
            self._snapshot(0)

    def begin_step(self) -> None:
        self._t0 = time.perf_counter()

    def sync_weights(self, step: int) -> None:
        self.rollout.maybe_sync(self.trainer, step)

    def rollout_and_score(self, step: int, task_ids: list[str]) -> list[Trajectory]:
        return self.rollout.rollout(step, task_ids)

    def after_update(self, step: int) -> None:
        self._t_end = time.perf_counter()
        if self.eval_every and step % self.eval_every == 0:
            self._eval(step)

    def record_step(self, step: int, update: dict[str, Any]) -> bool:
        """Step `step`'s metrics row from its rollout and its `update` (metrics.UPDATE_KEYS); True: stop training
        (an integrity alarm with action `stop`)."""
        done = self.rollout.steps.pop(step, None)
        if done is None:
            return False
        sync_s = self.rollout.sync_s.pop(step, 0.0)
        train_s = max(0.0, self._t_end - self._t0 - done.rollout_s - sync_s)
        row = step_metrics(step, done.trajectories, update, rollout_s=done.rollout_s, train_s=train_s,
                           sync_s=sync_s, reused=done.reused, engine_idle_s=done.engine_idle_s,
                           pipeline=done.pipeline, gc=self.gc_monitor.take() if self.gc_monitor else None,
                           lag=self.loop_lag.take() if self.loop_lag else None)
        self.rows.append(row)
        alarms = self._alarms(row)
        if self.writer is not None:
            self.writer.write(row)
        if self.trackers is not None:
            self.trackers.log_step(row, done.trajectories)
        self.echo(table_row(row))
        return self._alarm(alarms)

    def checkpoint_saved(self, step: int) -> None:
        self._snapshot(step)

    def after_training(self, step: int) -> None:
        if self.eval_every:
            self._eval(step)

    # -- internals -------------------------------------------------------------------------------------------------
    def _eval(self, step: int) -> None:
        if self.run_eval is not None and self.eval_every and step not in self.evaluated:
            self.evaluated.add(step)
            self.run_eval(step)

    def _snapshot(self, step: int) -> None:
        if self.run_snapshot is not None and self.snapshot_every and step % self.snapshot_every == 0 \
                and step not in self.snapshotted:
            self.snapshotted.add(step)
            self.run_snapshot(step)

    def _alarms(self, row: dict[str, Any]) -> list[integrity.Alarm]:
        """The integrity alarms of the step `row` ends; its alarm state goes into the row as
        `integrity_<signal>_alarm` (1: that signal's alarm rang at this step)."""
        opts = self.integrity
        if opts is None:
            return []
        alarms = integrity.check_alarm(self.rows, max_frac=opts.max_frac, window=opts.window, min_frac=opts.min_frac)
        rang = {a.signal for a in alarms}
        row.update({f"integrity_{name}_alarm": int(name in rang) for name in (*integrity.SIGNALS, *sorted(rang))})
        return alarms

    def _alarm(self, alarms: list[integrity.Alarm]) -> bool:
        """Integrity alarm after the step's row is stored: warn, and with action `stop` end training after it
        (True: this alarm stops training)."""
        opts = self.integrity
        if opts is None:
            return False
        for alarm in alarms:
            log.warning("%s", alarm)
            self.echo(f"WARNING: {alarm}; see the flagged trajectories with `agentrl view` / `agentrl stats`")
        self.alarms += alarms
        if alarms and opts.action == "stop" and self.stopped_by is None:
            self.stopped_by = alarms[0]
            return True
        return False
