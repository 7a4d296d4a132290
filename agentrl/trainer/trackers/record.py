"""What one step sends to the experiment trackers, derived from what agentrl already computed.

Owns the mapping from agentrl's records to tracker values, with no tracker library in sight:
- `scalars(row)`: every numeric value of the per-step metrics row (metrics.jsonl, metrics.py), under `train/<key>`.
  Generic on purpose: a key added to the row later reaches every tracker unchanged. Booleans become 0/1, nested
  dicts of numbers become `train/<key>/<sub>`, None, strings and lists are left out (metrics.jsonl keeps them).
- `histograms(trajectories)`: reward (scored trajectories only), turns and completion length of the step.
- `trajectory_table(trajectories, prompts, n)`: a few of the step's trajectories (the first sample of the first
  groups): task, prompt, the model's turns, tool outputs, reward, status and integrity signals; text cut to a size a
  tracker's table shows.
- `eval_scalars(result)`: an evaluation result (agentrl.trainer.eval) as `eval/<mode>/mean` with its 95% bootstrap
  interval over tasks (`ci_low` / `ci_high`) and the number of tasks scored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.types import Status, Trajectory

TRAIN_PREFIX = "train/"
EVAL_PREFIX = "eval/"
TABLE_COLUMNS = ("step", "task_id", "sample", "status", "reward", "turns", "prompt", "model_turns", "tool_outputs",
                 "signals")
TEXT_LIMIT = 2000  # characters of one table cell


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(float(value)):
        return float(value)
    return None


def scalars(row: Mapping[str, Any], prefix: str = TRAIN_PREFIX) -> dict[str, float]:
    """Every numeric value of a metrics row (see the module docstring); `step` itself is the x axis, not a value."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if key == "step":
            continue
        if isinstance(value, Mapping):
            out.update(scalars(value, f"{prefix}{key}/"))
            continue
        number = _number(value)
        if number is not None:
            out[prefix + key] = number
    return out


def histograms(trajectories: Sequence[Trajectory]) -> dict[str, list[float]]:
    """Per-step distributions; a trajectory without a reward (infra_error) is not a reward of 0."""
    hists = {
        "reward": [float(t.reward) for t in trajectories
                   if t.reward is not None and t.status is not Status.infra_error],
        "turns": [float(len(t.turns)) for t in trajectories],
        "completion_len": [float(len(t.completion_ids)) for t in trajectories],
    }
    return {f"{TRAIN_PREFIX}{name}": values for name, values in hists.items() if values}


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT] + f" ... [{len(text) - TEXT_LIMIT} more chars]"


def table_row(step: int, t: Trajectory, prompt: str) -> list[Any]:
    model = "\n---\n".join(turn.text for turn in t.turns)
    tools = "\n---\n".join(r.output for turn in t.turns for r in turn.tool_results)
    signals = ", ".join(f"{s.name}x{s.count}" for s in t.integrity)
    return [step, t.task_id, t.sample_index, t.status.value, t.reward, len(t.turns), _cut(prompt), _cut(model),
            _cut(tools), signals]


def trajectory_table(step: int, trajectories: Sequence[Trajectory], prompts: Mapping[str, str],
                     n: int) -> list[list[Any]]:
    """Up to `n` trajectories of the step: the first sample of each group first, then the rest in stored order."""
    groups: set[str] = set()
    firsts = []
    for t in trajectories:
        if t.group_id not in groups:
            groups.add(t.group_id)
            firsts.append(t)
    first_ids = {t.id for t in firsts}
    picked = [*firsts, *(t for t in trajectories if t.id not in first_ids)][:n]
    return [table_row(step, t, prompts.get(t.task_id, "")) for t in picked]


def eval_scalars(result: Mapping[str, Any], prefix: str = EVAL_PREFIX) -> dict[str, float]:
    """`<prefix><mode>/mean`, `/ci_low`, `/ci_high` (95% bootstrap over tasks) and `/tasks` of an eval result."""
    from agentrl.trainer.eval_stats import bootstrap_ci

    out: dict[str, float] = {}
    for mode, m in result.get("modes", {}).items():
        scores = [float(t["score"]) for t in m.get("tasks", {}).values() if t.get("score") is not None]
        if m.get("mean") is not None:
            out[f"{prefix}{mode}/mean"] = float(m["mean"])
        ci = bootstrap_ci(scores)
        if ci is not None:
            out[f"{prefix}{mode}/ci_low"], out[f"{prefix}{mode}/ci_high"] = float(ci[0]), float(ci[1])
        out[f"{prefix}{mode}/tasks"] = float(len(scores))
    return out
