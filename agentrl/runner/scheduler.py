"""Groups, concurrency, budgets and streaming of whole groups. One asyncio task per trajectory, no turn barrier.

Owns: turning (task, sample) pairs into finished `Trajectory` records — leasing a sandbox, running the loop
(`rollout.py`), killing what the policy left running and finalizing (hidden tests -> reward; for an env with
`grading_sandbox = "fresh"`, collect in the policy's sandbox, return it, lease a second one and grade there), one
deadline per stage (lease, setup, turns, finalize, teardown), attributing failures (`attribution.py`: infra_error only
for
causes that are provably not the policy's), retrying infrastructure failures within a budget, stopping a run whose
unscored fraction is too high (`guard.py`), and yielding each group as soon as its G trajectories are done. Does not
own: the loop itself,
the store (callers write what is yielded), or sandbox lifecycles (the pool's).

Concurrency: `max_trajectories` bounds trajectories in flight (each holds one sandbox lease; the pool bounds
sandboxes separately), and the engine batches whatever generate calls are outstanding.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agentrl.deadline import Deadline
from agentrl.envs.base import Submission, Task, lease_sandbox
from agentrl.errors import ConfigError, SandboxDiedError
from agentrl.reward import Scorer
from agentrl.runner import integrity
from agentrl.runner.attribution import DeathFacts, Stage, Verdict, classify
from agentrl.runner.guard import UnscoredGuard
from agentrl.runner.progress import Progress
from agentrl.runner.rollout import Rollout, TrajectoryState
from agentrl.runner.seeds import IdPlan
from agentrl.types import Status, TestReport, Timing, Trajectory

T = TypeVar("T")
DEATH_CAUSE_TIMEOUT_S = 10.0
REWARD_FAILED = "reward_failed"  # error_kind of a trajectory the scorer could not score (never re-run)

log = logging.getLogger("agentrl.runner")


@dataclass(frozen=True)
class SchedulerConfig:
    """Concurrency, retries and one deadline per stage of a trajectory (each with its own error message)."""

    group_size: int = 4
    max_trajectories: int = 16
    trajectory_timeout_s: float = 600.0  # the model's turns (generation + tools): expiry is status `timeout`, scored
    infra_retries: int = 2
    lease_timeout_s: float = 900.0  # waiting for a sandbox (includes waiting for a free slot): infra on expiry
    setup_timeout_s: float = 120.0  # env.setup: infra on expiry (the policy has not acted yet)
    finalize_timeout_s: float = 300.0  # hidden tests + solution read: policy_error on expiry (see time_needs())
    teardown_timeout_s: float = 60.0  # returning the lease; never changes the trajectory's verdict
    max_unscored_frac: float = 0.10  # over this fraction of infra_error trajectories the run stops
    unscored_min_trajectories: int = 20  # ... once at least this many trajectories are in
    seed: int | None = None  # deterministic: ids and per-turn sampling seeds derived from it (runner/seeds.py)
    namespace: str = ""  # separates deterministic runs that share a seed (e.g. evaluation modes)

    def episode_budget_s(self) -> float:
        """The longest one episode may hold a sandbox: the stage deadlines end it within this (a sandbox's TTL
        must cover it, `agentrl.config.check_ttl_covers_budgets`)."""
        return (self.lease_timeout_s + self.setup_timeout_s + self.trajectory_timeout_s + self.finalize_timeout_s
                + self.teardown_timeout_s)

    @classmethod
    def from_config(cls, cfg: Any, *, group_size: int | None = None) -> SchedulerConfig:
        """From a RolloutConfig / TrainConfig (duck-typed: `budgets`, `group_size`, `max_trajectories`, ...)."""
        b = cfg.budgets
        return cls(group_size=group_size or cfg.group_size, max_trajectories=cfg.max_trajectories,
                   trajectory_timeout_s=b.trajectory_timeout_s, infra_retries=cfg.infra_retries,
                   lease_timeout_s=b.lease_timeout_s, setup_timeout_s=b.setup_timeout_s,
                   finalize_timeout_s=b.finalize_timeout_s, teardown_timeout_s=b.teardown_timeout_s,
                   max_unscored_frac=cfg.max_unscored_frac,
                   unscored_min_trajectories=cfg.unscored_min_trajectories,
                   seed=cfg.seed if getattr(cfg, "deterministic", False) else None)


def check_time_needs(env: Any, *, tool_timeout_s: float, finalize_timeout_s: float) -> None:
    """Refuse to start when a deadline is shorter than what the env says an honest call may take: otherwise an
    honest solution would be charged a timeout (the policy's) for the env's own slowness."""
    needs = env.time_needs()
    for key, field_name, have in (("tool_call", "budgets.tool_timeout_s", tool_timeout_s),
                                  ("finalize", "budgets.finalize_timeout_s", finalize_timeout_s)):
        need = needs.get(key)
        if need is not None and have < need:
            raise ConfigError(f"{field_name}={have:g}s is shorter than env {env.name!r} may need for one "
                              f"{key.replace('_', ' ')} ({need:g}s with its options); raise {field_name} to at "
                              f"least {need:g} or lower the env's time options")


@dataclass
class _Attempt:
    """What one attempt of one trajectory has produced so far (the scheduler records it whatever happens)."""

    task: Task
    traj_id: str
    state: TrajectoryState | None = None
    stage: Stage = Stage.start
    tests: TestReport | None = None
    solution: str | None = None
    verdict: Verdict | None = None
    timing: Timing = field(default_factory=Timing)
    submission: Submission | None = None  # fresh grading: collected in the policy's sandbox, graded in another
    drift: asyncio.Task[str | None] | None = None  # deferred drift check, runs while the trajectory is finalized
    drift_error: str | None = None
    late_signals: list = field(default_factory=list)  # what the agent counted after the last tool call (kill_all)


class Scheduler:
    def __init__(self, rollout: Rollout, pool: Any, config: SchedulerConfig, *, meta: dict[str, Any] | None = None,
                 on_trajectory: Callable[[Trajectory], None] | None = None, scorer: Scorer | None = None,
                 slots: asyncio.Semaphore | None = None) -> None:
        if rollout.env.grading_sandbox not in ("same", "fresh"):
            raise ConfigError(f"env {rollout.env.name!r}: grading_sandbox={rollout.env.grading_sandbox!r}: use "
                              "'same' or 'fresh'")
        self.rollout = rollout
        self.scorer = scorer if scorer is not None else Scorer()  # default: unit_tests at weight 1
        self.pool = pool
        self.config = config
        self.meta = dict(meta or {})
        self.progress = Progress()
        self.guard = UnscoredGuard(config.max_unscored_frac, config.unscored_min_trajectories)
        self._on_trajectory = on_trajectory
        # `slots`: another scheduler's, so that everything one job runs (training, evaluation) stays under one bound
        self.slots = slots if slots is not None else asyncio.Semaphore(config.max_trajectories)
        self.ids = IdPlan(config.seed, config.namespace)
        self._replicas: Counter[tuple[str, int | None]] = Counter()  # groups started per (task, step)
        self.running = 0  # trajectories holding a slot now
        self._idle_since: float | None = time.perf_counter()
        self.idle_s = 0.0  # total time with no trajectory holding a slot, see idle_seconds()

    # -- the one fan-out: every group starts here (`run()` is built on it) ------------------------------------
    def submit(self, task: Task, *, group_id: str | None = None, step: int | None = None
               ) -> asyncio.Task[list[Trajectory]]:
        """Start the G trajectories of one group now (each waits for one of the `max_trajectories` slots).

        `group_id`: None numbers the group's replica per (task, step) (the deterministic ids and seeds of
        runner/seeds.py). The returned task resolves to the group ordered by sample index. Cancelling it cancels
        its trajectories (their sandbox leases are returned); a cancelled group is never a record, so it can never
        be mistaken for an infra error. Raises UnscoredLimitError (from the guard) like `run()`."""
        _check_submit(task, group_id, step)
        if group_id is None:
            replica = self._replicas[(task.id, step)]
            self._replicas[(task.id, step)] += 1
            group_id = self.ids.group_id(task.id, step, replica=replica)
        self.progress.trajectories_total += self.config.group_size
        return asyncio.create_task(self._group(task, group_id, step), name=f"agentrl-group-{group_id}")

    def idle_seconds(self) -> float:
        """Seconds so far during which no submitted trajectory held a slot (the engine had nothing of ours)."""
        extra = time.perf_counter() - self._idle_since if self._idle_since is not None else 0.0
        return self.idle_s + extra

    async def _group(self, task: Task, group_id: str, step: int | None) -> list[Trajectory]:
        workers = [asyncio.create_task(self._slotted(task, group_id, k, step)) for k in range(self.config.group_size)]
        try:
            out = await asyncio.gather(*workers)
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        return sorted(out, key=lambda t: t.sample_index)

    async def _slotted(self, task: Task, group_id: str, k: int, step: int | None) -> Trajectory:
        async with self.slots:
            self._busy(+1)
            try:
                traj = await self.run_one(task, group_id=group_id, sample_index=k, step=step)
            finally:
                self._busy(-1)
        self.guard.check()  # stop as soon as too many trajectories are unscored, not at the end of the group
        return traj

    def _busy(self, delta: int) -> None:
        now = time.perf_counter()
        if self.running == 0 and delta > 0 and self._idle_since is not None:
            self.idle_s += now - self._idle_since
            self._idle_since = None
        self.running += delta
        if self.running == 0:
            self._idle_since = now

    async def run(self, tasks: Iterable[Task], *, step: int | None = None) -> AsyncIterator[list[Trajectory]]:
        """Run G samples of every task; yield each group (ordered by sample index) as soon as it is complete.

        The groups start through `submit()`. Total: every trajectory ends in a record or its error is raised here
        (never a hang); closing the iterator early cancels and awaits the groups still running. Raises
        UnscoredLimitError when too many trajectories could not be scored (groups yielded before stay yielded)."""
        handles = [self.submit(task, step=step) for task in tasks]
        order = {h: i for i, h in enumerate(handles)}
        pending = set(handles)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for handle in sorted(done, key=order.__getitem__):
                    yield handle.result()
        finally:
            for h in handles:
                h.cancel()
            await asyncio.gather(*handles, return_exceptions=True)

    async def run_one(self, task: Task, *, group_id: str, sample_index: int, step: int | None = None) -> Trajectory:
        """One trajectory with infra retries. Never raises for task or infra failures: they are data."""
        attempt = 0
        while True:
            traj = await self._attempt(task, group_id, sample_index, attempt, step)
            self.progress.in_flight.pop(traj.id, None)  # in the same step as _account: the live counts never dip
            if (traj.status is not Status.infra_error or attempt >= self.config.infra_retries
                    or traj.error_kind == REWARD_FAILED):  # the episode was fine: never sample it again
                self._account(traj)
                return traj
            log.warning("trajectory %s (task %s) infra error [%s], attempt %d: %s", traj.id, task.id,
                        traj.error_kind, attempt, traj.error)
            attempt += 1

    async def _attempt(self, task: Task, group_id: str, k: int, attempt: int, step: int | None) -> Trajectory:
        """One attempt's record; while it runs its state is in `progress.in_flight` (run_one removes it with the
        record, an exception here removes it at once)."""
        run = _Attempt(task=task, traj_id=self.ids.trajectory_id(group_id, k, attempt))
        try:
            return await self._run_attempt(run, group_id, k, attempt, step)
        except BaseException:
            self.progress.in_flight.pop(run.traj_id, None)
            raise

    async def _run_attempt(self, run: _Attempt, group_id: str, k: int, attempt: int, step: int | None) -> Trajectory:
        task = run.task
        t0 = time.perf_counter()
        try:
            run.state = self.rollout.start(task, seed=self.ids.trajectory_seed(group_id, k))
            self.progress.in_flight[run.traj_id] = run.state
            await self._leased(run)
        except asyncio.CancelledError:
            if run.drift is not None:
                run.drift.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes a verdict on the record
            run.verdict = classify(exc, run.stage, deadline_expired=isinstance(exc, _StageDeadline))
        if run.drift is not None:
            run.drift_error = await _drift_result(run.drift)
        run.timing.total_s = time.perf_counter() - t0
        end_session = getattr(self.rollout.engine, "end_session", None)
        if end_session is not None:  # engines with sticky routing forget this trajectory's worker
            end_session(run.traj_id)
        return integrity.observe(await self._score(self._safe_record(run, group_id, k, attempt, step)),
                                 late=run.late_signals)

    async def _score(self, traj: Trajectory) -> Trajectory:
        """The scorer's reward. A scorer that fails (the reward service's 5xx / timeout after its own retries, a
        source's bug) leaves the trajectory unscored: infra_error `reward_failed`, never 0, and the episode is not
        sampled again (that would select for whatever the reward model accepts). A ConfigError (a reward service
        that rejects every request) stops the run."""
        try:
            return await self.scorer.score(traj)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001
            error = f"reward: {type(exc).__name__}: {exc}"
            return traj.model_copy(update={"status": Status.infra_error, "reward": None, "reward_components": {},
                                           "error_kind": REWARD_FAILED,
                                           "error": error if traj.error is None else f"{traj.error}\n{error}"})

    async def _leased(self, run: _Attempt) -> None:
        """Lease a sandbox (own deadline), run setup/turns/finalize in it, then return it. A failure inside is
        classified while the sandbox is still known (the backend is asked what happened to it); teardown failures
        are logged and never change the verdict. Fresh grading follows once the policy's sandbox is returned (so a
        trajectory never holds two leases: a full pool cannot deadlock on grading)."""
        await self._with_lease(run, Stage.lease, lambda sandbox: self._in_sandbox(run, sandbox))
        if run.submission is not None and run.verdict is None:
            submission = run.submission
            await self._with_lease(run, Stage.grade_lease, lambda sandbox: self._grade_in(run, sandbox, submission))

    async def _with_lease(self, run: _Attempt, stage: Stage, body: Callable[[Any], Awaitable[None]]) -> None:
        """Lease a sandbox for `run.task` (lease_timeout_s, counted in sandbox_wait_s; a failure here propagates
        with `stage` set, for the caller to classify), run `body(sandbox)`, classify a failure inside while the
        sandbox is still known (the backend is asked what happened to it), then return it. Teardown failures are
        logged and never change the verdict."""
        t0 = time.perf_counter()
        run.stage = stage
        lease = lease_sandbox(self.pool, self.rollout.env, run.task)
        sandbox = await _within(self.config.lease_timeout_s, lease.__aenter__(), "lease_timeout_s")
        run.timing.sandbox_wait_s += time.perf_counter() - t0
        leaving: BaseException | None = None  # a cancellation, handed to the lease's __aexit__
        try:
            try:
                await body(sandbox)
            except Exception as exc:  # noqa: BLE001
                run.verdict = await self._verdict(exc, run.stage, sandbox)
        except BaseException as exc:  # a cancellation in the body or while the verdict is decided
            leaving = exc
            raise
        finally:  # every path returns the lease, a cancellation included
            await self._teardown(lease, leaving)

    async def _grade_in(self, run: _Attempt, sandbox: Any, submission: Submission) -> None:
        """Fresh grading, in a second sandbox leased after the policy's was returned (a failing or expiring lease is
        infra: the policy has no part in it): env.grade under what collect() left of finalize_timeout_s. A death of
        that sandbox is classified on its own facts (the policy's kept code may run in its commands)."""
        run.stage = Stage.finalize
        left = max(self.config.finalize_timeout_s - run.timing.finalize_s, 0.0)
        t = time.perf_counter()
        run.tests = await _within(left, self.rollout.env.grade(sandbox, run.task, submission), "finalize_timeout_s")
        run.timing.finalize_s += time.perf_counter() - t

    async def _in_sandbox(self, run: _Attempt, sandbox: Any) -> None:
        env, task, state = self.rollout.env, run.task, run.state
        assert state is not None  # set by _attempt before the lease
        run.stage = Stage.setup
        t = time.perf_counter()
        await _within(self.config.setup_timeout_s, env.setup(sandbox, task), "setup_timeout_s")
        run.timing.setup_s = time.perf_counter() - t
        run.stage = Stage.turns
        try:
            await _within(self.config.trajectory_timeout_s,
                          self.rollout.run(state, task, sandbox, session_id=run.traj_id), "trajectory_timeout_s")
        except _StageDeadline:
            state.status = Status.timeout  # the policy ran out of wall time: scored on what it left behind
        run.timing.generation_s, run.timing.tools_s = state.gen_s, state.tools_s
        if state.drift_marks:  # deferred drift check: off the loop, overlapping finalize
            run.drift = asyncio.create_task(self.rollout.finish_drift(state))
        run.stage = Stage.finalize
        t = time.perf_counter()
        await _within(self.config.finalize_timeout_s, self._finalize(run, sandbox), "finalize_timeout_s")
        run.timing.finalize_s = time.perf_counter() - t

    async def _finalize(self, run: _Attempt, sandbox: Any) -> None:
        env = self.rollout.env
        await sandbox.kill_all()  # nothing the policy left running may touch the grading
        take = getattr(sandbox, "take_observed", None)  # refusals by processes that outlived the last tool call
        run.late_signals = integrity.from_sandbox(take()) if take is not None else []
        if env.grading_sandbox == "fresh":  # read the policy's work as data now; graded after this lease ends
            run.submission = await env.collect(sandbox, run.task)
            run.solution = run.submission.solution
            return
        run.tests = await env.finalize(sandbox, run.task)
        run.solution = await env.solution(sandbox, run.task)

    async def _verdict(self, exc: Exception, stage: Stage, sandbox: Any) -> Verdict:
        death = await self._death_facts(exc, sandbox) if isinstance(exc, SandboxDiedError) else None
        return classify(exc, stage, deadline_expired=isinstance(exc, _StageDeadline), death=death)

    async def _death_facts(self, exc: SandboxDiedError, sandbox: Any) -> DeathFacts:
        """What can be proven about a sandbox a stage found dead: the backend's cause, whether the sandbox still
        answers (then a missed deadline is the policy's), and what separates its agent from the commands."""
        cause = None
        try:
            cause = await _bounded(DEATH_CAUSE_TIMEOUT_S, self.pool.death_cause(sandbox))
        except Exception as err:  # noqa: BLE001 - unknown cause: decided on the other facts
            log.warning("sandbox %s: asking the backend why it died failed: %s", sandbox, err)
        # only a command runs the policy's code: a death during a file request or a health check is not its doing
        in_command = exc.in_flight and exc.request.endswith("/exec")
        ttl_s = getattr(getattr(sandbox, "spec", None), "ttl_s", None)
        return DeathFacts(in_flight=in_command, uid_separated=bool(sandbox.uid_separated), cause=cause,
                          control_plane_separated=_resources_separated(sandbox),
                          answers=cause is None and await _answers(sandbox),
                          within_budgets=ttl_s is not None and ttl_s >= self.config.episode_budget_s())

    async def _teardown(self, lease: Any, exc: BaseException | None) -> None:
        """Return the lease (within teardown_timeout_s). A cancellation that lands meanwhile waits for the return to
        finish and is then raised: the sandbox and its pool slot are never left to garbage collection. A return that
        fails or runs past teardown_timeout_s is logged and never raised: the episode is over, and its verdict is
        not the backend's deleting speed (`await shield(returning)` raised it, so at 2,000 pods, where a pod's
        DELETE queued for ~90 s, 70% of the trajectories became policy_error finalize_failed: "TimeoutError")."""
        args = (type(exc), exc, exc.__traceback__) if exc is not None else (None, None, None)
        returning = asyncio.ensure_future(asyncio.wait_for(lease.__aexit__(*args), self.config.teardown_timeout_s))
        cancelled = False
        while not returning.done():
            try:
                await asyncio.wait([returning])  # returns when it is done, whatever its outcome
            except asyncio.CancelledError:
                cancelled = True  # ours: wait() does not raise the return's own cancellation
        if not returning.cancelled() and (err := returning.exception()) is not None and err is not exc:
            late = isinstance(err, TimeoutError)
            log.warning("returning a sandbox lease %s (the verdict stands; the pool goes on destroying it): %s",
                        f"took over teardown_timeout_s={self.config.teardown_timeout_s:g}s" if late else "failed",
                        f"{type(err).__name__}: {err}")
        if cancelled and exc is None:
            raise asyncio.CancelledError

    def _safe_record(self, run: _Attempt, group_id: str, k: int, attempt: int, step: int | None) -> Trajectory:
        """The record of this attempt; if building it fails (a bug), an infra_error record that says why."""
        try:
            return self._record(run, group_id, k, attempt, step)
        except Exception as exc:  # noqa: BLE001
            log.error("building the record of trajectory %s failed: %s", run.traj_id, exc)
            run.state = TrajectoryState(prompt_ids=list(run.state.prompt_ids) if run.state else [], messages=[])
            run.verdict = Verdict(Status.infra_error, "record_failed", f"{type(exc).__name__}: {exc}\n"
                                  f"{traceback.format_exc(limit=4)}")
            run.tests = run.solution = None
            return self._record(run, group_id, k, attempt, step)

    def _record(self, run: _Attempt, group_id: str, k: int, attempt: int, step: int | None) -> Trajectory:
        state = run.state or TrajectoryState(prompt_ids=[], messages=[])
        verdict, tests = run.verdict, run.tests
        if verdict is not None:
            state.status = verdict.status
            if verdict.status is Status.policy_error:
                tests = self.rollout.env.failed_report(run.task, verdict.message)
        infra = state.status is Status.infra_error
        return Trajectory(
            id=run.traj_id, group_id=group_id, task_id=run.task.id, env=self.rollout.env.name, status=state.status,
            sample_index=k, attempt=attempt, step=step, prompt_ids=state.prompt_ids,
            completion_ids=state.completion_ids, logprobs=state.logprobs, env_mask=state.env_mask,
            turns=state.turns, tests=None if infra else tests,
            error=verdict.message if verdict else None, error_kind=verdict.kind if verdict else None,
            solution=run.solution, drift_count=sum(t.prefix_drift is True for t in state.turns), timing=run.timing,
            drift_check_error=run.drift_error,
            meta={**self.meta, "group_size": self.config.group_size},
        )

    def _account(self, traj: Trajectory) -> None:
        p = self.progress
        p.trajectories_done += 1
        p.turns += len(traj.turns)
        p.tool_calls += traj.num_tool_calls
        p.tokens += traj.num_model_tokens
        p.infra_errors += traj.status is Status.infra_error
        p.policy_errors += traj.status is Status.policy_error
        p.drift_check_errors += traj.drift_check_error is not None
        self.guard.add(traj)
        if self._on_trajectory is not None:
            self._on_trajectory(traj)


def _check_submit(task: Any, group_id: Any, step: Any) -> None:
    """`submit()`'s arguments, refused with what to pass instead (never a late error inside the group)."""
    if not isinstance(task, Task):
        raise TypeError(f"submit(task=...) takes an agentrl Task, got {type(task).__name__}")
    if group_id is not None and (not isinstance(group_id, str) or not group_id.strip()):
        raise ValueError(f"submit(group_id={group_id!r}): pass a non-empty string, or None to number the group "
                         "per (task, step)")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        raise ValueError(f"submit(step={step!r}): pass a step number >= 0, or None outside training")


def _resources_separated(sandbox: Any) -> bool:
    """The agent's memory / pids / CPU are not the commands' (its last /health said `resources_separated`; a sandbox
    handle that does not say is not separated: every death is then the policy's)."""
    return getattr(sandbox, "resources_separated", False) is True


async def _answers(sandbox: Any) -> bool:
    """A health probe of a sandbox a stage found dead: True when its agent answers (never raises)."""
    try:
        return bool(await _bounded(DEATH_CAUSE_TIMEOUT_S, sandbox.health()))
    except Exception as err:  # noqa: BLE001 - no answer is no answer
        log.warning("sandbox %s: health probe after a failure: %s", sandbox, err)
        return False


async def _drift_result(task: asyncio.Task[str | None]) -> str | None:
    """The deferred drift check's error (None when it succeeded); a bug in it is its error, never the record's."""
    try:
        return await task
    except asyncio.CancelledError:
        task.cancel()
        raise
    except Exception as exc:  # noqa: BLE001 - monitoring only
        return f"{type(exc).__name__}: {exc}"


class _StageDeadline(TimeoutError):
    """A stage's own deadline fired (not a timeout raised by something inside the stage)."""


async def _bounded(seconds: float, awaitable: Awaitable[T]) -> T:
    """`awaitable` under a Deadline (TimeoutError on expiry): used for the death-cause facts a verdict rests on."""
    async with Deadline(seconds):
        return await awaitable


async def _within(seconds: float, awaitable: Awaitable[T], field_name: str) -> T:
    """Await `awaitable` under a deadline of its own; on expiry raise _StageDeadline naming the config field."""
    cm = Deadline(seconds)  # a stall of the runner's own loop is not counted against the stage
    try:
        async with cm:
            return await awaitable
    except TimeoutError as exc:
        if cm.expired():
            raise _StageDeadline(f"{field_name}={seconds:g}s expired") from exc
        raise
