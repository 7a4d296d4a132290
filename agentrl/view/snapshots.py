"""The behaviour-snapshot section of the HTML report (`agentrl view RUN_DIR`): reward, length and format compliance
over training steps (the reward-hacking signature: reward up, length up, pass rate flat), per mode, and per-step
histograms of the snapshot rollouts' reward and length.

Owns: reading a run's `snapshots.jsonl` and the rollouts each row points to (`load_run_snapshots`), and drawing the
section. Rows come from `agentrl.trainer.snapshots.behaviour_row` (read as JSON, never imported: the viewer stays
independent of the trainer).
"""

from __future__ import annotations

import html
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.store import LineError, iter_records
from agentrl.types import Trajectory
from agentrl.view import plots

SNAPSHOTS_FILE = "snapshots.jsonl"
TRENDS = (("reward_mean", "reward"), ("completion_len_mean", "length (model tokens)"),
          ("format_rate", "format compliance"), ("pass_rate", "pass rate"))
COLUMNS = ("step", "mode", "trajectories", "reward_mean", "pass_rate", "completion_len_mean", "format_rate",
           "tool_error_rate", "truncation_rate", "infra_errors")


@dataclass
class RunSnapshots:
    rows: list[dict[str, Any]] = field(default_factory=list)
    rollouts: dict[int, list[Trajectory]] = field(default_factory=dict)  # step -> that step's snapshot trajectories
    errors: list[str] = field(default_factory=list)


def load_run_snapshots(run_dir: Path) -> RunSnapshots:
    """`snapshots.jsonl` of a run and the rollouts its rows name; unreadable lines and missing files are listed."""
    out = RunSnapshots()
    path = run_dir / SNAPSHOTS_FILE
    if not path.exists():
        return out
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            row = json.loads(line)
            int(row["step"])
        except (ValueError, KeyError, TypeError):
            out.errors.append(f"{path}:{lineno}: not a snapshot row")
            continue
        out.rows.append(row)
    seen: set[str] = set()
    for row in out.rows:
        rel = row.get("rollouts")
        if not isinstance(rel, str) or rel in seen:
            continue
        seen.add(rel)
        file = run_dir / rel
        if not file.exists():
            out.errors.append(f"{file}: snapshot rollouts missing (removed with their checkpoint?)")
            continue
        for rec in iter_records(file):
            if isinstance(rec, LineError):
                out.errors.append(str(rec))
            else:
                out.rollouts.setdefault(int(row["step"]), []).append(rec)
    return out


def _fmt(v: Any) -> str:
    return "–" if v is None else html.escape(str(v)) if isinstance(v, str) else plots.fmt(float(v))


def _trends(rows: list[dict[str, Any]]) -> str:
    by_mode: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: int(r["step"])):
        by_mode[str(row.get("mode", "sampled"))].append(row)
    out = []
    for mode, mode_rows in by_mode.items():
        svgs = []
        for key, label in TRENDS:
            pts = [(int(r["step"]), float(r[key])) for r in mode_rows if r.get(key) is not None]
            if pts:
                svgs.append(plots.trend_svg([p[0] for p in pts], [p[1] for p in pts], title=f"{mode}: {label}"))
        out.append(f'<div class="plots snaptrends" data-mode="{html.escape(mode)}">{"".join(svgs)}</div>')
    return "".join(out)


def _table(rows: list[dict[str, Any]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS) + "<th>reward components (mean)</th>"
    body = []
    for row in rows:
        comps = ", ".join(f"{html.escape(k)} {_fmt(v)}" for k, v in (row.get("reward_components") or {}).items())
        body.append("<tr>" + "".join(f"<td>{_fmt(row.get(c))}</td>" for c in COLUMNS) + f"<td>{comps}</td></tr>")
    return f'<table class="stats" id="snapshot-table"><tr>{head}</tr>{"".join(body)}</table>'


def _samples(trajs: Sequence[Trajectory]) -> dict[str, list[float]]:
    return {"reward": [float(t.reward) for t in trajs if t.reward is not None],
            "length": [float(t.num_model_tokens) for t in trajs]}


def _histograms(rollouts: dict[int, list[Trajectory]]) -> str:
    if not rollouts:
        return ""
    steps = sorted(rollouts)
    per = {s: _samples(rollouts[s]) for s in steps}
    edges = {m: plots.bin_edges([x for s in steps for x in per[s][m]]) for m in ("reward", "length")}
    blocks = []
    for n, step in enumerate(steps):
        prev = per[steps[n - 1]] if n else None
        labels = (f"step {step}", f"step {steps[n - 1]}") if n else ("", "")
        svgs = "".join(plots.histogram_svg(per[step][m], edges[m], title=f"snapshot {m} (n={len(per[step][m])})",
                                           xlabel=x, previous=prev[m] if prev else None, labels=labels)
                       for m, x in (("reward", "reward"), ("length", "model tokens")))
        hidden = "" if n == len(steps) - 1 else " hidden"
        blocks.append(f'<div class="snapblock plots" data-step="{step}"{hidden}>{svgs}</div>')
    options = "".join(f'<option value="{s}"{" selected" if n == len(steps) - 1 else ""}>step {s}</option>'
                      for n, s in enumerate(steps))
    return (f'<h3>snapshot histograms</h3><label>step <select id="snap-step-sel">{options}</select></label>'
            + "".join(blocks))


def snapshots_html(snaps: RunSnapshots) -> str:
    """The section, or "" for a run without snapshots."""
    if not snaps.rows:
        return ""
    errors = "".join(f"<li>{html.escape(e)}</li>" for e in snaps.errors[:20])
    return ('<details open id="snapshots"><summary>behaviour snapshots (fixed task set, current weights)</summary>'
            + (f'<div class="banner"><ul>{errors}</ul></div>' if errors else "")
            + '<div class="sub">reward vs length vs format compliance over steps; reward rising with length while the '
              'pass rate stays flat is the signature of reward hacking</div>'
            + _trends(snaps.rows) + _table(snaps.rows) + _histograms(snaps.rollouts) + "</details>")
