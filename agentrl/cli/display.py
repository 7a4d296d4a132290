"""Terminal output: the live progress line of a rollout and the summary table (rich)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from agentrl.runner.progress import Progress


def progress_line(p: Progress) -> str:
    elapsed = time.perf_counter() - p.started
    return (f"trajectories {p.trajectories_done}/{p.trajectories_total}  turns {p.turns}  tool calls {p.tool_calls}"
            f"  tokens {p.tokens} ({p.tokens_per_s():.1f}/s)  infra errors {p.infra_errors}  policy errors {p.policy_errors}  {elapsed:.0f}s")


class ProgressDisplay:
    """Refreshes one status line while a rollout runs; prints plain lines when not on a terminal (CI logs)."""

    def __init__(self, progress: Progress, console: Console | None = None, every_s: float = 10.0) -> None:
        self.p = progress
        self.console = console or Console(stderr=True)
        self.every_s = every_s
        self._live: Live | None = None
        self._last = 0.0

    def __enter__(self) -> "ProgressDisplay":
        if self.console.is_terminal:
            self._live = Live(progress_line(self.p), console=self.console, refresh_per_second=2,
                              get_renderable=lambda: progress_line(self.p))
            self._live.__enter__()
        return self

    def tick(self) -> None:
        if self._live is None and time.perf_counter() - self._last >= self.every_s:
            self._last = time.perf_counter()
            self.console.print(progress_line(self.p), soft_wrap=True)

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
        else:
            self.console.print(progress_line(self.p), soft_wrap=True)


_ROWS = [
    ("trajectories", "trajectories", "{:.0f}"), ("groups", "groups (tasks)", "{:.0f}"),
    ("reward_mean", "mean reward", "{:.3f}"), ("pass_at_1", "pass@1", "{:.3f}"), ("pass_at_g", "pass@G", "{:.3f}"),
    ("nonzero_reward_groups", "groups with reward > 0", "{:.0f}"), ("mean_turns", "mean turns", "{:.2f}"),
    ("tool_calls", "tool calls", "{:.0f}"), ("tool_errors", "tool errors", "{:.0f}"),
    ("parse_errors", "parse errors", "{:.0f}"), ("truncations", "truncations", "{:.0f}"),
    ("timeouts", "timeouts", "{:.0f}"), ("infra_errors", "infra errors (unscored)", "{:.0f}"),
    ("infra_error_frac", "unscored fraction", "{:.1%}"), ("policy_errors", "policy errors (scored)", "{:.0f}"),
    ("template_drift_turns", "template drift (turns)", "{:.0f}"), ("tokens_generated", "tokens generated", "{:.0f}"),
    ("tokens_per_s", "tokens/s (wall)", "{:.1f}"), ("wall_s", "wall time (s)", "{:.1f}"),
]


def summary_table(summary: dict[str, float], title: str = "rollout summary") -> Table:
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, label, fmt in _ROWS:
        if key in summary:
            table.add_row(label, fmt.format(summary[key]))
    return table
