"""Replay, re-execute and re-score stored trajectories: the debugging half of the store.

Owns: loading a trajectory file tolerantly (unreadable lines become counted `LineError`s, the rest is read),
selecting trajectories (`--id` / `--task` / `--step`), re-executing every stored tool call in a fresh sandbox and
comparing each result with what was stored, and re-scoring (from the stored record with a reward config — the
given one, else the one each trajectory records — or by re-running an env's tests on the stored solution first). Does
not own: drawing anything (`agentrl.view`), building sandbox pools
(the caller passes a `PoolFactory`, the CLI builds it from flags), or the reward definition (`agentrl.reward`).

Re-execution order: `env.setup(sandbox, task)` once, then `env.call_tool` for each stored `ToolCall` in turn
order and, within a turn, in call order, all in ONE sandbox (state carries over, as in the original rollout).
A call "matches" when every field in `COMPARED_FIELDS` of the new `ToolResult` equals the stored one; durations
are never compared.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agentrl.envs import Env, Task, get_env, lease_sandbox, spec_for_env
from agentrl.errors import ConfigError, InfraError, MissingDependencyError
from agentrl.reward import DEFAULT_REWARD, RewardSpec, Scorer, recorded_specs, score
from agentrl.sandbox.base import SandboxSpec
from agentrl.store import LineError, TrajectoryStore, iter_records
from agentrl.types import Status, TestReport, ToolCall, ToolResult, Trajectory

COMPARED_FIELDS: tuple[str, ...] = ("output", "exit_code", "stdout", "stderr", "timed_out", "truncated", "error",
                                    "done")
REWARD_TOLERANCE = 1e-9

# spec -> a SandboxPool-like object: `async with pool:` then `async with pool.lease() as sandbox:`
PoolFactory = Callable[[SandboxSpec], Any]


# -- loading and selection ----------------------------------------------------------------------------------------

@dataclass
class Loaded:
    """Everything readable in one file plus a `LineError` for every line that was not."""

    path: Path
    trajectories: list[Trajectory]
    errors: list[LineError]


def load(path: str | Path) -> Loaded:
    """Read `path` tolerantly. Raises `StoreError` only when the file itself is missing."""
    trajs: list[Trajectory] = []
    errors: list[LineError] = []
    for rec in iter_records(path):
        (errors if isinstance(rec, LineError) else trajs).append(rec)  # type: ignore[arg-type]
    return Loaded(Path(path), trajs, errors)


def select(trajs: Sequence[Trajectory], *, traj_id: str | None = None, task: str | None = None,
           step: int | None = None) -> list[Trajectory]:
    """Trajectories matching every given filter. `traj_id` matches exactly, else as a unique prefix."""
    out = [t for t in trajs if (task is None or t.task_id == task) and (step is None or t.step == step)]
    if traj_id is None:
        return out
    exact = [t for t in out if t.id == traj_id]
    if exact:
        return exact
    prefixed = [t for t in out if t.id.startswith(traj_id)]
    if len(prefixed) > 1:
        raise ConfigError(f"--id {traj_id!r} is ambiguous: it prefixes {len(prefixed)} trajectories "
                          f"({', '.join(t.id for t in prefixed[:5])}...); give more of the id")
    return prefixed


def describe_no_match(trajs: Sequence[Trajectory], **filters: object) -> str:
    if not trajs:
        return "the file holds no readable trajectories"
    given = " ".join(f"--{k.replace('traj_id', 'id')} {v}" for k, v in filters.items() if v is not None)
    ids = ", ".join(t.id for t in trajs[:5])
    return f"no trajectory matches {given} ({len(trajs)} in the file; first ids: {ids})"


# -- re-execution -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CallCheck:
    """One stored tool call replayed. `differs` names the compared fields whose values changed."""

    turn: int
    call: ToolCall
    stored: ToolResult | None  # None: the trajectory holds no result for this call (it ended mid-turn)
    replayed: ToolResult
    differs: tuple[str, ...]

    @property
    def matches(self) -> bool:
        return self.stored is not None and not self.differs


@dataclass
class ReexecuteReport:
    trajectory: Trajectory
    checks: list[CallCheck] = field(default_factory=list)
    error: str | None = None  # setup / infra failure: the replay stopped early

    @property
    def all_match(self) -> bool:
        return self.error is None and all(c.matches for c in self.checks)

    @property
    def mismatches(self) -> list[CallCheck]:
        return [c for c in self.checks if not c.matches]


def compare_results(stored: ToolResult, replayed: ToolResult) -> tuple[str, ...]:
    return tuple(f for f in COMPARED_FIELDS if getattr(stored, f) != getattr(replayed, f))


def stored_calls(traj: Trajectory) -> list[tuple[int, ToolCall, ToolResult | None]]:
    """(turn index, call, stored result) for every parsed call, in the order the rollout ran them."""
    out = []
    for turn in traj.turns:
        by_id = {r.call_id: r for r in turn.tool_results}
        for k, call in enumerate(turn.tool_calls):
            fallback = turn.tool_results[k] if k < len(turn.tool_results) else None
            out.append((turn.index, call, by_id.get(call.id, fallback)))
    return out


async def _call(env: Env, sandbox: Any, call: ToolCall, task: Task) -> ToolResult:
    """`env.call_tool` exactly as the rollout calls it: a tool that raises is a `tool_failed` result."""
    try:
        return await env.call_tool(sandbox, call, task=task)
    except InfraError:
        raise
    except Exception as exc:  # mirrors agentrl.runner.rollout: the tool's own failure is data
        return ToolResult(call_id=call.id, name=call.name, output=f"tool error: {exc}", error="tool_failed")


async def reexecute(traj: Trajectory, env: Env, task: Task, pool: Any) -> ReexecuteReport:
    """Replay every stored tool call of `traj` in one fresh sandbox leased from `pool`."""
    report = ReexecuteReport(traj)
    try:
        async with lease_sandbox(pool, env, task) as sandbox:
            await env.setup(sandbox, task)
            for turn, call, stored in stored_calls(traj):
                replayed = await _call(env, sandbox, call, task)
                differs = compare_results(stored, replayed) if stored is not None else ("missing stored result",)
                report.checks.append(CallCheck(turn, call, stored, replayed, differs))
    except Exception as exc:  # infra failure, or an env bug in setup: this replay stops, the others go on
        report.error = f"{type(exc).__name__}: {exc}"
    return report


def find_task(env: Env, task_id: str) -> Task:
    for task in env.tasks():
        if task.id == task_id:
            return task
    raise _missing_task(env, task_id)


def _missing_task(env: Env, task_id: str) -> ConfigError:
    return ConfigError(f"task {task_id!r} is not among env {env.name!r}'s tasks; if the run used env options "
                       f"(e.g. a dataset), pass the same ones with --env-option KEY=VALUE")


def spec_for(traj: Trajectory, env: Env) -> SandboxSpec:
    """The sandbox spec the run recorded in `meta["sandbox_spec"]`, else the env's own."""
    recorded = traj.meta.get("sandbox_spec")
    if not isinstance(recorded, dict):
        return env.sandbox_spec
    try:
        return spec_for_env(SandboxSpec.model_validate(recorded), env)  # + the env's writable dirs (e.g. /repo)
    except ValidationError as exc:
        raise ConfigError(f"trajectory {traj.id}: meta.sandbox_spec is not a valid SandboxSpec ({exc})") from exc


class _Envs:
    """Env instances (and their task lists) per (name, options). Options given on the command line win over
    the ones the run recorded in `meta["env_options"]`."""

    def __init__(self, env_name: str | None, options: dict[str, Any] | None) -> None:
        self.env_name, self.options = env_name, options
        self._envs: dict[str, tuple[Env, dict[str, Task]]] = {}

    def resolve(self, traj: Trajectory) -> tuple[Env, Task]:
        name = self.env_name or traj.env
        recorded = traj.meta.get("env_options")
        opts = self.options if self.options else (recorded if isinstance(recorded, dict) else {})
        key = json.dumps([name, opts], sort_keys=True, default=str)
        if key not in self._envs:
            env = get_env(name, **opts)
            self._envs[key] = (env, {t.id: t for t in env.tasks()})
        env, tasks = self._envs[key]
        if traj.task_id not in tasks:
            raise _missing_task(env, traj.task_id)
        return env, tasks[traj.task_id]


class _Pools:
    """Pools opened on demand, one per sandbox spec, closed together."""

    def __init__(self, stack: AsyncExitStack, factory: PoolFactory) -> None:
        self.stack, self.factory = stack, factory
        self._pools: dict[SandboxSpec, Any] = {}

    async def get(self, spec: SandboxSpec) -> Any:
        if spec not in self._pools:
            self._pools[spec] = await self.stack.enter_async_context(self.factory(spec))
        return self._pools[spec]


async def reexecute_many(trajs: Iterable[Trajectory], pool_factory: PoolFactory, *, env_name: str | None = None,
                         env_options: dict[str, Any] | None = None,
                         on_report: Callable[[ReexecuteReport], None] | None = None) -> list[ReexecuteReport]:
    """Re-execute each trajectory in its own fresh sandbox, one after another (reports stream to `on_report`)."""
    envs = _Envs(env_name, env_options)
    reports: list[ReexecuteReport] = []
    async with AsyncExitStack() as stack:
        pools = _Pools(stack, pool_factory)
        for traj in trajs:
            try:
                env, task = envs.resolve(traj)
                report = await reexecute(traj, env, task, await pools.get(spec_for(traj, env)))
            except (ConfigError, InfraError) as exc:
                report = ReexecuteReport(traj, error=f"{type(exc).__name__}: {exc}")
            reports.append(report)
            if on_report is not None:
                on_report(report)
    return reports


# -- re-scoring ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RescoreRow:
    """The stored and the recomputed reward of one trajectory. `rescored` is the trajectory to write back."""

    original: Trajectory
    rescored: Trajectory
    note: str = ""
    error: str | None = None  # the tests could not be re-run; `rescored` is the original

    @property
    def differs(self) -> bool:
        """The reward changed, or (for records that stored them) a reward component did."""
        old, new = self.original.reward, self.rescored.reward
        if old is None or new is None:
            return old is not new
        before, after = self.original.reward_components, self.rescored.reward_components
        if before and (before.keys() != after.keys()
                       or any(abs(before[k] - after[k]) > REWARD_TOLERANCE for k in before)):
            return True
        return abs(old - new) > REWARD_TOLERANCE


class _Scorers:
    """One Scorer per reward config: the given one, else each trajectory's recorded `meta["reward"]`, else the
    default. Sources that need the task's prompt (http) get it from the trajectory's env (`_Envs`)."""

    def __init__(self, specs: list[RewardSpec] | None, envs: _Envs) -> None:
        self.specs, self.envs = specs, envs
        self._scorers: dict[str, Scorer] = {}

    def _prompt(self, traj: Trajectory) -> list[Any]:
        env, task = self.envs.resolve(traj)
        return env.messages(task)

    def get(self, traj: Trajectory) -> Scorer:
        specs = self.specs or recorded_specs(traj) or list(DEFAULT_REWARD)
        key = json.dumps([s.model_dump(mode="json") for s in specs], sort_keys=True)
        if key not in self._scorers:
            self._scorers[key] = Scorer(specs, prompt_messages=self._prompt)
        return self._scorers[key]

    async def aclose(self) -> None:
        for scorer in self._scorers.values():
            await scorer.aclose()


async def rescore_with(trajs: Iterable[Trajectory], specs: list[RewardSpec] | None = None, *,
                       env_name: str | None = None, env_options: dict[str, Any] | None = None) -> list[RescoreRow]:
    """Recompute rewards and components from the stored trajectories with `specs` (default: each trajectory's
    recorded reward config). A source that fails (service down, unknown env) gives an error row, not a reward."""
    scorers = _Scorers(specs, _Envs(env_name, env_options))
    rows: list[RescoreRow] = []
    try:
        for traj in trajs:
            try:
                rows.append(RescoreRow(traj, await scorers.get(traj).score(traj)))
            except (ConfigError, InfraError, ValueError) as exc:
                rows.append(RescoreRow(traj, traj, "not rescored", error=f"{type(exc).__name__}: {exc}"))
    finally:
        await scorers.aclose()
    return rows


def rescore_pure(trajs: Iterable[Trajectory]) -> list[RescoreRow]:
    """Recompute every reward from the stored test report (`agentrl.reward.score`); no sandbox, no I/O."""
    return [RescoreRow(t, score(t)) for t in trajs]


async def _rerun_one(traj: Trajectory, env: Env, task: Task, pool: Any, scorer: Scorer) -> RescoreRow:
    if traj.status is Status.infra_error:
        return RescoreRow(traj, await scorer.score(traj), "infra_error: never scored")
    if traj.solution is None:
        return RescoreRow(traj, await scorer.score(traj), "no stored solution: scored from the stored test report")
    async with lease_sandbox(pool, env, task) as sandbox:
        report: TestReport = await env.score_solution(sandbox, task, traj.solution)
    return RescoreRow(traj, await scorer.score(traj.model_copy(update={"tests": report})), "tests re-run")


async def rescore_rerun(trajs: Iterable[Trajectory], pool_factory: PoolFactory, *, env_name: str | None = None,
                        env_options: dict[str, Any] | None = None,
                        specs: list[RewardSpec] | None = None,
                        on_row: Callable[[RescoreRow], None] | None = None) -> list[RescoreRow]:
    """Re-run the env's tests on each stored solution in a fresh sandbox, then score the new report (with `specs`,
    default: each trajectory's recorded reward config). Rows stream to `on_row` as they are done."""
    envs = _Envs(env_name, env_options)
    scorers = _Scorers(specs, envs)
    rows: list[RescoreRow] = []
    async with AsyncExitStack() as stack:
        stack.push_async_callback(scorers.aclose)
        pools = _Pools(stack, pool_factory)
        for traj in trajs:
            try:
                env, task = envs.resolve(traj)
                rows.append(await _rerun_one(traj, env, task, await pools.get(spec_for(traj, env)),
                                             scorers.get(traj)))
            except MissingDependencyError:
                raise  # nothing can be re-run here
            except Exception as exc:  # unknown env/task, infra failure or an env bug: reported, the others go on
                rows.append(RescoreRow(traj, traj, "not re-run", error=f"{type(exc).__name__}: {exc}"))
            if on_row is not None:
                on_row(rows[-1])
    return rows


def write_trajectories(path: str | Path, trajs: Sequence[Trajectory]) -> None:
    """Write `trajs` as a new store, one append per run of consecutive trajectories of the same group."""
    with TrajectoryStore(path) as store:
        group: list[Trajectory] = []
        for t in trajs:
            if group and t.group_id != group[-1].group_id:
                store.append_group(group)
                group = []
            group.append(t)
        if group:
            store.append_group(group)


def new_run_id() -> str:
    return "replay-" + uuid.uuid4().hex[:8]
