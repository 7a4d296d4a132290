"""The deferred drift check (agentrl.tools.drift): the same per-turn answers as the inline DriftCheck, computed after
the last turn in a worker process; a dead worker never fails or loses a trajectory; `inline` keeps the old path."""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest

from agentrl.runner import Budgets, Rollout, Scheduler, SchedulerConfig
from agentrl.store import TrajectoryStore, read_trajectories, summarize
from agentrl.testing.simulated import SimulatedEngine, SimulatedEnv, SimulatedPool, number_replies
from agentrl.tools.drift import DeferredDrift, DriftCheckError
from agentrl.tools.render import ChatRenderer, drift_answers, message_dicts
from agentrl.envs.base import Task
from agentrl.types import Message, SamplingParams, Status, ToolCall, ToolResult

# renders any message containing SECRET as REDACTED: text drift from the first turn whose observation has it
REDACTING_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}"
    "{% if 'SECRET' in m['content'] %}{{ 'REDACTED' }}{% else %}{{ m['content'] }}{% endif %}{{ '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _redacting(tok: Any) -> Any:
    t = copy.deepcopy(tok)
    t.chat_template = REDACTING_TEMPLATE
    return t


def _conversation(r: ChatRenderer, tok: Any, *, odd_turn: int | None, secret_turn: int | None, turns: int = 5
                  ) -> tuple[list[Message], list[int], list[tuple[int, int, int]], list[tuple[bool, bool]]]:
    """A conversation built turn by turn; returns it, the deferred marks and the inline DriftCheck's answers."""
    check = r.drift_check()
    msgs = [Message(role="system", content="You write Python."), Message(role="user", content="Print 3.")]
    ids = r.prompt_ids(msgs)
    marks, inline = [], []
    for turn in range(turns):
        reply = f"```python\nprint('hello {turn}')\n```"
        model_ids = list(tok.encode(reply, add_special_tokens=False))
        if turn == odd_turn:  # a non-canonical tokenization: re-tokenizing the text would not give these ids
            reply = "hello" + reply
            model_ids = [tok.convert_tokens_to_ids(ch) for ch in "hello"] + model_ids
        out = f"exit 0\nhello {turn} ü ✓\n" + (" the SECRET" if turn == secret_turn else "")
        obs = [Message(role="user", content=out)]
        ids = ids + model_ids + [tok.eos_token_id] + r.suffix_ids(obs)
        msgs = msgs + [Message(role="assistant", content=reply)] + obs
        marks.append((turn, len(msgs), len(ids)))
        inline.append(check.check(msgs, ids))
    return msgs, ids, marks, inline


@pytest.mark.parametrize(("template", "odd_turn", "secret_turn", "want"), [
    (None, None, None, [(False, False)] * 5),
    (None, 2, None, [(False, False)] * 2 + [(False, True)] * 3),  # retokenize mismatch from turn 2 on
    ("redact", None, 1, [(False, False)] + [(True, True)] * 4),  # template drift from turn 1 on
    ("redact", 3, 1, [(False, False)] + [(True, True)] * 4),
])
def test_deferred_answers_equal_inline_answers(smollm2_tokenizer, template, odd_turn, secret_turn,  # type: ignore[no-untyped-def]
                                               want) -> None:
    tok = _redacting(smollm2_tokenizer) if template else smollm2_tokenizer
    r = ChatRenderer(tok)
    msgs, ids, marks, inline = _conversation(r, tok, odd_turn=odd_turn, secret_turn=secret_turn)
    assert inline == want
    assert drift_answers(ChatRenderer(tok), message_dicts(msgs), ids, marks) == inline
    # every turn's full (non-incremental) check agrees as well
    assert [r.check_drift(msgs[:m], ids[:n]) for _, m, n in marks] == inline


async def test_worker_process_gives_the_inline_answers(smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Through a real spawned worker (pickled tokenizer with a custom template): drift and mismatch conversations."""
    tok = _redacting(smollm2_tokenizer)
    r = ChatRenderer(tok)
    with DeferredDrift(r) as worker:
        for odd, secret in ((None, None), (2, None), (None, 1)):
            msgs, ids, marks, inline = _conversation(r, tok, odd_turn=odd, secret_turn=secret)
            assert await worker.answers(msgs, ids, marks) == inline, (odd, secret)
        assert worker.stats == {"checked": 3, "errors": 0, "restarts": 0}
        assert await worker.worker_cpu_s() > 0


class _Bomb:
    """Unpickling it kills the process that unpickles it (the worker, while it starts)."""

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return os._exit, (3,)


def _crashing(worker: DeferredDrift) -> DeferredDrift:
    worker._initargs = (_Bomb(),)  # type: ignore[assignment]
    return worker


async def test_a_dead_worker_raises_drift_check_error(smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    r = ChatRenderer(smollm2_tokenizer)
    msgs, ids, marks, _ = _conversation(r, smollm2_tokenizer, odd_turn=None, secret_turn=None, turns=2)
    with _crashing(DeferredDrift(r)) as worker:
        with pytest.raises(DriftCheckError, match="died"):
            await worker.answers(msgs, ids, marks)
        assert worker.stats["errors"] == 1 and worker.stats["restarts"] == 2


class SecretEnv(SimulatedEnv):
    """The simulated env whose second tool output contains SECRET (so the redacting template drifts there)."""

    async def call_tool(self, sandbox: Any, call: ToolCall, *, task: Task) -> ToolResult:
        result = await super().call_tool(sandbox, call, task=task)
        self.calls = getattr(self, "calls", 0) + 1
        return result.model_copy(update={"output": result.output + " SECRET"}) if self.calls == 2 else result


def _scheduler(tok: Any, mode: str, worker: DeferredDrift | None) -> Scheduler:
    env = SecretEnv(tasks=1)
    rollout = Rollout(env=env, engine=SimulatedEngine(tok, number_replies(), decode_s=0.0), renderer=ChatRenderer(tok),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=32, seed=1),
                      budgets=Budgets(max_turns=4, max_completion_tokens=10_000, context_window=10_000),
                      drift_check=mode, drift_worker=worker)
    return Scheduler(rollout, SimulatedPool(exec_p50_s=0.001), SchedulerConfig(group_size=1, max_trajectories=1))


async def _one(sched: Scheduler) -> Any:
    return await sched.run_one(sched.rollout.env.tasks()[0], group_id="g", sample_index=0)


async def test_scheduler_modes_record_the_same_flags_and_a_crash_leaves_them_unset(smollm2_tokenizer,  # type: ignore[no-untyped-def]
                                                                                   tmp_path) -> None:
    tok = _redacting(smollm2_tokenizer)
    inline = await _one(_scheduler(tok, "inline", None))
    flags = [(t.prefix_drift, t.retokenize_mismatch) for t in inline.turns]
    assert flags == [(False, False), (True, True), (True, True), (False, False)]  # the last turn has no observation
    assert inline.drift_count == 2 and inline.drift_check_error is None

    with DeferredDrift(ChatRenderer(tok)) as worker:
        deferred = await _one(_scheduler(tok, "deferred", worker))
    assert [(t.prefix_drift, t.retokenize_mismatch) for t in deferred.turns[:3]] == flags[:3]
    assert deferred.drift_count == 2 and deferred.drift_check_error is None
    assert deferred.completion_ids == inline.completion_ids and deferred.reward == inline.reward

    off = await _one(_scheduler(tok, "off", None))
    assert [t.prefix_drift for t in off.turns[:3]] == [None] * 3 and off.drift_count == 0

    with _crashing(DeferredDrift(ChatRenderer(tok))) as worker:
        crashed = await _one(_scheduler(tok, "deferred", worker))
    assert crashed.status is inline.status is Status.max_turns and crashed.error is None
    assert crashed.reward == inline.reward and crashed.completion_ids == inline.completion_ids
    assert [(t.prefix_drift, t.retokenize_mismatch) for t in crashed.turns[:3]] == [(None, None)] * 3
    assert crashed.drift_count == 0 and "died" in (crashed.drift_check_error or "")
    with TrajectoryStore(tmp_path / "t.jsonl") as store:
        store.append_group([crashed])
    back = read_trajectories(tmp_path / "t.jsonl")
    assert back[0].drift_check_error == crashed.drift_check_error and back[0].turns[0].prefix_drift is None
    assert summarize(back)["drift_check_errors"] == 1.0


def test_deferred_mode_needs_a_worker_and_modes_are_checked(smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="drift_worker"):
        _scheduler(smollm2_tokenizer, "deferred", None)
    with pytest.raises(ValueError, match="drift_check='sometimes'"):
        _scheduler(smollm2_tokenizer, "sometimes", None)


async def test_progress_counts_drift_check_errors(smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    tok = smollm2_tokenizer
    with _crashing(DeferredDrift(ChatRenderer(tok), max_pending=1)) as worker:
        sched = _scheduler(tok, "deferred", worker)
        traj = await _one(sched)
    assert traj.drift_check_error is not None and sched.progress.drift_check_errors == 1
    assert sched.progress.infra_errors == 0 and traj.status is not Status.infra_error


class _Stall:
    """Unpickling it stalls the worker's start for a few seconds."""

    def __reduce__(self) -> tuple[Any, tuple[float]]:
        import time

        return time.sleep, (4.0,)


async def test_a_stalled_worker_times_out_without_blocking_the_loop(smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    r = ChatRenderer(smollm2_tokenizer)
    msgs, ids, marks, _ = _conversation(r, smollm2_tokenizer, odd_turn=None, secret_turn=None, turns=1)
    worker = DeferredDrift(r, timeout_s=1.0)
    worker._initargs = (_Stall(),)  # type: ignore[assignment]
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    t = asyncio.create_task(ticker())
    try:
        with pytest.raises(DriftCheckError, match="took over 1s"):
            await worker.answers(msgs, ids, marks)
    finally:
        t.cancel()
        worker.close()
    assert ticks >= 10  # the loop kept running while the worker's start stalled
