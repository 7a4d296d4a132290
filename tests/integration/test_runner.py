"""The runner end to end: real bubblewrap sandboxes, the real code_tests env, the real chat template, and either a
scripted model (exact control of replies) or a real tiny random model (real generations).

Checks the token-in/token-out invariants: stored ids and logprobs are exactly the engine's, env_mask boundaries
match the turn spans, tool tokens are the chat template's suffix of the observation, the trajectory ends on the
model's end-of-turn token unless truncated; and the status/budget/infra rules.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from agentrl.envs import get_env
from agentrl.runner import Budgets, Rollout, Scheduler, SchedulerConfig
from agentrl.runner import rollout as rollout_mod
from agentrl.sandbox import SandboxPool, SandboxSpec
from agentrl.testing.scripted import ScriptedEngine
from agentrl.tools.parsers import ParseOutcome
from agentrl.tools.render import ChatRenderer
from agentrl.types import Generation, Message, SamplingParams, Status, ToolCall, Trajectory


class RecordingEngine:
    """Wraps an engine and keeps every Generation it returned, per session, in order."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.returned: dict[str, list[Generation]] = {}
        self.inputs: dict[str, list[list[int]]] = {}

    def __getattr__(self, item: str) -> Any:
        return getattr(self.inner, item)

    async def generate(self, input_ids: list[int], sampling: SamplingParams, *, session_id: str) -> Generation:
        gen = await self.inner.generate(input_ids, sampling, session_id=session_id)
        self.returned.setdefault(session_id, []).append(gen)
        self.inputs.setdefault(session_id, []).append(list(input_ids))
        return gen


def _pool(**kw: Any) -> SandboxPool:
    return SandboxPool(backend="local", spec=SandboxSpec(default_timeout_s=10), warm=kw.pop("warm", 1),
                       max_sandboxes=kw.pop("max_sandboxes", 4), run_id=uuid.uuid4().hex[:8], **kw)


def _scheduler(env: Any, engine: Any, tok: Any, pool: SandboxPool, *, max_turns: int = 3, max_new: int = 256,
               max_total: int = 2048, window: int = 4096, group_size: int = 1, **cfg: Any) -> Scheduler:
    rollout = Rollout(env=env, engine=engine, renderer=ChatRenderer(tok),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=max_new,
                                              stop_token_ids=[tok.eos_token_id]),
                      budgets=Budgets(max_turns=max_turns, max_completion_tokens=max_total, context_window=window))
    return Scheduler(rollout, pool, SchedulerConfig(group_size=group_size, **cfg))


def _assert_tito(traj: Trajectory, gens: list[Generation], renderer: ChatRenderer, inputs: list[list[int]]) -> None:
    """The token invariants of the Trajectory contract (docs/architecture.md), checked against what the engine
    actually returned."""
    n = len(traj.completion_ids)
    assert len(traj.logprobs) == n and len(traj.env_mask) == n
    assert len(traj.turns) == len(gens)
    pos = 0
    for turn, gen, inp in zip(traj.turns, gens, inputs):
        assert inp == traj.prompt_ids + traj.completion_ids[:pos], "engine input is not the exact context so far"
        assert turn.start == pos
        span = slice(turn.start, turn.start + turn.model_len)
        assert traj.completion_ids[span] == gen.output_ids
        assert traj.logprobs[span] == gen.logprobs
        assert traj.env_mask[span] == [1] * turn.model_len
        env_span = slice(span.stop, span.stop + turn.env_len)
        assert traj.env_mask[env_span] == [0] * turn.env_len
        assert traj.logprobs[env_span] == [0.0] * turn.env_len
        if turn.env_len:
            obs = [Message(role="user", content=turn.observation)]
            assert traj.completion_ids[env_span] == renderer.suffix_ids(obs)
        pos = env_span.stop
    assert pos == n
    if traj.status not in (Status.truncated, Status.context_exhausted):
        assert traj.completion_ids[-1] in renderer.end_of_turn_ids
    assert traj.turns[-1].env_len == 0, "a trajectory never ends on tool tokens"


@pytest.fixture(scope="module")
def env() -> Any:
    return get_env("code_tests", source="easy")


@pytest.fixture(scope="module")
def task(env: Any) -> Any:
    return next(iter(env.tasks()))


def _code(src: str) -> str:
    return f"Here is my solution.\n```python\n{src}\n```"


async def test_correct_solution_two_turns(env: Any, task: Any, smollm2_tokenizer: Any) -> None:
    engine = RecordingEngine(ScriptedEngine(smollm2_tokenizer, [_code(env.reference_solution(task)), "Done."]))
    async with _pool() as pool:
        traj = await _scheduler(env, engine, smollm2_tokenizer, pool).run_one(task, group_id="g", sample_index=0)
    assert traj.status is Status.ok, traj.error
    assert len(traj.turns) == 2 and traj.num_tool_calls == 1
    assert traj.turns[0].tool_results[0].exit_code == 0
    assert traj.reward == 1.0 and traj.tests is not None and traj.tests.passed == traj.tests.total >= 3
    assert traj.solution and "def " in traj.solution
    _assert_tito(traj, engine.returned[traj.id], ChatRenderer(smollm2_tokenizer), engine.inputs[traj.id])
    assert traj.drift_count == 0


async def test_wrong_solution_scores_below_one(env: Any, task: Any, smollm2_tokenizer: Any) -> None:
    entry = task.data["entry_point"]
    wrong = f"def {entry}(*args, **kwargs):\n    return None"
    engine = ScriptedEngine(smollm2_tokenizer, [_code(wrong), "Done."])
    async with _pool() as pool:
        traj = await _scheduler(env, engine, smollm2_tokenizer, pool).run_one(task, group_id="g", sample_index=0)
    assert traj.status is Status.ok and traj.reward is not None and traj.reward < 1.0


async def test_max_turns_ends_on_model_token(env: Any, task: Any, smollm2_tokenizer: Any) -> None:
    engine = RecordingEngine(ScriptedEngine(smollm2_tokenizer, [_code("print('again')")]))
    async with _pool() as pool:
        traj = await _scheduler(env, engine, smollm2_tokenizer, pool, max_turns=3).run_one(
            task, group_id="g", sample_index=0)
    assert traj.status is Status.max_turns and len(traj.turns) == 3
    assert all(t.tool_results for t in traj.turns), "the last turn's tool call still runs"
    _assert_tito(traj, engine.returned[traj.id], ChatRenderer(smollm2_tokenizer), engine.inputs[traj.id])


async def test_budgets_truncate_and_clamp(env: Any, task: Any, smollm2_tokenizer: Any) -> None:
    long_reply = _code("x = 1\n" * 200)
    engine = RecordingEngine(ScriptedEngine(smollm2_tokenizer, [long_reply]))
    async with _pool() as pool:
        per_turn = await _scheduler(env, engine, smollm2_tokenizer, pool, max_new=32).run_one(
            task, group_id="g", sample_index=0)
        total = await _scheduler(env, engine, smollm2_tokenizer, pool, max_new=4096, max_total=100).run_one(
            task, group_id="g", sample_index=1)
        window = await _scheduler(env, engine, smollm2_tokenizer, pool, max_new=4096,
                                  window=len(per_turn.prompt_ids) + 50).run_one(task, group_id="g", sample_index=2)
    assert per_turn.status is Status.truncated and per_turn.turns[0].finish_reason == "length"
    assert len(per_turn.completion_ids) == 32
    assert total.status is Status.truncated and len(total.completion_ids) == 100
    assert window.status is Status.context_exhausted and len(window.completion_ids) == 50
    for t in (per_turn, total, window):
        assert t.reward is not None  # a truncated policy is scored on what it left, not an infra error


async def test_malformed_hermes_call_is_an_observation(smollm2_tokenizer: Any) -> None:
    env = get_env("code_tests", source="easy", action_format="hermes")
    task = next(iter(env.tasks()))
    replies = ['<tool_call>{"name": "run_python", "arguments": {"code": 1</tool_call>',
               '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>', "I give up."]
    engine = ScriptedEngine(smollm2_tokenizer, replies)
    async with _pool() as pool:
        traj = await _scheduler(env, engine, smollm2_tokenizer, pool, max_turns=4).run_one(
            task, group_id="g", sample_index=0)
    assert traj.status is Status.ok and len(traj.turns) == 3
    assert traj.turns[0].parse_errors and traj.turns[1].parse_errors
    assert "error" in traj.turns[0].observation.lower()
    assert traj.num_tool_errors >= 2


async def test_wall_time_budget(env: Any, task: Any, smollm2_tokenizer: Any) -> None:
    engine = ScriptedEngine(smollm2_tokenizer, [_code("import time\ntime.sleep(5)")])
    async with _pool() as pool:
        traj = await _scheduler(env, engine, smollm2_tokenizer, pool, trajectory_timeout_s=1.5).run_one(
            task, group_id="g", sample_index=0)
    assert traj.status is Status.timeout and traj.reward is not None


async def test_groups_stream_complete(env: Any, smollm2_tokenizer: Any) -> None:
    tasks = list(env.tasks())[:3]
    engine = ScriptedEngine(smollm2_tokenizer, ["No code needed."])
    async with _pool(max_sandboxes=4) as pool:
        sched = _scheduler(env, engine, smollm2_tokenizer, pool, group_size=3, max_trajectories=4)
        groups = [g async for g in sched.run(tasks)]
    assert sorted(g[0].task_id for g in groups) == sorted(t.id for t in tasks)
    for g in groups:
        assert [t.sample_index for t in g] == [0, 1, 2] and len({t.group_id for t in g}) == 1
    assert sched.progress.trajectories_done == 9


async def test_real_tiny_model_multi_turn_tito(env: Any, task: Any, eos_prone_model: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Real generations (random tiny model): every reply is turned into a tool call by a patched parser so the
    trajectory has several turns with tool tokens; everything else is real."""
    from transformers import AutoTokenizer

    from agentrl.engine.local import LocalEngine

    def every_reply_is_a_call(text: str, fmt: str, tools: Any, turn: int = 0) -> ParseOutcome:
        return ParseOutcome(calls=[ToolCall(id=f"c{turn}", name="run_python", arguments={"code": "print(6*7)"})],
                            errors=[])

    monkeypatch.setattr(rollout_mod, "parse_tool_calls", every_reply_is_a_call)
    tok = AutoTokenizer.from_pretrained(eos_prone_model)
    engine = RecordingEngine(LocalEngine(eos_prone_model, seed=0))
    try:
        async with _pool(max_sandboxes=4) as pool:
            sched = _scheduler(env, engine, tok, pool, max_turns=3, max_new=24, group_size=4, max_trajectories=4)
            trajs = [t for g in [g async for g in sched.run([task])] for t in g]
    finally:
        await engine.close()
    renderer = ChatRenderer(tok)
    for traj in trajs:
        gens = engine.returned[traj.id]
        _assert_tito(traj, gens, renderer, engine.inputs[traj.id])
    multi = [t for t in trajs if sum(1 for turn in t.turns if turn.env_len) >= 1]
    assert len(multi) >= 2, [t.status for t in trajs]
    assert all("42" in turn.observation for t in multi for turn in t.turns if turn.env_len)


async def test_code_completed_before_a_length_cut_still_runs(env: Any, task: Any, smollm2_tokenizer: Any) -> None:
    """A turn cut by max_new_tokens after a complete code block: the block runs (the solution counts), the
    episode ends truncated, and no observation follows the cut turn."""
    reply = _code(env.reference_solution(task)) + "\nNow let me explain this in great detail. " * 40
    engine = ScriptedEngine(smollm2_tokenizer, [reply])
    n_code = len(smollm2_tokenizer.encode(_code(env.reference_solution(task)), add_special_tokens=False))
    async with _pool() as pool:
        traj = await _scheduler(env, engine, smollm2_tokenizer, pool, max_new=n_code + 20).run_one(
            task, group_id="g", sample_index=0)
    assert traj.status is Status.truncated and len(traj.turns) == 1
    assert traj.turns[0].tool_results and traj.turns[0].env_len == 0
    assert traj.reward == 1.0
