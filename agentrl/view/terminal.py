"""Terminal rendering (rich) of trajectories, re-execution reports, re-scoring rows and per-step statistics.

Owns how `agentrl replay / rescore / stats` look. Every text that came from a model, a tool or a file is wrapped in
`rich.text.Text`, never interpreted as markup (tool output may contain "[bold]" or escape codes).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from agentrl.types import IntegritySignal, ToolResult, Trajectory, Turn
from agentrl.view.data import format_arguments, trim

if TYPE_CHECKING:  # replay imports envs and sandboxes; the views only read its records
    from agentrl.replay import ReexecuteReport, RescoreRow

MODEL_STYLE = "on #1d2b3a"
TOOL_STYLE = "on #3a2a12"


def _num(v: float | None, fmt: str = "{:.3f}") -> str:
    return "–" if v is None else fmt.format(v)


def listing_table(trajs: Sequence[Trajectory], title: str = "trajectories", max_rows: int = 50) -> Table:
    """One row per trajectory (the first `max_rows`); ids are never cut, they are what `--id` takes."""
    more = len(trajs) - max_rows
    table = Table(title=title, caption=f"… {more} more not shown" if more > 0 else None)
    for col in ("id", "task", "step", "status", "reward", "tests", "turns", "calls", "flags"):
        table.add_column(col, justify="right" if col in ("step", "reward", "tests", "turns", "calls") else "left",
                         overflow="fold", min_width=len(col))
    for t in trajs[:max_rows]:
        tests = f"{t.tests.passed}/{t.tests.total}" if t.tests else "–"
        table.add_row(Text(t.id), Text(t.task_id), _num(t.step, "{}"), t.status.value, _num(t.reward), tests,
                      str(len(t.turns)), str(t.num_tool_calls),
                      Text(",".join(s.name for s in t.integrity), style="bold red") if t.integrity else "")
    return table


def _header(t: Trajectory) -> Panel:
    tests = f"{t.tests.passed}/{t.tests.total}" if t.tests else "no test report"
    lines = [f"task {t.task_id}   env {t.env}   group {t.group_id}   sample {t.sample_index}   attempt {t.attempt}"
             f"   step {_num(t.step, '{}')}",
             f"status {t.status.value}   reward {_num(t.reward)}   tests {tests}   turns {len(t.turns)}   "
             f"tool calls {t.num_tool_calls}   tool errors {t.num_tool_errors}",
             f"tokens: prompt {len(t.prompt_ids)}   model {t.num_model_tokens}   "
             f"tool {len(t.completion_ids) - t.num_model_tokens}   template drift turns {t.drift_count}",
             "timing: " + "   ".join(f"{k.removesuffix('_s')} {v:.3f}s" for k, v in t.timing.model_dump().items())]
    if t.error:
        lines.append(f"error [{t.error_kind}]: {t.error}" if t.error_kind else f"error: {t.error}")
    text = Text("\n".join(lines))
    for sig in t.integrity:
        text.append("\n" + _signal_line(sig), style="bold red")
    return Panel(text, title=Text(f"trajectory {t.id}"), title_align="left")


def _signal_line(sig: IntegritySignal) -> str:
    where = "at grading" if sig.turn is None else f"at turn {sig.turn}"
    return f"INTEGRITY {sig.name} x{sig.count} {where}" + (f": {sig.detail}" if sig.detail else "")


def _result(r: ToolResult, max_chars: int) -> Text:
    flags = [f"exit {r.exit_code}" if r.exit_code is not None else "no exit code", f"{r.duration_s:.3f}s"]
    flags += [name for name, on in (("TIMED OUT", r.timed_out), ("truncated", r.truncated), ("done", r.done)) if on]
    if r.error:
        flags.append(f"error={r.error}")
    bad = r.error is not None or r.timed_out or (r.exit_code not in (0, None))
    out = Text(f"  result {r.call_id} ({r.name}): " + " · ".join(flags) + "\n", style="red" if bad else "green")
    out.append(_indent(trim(r.output, max_chars)))
    if r.stderr and r.stderr not in r.output:
        out.append("\n  stderr:\n", style="dim")
        out.append(_indent(trim(r.stderr, max_chars)))
    return out


def _indent(text: str, pad: str = "    ") -> str:
    return "\n".join(pad + line for line in text.splitlines()) if text else pad + "(empty)"


def _turn(turn: Turn, max_chars: int, signals: Sequence[IntegritySignal] = ()) -> Panel:
    parts: list[RenderableType] = [
        Text(f"model · {turn.model_len} tokens", style="bold cyan"),
        Text(trim(turn.text, max_chars) or "(empty)", style=MODEL_STYLE)]
    for call in turn.tool_calls:
        parts.append(Text(f"  tool call {call.id}: {call.name}\n", style="bold yellow")
                     + Text(_indent(trim(format_arguments(call.arguments), max_chars)), style="yellow"))
    parts += [_result(r, max_chars) for r in turn.tool_results]
    parts += [Text(f"  parse error: {e}", style="red") for e in turn.parse_errors]
    parts += [Text("  " + _signal_line(sig), style="bold red") for sig in signals if sig.turn == turn.index]
    if turn.env_len or turn.observation:
        parts.append(Text(f"tool · {turn.env_len} tokens", style="bold yellow"))
        parts.append(Text(trim(turn.observation, max_chars) or "(empty)", style=TOOL_STYLE))
    flags = [f"finish {turn.finish_reason}", f"weights v{turn.weight_version}", f"gen {turn.gen_duration_s:.3f}s",
             f"tools {turn.tool_duration_s:.3f}s", f"cached {turn.cached_tokens}"]
    flags += [name for name, on in (("TEMPLATE DRIFT", turn.prefix_drift),
                                    ("RE-TOKENIZE MISMATCH", turn.retokenize_mismatch)) if on]
    return Panel(Group(*parts), title=Text(f"turn {turn.index} · " + " · ".join(flags)), title_align="left")


def _tests(t: Trajectory, max_chars: int) -> RenderableType:
    if t.tests is None:
        return Text("no test report", style="dim")
    table = Table(title=f"tests {t.tests.passed}/{t.tests.total}" + (f" (error: {t.tests.error})" if t.tests.error
                                                                      else ""), title_justify="left")
    table.add_column("test")
    table.add_column("outcome")
    table.add_column("message")
    for o in t.tests.outcomes:
        table.add_row(Text(o.name), Text("pass", style="green") if o.passed else Text("FAIL", style="red"),
                      Text(trim(o.message, max_chars)))
    return table


def trajectory_view(t: Trajectory, *, max_chars: int = 2000) -> Group:
    """Header, every turn (model text, tool calls, results, observation), tests and the final solution."""
    parts: list[RenderableType] = [_header(t), *(_turn(turn, max_chars, t.integrity) for turn in t.turns),
                                   _tests(t, max_chars)]
    parts += [Text(_signal_line(sig), style="bold red") for sig in t.integrity if sig.turn is None]
    if t.solution:
        parts.append(Panel(Text(trim(t.solution, max_chars)), title="solution", title_align="left"))
    return Group(*parts)


def _diff(a: str, b: str, max_lines: int = 40) -> Text:
    lines = list(difflib.unified_diff(a.splitlines(), b.splitlines(), "stored", "replayed", lineterm="", n=1))
    out = Text()
    for line in lines[:max_lines]:
        style = "red" if line.startswith("-") else "green" if line.startswith("+") else "dim"
        out.append("      " + line + "\n", style=style)
    if len(lines) > max_lines:
        out.append(f"      … {len(lines) - max_lines} more diff lines\n", style="dim")
    return out


def reexecute_view(report: ReexecuteReport, *, max_chars: int = 2000) -> Group:
    """One `replay.ReexecuteReport`: a line per call (match / differing fields) and a diff of each change."""
    t = report.trajectory
    parts: list[RenderableType] = []
    for c in report.checks:
        if c.matches:
            parts.append(Text(f"  same     turn {c.turn} {c.call.id} {c.call.name}", style="green"))
            continue
        parts.append(Text(f"  DIFFERS  turn {c.turn} {c.call.id} {c.call.name}: {', '.join(c.differs)}",
                          style="bold red"))
        stored = c.stored or ToolResult(call_id=c.call.id, name=c.call.name, output="")
        for name in c.differs:
            old, new = getattr(stored, name, None), getattr(c.replayed, name)
            if isinstance(old, str) and isinstance(new, str):
                parts.append(_diff(trim(old, max_chars), trim(new, max_chars)))
            else:
                parts.append(Text(f"      {name}: stored {old!r} -> replayed {new!r}"))
    if report.error:
        parts.append(Text(f"  replay stopped: {report.error}", style="bold red"))
    verdicts = [f"{len(report.mismatches)} of {len(report.checks)} calls differ"] if report.mismatches else []
    verdicts += ["replay stopped"] if report.error else []
    verdict = ", ".join(verdicts) or "all calls identical"
    style = "green" if report.all_match else "red"
    return Group(Text(f"re-execute {t.id}: {len(report.checks)} tool calls, {verdict}", style=f"bold {style}"),
                 *parts)


def rescore_table(rows: Sequence[RescoreRow], *, only_diffs: bool = True) -> Table:
    """`replay.RescoreRow`s whose reward changed or that could not be re-run (all with `only_diffs=False`)."""
    table = Table(title="rescored rewards" + (" that differ" if only_diffs else ""))
    for col in ("id", "task", "stored reward", "new reward", "stored tests", "new tests", "note"):
        table.add_column(col)
    for r in rows:
        if only_diffs and not r.differs and r.error is None:
            continue
        old, new = r.original, r.rescored
        note = Text(f"{r.note}: {r.error}", style="red") if r.error else Text(r.note)
        table.add_row(Text(old.id), Text(old.task_id), _num(old.reward), _num(new.reward),
                      f"{old.tests.passed}/{old.tests.total}" if old.tests else "–",
                      f"{new.tests.passed}/{new.tests.total}" if new.tests else "–", note)
    return table


STEP_COLUMNS = (("trajectories", "trajs", "{:.0f}"), ("reward_mean", "reward", "{:.3f}"),
                ("pass_at_1", "pass@1", "{:.3f}"), ("pass_at_g", "pass@G", "{:.3f}"), ("mean_turns", "turns", "{:.2f}"),
                ("completion_len_mean", "len", "{:.0f}"), ("tool_errors", "t.err", "{:.0f}"),
                ("truncations", "trunc", "{:.0f}"), ("infra_errors", "infra", "{:.0f}"))


def steps_table(per_step: dict[Any, dict[str, float]]) -> Table:
    """One row per step: the main summary metrics and the reward delta to the previous step (fits 80 columns;
    `agentrl stats --json` has every metric)."""
    table = Table(title="per step", box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True, pad_edge=False)
    table.add_column("step", justify="right", no_wrap=True)
    for _, label, _ in STEP_COLUMNS[:2]:
        table.add_column(label, justify="right", no_wrap=True)
    table.add_column("Δreward", justify="right", no_wrap=True)
    for _, label, _ in STEP_COLUMNS[2:]:
        table.add_column(label, justify="right", no_wrap=True)
    prev = None
    for step, s in per_step.items():
        cells = [fmt.format(s[key]) for key, _, fmt in STEP_COLUMNS]
        delta = "" if prev is None else f"{s['reward_mean'] - prev:+.3f}"
        table.add_row(str(step), *cells[:2], delta, *cells[2:])
        prev = s["reward_mean"]
    return table
