"""Policy data is handled totally: parsing, storing and rendering any model text or tool output never raises, never
takes more than linear time, and stores what was there (issue 22). Each adversarial input here broke the old code
(a raise out of the parser, the store or the tokenizer; or seconds-to-minutes of one regex on the event loop)."""

from __future__ import annotations

import itertools
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from agentrl.store import TrajectoryStore, iter_records, read_trajectories
from agentrl.store.jsonl import LineError
from agentrl.tools import parse_tool_calls
from agentrl.types import (
    MAX_DATA_DEPTH,
    Message,
    Status,
    TestOutcome as Outcome,
    TestReport as Report,
    ToolCall,
    ToolResult,
    ToolSpec,
    Trajectory,
    Turn,
)

ANY_ARGS = ToolSpec(name="probe", description="takes anything", parameters={"type": "object"})
RUN_PYTHON = ToolSpec(name="run_python", description="Run Python.",
                      parameters={"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]})
TOOLS = [ANY_ARGS, RUN_PYTHON]
MAX_INT_DIGITS = 4300  # agentrl.tools.parsers.MAX_INT_DIGITS (tests import new names inside, to run on old code)
LINEAR_BOUND_S = 2.0  # every input below takes < 0.1 s now and took 15 s to many minutes before


def _nested(depth: int, leaf: Any = 0) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def _call(args_json: str, name: str = "probe") -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {args_json}}}</tool_call>'


# -- parsers: never raise --------------------------------------------------------------------------------------


@pytest.mark.parametrize("digits", [MAX_INT_DIGITS + 1, 5000, 100_000])
def test_an_integer_literal_over_the_limit_is_a_format_error(digits: int) -> None:
    for text in (_call('{"n": 1' + "0" * (digits - 1) + "}"), _call('"{\\"n\\": -1' + "0" * (digits - 1) + '}"')):
        out = parse_tool_calls(text, "hermes", TOOLS, turn=2)
        assert out.calls == [] and len(out.errors) == 1
        assert out.errors[0].startswith("tool call 1: ") and f"{digits} digits" in out.errors[0]


def test_an_integer_at_the_limit_is_a_call_and_keeps_its_value() -> None:
    n = int("9" * MAX_INT_DIGITS)
    out = parse_tool_calls(_call(f'{{"n": {n}, "m": -{n}}}'), "hermes", TOOLS)
    assert out.errors == [] and out.calls[0].arguments == {"n": n, "m": -n}


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999", "-1e400"])
def test_non_finite_numbers_are_a_format_error(literal: str) -> None:
    out = parse_tool_calls(_call(f'{{"x": {literal}}}'), "hermes", TOOLS)
    assert out.calls == [] and len(out.errors) == 1 and "invalid JSON" in out.errors[0]


def test_nesting_up_to_the_limit_is_a_call_and_deeper_is_a_format_error() -> None:
    ok = _nested(MAX_DATA_DEPTH - 2)  # + the arguments object + the call object = the limit
    out = parse_tool_calls(_call(json.dumps({"d": ok})), "hermes", TOOLS)
    assert out.errors == [] and out.calls[0].arguments == {"d": ok}
    for depth in (MAX_DATA_DEPTH - 1, 900, 100_000):
        out = parse_tool_calls(_call('{"d": ' + "[" * depth + "]" * depth + "}"), "hermes", TOOLS)
        assert out.calls == [] and len(out.errors) == 1
        assert f"nested too deeply (at most {MAX_DATA_DEPTH} levels)" in out.errors[0]


def test_lone_surrogates_and_nul_in_arguments_are_kept_exactly() -> None:
    out = parse_tool_calls(_call(r'{"s": "a\ud800b\udfff\u0000c", "k\udc00": [1, "\ud83d"]}'), "hermes", TOOLS)
    assert out.errors == []
    assert out.calls[0].arguments == {"s": "a\ud800b\udfff\x00c", "k\udc00": [1, "\ud83d"]}


# -- parsers: linear time --------------------------------------------------------------------------------------


def _timed(text: str, fmt: str) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = parse_tool_calls(text, fmt, TOOLS)
    return time.perf_counter() - t0, out


def test_a_fenced_body_of_whitespace_parses_in_linear_time() -> None:
    """The old ```json unfence regex was cubic in whitespace: 800 spaces took 0.5 s, these 4,000 about a minute."""
    for body in ("```" + " " * 4000 + "x", "```json" + "\n " * 2000 + "x", "```" + " " * 4000 + "```x"):
        took, out = _timed(f"<tool_call>{body}</tool_call>", "hermes")
        assert took < LINEAR_BOUND_S and out.calls == [] and len(out.errors) == 1 and "invalid JSON" in out.errors[0]


def test_many_broken_tags_parse_in_linear_time() -> None:
    """The old tag scan searched to the end of the text once per tag: quadratic (8,000 tags 0.25 s, these ~25 s)."""
    n = 80_000
    for text, word in (("</tool_call>" * n, "stray"), ("<tool_call>" * n, "unclosed")):
        took, out = _timed(text, "hermes")
        assert took < LINEAR_BOUND_S and len(out.errors) == n and all(word in e for e in out.errors[:3])


def test_a_long_fence_line_parses_in_linear_time() -> None:
    """The old fence-opening regex backtracked over the info string: quadratic in a line (40,000 chars took 7 s)."""
    for line in ("```" + "a" * 200_000 + "`", "```python " + "b" * 200_000 + "`x", "  ```" + " a" * 100_000 + "`"):
        took, out = _timed(line + "\nprint(1)\n```", "codeblock")
        assert took < LINEAR_BOUND_S and out.calls == []


def test_the_new_scanners_agree_with_the_old_ones_on_short_inputs() -> None:
    """The rewrites are the same functions: compared with the old regexes on inputs short enough for them."""
    from agentrl.tools import parsers

    old_fence = re.compile(r"^[ \t]*(`{3,})[ \t]*([^\s`]*)[^`\n]*$")
    old_unfence = re.compile(r"```(?:json)?\s*\n?(.*?)\n?\s*```", flags=re.DOTALL)
    pieces = ["`", "``", "```", "````", " ", "\t", "\u00a0", "py", "python", "json", "x y", "\r", "\n", "{}", "js"]
    for combo in itertools.product(pieces, repeat=4):
        s = "".join(combo)
        m = old_fence.match(s) if "\n" not in s else None
        want = (m.group(1), m.group(2)) if m else None
        if "\n" not in s:
            assert parsers._fence_open(s) == want, repr(s)
        m2 = old_unfence.fullmatch(s.strip())
        assert parsers._unfence_json(s) == (m2.group(1).strip() if m2 else s.strip()), repr(s)


def test_tag_spans_agree_with_the_old_scan() -> None:
    from agentrl.tools import parsers

    def old_spans(text: str) -> list[tuple[int, int, int]]:
        spans, pos = [], 0
        while True:
            start, stray = text.find(parsers.OPEN_TAG, pos), text.find(parsers.CLOSE_TAG, pos)
            if stray != -1 and (start == -1 or stray < start):
                spans.append((stray, stray, parsers._STRAY))
                pos = stray + len(parsers.CLOSE_TAG)
                continue
            if start == -1:
                return spans
            body = start + len(parsers.OPEN_TAG)
            end, reopen = text.find(parsers.CLOSE_TAG, body), text.find(parsers.OPEN_TAG, body)
            if end == -1 or (reopen != -1 and reopen < end):
                spans.append((start, body, parsers._UNCLOSED))
                if reopen == -1:
                    return spans
                pos = reopen
                continue
            spans.append((start, body, end))
            pos = end + len(parsers.CLOSE_TAG)

    for combo in itertools.product(["<tool_call>", "</tool_call>", "x", "<tool_", "call>"], repeat=5):
        text = "".join(combo)
        assert parsers._hermes_spans(text) == old_spans(text), text


# -- store: total, faithful ------------------------------------------------------------------------------------


def _traj(i: int, **kw: Any) -> Trajectory:
    base: dict[str, Any] = dict(id=f"t{i}", group_id="g", task_id="easy/add", env="code_tests", status=Status.ok,
                                prompt_ids=[1, 2, 3], completion_ids=[4, 5, 6], logprobs=[-0.5, 0.0, 0.0],
                                env_mask=[1, 0, 0], reward=1.0, meta={"group_size": 3})
    base.update(kw)
    return Trajectory(**base)


def _hostile() -> Trajectory:
    surrogate = "x\ud800y\udfff\x00z"
    call = ToolCall(id="call_0_0", name="probe", raw="<tool_call>...</tool_call>",
                    arguments={"s": surrogate, "deep": _nested(300, "\ud800"), "n": int("7" * MAX_INT_DIGITS),
                               "k\udc00": None})
    turn = Turn(index=0, start=0, model_len=1, env_len=2, text="a\x00b", tool_calls=[call],
                tool_results=[ToolResult(call_id="call_0_0", name="probe", output=surrogate, stderr="\ud800")],
                parse_errors=["e\udbff"], observation=surrogate)
    tests = Report(passed=0, total=1, outcomes=[Outcome(name="t", passed=False, message="ValueError: \ud800")])
    return _traj(1, turns=[turn], tests=tests, reward=0.0, error="\ud800", solution="raise ValueError('\ud800')")


def test_a_hostile_trajectory_is_stored_and_read_back_unchanged(tmp_path: Path) -> None:
    """Lone surrogates (tool output, test message, arguments), NUL, 300-deep arguments, a 4,300-digit integer: the
    old store raised (pydantic cannot write surrogates or nest past 255) and lost the whole group."""
    group = [_traj(0), _hostile(), _traj(2)]
    path = tmp_path / "t.jsonl"
    with TrajectoryStore(path) as store:
        store.append_group(group)
    errors: list[LineError] = []
    back = read_trajectories(path, errors)
    assert errors == [] and back == group
    assert back[1].turns[0].tool_calls[0].arguments["s"] == "x\ud800y\udfff\x00z"
    assert back[1].completion_ids == group[1].completion_ids and back[1].logprobs == group[1].logprobs
    lines = path.read_bytes().splitlines()
    assert lines[0] == group[0].model_dump_json().encode(), "ordinary records are written as before"
    assert lines[1].isascii() and b"\\ud800" in lines[1]


def test_a_surrogate_only_in_a_key_and_a_real_replacement_character_round_trip(tmp_path: Path) -> None:
    """pydantic writes a surrogate in a dict key as U+FFFD without raising: the old store lost it silently."""
    call = ToolCall(id="c", name="probe", arguments={"\udc00": None, "r": "\ufffd"})
    traj = _traj(0, turns=[Turn(index=0, start=0, model_len=1, tool_calls=[call], text="bad byte: \ufffd")])
    plain = _traj(1, turns=[Turn(index=0, start=0, model_len=1, text="bad byte: \ufffd")])
    path = tmp_path / "t.jsonl"
    with TrajectoryStore(path) as store:
        store.append_group([traj, plain])
    assert read_trajectories(path) == [traj, plain]


def test_resume_keeps_a_hostile_group(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    group = [_traj(0), _hostile(), _traj(2)]
    with TrajectoryStore(path) as store:
        store.append_group(group)
    with TrajectoryStore(path, resume=True) as store:
        assert store.repaired_bytes == 0 and store.completed() == group


def test_data_past_what_a_reader_can_hold_becomes_a_marker_and_the_rest_is_kept(tmp_path: Path) -> None:
    """Not reachable from the parsers (they refuse it), but the store never raises for it: nesting past
    MAX_LINE_DEPTH, an int Python cannot print, a set, bytes and an object are written as strings naming them."""

    from agentrl.store import encode_trajectory
    from agentrl.store.jsonl import MAX_LINE_DEPTH

    class Odd:
        def __str__(self) -> str:
            raise RuntimeError("no")

    meta = {"group_size": 1, "deep": _nested(5000), "big": 10 ** 5000, "set": {3}, "raw": b"\xff\x00",
            "obj": Odd(), "ok": [1, 2.5, "\ud800"]}
    traj = _traj(0, meta=meta)
    line = encode_trajectory(traj)
    path = tmp_path / "t.jsonl"
    path.write_bytes(line + b"\n")
    [back] = read_trajectories(path)
    assert back.completion_ids == traj.completion_ids and back.meta["ok"] == [1, 2.5, "\ud800"]
    assert back.meta["big"] == "<int of 16610 bits: not stored>" and back.meta["set"] == [3]
    assert back.meta["raw"] == "\\xff\x00" and back.meta["obj"] == "<Odd>"
    deep, depth = back.meta["deep"], 2  # the record's root is level 0, meta 1
    while isinstance(deep, list):
        deep, depth = deep[0], depth + 1
    assert depth == MAX_LINE_DEPTH and deep.startswith("<list nested deeper than")


def test_readers_report_unreadable_lines_instead_of_raising(tmp_path: Path) -> None:
    """A line too deep for json (RecursionError) or with an int Python will not convert (ValueError) is a LineError;
    the old reader and the resume repair raised on both."""
    from agentrl.store import encode_trajectory

    path = tmp_path / "t.jsonl"
    good = encode_trajectory(_traj(0, meta={"group_size": 1}))
    path.write_bytes(b"[" * 100_000 + b"]" * 100_000 + b"\n" + b'{"n": 1' + b"0" * 5000 + b"}\n"
                     + b'{"group_id": "x", "meta": []}\n' + good + b"\n")
    recs = list(iter_records(path))
    assert [type(r).__name__ for r in recs] == ["LineError", "LineError", "LineError", "Trajectory"]
    assert recs[0].line == 1 and recs[1].line == 2
    big = _traj(0, meta={"group_size": 1, "big": -10 ** 5000})  # pydantic writes it; json.loads refuses to read it
    path.write_bytes(encode_trajectory(big) + b"\n")
    [back] = read_trajectories(path)
    assert back.meta["big"] == "<int of 5001 digits: not stored>" and back.completion_ids == big.completion_ids
    with TrajectoryStore(path, resume=True) as store:
        assert store.repaired_bytes == 0 and len(store.completed()) == 1


# -- render: total on any text ---------------------------------------------------------------------------------


def test_observations_with_surrogates_render_and_drift_check(smollm2_tokenizer: Any) -> None:
    """The Rust tokenizer refuses surrogates (TypeError): the old renderer raised on such a tool output, which
    became internal_error. Now each one is written as its escape; NUL and other text pass unchanged."""
    from agentrl.tools.render import ChatRenderer, safe_text

    assert safe_text("a\ud800b\udfff\x00") == "a\\ud800b\\udfff\x00" and safe_text("ünï ✓") == "ünï ✓"
    for fast in (True, False):
        r = ChatRenderer(smollm2_tokenizer, [RUN_PYTHON], fast=fast)
        obs = [Message(role="tool", content="FAIL t -> ValueError: \ud800\x00", name="run_\udc00",
                       tool_call_id="c\ud800")]
        ids = r.suffix_ids(obs)
        text = r.decode(ids)
        assert "ValueError: \\ud800\x00" in text and "\ufffd" not in text
        assert r.encode("x\ud800") == r.encode("x\\ud800")
        prompt = [Message(role="system", content="s"), Message(role="user", content="task \ud800")]
        p = r.prompt_ids(prompt)
        convo = [*prompt, Message(role="assistant", content="ok"), *obs]
        full = p + r.encode("ok") + [r.end_of_turn_ids[0]] + ids
        assert r.render_text(convo, gen_prompt=True) == r.decode(full)
        assert r.drift_check().check(convo, full) == r.check_drift(convo, full)
