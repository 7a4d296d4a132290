"""Evaluation: run a fixed task set with the training sampling parameters and greedily, and diff two evaluations.

Owns: the per-task scores of one policy (`evaluate`), the diff report between a baseline and a candidate joined by
task id (never by arrival order), and its JSON / text renderings. Does not own building engines or loading
checkpoints (the CLI and `checkpoints.py` do), nor the trajectory loop (runner), nor building schedulers (they come
from the composition root's factory, `agentrl.compose.RunParts.scheduler`).

Modes: "sampled" runs every task `samples` times with the job's SamplingParams (its score is the mean reward),
"greedy" runs it once at temperature 0. Each mode's mean comes with a 95% bootstrap interval over tasks, and the
candidate-vs-baseline difference with a paired sign-flip permutation test over tasks (`eval_stats.py`). A task is
"better" / "worse" only when its samples differ significantly (two-sample permutation test, p < 0.05; one sample per
side never is), "n.s." when its score moved but not significantly, "unchanged" when it did not move; tasks without
a score on one side (every run an infra error, or the task missing) are "missing" and never counted as worse.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from statistics import mean
from typing import Any

from agentrl.envs.base import Task
from agentrl.store import TrajectoryStore
from agentrl.trainer import eval_stats
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


SchedulerFactory = Callable[..., Any]
"""Builds a scheduler over the run's pool and scorer (agentrl.compose.RunParts.scheduler, possibly sharing the
training scheduler's slots): keywords sampling, group_size, namespace, meta."""


async def run_mode(schedulers: SchedulerFactory, tasks: list[Task], *, sampling: SamplingParams, samples: int,
                   meta: dict[str, Any], store: TrajectoryStore | None = None,
                   step: int | None = None) -> list[Trajectory]:
    """`samples` runs of every task with `sampling`. Deterministic runs: ids and seeds per mode, the same for every
    policy evaluated (paired comparisons)."""
    scheduler = schedulers(sampling=sampling, group_size=samples, meta=meta,
                           namespace=f"|eval|{meta.get('eval_mode', '')}")
    out: list[Trajectory] = []
    async for group in scheduler.run(tasks, step=step):
        if store is not None:
            await asyncio.to_thread(store.append_group, group)
        out += group
    return out


def greedy_of(sampling: SamplingParams) -> SamplingParams:
    return sampling.model_copy(update={"temperature": 0.0, "seed": None})


async def evaluate(schedulers: SchedulerFactory, tasks: list[Task], *, sampling: SamplingParams, samples: int,
                   greedy: bool, label: str, meta: dict[str, Any] | None = None,
                   store_path: Path | None = None) -> dict[str, Any]:
    """Score `tasks` with `sampling` (`samples` runs each) and, if `greedy`, once at temperature 0."""
    modes: dict[str, SamplingParams] = {"sampled": sampling}
    if greedy:
        modes["greedy"] = greedy_of(sampling)
    result: dict[str, Any] = {"label": label, "task_ids": [t.id for t in tasks], "modes": {}}
    store = TrajectoryStore(store_path, resume=True) if store_path is not None else None
    try:  # the modes run concurrently so the engine batches them together
        runs = await asyncio.gather(*(
            run_mode(schedulers, tasks, sampling=mode_sampling, samples=samples if mode == "sampled" else 1,
                     store=store, meta={**(meta or {}), "eval": label, "eval_mode": mode})
            for mode, mode_sampling in modes.items()))
        for mode, trajs in zip(modes, runs):
            scores = task_scores(trajs)
            values = [s["score"] for s in scores.values() if s["score"] is not None]
            result["modes"][mode] = {"tasks": scores, "mean": mean(values) if values else None}
    finally:
        if store is not None:
            store.close()
    return result


VERDICTS = ("better", "worse", "n.s.", "unchanged", "missing")


def _verdict(base: float | None, cand: float | None, p_value: float, tol: float) -> str:
    if base is None or cand is None:
        return "missing"
    if abs(cand - base) <= tol:
        return "unchanged"
    if p_value >= eval_stats.ALPHA:
        return "n.s."
    return "better" if cand > base else "worse"


def _scored(entry: dict[str, Any]) -> list[float]:
    return [float(r) for r in entry.get("rewards", []) if r is not None]


def _task_row(task_id: str, b: dict[str, Any], c: dict[str, Any], tol: float, seed: int) -> dict[str, Any]:
    bs, cs = b.get("score"), c.get("score")
    p = eval_stats.permutation_p(_scored(b), _scored(c), seed=seed) if bs is not None and cs is not None else 1.0
    return {"task_id": task_id, "baseline": bs, "candidate": cs, "delta": None if bs is None or cs is None else cs - bs,
            "samples": [len(_scored(b)), len(_scored(c))], "p_value": p, "verdict": _verdict(bs, cs, p, tol)}


def _mode_stats(rows: list[dict[str, Any]], base: dict[str, Any], cand: dict[str, Any], seed: int) -> dict[str, Any]:
    b_scores = [v["score"] for v in base.values() if v.get("score") is not None]
    c_scores = [v["score"] for v in cand.values() if v.get("score") is not None]
    both = [r for r in rows if r["verdict"] != "missing"]
    return {"ci95_baseline": eval_stats.bootstrap_ci(b_scores, seed=seed),
            "ci95_candidate": eval_stats.bootstrap_ci(c_scores, seed=seed),
            "difference": eval_stats.paired_difference([r["baseline"] for r in both], [r["candidate"] for r in both],
                                                       seed=seed)}


def diff_evals(baseline: dict[str, Any], candidate: dict[str, Any], tol: float = TOLERANCE,
               seed: int = 0) -> dict[str, Any]:
    """Per-task diff of two `evaluate` results, joined by task id, with intervals and tests (seeded)."""
    report: dict[str, Any] = {"baseline": baseline["label"], "candidate": candidate["label"], "alpha": eval_stats.ALPHA,
                              "modes": {}}
    for mode in MODES:
        if mode not in baseline["modes"] or mode not in candidate["modes"]:
            continue
        base, cand = baseline["modes"][mode]["tasks"], candidate["modes"][mode]["tasks"]
        order = list(dict.fromkeys(candidate.get("task_ids", []) + baseline.get("task_ids", [])
                                   + sorted(set(base) | set(cand))))
        rows = [_task_row(t, base.get(t, {}), cand.get(t, {}), tol, seed) for t in order]
        counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
        report["modes"][mode] = {**counts, "mean_baseline": baseline["modes"][mode]["mean"],
                                 "mean_candidate": candidate["modes"][mode]["mean"],
                                 **_mode_stats(rows, base, cand, seed), "tasks": rows}
    return report


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _ci(ci: list[float] | tuple[float, float] | None) -> str:
    return "" if ci is None else f" [{ci[0]:.3f}, {ci[1]:.3f}]"


def _summary_lines(mode: str, m: dict[str, Any]) -> list[str]:
    d = m.get("difference") or {}
    if d.get("mean") is None:
        verdict = "no task scored on both sides"
    else:
        sig = "significant" if d["significant"] else "not significant (n.s.)"
        verdict = (f"difference {d['mean']:+.3f}{_ci(d['ci95'])}, p = {d['p_value']:.3g} over {d['tasks']} tasks: "
                   f"{sig} ({d['test']})")
    return [f"\n[{mode}] mean {_fmt(m['mean_baseline'])}{_ci(m.get('ci95_baseline'))} -> "
            f"{_fmt(m['mean_candidate'])}{_ci(m.get('ci95_candidate'))}  (95% bootstrap intervals over tasks)",
            f"  {verdict}",
            f"  tasks: better {m['better']}  worse {m['worse']}  n.s. {m.get('n.s.', 0)}  unchanged {m['unchanged']}"
            f"  missing {m['missing']}  (per task: permutation test of its samples, p < 0.05)"]


def format_diff(report: dict[str, Any], *, max_rows: int = 40) -> str:
    lines = [f"eval diff: candidate {report['candidate']}  vs  baseline {report['baseline']}"]
    for mode, m in report["modes"].items():
        lines += _summary_lines(mode, m)
        lines.append(f"  {'task':40s} {'baseline':>8s} {'candidate':>9s} {'delta':>7s} {'p':>6s}  verdict")
        changed = [r for r in m["tasks"] if r["verdict"] != "unchanged"]
        for r in (changed or m["tasks"])[:max_rows]:
            p = f"{r['p_value']:.2f}" if r.get("p_value") is not None else "-"
            lines.append(f"  {r['task_id'][:40]:40s} {_fmt(r['baseline']):>8s} {_fmt(r['candidate']):>9s} "
                         f"{_fmt(r['delta']):>7s} {p:>6s}  {r['verdict']}")
        hidden = len(changed or m["tasks"]) - max_rows
        if hidden > 0:
            lines.append(f"  ... {hidden} more rows in the JSON report")
        if changed and len(changed) < len(m["tasks"]):
            lines.append(f"  ({len(m['tasks']) - len(changed)} unchanged tasks not shown)")
    if any(r["verdict"] == "n.s." for m in report["modes"].values() for r in m["tasks"]):
        lines.append(f"\nn.s.: too few samples to tell. {eval_stats.samples_table()}; set --samples.")
    return "\n".join(lines)


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)
