"""What the HTML report shows, as plain JSON-able data: one index row per trajectory, one detail record per
trajectory (loaded by the page only when clicked), and per-step metric samples and means.

Owns: trimming long texts, the run-length encoding of `env_mask`, and the per-step comparison numbers.
Does not own: HTML or plots (`html.py`, `plots.py`).

Detail layout (keys kept short: the file holds thousands of these):
    {"id", "group", "task", "env", "status", "step", "sample", "attempt", "reward", "components": [[name, value]],
     "error", "solution", "integrity": [[signal, count, turn | null, detail], ...],
     "tests": {"passed", "total", "error", "outcomes": [[name, passed, message], ...]} | null,
     "timing": {...}, "meta": "<json, trimmed>", "prompt_len", "mask": [[1, n_model], [0, n_tool], ...],
     "turns": [{"i", "start", "model_len", "env_len", "text", "obs", "finish", "wv", "cached", "gen_s", "tool_s",
                "drift", "retok", "parse_errors": [...], "calls": [{"id", "name", "args"}],
                "results": [{"call_id", "name", "output", "exit", "stderr", "dur", "timed_out", "truncated",
                             "error", "done"}]}]}
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from statistics import mean
from typing import Any

from agentrl.store import summarize
from agentrl.types import ToolResult, Trajectory, Turn

INDEX_COLUMNS = ("id", "task", "step", "status", "reward", "passed", "total", "turns", "calls", "tool_errors",
                 "model_tokens", "tool_tokens", "total_s", "wv_min", "wv_max", "group", "sample", "flags")
NO_STEP = "all"


def finite(x: float | None, ndigits: int | None = None) -> float | None:
    """`x` (rounded), or None for None/NaN/inf: JSON.parse in the page accepts neither NaN nor Infinity."""
    if x is None or not math.isfinite(x):
        return None
    return round(x, ndigits) if ndigits is not None else x


def trim(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters: the head and the tail, with the number of characters removed."""
    if limit <= 0 or len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n… [{len(text) - head - tail} characters trimmed] …\n{text[len(text) - tail:]}"


def mask_runs(env_mask: Sequence[int]) -> list[list[int]]:
    """[1,1,0,0,0,1] -> [[1, 2], [0, 3], [1, 1]]."""
    runs: list[list[int]] = []
    for m in env_mask:
        if runs and runs[-1][0] == m:
            runs[-1][1] += 1
        else:
            runs.append([m, 1])
    return runs


def _weight_versions(t: Trajectory) -> tuple[int | None, int | None]:
    versions = [turn.weight_version for turn in t.turns]
    return (min(versions), max(versions)) if versions else (None, None)


def index_row(t: Trajectory) -> list[Any]:
    """One row of the trajectory table, in `INDEX_COLUMNS` order."""
    model = t.num_model_tokens
    wv_min, wv_max = _weight_versions(t)
    return [t.id, t.task_id, t.step, t.status.value, finite(t.reward), t.tests.passed if t.tests else None,
            t.tests.total if t.tests else None, len(t.turns), t.num_tool_calls, t.num_tool_errors, model,
            len(t.completion_ids) - model, finite(t.timing.total_s, 3), wv_min, wv_max, t.group_id, t.sample_index,
            ",".join(s.name for s in t.integrity) or None]


def _result(r: ToolResult, limit: int) -> dict[str, Any]:
    out: dict[str, Any] = {"call_id": r.call_id, "name": r.name, "output": trim(r.output, limit), "exit": r.exit_code,
                           "dur": finite(r.duration_s, 4), "timed_out": r.timed_out, "truncated": r.truncated,
                           "error": r.error, "done": r.done}
    if r.stderr and r.stderr not in r.output:
        out["stderr"] = trim(r.stderr, limit)
    return out


def format_arguments(arguments: dict[str, Any]) -> str:
    """Tool-call arguments for reading: multi-line strings (code) verbatim, everything else as JSON."""
    lines = []
    for key, value in arguments.items():
        if isinstance(value, str) and "\n" in value:
            lines.append(f"{key}:\n{value.rstrip()}")
        else:
            lines.append(f"{key}: {json.dumps(value, ensure_ascii=False)}")
    return "\n".join(lines)


def _turn(turn: Turn, limit: int) -> dict[str, Any]:
    return {"i": turn.index, "start": turn.start, "model_len": turn.model_len, "env_len": turn.env_len,
            "text": trim(turn.text, limit), "obs": trim(turn.observation, limit), "finish": turn.finish_reason,
            "wv": turn.weight_version, "cached": turn.cached_tokens, "gen_s": finite(turn.gen_duration_s, 4),
            "tool_s": finite(turn.tool_duration_s, 4), "drift": turn.prefix_drift, "retok": turn.retokenize_mismatch,
            "parse_errors": [trim(e, limit) for e in turn.parse_errors],
            "calls": [{"id": c.id, "name": c.name, "args": trim(format_arguments(c.arguments), limit)}
                      for c in turn.tool_calls],
            "results": [_result(r, limit) for r in turn.tool_results]}


def detail(t: Trajectory, limit: int) -> dict[str, Any]:
    """Everything the detail pane shows for one trajectory; every free text is trimmed to `limit` chars."""
    tests = None
    if t.tests is not None:
        tests = {"passed": t.tests.passed, "total": t.tests.total, "error": t.tests.error,
                 "outcomes": [[o.name, o.passed, trim(o.message, limit)] for o in t.tests.outcomes]}
    return {"id": t.id, "group": t.group_id, "task": t.task_id, "env": t.env, "status": t.status.value,
            "step": t.step, "sample": t.sample_index, "attempt": t.attempt, "reward": finite(t.reward),
            "components": [[k, finite(v)] for k, v in t.reward_components.items()],
            "error": trim(f"[{t.error_kind}] {t.error}" if t.error_kind else t.error, limit) if t.error else None,
            "solution": trim(t.solution, limit) if t.solution else None, "tests": tests,
            "timing": {k: finite(v, 4) for k, v in t.timing.model_dump().items()},
            "meta": trim(json.dumps(t.meta, ensure_ascii=False, default=str), limit),
            "prompt_len": len(t.prompt_ids), "drift_count": t.drift_count, "mask": mask_runs(t.env_mask),
            "integrity": [[s.name, s.count, s.turn, trim(s.detail, limit)] for s in t.integrity],
            "turns": [_turn(turn, limit) for turn in t.turns]}


# -- per-step statistics ------------------------------------------------------------------------------------------

METRICS = {  # key -> (label, x-axis label)
    "reward": ("reward", "reward"),
    "completion_len": ("completion length", "tokens (model + tool)"),
    "turns": ("turns", "turns"),
    "tool_latency": ("tool latency", "seconds per call"),
}


def samples(trajs: Sequence[Trajectory]) -> dict[str, list[float]]:
    """The values each histogram is drawn from. Rewards of unscored (infra_error) trajectories are left out."""
    out = {
        "reward": [float(t.reward) for t in trajs if t.reward is not None],
        "completion_len": [float(len(t.completion_ids)) for t in trajs],
        "turns": [float(len(t.turns)) for t in trajs],
        "tool_latency": [r.duration_s for t in trajs for turn in t.turns for r in turn.tool_results],
    }
    return {k: [v for v in vs if math.isfinite(v)] for k, vs in out.items()}


def by_step(trajs: Sequence[Trajectory]) -> dict[int | str, list[Trajectory]]:
    """Trajectories per step in step order; a file without steps is one group keyed `NO_STEP`."""
    groups: dict[int | str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        groups[t.step if t.step is not None else NO_STEP].append(t)
    return dict(sorted(groups.items(), key=lambda kv: (isinstance(kv[0], str), kv[0])))


COMPARE = ("trajectories", "reward_mean", "pass_at_1", "pass_at_g", "mean_turns", "completion_len_mean",
           "tool_latency_mean", "tool_errors", "truncations", "infra_errors", "flagged_frac")


def step_summary(trajs: Sequence[Trajectory]) -> dict[str, float]:
    s = summarize(trajs)
    lat = samples(trajs)["tool_latency"]
    s["tool_latency_mean"] = mean(lat) if lat else 0.0
    s["flagged_frac"] = s["integrity_flagged"] / s["trajectories"] if s["trajectories"] else 0.0
    return s


def step_comparison(steps: dict[int | str, list[Trajectory]]) -> list[dict[str, Any]]:
    """Per step: the `COMPARE` metrics and their deltas to the previous step (None for the first)."""
    rows: list[dict[str, Any]] = []
    prev: dict[str, float] | None = None
    for step, trajs in steps.items():
        s = step_summary(trajs)
        values = {k: s[k] for k in COMPARE}
        deltas = {k: (values[k] - prev[k]) if prev is not None else None for k in COMPARE}
        rows.append({"step": step, "values": values, "deltas": deltas})
        prev = values
    return rows


def component_means(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Mean unweighted value of each reward source over the trajectories that stored it."""
    values: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        for k, v in t.reward_components.items():
            if math.isfinite(v):
                values[k].append(v)
    return {k: mean(vs) for k, vs in sorted(values.items())}
