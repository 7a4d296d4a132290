"""Behaviour snapshots: the policy *as deployed*, watched during training.

Every `snapshot.every` optimizer steps (and once before the first, step 0) the current weights (synced to the engine
first) roll out a fixed task set through the same runner, scheduler and reward as training: `samples` runs per task
with the training sampling parameters ("sampled") and, if `greedy`, one run at temperature 0 ("greedy"). Snapshots
run right after the checkpoint of that step is saved, so `snapshot.every` is a multiple of `checkpoint_every`.

Output:

    snapshots.jsonl                                one row per (step, mode), `behaviour_row` below
    checkpoints/checkpoint-<N>/snapshot.jsonl      the rollouts of the weights saved in that checkpoint
    checkpoints/start/snapshot.jsonl               step 0: the weights training started from

Row metrics (over the non-infra_error trajectories of that step and mode; None when there are none):
reward_mean, pass_rate (all hidden tests passed), completion_len_mean (model tokens only), format_rate (the env's
action format followed: `agentrl.reward.format_followed`, whatever the reward config), tool_error_rate (failed or
malformed calls / all attempted calls), truncation_rate (truncated or context_exhausted), reward_components (mean of
each source's unweighted value). The signature of reward hacking: reward up, length up, pass rate flat.
"""

from __future__ import annotations

import time
from pathlib import Path
from statistics import mean
from typing import Any

from agentrl.envs.base import Task
from agentrl.reward import format_followed
from agentrl.reward.unit_tests import fully_correct
from agentrl.store import TrajectoryStore
from agentrl.trainer.eval import SchedulerFactory, greedy_of, run_mode
from agentrl.types import SamplingParams, Status, Trajectory

SNAPSHOT_FILE = "snapshot.jsonl"
START_DIR = "start"
ROW_KEYS = ("step", "mode", "trajectories", "infra_errors", "reward_mean", "pass_rate", "completion_len_mean",
            "format_rate", "tool_error_rate", "truncation_rate", "reward_components", "rollouts", "time_s")


def snapshot_path(checkpoints_dir: Path, step: int) -> Path:
    """Where the rollouts of the weights after `step` optimizer steps are stored."""
    return checkpoints_dir / (f"checkpoint-{step}" if step else START_DIR) / SNAPSHOT_FILE


def _mean(values: list[float]) -> float | None:
    return mean(values) if values else None


def behaviour_row(step: int, mode: str, trajs: list[Trajectory], *, rollouts: str, time_s: float) -> dict[str, Any]:
    """The `snapshots.jsonl` row of one step and mode (see the module docstring)."""
    ok = [t for t in trajs if t.status is not Status.infra_error]
    attempted = sum(t.num_tool_calls + sum(len(turn.parse_errors) for turn in t.turns) for t in ok)
    keys = sorted({k for t in ok for k in t.reward_components})
    return {
        "step": step, "mode": mode, "trajectories": len(trajs), "infra_errors": len(trajs) - len(ok),
        "reward_mean": _mean([float(t.reward) for t in ok if t.reward is not None]),
        "pass_rate": _mean([float(fully_correct(t)) for t in ok]),
        "completion_len_mean": _mean([float(t.num_model_tokens) for t in ok]),
        "format_rate": _mean([float(format_followed(t)) for t in ok]),
        "tool_error_rate": sum(t.num_tool_errors for t in ok) / attempted if attempted else (0.0 if ok else None),
        "truncation_rate": _mean([float(t.status in (Status.truncated, Status.context_exhausted)) for t in ok]),
        "reward_components": {k: _mean([t.reward_components[k] for t in ok if k in t.reward_components])
                              for k in keys},
        "rollouts": rollouts, "time_s": round(time_s, 3),
    }


async def run_snapshot(schedulers: SchedulerFactory, tasks: list[Task], *, sampling: SamplingParams, step: int,
                       samples: int, greedy: bool, meta: dict[str, Any], store_path: Path,
                       output_dir: Path) -> list[dict[str, Any]]:
    """Roll out `tasks` with the current weights in each mode, store them at `store_path`; one row per mode.
    `schedulers`: the run's scheduler factory (agentrl.compose.RunParts.scheduler)."""
    modes = {"sampled": (sampling, samples)} if samples else {}
    if greedy:
        modes["greedy"] = (greedy_of(sampling), 1)
    store_path.parent.mkdir(parents=True, exist_ok=True)
    store_path.unlink(missing_ok=True)  # a snapshot cut by a crash is redone whole
    rel = str(store_path.relative_to(output_dir)) if store_path.is_relative_to(output_dir) else str(store_path)
    rows = []
    with TrajectoryStore(store_path) as store:
        for mode, (mode_sampling, n) in modes.items():
            t0 = time.perf_counter()
            trajs = await run_mode(schedulers, tasks, sampling=mode_sampling, samples=n, store=store, step=step,
                                   meta={**meta, "snapshot": step, "snapshot_mode": mode})
            rows.append(behaviour_row(step, mode, trajs, rollouts=rel, time_s=time.perf_counter() - t0))
    return rows
