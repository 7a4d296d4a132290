"""The debugging commands: `agentrl replay`, `agentrl rescore`, `agentrl view`, `agentrl stats`.

    agentrl replay FILE|RUN_DIR [--id ID] [--task TASK] [--step N] [--reexecute [--sandbox local|docker]]
                   [--max-chars N]
    agentrl rescore FILE|RUN_DIR [--reward CONFIG.yaml] [--env NAME] [--rerun-tests [--sandbox ...]] [--out FILE]
                    [--all]
    agentrl view FILE|RUN_DIR -o report.html [--max-chars N] [--title TEXT]
    agentrl stats FILE|RUN_DIR [--json OUT]

For a training run dir, `view` and `stats` also show the train-inference mismatch per step from its metrics.jsonl.

FILE is a trajectory JSONL; RUN_DIR a directory a run wrote, read through its `trajectories.jsonl`
(`agentrl.cli.paths`).

Every command reads the file tolerantly: each unreadable line (corrupt, truncated, schema from the future) is
printed to stderr naming its line, counted, and skipped; the rest is read. A missing file, or a directory without
`trajectories.jsonl`, is an error naming the path (exit 2).
Exit codes: 0 ok; 1 `replay --reexecute` found a differing call (or a replay failed) / `rescore` found a differing
reward (or could not re-run a trajectory's tests); 2 error.

Only this module wires replay to sandboxes (through the composition root, `agentrl.compose.make_pool`); heavy
imports happen inside the commands so `agentrl --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

MAX_PRINTED_LINE_ERRORS = 20
FILE_HELP = "trajectory JSONL, or a run directory (its trajectories.jsonl)"


def add_replay_commands(sub: Any) -> None:
    """Add replay, rescore, view and stats to the `agentrl` subparsers."""
    _add_replay(sub)
    _add_rescore(sub)
    v = sub.add_parser("view", help="write one self-contained HTML report of a trajectory file or a training run")
    v.add_argument("file", type=Path, help="trajectory JSONL, or a training output_dir (its trajectories.jsonl "
                                           "plus its behaviour snapshots)")
    v.add_argument("-o", "--out", type=Path, default=Path("report.html"), help="HTML file to write")
    v.add_argument("--title", help="page title (default: the file name)")
    v.add_argument("--max-chars", type=int, default=4000,
                   help="trim each long text to about N characters (halved until the page fits 45 MB; 0: never trim)")
    v.set_defaults(func=_cmd_view)
    s = sub.add_parser("stats", help="the run's metrics table (same numbers as the rollout summary), per step")
    s.add_argument("file", type=Path, help=FILE_HELP)
    s.add_argument("--json", type=Path, help="also write the metrics as JSON here (for dashboards)")
    s.set_defaults(func=_cmd_stats)


def _add_sandbox_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sandbox", default="local", choices=["local", "docker"], help="sandbox backend (default local)")
    p.add_argument("--unsafe-no-isolation", action="store_true", help="local sandboxes without bubblewrap")
    p.add_argument("--env-option", action="append", default=[], metavar="KEY=VALUE",
                   help="env constructor option, as given to the run (default: meta.env_options if recorded)")


def _add_replay(sub: Any) -> None:
    p = sub.add_parser("replay", help="show stored trajectories turn by turn; --reexecute replays their tool calls")
    p.add_argument("file", type=Path, help=FILE_HELP)
    p.add_argument("--id", dest="traj_id", help="trajectory id (or a unique prefix of one)")
    p.add_argument("--task", help="every trajectory of this task id")
    p.add_argument("--step", type=int, help="every trajectory of this training step")
    p.add_argument("--reexecute", action="store_true",
                   help="replay every tool call in a fresh sandbox and compare with the stored results")
    p.add_argument("--max-chars", type=int, default=2000, help="trim each long text to about N characters (0: all)")
    _add_sandbox_args(p)
    p.set_defaults(func=_cmd_replay)


def _add_rescore(sub: Any) -> None:
    p = sub.add_parser("rescore", help="recompute rewards from stored test reports (or re-run the tests)")
    p.add_argument("file", type=Path, help=FILE_HELP)
    p.add_argument("--reward", type=Path, metavar="CONFIG",
                   help="YAML with the reward sources (a list, or a rollout/train config's `reward:`); default: the "
                        "config each trajectory records (meta.reward), else unit_tests")
    p.add_argument("--env", help="env whose tests to re-run (default: each trajectory's own env)")
    p.add_argument("--rerun-tests", action="store_true",
                   help="re-run the env's tests on each stored solution in a fresh sandbox")
    p.add_argument("--out", type=Path, help="write the rescored trajectories to this new file")
    p.add_argument("--all", action="store_true", help="list every trajectory, not only those whose reward changed")
    _add_sandbox_args(p)
    p.set_defaults(func=_cmd_rescore)


# -- shared -------------------------------------------------------------------------------------------------------

def _load(given: Path) -> Any:
    """Read the trajectory file `given` names (a file or a run dir); print each unreadable line to stderr (the first
    few) and how many there were."""
    from agentrl.cli.paths import trajectory_file
    from agentrl.replay import load

    path = trajectory_file(given)
    loaded = load(path)
    for err in loaded.errors[:MAX_PRINTED_LINE_ERRORS]:
        print(f"warning: skipped {err}", file=sys.stderr)
    if loaded.errors:
        more = len(loaded.errors) - MAX_PRINTED_LINE_ERRORS
        extra = f" ({more} not printed)" if more > 0 else ""
        print(f"warning: {len(loaded.errors)} unreadable line(s) in {path}{extra}; "
              f"read {len(loaded.trajectories)} trajectories", file=sys.stderr)
    return loaded


def _train_metrics(given: Path) -> list[dict[str, Any]]:
    """The rows of a training run dir's metrics.jsonl ([] for a trajectory file or a rollout dir); an unreadable line
    is skipped with a warning naming it."""
    from agentrl.cli.paths import metrics_file

    path = metrics_file(given)
    rows: list[dict[str, Any]] = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines() if path else [], start=1):
        try:
            row = json.loads(line) if line.strip() else None
        except json.JSONDecodeError as exc:
            print(f"warning: skipped {path}:{n}: not JSON ({exc.msg})", file=sys.stderr)
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _console() -> Any:
    from rich.console import Console

    return Console(highlight=False, markup=False)  # file names and ids are printed as they are


def _pool_factory(a: argparse.Namespace) -> Any:
    from agentrl.compose import make_pool
    from agentrl.replay import new_run_id

    def factory(spec: Any) -> Any:
        return make_pool(a.sandbox, spec, warm=0, max_sandboxes=1, run_id=new_run_id(),
                         unsafe_no_isolation=a.unsafe_no_isolation)

    return factory


def _env_options(a: argparse.Namespace) -> dict[str, Any]:
    from agentrl.cli import _parse_kv

    return dict(_parse_kv(kv) for kv in a.env_option)


# -- commands -----------------------------------------------------------------------------------------------------

def _cmd_replay(a: argparse.Namespace) -> int:
    from agentrl.errors import ConfigError
    from agentrl.replay import describe_no_match, select
    from agentrl.view.terminal import listing_table, trajectory_view

    loaded = _load(a.file)
    filters = {"traj_id": a.traj_id, "task": a.task, "step": a.step}
    chosen = select(loaded.trajectories, **filters)
    if not chosen:
        raise ConfigError(f"{a.file}: {describe_no_match(loaded.trajectories, **filters)}")
    console = _console()
    unfiltered = all(v is None for v in filters.values())
    if unfiltered and len(chosen) > 1 and not a.reexecute:
        console.print(listing_table(chosen, title=f"{a.file}: {len(chosen)} trajectories"))
        console.print("pick one with --id ID (or --task TASK / --step N to show several)")
        return 0
    if not a.reexecute:
        for t in chosen:
            console.print(trajectory_view(t, max_chars=a.max_chars))
        return 0
    return _reexecute(a, chosen, console)


def _reexecute(a: argparse.Namespace, chosen: list[Any], console: Any) -> int:
    from agentrl.cli import _run_cancellable
    from agentrl.cli.display import ProgressDisplay, timed
    from agentrl.replay import reexecute_many
    from agentrl.view.terminal import reexecute_view

    def show(report: Any) -> None:
        console.print(reexecute_view(report, max_chars=a.max_chars))

    reports: list[Any] = []

    def line() -> str:
        calls = sum(len(r.checks) for r in reports)
        return f"replay --reexecute: {len(reports)}/{len(chosen)} trajectories re-executed ({calls} tool calls)"

    def done(report: Any) -> None:
        reports.append(report)
        show(report)

    async def run() -> int:
        with ProgressDisplay(timed(line), live=False):  # one trajectory's tool calls can take minutes
            await reexecute_many(chosen, _pool_factory(a), env_options=_env_options(a), on_report=done)
        return 0

    rc = _run_cancellable(run())
    if rc:
        return rc
    calls = sum(len(r.checks) for r in reports)
    differing = sum(len(r.mismatches) for r in reports)
    failed = sum(r.error is not None for r in reports)
    verdict = "all identical" if not differing else f"{differing} differ"
    console.print(f"re-executed {len(reports)} trajectories, {calls} tool calls: {verdict}"
                  + (f"; {failed} trajectories could not be replayed to the end" if failed else ""), soft_wrap=True)
    return 0 if all(r.all_match for r in reports) else 1


def _reward_specs(path: Path | None) -> Any:
    """The `reward:` list of `--reward FILE` (a YAML list, or a mapping that holds `reward:`), or None."""
    import yaml

    from agentrl.errors import ConfigError
    from agentrl.reward import parse_reward_list

    if path is None:
        return None
    if not path.is_file():
        raise ConfigError(f"--reward {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"--reward {str(path)!r} is not valid YAML: {exc}") from None
    return parse_reward_list(data, f"--reward {path}")


def _cmd_rescore(a: argparse.Namespace) -> int:
    from agentrl.replay import rescore_rerun, rescore_with, write_trajectories
    from agentrl.view.terminal import rescore_table

    specs = _reward_specs(a.reward)
    loaded = _load(a.file)
    if a.rerun_tests:
        from agentrl.cli import _run_cancellable
        from agentrl.cli.display import ProgressDisplay, timed

        rows: list[Any] = []

        def line() -> str:
            return f"rescore --rerun-tests: {len(rows)}/{len(loaded.trajectories)} trajectories re-tested"

        async def run() -> int:
            with ProgressDisplay(timed(line), live=False):  # each re-run starts a sandbox and runs the tests
                await rescore_rerun(loaded.trajectories, _pool_factory(a), env_name=a.env,
                                    env_options=_env_options(a), specs=specs, on_row=rows.append)
            return 0

        rc = _run_cancellable(run())
        if rc:
            return rc
    else:
        from agentrl.cli import _run_cancellable

        rows = []

        async def pure() -> int:
            rows.extend(await rescore_with(loaded.trajectories, specs, env_name=a.env, env_options=_env_options(a)))
            return 0

        rc = _run_cancellable(pure())
        if rc:
            return rc
    console = _console()
    changed = [r for r in rows if r.differs]
    failed = [r for r in rows if r.error is not None]
    if changed or failed or a.all:
        console.print(rescore_table(rows, only_diffs=not a.all))
    how = "tests re-run" if a.rerun_tests else "from stored tests"
    console.print(f"rescored {len(rows)} trajectories ({how}): {len(changed)} rewards differ"
                  + (f", {len(failed)} could not be re-run" if failed else ""), soft_wrap=True)
    if a.out:
        write_trajectories(a.out, [r.rescored for r in rows])
        console.print(f"wrote {len(rows)} rescored trajectories to {a.out}")
    return 1 if changed or failed else 0


def _cmd_view(a: argparse.Namespace) -> int:
    from agentrl.view import write_report
    from agentrl.view.snapshots import load_run_snapshots

    snaps = None
    loaded = _load(a.file)
    if a.file.is_dir():
        snaps = load_run_snapshots(a.file)
        for err in snaps.errors[:MAX_PRINTED_LINE_ERRORS]:
            print(f"warning: {err}", file=sys.stderr)
    info = write_report(a.out, loaded.trajectories, title=a.title or f"agentrl trajectories: {a.file.name}",
                        errors=loaded.errors, max_chars=a.max_chars, snapshots=snaps,
                        metrics=_train_metrics(a.file))
    trimmed = f"; texts trimmed to {info.max_chars} characters to fit" if info.max_chars < a.max_chars else ""
    snap = f", {len(snaps.rows)} snapshot rows" if snaps is not None and snaps.rows else ""
    print(f"wrote {info.path} ({info.trajectories} trajectories{snap}, {info.bytes / 1e6:.1f} MB{trimmed})")
    return 0


def error_causes(trajectories: list[Any]) -> dict[str, dict[str, int]]:
    """{"infra_error": {kind: n}, "policy_error": {kind: n}}, most common first (only statuses that occur)."""
    from collections import Counter

    out: dict[str, Counter[str]] = {}
    for t in trajectories:
        if t.status.value in ("infra_error", "policy_error"):
            out.setdefault(t.status.value, Counter())[t.error_kind or "unknown"] += 1
    return {status: dict(c.most_common()) for status, c in out.items()}


def _cmd_stats(a: argparse.Namespace) -> int:
    from agentrl.cli.display import summary_table
    from agentrl.runner import integrity
    from agentrl.store import summarize
    from agentrl.view.data import NO_STEP, by_step
    from agentrl.view.mismatch import mismatch_rows, mismatch_table
    from agentrl.view.terminal import steps_table

    loaded = _load(a.file)
    metrics = _train_metrics(a.file)
    overall = summarize(loaded.trajectories)
    steps = by_step(loaded.trajectories)
    per_step = {k: summarize(v) for k, v in steps.items()} if set(steps) != {NO_STEP} else {}
    console = _console()
    console.print(summary_table(overall, title=f"{a.file.name}: run summary"))
    if per_step:
        console.print(steps_table(per_step))
    if (mismatch := mismatch_table(metrics)) is not None:
        console.print(mismatch)
    causes = error_causes(loaded.trajectories)
    for status, counts in causes.items():
        console.print(f"{status} by cause: " + ", ".join(f"{kind} {n}" for kind, n in counts.items()))
    signals = integrity.counts(loaded.trajectories)
    console.print("integrity signals: " + (", ".join(
        f"{name} in {c['trajectories']} trajectories ({c['count']}x)" for name, c in signals.items()) or "none"))
    if a.json:
        payload = {"file": str(a.file), "unreadable_lines": len(loaded.errors), "summary": overall,
                   "steps": {str(k): v for k, v in per_step.items()}, "error_causes": causes, "integrity": signals,
                   "mismatch": mismatch_rows(metrics)}
        a.json.write_text(json.dumps(payload, indent=2))
        console.print(f"wrote {a.json}")
    return 0
