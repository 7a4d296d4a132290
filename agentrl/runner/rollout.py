"""The N-turn loop of one trajectory. Owns the token bookkeeping and the length budgets; nothing else.

Per turn: generate from the exact ids so far -> keep the sampled ids/logprobs (env_mask 1) -> parse tool calls ->
run them in this trajectory's sandbox -> render the observation with the chat template and append its suffix ids
(env_mask 0, logprob 0.0) -> check for template drift (`drift_check`: inline = on the loop each turn; deferred = only
what each turn's check needs is recorded, and `finish_drift` computes the same answers in a worker process after the
last turn; off = none, the flags stay None). Budgets (docs/architecture.md, Contracts): per-turn max_new_tokens,
per-trajectory completion tokens, the context window (each turn is clamped to what is left and keeps its finish
reason), per-tool-call timeout (`tool_timeout_s` around env.call_tool, also the sandbox's default command timeout) and
per-trajectory wall time (in the scheduler).

Ends on the model's end-of-turn token unless truncated: an observation is appended only if another model turn
will follow it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from agentrl.deadline import Deadline
from agentrl.engine.base import GenerationEngine
from agentrl.envs.base import Env, Task
from agentrl.errors import EngineError, InfraError
from agentrl.runner import integrity
from agentrl.runner.seeds import turn_seed
from agentrl.sandbox.client import Sandbox
from agentrl.tools.drift import DRIFT_MODES, DeferredDrift, DriftCheckError
from agentrl.tools.parsers import parse_tool_calls
from agentrl.tools.render import ChatRenderer, DriftCheck
from agentrl.types import Generation, Message, SamplingParams, Status, ToolCall, ToolResult, Turn

MAX_OBSERVATION_CHARS = 8_000


@dataclass(frozen=True)
class Budgets:
    max_turns: int = 4
    max_completion_tokens: int = 2048
    context_window: int = 4096
    tool_timeout_s: float = 30.0


@dataclass
class TrajectoryState:
    """Mutable per-trajectory accumulators (one instance per attempt)."""

    prompt_ids: list[int]
    messages: list[Message]
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    status: Status = Status.max_turns
    gen_s: float = 0.0
    tools_s: float = 0.0
    drift: DriftCheck | None = None  # incremental per-turn drift check, created on the first observation
    drift_marks: list[tuple[int, int, int]] = field(default_factory=list)  # deferred: (turn, messages, ids) per check
    seed: int | None = None  # deterministic runs: the root of this trajectory's per-turn sampling seeds

    @property
    def context_len(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    def add_model(self, gen: Generation) -> None:
        self.completion_ids += gen.output_ids
        self.logprobs += gen.logprobs
        self.env_mask += [1] * len(gen.output_ids)

    def add_env(self, ids: list[int]) -> None:
        self.completion_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.env_mask += [0] * len(ids)


@dataclass
class Rollout:
    """Everything one trajectory's loop needs; shared by all trajectories of a run."""

    env: Env
    engine: GenerationEngine
    renderer: ChatRenderer
    sampling: SamplingParams
    budgets: Budgets
    drift_check: str = "inline"  # inline | deferred (needs drift_worker) | off
    drift_worker: DeferredDrift | None = None

    def __post_init__(self) -> None:
        if self.drift_check not in DRIFT_MODES:
            raise ValueError(f"drift_check={self.drift_check!r}: use one of {', '.join(DRIFT_MODES)}")
        if self.drift_check == "deferred" and self.drift_worker is None:
            raise ValueError("drift_check='deferred' needs a drift_worker (agentrl.tools.drift.DeferredDrift)")

    def start(self, task: Task, seed: int | None = None) -> TrajectoryState:
        messages = self.env.messages(task)
        return TrajectoryState(prompt_ids=self.renderer.prompt_ids(messages), messages=messages, seed=seed)

    async def run(self, state: TrajectoryState, task: Task, sandbox: Sandbox, session_id: str) -> None:
        """Run turns until the episode ends; records everything into `state`. Raises only InfraError."""
        for index in range(self.budgets.max_turns):
            max_new, limit_status = self._turn_budget(state)
            if max_new <= 0:
                state.status = limit_status
                return
            gen, gen_s = await self._generate(state, max_new, session_id)
            turn = Turn(index=index, start=len(state.completion_ids), model_len=len(gen.output_ids),
                        finish_reason=gen.finish_reason, weight_version=gen.weight_version,
                        cached_tokens=gen.cached_tokens, gen_duration_s=gen_s)
            state.add_model(gen)
            state.turns.append(turn)
            turn.text = self.renderer.decode(self.renderer.strip_end_of_turn(gen.output_ids))
            state.messages.append(Message(role="assistant", content=turn.text))
            parsed = parse_tool_calls(turn.text, self.env.action_format, self.env.tools, turn=index)
            turn.tool_calls, turn.parse_errors = parsed.calls, parsed.errors
            if gen.finish_reason == "length":
                # cut mid-turn: no end-of-turn, so the episode cannot go on; the calls it completed still run
                # (their effects, e.g. a written solution, count) but no observation follows
                turn.parse_errors = []
                await self._run_calls(state, turn, sandbox, task, parsed.calls)
                state.status = limit_status if max_new < self.sampling.max_new_tokens else Status.truncated
                return
            if not parsed.calls and not parsed.errors:
                state.status = Status.ok
                return
            results = await self._run_calls(state, turn, sandbox, task, parsed.calls)
            if any(r.done for r in results):
                state.status = Status.ok
                return
            if index == self.budgets.max_turns - 1:
                break  # tools ran (their effects count), but no observation: the trajectory ends on the model
            if not self._append_observation(state, turn, results, parsed.errors):
                return
        state.status = Status.max_turns

    async def _run_calls(self, state: TrajectoryState, turn: Turn, sandbox: Sandbox, task: Task,
                         calls: list[ToolCall]) -> list[ToolResult]:
        results = await self._call_tools(sandbox, task, calls)
        turn.tool_results = results
        turn.tool_duration_s = sum(r.duration_s for r in results)
        state.tools_s += turn.tool_duration_s
        return results

    def _turn_budget(self, state: TrajectoryState) -> tuple[int, Status]:
        left_total = self.budgets.max_completion_tokens - len(state.completion_ids)
        left_ctx = self.budgets.context_window - state.context_len
        if left_ctx < left_total:
            return min(self.sampling.max_new_tokens, left_ctx), Status.context_exhausted
        return min(self.sampling.max_new_tokens, left_total), Status.truncated

    async def _generate(self, state: TrajectoryState, max_new: int, session_id: str) -> tuple[Generation, float]:
        update: dict[str, int] = {"max_new_tokens": max_new}
        if state.seed is not None and not self.sampling.greedy:
            update["seed"] = turn_seed(state.seed, len(state.turns))
        sampling = self.sampling.model_copy(update=update)
        t0 = time.perf_counter()
        gen = await self.engine.generate(state.prompt_ids + state.completion_ids, sampling, session_id=session_id)
        if gen.finish_reason == "abort":
            raise EngineError("generation was aborted by the engine (weight update or shutdown); retrying")
        dt = time.perf_counter() - t0
        state.gen_s += dt
        return gen, dt

    async def _call_tools(self, sandbox: Sandbox, task: Task, calls: list[ToolCall]) -> list[ToolResult]:
        return [await self._call_tool(sandbox, task, call) for call in calls]

    async def _call_tool(self, sandbox: Sandbox, task: Task, call: ToolCall) -> ToolResult:
        """One env.call_tool under `tool_timeout_s`. A call over it is the policy's: its processes are killed and
        the model is told; a tool that raised is shown to the model; only InfraError propagates."""
        t0 = time.perf_counter()
        deadline = Deadline(self.budgets.tool_timeout_s)  # the runner's own stalls are not the tool's time
        try:
            async with deadline:
                result = await self.env.call_tool(sandbox, call, task=task)
        except InfraError:
            raise
        except TimeoutError:
            if not deadline.expired():
                raise
            await sandbox.kill_all()
            result = ToolResult(call_id=call.id, name=call.name, timed_out=True, error="tool_timeout",
                                output=f"tool error: the call did not finish within {self.budgets.tool_timeout_s:g}s "
                                       f"and its processes were killed")
        except Exception as exc:  # a tool that blew up is the task's problem, shown to the model
            result = ToolResult(call_id=call.id, name=call.name, output=f"tool error: {exc}", error="tool_failed")
        if not result.duration_s:
            result = result.model_copy(update={"duration_s": time.perf_counter() - t0})
        take = getattr(sandbox, "take_observed", None)  # test doubles of the sandbox may lack it
        seen = integrity.from_sandbox(take()) if take is not None else []  # the agent's counts, at this turn
        if seen:
            result = result.model_copy(update={"signals": [*result.signals, *seen]})
        return result

    def _observation(self, results: list[ToolResult], errors: list[str]) -> list[Message]:
        if self.env.action_format == "hermes":
            msgs = [Message(role="tool", content=r.output[:MAX_OBSERVATION_CHARS], tool_call_id=r.call_id,
                            name=r.name) for r in results]
            if errors:
                msgs.append(Message(role="user", content="\n".join(f"error: {e}" for e in errors)))
            return msgs
        texts = [f"error: {e}" for e in errors] + [r.output[:MAX_OBSERVATION_CHARS] for r in results]
        return [Message(role="user", content="\n\n".join(texts))]

    def _append_observation(self, state: TrajectoryState, turn: Turn, results: list[ToolResult],
                            errors: list[str]) -> bool:
        """Append the observation's suffix ids; False (and a final status) when no budget is left for it."""
        observation = self._observation(results, errors)
        suffix = self.renderer.suffix_ids(observation)
        if state.context_len + len(suffix) >= self.budgets.context_window:
            state.status = Status.context_exhausted
            return False
        if len(state.completion_ids) + len(suffix) >= self.budgets.max_completion_tokens:
            state.status = Status.truncated
            return False
        state.add_env(suffix)
        state.messages.extend(observation)
        turn.env_len = len(suffix)
        turn.observation = "\n".join(m.content for m in observation)
        self._check_drift(state, turn)
        return True

    def _check_drift(self, state: TrajectoryState, turn: Turn) -> None:
        if self.drift_check != "inline":  # deferred: answered by finish_drift; off: never (flags stay None)
            turn.prefix_drift = turn.retokenize_mismatch = None
            if self.drift_check == "deferred":
                state.drift_marks.append((turn.index, len(state.messages), state.context_len))
            return
        if state.drift is None:
            state.drift = self.renderer.drift_check()
        text_drift, token_drift = state.drift.check(state.messages, state.prompt_ids + state.completion_ids)
        turn.prefix_drift, turn.retokenize_mismatch = text_drift, token_drift

    async def finish_drift(self, state: TrajectoryState) -> str | None:
        """Deferred mode: fill in the drift flags of the turns checked during the episode, computed off the event
        loop (the same answers the inline check gives). Returns None, or the error that left them unset (None):
        the flags are monitoring only, so a failed check never fails the trajectory. Call after the last turn."""
        if self.drift_worker is None or not state.drift_marks:
            return None
        try:
            answers = await self.drift_worker.answers(state.messages, state.prompt_ids + state.completion_ids,
                                                      state.drift_marks)
        except DriftCheckError as exc:
            return str(exc)
        for (index, _, _), (text_drift, token_drift) in zip(state.drift_marks, answers, strict=True):
            state.turns[index].prefix_drift, state.turns[index].retokenize_mismatch = text_drift, token_drift
        return None
