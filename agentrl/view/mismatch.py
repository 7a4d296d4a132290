"""The train-inference mismatch of a training run, from its `metrics.jsonl` rows: a section of the HTML report and a
table of `agentrl stats`.

Owns which per-step columns are shown and their labels. The numbers are computed by the trainer
(`agentrl/trainer/mismatch.py`) and only read here; a run without them (a rollout file, or a run from before they
existed) shows nothing.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.table import Table

from agentrl.view import plots

COLUMNS = (  # (metrics.jsonl key, label)
    ("mismatch_logprob_abs_mean", "mean |Δlogp|"),
    ("mismatch_logprob_abs_max", "max |Δlogp|"),
    ("mismatch_kl", "KL k3"),
    ("is_ratio_mean", "IS ratio mean"),
    ("is_ratio_clipped_frac", "IS clipped"),
    ("staleness_max", "staleness max"),
)
NOTE = ("engine sampling logprobs vs the trainer's recomputation over the trained model tokens (nats); KL k3 = mean of "
        "exp(r) - 1 - r, r = trainer - engine; IS columns only when importance_sampling is on. Steps with staleness > "
        "0 also carry the policy change since the engine's weights")


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def mismatch_rows(metrics: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steps that measured the mismatch, each as {"step", <COLUMNS keys>: float or None}, in step order."""
    rows = [{"step": r.get("step"), **{k: _number(r.get(k)) for k, _ in COLUMNS}} for r in metrics
            if _number(r.get("mismatch_logprob_abs_mean")) is not None]
    return sorted(rows, key=lambda r: (not isinstance(r["step"], int), r["step"] if isinstance(r["step"], int) else 0))


def _cell(v: float | None) -> str:
    return "–" if v is None else f"{v:.3g}"


def mismatch_html(metrics: Sequence[dict[str, Any]]) -> str:
    """The report's section, or "" when no step measured the mismatch."""
    rows = mismatch_rows(metrics)
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label in COLUMNS)
    body = "".join(f"<tr><td>{html.escape(str(r['step']))}</td>"
                   + "".join(f"<td>{_cell(r[k])}</td>" for k, _ in COLUMNS) + "</tr>" for r in rows)
    numbered = [r for r in rows if isinstance(r["step"], int)]
    trends = "".join(plots.trend_svg([r["step"] for r in numbered if r[k] is not None],
                                     [r[k] for r in numbered if r[k] is not None], title=label)
                     for k, label in COLUMNS[:3]) if len(numbered) > 1 else ""
    return ('<details open id="mismatch"><summary>train-inference mismatch (per step)</summary>'
            f'<div class="sub">{html.escape(NOTE)}</div>'
            f'<table class="stats" id="mismatch-table"><tr><th>step</th>{head}</tr>{body}</table>'
            + (f'<div class="plots">{trends}</div>' if trends else "") + "</details>")


def mismatch_table(metrics: Sequence[dict[str, Any]]) -> Table | None:
    """`agentrl stats`'s table, or None when no step measured the mismatch."""
    rows = mismatch_rows(metrics)
    if not rows:
        return None
    table = Table(title="train-inference mismatch per step (metrics.jsonl)", box=box.SIMPLE_HEAD, padding=(0, 1),
                  collapse_padding=True, pad_edge=False)
    table.add_column("step", justify="right", no_wrap=True)
    for _, label in COLUMNS:
        table.add_column(label, justify="right", no_wrap=True)
    for r in rows:
        table.add_row(str(r["step"]), *(_cell(r[k]) for k, _ in COLUMNS))
    return table
