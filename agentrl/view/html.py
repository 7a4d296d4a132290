"""The self-contained static HTML report (`agentrl view FILE -o report.html`).

Owns: assembling one HTML file with everything inline: CSS and JS (`assets.py`), the trajectory index and the
per-trajectory details as embedded JSON, the per-step histograms and trends as inline SVG (`plots.py`), and the
per-step comparison table, and a training run's behaviour snapshots (`snapshots.py`) and train-inference mismatch
(`mismatch.py`, from its metrics.jsonl rows). No server, no network, no
external assets.

Size budget: every free text (model text, tool output, solution...) is trimmed to `max_chars`; when the details
still exceed `max_bytes`, the limit is halved until they fit (down to `MIN_CHARS`). Details are embedded one
`<script type="application/json">` per trajectory so the page parses only the one that is clicked.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agentrl.store import LineError
from agentrl.types import Trajectory
from agentrl.view import data, plots
from agentrl.view.assets import CSS, JS
from agentrl.view.mismatch import mismatch_html
from agentrl.view.snapshots import RunSnapshots, snapshots_html

DEFAULT_MAX_CHARS = 4000
DEFAULT_MAX_BYTES = 45_000_000
MIN_CHARS = 200
MAX_LISTED_ERRORS = 50

SUMMARY_LABELS = {
    "trajectories": "trajectories", "groups": "groups (tasks)", "reward_mean": "mean reward",
    "reward_std": "reward std", "pass_at_1": "pass@1", "pass_at_g": "pass@G",
    "nonzero_reward_groups": "groups with reward > 0", "frac_zero_std_groups": "groups with zero reward std",
    "mean_turns": "mean turns", "tool_calls": "tool calls", "tool_errors": "tool errors",
    "parse_errors": "parse errors", "truncations": "truncations", "timeouts": "timeouts",
    "infra_errors": "infra errors", "template_drift_turns": "template drift (turns)",
    "completion_len_mean": "mean completion length", "tokens_generated": "tokens generated",
    "tokens_per_s_engine": "tokens/s (engine)", "tool_latency_mean": "mean tool latency (s)",
    "integrity_flagged": "flagged (integrity signals)", "flagged_frac": "flagged rate (integrity)",
}


@dataclass(frozen=True)
class ReportInfo:
    path: Path
    bytes: int
    trajectories: int
    max_chars: int  # the text limit that was finally used


def json_for_script(obj: Any) -> str:
    """JSON safe inside a <script> element: no '<' survives, so neither '</script>' nor '<!--' can appear."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def _details(trajs: Sequence[Trajectory], max_chars: int, budget: int) -> tuple[list[str], int]:
    """Each trajectory's detail JSON; the text limit is halved until their UTF-8 size fits `budget` bytes."""
    limit = max_chars
    while True:
        blobs = [json_for_script(data.detail(t, limit)) for t in trajs]
        if sum(len(b.encode("utf-8", errors="replace")) for b in blobs) <= budget or limit <= MIN_CHARS:
            return blobs, limit
        limit = max(MIN_CHARS, limit // 2)


def _fmt(v: float | None) -> str:
    return "–" if v is None else plots.fmt(v)


HIGHER_IS_BETTER = {"reward_mean": True, "pass_at_1": True, "pass_at_g": True, "tool_errors": False,
                    "truncations": False, "infra_errors": False, "tool_latency_mean": False}


def _delta(d: float | None, key: str) -> str:
    """The change to the previous step: green when it is an improvement, red when worse, grey when neutral."""
    if d is None or d == 0:
        return ""
    better = HIGHER_IS_BETTER.get(key)
    cls = "" if better is None else "up" if (d > 0) == better else "down"
    return f'<span class="delta {cls}">{"+" if d > 0 else "−"}{plots.fmt(abs(d))}</span>'


def summary_html(trajs: Sequence[Trajectory]) -> str:
    s = data.step_summary(trajs)
    rows = "".join(f"<tr><td>{html.escape(SUMMARY_LABELS.get(k, k))}</td><td>{_fmt(v)}</td></tr>" for k, v in s.items())
    rows += "".join(f'<tr class="component"><td>reward component: {html.escape(k)} (mean)</td><td>{_fmt(v)}</td></tr>'
                    for k, v in data.component_means(trajs).items())
    return f'<table class="stats" id="summary-table"><tr><th>metric</th><th>value</th></tr>{rows}</table>'


def comparison_html(rows: list[dict[str, Any]]) -> str:
    """Steps as rows, `data.COMPARE` metrics as columns, each with its delta to the previous step."""
    head = "".join(f"<th>{html.escape(SUMMARY_LABELS.get(k, k))}</th>" for k in data.COMPARE)
    body = []
    for row in rows:
        cells = "".join(f"<td>{_fmt(row['values'][k])}{_delta(row['deltas'][k], k)}</td>" for k in data.COMPARE)
        body.append(f"<tr><td>{html.escape(str(row['step']))}</td>{cells}</tr>")
    return f'<table class="stats" id="step-table"><tr><th>step</th>{head}</tr>{"".join(body)}</table>'


def steps_html(trajs: Sequence[Trajectory]) -> str:
    """Per-step histograms (previous step overlaid), a step selector, the comparison table and trend lines."""
    steps = data.by_step(trajs)
    per_step = {k: data.samples(v) for k, v in steps.items()}
    edges = {m: plots.bin_edges([x for s in per_step.values() for x in s[m]]) for m in data.METRICS}
    keys = list(steps)
    blocks = []
    for n, key in enumerate(keys):
        prev = per_step[keys[n - 1]] if n > 0 else None
        svgs = "".join(plots.histogram_svg(per_step[key][m], edges[m], title=f"{label} (n={len(per_step[key][m])})",
                                           xlabel=xlabel, previous=prev[m] if prev else None,
                                           labels=(f"step {key}", f"step {keys[n - 1]}") if prev else ("", ""))
                       for m, (label, xlabel) in data.METRICS.items())
        hidden = "" if n == len(keys) - 1 else " hidden"
        blocks.append(f'<div class="stepblock plots" data-step="{html.escape(str(key))}"{hidden}>{svgs}</div>')
    options = "".join(f'<option value="{html.escape(str(k))}"{" selected" if n == len(keys) - 1 else ""}>'
                      f"step {html.escape(str(k))}</option>" for n, k in enumerate(keys))
    comparison = data.step_comparison(steps)
    out = [f'<h2>per step</h2><label>histograms of <select id="step-sel">{options}</select></label> '
           f'<span class="sub">(filled: this step; outline: the previous step)</span>', *blocks,
           "<h3>step comparison (delta to the previous step)</h3>", comparison_html(comparison)]
    numbered = [r for r in comparison if isinstance(r["step"], int)]
    if len(numbered) > 1:
        xs = [r["step"] for r in numbered]
        trends = [plots.trend_svg(xs, [r["values"][k] for r in numbered], title=SUMMARY_LABELS.get(k, k))
                  for k in ("reward_mean", "pass_at_1", "completion_len_mean", "mean_turns", "tool_latency_mean",
                            "flagged_frac")]
        out.append('<h3>trends</h3><div class="plots">' + "".join(trends) + "</div>")
    return "".join(out)


def _errors_html(errors: Sequence[LineError]) -> str:
    if not errors:
        return ""
    items = "".join(f"<li>{html.escape(str(e))}</li>" for e in errors[:MAX_LISTED_ERRORS])
    more = f"<li>… and {len(errors) - MAX_LISTED_ERRORS} more</li>" if len(errors) > MAX_LISTED_ERRORS else ""
    return (f'<div class="banner" id="line-errors"><b>{len(errors)} unreadable line(s) skipped</b>'
            f"<ul>{items}{more}</ul></div>")


FILTERS = """<div class="filters">
<select id="f-status"><option value="">all statuses</option></select>
<select id="f-step"><option value="">all steps</option></select>
<input id="f-task" placeholder="task contains"> <input id="f-id" placeholder="id contains">
<label>reward ≥ <input id="f-rmin" type="number" step="0.1"></label>
<label>≤ <input id="f-rmax" type="number" step="0.1"></label><span id="count"></span></div>
<div id="thead" class="grid"></div><div id="vp" tabindex="0"><div id="spacer"><div id="rows"></div></div></div>
<div id="detail"><p class="sub">click a trajectory to see its turns (↑/↓ move through the table)</p></div>"""


def _overview(trajs: Sequence[Trajectory]) -> str:
    steps = steps_html(trajs) if trajs else ""
    return ('<details open id="overview"><summary>summary and per-step plots</summary><div class="overview">'
            f'<div><h2>summary</h2>{summary_html(trajs)}</div><div class="steps">{steps}</div></div></details>')


def _title(title: str, sub: str) -> str:
    return f'<h1>{html.escape(title)}</h1><div class="sub">{html.escape(sub)}</div>'


def build_report(trajs: Sequence[Trajectory], *, title: str, errors: Sequence[LineError] = (),
                 max_chars: int = DEFAULT_MAX_CHARS, max_bytes: int = DEFAULT_MAX_BYTES,
                 snapshots: RunSnapshots | None = None,
                 metrics: Sequence[dict[str, Any]] = ()) -> tuple[str, int]:
    """The report page as one string, and the text limit used so that the page fits `max_bytes`. `metrics`: a
    training run's metrics.jsonl rows (for the train-inference mismatch section)."""
    index = {"cols": list(data.INDEX_COLUMNS), "rows": [data.index_row(t) for t in trajs]}
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    sub = f"{len(trajs)} trajectories · {len(errors)} unreadable lines · generated {when}"
    head = (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            f'content="width=device-width, initial-scale=1"><title>{html.escape(title)}</title>'
            f"<style>{CSS}</style></head><body>")
    parts = [head, _title(title, sub), _errors_html(errors), _overview(trajs),
             mismatch_html(metrics), snapshots_html(snapshots) if snapshots is not None else "",
             "<h2>trajectories</h2>", FILTERS,
             f'<script type="application/json" id="index">{json_for_script(index)}</script>',
             f"<script>{JS}</script>"]
    # what the details may take: the rest of the page, the per-detail <script> wrappers and the closing tags
    frame = sum(len(p.encode("utf-8", errors="replace")) for p in parts) + 60 * len(trajs) + 200
    details, limit = _details(trajs, max_chars, max_bytes - frame)
    if limit < max_chars:
        parts[1] = _title(title, f"{sub}; texts trimmed to {limit} characters")
    parts += [f'<script type="application/json" id="d{i}">{blob}</script>' for i, blob in enumerate(details)]
    parts.append("</body></html>")
    return "".join(parts), limit


def write_report(path: str | Path, trajs: Sequence[Trajectory], *, title: str | None = None,
                 errors: Sequence[LineError] = (), max_chars: int = DEFAULT_MAX_CHARS,
                 max_bytes: int = DEFAULT_MAX_BYTES, snapshots: RunSnapshots | None = None,
                 metrics: Sequence[dict[str, Any]] = ()) -> ReportInfo:
    out = Path(path)
    page, limit = build_report(trajs, title=title or f"agentrl trajectories: {out.stem}", errors=errors,
                               max_chars=max_chars, max_bytes=max_bytes, snapshots=snapshots, metrics=metrics)
    encoded = page.encode("utf-8", errors="replace")  # lone surrogates from odd tool output become '?'
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(encoded)
    return ReportInfo(out, len(encoded), len(trajs), limit)
