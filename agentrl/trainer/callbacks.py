"""The transformers `TrainerCallback` of a job: per-step metrics line + table row, and evaluation every K steps.

Owns the timing of a step (on_step_begin .. on_step_end, minus the rollout and weight-sync time the rollout function
measured = train time; evaluation and checkpoint saving are outside the step) and when evaluation runs: before the
first step (the baseline, "step-0"), after every `eval_every` optimizer steps, and after the last step; and when
behaviour snapshots run: before the first step and right after each saved checkpoint whose step is a multiple of
`snapshot_every` (so their rollouts go into that checkpoint's directory).

With `report_to`, rank 0 forwards each step's row (exactly what metrics.jsonl gets) and the step's trajectories to the
experiment trackers (agentrl.trainer.trackers).

Ranks other than 0 run the same callback without a writer (their rollout function records no steps) so that they
join rank 0's weight sync before evaluation and snapshots; `RankStop` carries rank 0's stop to them.

Callback order within one optimizer step (transformers 5): on_step_begin -> [rollout_func, forward/backward,
optimizer.step] -> on_step_end (global_step already incremented) -> on_log (TRL's averaged logs) -> save.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from agentrl.runner import integrity
from agentrl.trainer.dist import Ranks
from agentrl.trainer.metrics import MetricsWriter, step_metrics, table_header, table_row
from agentrl.trainer.rollout_func import AgentRollout

log = logging.getLogger("agentrl.integrity")


class StepCallback(TrainerCallback):
    def __init__(self, rollout: AgentRollout, writer: MetricsWriter | None, *, total_steps: int,
                 echo: Callable[[str], None] = print, eval_every: int = 0,
                 run_eval: Callable[[int], None] | None = None, snapshot_every: int = 0,
                 run_snapshot: Callable[[int], None] | None = None, gc_monitor: Any = None,
                 loop_lag: Any = None, integrity_options: Any = None, trackers: Any = None) -> None:
        self.rollout = rollout
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

    def _eval(self, step: int) -> None:
        if self.run_eval is not None and self.eval_every and step not in self.evaluated:
            self.evaluated.add(step)
            self.run_eval(step)

    def _snapshot(self, step: int) -> None:
        if self.run_snapshot is not None and self.snapshot_every and step % self.snapshot_every == 0 \
                and step not in self.snapshotted:
            self.snapshotted.add(step)
            self.run_snapshot(step)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.echo(table_header())
        if state.global_step == 0:
            self._eval(0)
            self._snapshot(0)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._snapshot(state.global_step)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._t0 = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._t_end = time.perf_counter()
        if self.eval_every and state.global_step % self.eval_every == 0:
            self._eval(state.global_step)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        logs = logs or {}
        if "loss" not in logs:
            return  # the end-of-training summary log, not a step
        step = state.global_step - 1
        done = self.rollout.steps.pop(step, None)
        if done is None:
            return
        sync_s = self.rollout.sync_s.pop(step, 0.0)
        train_s = max(0.0, self._t_end - self._t0 - done.rollout_s - sync_s)
        row = step_metrics(step, done.trajectories, logs, rollout_s=done.rollout_s, train_s=train_s,
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
        self._alarm(control, alarms)

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

    def _alarm(self, control: Any, alarms: list[integrity.Alarm]) -> None:
        """Integrity alarm after the step's row is stored: warn, and with action `stop` end training after it."""
        opts = self.integrity
        if opts is None:
            return
        for alarm in alarms:
            log.warning("%s", alarm)
            self.echo(f"WARNING: {alarm}; see the flagged trajectories with `agentrl view` / `agentrl stats`")
        self.alarms += alarms
        if alarms and opts.action == "stop" and self.stopped_by is None:
            self.stopped_by = alarms[0]
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.eval_every:
            self._eval(state.global_step)


class RankStop(TrainerCallback):
    """Several ranks: after each step's log, every rank learns whether rank 0 (whose StepCallback raised the
    integrity alarm) stops training, so that no rank waits for a step the others never start. Registered after
    the StepCallback."""

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if "loss" in (logs or {}) and self.ranks.share(lambda: bool(control.should_training_stop)):
            control.should_training_stop = True
