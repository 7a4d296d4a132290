"""Terminal output: the live progress line (a heartbeat in logs) of every long command (rollout, train, eval,
envs check, replay --reexecute, rescore --rerun-tests) and the summary table (rich)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from agentrl.runner.progress import Progress

HEARTBEAT_S = 10.0
"""Seconds between two heartbeat lines in a log (not a terminal): long work is never silent for longer."""


def merged(progresses: Iterable[Progress], started: float) -> Progress:
    """One Progress summing several schedulers' (an evaluation runs one per mode), for one progress line; `started`:
    when the work they belong to started."""
    out = Progress(started=started)
    for p in progresses:
        for name in ("trajectories_done", "trajectories_total", "turns", "tool_calls", "tokens", "infra_errors",
                     "policy_errors"):
            setattr(out, name, getattr(out, name) + getattr(p, name))
        out.in_flight.update(p.in_flight)
    return out


def timed(line: Callable[[], str]) -> Callable[[], str]:
    """`line` followed by the seconds since this call (for heartbeats of work without a scheduler's Progress)."""
    started = time.perf_counter()
    return lambda: f"{line()}  {time.perf_counter() - started:.0f}s"


def progress_line(p: Progress) -> str:
    elapsed = time.perf_counter() - p.started
    turns, tokens, tool_calls = p.live()
    return (f"trajectories {p.trajectories_done}/{p.trajectories_total} ({len(p.in_flight)} in flight)  turns {turns}"
            f"  tool calls {tool_calls}  tokens {tokens} ({tokens / max(elapsed, 1e-9):.1f}/s)"
            f"  infra errors {p.infra_errors}  policy errors {p.policy_errors}  {elapsed:.0f}s")


class ProgressDisplay:
    """The live progress of long work: a scheduler's `Progress` (in-flight trajectories included) or any function
    that returns the status line. On a terminal one status line redrawn twice a second; elsewhere (CI logs, pipes,
    or `live=False`) a heartbeat line every `every_s` seconds (default HEARTBEAT_S) whether or not anything
    finished, so long work is never silent. Enter it inside the running event loop (`with`, or `async with` from a
    coroutine on another thread's loop): the heartbeat is a task on it, cancelled on exit, which prints the final
    line (unless the work raised). The loop must stay free while the work runs (blocking work goes to threads)."""

    def __init__(self, progress: Progress | Callable[[], str], console: Console | None = None,
                 every_s: float | None = None, *, live: bool = True) -> None:
        self.line: Callable[[], str] = progress if callable(progress) else (lambda: progress_line(progress))
        self.console = console or Console(stderr=True)
        self.every_s = HEARTBEAT_S if every_s is None else every_s
        self.use_live = live
        self._live: Live | None = None
        self._beat: asyncio.Task[None] | None = None

    def __enter__(self) -> ProgressDisplay:
        if self.use_live and self.console.is_terminal:
            self._live = Live(self.line(), console=self.console, refresh_per_second=2)
            self._live.__enter__()
        self._beat = asyncio.get_running_loop().create_task(self._heartbeat(), name="agentrl-progress")
        return self

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(0.5 if self._live is not None else self.every_s)
            self._show()

    async def __aenter__(self) -> ProgressDisplay:
        return self.__enter__()

    async def __aexit__(self, *exc: Any) -> None:
        self.__exit__(*exc)

    def _show(self) -> None:
        if self._live is not None:
            self._live.update(self.line())
        else:
            self.console.print(self.line(), soft_wrap=True, markup=False, highlight=False)

    def tick(self) -> None:
        """A group finished: redraw now on a terminal (the heartbeat keeps its own pace in logs)."""
        if self._live is not None:
            self._show()

    def __exit__(self, *exc: Any) -> None:
        if self._beat is not None:
            self._beat.cancel()
        if self._live is not None:
            self._live.update(self.line())
            self._live.__exit__(*exc)
        elif exc[0] is None:  # the final line; on an error the error is what gets printed last
            self.console.print(self.line(), soft_wrap=True, markup=False, highlight=False)


_ROWS = [
    ("trajectories", "trajectories", "{:.0f}"), ("groups", "groups (tasks)", "{:.0f}"),
    ("reward_mean", "mean reward", "{:.3f}"), ("pass_at_1", "pass@1", "{:.3f}"), ("pass_at_g", "pass@G", "{:.3f}"),
    ("nonzero_reward_groups", "groups with reward > 0", "{:.0f}"), ("mean_turns", "mean turns", "{:.2f}"),
    ("tool_calls", "tool calls", "{:.0f}"), ("tool_errors", "tool errors", "{:.0f}"),
    ("parse_errors", "parse errors", "{:.0f}"), ("truncations", "truncations", "{:.0f}"),
    ("timeouts", "timeouts", "{:.0f}"), ("infra_errors", "infra errors (unscored)", "{:.0f}"),
    ("infra_error_frac", "unscored fraction", "{:.1%}"), ("policy_errors", "policy errors (scored)", "{:.0f}"),
    ("integrity_flagged", "flagged (integrity signals)", "{:.0f}"),
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
