"""Evaluation: run a fixed task set with the training sampling parameters and greedily, and diff two evaluations.

Owns: the per-task scores of one policy (`evaluate`), the diff report between a baseline and a candidate joined by
task id (never by arrival order), and its JSON / text renderings. Does not own building engines or loading
checkpoints (the CLI and `checkpoints.py` do), nor the trajectory loop (runner).

Modes: "sampled" runs every task `samples` times with the job's SamplingParams (its score is the mean reward),
"greedy" runs it once at temperature 0. A task is "better" / "worse" when the candidate's score is above / below the
baseline's by more than `tol`, else "unchanged"; tasks without a score on one side (every run an infra error, or the
task missing) are listed as "missing" and never counted as worse.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from statistics import mean
from typing import Any

from agentrl.envs.base import Task
from agentrl.reward import Scorer
from agentrl.runner import Rollout, Scheduler, SchedulerConfig
from agentrl.store import TrajectoryStore
from agentrl.types import SamplingParams, Trajectory

MODES = ("sampled", "greedy")
TOLERANCE = 1e-9


def task_scores(trajectories: list[Trajectory]) -> dict[str, dict[str, Any]]:
    """task id -> {rewards, score (mean of scored runs, None if none), pass_rate, infra_errors}."""
    by_task: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        by_task.setdefault(t.task_id, []).append(t)
    out = {}
    for task_id, trajs in by_task.items():
        trajs.sort(key=lambda t: t.sample_index)
        scored = [float(t.reward) for t in trajs if t.reward is not None]
        out[task_id] = {
            "rewards": [t.reward for t in trajs],
            "score": mean(scored) if scored else None,
            "pass_rate": mean([float(r >= 1.0) for r in scored]) if scored else None,
            "infra_errors": sum(t.reward is None for t in trajs),
        }
    return out


async def run_mode(rollout: Rollout, pool: Any, tasks: list[Task], *, samples: int, sched: SchedulerConfig,
                   meta: dict[str, Any], store: TrajectoryStore | None = None, scorer: Scorer | None = None,
                   step: int | None = None, parent: Scheduler | None = None) -> list[Trajectory]:
    """`parent`: the training job's scheduler, whose `max_trajectories` slots evaluation shares. Deterministic
    runs: ids and seeds per mode, the same for every policy evaluated (paired comparisons)."""
    namespace = f"{sched.namespace}|eval|{meta.get('eval_mode', '')}"
    if parent is not None:
        scheduler = parent.sibling(rollout, group_size=samples, meta=meta, scorer=scorer, namespace=namespace)
    else:
        scheduler = Scheduler(rollout, pool, dataclasses.replace(sched, group_size=samples, namespace=namespace),
                              meta=meta, scorer=scorer)
    out: list[Trajectory] = []
    async for group in scheduler.run(tasks, step=step):
        if store is not None:
            await asyncio.to_thread(store.append_group, group)
        out += group
    return out


async def evaluate(rollout: Rollout, pool: Any, tasks: list[Task], *, samples: int, greedy: bool,
                   sched: SchedulerConfig, label: str, meta: dict[str, Any] | None = None,
                   store_path: Path | None = None, scorer: Scorer | None = None,
                   parent: Scheduler | None = None) -> dict[str, Any]:
    """Score `tasks` with `rollout`'s sampling (`samples` runs each) and, if `greedy`, once at temperature 0."""
    modes: dict[str, SamplingParams] = {"sampled": rollout.sampling}
    if greedy:
        modes["greedy"] = rollout.sampling.model_copy(update={"temperature": 0.0, "seed": None})
    result: dict[str, Any] = {"label": label, "task_ids": [t.id for t in tasks], "modes": {}}
    store = TrajectoryStore(store_path, resume=True) if store_path is not None else None
    try:  # the modes run concurrently so the engine batches them together
        runs = await asyncio.gather(*(
            run_mode(dataclasses.replace(rollout, sampling=sampling), pool, tasks,
                     samples=samples if mode == "sampled" else 1, sched=sched, store=store, scorer=scorer,
                     parent=parent,
                     meta={**(meta or {}), "eval": label, "eval_mode": mode})
            for mode, sampling in modes.items()))
        for mode, trajs in zip(modes, runs):
            scores = task_scores(trajs)
            values = [s["score"] for s in scores.values() if s["score"] is not None]
            result["modes"][mode] = {"tasks": scores, "mean": mean(values) if values else None}
    finally:
        if store is not None:
            store.close()
    return result


def _verdict(base: float | None, cand: float | None, tol: float) -> str:
    if base is None or cand is None:
        return "missing"
    if cand > base + tol:
        return "better"
    if cand < base - tol:
        return "worse"
    return "unchanged"


def diff_evals(baseline: dict[str, Any], candidate: dict[str, Any], tol: float = TOLERANCE) -> dict[str, Any]:
    """Per-task diff of two `evaluate` results, joined by task id."""
    report: dict[str, Any] = {"baseline": baseline["label"], "candidate": candidate["label"], "modes": {}}
    for mode in MODES:
        if mode not in baseline["modes"] or mode not in candidate["modes"]:
            continue
        base, cand = baseline["modes"][mode]["tasks"], candidate["modes"][mode]["tasks"]
        order = list(dict.fromkeys(candidate.get("task_ids", []) + baseline.get("task_ids", [])
                                   + sorted(set(base) | set(cand))))
        rows, counts = [], {"better": 0, "worse": 0, "unchanged": 0, "missing": 0}
        for task_id in order:
            b = base.get(task_id, {}).get("score")
            c = cand.get(task_id, {}).get("score")
            verdict = _verdict(b, c, tol)
            counts[verdict] += 1
            rows.append({"task_id": task_id, "baseline": b, "candidate": c,
                         "delta": None if b is None or c is None else c - b, "verdict": verdict})
        report["modes"][mode] = {**counts, "mean_baseline": baseline["modes"][mode]["mean"],
                                 "mean_candidate": candidate["modes"][mode]["mean"], "tasks": rows}
    return report


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def format_diff(report: dict[str, Any], *, max_rows: int = 40) -> str:
    lines = [f"eval diff: candidate {report['candidate']}  vs  baseline {report['baseline']}"]
    for mode, m in report["modes"].items():
        lines.append(f"\n[{mode}] mean {_fmt(m['mean_baseline'])} -> {_fmt(m['mean_candidate'])}   better "
                     f"{m['better']}  worse {m['worse']}  unchanged {m['unchanged']}  missing {m['missing']}")
        lines.append(f"  {'task':40s} {'baseline':>8s} {'candidate':>9s} {'delta':>7s}  verdict")
        changed = [r for r in m["tasks"] if r["verdict"] != "unchanged"]
        for r in (changed or m["tasks"])[:max_rows]:
            lines.append(f"  {r['task_id'][:40]:40s} {_fmt(r['baseline']):>8s} {_fmt(r['candidate']):>9s} "
                         f"{_fmt(r['delta']):>7s}  {r['verdict']}")
        hidden = len(changed or m["tasks"]) - max_rows
        if hidden > 0:
            lines.append(f"  ... {hidden} more rows in the JSON report")
        if changed and len(changed) < len(m["tasks"]):
            lines.append(f"  ({len(m['tasks']) - len(changed)} unchanged tasks not shown)")
    return "\n".join(lines)


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)
