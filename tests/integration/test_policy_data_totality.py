"""Policy data through the real runner (issue 22): hostile tool-call JSON and outputs must end scored, be stored and
read back, and never stall the loop.

- `test_each_attack_is_scored_and_stored_through_a_real_rollout`: a real `agentrl rollout` (the CLI process, runner,
  scheduler, store, code_tests env in its hermes format, bubblewrap sandboxes) with the model replaced by a scripted
  one behind the SGLang stand-in. The old code: the huge integer raised out of the parser (internal_error), the
  surrogate in a test message made the tokenizer raise (internal_error), storing a surrogate or 300-deep arguments
  raised and the CLI exited 1 with nothing stored; the whitespace fence blocked the loop ~27 s.
- `test_arbitrary_completions_end_scored_and_round_trip`: hypothesis draws replies (text, tool calls with huge
  numbers, deep nesting, lone surrogates, NUL, broken tags) for the in-process runner; every trajectory is scored,
  none hangs, the store reads back exactly what was written.
- `test_adversarial_completions_do_not_stall_the_loop_or_change_other_results`: adversarial trajectories run beside
  normal ones under one loop; the loop's lag stays bounded and the normal trajectories equal a run without them.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sglang_support import contract_validator

from agentrl.engine.standin.sglang import StandIn, StandInServer
from agentrl.envs import get_env
from agentrl.runner import Budgets, LoopLag, Rollout, Scheduler, SchedulerConfig
from agentrl.sandbox import SandboxPool, SandboxSpec
from agentrl.store import LineError, TrajectoryStore, read_trajectories
from agentrl.testing.scripted import ScriptedEngine
from agentrl.tools.render import ChatRenderer
from agentrl.types import SamplingParams, Status, Trajectory

TASK = "easy/add"
CORRECT = "def add(a, b):\n    return a + b"
RAISES_SURROGATE = 'def add(a, b):\n    raise ValueError("\\ud800 \\x00")'  # ASCII source; the message is not
LONG_TURN = 4600  # tokens: a 4,400-digit literal is one token per digit
WINDOW = 20000


def _call(name: str, **arguments: Any) -> str:
    """A hermes tool call as a model writes it: JSON text, non-ASCII written as \\u escapes (lone surrogates too)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _nested(depth: int, leaf: Any = "bottom") -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


ATTACKS: dict[str, list[str]] = {
    "huge_integer": ['<tool_call>{"name": "run_python", "arguments": {"code": "print(1)", "n": 1' + "0" * 4400
                     + "}}</tool_call>"],
    "cubic_whitespace": ["<tool_call>```" + " " * 3000 + "x</tool_call>"],
    "surrogate_arguments": [_call("run_python", code="s = '\ud800'\nprint(len(s))", note="\udfff\x00")],
    "deep_arguments": [_call("run_python", code="print(2)", extra=_nested(300, "\ud800"))],
    "nul_everywhere": [_call("run_python", code="import sys\nsys.stdout.write('a\\x00b')")
                       + _call("run_python", code="x = 1  # \x00")],
    "grading_raises_surrogate": [_call("run_python", code=RAISES_SURROGATE), _call("run_tests")],
}


def _reply_for(names: list[str]) -> Any:
    """Each new session takes the next attack; its turns are the attack's replies (the first tagged with the
    attack's name), then the correct solution (except for the one whose point is a failing solution), then done."""
    assigned: dict[str, str] = {}

    def reply(session: str, turn: int, _ids: list[int]) -> str:
        name = assigned.setdefault(session, names[len(assigned) % len(names)])
        turns = ATTACKS[name] + ([] if name == "grading_raises_surrogate" else [_call("run_python", code=CORRECT)])
        if turn >= len(turns):
            return "I am done."
        return (f"attack: {name}\n" if turn == 0 else "") + turns[turn]

    return reply


async def _run(cmd: list[str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT, env={**os.environ})
    out, _ = await asyncio.wait_for(proc.communicate(), 600)
    return proc.returncode or 0, out.decode(errors="replace")


async def test_each_attack_is_scored_and_stored_through_a_real_rollout(tmp_path: Path, smollm2_path: Path,
                                                                       smollm2_tokenizer: Any) -> None:
    names = sorted(ATTACKS)
    engine = ScriptedEngine(smollm2_tokenizer, _reply_for(names), context_window=WINDOW)
    server = StandInServer(StandIn(engine, model_path=smollm2_path, validator=contract_validator(),
                                   worker_id="scripted"))
    url = await server.start()
    out, summary = tmp_path / "attacks.jsonl", tmp_path / "summary.json"
    config = tmp_path / "rollout.yaml"
    config.write_text("budgets:\n  max_completion_tokens: 12000\n  max_turns: 4\n")
    try:
        cmd = [sys.executable, "-m", "agentrl.cli", "rollout", "--config", str(config), "--env", "code_tests",
               "--env-option", "action_format=hermes", "--task-id", TASK, "--group-size", str(len(names)),
               "--max-new-tokens", str(LONG_TURN), "--out", str(out), "--summary-json", str(summary),
               "--engine", "sglang", "--engine-url", url, "--model", str(smollm2_path)]
        rc, log = await _run(cmd)
    finally:
        await server.stop()
    assert rc == 0, log[-3000:]
    errors: list[LineError] = []
    trajs = read_trajectories(out, errors)
    assert errors == [] and len(trajs) == len(names)
    by = {next(n for n in names if t.turns[0].text.startswith(f"attack: {n}\n")): t for t in trajs}
    assert sorted(by) == names, "every attack ran in its own trajectory"
    unscored = {n: (t.status, t.error_kind, (t.error or "")[:200]) for n, t in by.items()
                if t.status is Status.infra_error or t.reward is None or t.attempt != 0}
    assert not unscored, f"attacks that ended unscored: {unscored}"
    for name, t in by.items():
        want = 0.0 if name == "grading_raises_surrogate" else 1.0
        assert t.reward == want, (name, t.status, t.reward, t.turns[-1].text[:100])

    def first_errors(name: str) -> str:
        return " ".join(by[name].turns[0].parse_errors)

    assert "4401 digits" in first_errors("huge_integer") and "invalid JSON" in first_errors("cubic_whitespace")
    [call] = by["surrogate_arguments"].turns[0].tool_calls
    assert call.arguments == {"code": "s = '\ud800'\nprint(len(s))", "note": "\udfff\x00"}
    assert by["deep_arguments"].turns[0].tool_calls[0].arguments["extra"] == _nested(300, "\ud800")
    assert "a\x00b" in by["nul_everywhere"].turns[0].tool_results[0].output
    graded = by["grading_raises_surrogate"]
    assert graded.tests is not None and any("\ud800 \x00" in o.message for o in graded.tests.outcomes)
    assert "\ud800" in graded.turns[1].tool_results[0].output, "the visible tests' output held the surrogate"
    assert graded.turns[1].env_len > 0, "and it was rendered for the model"
    lag = json.loads(summary.read_text())["loop_lag"]
    assert lag["max_ms"] < 2000, f"the runner's loop stalled: {lag}"


# -- in-process runner: property-based and loop-lag tests ----------------------------------------------------------


def _pool(max_sandboxes: int) -> SandboxPool:
    return SandboxPool(backend="local", spec=SandboxSpec(default_timeout_s=10), warm=1,
                       max_sandboxes=max_sandboxes, run_id=uuid.uuid4().hex[:8])


def _scheduler(env: Any, engine: Any, tok: Any, pool: SandboxPool, group_size: int) -> Scheduler:
    rollout = Rollout(env=env, engine=engine, renderer=ChatRenderer(tok, env.tools),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=LONG_TURN,
                                              stop_token_ids=[tok.eos_token_id]),
                      budgets=Budgets(max_turns=3, max_completion_tokens=WINDOW - 2000, context_window=WINDOW,
                                      tool_timeout_s=20))
    return Scheduler(rollout, pool, SchedulerConfig(group_size=group_size, trajectory_timeout_s=120))


def _assert_scored_and_round_trips(trajs: list[Trajectory], path: Path) -> None:
    for t in trajs:
        assert t.status is not Status.infra_error and t.reward is not None, (t.status, t.error_kind, t.error)
    with TrajectoryStore(path, resume=True) as store:
        store.append_group(trajs)
    errors: list[LineError] = []
    back = read_trajectories(path, errors)[-len(trajs):]
    assert errors == [] and back == trajs, "the store gives back exactly what was written"


_CHAR = st.one_of(st.characters(categories=["Cs"]), st.sampled_from("\x00\x1f\u2028\ufffe\U0010ffff"),
                  st.characters(exclude_categories=()))  # any code point, lone surrogates and NUL often
_SCALAR = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
    st.integers(), st.integers(min_value=-(2 ** 128), max_value=2 ** 128),
    st.text(_CHAR, max_size=12),
)
_JSON = st.recursive(_SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                           max_size=3), max_leaves=8)


_CODE = st.one_of(st.sampled_from([CORRECT, RAISES_SURROGATE, "print('\\ud800')", "print('a\\x00b')",
                                    "import sys; sys.stdout.buffer.write(b'\\xed\\xa0\\x80\\x00')"]),
                  st.text(_CHAR, max_size=20))


@st.composite
def _reply(draw: st.DrawFn) -> str:
    """One model turn: free text and/or hermes tool calls whose JSON holds anything JSON text can hold."""
    text = draw(st.text(st.characters(exclude_categories=("Cs",)), max_size=40))  # a model emits encodable text
    kind = draw(st.sampled_from(["text", "call", "call", "deep", "raw"]))
    if kind == "text":
        return text
    if kind == "raw":
        raw = draw(st.sampled_from(["<tool_call>", "</tool_call>", "```json", "```", " " * 300, "{", "[" * 50,
                                    '"\\ud800"', "\\u0000", "1" * 4301, "NaN", "<tool_call>{}", '{"name": 1}']))
        return text + "".join(draw(st.lists(st.just(raw) | st.sampled_from(["\n", "x"]), min_size=1, max_size=6)))
    name = draw(st.sampled_from(["run_python", "run_python", "run_tests", "nope", "\ud800"]))
    args = draw(st.dictionaries(st.sampled_from(["x", "\udc00", ""]), _JSON, max_size=2))
    if name == "run_python":
        args["code"] = draw(_CODE)
    if kind == "deep":
        args["deep"] = _nested(draw(st.integers(min_value=250, max_value=600)), draw(_SCALAR))
    digits = draw(st.sampled_from([0, 0, 4300, 4301]))  # an integer literal at / past Python's limit
    if digits:
        args["big"] = "__big__"
    body = json.dumps({"name": name, "arguments": args})  # NaN / Infinity written as such: the model can too
    return text + "<tool_call>" + body.replace('"__big__"', "-" + "7" * digits) + "</tool_call>"


def test_arbitrary_completions_end_scored_and_round_trip(tmp_path: Path, smollm2_tokenizer: Any) -> None:
    env = get_env("code_tests", source="easy", action_format="hermes")
    task = next(t for t in env.tasks() if t.id == TASK)
    loop = asyncio.new_event_loop()
    pool = _pool(max_sandboxes=2)
    loop.run_until_complete(pool.__aenter__())
    store = tmp_path / "prop.jsonl"
    try:
        @settings(max_examples=24, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(replies=st.lists(_reply(), min_size=1, max_size=3))
        @example(replies=ATTACKS["huge_integer"])  # each red-team attack first, then drawn ones
        @example(replies=ATTACKS["surrogate_arguments"] + ATTACKS["deep_arguments"])
        @example(replies=ATTACKS["grading_raises_surrogate"])
        def check(replies: list[str]) -> None:
            engine = ScriptedEngine(smollm2_tokenizer, replies + ["I am done."], context_window=WINDOW)
            sched = _scheduler(env, engine, smollm2_tokenizer, pool, group_size=1)
            run = sched.run_one(task, group_id=uuid.uuid4().hex[:8], sample_index=0)
            traj = loop.run_until_complete(asyncio.wait_for(run, 150))  # no hang
            _assert_scored_and_round_trips([traj], store)

        check()
    finally:
        loop.run_until_complete(pool.__aexit__(None, None, None))
        loop.close()


ADVERSARIAL = [
    "<tool_call>```" + " " * 2500 + "x</tool_call>",  # the old unfence regex: ~15 s on the loop
    "</tool_call>" * 3000 + "<tool_call>" * 3000,
    "```" + "a" * 30000 + "`\nprint(1)\n```",
    '<tool_call>{"name": "run_python", "arguments": {"code": "x", "n": -' + "9" * 4400 + "}}</tool_call>",
    _call("run_python", code="print('\ud800')", deep=_nested(500, "\udbff\x00")),
    _call("run_python", code=RAISES_SURROGATE) + _call("run_tests"),
]
NORMAL = [_call("run_python", code=CORRECT), _call("run_tests"), "I am done."]


async def test_adversarial_completions_do_not_stall_the_loop_or_change_other_results(
        tmp_path: Path, smollm2_tokenizer: Any) -> None:
    env = get_env("code_tests", source="easy", action_format="hermes")
    task = next(t for t in env.tasks() if t.id == TASK)
    plan = [("normal", None)] * 4 + [("adversarial", text) for text in ADVERSARIAL]
    roles: dict[str, tuple[str, str | None]] = {}

    def reply(session: str, turn: int, _ids: list[int]) -> str:
        role, text = roles.setdefault(session, plan[len(roles) % len(plan)])
        if role == "normal":
            return NORMAL[min(turn, len(NORMAL) - 1)]
        return text if turn < 2 and text is not None else "I am done."

    async with _pool(max_sandboxes=len(plan)) as pool:
        alone = await _scheduler(env, ScriptedEngine(smollm2_tokenizer, NORMAL, context_window=WINDOW),
                                 smollm2_tokenizer, pool, group_size=1).run_one(task, group_id="base", sample_index=0)
        lag = await LoopLag(period_s=0.01).start()
        try:
            sched = _scheduler(env, ScriptedEngine(smollm2_tokenizer, reply, context_window=WINDOW),
                               smollm2_tokenizer, pool, group_size=len(plan))
            [group] = [g async for g in sched.run([task])]
        finally:
            await lag.stop()
    worst = lag.summary()
    assert worst["ticks"] > 10 and worst["max_ms"] < 2000, f"the loop stalled beside adversarial completions: {worst}"
    normal = [t for t in group if roles[t.id][0] == "normal"]
    adversarial = [t for t in group if roles[t.id][0] == "adversarial"]
    assert len(normal) == 4 and len(adversarial) == len(ADVERSARIAL)
    assert alone.status is Status.ok and alone.reward == 1.0
    for t in normal:
        assert (t.status, t.reward, t.completion_ids, t.env_mask) == \
               (alone.status, alone.reward, alone.completion_ids, alone.env_mask)
        assert [r.output for turn in t.turns for r in turn.tool_results] == \
               [r.output for turn in alone.turns for r in turn.tool_results]
    _assert_scored_and_round_trips(group, tmp_path / "lag.jsonl")
