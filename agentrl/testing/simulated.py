"""Simulated edges for scale tests and benchmarks: an engine, a sandbox pool and an env whose costs are modelled.

Test utilities, not user-facing backends. Everything between them (runner, scheduler, store, pipeline, renderer)
runs for real; only the model's compute and the sandbox's command execution are replaced by `asyncio.sleep`s drawn
from seeded distributions:

    SimulatedEngine   token in, token out. Replies are real token ids (a few texts tokenized once with the real
                      tokenizer, chosen by a hash of the input, so a run is reproducible); time per call =
                      prefill of the uncached tokens + output tokens x decode step, where the decode step grows with
                      the number of generate calls in flight (`decode_s * (1 + active / batch_knee)`); a per-session
                      prefix cache makes a turn prefill only its new tokens, with LocalEngine's rule (the previous
                      call's input + output except its last sampled token; reuse = the common prefix, leaving at least
                      one input token to compute; cleared by a weight update). With
                      `prefill_tokens_per_s` set, prefills share one engine-wide throughput, first come first
                      served (a chunked-prefill engine): 2,000 prompts arriving together finish their prefills one
                      after another instead of all at the same instant. Weight
                      versions and updates behave like an engine's (`update_weights` tags later generations).
    SimulatedPool     `lease()` gives a SimulatedSandbox; bounded by `max_sandboxes`; counts leases, releases and
                      deaths. `death_cause()` reports killed sandboxes as "deleted" (an external cause), so the
                      scheduler's attribution makes them infra errors and retries them.
    SimulatedSandbox  exec latency is lognormal (median `exec_p50_s`, sigma 1.5: p99/p50 ~ 33x), seeded per
                      sandbox; with probability `death_p` a command kills the sandbox: SandboxDiedError with the facts
                      a real local sandbox removed from outside during a command gives (in flight, POST /exec,
                      cause "deleted"; tests/integration/test_simulated_pool_contract.py).
    SimulatedEnv      codeblock tasks: each ```python block runs once in the sandbox; finalize runs one command
                      and passes when the last block printed the task's number.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from agentrl.envs.base import Env, Task
from agentrl.errors import SandboxDiedError
from agentrl.types import (
    FinishReason,
    Generation,
    SamplingParams,
    TestOutcome,
    TestReport,
    ToolCall,
    ToolResult,
    ToolSpec,
)

RUN = ToolSpec(name="run_python", description="Run Python code; returns its output.",
               parameters={"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]})
LOGNORMAL_SIGMA = 1.5  # p99 / p50 = exp(2.326 * 1.5) ~ 33


def lognormal_s(rng: random.Random, p50_s: float, sigma: float = LOGNORMAL_SIGMA) -> float:
    """One heavy-tailed latency with median `p50_s`."""
    return p50_s * math.exp(rng.gauss(0.0, sigma))


@dataclass
class SimulatedEngine:
    """See the module docstring. `replies`: texts the model may produce (each ends on end-of-turn)."""

    tokenizer: Any
    replies: list[str]
    decode_s: float = 0.002  # one decode step with an empty batch
    prefill_s: float = 0.00005  # per uncached input token
    batch_knee: float = 256.0  # the decode step doubles at this many calls in flight
    context_window: int = 8192
    prefill_tokens_per_s: float | None = None  # None: each prefill alone at prefill_s per token (no queue)
    name: ClassVar[str] = "simulated"
    weight_version: int = 0
    active: int = 0
    calls: int = 0
    cached_tokens: int = 0
    input_tokens: int = 0
    _reply_ids: list[list[int]] = field(default_factory=list)
    _cache: dict[str, list[int]] = field(default_factory=dict)  # session -> ids whose keys/values are kept
    _prefill_free_at: float = 0.0  # loop time at which the shared prefill queue is empty

    def __post_init__(self) -> None:
        eos = self.tokenizer.eos_token_id
        self.eos_token_ids = [eos]
        self._reply_ids = [list(self.tokenizer.encode(r, add_special_tokens=False)) + [eos] for r in self.replies]

    def step_s(self) -> float:
        return self.decode_s * (1.0 + self.active / self.batch_knee)

    async def generate(self, input_ids: list[int], sampling: SamplingParams, *, session_id: str) -> Generation:
        version = self.weight_version
        pick = hash((len(input_ids), tuple(input_ids[-16:]), sampling.seed)) % len(self._reply_ids)
        ids = self._reply_ids[pick]
        finish: FinishReason = "stop"
        if len(ids) > sampling.max_new_tokens:
            ids, finish = ids[: sampling.max_new_tokens], "length"
        cached = _reusable(self._cache.pop(session_id, None), input_ids)
        new_tokens = len(input_ids) - cached
        prefill_s = new_tokens * self.prefill_s
        if self.prefill_tokens_per_s:  # queue behind the prefills already admitted
            now = asyncio.get_running_loop().time()
            self._prefill_free_at = max(now, self._prefill_free_at) + new_tokens / self.prefill_tokens_per_s
            prefill_s = self._prefill_free_at - now
        self.active += 1
        self.calls += 1
        try:
            await asyncio.sleep(prefill_s + len(ids) * self.step_s())
        finally:
            self.active -= 1
        self._cache[session_id] = list(input_ids) + ids[:-1]  # the last sampled token was never fed back
        self.cached_tokens += cached
        self.input_tokens += len(input_ids)
        return Generation(output_ids=list(ids), logprobs=[-0.5] * len(ids), finish_reason=finish,
                          weight_version=version, cached_tokens=cached)

    def end_session(self, session_id: str) -> None:
        self._cache.pop(session_id, None)

    def info(self) -> dict[str, Any]:
        return {"engine": self.name, "model": "simulated", "decode_s": self.decode_s, "batch_knee": self.batch_knee}

    async def update_weights(self, source: Any, version: int) -> None:
        self.weight_version = version
        self._cache.clear()

    async def health(self) -> bool:
        return True

    async def close(self) -> None:
        return None


def _reusable(stored: list[int] | None, input_ids: list[int]) -> int:
    """Leading input tokens a stored prefix covers (LocalEngine's PrefixCache.take): the common prefix, at most all
    but the last input token (its logits give the first new token)."""
    if not stored:
        return 0
    limit = min(len(stored), len(input_ids) - 1)
    if stored[:limit] == input_ids[:limit]:  # the usual case (a turn extends the last one), compared in C
        return max(limit, 0)
    return next(i for i in range(limit) if stored[i] != input_ids[i])


@dataclass
class SimulatedSandbox:
    index: int
    pool: SimulatedPool
    rng: random.Random
    files: dict[str, str] = field(default_factory=dict)
    dead: bool = False
    uid_separated: bool = True
    resources_separated: bool = True

    async def exec(self, cmd: str, timeout: float | None = None) -> Any:
        from agentrl.sandbox.base import ExecResult

        if self.dead:  # dead before the request: nothing was in flight (a real agent refuses the connection)
            raise SandboxDiedError(f"simulated sandbox {self.index} is gone", request="POST /exec")
        dt = lognormal_s(self.rng, self.pool.exec_p50_s)
        if timeout is not None and dt > timeout:
            await asyncio.sleep(timeout)
            return ExecResult(exit_code=None, stdout="", stderr="", timed_out=True, duration_s=timeout)
        await asyncio.sleep(dt)
        self.pool.execs += 1
        if self.rng.random() < self.pool.death_p:
            self.dead = True
            self.pool.deaths += 1
            # removed from outside during the command: what a real agent's connection reports (see the contract test)
            raise SandboxDiedError(f"simulated sandbox {self.index} died", in_flight=True, request="POST /exec")
        return ExecResult(exit_code=0, stdout=self.files.get("out", ""), stderr="", duration_s=dt)

    async def write_file(self, path: str, content: str) -> None:
        if self.dead:
            raise SandboxDiedError(f"simulated sandbox {self.index} is gone")
        self.files[path] = content

    async def read_file(self, path: str) -> str:
        return self.files.get(path, "")

    async def kill_all(self) -> None:
        return None


@dataclass
class SimulatedPool:
    """See the module docstring. Use as an async context manager like SandboxPool."""

    exec_p50_s: float = 0.05
    death_p: float = 0.0
    max_sandboxes: int = 4096
    seed: int = 0
    leased: int = 0
    released: int = 0
    deaths: int = 0
    execs: int = 0
    peak: int = 0
    _slots: asyncio.Semaphore | None = None

    async def __aenter__(self) -> SimulatedPool:
        self._slots = asyncio.Semaphore(self.max_sandboxes)
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    @property
    def alive(self) -> int:
        return self.leased - self.released

    @contextlib.asynccontextmanager
    async def _lease(self) -> AsyncIterator[SimulatedSandbox]:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_sandboxes)
        async with self._slots:
            self.leased += 1
            self.peak = max(self.peak, self.alive)
            try:
                yield SimulatedSandbox(self.leased, self, random.Random(self.seed * 1_000_003 + self.leased))
            finally:
                self.released += 1

    def lease(self) -> Any:
        return self._lease()

    async def death_cause(self, sandbox: SimulatedSandbox) -> str | None:
        return "deleted" if sandbox.dead else None


class SimulatedEnv(Env):
    """Tasks "print the number N"; see the module docstring."""

    name: ClassVar[str] = "simulated"
    action_format = "codeblock"
    tools: list[ToolSpec] = [RUN]
    system_prompt = "Answer with one ```python code block."

    def __init__(self, tasks: int = 16, **options: Any) -> None:
        super().__init__(tasks=tasks, **options)
        self.n_tasks = int(tasks)

    def tasks(self) -> list[Task]:
        return [Task(id=f"sim-{i:04d}", prompt=f"Print the number {i % 100}.", data={"number": i % 100})
                for i in range(self.n_tasks)]

    async def call_tool(self, sandbox: Any, call: ToolCall, *, task: Task) -> ToolResult:
        code = str(call.arguments.get("code", ""))
        sandbox.files["out"] = code.removeprefix("print(").removesuffix(")").strip()
        r = await sandbox.exec("python3 answer.py", timeout=30)
        return ToolResult(call_id=call.id, name=call.name, output=f"exit {r.exit_code}\n{r.stdout[:200]}",
                          exit_code=r.exit_code, stdout=r.stdout[:200], duration_s=r.duration_s,
                          timed_out=r.timed_out)

    async def finalize(self, sandbox: Any, task: Task) -> TestReport:
        r = await sandbox.exec("python3 answer.py", timeout=30)
        right = r.stdout.strip() == str(task.data["number"])
        return TestReport(passed=int(right), total=1, outcomes=[TestOutcome(name="prints_number", passed=right)])


def number_replies(n: int = 12, *, final_every: int = 0) -> list[str]:
    """Reply texts for SimulatedEngine: code blocks printing 0..n-1 (+ a plain answer that ends the episode
    when `final_every` > 0)."""
    out = [f"```python\nprint({i})\n```" for i in range(n)]
    return out + (["Done."] if final_every else [])
