"""`agentrl diff RUN_A RUN_B`: where two runs that should agree stop agreeing.

    agentrl diff A B [--logprob-tol X] [--max-shown N] [--no-decode] [--json OUT]

A and B are trajectory files (JSONL) or run dirs (`trajectories.jsonl`, and `metrics.jsonl` of a training run).
Trajectories are paired by (step, task id, sample index, occurrence) — never by file order, which follows completion
order — and compared on what a run produces: prompt ids, completion ids, env mask, status, reward, tests passed, turn
structure, ids (all exactly) and logprobs (bit for bit by default; within `--logprob-tol X` nats when given: a real
inference server's kernels may move the last digits between seeded runs). Timings, durations and `meta` are ignored.
For each differing pair the first divergence is printed: the turn, the completion token index, both tokens (decoded
with the run's tokenizer when `meta.model` is readable here) and both logprobs; then which fields differ, how often,
and the largest logprob difference over the tokens both runs sampled alike. Metrics rows are paired by step; every key
except timings must be equal (the logprob-derived ones, `LOGPROB_METRICS`, within the same tolerance). Exit code 0:
identical (within the tolerance); 1: they differ; 2: error (unreadable input, a bad tolerance).

Owns the comparison and its report; reading files is `agentrl.store`'s.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.cli.paths import metrics_file, trajectory_file
from agentrl.trainer.metrics import is_timing
from agentrl.types import Trajectory

Key = tuple[int, str, int, int]  # (step or -1, task id, sample index, occurrence of that triple in the file)


def add_diff_command(sub: Any) -> None:
    p = sub.add_parser("diff", help="first divergence per task/sample between two runs (files or run dirs); "
                                    "exit 1 if they differ")
    p.add_argument("run_a", type=Path)
    p.add_argument("run_b", type=Path)
    p.add_argument("--logprob-tol", type=_tolerance, default=0.0, metavar="X",
                   help="logprobs within X nats count as equal (default 0: bit for bit); e.g. 1e-4 for a real vLLM")
    p.add_argument("--max-shown", type=int, default=20, help="print at most N differing trajectories (default 20)")
    p.add_argument("--no-decode", action="store_true", help="print token ids only (no tokenizer load)")
    p.add_argument("--json", type=Path, help="also write the full report as JSON here")
    p.set_defaults(func=_cmd_diff)


LOGPROB_METRICS = ("mismatch_", "is_ratio_", "sampling_logp_diff_")  # metrics.jsonl keys that follow the logprobs


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0.0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"--logprob-tol {text!r}: give a finite number of nats >= 0, e.g. 1e-4")
    return value


@dataclass
class Divergence:
    """How one pair of trajectories differs (empty `fields` and no `token`: identical)."""

    key: Key
    fields: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    token: dict[str, Any] | None = None  # the first differing prompt/completion position
    kinds: list[str] = field(default_factory=list)  # what differs: prompt_ids, completion_ids, logprobs, fields


@dataclass
class LogprobGap:
    """The largest |logprob A - logprob B| over the positions where both runs have the same prompt and tokens."""

    max_diff: float = 0.0
    tokens: int = 0

    def add(self, a: Trajectory, b: Trajectory) -> None:
        if a.prompt_ids != b.prompt_ids:
            return
        for x, y, lx, ly in zip(a.completion_ids, b.completion_ids, a.logprobs, b.logprobs):
            if x != y:
                return
            self.tokens += 1
            if not _same_float(lx, ly):
                self.max_diff = max(self.max_diff, abs(lx - ly)) if not (math.isnan(lx) or math.isnan(ly)) \
                    else math.inf


@dataclass
class Report:
    a_count: int
    b_count: int
    only_a: list[Key]
    only_b: list[Key]
    trajectories: list[Divergence]
    metrics: list[dict[str, Any]]
    metrics_compared: int
    logprob_tol: float = 0.0
    logprobs: LogprobGap = field(default_factory=LogprobGap)

    def kind_counts(self) -> dict[str, int]:
        """How many differing pairs differ in each field, most common first."""
        counts: dict[str, int] = {}
        for d in self.trajectories:
            for kind in d.kinds:
                counts[kind] = counts.get(kind, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))

    @property
    def identical(self) -> bool:
        return not (self.only_a or self.only_b or self.trajectories or self.metrics)


# -- inputs --------------------------------------------------------------------------------------------------------

def _paths(run: Path) -> tuple[Path, Path | None]:
    """(trajectory file, metrics file or None) of a file or run dir."""
    return trajectory_file(run), metrics_file(run)


def keyed(trajectories: list[Trajectory]) -> dict[Key, Trajectory]:
    seen: dict[tuple[int, str, int], int] = {}
    out: dict[Key, Trajectory] = {}
    for t in trajectories:
        base = (-1 if t.step is None else t.step, t.task_id, t.sample_index)
        seen[base] = seen.get(base, -1) + 1
        out[(*base, seen[base])] = t
    return out


# -- comparison ----------------------------------------------------------------------------------------------------

def _same_float(x: float | None, y: float | None, tol: float = 0.0) -> bool:
    if x is None or y is None:
        return x is y
    return x == y or (math.isnan(x) and math.isnan(y)) or abs(x - y) <= tol


def _turn_of(t: Trajectory, index: int) -> tuple[int | None, str]:
    """(turn index, "model" | "tool") of completion token `index`."""
    for turn in t.turns:
        if turn.start <= index < turn.start + turn.model_len:
            return turn.index, "model"
        if turn.start + turn.model_len <= index < turn.start + turn.model_len + turn.env_len:
            return turn.index, "tool"
    return None, "model"


def first_token_divergence(a: Trajectory, b: Trajectory, tol: float = 0.0) -> dict[str, Any] | None:
    """The first position where the prompt, a completion id or its logprob (by more than `tol`) differ; None if all
    agree."""
    if a.prompt_ids != b.prompt_ids:
        i = next((i for i, (x, y) in enumerate(zip(a.prompt_ids, b.prompt_ids)) if x != y),
                 min(len(a.prompt_ids), len(b.prompt_ids)))
        return {"where": "prompt", "index": i, "a": _at(a.prompt_ids, i), "b": _at(b.prompt_ids, i)}
    n = min(len(a.completion_ids), len(b.completion_ids))
    for i in range(n):
        if a.completion_ids[i] != b.completion_ids[i] or not _same_float(a.logprobs[i], b.logprobs[i], tol):
            return _completion_point(a, b, i)
    if len(a.completion_ids) != len(b.completion_ids):
        return _completion_point(a, b, n)
    return None


def _at(ids: list[int], i: int) -> int | None:
    return ids[i] if i < len(ids) else None


def _completion_point(a: Trajectory, b: Trajectory, i: int) -> dict[str, Any]:
    turn, kind = _turn_of(a if i < len(a.completion_ids) else b, i)
    return {"where": "completion", "index": i, "turn": turn, "kind": kind,
            "a": _at(a.completion_ids, i), "b": _at(b.completion_ids, i),
            "a_logprob": a.logprobs[i] if i < len(a.logprobs) else None,
            "b_logprob": b.logprobs[i] if i < len(b.logprobs) else None}


def _facts(t: Trajectory) -> dict[str, Any]:
    return {
        "id": t.id, "group_id": t.group_id, "env": t.env, "status": t.status.value, "reward": t.reward,
        "tests_passed": None if t.tests is None else (t.tests.passed, t.tests.total), "env_mask": t.env_mask,
        "turns": [(u.start, u.model_len, u.env_len, u.finish_reason, u.weight_version, len(u.tool_calls))
                  for u in t.turns],
        "tool_results": [(r.exit_code, r.error, r.timed_out, r.output) for u in t.turns for r in u.tool_results],
        "error": t.error, "solution": t.solution,
    }


def compare_pair(key: Key, a: Trajectory, b: Trajectory, tol: float = 0.0) -> Divergence | None:
    fa, fb = _facts(a), _facts(b)
    fields = {k: (fa[k], fb[k]) for k in fa if fa[k] != fb[k] and not (k == "reward" and _same_float(fa[k], fb[k]))}
    token = first_token_divergence(a, b, tol)
    if not fields and token is None:
        return None
    return Divergence(key=key, fields=fields, token=token, kinds=[*_token_kinds(a, b, tol), *fields])


def _token_kinds(a: Trajectory, b: Trajectory, tol: float) -> list[str]:
    """Which of prompt_ids / completion_ids / logprobs differ (logprobs: beyond `tol`, where the tokens agree)."""
    if a.prompt_ids != b.prompt_ids:
        return ["prompt_ids"]
    kinds = [] if a.completion_ids == b.completion_ids else ["completion_ids"]
    for x, y, lx, ly in zip(a.completion_ids, b.completion_ids, a.logprobs, b.logprobs):
        if x != y:
            break
        if not _same_float(lx, ly, tol):
            return [*kinds, "logprobs"]
    return kinds


def _same_metric(key: str, x: Any, y: Any, tol: float) -> bool:
    if x == y:
        return True
    numbers = isinstance(x, (int, float)) and isinstance(y, (int, float))
    return tol > 0 and numbers and key.startswith(LOGPROB_METRICS) and abs(x - y) <= tol


def compare_metrics(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]],
                    tol: float = 0.0) -> list[dict[str, Any]]:
    """Per-step differences of every metric except timings (`time_*`, `*_wait_s`, `*_idle_s`); the logprob-derived
    ones (`LOGPROB_METRICS`) within `tol`."""
    by_a, by_b = {r.get("step"): r for r in rows_a}, {r.get("step"): r for r in rows_b}
    out = []
    for step in sorted(set(by_a) | set(by_b), key=lambda s: (s is None, s)):
        ra, rb = by_a.get(step), by_b.get(step)
        if ra is None or rb is None:
            out.append({"step": step, "missing_in": "a" if ra is None else "b"})
            continue
        keys = [k for k in dict.fromkeys([*ra, *rb]) if not is_timing(k)]
        changed = {k: (ra.get(k), rb.get(k)) for k in keys if not _same_metric(k, ra.get(k), rb.get(k), tol)}
        if changed:
            out.append({"step": step, "changed": changed})
    return out


def diff_runs(traj_a: list[Trajectory], traj_b: list[Trajectory], metrics_a: list[dict[str, Any]] | None = None,
              metrics_b: list[dict[str, Any]] | None = None, *, logprob_tol: float = 0.0) -> Report:
    ka, kb = keyed(traj_a), keyed(traj_b)
    pairs = sorted((k for k in ka if k in kb), key=str)
    diverged = [d for k in pairs if (d := compare_pair(k, ka[k], kb[k], logprob_tol)) is not None]
    gap = LogprobGap()
    for k in pairs:
        gap.add(ka[k], kb[k])
    both = metrics_a is not None and metrics_b is not None
    return Report(a_count=len(ka), b_count=len(kb), only_a=sorted((k for k in ka if k not in kb), key=str),
                  only_b=sorted((k for k in kb if k not in ka), key=str), trajectories=diverged,
                  metrics=compare_metrics(metrics_a or [], metrics_b or [], logprob_tol) if both else [],
                  metrics_compared=len(metrics_a or []) if both else 0, logprob_tol=logprob_tol, logprobs=gap)


# -- rendering -----------------------------------------------------------------------------------------------------

def _label(key: Key) -> str:
    step, task, sample, occurrence = key
    where = f"step {step} " if step >= 0 else ""
    return f"{where}task {task} sample {sample}" + (f" (#{occurrence + 1})" if occurrence else "")


def _token_text(decode: Any, token: int | None) -> str:
    if token is None:
        return "<end>"
    return f"{token} {decode(token)!r}" if decode is not None else str(token)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render(report: Report, *, max_shown: int, decode: Any = None) -> list[str]:
    lines = [f"trajectories: {report.a_count} in A, {report.b_count} in B, "
             f"{report.a_count - len(report.only_a)} paired, {len(report.trajectories)} differ"]
    lines += [f"  only in A: {_label(k)}" for k in report.only_a[:max_shown]]
    lines += [f"  only in B: {_label(k)}" for k in report.only_b[:max_shown]]
    for d in report.trajectories[:max_shown]:
        lines.append(f"{_label(d.key)}:")
        p = d.token
        if p is not None and p["where"] == "prompt":
            lines.append(f"  prompt differs at token {p['index']}: A {_token_text(decode, p['a'])} vs "
                         f"B {_token_text(decode, p['b'])}")
        elif p is not None:
            lines.append(f"  first divergence: turn {p['turn']}, completion token {p['index']} ({p['kind']}): "
                         f"A {_token_text(decode, p['a'])} logprob {p['a_logprob']!r} vs "
                         f"B {_token_text(decode, p['b'])} logprob {p['b_logprob']!r}")
        for name, (x, y) in d.fields.items():
            lines.append(f"  {name}: {_short(x)} vs {_short(y)}")
    if len(report.trajectories) > max_shown:
        lines.append(f"  ... {len(report.trajectories) - max_shown} more (--max-shown, --json)")
    if report.trajectories:
        lines.append("fields that differ: " + ", ".join(f"{k} in {n}" for k, n in report.kind_counts().items()))
    lines.append(_logprob_line(report))
    if report.metrics_compared:
        lines.append(f"metrics: {report.metrics_compared} steps compared (timings ignored), "
                     f"{len(report.metrics)} differ")
        for m in report.metrics:
            if "missing_in" in m:
                lines.append(f"  step {m['step']}: missing in {m['missing_in'].upper()}")
            else:
                lines.append(f"  step {m['step']}: " + "; ".join(f"{k} {x!r} vs {y!r}" for k, (x, y) in
                                                                 m["changed"].items()))
    within = f" (logprobs within {report.logprob_tol:g})" if report.logprob_tol and report.logprobs.max_diff else ""
    lines.append(f"identical{within}" if report.identical else "runs differ")
    return lines


def _logprob_line(report: Report) -> str:
    gap = report.logprobs
    tol = f"tolerance {report.logprob_tol:g}" if report.logprob_tol else "compared bit for bit (--logprob-tol)"
    return (f"logprobs: max |A - B| {gap.max_diff:.3g} over {gap.tokens} tokens sampled alike; {tol}")


def _decoder(trajectories: list[Trajectory]) -> Any:
    """token id -> text with the run's tokenizer (meta.model), or None when it cannot be loaded here."""
    model = next((t.meta.get("model") for t in trajectories if t.meta.get("model")), None)
    if model is None or not Path(str(model)).is_dir():
        return None
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(model))
    except Exception:  # noqa: BLE001 - decoding is a convenience: ids are printed instead
        return None
    return lambda token: tok.decode([token])


def _cmd_diff(a: argparse.Namespace) -> int:
    from agentrl.cli.debug import _load
    from agentrl.trainer.metrics import read_metrics

    (ta, ma), (tb, mb) = _paths(a.run_a), _paths(a.run_b)
    traj_a, traj_b = _load(ta).trajectories, _load(tb).trajectories
    report = diff_runs(traj_a, traj_b, read_metrics(ma) if ma and mb else None, read_metrics(mb) if ma and mb else None,
                       logprob_tol=a.logprob_tol)
    decode = None if a.no_decode or report.identical else _decoder(traj_a + traj_b)
    print("\n".join(render(report, max_shown=a.max_shown, decode=decode)))
    if a.json:
        a.json.write_text(json.dumps(_as_json(report), indent=1, default=str))
    return 0 if report.identical else 1


def _as_json(report: Report) -> dict[str, Any]:
    return {"identical": report.identical, "a_count": report.a_count, "b_count": report.b_count,
            "only_a": report.only_a, "only_b": report.only_b, "metrics": report.metrics,
            "logprob_tol": report.logprob_tol, "max_logprob_diff": report.logprobs.max_diff,
            "logprob_tokens_compared": report.logprobs.tokens, "fields_differing": report.kind_counts(),
            "trajectories": [{"key": d.key, "fields": d.fields, "first_divergence": d.token, "differs_in": d.kinds}
                             for d in report.trajectories]}
